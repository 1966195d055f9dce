"""Shared test set-up: offline, quiet, deterministic, and a fresh workspace per test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Offline and quiet before anything imports prefect / transformers (STACK_NOTES).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_UI_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


@pytest.fixture
def arbor_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty ARBOR_HOME for one test."""
    home = tmp_path / "arbor_home"
    home.mkdir()
    monkeypatch.setenv("ARBOR_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect server for the whole test session (STACK_NOTES: ~8 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def sft_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny policy after the tiny-cpu SFT warm start, trained once per test session."""
    from flow_support import sft_start

    return sft_start("tiny-cpu", lambda: tmp_path_factory.mktemp("sft_home"))
