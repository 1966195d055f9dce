"""Which process owns a run, and is it still alive (``arbor runs``: running vs crashed).

A training flow records its host, pid and the pid's start time in its ``runs`` row and rewrites the row's
``heartbeat_at`` every ``HEARTBEAT_S`` seconds from a daemon thread (written like every stage file: a temporary
name outside the read glob, then ``os.replace``); when the flow ends, however it ends, ``flow_ended_at`` is set.
A SIGKILLed flow stops beating and leaves its pid behind. The decision (``owner_alive``): a flow that ended is not
alive; on this host, the pid must exist, not be a zombie, and have the recorded start time (a reused pid is another
process); on another host, the heartbeat must be younger than ``STALE_AFTER_S``. The SQL view ``run_status``
applies the heartbeat rule to every run, so it also works from another machine; ``arbor runs`` refines it here with
the pid check, which needs no waiting. Only the owning flow writes its ``runs`` row while it runs (the CLI refuses
to resume a live run), so the heartbeat's rewrite of that row races with nobody.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from arbor.storage.parquet import write_stage
from arbor.storage.runs import run_row

HEARTBEAT_S = 10.0
STALE_AFTER_S = 120.0  # keep in step with sql/views/run_status.sql


def host_name() -> str:
    return socket.gethostname()


def pid_start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22); None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # fields after "(comm)": state is 3rd overall, starttime 22nd


def _pid_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int, start: str | None = None) -> bool:
    """Is ``pid`` a live (non-zombie) process of this host, and the same one that recorded ``start``?"""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    if _pid_state(pid) in ("Z", "X"):
        return False
    return start is None or pid_start_time(pid) in (None, start)


def owner_alive(owner: dict[str, Any], *, now: float | None = None, this_host: str | None = None) -> bool:
    """The liveness decision for a ``runs`` row's owner columns (module docstring)."""
    if owner.get("flow_ended_at") is not None:
        return False
    if owner.get("host") == (this_host or host_name()) and owner.get("pid") is not None:
        return pid_alive(int(owner["pid"]), owner.get("pid_start"))
    beat = owner.get("heartbeat_at")
    if beat is None:
        return False
    at = beat.timestamp() if isinstance(beat, datetime) else float(beat)
    return (time.time() if now is None else now) - at <= STALE_AFTER_S


def read_owner(run_id: str, home: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """The owner columns of a run (host, pid, pid_start, heartbeat_at, flow_ended_at); None when it has none."""
    row = run_row(run_id, home)
    if row is None or row.get("pid") is None:
        return None
    return {k: row.get(k) for k in ("host", "pid", "pid_start", "heartbeat_at", "flow_ended_at")}


class Heartbeat:
    """Record this process as the owner of ``run_id`` (its ``runs`` row must exist) and keep its heartbeat fresh
    until ``stop()``."""

    def __init__(self, run_id: str, home: str | os.PathLike[str], interval_s: float = HEARTBEAT_S) -> None:
        row = run_row(run_id, home)
        if row is None:
            raise ValueError(f"no run '{run_id}' to own")
        self.run_id, self.home, self.interval_s = run_id, home, interval_s
        self.row = {**row, "host": host_name(), "pid": os.getpid(), "pid_start": pid_start_time(os.getpid())}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"arbor-heartbeat-{run_id}", daemon=True)

    def beat(self, ended: bool = False) -> None:
        now = datetime.now(UTC)
        write_stage("runs", [{**self.row, "heartbeat_at": now, "flow_ended_at": now if ended else None}],
                    run_id=self.run_id, step=0, stage="run", home=self.home)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except OSError:  # a full or briefly unavailable disk must not kill the run; the next beat retries
                pass

    def start(self) -> Heartbeat:
        self.beat()  # synchronously: the run is owned before any work starts
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating and record that the flow ended (its process may live on, e.g. a test or a worker)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.beat(ended=True)

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_status_table(home: str | os.PathLike[str] | None = None) -> Any:
    """The ``run_status`` view, each unfinished run's status decided by ``owner_alive`` (an Arrow table)."""
    import pyarrow as pa

    from arbor.storage.sql import query, sql_file

    tbl = query(sql_file("run_statuses"), home=home)
    statuses = tbl.column("status").to_pylist()
    for i, (rid, status) in enumerate(zip(tbl.column("run_id").to_pylist(), statuses, strict=True)):
        if status in ("running", "crashed"):
            owner = read_owner(rid, home)
            if owner is not None:
                statuses[i] = "running" if owner_alive(owner) else "crashed"
    idx = tbl.column_names.index("status")
    return tbl.set_column(idx, "status", pa.array(statuses, pa.string()))
