"""Co-ReAct's judge roles (its §3.1-3.3, App. A), each declared once: the step-rubric writer, the verifier of a
proposed action and the list-wise ranking of candidate actions; the request, the reply's schema and parser, the
prompt (``prompts/``) and the offline heuristic (``heuristics.py``)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StrictBool, StringConstraints

from arbor.llm import prompts
from arbor.llm.base import CallContext, Judge, JudgeOutcome, Messages, Role, register
from arbor.llm.parse import (
    LABEL,
    PROSE,
    SENTENCE,
    InvalidOutput,
    Strict,
    Text,
    exactly,
    json_number,
    one_of,
    parse_json,
    sent_cap,
)
from arbor.llm.text import compact_trajectory, escape_block
from arbor.tasks.methods.coreact import heuristics
from arbor.tasks.methods.coreact.equations import RANK_LABELS, unshuffle_ranking
from arbor.types import RubricItem, StepRubric, StepVerdict

prompts.register_prompts(Path(__file__).parent / "prompts")
VERSIONS = {
    "step_rubric": "step_rubric.v1",  # Co-ReAct §3.2 (prompt-only rubric writer)
    "step_verify": "step_verify.v1",  # Co-ReAct §3.3 verifier
    "rank_actions": "rank_actions.v2",  # Co-ReAct §3.1, App. A: rationale, then the ranking as the final answer
    "rank_actions_json": "rank_actions.v1",  # arbor's bare-JSON ranking (guidance.rank_judges[i].rationale=false)
}


# ---- reply schemas -------------------------------------------------------------------------------------------------
STEP_RUBRIC_MAX_ITEMS = 8  # the prompt asks for 3-5; the format reward, not the parser, scores that


class RubricItemOut(Strict):
    weight: Annotated[float, BeforeValidator(json_number), Field(allow_inf_nan=False)]
    condition: Annotated[Text, sent_cap(SENTENCE)]


class StepRubricOut(Strict):
    items: list[RubricItemOut] = Field(min_length=1, max_length=STEP_RUBRIC_MAX_ITEMS)
    action: Annotated[str, StringConstraints(strip_whitespace=True), sent_cap(PROSE)]


class StepVerdictOut(Strict):
    satisfied: list[StrictBool]
    feedback: Annotated[str, StringConstraints(strip_whitespace=True), sent_cap(PROSE)]


class RankingOut(Strict):
    ranking: list[Annotated[str, StringConstraints(strip_whitespace=True, to_upper=True), sent_cap(LABEL)]]


def parse_step_rubric(text: str) -> StepRubric:
    """Co-ReAct's step rubric: 1-8 items, each a JSON-number weight (clamped to [-1, 1]) and a non-empty
    condition, and the recommended action (may be empty)."""
    out = parse_json(text, StepRubricOut)
    items = tuple(RubricItem(min(1.0, max(-1.0, float(i.weight))), i.condition)
                  for i in out.items)  # type: ignore[attr-defined]
    return StepRubric(items, out.action)  # type: ignore[attr-defined]


def parse_step_verdict(text: str, n_items: int) -> StepVerdict:
    """Co-ReAct's verifier: exactly ``n_items`` JSON booleans (rubric order) and a feedback string."""
    out = parse_json(text, StepVerdictOut)
    if len(out.satisfied) != n_items:  # type: ignore[attr-defined]
        raise InvalidOutput(f"StepVerdictOut: {len(out.satisfied)} verdicts for a rubric of {n_items}")  # type: ignore[attr-defined]
    return StepVerdict(tuple(out.satisfied), out.feedback)  # type: ignore[attr-defined]


def parse_ranking(text: str, labels: Sequence[str]) -> list[str]:
    """Co-ReAct's list-wise ranking: the shown ``labels`` (case-insensitive), each exactly once, best first."""
    ranking = parse_json(text, RankingOut).ranking  # type: ignore[attr-defined]
    if len(ranking) != len(labels) or set(ranking) != set(labels):
        raise InvalidOutput(f"RankingOut: {ranking} is not a permutation of {list(labels)}")
    return list(ranking)


# the heading: "Final answer" then a colon or the line's end (markdown around it allowed), not the phrase in a sentence
_FINAL_ANSWER = re.compile(r"final\s+answer[ \t*_#`]*(?::|\n|$)", re.I)
_LABEL_TOKEN = re.compile(r"(?<![A-Za-z0-9_'])([A-Z])(?![A-Za-z0-9_'])")


