"""Progress a person can follow: where the run is, how far the stage is, when it ends.

On a terminal: live bars (the run's steps, the current stage: rollout groups or judge calls), with every log line
(Prefect's, arbor's, a library's) printed above them through the same console, so nothing garbles the bars. Off a
terminal (CI, a worker's log, ``| tee``): one line every ``ARBOR_PROGRESS_SECONDS`` (default 10) while a stage
runs, e.g. ``[arbor] step 2/5 · rollout · 24/32 groups · 12 s · ETA 4 s · run ETA 1 min``, and nothing when nothing
runs. The lines come from ``line()``, a pure rendering of the state the flow reports.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from arbor.runtime.quiet import all_handlers
from arbor.timefmt import duration

PROGRESS_EVERY_S = 10.0


class RunProgress:
    """The flow reports (``stage_started``, ``groups``, ``calls``, ``step_done``); this shows it."""

    def __init__(self, steps: int, *, console: Console | None = None, every_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, stream: TextIO | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.stream = stream  # where the lines go off a terminal (default: stderr at the time of printing)
        self.live = self.console.is_terminal
        self.every_s = every_s if every_s is not None else float(os.environ.get("ARBOR_PROGRESS_SECONDS",
                                                                                 PROGRESS_EVERY_S))
        self.clock = clock
        self.steps_total, self.steps_done = steps, 0
        self.step, self.stage = 0, ""
        self.done: int | None = None
        self.total: int | None = None
        self.unit = ""
        self.t_stage = clock()
        self.step_seconds: list[float] = []
        self._t_step = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._swapped: list[tuple[Any, str, Any]] = []
        # stages report from two threads under run.overlap=one-step (the next rollout runs in a task-runner thread
        # while this step trains): the bar a report updates must be the one that is there
        self._lock = threading.RLock()
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=self.console, transient=False, disable=not self.live,
        )
        self.steps_bar = self.progress.add_task("steps", total=steps)
        self.stage_bar = self.progress.add_task("stage", total=None)

    # ------------------------------------------------------------------ lifetime
    def __enter__(self) -> RunProgress:
        if self.live:
            self.progress.start()
            self._route_logs()
        elif self.every_s > 0:
            self._thread = threading.Thread(target=self._tick_loop, name="arbor-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.live:
            self._restore_logs()
            self.progress.stop()

    def _route_logs(self) -> None:
        """Every logging handler writes through the live console while the bars are shown (Prefect's console
        handler prints with its own rich Console: it gets ours; plain stream handlers get the console's stream)."""
        for h in all_handlers():
            if isinstance(getattr(h, "console", None), Console):
                self._swapped.append((h, "console", h.console))
                h.console = self.console
            elif isinstance(h, logging.StreamHandler) and h.stream in (sys.__stderr__, sys.__stdout__):
                self._swapped.append((h, "stream", h.stream))
                h.setStream(sys.stderr)  # rich's proxy while the live display runs

    def _restore_logs(self) -> None:
        for h, attr, old in reversed(self._swapped):
            if attr == "console":
                h.console = old
            else:
                h.setStream(old)
        self._swapped.clear()

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.tick()

    # ------------------------------------------------------------------ what the flow reports
    def stage_started(self, step: int, stage: str) -> None:
        with self._lock:
            if step != self.step:  # a step's time runs from its first stage (not from the run's start-up or eval)
                self._t_step = self.clock()
            self.step, self.stage, self.done, self.total, self.unit = step, stage, None, None, ""
            self.t_stage = self.clock()
            # a new bar per stage: rich's reset keeps the last stage's total (a stale "0/176" under evaluation)
            self.progress.remove_task(self.stage_bar)
            self.stage_bar = self.progress.add_task(f"step {step}: {stage}", total=None)

    def groups(self, done: int, total: int, unit: str = "groups") -> None:
        """Per rollout group that finished: a bar over the step's groups (evaluation: over its answers)."""
        self._count(done, total, unit)

    def calls(self, stage: str, done: int, total: int) -> None:
        """Per judge call (score / induce): a bar over the stage's calls."""
        self._count(done, total, "judge calls")

    def _count(self, done: int, total: int, unit: str) -> None:
        with self._lock:
            self.done, self.total, self.unit = done, total, unit
            self.progress.update(self.stage_bar, completed=done, total=total,
                                 description=f"step {self.step}: {self.stage} ({unit})")

    def step_done(self) -> None:
        with self._lock:
            now = self.clock()
            self.step_seconds.append(now - self._t_step)
            self._t_step = now
            self.steps_done += 1
            if self.step <= self.steps_done:  # else the next step's rollout already runs (overlap): keep its bar
                self.stage, self.done, self.total = "", None, None
                self.progress.update(self.stage_bar, visible=False)  # nothing runs: no stale bar on the screen
            self.progress.advance(self.steps_bar)

    # ------------------------------------------------------------------ off a terminal
    def line(self) -> str | None:
        """The progress line for now, or None when no stage runs."""
        if not self.stage:
            return None
        now = self.clock()
        elapsed = now - self.t_stage
        parts = [f"step {self.step}/{self.steps_total}", self.stage]
        if self.total:
            parts.append(f"{self.done}/{self.total} {self.unit}")
        parts.append(duration(elapsed))
        if self.total and self.done:
            parts.append(f"ETA {duration(elapsed / self.done * (self.total - self.done))}")
        if self.step_seconds:
            per_step = sum(self.step_seconds) / len(self.step_seconds)
            left = per_step * (self.steps_total - self.steps_done) - (now - self._t_step)
            parts.append(f"run ETA {duration(max(0.0, left))}")
        return "[arbor] " + " · ".join(parts)

    def tick(self, stream: TextIO | None = None) -> None:
        """Print the progress line (the ticker calls this every ``every_s`` off a terminal)."""
        if (text := self.line()) is not None:
            print(text, file=stream or self.stream or sys.stderr, flush=True)
