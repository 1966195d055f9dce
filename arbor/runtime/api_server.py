"""Prefect's temporary API server, started by arbor in a session of its own.

Left to Prefect, a flow run without ``PREFECT_API_URL`` starts a temporary server as a child in arbor's process
group: a Ctrl-C or a group-wide SIGTERM killed it together with arbor, and the flow then waited minutes on the dead
API before it could report that it stopped. Here arbor starts the same server (uvicorn over Prefect's app factory,
as Prefect does) with ``start_new_session=True``, points the flow at it, watches it (its death stops the run,
naming it: ``arbor.runtime.stop.request``) and stops it after the run has unwound. A SIGKILL of arbor leaves it to the
watchdog (``arbor.runtime.watchdog``), which stops every process arbor started.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from arbor.runtime import stop
from arbor.runtime.liveness import Watch, watch_process


class ApiServerError(RuntimeError):
    """The temporary server did not come up."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TemporaryApi:
    """One temporary Prefect API server on 127.0.0.1; ``url`` is its API root once ``start()`` returned."""

    def __init__(self, log_path: Path, startup_timeout_s: float = 120.0) -> None:
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._stopping = threading.Event()
        self._watches: list[Watch] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def _spawn(self) -> None:
        """Start the server and keep its handle in ``self.proc`` before a stop can be raised (``stop.deferred``):
        a Ctrl-C that lands while the process starts finds it to stop instead of leaving it behind."""
        import prefect
        from prefect.settings import get_current_settings

        self.port = _free_port()
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
               "PREFECT__SERVER_FINAL": "1", **get_current_settings().to_environment_variables(exclude_unset=True)}
        env.pop("PREFECT_API_URL", None)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log, stop.deferred():
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "--app-dir", str(Path(prefect.__file__).parent.parent), "--factory",
                 "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
                 "--log-level", "error", "--lifespan", "on"],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start(self) -> str:
        """Start the server and wait until ``/health`` answers; returns its API URL. Stopped again if anything
        (a signal included) interrupts the wait."""
        import httpx

        try:
            self._spawn()
            deadline = time.monotonic() + self.startup_timeout_s
            with httpx.Client(timeout=2.0) as client:
                while True:
                    code = self.proc.poll()
                    if code == 3:  # uvicorn could not bind: the port was taken meanwhile
                        self._spawn()
                    elif code is not None:
                        raise ApiServerError(f"Prefect's temporary API server exited with status {code} while "
                                             f"starting (log: {self.log_path})")
                    try:
                        if client.get(f"{self.url}/health").status_code == 200:
                            return self.url
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        raise ApiServerError(f"Prefect's temporary API server did not answer within "
                                             f"{self.startup_timeout_s:.0f} s (log: {self.log_path})")
                    time.sleep(0.1)
        except BaseException:
            self.stop()
            raise

    def watch(self, on_death: Callable[[str], None], every_s: float = 0.5) -> None:
        """Call ``on_death(message)`` from a daemon thread if the server exits before ``stop()``."""
        proc = self.proc
        self._watches.append(watch_process("Prefect's API server", lambda: proc, on_death,
                                           planned=lambda _: self._stopping.is_set(), every_s=every_s))

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the server, SIGKILL it after ``grace_s``."""
        self._stopping.set()
        for w in self._watches:
            w.stop()
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
