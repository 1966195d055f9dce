"""Step-metric tracking: the loggers of ``tracking.loggers`` — console, TensorBoard event files
under ``{home}/tb/{run_id}/``, W&B and MLflow — with verl's grouped metric names and a table of sample generations
per step.

The ``steps`` table (storage) stays the source of truth; this is a view for people watching a run. TensorBoard
scalars are written new-style in double precision, so a value read back equals the float64 the step computed.
W&B and MLflow are optional extras (arbor's ``tracking`` extra; ``install_hint``), imported only when named; their keys and
URIs come from the environment or the config, never from this module's logs.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from arbor.config.tracking import TrackingConfig
from arbor.paths import arbor_home


class TrackingError(ValueError):
    """A metric that cannot be logged (non-numeric value, bad step)."""


def tb_dir(run_id: str, home: str | os.PathLike[str] | None = None) -> Path:
    """Where a run's TensorBoard event files go: ``{home}/tb/{run_id}``."""
    root = Path(home).expanduser() if home is not None else arbor_home()
    return root / "tb" / run_id


# a ``steps`` row's keys under verl's grouped names; anything else goes to ``misc/``
METRIC_NAMES: dict[str, str] = {
    "mean_base_reward": "reward/base_mean", "mean_total_reward": "reward/total_mean",
    "format_valid_rate": "reward/format_valid_rate", "zero_var_base": "reward/zero_var_groups_base",
    "zero_var_total": "reward/zero_var_groups_total",
    "loss": "actor/pg_loss", "clip_frac": "actor/pg_clipfrac", "approx_kl": "actor/ppo_kl",
    "entropy": "actor/entropy", "grad_norm": "actor/grad_norm", "tis_mean": "actor/tis_mean",
    "tis_clip_frac": "actor/tis_clipfrac", "policy_version": "actor/policy_version",
    "mean_searches": "rollout/searches_mean", "mean_response_tokens": "rollout/response_tokens_mean",
    "n_groups": "rollout/groups", "dropped_groups": "rollout/dapo_dropped_groups",
    "dapo_shortfall": "rollout/dapo_shortfall",
    "judge_calls": "judge/calls", "judge_cost_usd": "judge/cost_usd",
    "judge_calls_failed": "judge/calls_failed", "judge_calls_refused": "judge/calls_refused",
    "judged_groups": "judge/judged_groups",
    "wall_seconds": "timing_s/step",
}
SAMPLE_COLUMNS = ("step", "group", "sample", "question", "gold", "answer", "format_valid", "base_reward",
                  "total_reward", "scores", "response")


