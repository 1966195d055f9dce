"""``rules`` judge backend: offline, deterministic, and a HEURISTIC, not a language model.

It exists so the whole pipeline (induction, admission, consolidation, pairwise scoring, accuracy, the RaR baseline)
runs offline and in CI with real statistics. Every rubric it writes is tied to one machine-checkable process
feature of a trajectory (``Rubric.feature``) and a direction (``Rubric.direction``: +1 more is better, -1 less is
better); judging reads the trajectory's tags (think / search / result / answer, App. E.1) and compares numbers.
It never reads meaning: a trajectory can game it, and its rubrics are only as good as these six features.

The RubricEM roles (App. C, D.6.2) work the same way: ``STAGE_FEATURES`` are machine-checkable features of one
stage of a staged response (``arbor.format.stage_spans``: Plan, Research, Review, Answer), each mapped to a
0/1/2 grade by fixed thresholds; ``stage_rubrics`` proposes a rubric per feature whose grades differ within the
group, ``stage_grades`` reads the features back, and ``reflection_grades`` is a keyword heuristic over reflection
candidates (see those methods). Same caveat: features, not understanding.

The Co-ReAct roles (its §3.1-3.3) write and check step rubrics in a small machine-checkable language
(``STEP_CONDITIONS``): ``step_rubric`` asks for a search of a question entity nobody has searched yet, then for
one bridge hop, then for an answer naming the latest result's first new name; ``step_verify`` reads those items
back from the proposed action; ``rank_actions`` sums ARCO's ``step_criteria`` scores of each candidate.
"""

from __future__ import annotations

import hashlib
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from arbor.format import PROTOCOLS, reflection_blocks, stage_spans
from arbor.llm.base import RANK_LABELS, CallContext, Judge, JudgeOutcome, Q, Refusal, Role, T, Winner
from arbor.llm.text import normalize_answer, parse_trajectory, structure_valid
from arbor.reward import exact_match
from arbor.tasks.induction import contrast_pairs, unlabeled_members
from arbor.types import (
    ReflectionGrade,
    Rubric,
    RubricDraft,
    RubricGrade,
    RubricItem,
    StagePolarity,
    StageRubric,
    StageRubricDraft,
    StepLabel,
    StepRubric,
    StepVerdict,
    Trajectory,
)

PROMPT_VERSION = "rules.v1"
_STOP = set(
    "a an the of in on at to for from by with and or is was were are be been who what which when where why how "
    "did does do same as that this it its their his her they he she than both first".split()
)
_QWORDS = {"were", "was", "is", "are", "who", "what", "which", "when", "where", "why", "how", "did", "does", "do",
           "in", "the"}


def question_entities(question: str) -> list[str]:
    """Capitalised word runs of the question (minus a leading question word), else its content words."""
    words = re.findall(r"[\w'’.-]+", question)
    runs: list[list[str]] = []
    cur: list[str] = []
    for i, w in enumerate(words):
        cap = (w[:1].isupper() or w[:1].isdigit()) and not (i == 0 and w.lower() in _QWORDS)
        if cap:
            cur.append(w)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    ents = [" ".join(r).strip(".") for r in runs]
    if not ents:
        ents = [w for w in words if w.lower() not in _STOP]
    return list(dict.fromkeys(e for e in ents if normalize_answer(e)))


def _tokens(s: str) -> set[str]:
    return set(normalize_answer(s).split()) - _STOP


# ---- process features ---------------------------------------------------------------------------------------
def n_searches(text: str, question: str) -> float:
    return float(len(parse_trajectory(text).queries))


def repeated_query_share(text: str, question: str) -> float:
    """Share of queries that repeat an earlier query (after normalisation)."""
    qs = [normalize_answer(q) for q in parse_trajectory(text).queries]
    return (len(qs) - len(set(qs))) / len(qs) if qs else 0.0


