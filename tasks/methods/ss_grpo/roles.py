"""SS-GRPO's judge roles (RubricEM App. C.2, C.3), each declared once: stage rubrics from a contrasted group and the
stage grades of one trajectory; the request, the reply's schema and parser, the prompt (``prompts/``) and the
offline heuristic (``heuristics.py``). RubricEM asks them too (it extends SS-GRPO) and adds its reflection role."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import Field, StringConstraints

from arbor.llm import prompts
from arbor.llm.base import Messages, Role, register
from arbor.llm.parse import (
    PROSE,
    SENTENCE,
    InvalidOutput,
    Number,
    Strict,
    Text,
    by_index,
    numbered,
    parse_json,
    sent_cap,
    sent_choices,
)
from arbor.llm.text import escape_block
from arbor.tasks.methods.ss_grpo import heuristics
from arbor.types import RubricGrade, StageRubric, StageRubricDraft, Trajectory

prompts.register_prompts(Path(__file__).parent / "prompts")
VERSIONS = {"stage_rubrics": "stage_rubrics.v1", "stage_grades": "stage_grades.v1"}  # RubricEM App. C.2, C.3


# ---- reply schemas -------------------------------------------------------------------------------------------------
STAGE_MAX_NEW = (4, 4, 4, 5)  # C.2 targets, read as the most one reply may add per stage (positive + negative)



class StageDraftOut(Strict):
    title: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=300)]
    description: Annotated[Text, sent_cap(PROSE)]
    weight: Number = Field(ge=1, le=3, json_schema_extra=sent_choices((1, 2, 3)))  # 1 minor, 2 important, 3 critical


class StageSetOut(Strict):
    positive_rubrics: list[StageDraftOut] = Field(default_factory=list)
    negative_rubrics: list[StageDraftOut] = Field(default_factory=list)


class StageRubricsOut(Strict):
    """C.2: rubrics by stage, each stage key present (empty lists where there is nothing to add)."""

    stage_1: StageSetOut
    stage_2: StageSetOut
    stage_3: StageSetOut
    stage_4: StageSetOut

    def to_drafts(self) -> list[StageRubricDraft]:
        """Stage order; within a stage the positive rubrics, then the negative ones. More rubrics in one stage
        than ``STAGE_MAX_NEW`` allows is invalid output."""
        out: list[StageRubricDraft] = []
        for k, s in enumerate((self.stage_1, self.stage_2, self.stage_3, self.stage_4), start=1):
            if len(s.positive_rubrics) + len(s.negative_rubrics) > STAGE_MAX_NEW[k - 1]:
                raise InvalidOutput(f"StageRubricsOut: more than {STAGE_MAX_NEW[k - 1]} rubrics in stage_{k}")
            for polarity, items in ((1, s.positive_rubrics), (-1, s.negative_rubrics)):
                out += [StageRubricDraft(k, d.title, d.description, d.weight, polarity) for d in items]
        return out


class GradeOut(Strict):
    index: Number
    score: Number = Field(ge=0, le=2, json_schema_extra=sent_choices((0, 1, 2)))
    justification: Annotated[str, StringConstraints(strip_whitespace=True), sent_cap(SENTENCE)] = ""


class StageGradesOut(Strict):
    scores: list[GradeOut]


def parse_stage_rubrics(text: str) -> list[StageRubricDraft]:
    """C.2: drafts by stage (``StageRubricsOut.to_drafts``)."""
    return parse_json(text, StageRubricsOut).to_drafts()  # type: ignore[attr-defined]


def parse_stage_grades(text: str, n: int) -> list[RubricGrade]:
    """C.3: one 0/1/2 score per rubric index 1..n, returned in rubric order."""
    scores = by_index(parse_json(text, StageGradesOut).scores, n, "StageGradesOut")  # type: ignore[attr-defined]
    return [RubricGrade(g.score, g.justification) for g in scores]


# ---- prompts ------------------------------------------------------------------------------------------------------
STAGE_LABELS = {1: "Plan", 2: "Research", 3: "Review", 4: "Answer"}


def stage_rubric_line(r: StageRubric) -> str:
    """``[Stage 2 Research | NEGATIVE | weight 2] Title: description`` (escaped)."""
    kind = "POSITIVE" if r.polarity >= 0 else "NEGATIVE"
    return (f"[Stage {r.stage} {STAGE_LABELS.get(r.stage, '?')} | {kind} | weight {r.weight}] "
            f"{escape_block(r.title)}: {escape_block(r.description)}")


def _existing_by_stage(existing: Sequence[StageRubric]) -> str:
    if not existing:
        return "(none)"
    lines = []
    for stage, label in STAGE_LABELS.items():
        mine = [r for r in existing if r.stage == stage]
        if mine:
            lines.append(f"Stage {stage} ({label}):")
            lines += [f"- {stage_rubric_line(r)}" for r in mine]
    lines += [f"- {stage_rubric_line(r)}" for r in existing if r.stage not in STAGE_LABELS]
    return "\n".join(lines)


def stage_rubrics_messages(question: str, golds: Sequence[str] | None, trajectories: Sequence[Trajectory],
                           existing: Sequence[StageRubric], max_tokens: int) -> tuple[str, Messages]:
    """RubricEM C.2: every trajectory of the group (numbered, each compacted to ``max_tokens``) and the question's
    current stage rubrics; the reply holds new positive / negative rubrics by stage."""
    version = VERSIONS["stage_rubrics"]
    blocks = [f'<trajectory index="{i + 1}">\n{prompts.trajectory_block(t, max_tokens)}\n</trajectory>' for i, t in enumerate(trajectories)]
    return version, prompts.render(version, question=escape_block(question), ground_truth=prompts.golds_block(golds),
                           trajectories="\n".join(blocks), existing=_existing_by_stage(existing))


def stage_grades_messages(question: str, golds: Sequence[str] | None, trajectory: Trajectory,
                          rubrics: Sequence[StageRubric], max_tokens: int) -> tuple[str, Messages]:
    """RubricEM C.3: one trajectory and its question's rubrics, numbered from 1 in the caller's order (the reply's
    indices refer to these numbers)."""
    version = VERSIONS["stage_grades"]
    listed = "\n".join(f"{i + 1}. {stage_rubric_line(r)}" for i, r in enumerate(rubrics))
    return version, prompts.render(version, question=escape_block(question), ground_truth=prompts.golds_block(golds),
                           trajectory=prompts.trajectory_block(trajectory, max_tokens), rubrics=listed)


# ---- the roles ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StageRubrics:
    question: str
    golds: Sequence[str] | None
    trajectories: Sequence[Trajectory]
    existing: Sequence[StageRubric]


def _stage_rubrics_prompt(q: StageRubrics, budget: int) -> tuple[str, Messages]:
    return stage_rubrics_messages(q.question, q.golds, q.trajectories, q.existing, budget)


STAGE_RUBRICS = register(Role(
    # stage_rubrics.v1: positive and negative rubrics by stage, weight 1-3, at most 4 per stage for stages 1-3 and
    # 5 for stage 4 (more is invalid output)
    name="stage_rubrics", request=StageRubrics, render=_stage_rubrics_prompt,
    parse=lambda text, q: parse_stage_rubrics(text), schema=StageRubricsOut,
    heuristic=lambda q, cfg: heuristics.stage_rubrics(q.question, q.trajectories, q.existing),
    identity=lambda q: (q.question, tuple(t.text for t in q.trajectories),
                        tuple(t.format_valid for t in q.trajectories),
                        tuple(sorted({r.feature for r in q.existing if r.feature}))),
    texts=lambda q: len(q.trajectories),
    skip=lambda q: [] if len(q.trajectories) < 2 else None,  # nothing to contrast
))


@dataclass(frozen=True)
class StageGrades:
    question: str
    golds: Sequence[str] | None
    trajectory: Trajectory
    rubrics: Sequence[StageRubric]


def _stage_grades_prompt(q: StageGrades, budget: int) -> tuple[str, Messages]:
    return stage_grades_messages(q.question, q.golds, q.trajectory, q.rubrics, budget)


STAGE_GRADES = register(Role(
    # stage_grades.v1: every rubric index scored exactly once, 0/1/2 (else invalid output), in rubric order
    name="stage_grades", request=StageGrades, render=_stage_grades_prompt,
    parse=lambda text, q: parse_stage_grades(text, len(q.rubrics)), schema=StageGradesOut,
    heuristic=lambda q, cfg: heuristics.stage_grades(q.question, q.trajectory, q.rubrics),
    identity=lambda q: (q.question, q.trajectory.text, tuple((r.feature, r.polarity) for r in q.rubrics)),
    texts=lambda q: 1, items=lambda q: len(q.rubrics),
    reply=(32, 64),  # per rubric: {"index", "score", "justification": one sentence}
    skip=lambda q: [] if not q.rubrics else None,
    narrow=lambda q, s: numbered(s, "scores", len(q.rubrics)),
))
