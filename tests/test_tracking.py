"""Step metrics as TensorBoard event files, read back with tensorboard's EventAccumulator (exact values)."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbor.tasks.tracking import (
    Tracker,
    TrackingError,
    clean_metrics,
    log_step_metrics,
    read_scalars,
    steps_to_tensorboard,
    tb_dir,
    wandb_enabled,
)


def test_event_files_hold_the_exact_values(arbor_home: Path) -> None:
    # 0.1 and 1/3 are not float32-representable: a float32 writer would read back 0.10000000149011612
    steps = {0: {"reward/mean_base": 0.1, "loss": 1 / 3, "judge_calls": 17, "clip_frac": None},
             1: {"reward/mean_base": 0.25, "loss": -2.5e-7, "judge_calls": 0, "clip_frac": float("nan")},
             2: {"reward/mean_base": 0.123456789012345, "loss": 1e300, "judge_calls": 3, "clip_frac": 0.5}}
    with Tracker("run-a", arbor_home, use_wandb=False) as t:
        for step, m in steps.items():
            t.log(step, m)
    files = list(tb_dir("run-a", arbor_home).glob("events.out.tfevents.*"))
    assert files and all(f.stat().st_size > 0 for f in files)
    assert tb_dir("run-a", arbor_home) == arbor_home / "tb" / "run-a"
    got = read_scalars("run-a", arbor_home)
    assert got["reward/mean_base"] == [(0, 0.1), (1, 0.25), (2, 0.123456789012345)]
    assert got["loss"] == [(0, 1 / 3), (1, -2.5e-7), (2, 1e300)]
    assert got["judge_calls"] == [(0, 17.0), (1, 0.0), (2, 3.0)]
    assert got["clip_frac"] == [(2, 0.5)]  # None and NaN were not logged


def test_resume_purges_the_steps_being_redone(arbor_home: Path) -> None:
    with Tracker("run-b", arbor_home, use_wandb=False) as t:
        for step in range(4):
            t.log(step, {"x": float(step)})
    # the run died after step 3's metrics were written but before step 2 was committed: it resumes at step 2
    with Tracker("run-b", arbor_home, use_wandb=False, resume_step=2) as t:
        t.log(2, {"x": 20.0})
    assert read_scalars("run-b", arbor_home)["x"] == [(0, 0.0), (1, 1.0), (2, 20.0)]


def test_one_shot_helper_and_bad_input(arbor_home: Path) -> None:
    assert log_step_metrics("run-c", 5, {"a": True, "b": 2}, home=arbor_home) == {"a": 1.0, "b": 2.0}
    assert read_scalars("run-c", arbor_home) == {"a": [(5, 1.0)], "b": [(5, 2.0)]}
    log_step_metrics("run-c", 6, {"a": 0.5}, home=arbor_home)  # a second writer appends; nothing is purged
    assert read_scalars("run-c", arbor_home)["a"] == [(5, 1.0), (6, 0.5)]
    with pytest.raises(TrackingError, match="metric 'name'"):
        clean_metrics({"name": "abc"})
    with Tracker("run-c", arbor_home, use_wandb=False) as t, pytest.raises(TrackingError, match="step"):
        t.log(-1, {"a": 1.0})
    assert read_scalars("missing", arbor_home) == {}


def test_wandb_only_when_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    assert wandb_enabled() is False
    monkeypatch.setenv("WANDB_PROJECT", "p")
    import importlib.util

    assert wandb_enabled() is (importlib.util.find_spec("wandb") is not None)


def test_steps_table_replayed_into_tensorboard(arbor_home: Path) -> None:
    from arbor.storage.parquet import write_stage

    for step, (reward, kl) in enumerate([(0.1, 1e-3), (0.3, None)]):
        write_stage("steps", [{"mean_base_reward": reward, "approx_kl": kl, "n_groups": 8, "wall_seconds": 2.5}],
                    run_id="run-d", step=step, stage="metrics", home=arbor_home)
    log_step_metrics("run-d", 7, {"stale": 1.0}, home=arbor_home)  # replaced by the replay
    assert steps_to_tensorboard("run-d", arbor_home) == 2
    got = read_scalars("run-d", arbor_home)
    assert got["mean_base_reward"] == [(0, 0.1), (1, 0.3)]
    assert got["approx_kl"] == [(0, 1e-3)]  # a null metric is not logged
    assert got["n_groups"] == [(0, 8.0), (1, 8.0)] and "stale" not in got and "completed_at" not in got