def answer_in_evidence(text: str, question: str) -> float:
    """Share of the final answer's normalised tokens that occur in the retrieved results (0 without an answer)."""
    p = parse_trajectory(text)
    ans = normalize_answer(p.answer or "").split()
    if not ans:
        return 0.0
    evidence = set(" ".join(normalize_answer(r) for r in p.results).split())
    return sum(tok in evidence for tok in ans) / len(ans)


def query_entity_overlap(text: str, question: str) -> float:
    """Mean over queries of the share of the question's entity tokens the query names (0 without queries)."""
    ent = set().union(*(_tokens(e) for e in question_entities(question))) if question_entities(question) else set()
    qs = parse_trajectory(text).queries
    if not qs or not ent:
        return 0.0
    return sum(len(ent & _tokens(q)) / len(ent) for q in qs) / len(qs)


def format_valid(text: str, question: str) -> float:
    return 1.0 if structure_valid(text) else 0.0


def searches_after_evidence(text: str, question: str) -> float:
    """Searches issued after the first result that already contains the final answer (0 if none contains it)."""
    p = parse_trajectory(text)
    ans = normalize_answer(p.answer or "")
    if not ans:
        return 0.0
    seen, after = False, 0
    for s in p.segments:
        if seen and s.kind == "search":
            after += 1
        if s.kind == "result" and re.search(rf"\b{re.escape(ans)}\b", normalize_answer(s.text)):
            seen = True
    return float(after)


Feature = Callable[[str, str], float]
# name -> (function, scale used to compare differences across features, prior direction for unlabeled groups)
FEATURES: dict[str, tuple[Feature, float, int]] = {
    "n_searches": (n_searches, 4.0, 0),
    "repeated_query_share": (repeated_query_share, 1.0, -1),
    "answer_in_evidence": (answer_in_evidence, 1.0, +1),
    "query_entity_overlap": (query_entity_overlap, 1.0, +1),
    "format_valid": (format_valid, 1.0, +1),
    "searches_after_evidence": (searches_after_evidence, 3.0, -1),
}

# (feature, direction) -> (title, high-scoring description, low-scoring description); {e.g.} filled for drafts
_TEXT: dict[tuple[str, int], tuple[str, str, str]] = {
    ("n_searches", 1): (
        "Sufficient Evidence Gathering Before Answering",
        "Issues enough searches to retrieve evidence for every hop of the question before committing to an answer.",
        "Answers after too few searches, leaving hops of the question without retrieved evidence.",
    ),
    ("n_searches", -1): (
        "Economical Search Budget",
        "Resolves the question with few, well-aimed searches and stops once the evidence suffices.",
        "Spends many searches, adding calls that bring no new information.",
    ),
    ("repeated_query_share", -1): (
        "Non-Repetitive Query Progression",
        "Each new query moves the search forward (a new entity, relation or reformulation) instead of repeating one.",
        "Re-issues the same or near-identical queries, circling without new information.",
    ),
    ("repeated_query_share", 1): (
        "Persistent Re-Querying",
        "Re-issues a query to confirm a result.",
        "Never re-checks a query.",
    ),
    ("answer_in_evidence", 1): (
        "Evidence-Grounded Final Answer",
        "States a final answer whose words all come from the retrieved evidence.",
        "States a final answer that the retrieved results do not support, wholly or in part.",
    ),
    ("answer_in_evidence", -1): (
        "Answer Beyond Retrieved Evidence",
        "Answers from knowledge beyond the retrieved results.",
        "Answers only with what the results contain.",
    ),
    ("query_entity_overlap", 1): (
        "Precise Entity-Anchored Queries",
        "Writes queries that name the specific entities of the question, so the right pages come back directly.",
        "Writes vague or generic queries that omit the question's key entities.",
    ),
    ("query_entity_overlap", -1): (
        "Exploratory Generic Queries",
        "Uses broad queries beyond the question's entities.",
        "Sticks to the question's entity names.",
    ),
    ("format_valid", 1): (
        "Clean Structured Finalisation",
        "Keeps every think/search/result/answer tag paired and closed and ends with exactly one boxed final answer.",
        "Leaves tags unclosed, adds stray text or several answers, or ends without a boxed final answer.",
    ),
    ("format_valid", -1): (
        "Loose Output Structure",
        "Departs from the tag structure.",
        "Follows the tag structure exactly.",
    ),
    ("searches_after_evidence", -1): (
        "Evidence-Guided Termination",
        "Stops searching and answers once a retrieved result already settles the question.",
        "Keeps searching after a result has already settled the question, spending calls without new information.",
    ),
    ("searches_after_evidence", 1): (
        "Continued Verification After Evidence",
        "Keeps verifying after the answer-bearing result appears.",
        "Stops at the first answer-bearing result.",
    ),
}


