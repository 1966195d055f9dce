"""200-step lifecycle simulation of RubricMemory (the acceptance; paper §3.3-3.4).

A synthetic world: each trajectory has an F1 and a hidden process quality q = F1 + noise. A synthetic pairwise
judge answers per edge from the rubric's hidden type (encoded in its title):
  good    prefers the trajectory with higher q (correlates with F1),
  anti    prefers lower q (anti-correlated: must retire on rho_r < rho_min),
  fading  like good until step ``@N`` in its title, then always TIE (stops discriminating: must retire once
          n_r exceeds kappa).
  flicker like good until step ``@N``, then TIE on every group but the step's last one (only in the
          ``flicker`` runs): n_r passes kappa in the middle of a step and the last group resets it;
          the rubric must still retire at the end of that step.
The real pieces run in the flow's order: sparse_edges, presentation coin, verdict mapping, score_group,
select_anchors, shaping, and every RubricMemory call. Steps 100-101 are a judge outage (every call fails).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pytest

from arbor.config.memory import MemoryConfig
from arbor.seeding import derive_seed
from arbor.tasks.methods.arbor.induction import select_anchors
from arbor.tasks.methods.arbor.memory import RubricMemory
from arbor.tasks.methods.arbor.records import Activation, DraftResult, GroupInfo, Records
from arbor.tasks.methods.arbor.sparse_graph import (
    presentation,
    presentation_swapped,
    score_group,
    sparse_edges,
    verdict_to_outcome,
)
from arbor.tasks.shaping import shape_group
from arbor.types import Rubric, RubricDraft

SEED, STEPS, GROUPS, K = 11, 200, 8, 8
OUTAGE = {100, 101}
CFG = MemoryConfig(k_consol=8, pool_max=6, n_active=2, kappa=5, rho_min=0.0, delta_v=0.05, maturity=3)


@dataclass
class World:
    f1: list[float]
    q: list[float]
    info: GroupInfo


def make_group(rng: random.Random, step: int, g: int) -> World:
    kind = rng.random()
    if kind < 0.2:
        f1 = [1.0] * K
    elif kind < 0.4:
        f1 = [0.0] * K
    elif kind < 0.45:
        f1 = [0.5] * K
    else:
        f1 = [rng.choice([0.0, 0.0, 0.5, 1.0]) for _ in range(K)]
    q = [f + rng.gauss(0, 0.3) for f in f1]
    return World(f1, q, GroupInfo(f"q{step}.{g}", f"question {step}.{g}?", tuple(f1)))


def rubric_type(r: Rubric, step: int) -> str:
    kind = r.title.split()[0]
    if kind.startswith("fading@"):
        return "good" if step < int(kind.split("@")[1]) else "flat"
    if kind.startswith("flicker@"):
        return "good" if step < int(kind.split("@")[1]) else "flicker"
    return kind


def judge(r: Rubric, w: World, step: int, g: int) -> object:
    """Score one group under one rubric through the real graph / coin / verdict mapping."""
    edges = sparse_edges(w.f1)  # base reward = F1 (all format-valid here)
    typ = rubric_type(r, step)
    if typ == "flicker":
        typ = "good" if g == GROUPS - 1 else "flat"
    outcomes = []
    for e, edge in enumerate(edges):
        swapped = presentation_swapped(SEED, step, g, r.rubric_id, e)
        a, b = presentation(edge, swapped)
        fail = step in OUTAGE or derive_seed(SEED, step, g, r.rubric_id, e, "fail") % 25 == 0
        if fail:
            verdict = None
        elif typ == "flat":
            verdict = "TIE"
        else:
            d = (w.q[a] - w.q[b]) * (1 if typ == "good" else -1)
            verdict = "A" if d > 0.05 else "B" if d < -0.05 else "TIE"
        outcomes.append(verdict_to_outcome(verdict, swapped))
    return score_group(K, edges, outcomes)


def consolidation_output(step: int, mem: RubricMemory, flicker: bool = False) -> list[RubricDraft]:
    """0-2 new commons per round, cycling through the hidden types; every 5th round repeats a pool member."""
    rnd = derive_seed(SEED, step, "consol")
    kinds = ["good", "anti", f"fading@{step + 20}", f"flicker@{step + 10}" if flicker else "good", "dup"]
    out = []
    for i in range(rnd % 3):
        kind = kinds[(rnd // 3 + i) % len(kinds)]
        if kind == "dup" and mem.pool:
            src = mem.pool[0]
            out.append(RubricDraft(src.title, src.description, src.counter_description))
        else:
            kind = "good" if kind == "dup" else kind
            title = f"{kind} rubric {step}.{i}"
            out.append(RubricDraft(title, f"does {title}", f"fails {title}"))
    return out


def toy_embed(texts: list[str]) -> np.ndarray:
    """One pseudo-random direction per text (identical texts -> cosine 1, others ~ 0)."""
    return np.array([np.random.default_rng(derive_seed(t) % 2**32).normal(size=64) for t in texts])


def simulate(shuffle: bool = False, resume_at: int | None = None, flicker: bool = False,
             resume_after_score: bool = False):
    """``resume_after_score``: whenever some activation of a step has n_r > kappa, rebuild the memory from the rows
    emitted so far (partial_phase="score", as tasks/step.py does on resume) before that step's retire call."""
    world_rng, order_rng = random.Random(SEED), random.Random(SEED + 1)
    mem = RubricMemory(CFG)
    log, groups = Records(), {}
    per_step: dict[int, dict] = {}
    for step in range(STEPS):
        if resume_at is not None and step == resume_at:
            mem = RubricMemory.from_events(CFG, log.events, log.activations, log.sources, groups)
        worlds = [make_group(world_rng, step, g) for g in range(GROUPS)]
        for g, w in enumerate(worlds):
            groups[(step, g)] = w.info
        pool_before = len(mem.P)
        active, rec = mem.select_active(step)
        results = [Activation(r.rubric_id, g, judge(r, w, step, g), w.f1) for g, w in enumerate(worlds)
                   for r in active]
        if shuffle:
            order_rng.shuffle(results)
        rec.extend(mem.apply_activations(step, results))
        if resume_after_score and any(a["n_r_after"] > CFG.kappa for a in rec.activations):
            mem = RubricMemory.from_events(CFG, log.events + rec.events, log.activations + rec.activations,
                                           log.sources, groups, partial_phase="score")
        # Shaping sees the same variance filter as the memory's "kept".
        for g, w in enumerate(worlds):
            mine = sorted((a for a in results if a.group == g), key=lambda a: a.rubric_id)
            shaped = shape_group(w.f1, [a.scoring.scores for a in mine], [True] * K, delta_v=CFG.delta_v)
            rows = sorted((a for a in rec.activations if a["group"] == g), key=lambda a: a["rubric_id"])
            assert shaped.kept == [a["kept"] for a in rows]
        rec.extend(mem.retire(step))
        drafts = []
        for g, w in enumerate(worlds):
            anchors = select_anchors(w.f1, [100 + i for i in range(K)], [True] * K)
            if anchors["mode"] == "skip":
                continue
            n = 1 + derive_seed(SEED, step, g, "n_drafts") % 2
            kinds = ["good" if derive_seed(SEED, step, g, i, "kind") % 3 else "anti" for i in range(n)]
            made = RubricMemory.make_drafts(step, g, [RubricDraft(f"{k} draft", "hi", "lo") for k in kinds])
            drafts += [DraftResult(d, g, w.info.question_id, w.info.question, judge(d, w, step, g), w.f1)
                       for d in made]
        if shuffle:
            order_rng.shuffle(drafts)
        rec.extend(mem.admit_drafts(step, drafts))
        if mem.consolidation_due() and step not in OUTAGE:  # the consolidation judge is down too
            rec.extend(mem.consolidate(step, consolidation_output(step, mem, flicker), toy_embed))
        log.extend(rec)
        per_step[step] = {"pool_before": pool_before, "active": [r.rubric_id for r in active],
                          "state": mem.state(), "P": len(mem.P)}
    return mem, log, per_step


