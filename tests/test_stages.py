"""Stages as stored artifacts: load-if-complete, atomic commit, fault injection (the resume primitive)."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbor.storage.parquet import read_stage, read_table, stage_done
from arbor.tasks.stage_store import InjectedFault, StageStore


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


def test_every_single_bit_flip_of_a_stored_stage_is_caught(arbor_home: Path) -> None:
    """300 random single-bit flips in a committed stage file (a shaped-reward-like float column)
    are each caught when the stage is loaded, naming the file and the stage; so are truncation and a lost file."""
    import random

    from arbor.storage.parquet import StageCorrupt, stage_path

    store = StageStore("r1", arbor_home)
    store.run(1, "score", ("rubric_activations",), lambda: {"rubric_activations": _rows(8, 1)})
    path = Path(stage_path("rubric_activations", run_id="r1", step=1, stage="score", home=arbor_home))
    good = path.read_bytes()
    rng = random.Random(0)
    for _ in range(300):
        i, bit = rng.randrange(len(good)), rng.randrange(8)
        path.write_bytes(good[:i] + bytes([good[i] ^ (1 << bit)]) + good[i + 1:])
        with pytest.raises(StageCorrupt, match="fails its checksum: stage 'score' of step 1 of run 'r1'"):
            store.load(1, "score", ("rubric_activations",))
    path.write_bytes(good[:-10])
    with pytest.raises(StageCorrupt, match=f"{len(good) - 10} bytes, {len(good)} recorded"):
        store.load(1, "score", ("rubric_activations",))
    import pyarrow.parquet as pq

    path.write_bytes(good)
    table = pq.read_table(path)  # a valid Parquet file that lost a column (read back as nulls without the check)
    pq.write_table(table.drop_columns([table.column_names[-1]]), path)
    with pytest.raises(StageCorrupt, match="stage 'score' of step 1 of run 'r1' is damaged"):
        store.load(1, "score", ("rubric_activations",))
    path.unlink()
    with pytest.raises(StageCorrupt, match="is missing"):
        store.run(1, "score", ("rubric_activations",), lambda: {})  # a done stage is loaded, so it is checked
    path.write_bytes(good)
    assert len(store.load(1, "score", ("rubric_activations",))["rubric_activations"]) == 8  # restored: fine


def test_arbor_verify_names_the_damaged_file(arbor_home: Path) -> None:
    from typer.testing import CliRunner

    from arbor.cli import app
    from arbor.storage.parquet import stage_path, write_stage

    write_stage("runs", [{"profile": "tiny-cpu", "method": "grpo", "seed": 0}], run_id="r1", step=0, stage="run",
                home=arbor_home)
    store = StageStore("r1", arbor_home)
    for step in (1, 2):
        store.run(step, "score", ("rubric_activations",), lambda step=step: {"rubric_activations": _rows(4, step)})
    ok = CliRunner().invoke(app, ["verify", "r1"])
    assert ok.exit_code == 0 and "run r1: 2 stages, 2 files checked, 0 damaged" in ok.output
    path = Path(stage_path("rubric_activations", run_id="r1", step=2, stage="score", home=arbor_home))
    path.write_bytes(path.read_bytes()[:-1] + b"\x00")
    bad = CliRunner().invoke(app, ["verify", "r1"])
    assert bad.exit_code == 1 and "1 damaged" in bad.output and str(path) in bad.output