def feature_value(feature: str, traj: Trajectory | str, question: str) -> float:
    text = traj if isinstance(traj, str) else traj.text
    if feature not in FEATURES:
        raise KeyError(feature)
    return FEATURES[feature][0](text, question)


def _draft(feature: str, direction: int, observed: str | None = None) -> RubricDraft:
    title, desc, counter = _TEXT[(feature, direction)]
    if observed:
        desc = f"{desc} (here: {observed})"
    return RubricDraft(title, desc, counter, feature=feature, direction=direction)


def _key(role: str, *parts: Any) -> str:
    return hashlib.sha256(repr((PROMPT_VERSION, role, parts)).encode()).hexdigest()


# ---- RubricEM stage features (App. C; issue 15) -------------------------------------------------------------
# Each reads one stage of a staged response (arbor.format.stage_spans; best effort on a malformed one) and returns
# a number; StageFeature.grade maps it to 0/1/2 by fixed thresholds. They never read meaning.
_TAG = re.compile(r"</?\w+>")
_FORCED = {parse_trajectory(p.force_answer_message).results[0].strip() for p in PROTOCOLS.values()
           if parse_trajectory(p.force_answer_message).results}
_SENTENCE_END = ".!?:;*•-"  # a word after one of these (or after a line break) opens a sentence


def _stage_text(text: str, stage: int) -> str:
    """The text of stage ``stage`` (1 Plan .. 4 Answer) with every tag removed."""
    a, b = stage_spans(text)[stage - 1]
    return _TAG.sub(" ", text[a:b])


def _tool_outputs(text: str) -> list[str]:
    """The retrieved tool outputs, less a protocol's forced "search budget exhausted" message (no evidence)."""
    return [r for r in parse_trajectory(text).results if r.strip() not in _FORCED]


def _entity_tokens(question: str) -> list[set[str]]:
    return [t for t in (_tokens(e) for e in question_entities(question)) if t]


def _names(text: str) -> list[str]:
    """Capitalised (or numeric) word runs of ``text``, broken by punctuation or a line break between words; a
    run that is one word opening a sentence (or the text) is left out, since that capital says nothing about a
    name ("Next, ...", "Both ...")."""
    runs: list[tuple[list[str], bool]] = []  # (words, opens a sentence)
    cur: list[str] = []
    pos = 0
    for m in re.finditer(r"[\w'’-]+", text):
        gap, w = text[pos : m.start()], m.group(0)
        pos = m.end()
        if cur and (gap.strip() or "\n" in gap):  # punctuation or a line break between two words ends a run
            cur = []
        if not (w[:1].isupper() or w[:1].isdigit()):
            cur = []
            continue
        if not cur:
            k = m.start() - 1
            while k >= 0 and text[k].isspace():
                k -= 1
            cur = []
            runs.append((cur, k < 0 or text[k] in _SENTENCE_END or "\n" in text[k + 1 : m.start()]))
        cur.append(w)
    return [" ".join(words) for words, opens in runs if len(words) > 1 or not opens]


def plan_entity_coverage(text: str, question: str) -> float:
    """Plan: share of the question's entities (``question_entities``) whose content tokens all occur in the Plan
    stage (0 without a plan or without entities)."""
    ents = _entity_tokens(question)
    plan = _tokens(_stage_text(text, 1))
    return sum(e <= plan for e in ents) / len(ents) if ents and plan else 0.0