def parse_final_ranking(text: str, labels: Sequence[str]) -> list[str]:
    """Co-ReAct's list-wise ranking read from a judge's final answer (App. A: a rationale, then the ranking): the
    text after the LAST "Final answer:" heading (any case, markdown around it is fine), and in it the last JSON list
    of labels (or ``{"ranking": [...]}``); a final answer without JSON is read as the labels in the order they are
    written ("Y > X > W > Z"). It must hold the shown ``labels`` (any case), each exactly once, best first. No final
    answer, or one that is no such permutation: ``InvalidOutput`` (that judge's ranking is invalid)."""
    heads = list(_FINAL_ANSWER.finditer(text))
    if not heads:
        raise InvalidOutput("no 'Final answer:' section in the reply")
    section = text[heads[-1].end():].lstrip(" \t*_#:>`\n")
    found: list[Any] | None = None
    decoder = json.JSONDecoder(strict=False)
    for start in sorted((i for i, ch in enumerate(section) if ch in "[{"), reverse=True):  # the last one first
        try:
            obj, _ = decoder.raw_decode(section, start)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("ranking"), list):
            obj = obj["ranking"]
        if isinstance(obj, list) and obj and all(isinstance(x, str) for x in obj):
            found = obj
            break
    if found is None:
        found = [m.group(1) for m in _LABEL_TOKEN.finditer(section) if m.group(1) in labels]
    ranking = [str(x).strip().upper() for x in found]
    if len(ranking) != len(labels) or set(ranking) != set(labels):
        raise InvalidOutput(f"final answer {ranking} is not a permutation of {list(labels)}")
    return ranking


# ---- prompts ------------------------------------------------------------------------------------------------------
def _history(history: str, max_tokens: int) -> str:
    return escape_block(compact_trajectory(history, max_tokens)) if history.strip() else "(nothing yet)"


def _action(action: str, max_tokens: int) -> str:
    return escape_block(compact_trajectory(action, max_tokens)) or "(empty)"


def _phase(tool_calls: int, max_tool_calls: int) -> str:
    """Early (no search yet), late (at most one search left) or middle: the rubric writer's phase hint."""
    if tool_calls <= 0:
        return "early - no search yet: the next action searches, broadly; do not recommend answering."
    if tool_calls >= max_tool_calls - 1:
        return "late - at most one search left: answer if the evidence so far suffices."
    return "middle - searches remain: target the most important fact still missing."


def step_rubric_messages(question: str, history: str, tool_calls: int, max_tool_calls: int,
                         max_tokens: int) -> tuple[str, Messages]:
    """Co-ReAct §3.2: the question, the agent's history so far (compacted to ``max_tokens``), the searches made
    out of the budget and the phase they imply."""
    version = VERSIONS["step_rubric"]
    return version, prompts.render(version, question=escape_block(question), history=_history(history, max_tokens),
                           tool_calls=str(tool_calls), max_tool_calls=str(max_tool_calls),
                           phase=_phase(tool_calls, max_tool_calls))


