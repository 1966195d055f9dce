"""Resume: the rubric memory rebuilt from its stored event and activation rows, each replayed through
the live calls' event handler and checked against the statistics stored after it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Self

from arbor.config.memory import MemoryConfig
from arbor.tasks.methods.arbor.records import GroupInfo
from arbor.tasks.methods.arbor.state import (
    _ACTIVATE,
    _ADMIT,
    _CONSOLIDATE,
    _LOAD,
    _RETIRE,
    _SELECT,
    MemoryState,
)

# from_events(partial_phase=...): the last call completed in an incomplete last step. The flow's stage names
# (tasks/step.py) are accepted too.
_PARTIAL = {
    "load_pool": _LOAD, "select_active": _SELECT, "apply_activations": _ACTIVATE, "score": _ACTIVATE,
    "admit_drafts": _ADMIT, "induce": _ADMIT, "consolidate": _CONSOLIDATE, "retire": _RETIRE, "end_step": _RETIRE,
}


class ReplayMixin(MemoryState):
    """``from_events``: the state a run's stored rows describe."""

    @classmethod
    def from_events(
        cls,
        cfg: MemoryConfig,
        events: Iterable[Mapping[str, Any]],
        activations: Iterable[Mapping[str, Any]],
        sources: Iterable[Mapping[str, Any]] = (),
        groups: Mapping[tuple[int, int], GroupInfo] | None = None,
        partial_phase: str | None = None,
    ) -> Self:
        """Rebuild the memory from stored rows of complete steps (resume).

        ``groups`` maps (step, group) to the group's question and per-sample F1 (from the trajectories table,
        ``group_info_from_rows``); it is needed for every scored activation and every draft still in D. Each
        replayed activation is checked against the stored n_r / n_activations / rho_r after it, so a wrong
        mapping fails loudly.
        ``sources`` is accepted for symmetry (lineage is an output, not state).
        ``partial_phase``: None when the last step is complete; otherwise the last call completed in it
        (a phase name, or the flow's stage name score / induce / consolidate / retire), so the remaining calls of
        that step can follow. Phases up to it are taken as done, except ``retire`` which counts only when named.
        """
        del sources
        groups = groups or {}
        mem = cls(cfg)
        evs = sorted((dict(e) for e in events), key=lambda e: (e["step"], e["seq"]))
        acts: dict[int, list[dict[str, Any]]] = {}
        for a in activations:
            acts.setdefault(int(a["step"]), []).append(dict(a))
        by_step: dict[int, list[dict[str, Any]]] = {}
        for e in evs:
            by_step.setdefault(int(e["step"]), []).append(e)
        for step in sorted(set(by_step) | set(acts)):
            step_acts = sorted(acts.get(step, []), key=lambda a: (a["group"], a["rubric_id"]))
            applied, seen_activated = not step_acts, False
            for e in by_step.get(step, []):
                if not applied and seen_activated and e["event"] != "activated":
                    mem._replay_activations(step, step_acts, groups)
                    applied = True
                seen_activated |= e["event"] == "activated"
                info = groups.get((step, e["group"])) if e["event"] == "admitted" else None
                mem._apply(e, info)
            if not applied:
                if not seen_activated:
                    raise ValueError(f"replay: step {step} has activation rows but no 'activated' event")
                mem._replay_activations(step, step_acts, groups)
            mem._step, mem._phase, mem._retired, mem._last = step, _CONSOLIDATE, True, "replay"
            mem._seq = 1 + max((e["seq"] for e in by_step.get(step, [])), default=-1)
            mem._commons = 1 + max((int(e["rubric_id"].rsplit(".", 1)[1]) for e in by_step.get(step, [])
                                    if e["kind"] == "common" and str(e["rubric_id"]).startswith(f"c{step}.")),
                                   default=-1)
        if partial_phase is not None:
            if partial_phase not in _PARTIAL:
                raise ValueError(f"from_events: unknown partial_phase {partial_phase!r} (one of {sorted(_PARTIAL)})")
            ph = _PARTIAL[partial_phase]
            mem._retired = ph == _RETIRE
            mem._phase = _ACTIVATE if ph == _RETIRE else ph
        lost = sorted({(d.step, d.group) for d in mem.D if d.question_id is None})
        if lost:
            raise ValueError(f"replay: drafts still in D need GroupInfo for (step, group) {lost}")
        return mem

    def _replay_activations(
        self, step: int, rows: list[dict[str, Any]], groups: Mapping[tuple[int, int], GroupInfo]
    ) -> None:
        per_step = self.cfg.count_activations == "step"
        for a in rows:
            rid, g = a["rubric_id"], int(a["group"])
            if rid not in self.P:
                raise ValueError(f"replay: activation of {rid!r} at step {step} group {g}, not in the common pool")
            if not a["judge_error"]:
                if (step, g) not in groups:
                    raise ValueError(f"replay: no GroupInfo (F1) for step {step} group {g}")
                self._apply_activation(rid, a["scores"], groups[(step, g)].f1, step, g)
            self._check_replayed(step, a, n_r=not per_step)
        if per_step:
            self._close_step(step)
            for a in rows:
                st = self.stats[a["rubric_id"]]
                if st.n_r != a["n_r_after"]:
                    raise ValueError(f"replay: rubric {a['rubric_id']} at the close of step {step}: replayed n_r "
                                     f"{st.n_r} != stored {a['n_r_after']} (wrong GroupInfo F1?)")

    def _check_replayed(self, step: int, a: Mapping[str, Any], n_r: bool) -> None:
        """A replayed activation must reach the stored n_activations / rho_r after it, and n_r unless it moves only
        at the step's close (count_activations=step)."""
        rid, g = a["rubric_id"], int(a["group"])
        st = self.stats[rid]
        rho, stored = st.rho, a["rho_r_after"]
        same_rho = (rho is None) == (stored is None) and (rho is None or abs(rho - stored) <= 1e-9)
        same_n_r = not n_r or st.n_r == a["n_r_after"]
        if st.n_activations != a["n_activations_after"] or not same_rho or not same_n_r:
            raise ValueError(
                f"replay: rubric {rid} at step {step} group {g}: replayed n_r/n_activations/rho_r "
                f"{st.n_r}/{st.n_activations}/{rho} != stored "
                f"{a['n_r_after']}/{a['n_activations_after']}/{stored} (wrong GroupInfo F1?)"
            )
