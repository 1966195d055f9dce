"""The one stop path of the commands that run flows: signals and dead dependencies end a run in
seconds with one line; Prefect's temporary API is started in a session of its own, an external one is watched."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from arbor.cli.common import _me

_T = TypeVar("_T")


def _on_stop_path(line: Callable[[Any], str], home: Path, body: Callable[[], _T]) -> _T:
    """Run ``body`` (a command's flows) on the one stop path: SIGINT and SIGTERM, to the process or its
    group, and a dependency found dead end it in seconds with the one line ``line`` renders (exit 130 / 143 / 1);
    Prefect's temporary API is started here in a session of its own, an external one is watched. Any other
    exception is the caller's to report."""
    from arbor.runtime import stop

    previous = stop.install(line)  # from here on, one stop path
    api, watches = None, []
    try:
        api, watches = _prefect_api(home)  # a group signal cannot take the API from the run
        if api is not None:  # held here before it starts: a stop from now on stops it
            _start_own_api(api)
        from arbor.runtime.quiet import quiet

        quiet()  # again, now that Prefect's log handlers exist
        with _api_settings(api):
            return body()
    except stop.RunStopped as s:
        if api is not None:
            api.stop()
        stop.report(s)
        os._exit(s.code)  # the run is recorded and unwound: nothing left to wait for (Prefect's log flush)
    finally:
        stop.uninstall(previous)
        for w in watches:
            w.stop()


def _prefect_api(home: Path) -> tuple[Any, list[Any]]:
    """Prefect's temporary API server, not started yet, when no API is configured (``PREFECT_API_URL``:
    ``_start_own_api`` starts it); an API configured elsewhere is watched through its port
    (``arbor.runtime.liveness``: gone for a bounded time, the run stops naming it). Returns (the temporary server or
    None, the port watches)."""
    from prefect.settings import get_current_settings

    from arbor.runtime import stop

    if url := get_current_settings().api.url:
        from arbor.runtime.liveness import DEAD_AFTER_S, is_local, watch_endpoint

        # a remote API (Prefect Cloud, a shared server) is asked less often and given longer: a network blip is
        # not a dead server
        slow = {} if is_local(url) else {"every_s": 1.0, "dead_after_s": 5 * DEAD_AFTER_S}
        return None, [watch_endpoint("Prefect's API", url, stop.request, **slow)]
    from arbor.runtime.api_server import TemporaryApi

    return TemporaryApi(home / "logs" / "prefect-api.log",
                        float(os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"])), []


def _start_own_api(api: Any) -> None:
    """Start the temporary server in its own session, watched (its death stops the run naming it) and stopped
    when this process exits, however it exits (the stop path's ``os._exit`` skips ``atexit``: it stops it itself)."""
    import atexit

    from arbor.runtime import stop

    atexit.register(api.stop)  # registered before Prefect's own exit handlers, so it runs after them
    stop.on_hard_stop(lambda _s: api.stop(grace_s=1.0))
    os.environ["PREFECT_API_URL"] = api.start()  # for processes the run starts
    api.watch(stop.request)


def _api_settings(api: Any) -> Any:
    """Prefect's settings pointing at ``api`` (its settings were read when Prefect was imported)."""
    from contextlib import nullcontext

    if api is None:
        return nullcontext()
    from prefect.settings import PREFECT_API_URL, temporary_settings

    return temporary_settings(updates={PREFECT_API_URL: api.url})


def _why(s: Any) -> tuple[str, str]:
    """(the line's head, why it stopped) for a stop ``s``: asked (a signal) or a dependency found dead."""
    return ("stopped", f"by {s.cause}") if s.signalled else ("error", f"because {s.cause}")


def _stop_line(s: Any, name: str | None, home: Path, resume: Callable[[str], str] | None = None) -> str:
    """The last line of a stopped run: what stopped it and how to go on (``resume``: the command that continues
    run RID; default ``arbor train --resume RID``)."""
    from arbor.runtime import stop
    from arbor.storage.runs import run_row

    rid = name or stop.run_id()
    head, why = _why(s)
    try:
        stored = rid is not None and run_row(rid, home) is not None
    except Exception:  # noqa: BLE001 - the line must come out whatever the store says
        stored = rid is not None
    if not stored:
        return (f"{head}: the run stopped {why} before it stored anything; start it again with the same command")
    how = resume(rid) if resume is not None else f"{_me()} train --resume {rid}"
    return f"{head}: run {rid} stopped {why}; what was stored is kept: resume it with `{how}`"


def _cause(e: BaseException) -> str:
    """One line on why a run stopped: the environment's failures in words, anything else as
    its type and first line."""
    import errno

    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the disk is full ({e.strerror}: {e.filename})"
    if isinstance(e, OSError) and e.errno == errno.EROFS:
        return f"the workspace is on a read-only file system ({e.strerror}: {e.filename})"
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__
