"""ARBOR rubric memory M = (D, P): admission, consolidation, capacity, retirement and active selection
(paper §3.3 and §3.4 "Active selection", Table 4). Pure bookkeeping: no I/O, no judge calls.

Call order within one training step ``s`` (enforced; each call at most once per step, any may be skipped):

    0. mem.load_pool(s, data)                      warm start from another run's exported P (first step only)
    1. active, rec = mem.select_active(s)          exactly min(n_active, |P|) rubrics: top rho_r + LRU
       ... the flow judges every group under every active rubric (tasks.methods.arbor.judge.score_group) ...
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

Each part of the lifecycle has its module: the state and its event handler (``state.py``), active
selection (``selection.py``), n_r / rho_r and retirement (``retirement.py``, ``rubric_stats.py``), admission
(``admission.py``), consolidation (``consolidation.py``), resume (``replay.py``) and the rows (``records.py``);
``RubricMemory`` joins them, with the warm start.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from arbor.tasks.methods.arbor.admission import AdmissionMixin
from arbor.tasks.methods.arbor.consolidation import ConsolidationMixin
from arbor.tasks.methods.arbor.records import Records
from arbor.tasks.methods.arbor.replay import ReplayMixin
from arbor.tasks.methods.arbor.retirement import RetirementMixin
from arbor.tasks.methods.arbor.selection import SelectionMixin
from arbor.tasks.methods.arbor.state import _LOAD
from arbor.types import Rubric


class RubricMemory(SelectionMixin, RetirementMixin, AdmissionMixin, ConsolidationMixin, ReplayMixin):
    """Candidate pool D and common pool P with the lifecycle of §3.3 and the selection of §3.4."""

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
