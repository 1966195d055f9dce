"""SS-GRPO's offline heuristics (the ``rules`` judge's answers to the stage roles, RubricEM App. C): machine-checkable
features of one stage of a staged response (``arbor.format.stage_spans``: Plan, Research, Review, Answer), each
mapped to a 0/1/2 grade by fixed thresholds; ``stage_rubrics`` proposes a rubric per feature whose grades differ
within the group and ``stage_grades`` reads the features back. Features, not understanding."""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from arbor.format import stage_spans
from arbor.llm.reading import (
    FORCED,
    Feature,
    answer_in_evidence,
    contains_phrase,
    content_tokens,
    entity_tokens,
    name_runs,
    question_entities,
    repeated_query_share,
    searches_after_evidence,
    tool_outputs,
)
from arbor.llm.text import normalize_answer, parse_trajectory
from arbor.types import RubricGrade, StagePolarity, StageRubric, StageRubricDraft, Trajectory

# Each reads one stage of a staged response (arbor.format.stage_spans; best effort on a malformed one) and returns
# a number; StageFeature.grade maps it to 0/1/2 by fixed thresholds. They never read meaning.
_TAG = re.compile(r"</?\w+>")


def _stage_text(text: str, stage: int) -> str:
    """The text of stage ``stage`` (1 Plan .. 4 Answer) with every tag removed."""
    a, b = stage_spans(text)[stage - 1]
    return _TAG.sub(" ", text[a:b])


def plan_entity_coverage(text: str, question: str) -> float:
    """Plan: share of the question's entities (``question_entities``) whose content tokens all occur in the Plan
    stage (0 without a plan or without entities)."""
    ents = entity_tokens(question)
    plan = content_tokens(_stage_text(text, 1))
    return sum(e <= plan for e in ents) / len(ents) if ents and plan else 0.0


def query_entity_coverage(text: str, question: str) -> float:
    """Research: share of the question's entities that at least one query names in full (all its content tokens;
    a later hop's query names a bridge entity instead, so the share is over entities, not a mean over queries)."""
    ents = entity_tokens(question)
    a, b = stage_spans(text)[1]
    qs = [content_tokens(q) for q in parse_trajectory(text[a:b]).queries]
    return sum(any(e <= q for q in qs) for e in ents) / len(ents) if ents and qs else 0.0


def evaluated_output_share(text: str, question: str) -> float:
    """Research: share of tool outputs whose next block (``<think>`` and stray text skipped) is a
    ``<state_evaluation>`` (0 without tool outputs; a forced "budget exhausted" message is not an output)."""
    segs = [s for s in parse_trajectory(text).segments if s.kind not in ("think", "other")]
    outs = [i for i, s in enumerate(segs) if s.kind == "result" and s.text.strip() not in FORCED]
    if not outs:
        return 0.0
    return sum(i + 1 < len(segs) and segs[i + 1].kind == "state_evaluation" for i in outs) / len(outs)


def review_grounds_answer(text: str, question: str) -> float:
    """Review: 1 when the Review stage names the final answer and some tool output holds it, 0.5 when the review
    names it but no tool output does, 0 when the review does not name it (or there is no final answer)."""
    ans = parse_trajectory(text).answer or ""
    if not normalize_answer(ans) or not contains_phrase(_stage_text(text, 3), ans):
        return 0.0
    return 1.0 if any(contains_phrase(r, ans) for r in tool_outputs(text)) else 0.5


def review_unsupported_names(text: str, question: str) -> float:
    """Review (a flaw): share of the names in the Review stage (``_names``) with a content token that occurs in
    no tool output and not in the question (0 when the review names nothing)."""
    names = [content_tokens(n) for n in name_runs(_stage_text(text, 3))]
    names = [n for n in names if n]
    if not names:
        return 0.0
    known = content_tokens(question).union(*(content_tokens(r) for r in tool_outputs(text)))
    return sum(not n <= known for n in names) / len(names)


