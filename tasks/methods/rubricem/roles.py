"""RubricEM's own judge role (App. D.6.2): the grades of reflection candidates, declared once: the request, the
reply's schema and parser, the prompt (``prompts/``) and the offline heuristic (a keyword reading of the candidates
against the trajectory's weak points). The stage roles it shares with SS-GRPO live in ``ss_grpo/roles.py``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from arbor.format import reflection_blocks
from arbor.llm import prompts
from arbor.llm.base import Messages, Role, register
from arbor.llm.parse import TENTHS, Number, Strict, by_index, numbered, parse_json, sent_choices
from arbor.llm.reading import STOP_WORDS, entity_tokens
from arbor.llm.text import compact_trajectory, escape_block, normalize_answer, parse_trajectory
from arbor.reward import exact_match
from arbor.tasks.methods.ss_grpo.heuristics import STAGE_FEATURES
from arbor.tasks.methods.ss_grpo.roles import stage_rubric_line
from arbor.types import ReflectionGrade, RubricGrade, StageRubric, Trajectory

prompts.register_prompts(Path(__file__).parent / "prompts")
VERSIONS = {"reflection_grades": "reflection_grades.v1"}  # RubricEM App. D.6.2


# ---- reply schema --------------------------------------------------------------------------------------------------
class ReflectionGradeOut(Strict):
    index: Number
    diagnosis: float = Field(ge=0.0, le=1.0, allow_inf_nan=False, json_schema_extra=sent_choices(TENTHS))
    specificity: float = Field(ge=0.0, le=1.0, allow_inf_nan=False, json_schema_extra=sent_choices(TENTHS))
    scope: float = Field(ge=0.0, le=1.0, allow_inf_nan=False, json_schema_extra=sent_choices(TENTHS))


class ReflectionGradesOut(Strict):
    grades: list[ReflectionGradeOut]


def parse_reflection_grades(text: str, n: int) -> list[ReflectionGrade]:
    """D.6.2: one (diagnosis, specificity, scope) in [0, 1] per candidate index 1..n, returned in candidate order."""
    grades = by_index(parse_json(text, ReflectionGradesOut).grades, n,  # type: ignore[attr-defined]
                       "ReflectionGradesOut")
    return [ReflectionGrade(g.diagnosis, g.specificity, g.scope) for g in grades]


# ---- prompt -------------------------------------------------------------------------------------------------------
def _grade_meaning(r: StageRubric, score: int) -> str:
    if r.polarity >= 0:
        return {2: "quality fully shown", 1: "quality partly shown", 0: "quality absent"}.get(score, "?")
    return {2: "flaw fully present", 1: "flaw partly present", 0: "flaw avoided"}.get(score, "?")


def reflection_grades_messages(question: str, golds: Sequence[str] | None, trajectory: Trajectory,
                               graded: Sequence[tuple[StageRubric, RubricGrade]], candidates: Sequence[str],
                               max_tokens: int) -> tuple[str, Messages]:
    """RubricEM D.6.2: the graded trajectory with the evaluator's grades and justifications (privileged context),
    then the reflection candidates, numbered from 1 in the caller's order (each compacted to ``max_tokens``)."""
    version = VERSIONS["reflection_grades"]
    grades = "\n".join(
        f"{i + 1}. {stage_rubric_line(r)}\n   score {g.score} ({_grade_meaning(r, g.score)}): "
        f"{escape_block(g.justification) or '(no justification)'}"
        for i, (r, g) in enumerate(graded)) or "(none)"
    blocks = [f'<candidate index="{i + 1}">\n{escape_block(compact_trajectory(c, max_tokens))}\n</candidate>'
              for i, c in enumerate(candidates)]
    return version, prompts.render(version, question=escape_block(question), ground_truth=prompts.golds_block(golds),
                           trajectory=prompts.trajectory_block(trajectory, max_tokens), grades=grades, candidates="\n".join(blocks))


# ---- the offline heuristic (D.6.2) --------------------------------------------------------------------------------
def reflection_grades(question: str, golds: Sequence[str] | None, trajectory: Trajectory,
                      graded: Sequence[tuple[StageRubric, RubricGrade]],
                      candidates: Sequence[str]) -> list[ReflectionGrade]:
    """D.6.2 as a keyword HEURISTIC (it does not judge whether the advice is right), one grade per candidate in
    order, each dimension in [0, 1]; a candidate without a non-empty ``<reflection_rubrics>`` and a non-empty
    ``<reflection_takeaways>`` block (D.6.1) gets 0 on all three:

    - diagnosis: the weak points are the rubrics graded below full (a quality at 0 or 1, a flaw at 1 or 2)
      plus, when golds are given and the final answer matches none, the failure itself. The share of weak
      points the candidate mentions (a feature's cue stems, an LLM rubric's title words, for the failure a
      failure word or the wrong / right answer). No weak point: 1, or 0.5 when it claims a failure anyway.
    - specificity: the mean of the share of the question's entities it names and whether it quotes one of
      the trajectory's queries or its final answer (concrete, not "be more careful").
    - scope: the mean of (1-4 takeaways), (the share of takeaways that are distinct and not copied from the
      rubrics block) and (the share of D.6.1's four categories the rubrics block names)."""
    weak = _weak_points(question, golds, trajectory, graded)
    return [_grade_reflection(c, question, trajectory, weak) for c in candidates]


