"""Stages as stored artifacts (docs/architecture.md): the resume primitive of every flow.

A stage of step ``s`` of run ``r`` writes its tables as Parquet files keyed by (r, s, stage) and then a completion
marker. ``run_stage`` returns the stored rows when the marker exists (no recomputation, no judge or search call),
otherwise computes, writes every table atomically, then marks the stage done. A crash anywhere before the marker
leaves the stage "not done"; re-running it replaces its files (idempotent, never duplicated).

Fault injection for tests and drills (``ARBOR_FAULT=STEP:STAGE[:MODE]``): MODE ``raise`` (default) raises after the
stage computed but before it committed; ``kill`` SIGKILLs the process there; ``kill-mid`` is honoured by stages that
call ``fault_point(step, stage, "mid")`` halfway through their work; ``enospc`` / ``erofs`` raise there the
``OSError`` a full disk / a read-only file system gives a writer; ``hold-mid`` waits at the "mid" point until the
run is asked to stop (at most ``HOLD_S``), so a stop drill lands its signal inside that phase every time.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from arbor.storage.parquet import (
    file_digest,
    mark_stage_done,
    read_stage,
    stage_done,
    verify_stage,
    write_stage,
)

Rows = list[dict[str, Any]]


HOLD_S = 300.0


class InjectedFault(RuntimeError):
    """Raised by ``ARBOR_FAULT`` (tests and failure drills)."""


def fault_point(step: int, stage: str, where: str) -> None:
    """Fail here if ``ARBOR_FAULT`` names this (step, stage) and moment."""
    spec = os.environ.get("ARBOR_FAULT")
    if not spec:
        return
    parts = spec.split(":")
    f_step, f_stage = int(parts[0]), parts[1]
    mode = parts[2] if len(parts) > 2 else "raise"
    if (f_step, f_stage) != (step, stage):
        return
    if where == "mid" and mode == "kill-mid":
        os.kill(os.getpid(), signal.SIGKILL)
    if where == "mid" and mode == "hold-mid":
        _hold_until_stopped()
    if where == "commit":
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "raise":
            raise InjectedFault(f"injected fault at step {step}, stage {stage!r}")
        if mode in ("enospc", "erofs"):
            code = errno.ENOSPC if mode == "enospc" else errno.EROFS
            raise OSError(code, os.strerror(code), f"<injected at step {step}, stage {stage}>")


def _hold_until_stopped() -> None:
    """Wait until a stop is asked (the main thread's signal handler raises ``RunStopped`` out of the wait)."""
    from arbor.runtime import stop

    deadline = time.monotonic() + HOLD_S
    while stop.current() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.raise_pending()


class StageStore:
    """The stored artifacts of one run."""

    def __init__(self, run_id: str, home: Path) -> None:
        self.run_id = run_id
        self.home = Path(home)

    def done(self, step: int, stage: str) -> bool:
        return stage_done(run_id=self.run_id, step=step, stage=stage, home=self.home)

    def load(self, step: int, stage: str, tables: tuple[str, ...]) -> dict[str, Rows]:
        """The stage's stored rows, after checking its files against the checksums its marker recorded (a damaged
        file stops the resume naming it: ``StageCorrupt``)."""
        verify_stage(run_id=self.run_id, step=step, stage=stage, tables=tables, home=self.home)
        return {t: read_stage(t, run_id=self.run_id, step=step, stage=stage, home=self.home) or [] for t in tables}

    def commit(self, step: int, stage: str, outputs: Mapping[str, Rows], started_at: float | None = None) -> None:
        """Write every table of the stage, its ``stage_runs`` row, then the completion marker (last)."""
        fault_point(step, stage, "commit")
        files = {table: file_digest(write_stage(table, rows, run_id=self.run_id, step=step, stage=stage,
                                                home=self.home)) for table, rows in outputs.items()}
        now = time.time()
        started_at = now if started_at is None else started_at
        self.record(step, stage, "completed", started_at, now)
        mark_stage_done(run_id=self.run_id, step=step, stage=stage, home=self.home,
                        info={"wall_seconds": now - started_at, "files": files})

    def record(self, step: int, stage: str, status: str, started_at: float, finished_at: float | None) -> None:
        """A ``stage_runs`` row: when the stage ran and how it ended (``arbor runs`` derives run status from it)."""
        write_stage("stage_runs", [{
            "stage": stage, "started_at": started_at, "finished_at": finished_at, "status": status,
            "wall_seconds": None if finished_at is None else finished_at - started_at,
        }], run_id=self.run_id, step=step, stage=stage, home=self.home)

    def run(
        self, step: int, stage: str, tables: tuple[str, ...], compute: Callable[[], Mapping[str, Rows]]
    ) -> tuple[dict[str, Rows], bool]:
        """(rows per table, resumed?) — stored rows if the stage is complete, else computed and committed."""
        if self.done(step, stage):
            return self.load(step, stage, tables), True
        started = time.time()
        out = dict(compute())
        missing = set(tables) - set(out)
        if missing:
            raise RuntimeError(f"stage {stage!r} produced no rows for {sorted(missing)}")
        self.commit(step, stage, out, started_at=started)
        return out, False
