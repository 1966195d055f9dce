"""Step metrics: TensorBoard event files read back with tensorboard's EventAccumulator (exact values), verl's
grouped names, and the optional loggers (W&B offline, an MLflow file store) read back from what they wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbor.config import TrackingConfig
from arbor.tasks.reporting.tracking import (
    Tracker,
    TrackingError,
    clean_metrics,
    grouped_metrics,
    log_step_metrics,
    read_scalars,
    steps_to_tensorboard,
    tb_dir,
)


def test_event_files_hold_the_exact_values(arbor_home: Path) -> None:
    # 0.1 and 1/3 are not float32-representable: a float32 writer would read back 0.10000000149011612
    steps = {0: {"reward/mean_base": 0.1, "loss": 1 / 3, "judge_calls": 17, "clip_frac": None},
             1: {"reward/mean_base": 0.25, "loss": -2.5e-7, "judge_calls": 0, "clip_frac": float("nan")},
             2: {"reward/mean_base": 0.123456789012345, "loss": 1e300, "judge_calls": 3, "clip_frac": 0.5}}
    with Tracker("run-a", arbor_home) as t:
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
    with Tracker("run-b", arbor_home) as t:
        for step in range(4):
            t.log(step, {"x": float(step)})
    # the run died after step 3's metrics were written but before step 2 was committed: it resumes at step 2
    with Tracker("run-b", arbor_home, resume_step=2) as t:
        t.log(2, {"x": 20.0})
    assert read_scalars("run-b", arbor_home)["x"] == [(0, 0.0), (1, 1.0), (2, 20.0)]


def test_one_shot_helper_and_bad_input(arbor_home: Path) -> None:
    assert log_step_metrics("run-c", 5, {"a": True, "b": 2}, home=arbor_home) == {"a": 1.0, "b": 2.0}
    assert read_scalars("run-c", arbor_home) == {"a": [(5, 1.0)], "b": [(5, 2.0)]}
    log_step_metrics("run-c", 6, {"a": 0.5}, home=arbor_home)  # a second writer appends; nothing is purged
    assert read_scalars("run-c", arbor_home)["a"] == [(5, 1.0), (6, 0.5)]
    with pytest.raises(TrackingError, match="metric 'name'"):
        clean_metrics({"name": "abc"})
    with Tracker("run-c", arbor_home) as t, pytest.raises(TrackingError, match="step"):
        t.log(-1, {"a": 1.0})
    assert read_scalars("missing", arbor_home) == {}


def test_grouped_names_by_hand() -> None:
    row = {"run_id": "r", "step": 3, "completed_at": 1.0, "mean_base_reward": 0.2, "loss": 0.5,
           "approx_kl": 0.01, "judge_calls": 7, "wall_seconds": 2.0, "mean_searches": 1.5,
           "rubric/pool_size": 2, "something_new": 1.0}
    assert grouped_metrics(row) == {
        "reward/base_mean": 0.2, "actor/pg_loss": 0.5, "actor/ppo_kl": 0.01, "judge/calls": 7,
        "timing_s/step": 2.0, "rollout/searches_mean": 1.5, "rubric/pool_size": 2, "misc/something_new": 1.0}


def test_steps_table_replayed_into_tensorboard(arbor_home: Path) -> None:
    from arbor.storage.parquet import write_stage

    for step, (reward, kl) in enumerate([(0.1, 1e-3), (0.3, None)]):
        write_stage("steps", [{"mean_base_reward": reward, "approx_kl": kl, "n_groups": 8, "wall_seconds": 2.5}],
                    run_id="run-d", step=step, stage="metrics", home=arbor_home)
    log_step_metrics("run-d", 7, {"stale": 1.0}, home=arbor_home)  # replaced by the replay
    assert steps_to_tensorboard("run-d", arbor_home) == 2
    got = read_scalars("run-d", arbor_home)  # under the grouped names the live run uses
    assert got["reward/base_mean"] == [(0, 0.1), (1, 0.3)]
    assert got["actor/ppo_kl"] == [(0, 1e-3)]  # a null metric is not logged
    assert "stale" not in got and "mean_base_reward" not in got
    assert got["rollout/groups"] == [(0, 8.0), (1, 8.0)] and "misc/completed_at" not in got


SAMPLES = [{"step": 1, "group": g, "sample": 0, "question": f"Who is {g}?", "gold": "A", "answer": "A | B",
            "format_valid": True, "base_reward": 0.5, "total_reward": 0.75, "scores": "r1 +0.50",
            "response": "<think>x</think>\n<answer>\\boxed{A}</answer>"} for g in range(2)]


def test_wandb_offline_and_mlflow_local_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every logger at once, nothing over the network: W&B in offline mode (its run file decoded), MLflow in a
    local SQLite store with file artifacts (read back through its client), TensorBoard, and the console line."""
    from flow_support import wandb_history
    from mlflow.tracking import MlflowClient

    cfg = TrackingConfig(loggers=["console", "tensorboard", "wandb", "mlflow"], project="arbor-test",
                         wandb_mode="offline")
    for step, reward in ((1, 0.25), (2, 0.5)):
        with Tracker("run-w", tmp_path, tracking=cfg, config={"train": {"lr": 3e-4}}) as t:  # reopened: resume
            t.log(step, {"reward/base_mean": reward, "actor/pg_loss": -reward})
            t.log_samples(step, SAMPLES)
    assert "step 2\n  reward   base 0.5\n  update   loss -0.5\n" in capsys.readouterr().out
    # W&B: one offline run (resumed by id), both steps, and the sample table as a table file
    runs = list((tmp_path / "wandb").glob("offline-run-*-run-w"))
    hist = [row for d in runs for row in wandb_history(d)]
    assert sorted((r["_step"], r["reward/base_mean"]) for r in hist if "reward/base_mean" in r) == \
        [(1, 0.25), (2, 0.5)]  # an offline resume writes a second run folder; `wandb sync` joins them by id
    tables = [r for r in hist if r.get("samples/_type") == "table-file"]
    assert len(tables) == 2 and {r["samples/nrows"] for r in tables} == {2}
    table_file = next(f for d in runs for f in d.glob("files/media/table/samples_1_*.table.json"))
    import json

    got = json.loads(table_file.read_text())
    assert got["columns"][:4] == ["step", "group", "sample", "question"] and got["data"][1][3] == "Who is 1?"
    # MLflow: one run in the experiment, tagged with the arbor run id, grouped metric history, a table per step
    from arbor.tasks.reporting.tracking import mlflow_local_uri

    client = MlflowClient(tracking_uri=mlflow_local_uri(tmp_path))
    exp = client.get_experiment_by_name("arbor-test")
    [run] = client.search_runs([exp.experiment_id])
    assert run.data.tags["arbor.run_id"] == "run-w"
    hist_m = client.get_metric_history(run.info.run_id, "reward/base_mean")
    assert sorted((m.step, m.value) for m in hist_m) == [(1, 0.25), (2, 0.5)]
    assert {a.path for a in client.list_artifacts(run.info.run_id, "samples")} == \
        {"samples/step_000001.json", "samples/step_000002.json"}
    local = client.download_artifacts(run.info.run_id, "samples/step_000002.json", str(tmp_path / "dl"))
    table = json.loads(Path(local).read_text())
    assert table["columns"][-1] == "response" and len(table["data"]) == 2
    assert json.loads(Path(client.download_artifacts(run.info.run_id, "config.json", str(tmp_path / "dl"))
                           ).read_text()) == {"train": {"lr": 3e-4}}
    # TensorBoard: the scalars and the samples as a text panel
    assert read_scalars("run-w", tmp_path)["reward/base_mean"] == [(1, 0.25), (2, 0.5)]
    from arbor.tasks.reporting.tracking import read_texts

    texts = read_texts("run-w", tmp_path)
    assert sorted(texts) == [1, 2] and "| 1 | 1 | 0 | Who is 1? | A | A \\| B | true | 0.5 | 0.75 |" in texts[2]


