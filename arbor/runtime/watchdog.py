"""A watchdog that outlives us to stop what we started (clean exits).

Prefect's temporary API server is a child process of ``arbor train``; a SIGKILL of ``arbor train`` re-parented it
to PID 1, where it ran on for minutes. ``guard()`` starts one small process per CLI run that watches ours through
a pipe: the kernel closes our end when we die, whatever killed us, and the watchdog then sends SIGTERM (SIGKILL
after ``GRACE_S``) to every descendant it saw us have. It looks every ``TICK_S`` seconds, so a child started and
orphaned within one tick can be missed; Prefect's server runs for the life of the flow.

Linux only (``/proc``); elsewhere ``guard()`` does nothing.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

TICK_S = 1.0
GRACE_S = 5.0
_held: list[int] = []  # the write end of the pipe, open for the life of this process


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of ``pid``, or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Every live descendant of ``root``: {pid: start time} (the start time tells a reused pid apart)."""
    parent: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            parent[int(entry)] = st
    found: dict[int, int] = {}
    frontier = [root]
    while frontier:
        p = frontier.pop()
        for pid, (ppid, start) in parent.items():
            if ppid == p and pid not in found:
                found[pid] = start
                frontier.append(pid)
    return found


def stop(seen: dict[int, int], grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM every process of ``seen`` that is still the same process, SIGKILL those alive after ``grace_s``;
    return the pids signalled."""
    alive = [pid for pid, start in seen.items() if _same(pid, start)]
    for pid in alive:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_same(pid, seen[pid]) for pid in alive):
        time.sleep(0.1)
    for pid in alive:
        if _same(pid, seen[pid]):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return alive


def _same(pid: int, start: int) -> bool:
    st = _stat(pid)
    return st is not None and st[1] == start


def watch(parent: int, fd: int) -> None:
    """The watchdog's loop: remember ``parent``'s descendants until the pipe ``fd`` reads EOF, then stop them."""
    seen: dict[int, int] = {}
    me = os.getpid()
    while True:
        ready, _, _ = select.select([fd], [], [], TICK_S)
        if ready and not os.read(fd, 1):  # EOF: the parent is gone
            break
        now = descendants(parent)
        now.pop(me, None)
        seen = {**{p: s for p, s in seen.items() if _same(p, s)}, **now}
    stop(seen)


def guard() -> None:
    """Start the watchdog for this process (once; Linux only)."""
    if _held or not Path("/proc/self/stat").exists():
        return
    read_end, write_end = os.pipe()  # both non-inheritable: no other child keeps our end open
    subprocess.Popen([sys.executable, "-m", "arbor.runtime.watchdog", str(os.getpid()), str(read_end)],
                     pass_fds=(read_end,), start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(read_end)
    _held.append(write_end)


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]))