def query_entity_coverage(text: str, question: str) -> float:
    """Research: share of the question's entities that at least one query names in full (all its content tokens;
    a later hop's query names a bridge entity instead, so the share is over entities, not a mean over queries)."""
    ents = _entity_tokens(question)
    a, b = stage_spans(text)[1]
    qs = [_tokens(q) for q in parse_trajectory(text[a:b]).queries]
    return sum(any(e <= q for q in qs) for e in ents) / len(ents) if ents and qs else 0.0


def evaluated_output_share(text: str, question: str) -> float:
    """Research: share of tool outputs whose next block (``<think>`` and stray text skipped) is a
    ``<state_evaluation>`` (0 without tool outputs; a forced "budget exhausted" message is not an output)."""
    segs = [s for s in parse_trajectory(text).segments if s.kind not in ("think", "other")]
    outs = [i for i, s in enumerate(segs) if s.kind == "result" and s.text.strip() not in _FORCED]
    if not outs:
        return 0.0
    return sum(i + 1 < len(segs) and segs[i + 1].kind == "state_evaluation" for i in outs) / len(outs)


def review_grounds_answer(text: str, question: str) -> float:
    """Review: 1 when the Review stage names the final answer and some tool output holds it, 0.5 when the review
    names it but no tool output does, 0 when the review does not name it (or there is no final answer)."""
    ans = parse_trajectory(text).answer or ""
    if not normalize_answer(ans) or not _contains(_stage_text(text, 3), ans):
        return 0.0
    return 1.0 if any(_contains(r, ans) for r in _tool_outputs(text)) else 0.5


def review_unsupported_names(text: str, question: str) -> float:
    """Review (a flaw): share of the names in the Review stage (``_names``) with a content token that occurs in
    no tool output and not in the question (0 when the review names nothing)."""
    names = [_tokens(n) for n in _names(_stage_text(text, 3))]
    names = [n for n in names if n]
    if not names:
        return 0.0
    known = _tokens(question).union(*(_tokens(r) for r in _tool_outputs(text)))
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


# ---- the heuristics of each role (declared in llm/roles/; each a pure function of the request) ----------------------
def induce(question: str, trajectories: Sequence[Trajectory], anchors: Mapping[str, Any],
           existing: Sequence[Rubric | RubricDraft], tolerance: float) -> list[RubricDraft]:
    """Pick the (at most 3) features on which the positive and negative anchors differ most, in the same
    direction across both contrast pairs, beyond the tolerance; skip features an existing common rubric covers."""
    # only common rubrics cover a feature: a draft of another query on the same feature is the recurrence that
    # consolidation needs (>= 2 queries), not a duplicate (docs/decisions.md, "Judges")
    covered = {r.feature for r in existing if r.feature and getattr(r, "kind", "draft") == "common"}
    scored: list[tuple[float, str, int, str]] = []
    for name, (fn, scale, prior) in FEATURES.items():
        if name in covered:
            continue
        if anchors.get("mode") == "unlabeled":
            members = unlabeled_members([t.format_valid for t in trajectories]) or range(len(trajectories))
            vals = [fn(trajectories[i].text, question) for i in members]
            spread = max(vals) - min(vals)
            if prior != 0 and spread > tolerance:
                scored.append((spread / scale, name, prior, f"values range {min(vals):g}-{max(vals):g}"))
            continue
        diffs = [(fn(trajectories[a].text, question), fn(trajectories[b].text, question))
                 for a, b in contrast_pairs(dict(anchors))]
        deltas = [hi - lo for hi, lo in diffs]
        if all(d > tolerance for d in deltas) or all(d < -tolerance for d in deltas):
            direction = 1 if deltas[0] > 0 else -1
            obs = "; ".join(f"{hi:g} vs {lo:g}" for hi, lo in diffs)
            scored.append((min(abs(d) for d in deltas) / scale, name, direction, f"{name} {obs}"))
    scored.sort(key=lambda s: (-s[0], s[1]))
    return [_draft(name, d, obs) for _, name, d, obs in scored[:3]]


