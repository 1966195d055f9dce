"""Progress a person can follow: the off-terminal line, its cadence, and log lines routed through
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


def test_on_a_terminal_the_stage_bar_shows_answers_and_goes_when_the_step_ends() -> None:
    """Evaluation reports its answers (not a stale total from the stage before); after the last step no stage bar
    is left on the screen: the final frame is the steps bar alone."""
    screen = Console(file=io.StringIO(), force_terminal=True, width=100)
    with RunProgress(1, console=screen) as p:
        p.stage_started(1, "score")
        p.calls("score", 176, 176)
        p.stage_started(1, "eval")
        [stage] = [t for t in p.progress.tasks if t.id == p.stage_bar]
        assert stage.visible and stage.total is None and stage.completed == 0
        p.groups(2, 4, "answers")
        assert (stage.description, stage.completed, stage.total) == ("step 1: eval (answers)", 2, 4)
        p.step_done()
        assert not stage.visible and [t.completed for t in p.progress.tasks if t.id == p.steps_bar] == [1]
    final = screen.file.getvalue().rsplit("\x1b[2K", 1)[-1]  # what is left on the screen after the last redraw
    assert "steps" in final and "eval" not in final


def test_evaluation_reports_each_answer_to_an_engine_that_takes_it() -> None:
    from arbor.tasks.reporting.evaluate import evaluate_questions

    class Loop:
        protocol = type("P", (), {"name": "arbor"})()

    class Engine:
        loop, guide = Loop(), None

        def generate_groups(self, questions: list, k: int, seed: int, step: int, run_id: str,
                            on_group: object = None) -> list:
            for _ in questions:
                on_group([])  # type: ignore[operator]
            return []

    class Judge:
        async def aclose(self) -> None:
            return None

    answered: list[list] = []
    evaluate_questions(Engine(), Judge(), {"s": ["q1", "q2", "q3"]}, runs=2, seed=0, run_id="r", step=0,
                       checkpoint=None, on_group=answered.append)
    assert len(answered) == 6  # 3 questions x 2 evaluation runs


def test_the_sft_line_times_updates_from_the_first_one_on(capsys) -> None:
    """Off a terminal the SFT line's ETA is the rate since the first update ended: the model load and engine set-up
    before it (26 s in a demo, which made the first ETA 38,757 s) are not an update's time."""
    from arbor.tasks.training.sft import SFTProgress

    p = SFTProgress(2, live=False, every_s=0)
    start = p.t0
    m = {"update": 1, "total": 1500, "epoch": 0, "loss": 9.057}
    p.calls, p.t_first = 1, start + 26.0  # the first update ended 26 s after start-up began
    assert p.line(m, start + 26.0) == "SFT update 1/1500 (epoch 1 of 2): loss 9.057, 26 s"  # no ETA from one
    p.calls = 11  # ten more updates in the next 5 s: 0.5 s each, 1,490 left
    assert p.line({**m, "update": 11}, start + 31.0) == "SFT update 11/1500 (epoch 1 of 2): loss 9.057, 31 s, ETA 12 min"
    q = SFTProgress(2, live=False, every_s=0)
    q({"update": 1, "total": 4, "epoch": 0, "loss": 1.0})
    q({"update": 2, "total": 4, "epoch": 0, "loss": 0.5})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("SFT update 1/4") and "ETA" not in lines[0] and "ETA" in lines[1]


def test_overlapped_stages_report_from_two_threads() -> None:
    """With run.overlap=one-step the next step's rollout starts and reports groups from a task-runner thread while
    this step trains: a stage starting in one thread never leaves the other updating a bar that is gone."""
    import sys

    errors: list[BaseException] = []
    p = RunProgress(2, console=Console(file=io.StringIO(), force_terminal=True, width=100))

    def hammer(stage: str) -> None:
        try:
            for i in range(3000):
                p.stage_started(1, stage)
                p.groups(i % 16, 16)
        except BaseException as e:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(e)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows
    try:
        threads = [threading.Thread(target=hammer, args=(s,)) for s in ("train", "rollout")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors[:1]
    assert len([t for t in p.progress.tasks if t.visible]) == 2  # the steps bar and one stage bar
    q = RunProgress(3, console=_plain(), every_s=0, clock=Clock())
    q.stage_started(1, "train")
    q.stage_started(2, "rollout")  # submitted ahead while step 1 trains
    q.groups(3, 8)
    q.step_done()  # step 1 ends: step 2's rollout goes on showing
    assert q.line() is not None and "step 2/3 · rollout · 3/8 groups" in q.line()
    q.step_done()
    assert q.line() is None
