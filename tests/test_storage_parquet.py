"""Parquet store: schemas applied on write, atomic idempotent stage files, stage markers (storage/parquet.py)."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from arbor.storage.parquet import (
    clear_stage,
    mark_stage_done,
    read_stage,
    read_table,
    stage_done,
    stage_files,
    write_stage,
)
from arbor.storage.schemas import SCHEMAS, SchemaError, conform
from arbor.types import Trajectory


def _traj(step: int, group: int, sample: int, f1: float = 0.5) -> dict:
    t = Trajectory(run_id="r1", step=step, group=group, sample=sample, question_id=f"q{group}",
                   question="who?", golds=["a", "b"], prompt_ids=[1, 2, 3], response_ids=[4, 5],
                   loss_mask=[1, 0], rollout_logprobs=[-0.5, 0.0], text="<answer>a</answer>", format_valid=True,
                   answer="a", em=0.0, f1=f1, base_reward=f1, search_queries=["x", "y"])
    return t.to_row()


def test_every_interface_table_has_a_schema():
    """The pipeline declares its own tables; each built-in method's package declares the rest."""
    from arbor.storage.schemas import OWNER, PIPELINE_TABLES
    from arbor.tasks.methods import BUILTIN, resolve_method

    assert set(PIPELINE_TABLES) == {"runs", "steps", "stage_runs", "trajectories", "rubric_events",
                                    "rubric_activations", "rubric_sources", "judge_calls", "eval_results",
                                    "rollouts", "draft_scores"}
    for name in BUILTIN:
        resolve_method(name)
    import arbor.tasks.methods.coreact  # noqa: F401 - registers Co-ReAct's tables

    owned = {"ss-grpo": {"stage_rubrics", "stage_scores", "stage_grades"},
             "rubricem": {"reflections", "rubric_bank", "bank_retrievals"},
             "arco": {"mu_scores", "turn_advantages", "mu_updates"},
             "co-react": {"guided_steps", "branch_points", "generator_samples"}}
    for owner, names in owned.items():
        assert {t for t in SCHEMAS if OWNER[t] == owner} == names, owner
    assert OWNER["steps.dapo_shortfall"] == "dapo" and OWNER["steps.mu_loss"] == "arco"
    assert {"dapo_shortfall", "mu_loss"} <= set(SCHEMAS["steps"].names)


def test_unknown_column_refused_naming_it(tmp_path):
    row = _traj(1, 0, 0) | {"bogus_col": 1}
    with pytest.raises(SchemaError, match="bogus_col"):
        write_stage("trajectories", [row], run_id="r1", step=1, stage="rollout", home=tmp_path)
    assert not (tmp_path / "data" / "trajectories").exists()  # nothing half-written


def test_missing_nullable_columns_are_null_and_keys_required():
    tbl = conform("judge_calls", [{"run_id": "r", "step": 3, "role": "pairwise"}])
    row = tbl.to_pylist()[0]
    assert row["role"] == "pairwise" and row["cost_usd"] is None and row["model"] is None
    assert tbl.schema.field("cost_usd").type == pa.float64()
    with pytest.raises(SchemaError, match="'rubric_id'"):
        conform("rubric_activations", [{"run_id": "r", "step": 1, "group": 0}])
    with pytest.raises(SchemaError, match="'em'"):
        conform("eval_results", [{"run_id": "r", "step": 1, "question_id": "q", "em": "not a number"}])


def test_judge_edge_pair_stored_as_string():
    assert conform("judge_calls", [{"run_id": "r", "step": 0, "edge": (2, 5)}]).column("edge").to_pylist() == ["2-5"]


def test_write_read_roundtrip_fills_keys_and_token_counts(tmp_path):
    rows = [_traj(1, 0, s) for s in range(3)]
    path = write_stage("trajectories", rows, run_id="r1", step=1, stage="rollout", home=tmp_path)
    assert path.as_posix().endswith("data/trajectories/run_id=r1/step=000001/rollout.parquet")
    back = read_stage("trajectories", run_id="r1", step=1, stage="rollout", home=tmp_path)
    assert [r["sample"] for r in back] == [0, 1, 2]
    assert back[0]["golds"] == ["a", "b"] and back[0]["loss_mask"] == [1, 0]
    assert back[0]["prompt_tokens"] == 3 and back[0]["response_tokens"] == 2  # len(prompt_ids), len(response_ids)
    assert read_stage("trajectories", run_id="r1", step=2, stage="rollout", home=tmp_path) is None
    # an arrow table is accepted too, and run_id/step are filled when the table lacks them
    path2 = write_stage("steps", pa.table({"loss": [0.25]}), run_id="r1", step=1, stage="train", home=tmp_path)
    assert pq.read_table(path2).to_pylist()[0]["run_id"] == "r1"


def test_row_with_other_step_refused(tmp_path):
    with pytest.raises(SchemaError, match="step=2"):
        write_stage("trajectories", [_traj(2, 0, 0)], run_id="r1", step=1, stage="rollout", home=tmp_path)


def test_rewrite_replaces_never_duplicates(tmp_path):
    write_stage("trajectories", [_traj(1, 0, s) for s in range(4)], run_id="r1", step=1, stage="rollout", home=tmp_path)
    write_stage("trajectories", [_traj(1, 0, s, f1=1.0) for s in range(4)], run_id="r1", step=1, stage="rollout",
                home=tmp_path)
    tbl = read_table("trajectories", home=tmp_path)
    assert tbl.num_rows == 4  # not 8
    assert set(tbl.column("f1").to_pylist()) == {1.0}  # the second write won
    leftovers = [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".inprogress")]
    assert leftovers == []
    assert len(stage_files("trajectories", home=tmp_path)) == 1


def test_read_table_filters_run_and_orders_by_step(tmp_path):
    for run in ("a", "b"):
        for step in (2, 1):
            write_stage("steps", [{"loss": float(step)}], run_id=run, step=step, stage="train", home=tmp_path)
    tbl = read_table("steps", run_id="b", home=tmp_path)
    assert tbl.column("run_id").to_pylist() == ["b", "b"] and tbl.column("step").to_pylist() == [1, 2]
    assert read_table("judge_calls", home=tmp_path).num_rows == 0


def test_stage_markers(tmp_path):
    kw = dict(run_id="r1", step=3, stage="rollout", home=tmp_path)
    assert not stage_done(**kw)
    write_stage("trajectories", [_traj(3, 0, 0)], **kw)
    mark_stage_done(**kw)
    assert stage_done(**kw)
    clear_stage(**kw)
    assert not stage_done(**kw)
    assert read_stage("trajectories", **kw) is None  # the stage's files are gone with its marker


def test_bad_names_refused(tmp_path):
    with pytest.raises(SchemaError, match="run_id"):
        write_stage("steps", [], run_id="../x", step=1, stage="train", home=tmp_path)
    with pytest.raises(SchemaError, match="unknown table"):
        write_stage("nope", [], run_id="r", step=1, stage="train", home=tmp_path)
