"""Every endpoint a run depends on is watched — the judge's, each role's own, Co-ReAct's ranking
council, the search service, the rollout server — and a dead one is named without its credentials."""

from __future__ import annotations

import socket
import time

from arbor.config import load_config
from arbor.flows.run_life import dependency_endpoints, watch_dependencies


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_endpoint_is_listed_once() -> None:
    cfg = load_config("tiny-cpu", {
        "judge.backend": "openai", "judge.base_url": "http://127.0.0.1:8001/v1",
        "judge.roles.pairwise.base_url": "http://127.0.0.1:8002/v1",
        "judge.roles.induction.base_url": "http://127.0.0.1:8001/v1",  # the judge's own: listed once
        "guidance.rank_judges": [{"name": "a", "model": "m", "base_url": "http://127.0.0.1:8003/v1"},
                                 {"name": "b", "model": "m"},  # inherits rank_actions' endpoint: the judge's
                                 {"name": "c", "model": "m", "base_url": "https://judge.example.com/v1"}],
        "search.backend": "http", "search.url": "http://127.0.0.1:8004",
        "rollout.engine": "openai", "rollout.base_url": "http://127.0.0.1:8005/v1"})
    assert dependency_endpoints(cfg, council=True) == [
        ("the judge server", "http://127.0.0.1:8001/v1"),
        ("the judge of role 'pairwise'", "http://127.0.0.1:8002/v1"),
        ("the ranking judge 'a'", "http://127.0.0.1:8003/v1"),
        ("the ranking judge 'c'", "https://judge.example.com/v1"),
        ("the search server", "http://127.0.0.1:8004"),
        ("the rollout server", "http://127.0.0.1:8005/v1")]
    # arbor train asks no council; a rollout server the flow serves is watched through its process instead
    assert [n for n, _ in dependency_endpoints(cfg, rollout_served=True)] == [
        "the judge server", "the judge of role 'pairwise'", "the search server"]
    offline = load_config("tiny-cpu", {})  # rules judge, BM25, in-process rollouts: nothing to watch
    assert dependency_endpoints(offline, council=True) == []


def test_a_dead_role_endpoint_is_named() -> None:
    """Earlier only judge.base_url (and only on this machine) was watched: a role's own endpoint never."""
    live = socket.create_server(("127.0.0.1", 0))  # the judge-wide endpoint answers
    dead = _closed_port()
    cfg = load_config("tiny-cpu", {
        "judge.backend": "openai", "judge.base_url": f"http://127.0.0.1:{live.getsockname()[1]}/v1",
        "judge.roles.rar_rate.base_url": f"http://127.0.0.1:{dead}/v1"})
    deaths: list[str] = []
    watches = watch_dependencies(cfg, [], on_death=deaths.append)
    try:
        deadline = time.monotonic() + 30
        while not deaths and time.monotonic() < deadline:  # waits on the watch's report, not a fixed time
            time.sleep(0.05)
    finally:
        for w in watches:
            w.stop()
        live.close()
    assert len(watches) == 2
    assert deaths == [f"the judge of role 'rar_rate' at http://127.0.0.1:{dead}/v1 stopped accepting connections "
                      "(connection refused for 2 s)"]
