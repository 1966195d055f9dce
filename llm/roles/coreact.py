"""Co-ReAct's judge roles (its §3.1-3.3, App. A): the step-rubric writer, the verifier of a proposed action and
the list-wise ranking of candidate actions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from arbor.llm import prompts, rules
from arbor.llm.base import RANK_LABELS, Messages, Role, register
from arbor.llm.parse import (
    RankingOut,
    StepRubricOut,
    StepVerdictOut,
    exactly,
    one_of,
    parse_final_ranking,
    parse_ranking,
    parse_step_rubric,
    parse_step_verdict,
)
from arbor.types import StepRubric, StepVerdict


@dataclass(frozen=True)
class StepRubricRequest:
    question: str
    history: str
    tool_calls: int  # searches made so far (with max_tool_calls: the phase)
    max_tool_calls: int


def _step_rubric_prompt(q: StepRubricRequest, budget: int) -> tuple[str, Messages]:
    return prompts.step_rubric_messages(q.question, q.history, q.tool_calls, q.max_tool_calls, budget)


register(Role(
    # step_rubric.v1: 1-8 weighted items (weights clamped to [-1, 1]) and a recommended action; no items, a
    # non-numeric weight or an empty condition is invalid output
    name="step_rubric", request=StepRubricRequest, render=_step_rubric_prompt,
    parse=lambda text, q: parse_step_rubric(text), schema=StepRubricOut,
    heuristic=lambda q, cfg: rules.step_rubric(q.question, q.history, q.tool_calls, q.max_tool_calls),
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
    return prompts.step_verify_messages(q.question, q.history, q.action, q.rubric, budget)


register(Role(
    # step_verify.v1: exactly one boolean per rubric item (else invalid output) and feedback
    name="step_verify", request=StepVerify, render=_step_verify_prompt,
    parse=lambda text, q: parse_step_verdict(text, len(q.rubric.items)), schema=StepVerdictOut,
    heuristic=lambda q, cfg: rules.step_verify(q.history, q.action, q.rubric),
    identity=lambda q: (q.question, q.history, q.action, q.rubric),
    texts=lambda q: 2, items=lambda q: len(q.rubric.items),
    reply=(160, 8),  # one boolean per item, then a sentence or two of feedback
    skip=lambda q: StepVerdict((), "") if not q.rubric.items else None,  # nothing to verify
    narrow=lambda q, s: exactly(s, "satisfied", len(q.rubric.items)),
))


@dataclass(frozen=True)
class RankActions:
    """Candidates in the order they are *shown*, ``shown[j]`` labelled ``RANK_LABELS[j]`` (``Judge.rank_actions``
    draws the relabelling and undoes it). ``rationale`` (App. A, the default): the judge reasons first and the
    ranking is read from its final answer; False: a bare JSON ranking under the role's schema."""

    question: str
    golds: Sequence[str] | None
    history: str
    shown: Sequence[str]
    rationale: bool = True


def _rank_prompt(q: RankActions, budget: int) -> tuple[str, Messages]:
    return prompts.rank_actions_messages(q.question, q.golds, q.history, q.shown, budget, q.rationale)


def _parse_rank(text: str, q: RankActions) -> list[str]:
    labels = RANK_LABELS[: len(q.shown)]
    return parse_final_ranking(text, labels) if q.rationale else parse_ranking(text, labels)


register(Role(
    # rank_actions.v2 (rationale): free text whose final answer holds every shown label exactly once, best first;
    # rank_actions.v1 (rationale=False): that ranking as JSON only. Anything else is invalid output
    name="rank_actions", request=RankActions, render=_rank_prompt, parse=_parse_rank, schema=RankingOut,
    heuristic=lambda q, cfg: rules.rank_actions(q.question, q.golds, q.history, q.shown),
    identity=lambda q: (q.question, tuple(q.golds or ()), q.history, tuple(q.shown)),
    texts=lambda q: 1 + len(q.shown),
    # a free-text reasoned reply sends no response_format (a schema would forbid the rationale)
    narrow=lambda q, s: None if q.rationale else exactly(s, "ranking", len(q.shown),
                                                         one_of(RANK_LABELS[: len(q.shown)])),
))
