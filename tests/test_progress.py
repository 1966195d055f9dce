"""Progress a person can follow (issue 34 item 7): the off-terminal line, its cadence, and log lines routed through
the live display on a terminal."""

from __future__ import annotations

import io
import logging
import threading

from rich.console import Console

from arbor.flows.progress import RunProgress, duration


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _plain() -> Console:
    return Console(file=io.StringIO(), force_terminal=False)


def test_the_line_says_where_the_run_is_and_when_it_ends() -> None:
    clock = Clock()
    p = RunProgress(5, console=_plain(), every_s=0, clock=clock)
    assert p.line() is None  # nothing runs yet
    p.stage_started(0, "eval")  # the start's evaluation is no part of step 1's time
    clock.t += 120
    p.stage_started(1, "rollout")
    clock.t += 6
    p.groups(3, 8)
    assert p.line() == "[arbor] step 1/5 · rollout · 3/8 groups · 6 s · ETA 10 s"  # 6 s for 3: 2 s a group
    clock.t += 14
    p.step_done()  # step 1 took 20 s
    assert p.line() is None  # between stages: silent
    p.stage_started(2, "score")
    clock.t += 5
    p.calls("score", 0, 40)
    # no ETA before the first call ends; the run: 4 steps left at 20 s, 5 s of this one spent
    assert p.line() == "[arbor] step 2/5 · score · 0/40 judge calls · 5 s · run ETA 75 s"
    assert [duration(s) for s in (42, 95, 3900)] == ["42 s", "2 min", "1 h 05 min"]


def test_off_a_terminal_a_line_comes_at_a_steady_cadence() -> None:
    lines: list[str] = []
    two = threading.Event()

    class Sink(io.StringIO):
        def write(self, text: str) -> int:
            if text.strip():
                lines.append(text.strip())
                if len(lines) >= 2:
                    two.set()
            return len(text)

    with RunProgress(3, console=_plain(), every_s=0.01, stream=Sink()) as p:
        p.stage_started(1, "induce")
        p.calls("induce", 1, 4)
        assert two.wait(timeout=30), lines
    assert lines[0].startswith("[arbor] step 1/3 · induce · 1/4 judge calls")


def test_on_a_terminal_log_lines_go_through_the_live_display() -> None:
    """Prefect's console handler prints with its own rich Console: while the bars show, it prints through ours (so
    a log line lands above the bars, not inside them), and gets its own back afterwards."""

    class RichHandler(logging.Handler):
        def __init__(self, console: Console) -> None:
            super().__init__()
            self.console = console

        def emit(self, record: logging.LogRecord) -> None:
            self.console.print(record.getMessage())

    own = Console(file=io.StringIO())
    handler = RichHandler(own)
    log = logging.getLogger("arbor-test-progress")
    log.addHandler(handler)
    try:
        screen = Console(file=io.StringIO(), force_terminal=True, width=100)
        with RunProgress(2, console=screen) as p:
            assert p.live and handler.console is screen
            log.warning("a judge call was retried")
        assert handler.console is own
        assert "a judge call was retried" in screen.file.getvalue() and not own.file.getvalue()
    finally:
        log.removeHandler(handler)
