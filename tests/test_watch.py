"""The one watch loop (``arbor.runtime.liveness.Watch``) on real processes: a death is reported once, with its pid
and status; a planned one (the owner's stop, a restart) and one after ``stop()`` are not."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from arbor.runtime.liveness import watch_process

EVERY_S = 0.02


def _child() -> subprocess.Popen[bytes]:
    """A process that runs until its stdin closes, then exits with status 0."""
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)


def _until(cond: Callable[[], bool], within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


@pytest.fixture
def children():
    made: list[subprocess.Popen[bytes]] = []

    def make() -> subprocess.Popen[bytes]:
        made.append(_child())
        return made[-1]

    yield make
    for p in made:
        p.kill()
        p.wait()


def test_a_death_is_reported_once_and_ends_the_watch(children) -> None:
    proc = children()
    deaths: list[str] = []
    looks = [0]

    def current() -> subprocess.Popen[bytes]:
        looks[0] += 1
        return proc

    w = watch_process("the server", current, deaths.append, planned=lambda _: False, every_s=EVERY_S)
    assert _until(lambda: looks[0] >= 3)  # alive for three looks: nothing said
    assert deaths == []
    assert proc.stdin is not None
    proc.stdin.close()
    assert _until(lambda: bool(deaths))
    w._thread.join(10.0)
    assert not w._thread.is_alive()  # no second look, so no second report
    assert deaths == [f"the server (pid {proc.pid}) exited with status 0"]


def test_a_planned_death_is_not_reported_and_the_next_process_is_watched(children) -> None:
    """The owner marks a process before stopping it; the watch is asked about it only after seeing it dead, says
    nothing, and goes on to the process that replaced it, whose unplanned death it reports."""
    first, deaths, asked = children(), [], []
    retired: list[subprocess.Popen[bytes]] = []
    box = [first]

    def planned(p: subprocess.Popen[bytes]) -> bool:
        asked.append(p)
        assert p.poll() is not None  # asked only about a process seen dead
        return p in retired

    w = watch_process("vLLM's server", lambda: box[0], deaths.append, planned=planned, every_s=EVERY_S)
    retired.append(first)
    first.kill()
    assert _until(lambda: asked.count(first) >= 2)  # seen dead twice, planned both times
    assert deaths == []
    box[0] = second = children()
    second.kill()
    assert _until(lambda: bool(deaths))
    w._thread.join(10.0)
    assert deaths == [f"vLLM's server (pid {second.pid}) exited with status -9"]


def test_nothing_is_reported_after_stop(children) -> None:
    proc = children()
    deaths: list[str] = []
    w = watch_process("x", lambda: proc, deaths.append, planned=lambda _: False, every_s=EVERY_S)
    w.stop()
    proc.kill()
    proc.wait()
    w._thread.join(10.0)
    assert not w._thread.is_alive() and deaths == []