REFLECTION_CATEGORIES = ("critical requirement", "analytical approach", "communication", "pitfall")  # D.6.1
_FAILURE_CUES = ("wrong", "incorrect", "error", "mistak", "fail", "miss")
_ITEM_MARK = re.compile(r"^\s*(?:[-*•]|\(?\d+[.)]|\(?[a-z][.)])\s*")


Cues = tuple[tuple[str, ...], tuple[str, ...]]  # (word stems, whole normalised phrases)


def _mentions(norm: str, cues: Cues) -> bool:
    """Whether normalised text holds a cue: a word starting with one of the stems, or one of the phrases whole."""
    stems, phrases = cues
    words = norm.split()
    return any(w.startswith(s) for s in stems for w in words) or any(f" {p} " in f" {norm} " for p in phrases)


def _weak_points(question: str, golds: Sequence[str] | None, trajectory: Trajectory,
                 graded: Sequence[tuple[StageRubric, RubricGrade]]) -> list[Cues]:
    """The cues of what went wrong: rubrics graded below full (a feature's cue stems; an LLM rubric's title words
    of four letters or more), and a final answer that matches no gold (failure stems, the answer, the golds)."""
    weak: list[Cues] = []
    for r, g in graded:
        if (g.score if r.polarity > 0 else 2 - g.score) >= 2:
            continue
        f = STAGE_FEATURES.get(r.feature or "")
        stems = f.cues if f else tuple(w for w in normalize_answer(r.title).split() if len(w) >= 4 and w not in STOP_WORDS)
        weak.append((stems, ()))
    answer = parse_trajectory(trajectory.text).answer
    if golds and not exact_match(answer, list(golds)):
        said = tuple(normalize_answer(x) for x in [answer or "", *golds] if normalize_answer(x))
        weak.append((_FAILURE_CUES, said))
    return [w for w in weak if w[0] or w[1]]


def _grade_reflection(candidate: str, question: str, trajectory: Trajectory,
                      weak: Sequence[Cues]) -> ReflectionGrade:
    blocks = reflection_blocks(candidate)
    if blocks is None:
        return ReflectionGrade(0.0, 0.0, 0.0)
    rubrics, takeaways = blocks
    norm = normalize_answer(f"{rubrics} {takeaways}")
    if weak:
        diagnosis = sum(_mentions(norm, cues) for cues in weak) / len(weak)
    else:
        diagnosis = 0.5 if _mentions(norm, (_FAILURE_CUES, ())) else 1.0
    ents = entity_tokens(question)
    words = set(norm.split())
    p = parse_trajectory(trajectory.text)
    concrete = [normalize_answer(x) for x in [*p.queries, p.answer or ""] if normalize_answer(x)]
    quotes = float(any(f" {c} " in f" {norm} " for c in concrete))
    specificity = (sum(e <= words for e in ents) / len(ents) + quotes) / 2 if ents else quotes
    items = [normalize_answer(_ITEM_MARK.sub("", line)) for line in takeaways.splitlines()]
    items = [i for i in items if i]
    count_ok = float(1 <= len(items) <= 4)
    rub_norm = f" {normalize_answer(rubrics)} "
    fresh = [i for k, i in enumerate(items) if i not in items[:k] and f" {i} " not in rub_norm]
    distinct = len(fresh) / len(items) if items else 0.0
    low = rubrics.lower()
    coverage = sum(c in low for c in REFLECTION_CATEGORIES) / len(REFLECTION_CATEGORIES)
    return ReflectionGrade(diagnosis, specificity, (count_ok + distinct + coverage) / 3)


# ---- the role -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReflectionGrades:
    question: str
    golds: Sequence[str] | None
    trajectory: Trajectory
    graded: Sequence[tuple[StageRubric, RubricGrade]]  # the trajectory's stage grades (privileged context)
    candidates: Sequence[str]


def _reflection_prompt(q: ReflectionGrades, budget: int) -> tuple[str, Messages]:
    return reflection_grades_messages(q.question, q.golds, q.trajectory, q.graded, q.candidates, budget)


REFLECTION_GRADES = register(Role(
    # reflection_grades.v1: diagnosis, specificity and scope in [0, 1] for every candidate index exactly once, in
    # candidate order; the caller weights them (0.4 / 0.3 / 0.3)
    name="reflection_grades", request=ReflectionGrades, render=_reflection_prompt,
    parse=lambda text, q: parse_reflection_grades(text, len(q.candidates)), schema=ReflectionGradesOut,
    heuristic=lambda q, cfg: reflection_grades(q.question, q.golds, q.trajectory, q.graded, q.candidates),
    identity=lambda q: (q.question, tuple(q.golds or ()), q.trajectory.text,
                        tuple((r.feature, r.title, r.polarity, g.score) for r, g in q.graded), tuple(q.candidates)),
    texts=lambda q: 1 + len(q.candidates), items=lambda q: len(q.candidates),
    reply=(32, 48),  # per candidate: index and three numbers
    skip=lambda q: [] if not q.candidates else None,
    narrow=lambda q, s: numbered(s, "grades", len(q.candidates)),
))