def test_a_named_logger_that_is_not_installed_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if the extra were not installed
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    with pytest.raises(TrackingError) as err:
        Tracker("run-x", tmp_path, tracking=TrackingConfig(loggers=["mlflow"]))
    # a command that installs something: pyproject's own pin of the extra, not the unpublished 'arbor-rl[tracking]'
    import tomllib

    from arbor.paths import PROJECT_ROOT

    [pin] = [r for r in tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["tracking"] if r.startswith("mlflow")]
    from packaging.requirements import Requirement

    said = str(err.value).split("pip install '", 1)[1].split("'", 1)[0]
    assert Requirement(said).name == "mlflow-skinny" and Requirement(said).specifier == Requirement(pin).specifier
    assert "arbor-rl[" not in str(err.value)


def test_the_console_shows_a_short_summary_per_step() -> None:
    """A few headline figures in rows (the steps table keeps every metric), the method's own rows, held-out F1 per
    split when the step evaluated, and nothing for figures the step did not produce. The generic rows name no
    method's state: a rubric count is shown only by a method that adds its row (ARBOR's ``console_lines``)."""
    from arbor.tasks.methods.arbor.report import console_lines
    from arbor.tasks.reporting.tracking import step_summary

    metrics = {"timing_s/step": 12.34, "reward/base_mean": 0.25, "reward/total_mean": 0.3125,
               "reward/format_valid_rate": 1.0, "reward/zero_var_groups_base": 0.5,
               "reward/zero_var_groups_total": 0.125, "judge/calls": 96.0, "rubric/pool_size": 3.0,
               "eval/world_test/strict_f1": 0.42, "misc/other": 7.0}
    generic = ("step 3 · 12.3 s\n"
               "  reward   base 0.25   total 0.3125   valid 1\n"
               "  groups   zero-var base 0.5   -> total 0.125\n"
               "  judge    calls 96\n")
    assert step_summary(3, metrics) == generic + "  eval F1  world_test 0.42"
    text = step_summary(3, metrics, console_lines(metrics))  # Arbor.console_lines
    assert text == generic + "  rubrics  pool 3\n  eval F1  world_test 0.42"
    assert all(len(line) < 100 for line in text.splitlines())
