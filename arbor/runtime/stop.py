"""One way for a run to stop when asked.

``arbor train`` installs ``install()`` before it starts anything. From then on SIGINT (Ctrl-C) and SIGTERM — sent
to the process or to its whole process group (a terminal's Ctrl-C, ``timeout``, SLURM's ``scancel``) — and a
dependency found dead (``request``: Prefect's API server exited) all take the same path: the main thread raises
``RunStopped`` naming the cause, the flow records the run as ``stopped`` (``failed`` for a dead dependency) and
unwinds, and the CLI prints one line saying what stopped the run and how to resume it.

The servers the run relies on are started in sessions of their own (``arbor.runtime.api_server``, ``tasks.env.serving``),
so a group signal reaches only arbor, which stops them itself once the run has unwound. A bound covers what could
still hang (a library waiting on a dead API, a second signal): ``DEADLINE_S`` after the first request, or at once on
a second signal, the process records the run's end, prints the same line and exits without further cleanup; the
watchdog (``arbor.runtime.watchdog``) then stops whatever it had started.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

DEADLINE_S = float(os.environ.get("ARBOR_STOP_DEADLINE_S", "8"))
DEAD_DEPENDENCY_GRACE_S = 3.0  # nothing can wait on a dead dependency: a short bound


class RunStopped(BaseException):
    """The run was asked to stop (a signal) or lost a dependency; a BaseException so that no ``except Exception``
    on the way up retries or swallows it."""

    def __init__(self, cause: str, *, signalled: bool, code: int) -> None:
        super().__init__(cause)
        self.cause, self.signalled, self.code = cause, signalled, code


@dataclass
class _State:
    installed: bool = False
    cause: str | None = None
    signalled: bool = False
    code: int = 1
    raised: bool = False
    deferring: int = 0  # inside ``deferred()``: a signal is recorded, its raise waits for the block's end
    reported: bool = False
    line: Callable[[RunStopped], str] | None = None
    run_id: str | None = None
    on_hard_stop: list[Callable[[RunStopped], None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


_state = _State()

_NAMES = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM"}


def installed() -> bool:
    """Whether this process took over SIGINT and SIGTERM (the CLI did; a Prefect worker's flow run did not)."""
    return _state.installed


def install(line: Callable[[RunStopped], str]) -> dict[int, Any]:
    """Take over SIGINT and SIGTERM for this process (main thread only); ``line`` renders the last line. Returns
    the handlers it replaced (``uninstall``)."""
    _state.installed, _state.line = True, line
    return {sig: signal.signal(sig, _on_signal) for sig in _NAMES}


def uninstall(previous: dict[int, Any]) -> None:
    """Give SIGINT and SIGTERM back to ``previous`` (the run is over; nothing more to stop)."""
    _state.installed = False
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def set_run(run_id: str) -> None:
    """The run being trained (its id is generated in the flow when the user named none)."""
    _state.run_id = run_id


def run_id() -> str | None:
    return _state.run_id


def rearm() -> None:
    """Put our handlers back (Prefect's flow engine installs its own SIGTERM handler for the flow's duration)."""
    if _state.installed and threading.current_thread() is threading.main_thread():
        for sig in _NAMES:
            signal.signal(sig, _on_signal)


def current() -> RunStopped | None:
    """The stop asked for so far, if any."""
    return None if _state.cause is None else RunStopped(_state.cause, signalled=_state.signalled, code=_state.code)


def raise_pending() -> None:
    """Raise the stop asked for, if any. The signal handler raises it where the signal lands; landing inside code
    whose exceptions Python ignores (a finalizer, a garbage-collector callback: "Exception ignored in ...") loses
    that raise, so the run checks again at each step boundary and before it records itself completed."""
    pending = current()
    if pending is not None:
        raise pending


def on_hard_stop(fn: Callable[[RunStopped], None]) -> Callable[[], None]:
    """Run ``fn`` (quick: record the run's end) if the bound forces the exit; returns a function that removes it."""
    _state.on_hard_stop.append(fn)
    return lambda: _state.on_hard_stop.remove(fn) if fn in _state.on_hard_stop else None


@contextmanager
def deferred() -> Iterator[None]:
    """Hold the raise of a stop asked for inside the block until its end (main thread; a few statements only:
    starting a process and keeping its handle, so that the stop path finds it to stop). The deadline runs as ever."""
    _state.deferring += 1
    try:
        yield
    finally:
        _state.deferring -= 1
    if not _state.deferring and (pending := current()) is not None and not _state.raised:
        _state.raised = True
        raise pending


def _on_signal(signum: int, frame: Any) -> None:
    with _state.lock:
        first = _state.cause is None
        if first:
            _state.cause, _state.signalled, _state.code = _NAMES.get(signum, f"signal {signum}"), True, 128 + signum
        hold = _state.deferring > 0 and not _state.raised  # raised at the end of ``deferred()``
        raise_now = not _state.raised
        _state.raised = _state.raised or not hold
    if first:
        _start_deadline(DEADLINE_S)
    if hold:
        return
    if not raise_now:  # a second signal while unwinding: the user wants out now
        hard_stop()
    raise RunStopped(_state.cause or "", signalled=_state.signalled, code=_state.code)


def request(cause: str, code: int = 1) -> None:
    """From any thread: a dependency of the run is gone; stop the run naming ``cause`` (in the main thread)."""
    with _state.lock:
        if _state.cause is not None or not _state.installed:  # a watch that outlived its run: nothing to stop
            return
        _state.cause, _state.signalled, _state.code = cause, False, code
    _start_deadline(DEAD_DEPENDENCY_GRACE_S)
    import _thread

    _thread.interrupt_main(signal.SIGINT)  # our SIGINT handler raises RunStopped with this cause


def _start_deadline(seconds: float) -> None:
    def wait() -> None:
        time.sleep(seconds)
        hard_stop()

    threading.Thread(target=wait, name="arbor-stop-deadline", daemon=True).start()


def report(stopped: RunStopped) -> None:
    """Print the last line once (the CLI's normal path and the bound's forced path share it)."""
    with _state.lock:
        if _state.reported:
            return
        _state.reported = True
    text = _state.line(stopped) if _state.line is not None else f"error: the run stopped: {stopped.cause}"
    sys.stdout.flush()
    print(text, file=sys.stderr, flush=True)


def hard_stop() -> None:
    """Record the run's end, print the last line and leave now, skipping every other cleanup (the bound)."""
    stopped = current() or RunStopped("stopped", signalled=True, code=1)
    for fn in list(_state.on_hard_stop):
        try:
            fn(stopped)
        except Exception:  # noqa: BLE001, S110 - the exit must happen; the status is best effort here
            pass
    report(stopped)
    os._exit(stopped.code)


__all__ = ["RunStopped", "install", "uninstall", "installed", "rearm", "request", "report", "current", "raise_pending",
           "deferred", "on_hard_stop", "set_run", "run_id", "hard_stop"]