def step_verify_messages(question: str, history: str, action: str, rubric: StepRubric,
                         max_tokens: int) -> tuple[str, Messages]:
    """Co-ReAct §3.3: the history, the proposed action and the rubric's items numbered from 1 in rubric order
    (``1. [0.4] condition``; the reply's verdicts follow these numbers)."""
    version = VERSIONS["step_verify"]
    items = "\n".join(f"{i + 1}. [{it.weight:g}] {escape_block(it.condition)}" for i, it in enumerate(rubric.items))
    return version, prompts.render(version, question=escape_block(question), history=_history(history, max_tokens),
                           action=_action(action, max_tokens // 2), items=items, n_items=str(len(rubric.items)))


def rank_actions_messages(question: str, golds: Sequence[str] | None, history: str, shown: Sequence[str],
                          max_tokens: int, rationale: bool = True) -> tuple[str, Messages]:
    """Co-ReAct §3.1: the history and the candidates in shown order, ``shown[j]`` under ``RANK_LABELS[j]`` (each
    compacted to ``max_tokens // 2``). ``rationale`` (App. A): the judge reasons first and ends with a "Final
    answer:" holding the ranking (v2); otherwise it replies with the JSON ranking only (v1)."""
    version = VERSIONS["rank_actions" if rationale else "rank_actions_json"]
    labels = RANK_LABELS[: len(shown)]
    blocks = [f'<candidate label="{lab}">\n{_action(a, max_tokens // 2)}\n</candidate>'
              for lab, a in zip(labels, shown, strict=True)]
    return version, prompts.render(version, question=escape_block(question), ground_truth=prompts.golds_block(golds),
                           history=_history(history, max_tokens), candidates="\n".join(blocks),
                           labels=", ".join(labels))


# ---- the roles ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepRubricRequest:
    question: str
    history: str
    tool_calls: int  # searches made so far (with max_tool_calls: the phase)
    max_tool_calls: int


def _step_rubric_prompt(q: StepRubricRequest, budget: int) -> tuple[str, Messages]:
    return step_rubric_messages(q.question, q.history, q.tool_calls, q.max_tool_calls, budget)


STEP_RUBRIC = register(Role(
    # step_rubric.v1: 1-8 weighted items (weights clamped to [-1, 1]) and a recommended action; no items, a
    # non-numeric weight or an empty condition is invalid output
    name="step_rubric", request=StepRubricRequest, render=_step_rubric_prompt,
    parse=lambda text, q: parse_step_rubric(text), schema=StepRubricOut,
    heuristic=lambda q, cfg: heuristics.step_rubric(q.question, q.history, q.tool_calls, q.max_tool_calls),
    identity=lambda q: (q.question, q.history, q.tool_calls, q.max_tool_calls),
    texts=lambda q: 1,
))


@dataclass(frozen=True)
class StepVerify:
    question: str
    history: str
    action: str
    rubric: StepRubric


def _step_verify_prompt(q: StepVerify, budget: int) -> tuple[str, Messages]:
    return step_verify_messages(q.question, q.history, q.action, q.rubric, budget)


STEP_VERIFY = register(Role(
    # step_verify.v1: exactly one boolean per rubric item (else invalid output) and feedback
    name="step_verify", request=StepVerify, render=_step_verify_prompt,
    parse=lambda text, q: parse_step_verdict(text, len(q.rubric.items)), schema=StepVerdictOut,
    heuristic=lambda q, cfg: heuristics.step_verify(q.history, q.action, q.rubric),
    identity=lambda q: (q.question, q.history, q.action, q.rubric),
    texts=lambda q: 2, items=lambda q: len(q.rubric.items),
    reply=(160, 8),  # one boolean per item, then a sentence or two of feedback
    skip=lambda q: StepVerdict((), "") if not q.rubric.items else None,  # nothing to verify
    narrow=lambda q, s: exactly(s, "satisfied", len(q.rubric.items)),
))


@dataclass(frozen=True)
class RankActions:
    """Candidates in the order they are *shown*, ``shown[j]`` labelled ``RANK_LABELS[j]`` (``ask_ranking``
    draws the relabelling and undoes it). ``rationale`` (App. A, the default): the judge reasons first and the
    ranking is read from its final answer; False: a bare JSON ranking under the role's schema."""

    question: str
    golds: Sequence[str] | None
    history: str
    shown: Sequence[str]
    rationale: bool = True


def _rank_prompt(q: RankActions, budget: int) -> tuple[str, Messages]:
    return rank_actions_messages(q.question, q.golds, q.history, q.shown, budget, q.rationale)


def _parse_rank(text: str, q: RankActions) -> list[str]:
    labels = RANK_LABELS[: len(q.shown)]
    return parse_final_ranking(text, labels) if q.rationale else parse_ranking(text, labels)


RANK_ACTIONS = register(Role(
    # rank_actions.v2 (rationale): free text whose final answer holds every shown label exactly once, best first;
    # rank_actions.v1 (rationale=False): that ranking as JSON only. Anything else is invalid output
    name="rank_actions", request=RankActions, render=_rank_prompt, parse=_parse_rank, schema=RankingOut,
    heuristic=lambda q, cfg: heuristics.rank_actions(q.question, q.golds, q.history, q.shown),
    identity=lambda q: (q.question, tuple(q.golds or ()), q.history, tuple(q.shown)),
    texts=lambda q: 1 + len(q.shown),
    # a free-text reasoned reply sends no response_format (a schema would forbid the rationale)
    narrow=lambda q, s: None if q.rationale else exactly(s, "ranking", len(q.shown),
                                                         one_of(RANK_LABELS[: len(q.shown)])),
))


async def ask_ranking(judge: Judge, question: str, golds: Sequence[str] | None, history: str,
                      candidates: Sequence[str], *, order: Sequence[int], rationale: bool = True,
                      ctx: CallContext | None = None) -> JudgeOutcome[list[int]]:
    """§3.1's list-wise expert ranking of candidate next actions. ``order`` is a permutation of
    range(len(candidates)) drawn by the caller: candidate ``order[j]`` is shown at position j as
    ``RANK_LABELS[j]``. Returns ``ranks`` in the caller's order (``ranks[i]``: rank of ``candidates[i]``,
    1 = best); the relabelling is undone here. ``rationale`` (App. A): the judge writes its reasoning first and
    the ranking is read from its final answer (``parse_final_ranking``); False: a bare JSON ranking. No
    candidates: ``[]`` without a call. ValueError on more candidates than labels or an ``order`` that is no
    permutation."""
    if len(candidates) > len(RANK_LABELS):
        raise ValueError(f"rank_actions: {len(candidates)} candidates, at most {len(RANK_LABELS)} labels")
    if sorted(order) != list(range(len(candidates))):
        raise ValueError(f"rank_actions: order {list(order)} is not a permutation of range({len(candidates)})")
    if not candidates:
        return JudgeOutcome([], None, 0, False)
    shown = [candidates[i] for i in order]
    out = await judge.ask(RANK_ACTIONS, question=question, golds=golds, history=history, shown=shown,
                          rationale=rationale, ctx=ctx)
    ranks = None if out.value is None else unshuffle_ranking(out.value, order)
    return JudgeOutcome(ranks, out.error, out.attempts, out.cache_hit)