@dataclass(frozen=True)
class StageFeature:
    """A stage feature and its grade: ``value >= high`` -> 2, ``value >= low`` -> 1, else 0 (compared with a 1e-9
    slack, so 1/3 + 2/3 counts as 1). ``polarity`` +1: a quality (the grade is how fully it is shown); -1: a flaw
    (the grade is how fully the flaw is present; callers invert). ``cues``: word stems a reflection uses when it
    talks about this feature (``reflection_grades``). ``{entities}`` in the description is filled per question."""

    stage: int
    fn: Feature
    low: float
    high: float
    polarity: StagePolarity
    weight: int
    title: str
    description: str
    cues: tuple[str, ...]

    def grade(self, value: float) -> int:
        return 2 if value >= self.high - 1e-9 else 1 if value >= self.low - 1e-9 else 0

    @property
    def rule(self) -> str:
        what = "quality" if self.polarity > 0 else "flaw"
        return f"{what} grade 2 at >= {self.high:g}, 1 at >= {self.low:g}, else 0"


_POS = 1e-6  # "any at all" for a share that is 0 when the flaw is absent
# The thresholds: shares of entities / outputs / answer words get 2 when complete and 1 from half; a flaw share
# gets 2 from half and 1 when present at all; a count of wasted searches gets 1 at one and 2 from two.
STAGE_FEATURES: dict[str, StageFeature] = {
    "plan_entity_coverage": StageFeature(
        1, plan_entity_coverage, 0.5, 1.0, 1, 2, "Plan covers every entity of the question",
        "The structured plan names each entity the question turns on ({entities}) and what must be found out about "
        "it. Grade 2: all of them; 1: at least half; 0: fewer.",
        ("plan", "entit", "decompo", "subgoal", "hop", "checklist")),
    "query_entity_coverage": StageFeature(
        2, query_entity_coverage, 0.5, 1.0, 1, 2, "Queries name the question's entities",
        "Each entity of the question ({entities}) is named in full by at least one search query, so the right pages "
        "come back directly. Grade 2: every entity; 1: at least half; 0: fewer.",
        ("quer", "entit", "specific", "keyword")),
    "repeated_query_share": StageFeature(
        2, repeated_query_share, _POS, 0.5, -1, 2, "Repeats an earlier query",
        "The agent re-issues a query it already ran (the same words after normalisation) instead of moving on to "
        "the next missing fact. Flaw grade 2: half or more of the queries are repeats; 1: some; 0: none.",
        ("repeat", "repetit", "duplicat", "redundan", "reissu")),
    "searches_after_evidence": StageFeature(
        2, searches_after_evidence, 1.0, 2.0, -1, 2, "Keeps searching after the answer was retrieved",
        "Searches go on after a tool output already contains the final answer, spending calls without new "
        "information. Flaw grade 2: two or more such searches; 1: one; 0: none.",
        ("stop", "unnecessar", "extra", "terminat", "already", "overs")),
    "evaluated_output_share": StageFeature(
        2, evaluated_output_share, 0.5, 1.0, 1, 1, "Weighs each tool output before the next step",
        "Every tool output is followed by a state evaluation that weighs it against the plan before the next "
        "search or the review. Grade 2: every output; 1: at least half; 0: fewer.",
        ("evaluat", "assess", "weigh", "reflect", "check")),
    "review_grounds_answer": StageFeature(
        3, review_grounds_answer, 0.5, 1.0, 1, 3, "Review states the answer the evidence supports",
        "The review names the answer the agent will give, and that answer occurs in a retrieved tool output. "
        "Grade 2: both; 1: the review names the answer but no tool output holds it; 0: the review does not name "
        "the final answer.",
        ("review", "verif", "confirm", "support", "audit")),
    "review_unsupported_names": StageFeature(
        3, review_unsupported_names, _POS, 0.5, -1, 2, "Review cites names the evidence does not contain",
        "The review mentions names (capitalised terms) found neither in the question nor in any tool output. "
        "Flaw grade 2: half or more of its names; 1: some; 0: none.",
        ("unsupport", "hallucin", "invent", "fabricat", "unground")),
    "answer_in_evidence": StageFeature(
        4, answer_in_evidence, 0.5, 1.0, 1, 3, "Final answer is grounded in the evidence",
        "Every word of the boxed final answer occurs in the retrieved tool outputs. Grade 2: all of its words; "
        "1: at least half; 0: fewer.",
        ("evidence", "ground", "support", "passage", "source")),
}
STAGE_MAX_NEW = {1: 4, 2: 4, 3: 4, 4: 5}  # App. C.2 targets, as caps on one call's new rubrics per stage


