"""Stages as stored artifacts: load-if-complete, atomic commit, fault injection (the resume primitive)."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbor.storage.parquet import read_stage, read_table, stage_done
from arbor.tasks.stages import InjectedFault, StageStore


def _rows(n: int, step: int) -> list[dict]:
    return [{"run_id": "r1", "step": step, "group": i, "rubric_id": f"c{i}", "variance": 0.1 * i} for i in range(n)]


def test_stage_computed_once_then_loaded(arbor_home: Path) -> None:
    store = StageStore("r1", arbor_home)
    calls = []

    def compute() -> dict:
        calls.append(1)
        return {"rubric_activations": _rows(3, 1)}

    out1, resumed1 = store.run(1, "score", ("rubric_activations",), compute)
    out2, resumed2 = store.run(1, "score", ("rubric_activations",), compute)
    assert (resumed1, resumed2) == (False, True)
    assert len(calls) == 1  # the second run loaded the artifact instead of recomputing
    assert [r["variance"] for r in out2["rubric_activations"]] == pytest.approx([0.0, 0.1, 0.2])
    status = read_stage("stage_runs", run_id="r1", step=1, stage="score", home=arbor_home)
    assert status and status[0]["status"] == "completed"


def test_injected_fault_leaves_stage_not_done(arbor_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = StageStore("r1", arbor_home)
    monkeypatch.setenv("ARBOR_FAULT", "2:score")
    store.run(1, "score", ("rubric_activations",), lambda: {"rubric_activations": _rows(2, 1)})  # other step: fine
    with pytest.raises(InjectedFault, match="step 2"):
        store.run(2, "score", ("rubric_activations",), lambda: {"rubric_activations": _rows(2, 2)})
    assert not stage_done(run_id="r1", step=2, stage="score", home=arbor_home)
    assert read_table("rubric_activations", run_id="r1", home=arbor_home).num_rows == 2  # nothing of step 2
    monkeypatch.delenv("ARBOR_FAULT")
    out, resumed = store.run(2, "score", ("rubric_activations",), lambda: {"rubric_activations": _rows(4, 2)})
    assert not resumed and len(out["rubric_activations"]) == 4
    assert read_table("rubric_activations", run_id="r1", home=arbor_home).num_rows == 6


def test_stage_missing_table_refused(arbor_home: Path) -> None:
    store = StageStore("r1", arbor_home)
    with pytest.raises(RuntimeError, match="rubric_events"):
        store.run(1, "score", ("rubric_activations", "rubric_events"), lambda: {"rubric_activations": []})
    assert not store.done(1, "score")