@pytest.fixture(scope="module")
def runs():
    return {"ordered": simulate(), "shuffled": simulate(shuffle=True), "resumed": simulate(resume_at=137),
            "flicker": simulate(flicker=True), "flicker_resumed": simulate(flicker=True, resume_after_score=True)}


def test_pool_bounded_and_selection_size(runs):
    mem, log, per_step = runs["ordered"]
    assert all(e["pool_size"] <= CFG.pool_max for e in log.events)
    assert all(s["P"] <= CFG.pool_max for s in per_step.values())
    for s in per_step.values():
        assert len(s["active"]) == min(CFG.n_active, s["pool_before"])
    counts = {}
    for e in log.events:
        counts[e["event"]] = counts.get(e["event"], 0) + 1
    # The simulation exercises every lifecycle path.
    for ev in ("induced", "admitted", "rejected", "consolidated", "duplicate", "activated", "retired", "replaced",
               "judge_error"):
        assert counts.get(ev, 0) > 0, ev
    assert max(s["P"] for s in per_step.values()) == CFG.pool_max


def test_anti_correlated_rubrics_retire(runs):
    _, log, _ = runs["ordered"]
    anti = {e["rubric_id"] for e in log.events if e["event"] == "consolidated" and e["kind"] == "common"
            and e["title"].startswith("anti")}
    assert anti
    scored = {a["rubric_id"] for a in log.activations if not a["judge_error"]}
    retired = {e["rubric_id"]: e for e in log.events if e["event"] == "retired"}
    for rid in anti & scored:
        first = min(a["step"] for a in log.activations if a["rubric_id"] == rid and not a["judge_error"])
        assert rid in retired and retired[rid]["step"] == first and "rho_r" in retired[rid]["reason"]
        assert retired[rid]["rho_r"] < CFG.rho_min
    # Every admission decision is eq. 2 on the recorded statistics; anti-correlated drafts are rejected unless
    # their Pearson is undefined (constant F1: unlabeled induction) or noise makes it reach rho_min.
    decided = [e for e in log.events if e["event"] in ("admitted", "rejected")]
    for e in decided:
        eq2 = e["variance"] >= CFG.delta_v and (e["pearson"] is None or e["pearson"] >= CFG.rho_min)
        assert eq2 == (e["event"] == "admitted"), e
    anti_defined = [e for e in decided if e["title"].startswith("anti") and e["pearson"] is not None]
    rejected = [e for e in anti_defined if e["event"] == "rejected"]
    assert len(rejected) >= 0.95 * len(anti_defined) > 0


