"""ARCO's judge role, declared once: the warm-up teacher that labels each step of a trajectory with k criteria and
scores; the request, the reply's schema and parser, the prompt (``prompts/``) and the offline heuristic (criteria
read from the step alone, ``step_criteria``, which Co-ReAct's ranking heuristic reuses)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import Field

from arbor.llm import prompts
from arbor.llm.base import Messages, Role, register
from arbor.llm.parse import SENTENCE, InvalidOutput, Strict, each_exactly, exactly, parse_json, sent_cap
from arbor.llm.reading import contains_phrase, content_tokens, question_entities
from arbor.llm.text import compact_trajectory, escape_block, normalize_answer, parse_trajectory
from arbor.types import StepLabel, Trajectory

prompts.register_prompts(Path(__file__).parent / "prompts")
VERSIONS = {"step_labels": "step_labels.v1"}  # ARCO's warm-up teacher


# ---- reply schema --------------------------------------------------------------------------------------------------
class StepLabelOut(Strict):
    criteria: list[Annotated[str, sent_cap(SENTENCE)]]
    scores: list[Annotated[float, Field(allow_inf_nan=False)]]


class StepLabelsOut(Strict):
    steps: list[StepLabelOut]


def parse_step_labels(text: str, n: int, k: int) -> list[StepLabel]:
    """ARCO's teacher: one entry per step (exactly ``n``); each step's criteria and scores are cut or padded to
    ``k`` (a short score list repeats its last value, missing criteria are empty) and scores clamped to [-1, 1]."""
    steps = parse_json(text, StepLabelsOut).steps  # type: ignore[attr-defined]
    if len(steps) != n:
        raise InvalidOutput(f"StepLabelsOut: {len(steps)} steps for a trajectory of {n}")
    out = []
    for s in steps:
        if not s.scores:
            raise InvalidOutput("StepLabelsOut: a step without scores")
        scores = [min(1.0, max(-1.0, float(v))) for v in s.scores[:k]]
        scores += [scores[-1]] * (k - len(scores))
        criteria = [c.strip() for c in s.criteria[:k]] + [""] * (k - len(s.criteria[:k]))
        out.append(StepLabel(tuple(criteria), tuple(scores)))
    return out


# ---- prompt -------------------------------------------------------------------------------------------------------
def step_labels_messages(question: str, golds: Sequence[str] | None, trajectory: Trajectory,
                         steps: Sequence[tuple[str, str]], k: int, max_tokens: int) -> tuple[str, Messages]:
    """ARCO's teacher: the whole trajectory's steps, numbered from 1 (each action with the result after it), the
    outcome reward, and how many criteria to write per step."""
    version = VERSIONS["step_labels"]
    listed = "\n".join(f"Step {i + 1}:\n  action: {escape_block(compact_trajectory(a, max_tokens // 2))}\n"
                       f"  result: {escape_block(compact_trajectory(o, max_tokens // 2)) or '(none)'}"
                       for i, (a, o) in enumerate(steps))
    return version, prompts.render(version, question=escape_block(question), ground_truth=prompts.golds_block(golds),
                           steps=listed, n_steps=str(len(steps)), k=str(k),
                           outcome=f"{trajectory.base_reward:.3f}")


# ---- the offline heuristic ---------------------------------------------------------------------------------------
def step_labels(question: str, golds: Sequence[str] | None, steps: Sequence[tuple[str, str]],
                k: int) -> list[StepLabel]:
    """ARCO's teacher as a HEURISTIC: each step gets up to three criteria read from its action and result
    (``step_criteria``), cycled to ``k``."""
    out = []
    queries: list[str] = []
    for action, result in steps:
        crit = step_criteria(question, golds or [], action, result, queries)
        out.append(StepLabel(tuple(crit[j % len(crit)][0] for j in range(k)),
                             tuple(crit[j % len(crit)][1] for j in range(k))))
        queries += parse_trajectory(action).queries
    return out


def step_criteria(question: str, golds: Sequence[str], action: str, result: str,
                  earlier_queries: Sequence[str]) -> list[tuple[str, float]]:
    """(criterion, score in [-1, 1]) for one step, from features of the step alone:

    - a search: it names the question's entities (2 x share - 1), it is new (+1, a repeat -1), and its result
      holds a gold answer (+1), else a question entity (0), else nothing useful (-1);
    - an answer: it matches a gold answer (2 F1 - 1), it is short (at most four words: a name, not a
      sentence), and it is boxed;
    - anything else (no search, no answer): one criterion, -1."""
    from arbor.reward import token_f1

    p = parse_trajectory(action)
    result = re.sub(r"<[^>]*>", " ", result)  # the result's text without its tags
    ents = question_entities(question)
    ent_tokens = set().union(*(content_tokens(e) for e in ents)) if ents else set()
    if p.answer is not None:
        f1 = token_f1(p.answer, list(golds)) if golds else 0.0
        boxed = "\\boxed{" in action
        return [(f"The answer matches {' or '.join(golds[:2]) or 'the gold answer'}", 2 * f1 - 1),
                ("The answer is a short entity name, not a sentence", 1.0 if len(p.answer.split()) <= 4 else -1.0),
                ("The answer is given in the required boxed format", 1.0 if boxed else -1.0)]
    if p.queries:
        q = p.queries[-1]
        share = len(ent_tokens & content_tokens(q)) / len(ent_tokens) if ent_tokens else 0.0
        repeat = normalize_answer(q) in {normalize_answer(e) for e in earlier_queries}
        if golds and any(contains_phrase(result, g) for g in golds):
            found = 1.0
        elif any(contains_phrase(result, e) for e in ents):
            found = 0.0
        else:
            found = -1.0
        return [(f"The query names {', '.join(ents[:2]) or 'the entities of the question'}", 2 * share - 1),
                ("The query does not repeat an earlier search", -1.0 if repeat else 1.0),
                ("The result brings the fact the question asks for", found)]
    return [("The step searches or answers", -1.0)]

# ---- the role -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepLabels:
    question: str
    golds: Sequence[str] | None
    trajectory: Trajectory
    steps: Sequence[tuple[str, str]]  # (action, the result that followed), in order
    k: int  # criteria per step


def _step_labels_prompt(q: StepLabels, budget: int) -> tuple[str, Messages]:
    return step_labels_messages(q.question, q.golds, q.trajectory, q.steps, q.k, budget)


STEP_LABELS = register(Role(
    # step_labels.v1: one entry per step with k criteria and scores (another number of steps is invalid output)
    name="step_labels", request=StepLabels, render=_step_labels_prompt,
    parse=lambda text, q: parse_step_labels(text, len(q.steps), q.k), schema=StepLabelsOut,
    heuristic=lambda q, cfg: step_labels(q.question, q.golds, q.steps, q.k),
    identity=lambda q: (q.question, tuple(q.golds or ()), tuple(q.steps), q.k),
    texts=lambda q: len(q.steps), items=lambda q: len(q.steps) * q.k,
    reply=(32, 40),  # per step and criterion: a short criterion and its score
    skip=lambda q: [] if not q.steps else None,
    narrow=lambda q, s: exactly(s, "steps", len(q.steps), each_exactly(q.k, "criteria", "scores")),
))
