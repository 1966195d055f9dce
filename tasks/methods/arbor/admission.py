"""Admission (paper §3.3, eq. 2): an induced draft enters the candidate pool D when its scores on its source
group vary enough (Var >= delta_v) and agree with F1 (Pearson >= rho_min)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from arbor.group_stats import VarianceKind, group_variance, pearson
from arbor.tasks.methods.arbor.records import DraftResult, GroupInfo, Records
from arbor.tasks.methods.arbor.rubric_stats import RHO_TOL
from arbor.tasks.methods.arbor.state import _ADMIT, MemoryState
from arbor.tasks.shaping import passes_variance
from arbor.types import Rubric, RubricDraft


def admission_stats(scores: Sequence[float | None], f1: Sequence[float],
                    variance: VarianceKind = "population") -> tuple[float, float | None]:
    """(variance of the scores, of ``memory.variance``'s kind; Pearson(scores, F1) or None) over the scored
    trajectories."""
    if len(scores) != len(f1):
        raise ValueError(f"admit: {len(scores)} scores vs {len(f1)} F1 values")
    pairs = [(s, y) for s, y in zip(scores, f1, strict=True) if s is not None]
    xs = [p[0] for p in pairs]
    ys = [p[1] for p in pairs]
    return group_variance(xs, variance), pearson(xs, ys)


@dataclass(frozen=True)
class Admission:
    """Eq. 2's verdict on a draft and the statistics behind it."""

    variance: float
    pearson: float | None
    admitted: bool
    reason: str | None  # why a draft was rejected, or a note on an admission by variance alone


def admission(scores: Sequence[float | None], f1: Sequence[float], delta_v: float = 0.05,
              rho_min: float = 0.0, variance: VarianceKind = "population") -> Admission:
    """Eq. 2: Var_i(s_i^r) >= delta_v and Pearson({s_i^r}, {F1_i}) >= rho_min.

    When the Pearson is undefined (constant F1: the ``unlabeled`` induction mode) the draft is admitted on
    variance alone and the Pearson is recorded as NULL.
    """
    var, p = admission_stats(scores, f1, variance)
    if not passes_variance(var, delta_v):
        return Admission(var, p, False, "variance < delta_v")
    if p is not None and p + RHO_TOL < rho_min:
        return Admission(var, p, False, "pearson < rho_min")
    return Admission(var, p, True, "pearson undefined (constant F1): admitted on variance" if p is None else None)


def admit(scores: Sequence[float | None], f1: Sequence[float], delta_v: float = 0.05, rho_min: float = 0.0,
          variance: VarianceKind = "population") -> bool:
    """Eq. 2 as a yes / no (``admission`` has the statistics and the reason)."""
    return admission(scores, f1, delta_v, rho_min, variance).admitted


def draft_index(rubric_id: str) -> int:
    return int(rubric_id.rsplit(".", 1)[1])


class AdmissionMixin(MemoryState):
    """Step call 4: ``admit_drafts``; ``make_drafts`` mints the ids of a judge's induced drafts."""

    @staticmethod
    def make_drafts(step: int, group: int, drafts: Sequence[RubricDraft]) -> list[Rubric]:
        """Mint deterministic draft ids d{step}.{group}.{i} for a judge's induced drafts."""
        return [
            Rubric(f"d{step}.{group}.{i}", d.title, d.description, d.counter_description, "draft", d.feature, d.direction)
            for i, d in enumerate(drafts)
        ]

    def admit_drafts(self, step: int, results: Iterable[DraftResult]) -> Records:
        """Record each induced draft and admit it into D if eq. 2 holds on its source group."""
        self._enter(step, _ADMIT)
        rec = Records()
        results = sorted(results, key=lambda d: (d.group, draft_index(d.rubric.rubric_id)))
        ids = [d.rubric.rubric_id for d in results]
        if len(set(ids)) != len(ids):
            raise ValueError(f"admit_drafts: duplicate draft ids in step {step}")
        for d in results:
            info = GroupInfo(d.question_id, d.question, tuple(d.f1))
            self._emit(rec, self._event(step, "induced", d.rubric, group=d.group))
            sc = d.scoring
            if self.cfg.frozen:
                self._emit(rec, self._event(step, "rejected", d.rubric, group=d.group, reason="memory frozen"))
                continue
            if sc.judge_error:
                self._emit(rec, self._event(step, "judge_error", d.rubric, group=d.group,
                                            reason=f"{sc.n_failed_edges}/{sc.n_edges} edges failed; not admitted"))
                continue
            assert sc.scores is not None
            a = admission(sc.scores, d.f1, self.cfg.delta_v, self.cfg.rho_min, self.cfg.variance)
            self._emit(rec, self._event(step, "admitted" if a.admitted else "rejected", d.rubric, group=d.group,
                                        variance=a.variance, pearson=a.pearson, reason=a.reason),
                       info if a.admitted else None)
        return rec
