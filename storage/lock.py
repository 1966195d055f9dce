"""One writer per run (issue 35 item 3): an OS lock on ``{home}/locks/<run_id>.lock`` held while a process writes a
run. ``flock`` locks belong to the open file, so the kernel releases them when the holder dies, even by SIGKILL: a
lock is never stale. Re-entrant within a process (the CLI takes it before its checks, the flow again around the run)."""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_HELD: dict[str, tuple[int, int]] = {}  # lock path -> (fd, depth)
_GUARD = threading.Lock()


class RunLocked(RuntimeError):
    """Another process is writing this run."""


def lock_path(run_id: str, home: str | os.PathLike[str]) -> Path:
    return Path(home) / "locks" / f"{run_id}.lock"


def acquire(run_id: str, home: str | os.PathLike[str]) -> None:
    """Take the run's lock (again, if this process holds it); RunLocked naming the holder's pid otherwise."""
    path = lock_path(run_id, home)
    key = str(path.resolve())
    with _GUARD:
        if key in _HELD:
            fd, depth = _HELD[key]
            _HELD[key] = (fd, depth + 1)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise RunLocked(f"run '{run_id}' is still running: another process writes it (pid {holder}; {path}); "
                            "wait for it to end or stop it") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _HELD[key] = (fd, 1)


def release(run_id: str, home: str | os.PathLike[str]) -> None:
    """Give back one hold of the run's lock; the last one unlocks it."""
    key = str(lock_path(run_id, home).resolve())
    with _GUARD:
        fd, depth = _HELD.get(key, (-1, 0))
        if depth > 1:
            _HELD[key] = (fd, depth - 1)
        elif depth == 1:
            del _HELD[key]
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


@contextmanager
def run_lock(run_id: str, home: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the run's lock for the block."""
    acquire(run_id, home)
    try:
        yield
    finally:
        release(run_id, home)
