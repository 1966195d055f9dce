"""Step-metric tracking: TensorBoard event files under ``{home}/tb/{run_id}/``, and W&B when the user has it.

The ``steps`` table (storage) stays the source of truth; this is a view for people watching a run. Scalars are
written new-style in double precision, so a value read back equals the float64 the step computed (no float32
rounding). W&B is optional and never required: it is used only when ``wandb`` is importable *and* the
``WANDB_PROJECT`` environment variable is set (its key, as always, from the environment; never stored here).
"""

from __future__ import annotations

import importlib.util
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from arbor.paths import arbor_home


class TrackingError(ValueError):
    """A metric that cannot be logged (non-numeric value, bad step)."""


def tb_dir(run_id: str, home: str | os.PathLike[str] | None = None) -> Path:
    """Where a run's TensorBoard event files go: ``{home}/tb/{run_id}``."""
    root = Path(home).expanduser() if home is not None else arbor_home()
    return root / "tb" / run_id


def wandb_enabled() -> bool:
    """W&B is used only when installed and ``WANDB_PROJECT`` is set."""
    return bool(os.environ.get("WANDB_PROJECT")) and importlib.util.find_spec("wandb") is not None


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


class Tracker:
    """Writes one run's step metrics. ``resume_step``: events at or after it from an earlier attempt are purged
    (TensorBoard ``purge_step``), so a resumed run does not draw a second line over the same steps."""

    def __init__(self, run_id: str, home: str | os.PathLike[str] | None = None, *,
                 config: Mapping[str, Any] | None = None, resume_step: int | None = None,
                 use_wandb: bool | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.run_id = run_id
        self.log_dir = tb_dir(run_id, home)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        fresh = not any(self.log_dir.glob("events.out.tfevents.*"))
        self._tb = SummaryWriter(log_dir=str(self.log_dir), purge_step=resume_step, flush_secs=30)
        if fresh and resume_step is None:
            # TensorBoard treats a run's first SessionLog.START as its beginning and each later one (written by
            # purge_step on resume) as a restart that drops the superseded steps; torch writes START only on purge.
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog

            self._tb._get_file_writer().add_event(
                Event(step=0, wall_time=time.time(), session_log=SessionLog(status=SessionLog.START)))
        self._wandb: Any = None
        if use_wandb if use_wandb is not None else wandb_enabled():
            import wandb  # optional dependency, installed by the user

            self._wandb = wandb.init(project=os.environ.get("WANDB_PROJECT"), name=run_id, id=run_id,
                                     resume="allow", config=dict(config or {}),
                                     dir=str(self.log_dir.parent.parent))

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Log ``metrics`` (name -> number) at ``step``; returns what was logged. Names may carry a ``/`` group
        prefix (``reward/mean_base``), which TensorBoard and W&B both use as a section."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise TrackingError(f"step must be a non-negative int, got {step!r}")
        clean = clean_metrics(metrics)
        for name, v in clean.items():
            self._tb.add_scalar(name, v, global_step=step, new_style=True, double_precision=True)
        if self._wandb is not None:
            self._wandb.log(clean, step=step)
        return clean

    def flush(self) -> None:
        self._tb.flush()

    def close(self) -> None:
        self._tb.flush()
        self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def log_step_metrics(run_id: str, step: int, metrics: Mapping[str, Any],
                     home: str | os.PathLike[str] | None = None) -> dict[str, float]:
    """One-shot: open a writer, log one step, close (for flows that run each step in a fresh task)."""
    with Tracker(run_id, home, use_wandb=False) as t:
        return t.log(step, metrics)


STEP_KEYS = ("run_id", "step", "completed_at")


def steps_to_tensorboard(run_id: str, home: str | os.PathLike[str] | None = None) -> int:
    """Rebuild a run's event files from its stored ``steps`` rows (the source of truth); returns the steps logged.

    Earlier event files of the run are replaced, so this is idempotent (e.g. after copying a workspace)."""
    from arbor.storage.sql import run_file

    rows = run_file("steps_of_runs", {"run_ids": [run_id]}, home=home)
    d = tb_dir(run_id, home)
    for f in d.glob("events.out.tfevents.*") if d.exists() else []:
        f.unlink()
    with Tracker(run_id, home, use_wandb=False) as t:
        for r in rows:
            t.log(int(r["step"]), {k: v for k, v in r.items() if k not in STEP_KEYS})
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
        out[tag] = sorted((e.step, float(np.asarray(tensor_util.make_ndarray(e.tensor_proto)).item()))
                          for e in acc.Tensors(tag))
    return out
