"""CPU seconds per test, for CI-time work: ``PYTHONPATH=tests pytest -p cpu_usage`` with
``ARBOR_TEST_CPU_LOG=<folder>`` writes one tab-separated line per test phase (nodeid, phase, start (epoch s), wall s, CPU s) to
``<folder>/<worker>.tsv``.

The CPU count is the worker's own time, its reaped children's and every live descendant's (their own and their
reaped children's), read before and after each phase: the work a test makes the machine do, servers and
subprocesses included, which wall time on a shared two-core machine hides. A module fixture's server is counted
where it starts and while the tests that use it run."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest


def tree_cpu_s() -> float:
    """User + system seconds of this process, its reaped children and every live descendant."""
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:  # ended between the listing and the read
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def _log() -> Path | None:
    folder = os.environ.get("ARBOR_TEST_CPU_LOG")
    if not folder:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Path(folder) / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.tsv"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _measure(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _measure(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield from _measure(item, "teardown")


def _measure(item: pytest.Item, phase: str) -> Iterator[None]:
    log = _log()
    if log is None:
        yield
        return
    start, t0, c0 = time.time(), time.monotonic(), tree_cpu_s()
    yield
    wall, cpu = time.monotonic() - t0, tree_cpu_s() - c0
    with open(log, "a") as f:
        f.write(f"{item.nodeid}\t{phase}\t{start:.1f}\t{wall:.2f}\t{cpu:.2f}\n")
