"""great-expectations suite for trajectory batches: each kind of bad batch is refused with a clear message."""

from __future__ import annotations

import pytest

from arbor.storage.parquet import read_table
from arbor.storage.validation import ValidationError, validate_trajectories, write_trajectories

K = 4


def _batch() -> list[dict]:
    """Two groups of K = 4: group 0 mixed outcomes, group 1 with one format-invalid trajectory."""
    rows = []
    for g, f1s in enumerate([[1.0, 0.5, 0.0, 0.0], [0.0, 0.0, 0.25, 0.0]]):
        for s, f1 in enumerate(f1s):
            valid = not (g == 1 and s == 3)
            rows.append(dict(traj_id=f"r/1/{g}/{s}", run_id="r", step=1, group=g, sample=s, question_id=f"q{g}",
                             question="who?", text="<answer>x</answer>", format_valid=valid,
                             em=1.0 if f1 == 1.0 else 0.0, f1=f1 if valid else 0.0,
                             base_reward=f1 if valid else -1.0))
    return rows


def test_good_batch_passes():
    validate_trajectories(_batch(), K)


def _refused(rows, k=K) -> str:
    with pytest.raises(ValidationError) as e:
        validate_trajectories(rows, k)
    return str(e.value)


def test_null_required_column():
    rows = _batch()
    rows[2]["f1"] = None
    msg = _refused(rows)
    assert "expect_column_values_to_not_be_null(column='f1')" in msg and "r/1/0/2" in msg


def test_missing_required_column():
    rows = [{k: v for k, v in r.items() if k != "base_reward"} for r in _batch()]
    assert "base_reward" in _refused(rows)


def test_f1_and_em_out_of_range():
    rows = _batch()
    rows[0]["f1"] = 1.5
    rows[5]["em"] = -0.1
    msg = _refused(rows)
    assert "expect_column_values_to_be_between(column='f1')" in msg and "F1 in [0, 1]" in msg
    assert "expect_column_values_to_be_between(column='em')" in msg and "r/1/1/1" in msg


def test_base_reward_outside_minus_one_or_unit_interval():
    rows = _batch()
    rows[1]["base_reward"] = -0.5  # neither -1 nor in [0, 1]
    rows[2]["base_reward"] = 1.2
    msg = _refused(rows)
    assert "base reward in {-1} ∪ [0, 1]" in msg and "2 offending row(s): r/1/0/1, r/1/0/2" in msg


def test_group_size_not_k():
    rows = _batch()[:-1]  # group 1 has only 3 trajectories
    msg = _refused(rows)
    assert "exactly K = 4" in msg and "r/1/1/0, r/1/1/1, r/1/1/2" in msg and "r/1/0/" not in msg
    validate_trajectories(_batch(), 4)
    assert "exactly K = 8" in _refused(_batch(), k=8)


def test_format_invalid_row_with_credit():
    rows = _batch()
    rows[7]["f1"] = 0.5  # format-invalid but given F1 credit (and so base reward must be -1, F1 0)
    msg = _refused(rows)
    assert "format-invalid rows have F1 = 0, EM = 0 and base reward -1" in msg and "r/1/1/3" in msg
    rows = _batch()
    rows[7]["base_reward"] = 0.0  # format-invalid must get -1
    assert "r/1/1/3" in _refused(rows)


def test_duplicate_traj_id():
    rows = _batch()
    rows[1]["traj_id"] = rows[0]["traj_id"]
    assert "traj_id is unique" in _refused(rows)


def test_several_failures_reported_together():
    rows = _batch()
    rows[0]["f1"] = 2.0
    rows[7]["f1"] = 0.5
    msg = _refused(rows)
    assert msg.count("offending row(s)") >= 2


def test_nothing_written_when_refused(tmp_path):
    rows = _batch()
    rows[0]["f1"] = 2.0
    with pytest.raises(ValidationError):
        write_trajectories(rows, K, run_id="r", step=1, home=tmp_path)
    assert read_table("trajectories", home=tmp_path).num_rows == 0
    assert not (tmp_path / "data" / "trajectories").exists()
    write_trajectories(_batch(), K, run_id="r", step=1, home=tmp_path)
    assert read_table("trajectories", home=tmp_path).num_rows == 8


def test_a_reward_fn_may_return_any_finite_number():
    """A reward.fn plug-in's value is the base reward (docs/plugins.md): EM minus a search price is -0.05 for a
    wrong answer after one search. The built-in range check would refuse it; with the plug-in only a non-finite
    value is refused, and the format gate still gives format-invalid rows -1."""
    rows = _batch()
    rows[3]["base_reward"] = -0.05
    assert "base reward in {-1} ∪ [0, 1]" in _refused(rows)
    validate_trajectories(rows, K, custom_reward=True)
    rows[2]["base_reward"] = float("nan")
    with pytest.raises(ValidationError, match=r"finite number \(reward.fn\): 1 offending row\(s\): r/1/0/2"):
        validate_trajectories(rows, K, custom_reward=True)
    rows = _batch()
    rows[7]["base_reward"] = 0.3  # the format-invalid row, scored by the plug-in
    with pytest.raises(ValidationError, match="base reward -1"):
        validate_trajectories(rows, K, custom_reward=True)
    validate_trajectories(rows, K, custom_reward=True, format_gate=False)
    rows[7]["f1"] = 0.5  # F1 stays arbor's: still 0 for a format-invalid row
    with pytest.raises(ValidationError, match="F1 = 0 and EM = 0"):
        validate_trajectories(rows, K, custom_reward=True, format_gate=False)