def consolidate(candidates_by_query: Mapping[str, Sequence[Rubric | RubricDraft]],
                existing: Sequence[Rubric | RubricDraft]) -> list[RubricDraft]:
    """Merge drafts with the same (feature, direction) seen for >= 2 distinct queries into a general
    standard (at most 2, most widely seen first), unless an existing common rubric has that pair."""
    seen: dict[tuple[str, int], set[str]] = {}
    for query, drafts in candidates_by_query.items():
        for d in drafts:
            if d.feature in FEATURES and d.direction in (1, -1):
                seen.setdefault((d.feature, d.direction), set()).add(query)
    covered = {(r.feature, r.direction) for r in existing if r.feature}
    ranked = sorted(((len(qs), f, d) for (f, d), qs in seen.items() if len(qs) >= 2 and (f, d) not in covered),
                    key=lambda x: (-x[0], x[1]))
    return [_draft(f, d) for _, f, d in ranked[:2]]


def pairwise(question: str, shown_a: Trajectory, shown_b: Trajectory, rubric: Rubric | RubricDraft,
             tolerance: float) -> Winner:
    """direction * (f(A) - f(B)) beyond the tolerance decides; inside it: TIE. A rubric without a feature of
    ours cannot be read: ``Refusal("RubricWithoutFeature")``."""
    if not rubric.feature or rubric.feature not in FEATURES or rubric.direction not in (1, -1):
        raise Refusal("RubricWithoutFeature")
    fa = feature_value(rubric.feature, shown_a, question)
    fb = feature_value(rubric.feature, shown_b, question)
    d = rubric.direction * (fa - fb)
    return "TIE" if abs(fa - fb) <= tolerance else ("A" if d > 0 else "B")


def accuracy(golds: Sequence[str], prediction: str | None) -> bool:
    """Normalised exact match against any gold alias (SQuAD normalisation)."""
    pred = normalize_answer(prediction or "")
    return bool(pred) and any(pred == normalize_answer(g) for g in golds)


def rar_rubrics(question: str, golds: Sequence[str]) -> list[str]:
    """Items from the question's entities and the reference answer, in a checkable 'kind: text' form."""
    items = [f"Query names: {e}" for e in question_entities(question)[:4]]
    for g in list(golds)[:2]:
        items += [f"Evidence mentions: {g}", f"Answer states: {g}"]
    generic = ["Structure: one boxed final answer with closed tags", "Queries: no repeated query",
               "Searches: at least one search issued", "Results: at least one result read",
               "Answer given: a non-empty final answer"]
    items = list(dict.fromkeys(items))[:8]
    items += generic[: max(2, 5 - len(items))]
    return items[:10]


def rar_rate(trajectory: Trajectory, items: Sequence[str]) -> int:
    """rating = 1 + floor(9 * share of items satisfied + 0.5) (so 1..10, halves round up)."""
    share = sum(_item_met(it, trajectory.text) for it in items) / len(items) if items else 0.0
    return 1 + int(9 * share + 0.5)


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


