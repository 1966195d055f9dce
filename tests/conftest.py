"""Shared test set-up: offline, quiet, deterministic, and a fresh workspace per test."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# Offline and quiet before anything imports prefect / transformers.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_UI_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
if _worker := os.environ.get("PYTEST_XDIST_WORKER"):  # pytest-xdist
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix=f"arbor-tests-prefect-{_worker}-")  # each worker's own
    # The cores shared out between the workers, inherited by every process a test starts. Left at torch's default
    # (every core), two workers' OpenMP threads spin on each other: a small forward/backward/AdamW loop ran at
    # 2.2 it/s with two threads and 47.8 it/s with one, on two cores loaded by another job.
    _threads = str(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
    os.environ.setdefault("OMP_NUM_THREADS", _threads)
    os.environ.setdefault("MKL_NUM_THREADS", _threads)


# The suite's peak under pytest's base temporary folder, measured with pyproject's retention settings:
# 7.6 GiB (the module- and session-scoped workspaces of the training tests; stop 65's CI ran out of disk with none).
DISK_NEEDED_GIB = 8.0


def pytest_unconfigure(config: pytest.Config) -> None:
    """A worker removes its Prefect home when it ends (an xdist worker exits without running ``atexit`` handlers:
    CI's disk kept one folder per worker per run)."""
    if _worker:
        shutil.rmtree(os.environ["PREFECT_HOME"], ignore_errors=True)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Refuse to start, in one line, on a disk the suite cannot finish on (instead of hundreds of errors later)."""
    if hasattr(session.config, "workerinput"):  # the xdist controller checks once
        return
    where = Path(os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir())
    free = shutil.disk_usage(where).free / 2**30
    if free < DISK_NEEDED_GIB:
        pytest.exit(f"{free:.1f} GiB free under {where}: the suite needs about {DISK_NEEDED_GIB:g} GiB there "
                    "(its training workspaces); free some space or point TMPDIR elsewhere", returncode=3)


@pytest.fixture
def arbor_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty ARBOR_HOME for one test."""
    home = tmp_path / "arbor_home"
    home.mkdir()
    monkeypatch.setenv("ARBOR_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def smol_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace holding SmolLM2 converted once (the conversion is what the first run of a user pays; ~25 s):
    test_smollm2.py and test_vllm_real.py share it (one unit of work, ONE_UNIT)."""
    from arbor.tasks.env.policy import resolve_model

    home = tmp_path_factory.mktemp("smol_home")
    resolve_model("smollm2", home)
    return home


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect server for the whole test session (~8 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory every worker of this pytest run shares: under pytest-xdist each worker's base temp is a sibling
    (``popen-gw0``, ``popen-gw1``) of one run directory; run serially, the base temp itself."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def sft_starts(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``sft_starts(profile, overrides=None)``: an SFT start trained once per test run, whichever test file or
    worker asks first (flow_support.sft_start), keyed by the config that produced it."""
    from flow_support import sft_start

    shared = run_dir(tmp_path_factory) / "sft_starts"
    return lambda profile, overrides=None: sft_start(profile, shared, overrides)


@pytest.fixture(scope="session")
def sft_policy(sft_starts: Callable[..., Path]) -> Path:
    """The tiny policy after the tiny-cpu SFT warm start."""
    return sft_starts("tiny-cpu")


@pytest.fixture(scope="session")
def reference_run(prefect_harness, sft_policy: Path, tmp_path_factory: pytest.TempPathFactory):
    """The uninterrupted two-step tiny-cpu run (openai judge over HTTP, streamed judging: the default) that the
    resume tests and the serial-order comparison check against: (workspace, its judge server's request count
    per prompt, each request's arrival time and role). Run id ``ref``."""
    from flow_support import JUDGE_KEY, JUDGE_KEY_ENV, judge_server, openai_judge, tiny_overrides

    from arbor.flows.train import arbor_train

    home = tmp_path_factory.mktemp("ref_home")
    os.environ[JUDGE_KEY_ENV] = JUDGE_KEY
    os.environ["ARBOR_HOME"] = str(home)
    with judge_server() as srv:
        srv.plan.latency_s = 0.02  # judge work that takes time: streamed calls arrive while groups still roll out
        arbor_train(profile="tiny-cpu", overrides={**tiny_overrides(sft_policy), **openai_judge(srv.base_url)},
                    run_id="ref")
        return home, dict(srv.counts), list(srv.arrivals)


@pytest.fixture
def deterministic():
    """Deterministic torch algorithms for one test (bitwise resume comparisons)."""
    import torch

    prev = torch.are_deterministic_algorithms_enabled()
    prev_fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    # filling every torch.empty with NaN costs ~30 s on DeepSpeed's large CPU buckets; determinism is unaffected
    torch.utils.deterministic.fill_uninitialized_memory = False
    yield
    torch.use_deterministic_algorithms(prev)
    torch.utils.deterministic.fill_uninitialized_memory = prev_fill


# ------------------------------------------------------------------------------------------- two workers
# `make test` runs the suite on two pytest-xdist workers. A test file is one unit of work (its module fixtures are
# built once), and files that share a session fixture too costly to build twice form one unit (ONE_UNIT). Units are
# handed out in COSTLIEST_FIRST order (measured with --durations on two cores), so that the last unit to finish is a
# short one; files not named follow in collection order. (xdist's own `--dist loadgroup` cannot do this under pytest
# 9.2: it renames `item._nodeid`, which pytest 9.2 no longer reads, so its groups are silently ignored.)
COSTLIEST_FIRST: tuple[str, ...] = (  # the first two build the two longest SFT starts side by side
    "test_real_judge.py", "test_learning.py", "test_flow_train.py", "test_stop_drill.py", "test_flow_pipeline.py",
    "test_deployment.py", "test_flow_rubricem.py", "test_flow_guidance.py", "test_bad_input.py",
    "test_example_evidence_check.py", "test_methods.py", "test_sft.py", "test_flow_arco.py", "test_smollm2.py",
    "test_example_diversity.py", "test_flow_lora.py", "test_install.py")
ONE_UNIT = {"test_flow_train.py": "reference_run", "test_flow_pipeline.py": "reference_run",
            "test_smollm2.py": "smol_home", "test_vllm_real.py": "smol_home"}
# a file whose cases share nothing costly is cut in two units, so the two workers can split it: the stop drill's
# signal-by-phase table, and its other cases (dead dependencies, the resumes that share one reference run)
SPLIT = {"test_stop_drill.py": "test_a_signal_stops_the_run_in_seconds"}


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, its file's ONE_UNIT group, or one of a SPLIT file's halves."""
    path = nodeid.split("::", 1)[0]
    name = Path(path).name
    if name in SPLIT:
        return f"{path}::{'table' if f'::{SPLIT[name]}' in nodeid else 'rest'}"
    return ONE_UNIT.get(name, path)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(COSTLIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduler with ``unit_of`` as its scope: units in collection order (``--no-loadscope-reorder``),
    each whole on one worker."""
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return Units(config, log)
