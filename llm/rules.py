"""``rules`` judge backend: offline, deterministic, and a HEURISTIC, not a language model.

It exists so the whole pipeline (induction, admission, consolidation, pairwise scoring, accuracy, the RaR baseline)
runs offline and in CI with real statistics. Every rubric it writes is tied to one machine-checkable process
feature of a trajectory (``Rubric.feature``) and a direction (``Rubric.direction``: +1 more is better, -1 less is
better); judging reads the trajectory's tags (think / search / result / answer, App. E.1) and compares numbers.
It never reads meaning: a trajectory can game it, and its rubrics are only as good as these six features.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from arbor.llm.base import CallContext, Judge, JudgeOutcome, Winner
from arbor.llm.text import normalize_answer, parse_trajectory, structure_valid
from arbor.tasks.induction import contrast_pairs, unlabeled_members
from arbor.tasks.types import Rubric, RubricDraft, Trajectory

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


class RulesJudge(Judge):
    backend = "rules"

    def _done(self, role: str, ctx: CallContext | None, key: str, t0: float, error: str | None = None) -> None:
        self._record(ctx, role=role, model="rules", prompt_version=PROMPT_VERSION, cache_key=key,
                     prompt_hash=key[:16], latency_s=time.perf_counter() - t0, prompt_tokens=0, completion_tokens=0,
                     cost_usd=0.0, cache_hit=False, attempts=1, error=error)

    async def induce(self, question: str, golds: Sequence[str] | None, trajectories: Sequence[Trajectory],
                     anchors: Mapping[str, Any], existing: Sequence[Rubric | RubricDraft], *,
                     ctx: CallContext | None = None) -> JudgeOutcome[list[RubricDraft]]:
        """Pick the (at most 3) features on which the positive and negative anchors differ most, in the same
        direction across both contrast pairs, beyond the tolerance; skip features an existing common rubric covers."""
        mode = anchors.get("mode")
        if mode in (None, "skip"):
            return JudgeOutcome([], None, 0, False)
        t0 = time.perf_counter()
        key = _key("induction", question, tuple(t.text for t in trajectories), tuple(sorted(anchors.items())))
        # only common rubrics cover a feature: a draft of another query on the same feature is the recurrence that
        # consolidation needs (>= 2 queries), not a duplicate (docs/decisions.md, "Judges")
        covered = {r.feature for r in existing if r.feature and getattr(r, "kind", "draft") == "common"}
        tol = self.cfg.rules_tolerance
        scored: list[tuple[float, str, int, str]] = []
        for name, (fn, scale, prior) in FEATURES.items():
            if name in covered:
                continue
            if mode == "unlabeled":
                members = unlabeled_members([t.format_valid for t in trajectories]) or range(len(trajectories))
                vals = [fn(trajectories[i].text, question) for i in members]
                spread = max(vals) - min(vals)
                if prior != 0 and spread > tol:
                    scored.append((spread / scale, name, prior, f"values range {min(vals):g}-{max(vals):g}"))
                continue
            diffs = [(fn(trajectories[a].text, question), fn(trajectories[b].text, question))
                     for a, b in contrast_pairs(dict(anchors))]
            deltas = [hi - lo for hi, lo in diffs]
            if all(d > tol for d in deltas) or all(d < -tol for d in deltas):
                direction = 1 if deltas[0] > 0 else -1
                obs = "; ".join(f"{hi:g} vs {lo:g}" for hi, lo in diffs)
                scored.append((min(abs(d) for d in deltas) / scale, name, direction, f"{name} {obs}"))
        scored.sort(key=lambda s: (-s[0], s[1]))
        drafts = [_draft(name, d, obs) for _, name, d, obs in scored[:3]]
        self._done("induction", ctx, key, t0)
        return JudgeOutcome(drafts, None, 1, False)

    async def consolidate(self, candidates_by_query: Mapping[str, Sequence[Rubric | RubricDraft]],
                          existing: Sequence[Rubric | RubricDraft], *,
                          ctx: CallContext | None = None) -> JudgeOutcome[list[RubricDraft]]:
        """Merge drafts with the same (feature, direction) seen for >= 2 distinct queries into a general
        standard (at most 2, most widely seen first), unless an existing common rubric has that pair."""
        t0 = time.perf_counter()
        key = _key("consolidation", tuple((q, tuple((d.feature, d.direction) for d in ds))
                                          for q, ds in candidates_by_query.items()))
        seen: dict[tuple[str, int], set[str]] = {}
        for query, drafts in candidates_by_query.items():
            for d in drafts:
                if d.feature in FEATURES and d.direction in (1, -1):
                    seen.setdefault((d.feature, d.direction), set()).add(query)
        covered = {(r.feature, r.direction) for r in existing if r.feature}
        ranked = sorted(((len(qs), f, d) for (f, d), qs in seen.items() if len(qs) >= 2 and (f, d) not in covered),
                        key=lambda x: (-x[0], x[1]))
        out = [_draft(f, d) for _, f, d in ranked[:2]]
        self._done("consolidation", ctx, key, t0)
        return JudgeOutcome(out, None, 1, False)

    async def _pairwise_shown(self, question: str, shown_a: Trajectory, shown_b: Trajectory,
                              rubric: Rubric | RubricDraft, *, ctx: CallContext | None) -> JudgeOutcome[Winner]:
        """direction * (f(A) - f(B)) beyond the tolerance decides; inside it: TIE."""
        t0 = time.perf_counter()
        key = _key("pairwise", question, shown_a.text, shown_b.text, rubric.feature, rubric.direction)
        if not rubric.feature or rubric.feature not in FEATURES or rubric.direction not in (1, -1):
            error = "RubricWithoutFeature"
            self._done("pairwise", ctx, key, t0, error)
            return JudgeOutcome(None, error, 1, False)
        fa = feature_value(rubric.feature, shown_a, question)
        fb = feature_value(rubric.feature, shown_b, question)
        d = rubric.direction * (fa - fb)
        winner: Winner = "TIE" if abs(fa - fb) <= self.cfg.rules_tolerance else ("A" if d > 0 else "B")
        self._done("pairwise", ctx, key, t0)
        return JudgeOutcome(winner, None, 1, False)

    async def accuracy(self, question: str, golds: Sequence[str], prediction: str | None, *,
                       ctx: CallContext | None = None) -> JudgeOutcome[bool]:
        """Normalised exact match against any gold alias (SQuAD normalisation)."""
        t0 = time.perf_counter()
        key = _key("accuracy", question, tuple(golds), prediction)
        pred = normalize_answer(prediction or "")
        ok = bool(pred) and any(pred == normalize_answer(g) for g in golds)
        self._done("accuracy", ctx, key, t0)
        return JudgeOutcome(ok, None, 1, False)

    async def rar_rubrics(self, question: str, golds: Sequence[str], *,
                          ctx: CallContext | None = None) -> JudgeOutcome[list[str]]:
        """Items from the question's entities and the reference answer, in a checkable 'kind: text' form."""
        t0 = time.perf_counter()
        key = _key("rar_rubrics", question, tuple(golds))
        items = [f"Query names: {e}" for e in question_entities(question)[:4]]
        for g in list(golds)[:2]:
            items += [f"Evidence mentions: {g}", f"Answer states: {g}"]
        generic = ["Structure: one boxed final answer with closed tags", "Queries: no repeated query",
                   "Searches: at least one search issued", "Results: at least one result read",
                   "Answer given: a non-empty final answer"]
        items = list(dict.fromkeys(items))[:8]
        items += generic[: max(2, 5 - len(items))]
        self._done("rar_rubrics", ctx, key, t0)
        return JudgeOutcome(items[:10], None, 1, False)

    async def rar_rate(self, question: str, trajectory: Trajectory, items: Sequence[str], *,
                       ctx: CallContext | None = None) -> JudgeOutcome[int]:
        """rating = 1 + floor(9 * share of items satisfied + 0.5) (so 1..10, halves round up)."""
        t0 = time.perf_counter()
        key = _key("rar_rate", question, trajectory.text, tuple(items))
        share = sum(_item_met(it, trajectory.text) for it in items) / len(items) if items else 0.0
        self._done("rar_rate", ctx, key, t0)
        return JudgeOutcome(1 + int(9 * share + 0.5), None, 1, False)


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
