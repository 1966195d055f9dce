"""A run's life under a command: the servers it relies on watched (a death ends it naming the server), its end
recorded as ``completed``, ``stopped`` or ``failed``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from arbor.config import ArborConfig
from arbor.storage.heartbeat import Heartbeat
from arbor.tasks.stage_store import StageStore


def dependency_endpoints(cfg: ArborConfig, *, council: bool = False,
                         rollout_served: bool = False) -> list[tuple[str, str]]:
    """(name, URL) of every server the run talks to and did not start, each URL once under the
    first name that claims it: the judge (``judge.base_url``), every role with an endpoint of its own
    (``judge.roles.<role>.base_url``), with ``council`` Co-ReAct's ranking judges (``guidance.rank_judges``), the
    search service (``search.url``), the rollout server (unless the flow serves it: ``rollout_served``). A judge
    left at the client's default endpoint (no base_url) is the vendor's, left to the client."""
    from arbor.config.judge import JudgeRoles

    out: dict[str, str] = {}

    def add(name: str, url: object) -> None:
        if url and str(url) not in out:
            out[str(url)] = name

    j = cfg.judge
    if j.backend == "openai":
        add("the judge server", j.base_url)
        for role in JudgeRoles.model_fields:
            add(f"the judge of role {role!r}", getattr(j.roles, role).base_url)
        if council:
            from arbor.tasks.methods.coreact.council import rank_judge_config, rank_judge_names

            for name, entry in zip(rank_judge_names(cfg.guidance, j), cfg.guidance.rank_judges, strict=True):
                add(f"the ranking judge {name!r}", rank_judge_config(j, entry).for_role("rank_actions")["base_url"])
    if cfg.search.backend in ("http", "web"):
        add("the search server", cfg.search.url)
    if cfg.rollout.engine == "openai" and not rollout_served:
        add("the rollout server", cfg.rollout.base_url)
    return [(name, url) for url, name in out.items()]


def watch_dependencies(cfg: ArborConfig, servers: list[Any], *, council: bool = False,
                       on_death: Callable[[str], None] | None = None) -> list[Any]:
    """Under a command on the stop path, a server the run relies on that dies ends the run naming it:
    the `vllm serve` the flow started, by its process; every other endpoint (``dependency_endpoints``) by its
    port (``arbor.runtime.liveness``), one on another machine asked less often and given longer (a network blip is not a
    dead server). ``on_death``: what a death calls (default: ``stop.request``, only when the stop path is
    installed). Returns the port watches (stopped with the run's servers)."""
    from arbor.runtime import stop

    if on_death is None:
        if not stop.installed():
            return []
        on_death = stop.request
    from arbor.runtime.liveness import DEAD_AFTER_S, is_local, watch_endpoint

    for server in servers:
        server.watch("vLLM's server", on_death)
    slow = {"every_s": 1.0, "dead_after_s": 5 * DEAD_AFTER_S}
    return [watch_endpoint(name, url, on_death, **({} if is_local(url) else slow))
            for name, url in dependency_endpoints(cfg, council=council, rollout_served=bool(servers))]


def end_status(e: BaseException) -> str:
    """How a run that raised ``e`` ended: ``stopped`` when it was asked to stop (a signal), else ``failed`` (a
    dependency found dead included)."""
    from prefect.exceptions import TerminationSignal

    from arbor.runtime.stop import RunStopped

    if isinstance(e, RunStopped):
        return "stopped" if e.signalled else "failed"
    return "stopped" if isinstance(e, KeyboardInterrupt | TerminationSignal) else "failed"


@contextmanager
def recorded_run(cfg: ArborConfig, rid: str, home: Path, *, council: bool = False,
                 watch: bool = True) -> Iterator[StageStore]:
    """The life of a run (``arbor train``, ``arbor eval``, ``arbor guidance-train``): ``running``, then
    ``completed``, ``stopped`` (a signal) or ``failed`` in its ``stage_runs`` row, also when the stop's bound forces
    the exit; owned by this process (its heartbeat); with ``watch`` its endpoints watched (``watch_dependencies``;
    a training run watches them with the servers it starts, ``open_run``). Its ``runs`` row must exist."""
    from arbor.runtime import stop

    store = StageStore(rid, home)
    started = time.time()
    store.record(0, "run", "running", started, None)
    forget = stop.on_hard_stop(lambda s: store.record(0, "run", end_status(s), started, time.time()))
    heartbeat = Heartbeat(rid, home).start()
    watches = watch_dependencies(cfg, [], council=council) if watch else []
    try:
        yield store
    except BaseException as e:
        store.record(0, "run", end_status(e), started, time.time())
        raise
    finally:
        forget()
        heartbeat.stop()
        for w in watches:
            w.stop()
    store.record(0, "run", "completed", started, time.time())
