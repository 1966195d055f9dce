"""One writer per run: an OS lock on ``{home}/locks/<run_id>.lock`` held while a process writes a
run. ``flock`` locks belong to the open file, so the kernel releases them when the holder dies, even by SIGKILL: a
lock is never stale. Re-entrant within a process (the CLI takes it before its checks, the flow again around the run).
The last hold removes the file (and the folders its first hold made, when empty): a refused command leaves nothing
behind. A taker checks that the file it locked is still the one at the path, so a file removed under it is not a
second lock."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_HELD: dict[str, tuple[int, int, list[Path]]] = {}  # lock path -> (fd, depth, folders its first hold made)
_GUARD = threading.Lock()


class RunLocked(RuntimeError):
    """Another process is writing this run."""


def lock_path(run_id: str, home: str | os.PathLike[str]) -> Path:
    return Path(home) / "locks" / f"{run_id}.lock"


def _is_at(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is the file at ``path`` (a releasing holder may have removed it since)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def acquire(run_id: str, home: str | os.PathLike[str]) -> None:
    """Take the run's lock (again, if this process holds it); RunLocked naming the holder's pid otherwise."""
    path = lock_path(run_id, home)
    key = str(path.resolve())
    with _GUARD:
        if key in _HELD:
            fd, depth, made = _HELD[key]
            _HELD[key] = (fd, depth + 1, made)
            return
        while True:
            made: list[Path] = []
            d = path.parent
            while not d.exists():
                made.append(d)
                d = d.parent
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:  # a releasing holder removed the folder in between: make it again
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise RunLocked(f"run '{run_id}' is still running: another process writes it (pid {holder}; "
                                f"{path}); wait for it to end or stop it") from None
            if _is_at(fd, path):
                break
            os.close(fd)  # locked a file its holder removed on release: take the one at the path now
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _HELD[key] = (fd, 1, made)


def release(run_id: str, home: str | os.PathLike[str]) -> None:
    """Give back one hold of the run's lock; the last one removes the file and unlocks it."""
    path = lock_path(run_id, home)
    key = str(path.resolve())
    with _GUARD:
        fd, depth, made = _HELD.get(key, (-1, 0, []))
        if depth > 1:
            _HELD[key] = (fd, depth - 1, made)
        elif depth == 1:
            del _HELD[key]
            with contextlib.suppress(FileNotFoundError):
                os.unlink(key)  # still locked: a taker that opened it finds it gone and takes the path's new file
            for d in made:  # deepest first; one that holds anything now stays
                try:
                    d.rmdir()
                except OSError:
                    break
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
