"""RubricEM's judge roles: stage rubrics from a contrasted group (App. C.2), stage grades of one trajectory (C.3)
and the grades of reflection candidates (D.6.2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from arbor.llm import prompts, rules
from arbor.llm.base import Messages, Role, register
from arbor.llm.parse import (
    ReflectionGradesOut,
    StageGradesOut,
    StageRubricsOut,
    numbered,
    parse_reflection_grades,
    parse_stage_grades,
    parse_stage_rubrics,
)
from arbor.types import RubricGrade, StageRubric, Trajectory


@dataclass(frozen=True)
class StageRubrics:
    question: str
    golds: Sequence[str] | None
    trajectories: Sequence[Trajectory]
    existing: Sequence[StageRubric]


def _stage_rubrics_prompt(q: StageRubrics, budget: int) -> tuple[str, Messages]:
    return prompts.stage_rubrics_messages(q.question, q.golds, q.trajectories, q.existing, budget)


register(Role(
    # stage_rubrics.v1: positive and negative rubrics by stage, weight 1-3, at most 4 per stage for stages 1-3 and
    # 5 for stage 4 (more is invalid output)
    name="stage_rubrics", request=StageRubrics, render=_stage_rubrics_prompt,
    parse=lambda text, q: parse_stage_rubrics(text), schema=StageRubricsOut,
    heuristic=lambda q, cfg: rules.stage_rubrics(q.question, q.trajectories, q.existing),
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
    return prompts.stage_grades_messages(q.question, q.golds, q.trajectory, q.rubrics, budget)


register(Role(
    # stage_grades.v1: every rubric index scored exactly once, 0/1/2 (else invalid output), in rubric order
    name="stage_grades", request=StageGrades, render=_stage_grades_prompt,
    parse=lambda text, q: parse_stage_grades(text, len(q.rubrics)), schema=StageGradesOut,
    heuristic=lambda q, cfg: rules.stage_grades(q.question, q.trajectory, q.rubrics),
    identity=lambda q: (q.question, q.trajectory.text, tuple((r.feature, r.polarity) for r in q.rubrics)),
    texts=lambda q: 1, items=lambda q: len(q.rubrics),
    reply=(32, 64),  # per rubric: {"index", "score", "justification": one sentence}
    skip=lambda q: [] if not q.rubrics else None,
    narrow=lambda q, s: numbered(s, "scores", len(q.rubrics)),
))


@dataclass(frozen=True)
class ReflectionGrades:
    question: str
    golds: Sequence[str] | None
    trajectory: Trajectory
    graded: Sequence[tuple[StageRubric, RubricGrade]]  # the trajectory's stage grades (privileged context)
    candidates: Sequence[str]


def _reflection_prompt(q: ReflectionGrades, budget: int) -> tuple[str, Messages]:
    return prompts.reflection_grades_messages(q.question, q.golds, q.trajectory, q.graded, q.candidates, budget)


register(Role(
    # reflection_grades.v1: diagnosis, specificity and scope in [0, 1] for every candidate index exactly once, in
    # candidate order; the caller weights them (0.4 / 0.3 / 0.3)
    name="reflection_grades", request=ReflectionGrades, render=_reflection_prompt,
    parse=lambda text, q: parse_reflection_grades(text, len(q.candidates)), schema=ReflectionGradesOut,
    heuristic=lambda q, cfg: rules.reflection_grades(q.question, q.golds, q.trajectory, q.graded, q.candidates),
    identity=lambda q: (q.question, tuple(q.golds or ()), q.trajectory.text,
                        tuple((r.feature, r.title, r.polarity, g.score) for r, g in q.graded), tuple(q.candidates)),
    texts=lambda q: 1 + len(q.candidates), items=lambda q: len(q.candidates),
    reply=(32, 48),  # per candidate: index and three numbers
    skip=lambda q: [] if not q.candidates else None,
    narrow=lambda q, s: numbered(s, "grades", len(q.candidates)),
))