def step_rubric(question: str, history: str, tool_calls: int, max_tool_calls: int) -> StepRubric:
    """The rubric writer as a HEURISTIC, in ``STEP_CONDITIONS`` (no gold knowledge): while searches remain,
    (1) a search naming the first question entity no earlier query names, else (2) on a bridge question
    ("... of the ...", one hop per "of the") a search naming the first new name of the latest result;
    else (3) an answer naming the latest result's first new name (or just an answer), with a -0.2 item
    against a repeated query while searches remain. Positive weights sum to 1."""
    queries = parse_trajectory(history).queries
    results = _tool_outputs(history)
    searches_left = max(tool_calls, len(queries)) < max_tool_calls
    ent_union = set().union(*_entity_tokens(question))

    def queried(name: str) -> bool:
        return any(_tokens(name) <= _tokens(q) for q in queries)

    latest = _DOC_HEADER.sub(" ", results[-1]) if results else ""  # "Doc 1 (Title: X)" is not a name
    new_names = [n for n in _names(latest)
                 if _tokens(n) and not _tokens(n) <= ent_union and not queried(n)]
    unsearched = [e for e in question_entities(question) if _tokens(e) and not queried(e)]
    bridge_hops = sum(not (_tokens(q) & ent_union) for q in queries)
    target = None
    if searches_left and unsearched:
        target = unsearched[0]
    elif searches_left and new_names and bridge_hops < len(_BRIDGE.findall(question)):
        target = new_names[0]
    if target is not None:
        items = (RubricItem(0.6, f"query names: {target}"), RubricItem(0.2, "searches"),
                 RubricItem(0.2, "query is new"))  # an off-target search scores 0.4: it fails tau = 0.5
        return StepRubric(items, f"search for {target}")
    items = ((RubricItem(0.6, "answers"), RubricItem(0.4, f"answer names: {new_names[0]}")) if new_names
             else (RubricItem(1.0, "answers"),))
    if searches_left:
        items += (RubricItem(-0.2, "query repeats"),)
    return StepRubric(items, f"answer with {new_names[0]}" if new_names else "answer from the evidence")


def step_verify(history: str, action: str, rubric: StepRubric) -> StepVerdict:
    """The verifier as a HEURISTIC: each item read from the action (``step_condition_met``; a negative item's
    verdict is whether its flaw is present); feedback "Unmet: ..." lists the positive items not met and the
    negative ones present, "" when none."""
    earlier = parse_trajectory(history).queries
    met = tuple(step_condition_met(it.condition, action, earlier) for it in rubric.items)
    unmet = [it.condition for it, m in zip(rubric.items, met, strict=True) if m != (it.weight >= 0)]
    return StepVerdict(met, f"Unmet: {'; '.join(unmet)}" if unmet else "")


def rank_actions(question: str, golds: Sequence[str] | None, history: str, shown: Sequence[str]) -> list[str]:
    """The expert ranking as a HEURISTIC: each candidate's ARCO ``step_criteria`` scores summed (no result
    yet), best first, as the shown labels; ties keep the shown order."""
    earlier = parse_trajectory(history).queries
    score = [sum(v for _, v in step_criteria(question, golds or [], a, "", earlier)) for a in shown]
    best_first = sorted(range(len(shown)), key=lambda j: -score[j])
    return [RANK_LABELS[j] for j in best_first]


class RulesJudge(Judge):
    """The offline backend: every role answered by its declared heuristic (``Role.heuristic``), one ledger row a
    call (model "rules", key: the role's ``identity``, no tokens, no cost)."""

    backend = "rules"

    async def _answer(self, role: Role[Q, T], request: Q, ctx: CallContext | None) -> JudgeOutcome[T]:
        t0 = time.perf_counter()
        key = _key(role.name, *role.identity(request))
        try:
            value, error = role.heuristic(request, self.cfg), None
        except Refusal as e:
            value, error = None, str(e)
        self._record(ctx, role=role.name, model="rules", prompt_version=PROMPT_VERSION, cache_key=key,
                     prompt_hash=key[:16], latency_s=time.perf_counter() - t0, prompt_tokens=0, completion_tokens=0,
                     cost_usd=0.0, cache_hit=False, attempts=1, error=error, attempt_errors=[error])
        return JudgeOutcome(value, error, 1, False)


_BRIDGE = re.compile(r"\bof the\b", re.I)
_DOC_HEADER = re.compile(r"Doc \d+\s*\(Title:[^)]*\)")
# the rules backend's step-rubric language: "kind" or "kind: argument"; anything else is read as free text
STEP_CONDITIONS = ("searches", "answers", "query names: <entity>", "query is new", "query repeats",
                   "answer names: <text>")