def test_rubric_that_stops_discriminating_retires_after_kappa_plus_one(runs):
    _, log, _ = runs["ordered"]
    retired = {e["rubric_id"]: e for e in log.events if e["event"] == "retired"}
    faded = [e for e in log.events if e["event"] == "consolidated" and e["kind"] == "common"
             and e["title"].startswith("fading@")]
    checked = 0
    for e in faded:
        rid, fade = e["rubric_id"], int(e["title"].split()[0].split("@")[1])
        rows = [a for a in log.activations if a["rubric_id"] == rid and not a["judge_error"]]
        late = [a for a in rows if a["step"] >= fade]
        if not late or rid not in retired or "n_r" not in retired[rid]["reason"]:
            # Replaced or never activated after fading; it must not still be active past kappa+1 flat groups.
            assert len(late) <= CFG.kappa or rid in retired
            continue
        checked += 1
        # n_r counts consecutive low-variance activations; retirement comes at the end of the step in which
        # n_r first exceeds kappa, and never earlier.
        first = next(a for a in rows if a["n_r_after"] == CFG.kappa + 1)
        assert retired[rid]["step"] == first["step"]
        idx = rows.index(first)
        assert all(a["variance"] < CFG.delta_v for a in rows[idx - CFG.kappa: idx + 1])
        assert all(a["n_r_after"] <= CFG.kappa for a in rows if a["step"] < first["step"])
    assert checked >= 1


