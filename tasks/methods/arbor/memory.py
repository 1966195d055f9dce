"""ARBOR rubric memory M = (D, P) in one class, ``RubricMemory``: admission, consolidation, capacity, retirement and
active selection (paper §3.2-3.4, Table 4). Pure bookkeeping: no I/O, no judge calls.

The class reads in the order the paper tells the lifecycle (§3.3's admission, consolidation, retirement, then
§3.4's selection), each part under its own heading:

    state        M = (D, P) (§3.3): the candidate pool D, the common pool P with each rubric's statistics (n_r, rho_r:
                 ``rubric_stats.py``), the order of a step's calls, and the one event handler that live calls and the
                 replay both apply; the warm start loads P from another run's exported pool (memory.init_from).
    induce       the drafts (§3.2, A.1): a judge's induced drafts get deterministic ids (the anchors of eq. 1 and the
                 induction call are ``induction.py`` and ``method.py``).
    admit        §3.3 Admission, eq. 2: an induced draft enters the candidate pool D when its scores on its source
                 group vary enough (Var >= delta_v) and agree with F1 (Pearson >= rho_min).
    consolidate  §3.3 Consolidation and capacity: every K_consol admitted drafts, the consolidation judge's new
                 common rubrics enter P unless an embedding de-duplicates them; a full pool replaces its weakest
                 matured rubric.
    retire       §3.3 Retirement: a rubric whose n_r exceeded kappa, or whose rho_r fell below rho_min, leaves the
                 common pool.
    select       §3.4 Active selection: the common rubrics that judge a step's groups, the strongest by rho_r plus the
                 least recently used among the next strongest; each active rubric's judged groups are then applied
                 as activations, which update n_r and rho_r (§3.3 Retirement; §3.4's per-batch filter).
    replay       resume: the memory rebuilt from its stored event and activation rows, each replayed through the
                 live calls' event handler and checked against the statistics stored after it.

Call order within one training step ``s`` (enforced; each call at most once per step, any may be skipped):

    0. mem.load_pool(s, data)                      warm start from another run's exported P (first step only)
    1. active, rec = mem.select_active(s)          exactly min(n_active, |P|) rubrics: top rho_r + LRU
       ... the flow judges every group under every active rubric (tasks.methods.arbor.sparse_graph.score_group) ...
    2. rec = mem.apply_activations(s, [Activation(rubric_id, group, scoring, f1), ...])
                                                   n_r and cumulative rho_r, applied in group-index order; the
                                                   first activation with n_r > kappa marks the rubric
    3. rec = mem.retire(s)                         end of the step's scoring: marked (n_r > kappa at any
                                                   activation) or rho_r < rho_min now
                                                   (may instead come last, after 5; alias ``end_step``)
       ... the flow shapes rewards (tasks.shaping), induces drafts on mixed groups and judges each draft on its
           source group; ``RubricMemory.make_drafts(s, group, drafts)`` mints the draft ids ...
    4. rec = mem.admit_drafts(s, [DraftResult(rubric, group, question_id, question, scoring, f1), ...])  (eq. 2)
    5. while mem.consolidation_due():              |D| >= k_consol
           drafts = mem.consolidation_batch()      the oldest k_consol drafts (memory.consolidation_batch=all: D)
           new = <consolidation judge>(mem.candidates_by_query(drafts), mem.pool)   (0-2 RubricDrafts)
           rec = mem.consolidate(s, new, embed)    de-dup (cosine >= dedup_threshold), capacity, lineage; the
                                                   batch leaves D (the only call that may repeat within a step)

Every call returns ``Records`` (events / activations / sources): plain dicts whose keys are the columns of
``rubric_events`` / ``rubric_activations`` / ``rubric_sources`` (docs/interfaces.md) without run_id.
``RubricMemory.from_events(cfg, events, activations, sources, groups)`` replays them into the identical state
(resume): every live decision is itself applied through the same event handler the replay uses, and the
statistics are re-accumulated from the activation rows' scores with the groups' F1 (``groups``: (step, group) ->
GroupInfo, read back from the trajectories table).

Ids are deterministic: drafts ``d{step}.{group}.{i}``, commons ``c{step}.{i}`` (i counts on over the step's
consolidation calls), warm-start commons ``w{i}``.

Beside this module: the rows and the calls' inputs (``records.py``) and a common rubric's lifetime statistics
(``rubric_stats.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np

from arbor.config.memory import MemoryConfig
from arbor.group_stats import VarianceKind, group_variance, pearson
from arbor.tasks.methods.arbor.records import (
    ACTIVATION_COLUMNS,
    EVENT_COLUMNS,
    Activation,
    DraftResult,
    GroupInfo,
    Records,
)
from arbor.tasks.methods.arbor.rubric_stats import (
    RHO_TOL,
    RubricStats,
    exceeds_kappa,
    next_n_r,
    step_variance,
)
from arbor.tasks.shaping import passes_variance
from arbor.types import Rubric, RubricDraft

# Phases of a step (see the module docstring). The ordered ones must come in this order, each at most once;
# ``retire`` comes once, any time after the scoring (after it, no select/activations in that step).
_LOAD, _SELECT, _ACTIVATE, _ADMIT, _CONSOLIDATE, _RETIRE = range(6)
_PHASE_NAMES = ("load_pool", "select_active", "apply_activations", "admit_drafts", "consolidate", "retire")

# from_events(partial_phase=...): the last call completed in an incomplete last step. The flow's stage names
# (tasks/step.py) are accepted too.
_PARTIAL = {
    "load_pool": _LOAD, "select_active": _SELECT, "apply_activations": _ACTIVATE, "score": _ACTIVATE,
    "admit_drafts": _ADMIT, "induce": _ADMIT, "consolidate": _CONSOLIDATE, "retire": _RETIRE, "end_step": _RETIRE,
}


@dataclass(frozen=True)
class DraftEntry:
    """A draft in the candidate pool D with its query of origin (lineage)."""

    rubric: Rubric
    step: int
    group: int
    question_id: str | None  # None only transiently during a replay without that group's GroupInfo
    question: str | None


# ---------------------------------------------------------------- admission's test (§3.3, eq. 2)
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


# ---------------------------------------------------------------- consolidation's de-duplication (§3.3)
def rubric_text(r: Rubric | RubricDraft) -> str:
    """Text embedded for de-duplication: title and high-scoring description."""
    return f"{r.title}: {r.description}"


Embed = Callable[[list[str]], Any]  # texts -> array-like (n, dim)


def _normalise(x: Any) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 2:
        a = a.reshape(len(a), -1)
    norms = np.linalg.norm(a, axis=1, keepdims=True)
    return a / np.where(norms == 0, 1.0, norms)


# ---------------------------------------------------------------- the shaping filter per batch (§3.4)
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


class RubricMemory:
    """Candidate pool D and common pool P with the lifecycle of §3.3 and the selection of §3.4."""

    # ================================================================ state: M = (D, P) (§3.3)
    # Candidate pool D and common pool P, and the bookkeeping every call of the lifecycle goes through.
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

    # ---------------------------------------------------------------- the event handler (live calls and replay)
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

    # ---------------------------------------------------------------- 0. warm start
    def load_pool(self, step: int, data: Mapping[str, Any], source: str = "") -> Records:
        """Warm-start P from ``export_pool()`` data: rubrics enter as new commons w{i} with fresh statistics."""
        self._enter(step, _LOAD)
        rec = Records()
        rubrics = data.get("rubrics")
        if not isinstance(rubrics, list):
            raise ValueError(f"rubric pool {source or '<data>'}: expected a 'rubrics' list")
        for i, r in enumerate(rubrics):
            missing = [k for k in ("title", "description", "counter_description") if not isinstance(r.get(k), str)]
            if missing:
                raise ValueError(f"rubric pool {source or '<data>'}: rubric {i} lacks {', '.join(missing)}")
            new = Rubric(f"w{i}", r["title"], r["description"], r["counter_description"], "common",
                         r.get("feature"), int(r.get("direction") or 0))
            why = f"warm start from {source or 'exported pool'} ({r.get('rubric_id', i)})"
            if len(self.P) >= self.cfg.pool_max:
                self._emit(rec, self._event(step, "dropped", new, reason=why + "; pool full"))
            else:
                self._emit(rec, self._event(step, "consolidated", new, reason=why))
        return rec

    def export_pool(self) -> dict[str, Any]:
        """P as JSON-able data (text and the statistics at export time) for ``load_pool`` in another run."""
        return {
            "version": 1,
            "rubrics": [
                {"rubric_id": rid, "title": r.title, "description": r.description,
                 "counter_description": r.counter_description, "feature": r.feature, "direction": r.direction,
                 **self._stat_cols(rid)}
                for rid, r in self.P.items()
            ],
        }

    # ================================================================ induce: the drafts (§3.2, A.1)
    @staticmethod
    def make_drafts(step: int, group: int, drafts: Sequence[RubricDraft]) -> list[Rubric]:
        """Mint deterministic draft ids d{step}.{group}.{i} for a judge's induced drafts."""
        return [
            Rubric(f"d{step}.{group}.{i}", d.title, d.description, d.counter_description, "draft", d.feature, d.direction)
            for i, d in enumerate(drafts)
        ]

    # ================================================================ admit (§3.3 Admission, eq. 2): step call 4
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

    # ================================================================ consolidate (§3.3 Consolidation): step call 5
    # ``consolidate`` while ``consolidation_due()``, on ``consolidation_batch()``.
    def consolidation_due(self) -> bool:
        """|D| has reached K_consol (§3.3): a consolidation call is due."""
        return not self.cfg.frozen and len(self.D) >= self.cfg.k_consol

    def consolidation_batch(self) -> list[DraftEntry]:
        """The drafts the next consolidation call digests (§3.3: it fires when |D| reaches K_consol, so one call sees
        K_consol drafts): the oldest ``k_consol`` in admission order; ``memory.consolidation_batch=all``: all of D."""
        return list(self.D) if self.cfg.consolidation_batch == "all" else self.D[: self.cfg.k_consol]

    def candidates_by_query(self, drafts: Sequence[DraftEntry] | None = None) -> dict[str, list[Rubric]]:
        """``drafts`` (default: all of D) grouped by query of origin (question text), in admission order (the
        consolidation prompt, E.2)."""
        out: dict[str, list[Rubric]] = {}
        for d in self.D if drafts is None else drafts:
            out.setdefault(d.question or "", []).append(d.rubric)
        return out

    def consolidate(self, step: int, new_commons: Sequence[RubricDraft], embed: Embed) -> Records:
        """Write the consolidation judge's new common rubrics into P (de-dup, capacity), keep lineage; the drafts of
        ``consolidation_batch()`` (the ones the judge was shown) leave D (§3.3). May repeat within a step while
        ``consolidation_due()``."""
        self._enter(step, _CONSOLIDATE)
        if self.cfg.frozen:
            raise RuntimeError("RubricMemory.consolidate: the memory is frozen (memory.frozen=true)")
        if not self.consolidation_due():
            raise RuntimeError(f"RubricMemory.consolidate: not due (|D| = {len(self.D)} < k_consol)")
        rec = Records()
        drafts = self.consolidation_batch()
        existing = list(self.P.values())
        texts = [rubric_text(r) for r in existing] + [rubric_text(c) for c in new_commons]
        vecs = _normalise(embed(texts)) if new_commons else np.zeros((len(texts), 1))
        if len(vecs) != len(texts):
            raise ValueError(f"consolidate: the embedder (memory.embedder) returned {len(vecs)} vectors "
                             f"for {len(texts)} texts")
        old_ids, old_vecs = [r.rubric_id for r in existing], vecs[: len(existing)]
        kept_ids: list[str] = []
        kept_vecs: list[np.ndarray] = []
        for i, c in enumerate(new_commons):
            new = Rubric(f"c{step}.{self._commons + i}", c.title, c.description, c.counter_description, "common", c.feature, c.direction)
            v = vecs[len(existing) + i]
            ids = old_ids + kept_ids
            sims = [float(v @ w) for w in list(old_vecs) + kept_vecs]
            best = int(np.argmax(sims)) if sims else -1
            sim = sims[best] if sims else None
            if sim is not None and sim >= self.cfg.dedup_threshold:
                self._emit(rec, self._event(step, "duplicate", new, other_rubric_id=ids[best], similarity=sim,
                                            reason="cosine >= dedup_threshold"))
                continue
            if len(self.P) >= self.cfg.pool_max:
                unit = self.cfg.count_activations
                matured = [r for r in self.P if self.stats[r].activations(unit) >= self.cfg.maturity]
                if not matured:
                    self._emit(rec, self._event(step, "dropped", new, similarity=sim,
                                                reason=f"pool full and no rubric has {self.cfg.maturity} "
                                                       f"activations{' (steps)' if unit == 'step' else ''}"))
                    continue
                victim = min(matured, key=lambda r: (self.stats[r].mean_variance, self.stats[r].birth))
                self._emit(rec, self._event(step, "replaced", self.P[victim], other_rubric_id=new.rubric_id,
                                            reason="lowest mean within-group variance among matured",
                                            **self._stat_cols(victim)))
            self._emit(rec, self._event(step, "consolidated", new, similarity=sim,
                                        reason=f"from {len(drafts)} drafts"))
            kept_ids.append(new.rubric_id)
            kept_vecs.append(v)
            for d in drafts:
                rec.sources.append({"step": step, "common_rubric_id": new.rubric_id,
                                    "draft_rubric_id": d.rubric.rubric_id, "draft_step": d.step, "group": d.group,
                                    "question_id": d.question_id, "question": d.question})
        self._commons += len(new_commons)
        for d in drafts:  # the batch leaves D: each of its drafts as "consolidated"
            self._emit(rec, self._event(step, "consolidated", d.rubric, group=d.group,
                                        reason=f"consumed by consolidation at step {step}"))
        return rec

    # ================================================================ retire (§3.3 Retirement): step call 3
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

    # ================================================================ select (§3.4 Active selection): step call 1
    # ``select_active`` (and ``peek_active``, its look without choosing).
    def _strength(self, rid: str) -> tuple[int, float, int]:
        rho = self.stats[rid].rho
        return (1, 0.0, self.stats[rid].birth) if rho is None else (0, -rho, self.stats[rid].birth)

    def select_active(self, step: int) -> tuple[list[Rubric], Records]:
        """Exactly min(n_active, |P|) rubrics: the highest rho_r, plus the least recently used among the next
        strongest (rotation_pool of them; ties: higher rho_r, then older). Undefined rho_r ranks last."""
        self._enter(step, _SELECT)
        rec = Records()
        chosen = self._choose_active()
        for rid, why in chosen:
            self._emit(rec, self._event(step, "activated", self.P[rid], reason=why, **self._stat_cols(rid)))
        return [self.P[rid] for rid, _ in chosen], rec

    def peek_active(self) -> list[Rubric]:
        """The rubrics ``select_active`` would choose now, without choosing them (no event, no state change):
        streamed judging scores a group with them before the score stage runs."""
        return [self.P[rid] for rid, _ in self._choose_active()]

    def _choose_active(self) -> list[tuple[str, str]]:
        m = min(self.cfg.n_active, len(self.P))
        if m == 0:
            return []
        ranked = sorted(self.P, key=self._strength)
        rest = ranked[1:]
        width = len(rest) if self.cfg.rotation_pool is None else max(self.cfg.rotation_pool, m - 1)
        lru = sorted(rest[:width], key=lambda r: (-1 if self.stats[r].last_used is None else self.stats[r].last_used,
                                                  self._strength(r)))[: m - 1]
        return [(ranked[0], "top rho_r")] + [(r, "lru") for r in lru]

    # ---------------------------------------------------------------- activate: step call 2, n_r and rho_r per
    # judged group (§3.3 Retirement's statistics)
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

    # ================================================================ replay: resume from the stored rows
    # ``from_events``: the state a run's stored rows describe.
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


def load_pool_file(path: str | Path) -> dict[str, Any]:
    """Read an exported rubric pool (memory.init_from); errors name the file."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError as e:
        raise FileNotFoundError(f"memory.init_from: rubric pool file {p} does not exist") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"memory.init_from: {p}, line {e.lineno}: invalid JSON ({e.msg})") from e
    if not isinstance(data, dict) or not isinstance(data.get("rubrics"), list):
        raise ValueError(f"memory.init_from: {p}: expected an object with a 'rubrics' list")
    return data