def step_condition_met(condition: str, action: str, earlier_queries: Sequence[str]) -> bool:
    """Whether ``action`` meets one ``STEP_CONDITIONS`` item (for ``query repeats``: whether the flaw is there).
    ``query names: X``: every content token of X is in one of the action's queries; ``query is new``: the action
    searches and none of its queries repeats an earlier one (normalised); ``answer names: X``: the answer holds X
    as whole words. A condition in no known form: all its content tokens of 3+ characters occur in the action."""
    kind, _, arg = condition.partition(":")
    kind, arg = kind.strip().lower(), arg.strip()
    p = parse_trajectory(action)
    seen = {normalize_answer(q) for q in earlier_queries}
    repeats = [normalize_answer(q) in seen for q in p.queries]
    if kind == "searches" and not arg:
        return bool(p.queries)
    if kind == "answers" and not arg:
        return bool(normalize_answer(p.answer or ""))
    if kind == "query names" and _tokens(arg):
        return any(_tokens(arg) <= _tokens(q) for q in p.queries)
    if kind == "query is new" and not arg:
        return bool(repeats) and not any(repeats)
    if kind == "query repeats" and not arg:
        return any(repeats)
    if kind == "answer names" and arg:
        return _contains(p.answer or "", arg)
    words = set(normalize_answer(re.sub(r"<[^>]*>", " ", action)).split())  # the action's text without its tags
    return {t for t in _tokens(condition) if len(t) >= 3} <= words


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
    ent_tokens = set().union(*(_tokens(e) for e in ents)) if ents else set()
    if p.answer is not None:
        f1 = token_f1(p.answer, list(golds)) if golds else 0.0
        boxed = "\\boxed{" in action
        return [(f"The answer matches {' or '.join(golds[:2]) or 'the gold answer'}", 2 * f1 - 1),
                ("The answer is a short entity name, not a sentence", 1.0 if len(p.answer.split()) <= 4 else -1.0),
                ("The answer is given in the required boxed format", 1.0 if boxed else -1.0)]
    if p.queries:
        q = p.queries[-1]
        share = len(ent_tokens & _tokens(q)) / len(ent_tokens) if ent_tokens else 0.0
        repeat = normalize_answer(q) in {normalize_answer(e) for e in earlier_queries}
        if golds and any(_contains(result, g) for g in golds):
            found = 1.0
        elif any(_contains(result, e) for e in ents):
            found = 0.0
        else:
            found = -1.0
        return [(f"The query names {', '.join(ents[:2]) or 'the entities of the question'}", 2 * share - 1),
                ("The query does not repeat an earlier search", -1.0 if repeat else 1.0),
                ("The result brings the fact the question asks for", found)]
    return [("The step searches or answers", -1.0)]

def _contains(haystack: str, needle: str) -> bool:
    n = normalize_answer(needle)
    return bool(n) and re.search(rf"\b{re.escape(n)}\b", normalize_answer(haystack)) is not None


def _item_met(item: str, text: str) -> bool:
    kind, _, arg = item.partition(":")
    kind, arg = kind.strip().lower(), arg.strip()
    p = parse_trajectory(text)
    if kind == "query names":
        return any(_tokens(arg) <= _tokens(q) for q in p.queries)
    if kind == "evidence mentions":
        return any(_contains(r, arg) for r in p.results)
    if kind == "answer states":
        return _contains(p.answer or "", arg)
    if kind == "structure":
        return structure_valid(text)
    if kind == "queries":
        return bool(p.queries) and repeated_query_share(text, "") == 0.0
    if kind == "searches":
        return bool(p.queries)
    if kind == "results":
        return bool(p.results)
    if kind == "answer given":
        return bool(normalize_answer(p.answer or ""))
    return _contains(text, arg or item)


# ---- reflection heuristic (D.6.2) ------------------------------------------------------------------------------
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
        stems = f.cues if f else tuple(w for w in normalize_answer(r.title).split() if len(w) >= 4 and w not in _STOP)
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
    ents = _entity_tokens(question)
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
