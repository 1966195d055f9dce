"""Rubric-memory bookkeeping cost per step: 32 groups x 8 trajectories, 2 active rubrics.

    python bench/memory.py [--steps N] [--groups G] [--k K]

Timed per step (everything ARBOR adds around the LLM calls, which are replaced by precomputed verdicts and
embeddings): active selection, the sparse graph + presentation coin + verdict mapping + per-trajectory scores
for every (active rubric, group), the n_r / rho_r updates, retirement, anchor selection, admission of 1-2 drafts
per mixed group, shaping, and consolidation when due. Reference measured in the same run: computing the base
rewards of the same step (arbor.reward.base_reward: format gate + answer extraction + token F1 on realistic
trajectory texts). Prints per-step and per-group costs and their ratio.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np

from arbor.config.memory import MemoryConfig
from arbor.reward import base_reward
from arbor.seeding import derive_seed
from arbor.tasks.methods.arbor.induction import select_anchors
from arbor.tasks.methods.arbor.memory import RubricMemory
from arbor.tasks.methods.arbor.records import Activation, DraftResult
from arbor.tasks.methods.arbor.sparse_graph import (
    presentation,
    presentation_swapped,
    score_group,
    sparse_edges,
    verdict_to_outcome,
)
from arbor.tasks.shaping import shape_group
from arbor.types import RubricDraft

ANSWERS = ["Paris", "Lyon", "Marseille", "the Eiffel Tower", "Gustave Eiffel", "1889"]
FILLER = ("The city is known for its museums, cafes and long history as a centre of art and politics. " * 6).strip()


def trajectory_text(rng: random.Random, answer: str) -> str:
    """A realistic multi-turn search-agent response (~3-5 KB) ending in a boxed answer."""
    turns = []
    for i in range(rng.randint(2, 4)):
        turns.append(f"<think>I need fact {i} about the question; plan the next query.</think>\n"
                     f"<search>query {i} about {answer}</search>\n"
                     f"<result>Doc 1: {FILLER}\nDoc 2: {FILLER}\nDoc 3: mentions {answer}.</result>\n")
    return "".join(turns) + f"<think>The evidence suffices.</think>\n<answer>\\boxed{{{answer}}}</answer>"


def make_step(rng: random.Random, groups: int, k: int) -> list[tuple[list[str], list[str]]]:
    out = []
    for _ in range(groups):
        gold = rng.choice(ANSWERS)
        p_right = rng.choice([0.0, 0.3, 0.7, 1.0])
        texts = [trajectory_text(rng, gold if rng.random() < p_right else rng.choice(ANSWERS)) for _ in range(k)]
        out.append((texts, [gold]))
    return out


def verdict(q_a: float, q_b: float) -> str:
    return "A" if q_a > q_b + 0.05 else "B" if q_b > q_a + 0.05 else "TIE"


def score(seed: int, step: int, g: int, rid: str, base: list[float], q: list[float]):
    """One rubric on one group: graph, presentation coin, (precomputed) verdicts mapped back, scores."""
    edges = sparse_edges(base)
    outs = []
    for e, edge in enumerate(edges):
        sw = presentation_swapped(seed, step, g, rid, e)
        a, b = presentation(edge, sw)
        outs.append(verdict_to_outcome(verdict(q[a], q[b]), sw))
    return score_group(len(base), edges, outs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--k", type=int, default=8)
    args = ap.parse_args()
    rng = random.Random(0)
    seed = 0
    data = [make_step(rng, args.groups, args.k) for _ in range(args.steps)]
    mem = RubricMemory(MemoryConfig())
    mem.load_pool(0, {"rubrics": [{"title": f"rubric {i}", "description": "hi", "counter_description": "lo"}
                                  for i in range(6)]})
    embed_cache: dict[str, np.ndarray] = {}

    def embed(texts: list[str]) -> np.ndarray:  # precomputed vectors stand for the embedding model call
        return np.array([embed_cache.setdefault(t, np.random.default_rng(derive_seed(t) % 2**32).normal(size=384))
                         for t in texts])

    ref_times, memory_times = [], []
    n_events = 0
    for step, groups in enumerate(data, start=1):
        # ---- reference: base rewards of the step
        t0 = time.perf_counter()
        rewards = [[base_reward(text, golds) for text in texts] for texts, golds in groups]
        ref_times.append(time.perf_counter() - t0)
        f1 = [[r.f1 for r in rs] for rs in rewards]
        base = [[r.base_reward for r in rs] for rs in rewards]
        valid = [[r.format_valid for r in rs] for rs in rewards]
        q = [[x + rng.gauss(0, 0.3) for x in g] for g in f1]  # hidden process quality the fake judge sees
        lengths = [[len(t) for t in texts] for texts, _ in groups]
        # ---- timed: everything the memory and scoring bookkeeping does in a step
        t0 = time.perf_counter()
        active, rec = mem.select_active(step)

        acts = [Activation(r.rubric_id, g, score(seed, step, g, r.rubric_id, base[g], q[g]), f1[g]) for g in range(len(groups)) for r in active]
        rec.extend(mem.apply_activations(step, acts))
        rec.extend(mem.retire(step))
        drafts = []
        for g in range(len(groups)):
            anchors = select_anchors(f1[g], lengths[g], valid[g])
            if anchors["mode"] == "skip":
                continue
            made = RubricMemory.make_drafts(step, g, [RubricDraft(f"draft {step}.{g}.{i}", "hi", "lo")
                                                      for i in range(1 + g % 2)])
            drafts += [DraftResult(d, g, f"q{g}", "question?", score(seed, step, g, d.rubric_id, base[g], q[g]), f1[g]) for d in made]
        rec.extend(mem.admit_drafts(step, drafts))
        for g in range(len(groups)):
            scores = [a.scoring.scores for a in acts if a.group == g]
            shape_group(base[g], scores, valid[g])
        if mem.consolidation_due():
            new = [RubricDraft(f"common {step}.{i}", "hi", "lo") for i in range(2)]
            rec.extend(mem.consolidate(step, new, embed))
        memory_times.append(time.perf_counter() - t0)
        n_events += len(rec.events) + len(rec.activations)
    ref, mine = statistics.median(ref_times), statistics.median(memory_times)
    g = args.groups
    print(f"steps={args.steps} groups={g} k={args.k} active={MemoryConfig().n_active} rows={n_events}")
    print(f"base rewards (reference): {ref * 1e3:8.2f} ms/step  {ref / g * 1e3:6.3f} ms/group")
    print(f"memory bookkeeping      : {mine * 1e3:8.2f} ms/step  {mine / g * 1e3:6.3f} ms/group")
    print(f"ratio bookkeeping / base reward: {mine / ref:.2f}x   (median over steps)")
    print(f"p95 bookkeeping: {sorted(memory_times)[int(0.95 * (len(memory_times) - 1))] / g * 1e3:.3f} ms/group; "
          f"final |P|={len(mem.P)} |D|={len(mem.D)}")


if __name__ == "__main__":
    main()
