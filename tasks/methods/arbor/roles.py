"""ARBOR's judge roles (paper App. E), each declared once: contrastive induction (E.1, A.1), consolidation (E.2)
and pairwise judging under one rubric (E.3): the request, the reply's schema and parser, the prompt (``prompts/``),
and the offline heuristic (``heuristics.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from arbor.config.judge import JudgeConfig
from arbor.llm import prompts
from arbor.llm.base import CallContext, Judge, JudgeOutcome, Messages, Role, register
from arbor.llm.parse import PROSE, Strict, parse_json
from arbor.llm.text import escape_block
from arbor.tasks.methods.arbor import heuristics
from arbor.tasks.methods.arbor.heuristics import Winner
from arbor.tasks.methods.arbor.induction import contrast_pairs, unlabeled_members
from arbor.types import Rubric, RubricDraft, Trajectory

prompts.register_prompts(Path(__file__).parent / "prompts")
VERSIONS = {"induction": "induction.v1", "induction_unlabeled": "induction_unlabeled.v1",
            "consolidation": "consolidation.v1", "pairwise": "pairwise.v1"}


# ---- reply schemas -------------------------------------------------------------------------------------------------
class DraftOut(Strict):
    title: str = Field(min_length=1, max_length=300)
    description: str = Field(min_length=1, json_schema_extra={"maxLength": PROSE})
    counter_description: str = Field(min_length=1, json_schema_extra={"maxLength": PROSE})

    def to_draft(self) -> RubricDraft:
        return RubricDraft(self.title.strip(), self.description.strip(), self.counter_description.strip())


class InductionOut(Strict):
    rubrics: list[DraftOut] = Field(max_length=3)  # 1-3 rubrics, or [] ("existing rubrics already cover it")


class ConsolidationOut(Strict):
    new_common_rubrics: list[DraftOut] = Field(max_length=2)  # 1-2 standards, or []


class PairwiseOut(Strict):
    winner: Literal["A", "B", "TIE"]

    @field_validator("winner", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.strip().upper() if isinstance(v, str) else v


# ---- prompts ------------------------------------------------------------------------------------------------------
def _rubric_list(rubrics: Sequence[Rubric | RubricDraft]) -> str:
    if not rubrics:
        return "(none)"
    return "\n".join(
        f"- {escape_block(r.title)}\n  DO: {escape_block(r.description)}\n  AVOID: {escape_block(r.counter_description)}"
        for r in rubrics
    )


def induction_messages(question: str, golds: Sequence[str] | None, trajectories: Sequence[Trajectory],
                       anchors: Mapping[str, object], existing: Sequence[Rubric | RubricDraft],
                       max_tokens: int) -> tuple[str, Messages]:
    """E.1 contrastive induction, or its unlabeled variant (App. A.1) when ``anchors['mode'] == 'unlabeled'``."""
    common = {"question": escape_block(question), "ground_truth": prompts.golds_block(golds), "existing": _rubric_list(existing)}
    if anchors.get("mode") == "unlabeled":
        version = VERSIONS["induction_unlabeled"]
        members = unlabeled_members([t.format_valid for t in trajectories]) or list(range(len(trajectories)))
        blocks = [f'<trajectory index="{k + 1}">\n{prompts.trajectory_block(trajectories[i], max_tokens)}\n</trajectory>'
                  for k, i in enumerate(members)]
        return version, prompts.render(version, trajectories="\n".join(blocks), **common)
    version = VERSIONS["induction"]
    pairs = contrast_pairs(dict(anchors))
    if not pairs or any(not isinstance(i, int) for p in pairs for i in p):
        raise ValueError(f"anchors {dict(anchors)}: no contrast pair to induce from")
    names = ["best vs worst", "best vs hard negative"] if len(pairs) == 2 else ["best vs hard negative"]
    blocks = [
        f'<pair index="{k + 1}" kind="{names[k]}">\n<higher>\n{prompts.trajectory_block(trajectories[a], max_tokens)}\n</higher>\n'
        f"<lower>\n{prompts.trajectory_block(trajectories[b], max_tokens)}\n</lower>\n</pair>"
        for k, (a, b) in enumerate(pairs)
    ]
    return version, prompts.render(version, pairs="\n".join(blocks), **common)


def consolidation_messages(candidates_by_query: Mapping[str, Sequence[Rubric | RubricDraft]],
                           existing: Sequence[Rubric | RubricDraft]) -> tuple[str, Messages]:
    """E.2: existing common standards with DO / AVOID, candidates grouped by the query they came from."""
    groups = [
        f"Query {i + 1}: {escape_block(q)}\n{_rubric_list(drafts)}"
        for i, (q, drafts) in enumerate(candidates_by_query.items())
    ]
    version = VERSIONS["consolidation"]
    return version, prompts.render(version, existing=_rubric_list(existing), candidates="\n".join(groups))


def pairwise_messages(question: str, shown_a: Trajectory, shown_b: Trajectory, rubric: Rubric | RubricDraft,
                      max_tokens: int) -> tuple[str, Messages]:
    """E.3: ``shown_a`` is whatever the caller decided to present as Response A (after any swap)."""
    version = VERSIONS["pairwise"]
    return version, prompts.render(
        version, question=escape_block(question), response_a=prompts.trajectory_block(shown_a, max_tokens),
        response_b=prompts.trajectory_block(shown_b, max_tokens), description=escape_block(rubric.description),
        counter_description=escape_block(rubric.counter_description),
    )


# ---- the roles ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Induction:
    question: str
    golds: Sequence[str] | None
    trajectories: Sequence[Trajectory]
    anchors: Mapping[str, Any]  # induction.select_anchors: mode and anchor indices
    existing: Sequence[Rubric | RubricDraft]


def _induction_prompt(q: Induction, budget: int) -> tuple[str, Messages]:
    return induction_messages(q.question, q.golds, q.trajectories, q.anchors, q.existing, budget)


def _induction_parse(text: str, q: Induction) -> list[RubricDraft]:
    return [d.to_draft() for d in parse_json(text, InductionOut).rubrics]  # type: ignore[attr-defined]


INDUCTION = register(Role(
    name="induction", request=Induction, render=_induction_prompt, parse=_induction_parse, schema=InductionOut,
    heuristic=lambda q, cfg: heuristics.induce(q.question, q.trajectories, q.anchors, q.existing, cfg.rules_tolerance),
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


CONSOLIDATION = register(Role(
    name="consolidation", request=Consolidation,
    render=lambda q, budget: consolidation_messages(q.candidates_by_query, q.existing),
    parse=_consolidation_parse, schema=ConsolidationOut,
    heuristic=lambda q, cfg: heuristics.consolidate(q.candidates_by_query, q.existing),
    identity=lambda q: (tuple((query, tuple((d.feature, d.direction) for d in ds))
                              for query, ds in q.candidates_by_query.items()),),
))


@dataclass(frozen=True)
class Pairwise:
    """Two trajectories in the order they are *shown* (``ask_pairwise`` draws and undoes the swap of §3.4)."""

    question: str
    shown_a: Trajectory
    shown_b: Trajectory
    rubric: Rubric | RubricDraft


def _pairwise_heuristic(q: Pairwise, cfg: JudgeConfig) -> Winner:
    return heuristics.pairwise(q.question, q.shown_a, q.shown_b, q.rubric, cfg.rules_tolerance)


PAIRWISE = register(Role(
    name="pairwise", request=Pairwise,
    render=lambda q, budget: pairwise_messages(q.question, q.shown_a, q.shown_b, q.rubric, budget),
    parse=lambda text, q: parse_json(text, PairwiseOut).winner,  # type: ignore[attr-defined]
    schema=PairwiseOut, heuristic=_pairwise_heuristic,
    identity=lambda q: (q.question, q.shown_a.text, q.shown_b.text, q.rubric.feature, q.rubric.direction),
    texts=lambda q: 2,
))


def unswap(winner: Winner | None, swap: bool) -> Winner | None:
    """Map a verdict about the *shown* order back to the caller's order (undo the position swap of §3.4)."""
    if winner is None or not swap or winner == "TIE":
        return winner
    return "B" if winner == "A" else "A"


async def ask_pairwise(judge: Judge, question: str, traj_a: Trajectory, traj_b: Trajectory,
                       rubric: Rubric | RubricDraft, *, swap: bool = False,
                       ctx: CallContext | None = None) -> JudgeOutcome[Winner]:
    """E.3 under one criterion. ``swap=True`` shows ``traj_b`` as Response A (the call site draws it with
    ``arbor.seeding.coin(seed, step, group, rubric_id, edge)``); the returned winner always refers to the
    caller's (traj_a, traj_b) order, so the swap is undone here. value None = failed, never a tie."""
    shown_a, shown_b = (traj_b, traj_a) if swap else (traj_a, traj_b)
    out = await judge.ask(PAIRWISE, question=question, shown_a=shown_a, shown_b=shown_b, rubric=rubric, ctx=ctx)
    return JudgeOutcome(unswap(out.value, swap), out.error, out.attempts, out.cache_hit)
