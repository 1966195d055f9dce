"""Stage-structured credit (RubricEM §3.3, eq. 1; App. C): stage scores, returns, per-stage advantages, and the
per-question stage rubric buffer. Pure Python, no judge: ``tasks.methods.ss_grpo`` calls the judge and stores rows.

    R_{i,k} = sum_r w_r s'_r / (2 sum_r w_r)        s'_r = s_r (positive rubric), 2 - s_r (negative)   (C.3)
    G_{i,k} = sum_{j >= k} lambda_{k,j} R_{i,j}    lambda_{k,j} = 0 for j < k, lambda_{k,k} = 1         (§3.3)
    A_{i,k} = (G_{i,k} - mean_i' G_{i',k}) / (std_i' G_{i',k} + eps)   per stage across the group     (§3.3)

Every token of stage k of trajectory i carries A_{i,k} (``tasks.training.losses.segment_advantages``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from arbor.format import stage_spans, token_starts
from arbor.tasks.training.losses import group_advantages
from arbor.types import StageRubric, StageRubricDraft

N_STAGES = 4


# ---------------------------------------------------------------------------------------------- eq. 1 and C.3
def stage_score(grades: Sequence[float], weights: Sequence[float], polarities: Sequence[int],
                extra: tuple[float, float] | None = None) -> float:
    """R_{i,k} in [0, 1] (C.3): the weighted mean of a stage's 0/1/2 grades, a negative rubric's grade inverted
    (2 - s: no flaw scores full), mapped to [0, 1]. ``extra`` = (value in [0, 1], weight) adds a rubric scored
    outside the judge (the persistent Answer rubric: token F1). A stage without rubrics scores 0."""
    if not len(grades) == len(weights) == len(polarities):
        raise ValueError(f"{len(grades)} grades, {len(weights)} weights, {len(polarities)} polarities")
    num = sum(w * (g if p > 0 else 2 - g) / 2 for g, w, p in zip(grades, weights, polarities, strict=True))
    den = float(sum(weights))
    if extra is not None:
        num += extra[1] * extra[0]
        den += extra[1]
    return num / den if den > 0 else 0.0


def stage_returns(scores: Sequence[float], lam: Sequence[Sequence[float]]) -> list[float]:
    """G_k = sum_{j >= k} lambda_{k,j} R_j (§3.3): each stage keeps its own score and is credited with the
    downstream stages it enables."""
    k = len(scores)
    if len(lam) != k or any(len(row) != k for row in lam):
        raise ValueError(f"Lambda must be {k} x {k} for {k} stage scores")
    return [sum(lam[a][b] * scores[b] for b in range(a, k)) for a in range(k)]


def stage_advantages(returns: Sequence[Sequence[float]], eps: float = 1e-6, norm: str = "std") -> list[list[float]]:
    """A_{i,k} (§3.3): each stage's returns normalised across the group, as GRPO normalises outcomes (the same
    ``group_advantages``: sample std, so terminal broadcast is GRPO exactly). ``returns[i][k]`` -> ``A[i][k]``."""
    if not returns:
        return []
    n_stages = len(returns[0])
    cols = [group_advantages([g[k] for g in returns], [0] * len(returns), norm=norm, eps=eps).tolist()
            for k in range(n_stages)]
    return [[cols[k][i] for k in range(n_stages)] for i in range(len(returns))]


def grade_variance(grades: Sequence[int | None]) -> float:
    """A rubric's discrimination on one group (C.4): the population variance of its grades (failed grades left
    out; fewer than two grades: 0)."""
    xs = [float(g) for g in grades if g is not None]
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)


def prune_stage(rubrics: Sequence[StageRubric], variances: Mapping[str, float], cap: int,
                created: Mapping[str, int] | None = None) -> tuple[list[StageRubric], list[StageRubric]]:
    """C.4: over ``cap`` adaptive rubrics in one stage, drop the least discriminative (lowest variance; ties: the
    older, then the smaller id) until ``cap`` remain; persistent rubrics are never dropped nor counted.
    Returns (kept, dropped), both in input order."""
    adaptive = [r for r in rubrics if not r.persistent]
    over = len(adaptive) - cap
    if over <= 0:
        return list(rubrics), []
    created = created or {}
    order = sorted(adaptive, key=lambda r: (variances.get(r.rubric_id, 0.0), created.get(r.rubric_id, 0), r.rubric_id))
    drop = {r.rubric_id for r in order[:over]}
    return [r for r in rubrics if r.rubric_id not in drop], [r for r in rubrics if r.rubric_id in drop]


# ---------------------------------------------------------------------------------------------- token spans
def stage_token_bounds(decode: Callable[[list[int]], str], response_ids: Sequence[int], text: str) -> list[int]:
    """The response-token index where each of the four stages starts (``arbor.format.stage_spans`` on the text,
    mapped onto the ids); stage k spans [start_k, start_{k+1}) and the last runs to the end."""
    spans = stage_spans(text)
    return token_starts(decode, response_ids, [a for a, _ in spans])


def stage_segments(starts: Sequence[int], n_tokens: int, advantages: Sequence[float]) -> list[tuple[int, int, float]]:
    """(start, end, A_k) per stage for ``tasks.training.losses.segment_advantages``."""
    ends = [*starts[1:], n_tokens]
    return [(a, b, adv) for a, b, adv in zip(starts, ends, advantages, strict=True)]


# ---------------------------------------------------------------------------------------------- the buffer
@dataclass
class StageBuffer:
    """Per question, the active adaptive stage rubrics (App. C.1). Changed only by ``add`` and ``prune``, whose
    events (``stage_rubrics`` rows) rebuild it on resume (``from_events``). The persistent Answer rubric (the gold
    answer, scored by F1) is not stored here: the method adds it when scoring."""

    caps: tuple[int, ...] = (3, 2, 2, 3)
    by_question: dict[str, list[StageRubric]] = field(default_factory=dict)
    created: dict[str, int] = field(default_factory=dict)  # rubric id -> step it was generated

    def rubrics(self, question_id: str) -> list[StageRubric]:
        """The question's buffer, by stage then age."""
        return sorted(self.by_question.get(question_id, []), key=lambda r: (r.stage, self.created[r.rubric_id],
                                                                            r.rubric_id))

    def add(self, step: int, group: int, question_id: str, drafts: Sequence[StageRubricDraft]) -> list[dict[str, Any]]:
        """Name the drafts (``st<step>.<group>.<n>``), add them, return their ``generated`` events."""
        have = self.by_question.setdefault(question_id, [])
        seen = {(r.stage, r.title.strip().lower()) for r in have}
        events = []
        for n, d in enumerate(drafts):
            if not 1 <= d.stage <= N_STAGES or (d.stage, d.title.strip().lower()) in seen:
                continue  # out-of-range stage, or a title the buffer already holds for that stage
            seen.add((d.stage, d.title.strip().lower()))
            r = StageRubric(f"st{step}.{group}.{n}", d.stage, d.title, d.description, int(d.weight),
                            1 if d.polarity >= 0 else -1, False, d.feature)
            have.append(r)
            self.created[r.rubric_id] = step
            events.append(rubric_event(step, group, question_id, r, "generated"))
        return events

    def prune(self, step: int, group: int, question_id: str, variances: Mapping[str, float]) -> list[dict[str, Any]]:
        """C.4 after a group's scoring: per stage, drop down to the cap; ``kept`` / ``dropped`` events carry the
        variance that decided them."""
        have = self.by_question.get(question_id, [])
        events = []
        keep_all: list[StageRubric] = []
        for stage in range(1, N_STAGES + 1):
            mine = [r for r in have if r.stage == stage]
            kept, dropped = prune_stage(mine, variances, self.caps[stage - 1], self.created)
            keep_all += kept
            events += [rubric_event(step, group, question_id, r, "kept", variances.get(r.rubric_id)) for r in kept]
            events += [rubric_event(step, group, question_id, r, "dropped", variances.get(r.rubric_id))
                       for r in dropped]
        self.by_question[question_id] = keep_all
        return events

    @classmethod
    def from_events(cls, caps: tuple[int, ...], events: Sequence[Mapping[str, Any]]) -> StageBuffer:
        """Replay ``generated`` / ``dropped`` events in stored order (resume)."""
        buf = cls(caps)
        for e in events:
            qid, rid = e["question_id"], e["rubric_id"]
            if e["event"] == "generated":
                buf.by_question.setdefault(qid, []).append(StageRubric(
                    rid, int(e["stage"]), e["title"], e["description"], int(e["weight"]), int(e["polarity"]),
                    bool(e["persistent"]), e.get("feature")))
                buf.created[rid] = int(e["step"])
            elif e["event"] == "dropped":
                buf.by_question[qid] = [r for r in buf.by_question.get(qid, []) if r.rubric_id != rid]
        return buf


def rubric_event(step: int, group: int, question_id: str, r: StageRubric, event: str,
                 variance: float | None = None) -> dict[str, Any]:
    """A ``stage_rubrics`` row: one lifecycle event of one stage rubric."""
    return {"step": step, "group": group, "question_id": question_id, "rubric_id": r.rubric_id, "event": event,
            "stage": r.stage, "title": r.title, "description": r.description, "weight": r.weight,
            "polarity": r.polarity, "persistent": r.persistent, "feature": r.feature, "variance": variance}


__all__ = ["N_STAGES", "StageBuffer", "grade_variance", "prune_stage", "rubric_event", "stage_advantages",
           "stage_returns", "stage_score", "stage_segments", "stage_token_bounds"]
