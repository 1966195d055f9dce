"""The rubric memory's state M = (D, P) (paper §3.3): the candidate pool D, the common pool P with each rubric's
statistics, the order of a step's calls, and the one event handler that live calls and the replay both apply."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from arbor.config.memory import MemoryConfig
from arbor.group_stats import group_variance
from arbor.tasks.methods.arbor.records import EVENT_COLUMNS, GroupInfo, Records
from arbor.tasks.methods.arbor.rubric_stats import RubricStats, exceeds_kappa, next_n_r, step_variance
from arbor.types import Rubric

# Phases of a step (see the module docstring). The ordered ones must come in this order, each at most once;
# ``retire`` comes once, any time after the scoring (after it, no select/activations in that step).
_LOAD, _SELECT, _ACTIVATE, _ADMIT, _CONSOLIDATE, _RETIRE = range(6)
_PHASE_NAMES = ("load_pool", "select_active", "apply_activations", "admit_drafts", "consolidate", "retire")


@dataclass(frozen=True)
class DraftEntry:
    """A draft in the candidate pool D with its query of origin (lineage)."""

    rubric: Rubric
    step: int
    group: int
    question_id: str | None  # None only transiently during a replay without that group's GroupInfo
    question: str | None


class MemoryState:
    """Candidate pool D and common pool P, and the bookkeeping every call of the lifecycle goes through."""

    def __init__(self, cfg: MemoryConfig | None = None) -> None:
        self.cfg = cfg or MemoryConfig()
        self.P: dict[str, Rubric] = {}  # insertion order = birth order
        self.stats: dict[str, RubricStats] = {}
        self.D: list[DraftEntry] = []
        self._births = 0
        self._induced: dict[str, Rubric] = {}
        self._step: int | None = None
        self._phase = -1  # last ordered phase done in the current step
        self._retired = False  # retire() done in the current step
        self._last = ""
        self._seq = 0
        self._commons = 0  # common ids minted in the current step: the next one is c{step}.{_commons}

    # ---------------------------------------------------------------- views
    @property
    def pool(self) -> list[Rubric]:
        return list(self.P.values())

    def rho(self, rubric_id: str) -> float | None:
        return self.stats[rubric_id].rho

    def state(self) -> dict[str, Any]:
        """A comparable snapshot of everything that drives future decisions."""
        return {
            "P": [(r, vars(self.stats[rid]).copy()) for rid, r in self.P.items()],
            "D": list(self.D),
            "births": self._births,
        }

    # ---------------------------------------------------------------- step bookkeeping
    def _enter(self, step: int, phase: int) -> None:
        if self._step is not None and step < self._step:
            raise ValueError(f"RubricMemory: step {step} after step {self._step} (steps must not go back)")
        if self._step is None or step > self._step:
            self._step, self._phase, self._retired, self._seq, self._last = step, -1, False, 0, ""
            self._commons = 0
        name = _PHASE_NAMES[phase]
        if phase == _CONSOLIDATE and self._phase == _CONSOLIDATE and self._last == name:
            pass  # the next batch of K_consol drafts in the same step (§3.3)
        elif phase == _RETIRE:
            if self._retired:
                raise RuntimeError(f"RubricMemory: retire called twice in step {step}")
            self._retired, self._phase = True, max(self._phase, _ACTIVATE)
        elif phase <= self._phase:
            raise RuntimeError(
                f"RubricMemory: {name} called after {self._last} in step {step} (order: load_pool -> "
                "select_active -> apply_activations -> [retire] -> admit_drafts -> consolidate... -> [retire]; "
                "each at most once per step, consolidate once per batch)"
            )
        else:
            self._phase = phase
        self._last = name

    def _event(self, step: int, event: str, rubric: Rubric | None = None, **cols: Any) -> dict[str, Any]:
        row: dict[str, Any] = dict.fromkeys(EVENT_COLUMNS)
        row.update(step=step, seq=self._seq, event=event)
        self._seq += 1
        if rubric is not None:
            row.update(
                rubric_id=rubric.rubric_id, kind=rubric.kind, title=rubric.title, description=rubric.description,
                counter_description=rubric.counter_description, feature=rubric.feature, direction=rubric.direction,
            )
        row.update(cols)
        return row

    def _stat_cols(self, rid: str) -> dict[str, Any]:
        st = self.stats[rid]
        return {"n_r": st.n_r, "rho_r": st.rho, "n_activations": st.n_activations, "mean_variance": st.mean_variance}

    def _emit(self, rec: Records, row: dict[str, Any], info: GroupInfo | None = None) -> None:
        """Apply an event to the state (the same handler replays it), then stamp the pool sizes after it."""
        self._apply(row, info)
        row["pool_size"] = len(self.P)
        row["candidate_pool_size"] = len(self.D)
        rec.events.append(row)

    def _apply(self, e: Mapping[str, Any], info: GroupInfo | None) -> None:
        ev, rid, kind = e["event"], e["rubric_id"], e["kind"]
        if ev == "induced":
            self._induced[rid] = Rubric(
                rid, e["title"], e["description"], e["counter_description"], "draft", e["feature"], e["direction"] or 0
            )
        elif ev == "admitted":
            qid, q = (info.question_id, info.question) if info is not None else (None, None)
            self.D.append(DraftEntry(self._induced.pop(rid), e["step"], e["group"], qid, q))
        elif ev in ("rejected", "judge_error") and kind == "draft":
            self._induced.pop(rid, None)
        elif ev == "consolidated" and kind == "draft":
            self.D = [d for d in self.D if d.rubric.rubric_id != rid]
        elif ev == "consolidated" and kind == "common":
            self.P[rid] = Rubric(
                rid, e["title"], e["description"], e["counter_description"], "common", e["feature"], e["direction"] or 0
            )
            self.stats[rid] = RubricStats(birth=self._births)
            self._births += 1
        elif ev in ("retired", "replaced"):
            del self.P[rid]
            del self.stats[rid]
        elif ev == "activated":
            self.stats[rid].last_used = e["step"]
        # duplicate, dropped, judge_error (common): recorded decisions with no state change

    def _apply_activation(
        self, rid: str, scores: Sequence[float | None], f1: Sequence[float], step: int, group: int
    ) -> float:
        """One scored activation (live and replay alike): n_r, rho_r sums, and the n_r > kappa mark (§3.3)."""
        pairs = [(s, y) for s, y in zip(scores, f1, strict=True) if s is not None]
        xs = [p[0] for p in pairs]
        variance = group_variance(xs, self.cfg.variance)
        st = self.stats[rid]
        if st.scored_step != step:
            st.n_steps, st.scored_step = st.n_steps + 1, step
        st.add(xs, [p[1] for p in pairs], variance, self.cfg.delta_v, per_step=self.cfg.count_activations == "step")
        if st.over_kappa is None and exceeds_kappa(st.n_r, self.cfg.kappa):
            st.over_kappa = (step, group, st.n_r)
        return variance

    def _close_step(self, step: int) -> None:
        """count_activations=step (live and replay alike): each rubric scored this step takes one activation for
        n_r, with the mean of its groups' variances (§3.3 read with activation = step)."""
        if self.cfg.count_activations != "step":
            return
        for st in self.stats.values():
            if st.step_variances:
                st.n_r = next_n_r(st.n_r, step_variance(st.step_variances), self.cfg.delta_v)
                st.step_variances = []
                if st.over_kappa is None and exceeds_kappa(st.n_r, self.cfg.kappa):
                    st.over_kappa = (step, None, st.n_r)