def stage_feature_value(feature: str, traj: Trajectory | str, question: str) -> float:
    text = traj if isinstance(traj, str) else traj.text
    return STAGE_FEATURES[feature].fn(text, question)


def stage_feature_grade(feature: str, traj: Trajectory | str, question: str) -> int:
    return STAGE_FEATURES[feature].grade(stage_feature_value(feature, traj, question))


def _stage_draft(name: str, question: str, grades: Sequence[int]) -> StageRubricDraft:
    f = STAGE_FEATURES[name]
    ents = ", ".join(question_entities(question)[:4]) or "its key terms"
    desc = f.description.replace("{entities}", ents) + f" (this group's grades: {', '.join(map(str, grades))})"
    return StageRubricDraft(f.stage, f.title, desc, f.weight, f.polarity, feature=name)


# ---- the heuristics of the stage roles (declared in roles.py) ------------------------------------------------
def stage_rubrics(question: str, trajectories: Sequence[Trajectory],
                  existing: Sequence[StageRubric]) -> list[StageRubricDraft]:
    """C.2 as features: one draft per stage feature whose 0/1/2 grades are not all equal across the group
    ("skip criteria where all trajectories perform similarly"), unless a rubric in ``existing`` already reads
    that feature. The grades compared are those of the format-valid trajectories (the ones a stage grader
    scores), or of all of them when fewer than two are valid. Per stage, the most discriminative first
    (population variance of the grades, then table order), at most 4 for stages 1-3 and 5 for stage 4; each
    feature has one fixed polarity, so no positive / negative mirrors. ``golds`` are not read."""
    covered = {r.feature for r in existing if r.feature}
    members = [t for t in trajectories if t.format_valid]
    if len(members) < 2:
        members = list(trajectories)
    ranked: list[tuple[int, float, int, str, list[int]]] = []
    for order, (name, f) in enumerate(STAGE_FEATURES.items()):
        if name in covered:
            continue
        grades = [f.grade(f.fn(t.text, question)) for t in members]
        if len(set(grades)) > 1:
            ranked.append((f.stage, -statistics.pvariance(grades), order, name, grades))
    ranked.sort()
    drafts: list[StageRubricDraft] = []
    for stage, cap in STAGE_MAX_NEW.items():
        mine = [r for r in ranked if r[0] == stage][:cap]
        drafts += [_stage_draft(name, question, grades) for *_, name, grades in mine]
    return drafts


def stage_grades(question: str, trajectory: Trajectory, rubrics: Sequence[StageRubric]) -> list[RubricGrade]:
    """C.3 from the features: one grade per rubric, in order, by its feature's thresholds (the feature decides,
    not the rubric's stage field). For a negative rubric the grade is how fully the flaw is present; a rubric
    whose polarity is the opposite of its feature's gets ``2 - grade``. A rubric without a stage feature
    (written by an LLM judge) cannot be read: it gets 0 for every trajectory, with a justification that says
    so, which is constant across the group (variance 0: it separates nothing and is pruned first)."""
    out: list[RubricGrade] = []
    for r in rubrics:
        f = STAGE_FEATURES.get(r.feature or "")
        if f is None:
            out.append(RubricGrade(0, f"not graded: the rules judge has no stage feature {r.feature!r} "
                                      "(the same 0 for every trajectory)"))
            continue
        value = f.fn(trajectory.text, question)
        g = f.grade(value)
        flipped = (r.polarity < 0) != (f.polarity < 0)
        note = "; rubric polarity opposite to the feature's: 2 - grade" if flipped else ""
        out.append(RubricGrade(2 - g if flipped else g, f"{r.feature} = {value:.3g} ({f.rule}){note}"))
    return out
