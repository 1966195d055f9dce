"""Retirement (paper §3.3): each active rubric's judged groups update n_r and rho_r, and a rubric whose n_r
exceeded kappa, or whose rho_r fell below rho_min, leaves the common pool."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from arbor.tasks.methods.arbor.records import ACTIVATION_COLUMNS, Activation, Records
from arbor.tasks.methods.arbor.rubric_stats import RHO_TOL, step_variance
from arbor.tasks.methods.arbor.state import _ACTIVATE, _RETIRE, MemoryState
from arbor.tasks.shaping import passes_variance


def batch_filter(activations: Iterable[dict[str, Any]], delta_v: float) -> dict[str, bool]:
    """§3.4, the shaping filter read per batch: a rubric passes for the whole step when its step-level variance, the
    mean of its scored groups' within-group variances (``step_variance``), reaches delta_v; a rubric with no scored
    group does not pass."""
    per: dict[str, list[float]] = {}
    for a in activations:
        got = per.setdefault(a["rubric_id"], [])
        if not a["judge_error"]:
            got.append(float(a["variance"]))
    return {rid: bool(v) and passes_variance(step_variance(v), delta_v) for rid, v in per.items()}


class RetirementMixin(MemoryState):
    """Step calls 2 and 3: ``apply_activations`` (n_r, rho_r) and ``retire`` (alias ``end_step``)."""

    # ---------------------------------------------------------------- 2. per-group statistics (§3.3 Retirement)
    def apply_activations(self, step: int, results: Iterable[Activation]) -> Records:
        """Update n_r and rho_r from every (active rubric, group) result, in group-index order."""
        self._enter(step, _ACTIVATE)
        rec = Records()
        results = sorted(results, key=lambda a: (a.group, a.rubric_id))
        keys = [(a.group, a.rubric_id) for a in results]
        if len(set(keys)) != len(keys):
            raise ValueError(f"apply_activations: duplicate (group, rubric) results in step {step}")
        for a in results:
            if a.rubric_id not in self.P:
                raise ValueError(f"apply_activations: rubric {a.rubric_id!r} is not in the common pool")
            sc = a.scoring
            row: dict[str, Any] = dict.fromkeys(ACTIVATION_COLUMNS)
            row.update(step=step, group=a.group, rubric_id=a.rubric_id, n_edges=sc.n_edges,
                       n_failed_edges=sc.n_failed_edges, judge_error=sc.judge_error)
            if sc.judge_error:
                row.update(kept=False, scores=None)
                self._emit(rec, self._event(step, "judge_error", self.P[a.rubric_id], group=a.group,
                                            reason=f"{sc.n_failed_edges}/{sc.n_edges} edges failed; scores discarded",
                                            **self._stat_cols(a.rubric_id)))
            else:
                assert sc.scores is not None
                if len(sc.scores) != len(a.f1):
                    raise ValueError(f"apply_activations: group {a.group}: {len(sc.scores)} scores vs {len(a.f1)} F1")
                var = self._apply_activation(a.rubric_id, sc.scores, a.f1, step, a.group)
                row.update(variance=var, kept=passes_variance(var, self.cfg.delta_v), scores=list(sc.scores))
            st = self.stats[a.rubric_id]
            row.update(n_r_after=st.n_r, rho_r_after=st.rho, n_activations_after=st.n_activations,
                       mean_variance_after=st.mean_variance)
            rec.activations.append(row)
        if self.cfg.count_activations == "step":  # n_r moves at the close: every row of the step shows the result
            self._close_step(step)
            for row in rec.activations:
                row["n_r_after"] = self.stats[row["rubric_id"]].n_r
        if self.cfg.shaping_filter == "batch":  # §3.4's per-batch filter: one verdict per rubric for the step
            passed = batch_filter(rec.activations, self.cfg.delta_v)
            for row in rec.activations:
                row["kept"] = not row["judge_error"] and passed[row["rubric_id"]]
        return rec

    # ---------------------------------------------------------------- 3. retirement (§3.3)
    def retire(self, step: int) -> Records:
        """Retire rubrics whose n_r exceeded kappa at any activation so far, or with a defined rho_r < rho_min now
        (undefined rho_r never retires); §3.3 Retirement.

        n_r is judged on the activation sequence in group order (``apply_activations``): a run of more than kappa
        low-variance groups retires the rubric even if a later group of the same step reset n_r. The event's
        ``group`` is the group of the activation at which n_r first exceeded kappa (None for a rho_r retirement);
        its n_r / rho_r columns are the statistics now, as for every event.
        Called once per step after the step's scoring (all activations applied). Recommended right after
        ``apply_activations``: a retired rubric then frees its slot before consolidation instead of a live one
        being replaced at capacity. Calling it last (after consolidation) is also valid;
        the events record and replay whichever order happened.
        """
        self._enter(step, _RETIRE)
        rec = Records()
        if self.cfg.frozen:
            return rec
        for rid in list(self.P):
            st = self.stats[rid]
            rho = st.rho
            why, group = None, None
            if st.over_kappa is not None:
                at_step, group, n_r = st.over_kappa
                where = f"group {group} of step {at_step}" if group is not None else f"step {at_step} (per step)"
                why = f"n_r={n_r} > kappa={self.cfg.kappa} at the activation on {where}"
            elif rho is not None and rho + RHO_TOL < self.cfg.rho_min:
                why = f"rho_r={rho:.4f} < rho_min={self.cfg.rho_min}"
            if why:
                self._emit(rec, self._event(step, "retired", self.P[rid], group=group, reason=why,
                                            **self._stat_cols(rid)))
        return rec

    end_step = retire  # the same call, under the name tasks/step.py uses when it retires at the end of the step
