"""Liveness of the servers a run relies on: one watch loop, ``Watch``, for all of them.

A server arbor starts is watched through its process (``watch_process``: ``arbor.runtime.api_server``,
``tasks.env.serving.Supervised``): its exit is seen at once and named with its pid and status, unless its owner
says the exit was planned (its own stop, a restart). A server someone else started — Prefect's API behind
``PREFECT_API_URL``, a judge served by ``arbor judge serve`` in another terminal, a vLLM server at
``rollout.base_url`` — can only be watched through its port: ``watch_endpoint`` opens a TCP connection to it every
``every_s`` seconds (nothing is sent: no request, no credentials), and once every attempt has failed for
``dead_after_s`` seconds the server is taken for gone and ``on_death`` is called with one phrase naming it. A
server that accepts connections but never answers is not detected here: each client bounds it with a progress
deadline (``DependencyStalled``: no byte for ``*.stall_s`` seconds).

A URL is shown without its user and password (a secret never reaches a log line).
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

DEAD_AFTER_S = float(os.environ.get("ARBOR_DEPENDENCY_DEAD_AFTER_S", "2"))  # a server down this long is gone
EVERY_S = 0.25


def shown(url: str) -> str:
    """``url`` as it may be printed: scheme, host, port and path, without user, password, query or fragment."""
    u = urlsplit(url)
    host = u.hostname or ""
    if ":" in host:  # IPv6
        host = f"[{host}]"
    port = f":{u.port}" if u.port else ""
    return f"{u.scheme}://{host}{port}{u.path}"


def address(url: str) -> tuple[str, int]:
    """The host and port a URL's server listens on (the scheme's default port when none is given)."""
    u = urlsplit(url)
    return u.hostname or "127.0.0.1", u.port or (443 if u.scheme == "https" else 80)


def is_local(url: str) -> bool:
    """Whether ``url``'s server runs on this machine (a loopback address or ``localhost``)."""
    host = urlsplit(url).hostname or ""
    return host == "localhost" or host.startswith("127.") or host == "::1"


def reachable(host: str, port: int, timeout_s: float = 1.0) -> str | None:
    """None when a TCP connection to (host, port) opens; else why not, in words."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except ConnectionRefusedError:
        return "connection refused"
    except TimeoutError:
        return f"no answer within {timeout_s:.0f} s"
    except OSError as e:
        return e.strerror or type(e).__name__


class DependencyStalled(RuntimeError):
    """A server that took a request and then sent no byte for ``stall_s`` seconds: the request is not
    retried (a wedged server would wedge the retry too) and the run ends naming the server, resumable.

    The deadline is httpx's read timeout (``transport_timeout``): httpcore wraps every receive on the socket in its
    own ``anyio.fail_after(read)`` (httpcore 1.0.9 ``_backends/anyio.py`` ``AnyIOStream.read``; ``_async/http11.py``
    ``_receive_event`` reads the status line, the headers and each body chunk that way), so it is exactly "no byte
    for N s", streaming or not, and a reply that keeps trickling never trips it. The openai client (3.54) rides
    httpx2 / httpcore2 2.16, forks with the same read path (``httpcore2/_backends/anyio.py``), and raises
    ``APITimeoutError`` from their ``ReadTimeout``. A non-streaming completion sends
    nothing until its last token, which is why each role's default is sized to its output budget."""

    def __init__(self, name: str, url: str, stall_s: float) -> None:
        self.name, self.url, self.stall_s = name, shown(url), stall_s
        super().__init__(f"{name} at {self.url} stalled: no bytes for {stall_s:g} s")


_READ_TIMEOUTS = {"httpx", "httpx2", "httpcore", "httpcore2"}  # the packages whose ReadTimeout is a stall


def is_stall(err: BaseException | None) -> bool:
    """Whether ``err`` is a ReadTimeout of httpx or httpx2 (or their httpcore) or was raised from one (the openai
    client wraps it in ``APITimeoutError``)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if type(err).__name__ == "ReadTimeout" and type(err).__module__.split(".")[0] in _READ_TIMEOUTS:
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


def transport_timeout(timeout_s: float, stall_s: float) -> object:
    """httpx's timeouts of a client: ``timeout_s`` to connect, write and wait for a pooled connection, ``stall_s``
    without a byte received (``DependencyStalled``)."""
    import httpx

    return httpx.Timeout(timeout_s, read=stall_s)


class Watch:
    """A daemon thread that asks ``check()`` every ``every_s`` seconds and calls ``on_death(phrase)`` once, with the
    first phrase ``check`` returns, unless ``stop()`` came first; ``check`` returns None while all is well."""

    def __init__(self, name: str, check: Callable[[], str | None], on_death: Callable[[str], None], *,
                 every_s: float = EVERY_S) -> None:
        self.name, self.check, self.on_death, self.every_s = name, check, on_death, every_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"arbor-watch-{name}", daemon=True)

    def start(self) -> Watch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()

    def _loop(self) -> None:
        while not self._stopping.wait(self.every_s):
            if (phrase := self.check()) is not None and not self._stopping.is_set():
                self.on_death(phrase)
                return


def watch_process(name: str, current: Callable[[], subprocess.Popen[bytes] | None],
                  on_death: Callable[[str], None], *, planned: Callable[[subprocess.Popen[bytes]], bool],
                  every_s: float = EVERY_S) -> Watch:
    """Start a ``Watch`` of the process ``current()`` returns at each look (a restart may replace it): its exit is
    reported as "``name`` (pid N) exited with status S" unless ``planned(proc)``, asked after the exit was seen,
    says it was planned (the owner marks a process before stopping it)."""

    def check() -> str | None:
        proc = current()
        if proc is None or (code := proc.poll()) is None or planned(proc):
            return None
        return f"{name} (pid {proc.pid}) exited with status {code}"

    return Watch(name, check, on_death, every_s=every_s).start()


def watch_endpoint(name: str, url: str, on_death: Callable[[str], None], *, every_s: float = EVERY_S,
                   dead_after_s: float = DEAD_AFTER_S) -> Watch:
    """Start a ``Watch`` of ``url``'s port: its server is dead once it refused connections for ``dead_after_s``
    seconds (see the module's docstring)."""
    down_since: float | None = None

    def check() -> str | None:
        nonlocal down_since
        why = reachable(*address(url), timeout_s=min(1.0, dead_after_s))
        if why is None:
            down_since = None
            return None
        now = time.monotonic()
        down_since = now if down_since is None else down_since
        if now - down_since < dead_after_s:
            return None
        return f"{name} at {shown(url)} stopped accepting connections ({why} for {now - down_since:.0f} s)"

    return Watch(name, check, on_death, every_s=every_s).start()


__all__ = ["DependencyStalled", "is_stall", "transport_timeout", "Watch", "watch_process", "watch_endpoint", "shown", "address", "is_local", "reachable", "DEAD_AFTER_S"]
