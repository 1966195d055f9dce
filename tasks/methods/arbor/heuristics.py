"""ARBOR's offline heuristics (the ``rules`` judge's answers to ARBOR's roles, App. E): every rubric it writes is
tied to one machine-checkable process feature of a trajectory (``Rubric.feature``) and a direction
(``Rubric.direction``: +1 more is better, -1 less is better); judging reads the trajectory's tags (think / search /
result / answer, App. E.1) and compares numbers. It never reads meaning: a trajectory can game it, and its
rubrics are only as good as these six features."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from arbor.llm.base import Refusal
from arbor.llm.reading import (
    Feature,
    answer_in_evidence,
    content_tokens,
    question_entities,
    repeated_query_share,
    searches_after_evidence,
)
from arbor.llm.text import parse_trajectory, structure_valid
from arbor.tasks.methods.arbor.induction import contrast_pairs, unlabeled_members
from arbor.types import Rubric, RubricDraft, Trajectory

Winner = Literal["A", "B", "TIE"]  # a pairwise verdict about the shown order (E.3)


# ---- process features ---------------------------------------------------------------------------------------
def n_searches(text: str, question: str) -> float:
    return float(len(parse_trajectory(text).queries))


def query_entity_overlap(text: str, question: str) -> float:
    """Mean over queries of the share of the question's entity tokens the query names (0 without queries)."""
    ent = set().union(*(content_tokens(e) for e in question_entities(question))) if question_entities(question) else set()
    qs = parse_trajectory(text).queries
    if not qs or not ent:
        return 0.0
    return sum(len(ent & content_tokens(q)) / len(ent) for q in qs) / len(qs)


def format_valid(text: str, question: str) -> float:
    return 1.0 if structure_valid(text) else 0.0


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


# ---- the heuristics of ARBOR's roles (declared in roles.py; each a pure function of the request) -------------
def induce(question: str, trajectories: Sequence[Trajectory], anchors: Mapping[str, Any],
           existing: Sequence[Rubric | RubricDraft], tolerance: float) -> list[RubricDraft]:
    """Pick the (at most 3) features on which the positive and negative anchors differ most, in the same
    direction across both contrast pairs, beyond the tolerance; skip features an existing common rubric covers."""
    # only common rubrics cover a feature: a draft of another query on the same feature is the recurrence that
    # consolidation needs (>= 2 queries), not a duplicate (docs/decisions/anchors-and-retirement.md)
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
