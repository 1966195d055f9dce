"""ARBOR's judge roles (paper App. E): contrastive induction (E.1, A.1), consolidation (E.2), pairwise judging
under one rubric (E.3) and answer accuracy (E.4)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from arbor.config.judge import JudgeConfig
from arbor.llm import prompts, rules
from arbor.llm.base import Messages, Role, Winner, register
from arbor.llm.parse import (
    AccuracyOut,
    ConsolidationOut,
    InductionOut,
    PairwiseOut,
    parse_accuracy,
    parse_json,
)
from arbor.types import Rubric, RubricDraft, Trajectory


@dataclass(frozen=True)
class Induction:
    question: str
    golds: Sequence[str] | None
    trajectories: Sequence[Trajectory]
    anchors: Mapping[str, Any]  # tasks.induction.select_anchors: mode and anchor indices
    existing: Sequence[Rubric | RubricDraft]


def _induction_prompt(q: Induction, budget: int) -> tuple[str, Messages]:
    return prompts.induction_messages(q.question, q.golds, q.trajectories, q.anchors, q.existing, budget)


def _induction_parse(text: str, q: Induction) -> list[RubricDraft]:
    return [d.to_draft() for d in parse_json(text, InductionOut).rubrics]  # type: ignore[attr-defined]


register(Role(
    name="induction", request=Induction, render=_induction_prompt, parse=_induction_parse, schema=InductionOut,
    heuristic=lambda q, cfg: rules.induce(q.question, q.trajectories, q.anchors, q.existing, cfg.rules_tolerance),
    identity=lambda q: (q.question, tuple(t.text for t in q.trajectories), tuple(sorted(q.anchors.items()))),
    # the unlabeled variant (A.1) shows every trajectory; the labeled one its four anchors
    texts=lambda q: len(q.trajectories) if q.anchors.get("mode") == "unlabeled" else 4,
    skip=lambda q: [] if q.anchors.get("mode") in (None, "skip") else None,
))


@dataclass(frozen=True)
class Consolidation:
    candidates_by_query: Mapping[str, Sequence[Rubric | RubricDraft]]
    existing: Sequence[Rubric | RubricDraft]


def _consolidation_parse(text: str, q: Consolidation) -> list[RubricDraft]:
    return [d.to_draft() for d in parse_json(text, ConsolidationOut).new_common_rubrics]  # type: ignore[attr-defined]


register(Role(
    name="consolidation", request=Consolidation,
    render=lambda q, budget: prompts.consolidation_messages(q.candidates_by_query, q.existing),
    parse=_consolidation_parse, schema=ConsolidationOut,
    heuristic=lambda q, cfg: rules.consolidate(q.candidates_by_query, q.existing),
    identity=lambda q: (tuple((query, tuple((d.feature, d.direction) for d in ds))
                              for query, ds in q.candidates_by_query.items()),),
))


@dataclass(frozen=True)
class Pairwise:
    """Two trajectories in the order they are *shown* (``Judge.pairwise`` draws and undoes the swap of §3.4)."""

    question: str
    shown_a: Trajectory
    shown_b: Trajectory
    rubric: Rubric | RubricDraft


def _pairwise_heuristic(q: Pairwise, cfg: JudgeConfig) -> Winner:
    return rules.pairwise(q.question, q.shown_a, q.shown_b, q.rubric, cfg.rules_tolerance)


register(Role(
    name="pairwise", request=Pairwise,
    render=lambda q, budget: prompts.pairwise_messages(q.question, q.shown_a, q.shown_b, q.rubric, budget),
    parse=lambda text, q: parse_json(text, PairwiseOut).winner,  # type: ignore[attr-defined]
    schema=PairwiseOut, heuristic=_pairwise_heuristic,
    identity=lambda q: (q.question, q.shown_a.text, q.shown_b.text, q.rubric.feature, q.rubric.direction),
    texts=lambda q: 2,
))


@dataclass(frozen=True)
class Accuracy:
    question: str
    golds: Sequence[str]
    prediction: str | None


register(Role(
    name="accuracy", request=Accuracy,
    render=lambda q, budget: prompts.accuracy_messages(q.question, q.golds, q.prediction),
    parse=lambda text, q: parse_accuracy(text),  # E.4's verdict word, or {"verdict": ...} under a schema
    schema=AccuracyOut, heuristic=lambda q, cfg: rules.accuracy(q.golds, q.prediction),
    identity=lambda q: (q.question, tuple(q.golds), q.prediction),
))