def grouped_metrics(row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` under grouped names: ``METRIC_NAMES``, names that already carry a group (``rubric/pool_size``)
    unchanged, the rest under ``misc/``; bookkeeping keys (run id, step, timestamps) dropped."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if k in STEP_KEYS or k == "step":
            continue
        if k == "judge_degraded":  # the degraded roles' names: a logger plots whether there were any
            out["judge/degraded"] = float(v is not None)
            continue
        out[METRIC_NAMES.get(k, k if "/" in k else f"misc/{k}")] = v
    return out


# the console's per-step summary: a few headline figures per row, in this order (every metric still goes to the
# steps table, TensorBoard, W&B and MLflow)
SUMMARY_ROWS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("reward", (("base", "reward/base_mean"), ("total", "reward/total_mean"),
                ("valid", "reward/format_valid_rate"))),
    ("groups", (("zero-var base", "reward/zero_var_groups_base"), ("-> total", "reward/zero_var_groups_total"),
                ("groups", "rollout/groups"))),
    ("rollout", (("searches", "rollout/searches_mean"), ("tokens", "rollout/response_tokens_mean"))),
    ("update", (("loss", "actor/pg_loss"), ("kl", "actor/ppo_kl"), ("clip", "actor/pg_clipfrac"),
                ("grad", "actor/grad_norm"))),
    ("judge", (("calls", "judge/calls"), ("usd", "judge/cost_usd"))),
)


def summary_row(label: str, cells: Sequence[tuple[str, str]], metrics: Mapping[str, float]) -> str | None:
    """One console row: ``label`` then each (name, metric key) cell the step has; None when it has none."""
    shown = [f"{name} {short_number(metrics[key])}" for name, key in cells if key in metrics]
    return f"  {label:<8} " + "   ".join(shown) if shown else None


def step_summary(step: int, metrics: Mapping[str, float], method_lines: Sequence[str] = ()) -> str:
    """The console's few lines for a step: a header with its seconds, then one row per group of headline
    figures it has (``SUMMARY_ROWS``), the method's own rows (``Method.console_lines``), then held-out F1 per
    split when the step evaluated."""
    head = f"step {step}" + (f" · {metrics['timing_s/step']:.1f} s" if "timing_s/step" in metrics else "")
    lines = [head]
    lines += [row for label, cells in SUMMARY_ROWS if (row := summary_row(label, cells, metrics)) is not None]
    lines += method_lines
    f1 = {k.split("/")[1]: v for k, v in metrics.items() if k.startswith("eval/") and k.endswith("/strict_f1")}
    if f1:
        lines.append(f"  {'eval F1':<8} " + "   ".join(f"{split} {short_number(v)}" for split, v in sorted(f1.items())))
    return "\n".join(lines)


def clean_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Floats to log: None and NaN are skipped (a metric a step did not produce), bools become 0/1, anything
    non-numeric is refused by name."""
    out: dict[str, float] = {}
    for name, v in metrics.items():
        if v is None:
            continue
        if isinstance(v, bool):
            v = float(v)
        try:
            f = float(v)
        except (TypeError, ValueError) as e:
            raise TrackingError(f"metric {name!r}: {v!r} is not a number") from e
        if math.isnan(f):
            continue
        out[name] = f
    return out


def install_hint(logger: str) -> str:
    """The command that installs ``logger`` as arbor's ``tracking`` extra pins it (read from arbor's installed
    metadata: arbor-rl is not on a package index, so ``pip install 'arbor-rl[tracking]'`` finds nothing)."""
    from importlib.metadata import PackageNotFoundError, requires

    dist = "mlflow-skinny" if logger == "mlflow" else logger
    try:
        reqs = requires("arbor-rl") or []
    except PackageNotFoundError:
        reqs = []
    pinned = next((r.split(";")[0].strip() for r in reqs
                   if r.startswith(dist) and "tracking" in r.partition(";")[2]), dist)
    return f"pip install '{pinned}' (arbor's tracking extra; from arbor's checkout: pip install -c constraints.txt '.[tracking]')"


class Tracker:
    """Writes one run's step metrics to every logger of ``tracking``. ``resume_step``: TensorBoard events at or
    after it from an earlier attempt are purged (``purge_step``), W&B resumes the run of the same id and MLflow the
    run tagged with this run id, so a resumed run does not draw a second line over the same steps."""

    def __init__(self, run_id: str, home: str | os.PathLike[str] | None = None, *,
                 tracking: TrackingConfig | None = None, config: Mapping[str, Any] | None = None,
                 resume_step: int | None = None,
                 method_lines: Callable[[Mapping[str, float]], Sequence[str]] | None = None):
        self.run_id = run_id
        self.method_lines = method_lines  # the method's console rows (``Method.console_lines``)
        self.cfg = tracking if tracking is not None else TrackingConfig(loggers=["tensorboard"])
        self.home = Path(home).expanduser() if home is not None else arbor_home()
        self.log_dir = tb_dir(run_id, self.home)
        self._tb: Any = None
        self._wandb: Any = None
        self._mlflow: Any = None
        if "tensorboard" in self.cfg.loggers:
            self._open_tensorboard(resume_step)
        if "wandb" in self.cfg.loggers:
            self._open_wandb(config)
        if "mlflow" in self.cfg.loggers:
            self._open_mlflow(config)

    # -- opening each logger
    def _open_tensorboard(self, resume_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir.mkdir(parents=True, exist_ok=True)
        fresh = not any(self.log_dir.glob("events.out.tfevents.*"))
        self._tb = SummaryWriter(log_dir=str(self.log_dir), purge_step=resume_step, flush_secs=30)
        if fresh and resume_step is None:
            # TensorBoard treats a run's first SessionLog.START as its beginning and each later one (written by
            # purge_step on resume) as a restart that drops the superseded steps; torch writes START only on purge.
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog

            self._tb._get_file_writer().add_event(
                Event(step=0, wall_time=time.time(), session_log=SessionLog(status=SessionLog.START)))

    def _open_wandb(self, config: Mapping[str, Any] | None) -> None:
        try:
            import wandb
        except ImportError as e:
            raise TrackingError(f"tracking.loggers names wandb but it is not installed: {install_hint('wandb')}") from e
        (self.home / "wandb").mkdir(parents=True, exist_ok=True)
        self._wandb = wandb.init(project=self.cfg.project, name=self.cfg.experiment or self.run_id, id=self.run_id,
                                 resume="allow", config=dict(config or {}), dir=str(self.home),
                                 mode=self.cfg.wandb_mode, reinit="create_new")

    def _open_mlflow(self, config: Mapping[str, Any] | None) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise TrackingError(f"tracking.loggers names mlflow but it is not installed: {install_hint('mlflow')}") from e
        uri = self.cfg.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or mlflow_local_uri(self.home)
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(self.cfg.project)
        # artifacts beside the store, never in the working directory (MLflow's default for a database store)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(
            self.cfg.project, artifact_location=(self.home / "mlflow" / "artifacts").resolve().as_uri())
        found = client.search_runs([exp_id], filter_string=f"tags.`arbor.run_id` = '{self.run_id}'", max_results=1)
        if found:  # a resumed run continues its MLflow run
            mlflow_run_id = found[0].info.run_id
        else:
            mlflow_run_id = client.create_run(exp_id, run_name=self.cfg.experiment or self.run_id,
                                              tags={"arbor.run_id": self.run_id}).info.run_id
            if config is not None:
                client.log_dict(mlflow_run_id, dict(config), "config.json")
        self._mlflow = (client, mlflow_run_id)

    # -- logging
    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Log ``metrics`` (name -> number) at ``step``; returns what was logged. Names carry a ``/`` group
        prefix (``reward/base_mean``; ``grouped_metrics``), which every logger shows as a section."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise TrackingError(f"step must be a non-negative int, got {step!r}")
        clean = clean_metrics(metrics)
        if "console" in self.cfg.loggers:
            print(step_summary(step, clean, self.method_lines(clean) if self.method_lines else ()), flush=True)
        if self._tb is not None:
            for name, v in clean.items():
                self._tb.add_scalar(name, v, global_step=step, new_style=True, double_precision=True)
        if self._wandb is not None:
            self._wandb.log(clean, step=step)
        if self._mlflow is not None:
            from mlflow.entities import Metric

            client, mrid = self._mlflow
            now = int(time.time() * 1000)
            client.log_batch(mrid, metrics=[Metric(k, v, now, step) for k, v in clean.items()])
        return clean

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """The step's sample generations (``SAMPLE_COLUMNS``): a W&B table ``samples``, an MLflow table artifact
        ``samples/step_NNNNNN.json``, a TensorBoard text panel ``samples``; the console prints nothing more."""
        if not rows:
            return
        cols = list(SAMPLE_COLUMNS)
        data = [[r.get(c) for c in cols] for r in rows]
        if self._tb is not None:
            head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
            body = "\n".join("| " + " | ".join(_cell(v) for v in row) + " |" for row in data)
            self._tb.add_text("samples", head + body, global_step=step)
        if self._wandb is not None:
            import wandb

            self._wandb.log({"samples": wandb.Table(columns=cols, data=data)}, step=step)
        if self._mlflow is not None:
            client, mrid = self._mlflow
            client.log_table(mrid, data={c: [row[i] for row in data] for i, c in enumerate(cols)},
                             artifact_file=f"samples/step_{step:06d}.json")

    def flush(self) -> None:
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        if self._mlflow is not None:
            client, mrid = self._mlflow
            client.set_terminated(mrid)
            self._mlflow = None

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def mlflow_local_uri(home: Path) -> str:
    """The default MLflow store of a workspace: SQLite at ``{home}/mlflow/mlflow.db`` (MLflow 3 retired the plain
    file store); ``mlflow ui --backend-store-uri`` this URI to browse it."""
    (home / "mlflow").mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(home / 'mlflow' / 'mlflow.db').resolve()}"


def short_number(v: float) -> str:
    """A console figure: four significant digits."""
    return f"{v:.4g}"


def _cell(v: Any) -> str:
    """One markdown table cell: pipes escaped, newlines as spaces, long text cut."""
    text = v if isinstance(v, str) else json.dumps(v)
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= 300 else text[:300] + " ..."


def log_step_metrics(run_id: str, step: int, metrics: Mapping[str, Any],
                     home: str | os.PathLike[str] | None = None) -> dict[str, float]:
    """One-shot: open a writer, log one step, close (for flows that run each step in a fresh task)."""
    with Tracker(run_id, home) as t:
        return t.log(step, metrics)


STEP_KEYS = ("run_id", "step", "completed_at")


def steps_to_tensorboard(run_id: str, home: str | os.PathLike[str] | None = None) -> int:
    """Rebuild a run's event files from its stored ``steps`` rows (the source of truth, under the grouped names the
    live run used); returns the steps logged.

    Earlier event files of the run are replaced, so this is idempotent (e.g. after copying a workspace)."""
    from arbor.storage.sql import run_file

    rows = run_file("steps_of_runs", {"run_ids": [run_id]}, home=home)
    d = tb_dir(run_id, home)
    for f in d.glob("events.out.tfevents.*") if d.exists() else []:
        f.unlink()
    with Tracker(run_id, home) as t:
        for r in rows:
            t.log(int(r["step"]), grouped_metrics(r))
    return len(rows)


def read_scalars(run_id: str, home: str | os.PathLike[str] | None = None) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in a run's event files: tag -> [(step, value)] in step order (reads with tensorboard's
    EventAccumulator; used by tests and ``arbor report``)."""
    import numpy as np
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    d = tb_dir(run_id, home)
    if not d.exists():
        return {}
    # The plugin accumulator is the one the TensorBoard server uses: legacy and new-style scalars both arrive as
    # tensors, and a writer's purge_step (resume) discards the superseded events.
    acc = EventAccumulator(str(d), size_guidance={"tensors": 0})
    acc.Reload()
    out: dict[str, list[tuple[int, float]]] = {}
    for tag in acc.Tags().get("tensors", []):
        if acc.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":  # the samples' text panel
            continue
        out[tag] = sorted((e.step, float(np.asarray(tensor_util.make_ndarray(e.tensor_proto)).item()))
                          for e in acc.Tensors(tag))
    return out


def read_texts(run_id: str, home: str | os.PathLike[str] | None = None) -> dict[int, str]:
    """The sample tables of a run's event files (TensorBoard text panel ``samples``): step -> markdown."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    d = tb_dir(run_id, home)
    acc = EventAccumulator(str(d), size_guidance={"tensors": 0})
    acc.Reload()
    tag = "samples/text_summary"
    if tag not in acc.Tags().get("tensors", []):
        return {}
    return {e.step: tensor_util.make_ndarray(e.tensor_proto).item().decode() for e in acc.Tensors(tag)}
