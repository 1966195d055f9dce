"""The quiet default: library noise is dropped at its source, arbor's own lines are kept, and
``--verbose`` (ARBOR_VERBOSE=1) brings everything back, in this process and the ones it starts."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

import pytest

from arbor.runtime.quiet import NOISE, NoiseFilter, quiet

NOISY_ENV = ("HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY", "TRANSFORMERS_NO_ADVISORY_WARNINGS",
             "PYTHONWARNINGS", "ARBOR_VERBOSE")


def _record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("prefect.flow_runs", logging.INFO, __file__, 1, msg, None, None)


def test_the_filter_drops_library_notices_and_keeps_arbors_lines() -> None:
    f = NoiseFilter()
    assert not f.filter(_record("DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully"))
    assert not f.filter(_record("Starting temporary server on http://127.0.0.1:8742"))
    assert not f.filter(_record("Stopping temporary server on http://127.0.0.1:8577"))
    assert not f.filter(_record("See https://docs.prefect.io/v3/concepts/server#how-to-guides for more"))
    assert not f.filter(_record("Created temporary directory '/tmp/x' for ephemeral docs site"))
    assert not f.filter(_record("Finished in state Completed()"))  # a task run's; the step summary says it
    assert f.filter(_record("Finished in state Failed('Task run encountered an exception ValueError')"))
    assert f.filter(_record("Task run failed with exception: TimeoutError() - Retry 1/1 will start 2 second(s) "
                            "from now"))
    assert f.filter(_record("SFT update 224/2240 (epoch 1 of 2): loss 0.817, 74 s"))
    assert f.filter(_record("judge call failed after 3 attempts: rate limited"))
    assert NOISE.pattern  # one pattern, visible in one place


def test_quiet_sets_the_libraries_own_switches_for_this_process_and_its_children(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in NOISY_ENV:
        monkeypatch.delenv(name, raising=False)
    handler = logging.StreamHandler()
    logging.getLogger("arbor-test-quiet").addHandler(handler)
    with warnings.catch_warnings():
        quiet()
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
        assert os.environ["TRANSFORMERS_VERBOSITY"] == "error"
        assert "ignore::FutureWarning" in os.environ["PYTHONWARNINGS"]
        assert logging.getLogger("bm25s").getEffectiveLevel() == logging.WARNING
        assert any(isinstance(f, NoiseFilter) for f in handler.filters)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("default")
            quiet()  # idempotent, and re-applies its filters
            warnings.warn("old API", FutureWarning, stacklevel=1)
        assert not seen
    logging.getLogger("arbor-test-quiet").removeHandler(handler)
    # a child process of a quiet run is quiet too; ARBOR_VERBOSE=1 there turns it all off
    code = "import warnings; warnings.warn('x', FutureWarning); print('done')"
    quiet_child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert quiet_child.stdout.strip() == "done" and "FutureWarning" not in quiet_child.stderr


def test_verbose_turns_it_off(monkeypatch: pytest.MonkeyPatch, arbor_home: object) -> None:
    for name in NOISY_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ARBOR_VERBOSE", "1")
    quiet()
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ and "PYTHONWARNINGS" not in os.environ
    from typer.testing import CliRunner

    from arbor.cli import app

    monkeypatch.delenv("ARBOR_VERBOSE")
    res = CliRunner().invoke(app, ["--verbose", "runs", "--format", "json"])
    assert os.environ.get("ARBOR_VERBOSE") == "1", res.output  # what the processes a run starts inherit


def test_the_filter_survives_prefects_logging_setup() -> None:
    """Prefect replaces its handlers when it sets up logging (possibly after the CLI's ``quiet()``); the filter on
    the loggers the notices are logged on stays."""
    from prefect.logging.configuration import setup_logging

    quiet()
    setup_logging()
    notice = logging.LogRecord("prefect", logging.INFO, __file__, 1, "Starting temporary server on http://x", None,
                               None)
    assert not logging.getLogger("prefect").filter(notice)
    assert logging.getLogger("prefect.flow_runs").filter(_record("step 1 done"))


def test_a_library_that_sets_its_own_level_stays_quiet() -> None:
    import bm25s  # noqa: F401 - it sets its logger to DEBUG on import

    quiet()
    logging.getLogger("bm25s").setLevel(logging.DEBUG)  # as bm25s does
    lg = logging.getLogger("bm25s")
    debug = logging.LogRecord("bm25s", logging.DEBUG, __file__, 1, "Building index from tokens", None, None)
    warn = logging.LogRecord("bm25s", logging.WARNING, __file__, 1, "index is stale", None, None)
    assert not lg.filter(debug) and lg.filter(warn)