def test_judge_outage_retires_and_admits_nothing(runs):
    _, log, per_step = runs["ordered"]
    for step in OUTAGE:
        evs = [e for e in log.events if e["step"] == step]
        assert not [e for e in evs if e["event"] in ("retired", "admitted", "rejected", "consolidated", "replaced")]
        acts = [a for a in log.activations if a["step"] == step]
        assert acts and all(a["judge_error"] for a in acts)
    before = per_step[min(OUTAGE) - 1]["state"]
    after = per_step[max(OUTAGE)]["state"]

    def stats_only(state):
        return [(r, {k: v for k, v in s.items() if k != "last_used"}) for r, s in state["P"]], state["D"]

    assert stats_only(before) == stats_only(after)


def test_arrival_order_does_not_matter(runs):
    _, log_a, steps_a = runs["ordered"]
    _, log_b, steps_b = runs["shuffled"]
    assert log_a == log_b
    assert [s["state"] for s in steps_a.values()] == [s["state"] for s in steps_b.values()]


def test_rebuild_from_events_is_identical(runs):
    mem, log, per_step = runs["ordered"]
    groups = {}
    world_rng = random.Random(SEED)
    for step in range(STEPS):
        for g in range(GROUPS):
            groups[(step, g)] = make_group(world_rng, step, g).info
    for cut in (0, 57, 150, STEPS - 1):
        ev = [e for e in log.events if e["step"] <= cut]
        ac = [a for a in log.activations if a["step"] <= cut]
        so = [s for s in log.sources if s["step"] <= cut]
        assert RubricMemory.from_events(CFG, ev, ac, so, groups).state() == per_step[cut]["state"]
    # A run resumed from its events at step 137 continues exactly like the uninterrupted one.
    _, log_r, steps_r = runs["resumed"]
    assert log_r == log
    assert steps_r[STEPS - 1]["state"] == mem.state()


def test_n_r_over_kappa_mid_step_retires_even_when_a_later_group_resets_it(runs):
    """Retirement is decided on the activation sequence in group order, not on the step's final n_r."""
    _, log, _ = runs["flicker"]
    retired = {e["rubric_id"]: e for e in log.events if e["event"] == "retired"}
    flick = [e["rubric_id"] for e in log.events if e["event"] == "consolidated" and e["kind"] == "common"
             and e["title"].startswith("flicker@")]
    mid = 0
    for rid in flick:
        rows = [a for a in log.activations if a["rubric_id"] == rid and not a["judge_error"]]
        over = next((a for a in rows if a["n_r_after"] > CFG.kappa), None)
        if over is None:
            assert rid not in retired or "rho_r" in retired[rid]["reason"]
            continue
        # retire runs right after the step's scoring, before any capacity replacement of that step
        assert rid in retired, f"{rid} crossed kappa at step {over['step']} group {over['group']} but was not retired"
        ev = retired[rid]
        assert (ev["step"], ev["group"]) == (over["step"], over["group"]), ev
        assert ev["reason"].startswith(f"n_r={CFG.kappa + 1} > kappa={CFG.kappa}")
        later = [a for a in rows if a["step"] == over["step"] and a["group"] > over["group"]]
        mid += bool(later) and later[-1]["n_r_after"] <= CFG.kappa  # the step ended with n_r reset
        # No scoring of the rubric after the step in which it crossed kappa.
        assert not [a for a in log.activations if a["rubric_id"] == rid and a["step"] > over["step"]]
    assert mid >= 1


def test_flicker_run_resumed_after_every_crossing_score_stage_is_identical(runs):
    _, log, steps = runs["flicker"]
    _, log_r, steps_r = runs["flicker_resumed"]
    assert any(a["n_r_after"] > CFG.kappa for a in log.activations)
    assert log_r == log
    assert [s["state"] for s in steps_r.values()] == [s["state"] for s in steps.values()]
