"""One door for a run's identity: however a run id arrives (``--run-id``, ``--resume``, ``--set run.run_id``, a
profile's ``run.run_id``, a flow's ``run_id`` or overrides), it is checked, the run is locked and the stored runs are
consulted before anything is written; a refused door changes no stored run and leaves no file behind.

The workspace is built by hand: one stored run 'dup' with a known creation time, a history of one config change and
its config.yaml. The CLI doors run as `.venv/bin/arbor` subprocesses; the flow's doors through ``prepare_run``, the
call ``arbor_train`` resolves its run with.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from arbor.config import ConfigError, load_config
from arbor.storage.lock import run_lock
from arbor.storage.parquet import write_stage
from arbor.storage.runs import run_row
from arbor.storage.schemas import SchemaError

ARBOR = str(Path(sys.executable).parent / "arbor")
QUIET = ("DO_NOT_TRACK", "PREFECT_SERVER_ANALYTICS_ENABLED", "HF_HUB_DISABLE_TELEMETRY", "PREFECT_API_URL")
CREATED = 1_700_000_000.0
HISTORY = [{"at": 1_700_000_100.0, "key": "run.steps", "old": 5, "new": 6}]
CONFIG_YAML = "run:\n  run_id: dup  # override\n  steps: 6  # override (resume)\n"
HOLD = ("import sys, time; from arbor.storage.lock import acquire; acquire(sys.argv[2], sys.argv[1]); "
        "print('held', flush=True); time.sleep(600)")


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root``: a file's bytes, None for a folder."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Path, dict[str, str], Path]:
    """(working directory, environment, workspace) with run 'dup' stored (tiny-cpu, steps 5 -> 6 on a resume) and a
    profile ``named.yaml`` in the working directory whose run.run_id is 'dup'."""
    home = tmp_path / "home"
    cfg = load_config("tiny-cpu", {"run.steps": 6})
    cfg.run.run_id = "dup"
    write_stage("runs", [{"profile": "tiny-cpu", "method": "arbor", "seed": 0, "config_json": cfg.to_json(),
                          "created_at": CREATED, "config_changes": json.dumps(HISTORY)}],
                run_id="dup", step=0, stage="run", home=home)
    (home / "runs" / "dup").mkdir(parents=True)
    (home / "runs" / "dup" / "config.yaml").write_text(CONFIG_YAML)
    (tmp_path / "named.yaml").write_text("run:\n  run_id: dup\n")
    env = {k: v for k, v in os.environ.items() if k not in QUIET}
    env.update(ARBOR_HOME=str(home), PREFECT_HOME=str(tmp_path / "prefect"))
    return tmp_path, env, home


def assert_dup_unchanged(home: Path) -> None:
    row = run_row("dup", home)
    assert row is not None and row["created_at"].timestamp() == CREATED
    assert json.loads(row["config_changes"]) == HISTORY
    assert json.loads(row["config_json"])["run"]["steps"] == 6
    assert (home / "runs" / "dup" / "config.yaml").read_text() == CONFIG_YAML


CLI_DOORS = [  # (arguments, what the one line says)
    (["train", "--run-id", "dup"], "run 'dup' already exists in {home}: continue it with --resume dup"),
    (["train", "--set", "run.run_id=dup"], "run 'dup' already exists in {home}: continue it with --resume dup"),
    (["train", "run.run_id=dup"], "run 'dup' already exists in {home}: continue it with --resume dup"),
    (["train", "-p", "named.yaml"], "run 'dup' already exists in {home}: continue it with --resume dup"),
    (["train", "--run-id", "other", "--set", "run.run_id=dup"],
     "--run-id other and run.run_id=dup name different runs"),
    (["train", "--resume", "dup", "--set", "run.run_id=other"], "cannot change run.run_id ('dup' -> 'other')"),
    (["train", "--set", "run.run_id=../dup"], "run id '../dup' must match"),
    (["train", "-p", "named.yaml", "--set", "run.run_id=dup/x"], "run id 'dup/x' must match"),
    (["train", "--resume", "nope"], "cannot resume run 'nope': no such run in {home}"),
]


@pytest.mark.parametrize(("args", "says"), CLI_DOORS, ids=[" ".join(a) for a, _ in CLI_DOORS])
def test_every_cli_door_is_refused_and_changes_nothing(stored, args: list[str], says: str) -> None:
    cwd, env, home = stored
    before = snapshot(home)
    out = subprocess.run([ARBOR, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith("error: ") and says.format(home=home) in lines[0], lines[0]
    assert snapshot(home) == before  # no lock file left, no record, config.yaml or folder touched
    assert_dup_unchanged(home)
    assert not (cwd / "prefect").exists(), "Prefect was started"


@pytest.mark.parametrize("args", [["--resume", "dup"], ["--set", "run.run_id=dup"], ["--set", "run.run_id=fresh"],
                                  ["-p", "named.yaml"]], ids=" ".join)
def test_a_run_another_process_writes_is_refused_by_every_door(stored, args: list[str]) -> None:
    """The lock comes with the id, whichever door names it: 'fresh' is a new run, but another process holds it."""
    cwd, env, home = stored
    with run_lock("dup", home), run_lock("fresh", home):
        before = snapshot(home)
        out = subprocess.run([ARBOR, "train", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
        lines = out.stderr.splitlines()
        assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
        rid = "fresh" if "run.run_id=fresh" in args else "dup"
        assert f"run '{rid}' is still running: another process writes it (pid {os.getpid()};" in lines[0], lines[0]
        assert snapshot(home) == before
    assert_dup_unchanged(home)
    assert not (home / "locks").exists()  # the holder's last release took its files and the folder it made


def test_flow_overrides_and_profile_reach_the_stored_run(stored) -> None:
    """A flow's ``overrides`` or profile naming 'dup' continue it as its ``run_id`` would: only what a resume may
    change is changed, and its record (creation time, history) is kept, never written afresh."""
    from arbor.flows.run_setup import prepare_run
    from arbor.storage.lock import release

    cwd, _env, home = stored
    before = snapshot(home)
    with pytest.raises(ConfigError, match=r"cannot change rollout\.k \(8 -> 4\) when resuming run 'dup'"):
        prepare_run("tiny-cpu", {"run.run_id": "dup", "rollout.k": 4}, None, False, home)
    assert snapshot(home) == before
    cfg = prepare_run(str(cwd / "named.yaml"), None, None, False, home)
    release("dup", home)
    assert (cfg.run.run_id, cfg.run.steps) == ("dup", 6)
    assert snapshot(home) == before
    assert_dup_unchanged(home)


FLOW_DOORS = [  # (overrides, run_id, resume, error, message)
    ({"run.run_id": "dup"}, "other", False, SchemaError, "run_id other and run.run_id=dup name different runs"),
    ({"run.run_id": "../dup"}, None, False, SchemaError, r"run id '\.\./dup' must match"),
    (None, "../dup", True, SchemaError, r"run id '\.\./dup' must match"),
    (None, "nope", True, SchemaError, "cannot resume run 'nope': no such run"),
    ({"rollout.k": 4}, "dup", True, ConfigError, r"cannot change rollout\.k \(8 -> 4\)"),
]


@pytest.mark.parametrize(("overrides", "run_id", "resume", "error", "message"), FLOW_DOORS,
                         ids=[f"{o}-{r}-{s}" for o, r, s, *_ in FLOW_DOORS])
def test_every_flow_door_is_refused_and_changes_nothing(stored, overrides, run_id, resume, error, message) -> None:
    from arbor.flows.run_setup import prepare_run

    _cwd, _env, home = stored
    before = snapshot(home)
    with pytest.raises(error, match=message):
        prepare_run("tiny-cpu", overrides, run_id, resume, home)
    assert snapshot(home) == before
    assert_dup_unchanged(home)


@pytest.mark.parametrize(("run_id", "resume", "redo", "message"), [
    ("nope", False, "1:score", r"redo 1:score: run 'nope' is not stored"),
    ("dup", True, "1", r"redo 1: expected STEP:STAGE"),
    ("dup", True, "1:nope", r"redo 1:nope: "),
], ids=["unstored", "no-stage", "unknown-stage"])
def test_the_flows_redo_parameter_is_checked_before_anything_changes(stored, run_id, resume, redo, message) -> None:
    """``arbor_train(redo=STEP:STAGE)`` (the deployment's parameter, ``--redo`` on the CLI) goes through the same
    door: a run that is not stored, or a spec that names no stored stage, is refused and nothing changes."""
    from arbor.flows.run_setup import prepare_run

    _cwd, _env, home = stored
    before = snapshot(home)
    with pytest.raises(ConfigError, match=message):
        prepare_run("tiny-cpu", None, run_id, resume, home, redo=redo)
    assert snapshot(home) == before
    assert_dup_unchanged(home)


def test_a_flow_door_to_a_run_another_process_writes_is_refused(stored) -> None:
    """A flow's overrides naming 'dup' while another process writes it: refused before its record is read."""
    from arbor.flows.run_setup import prepare_run

    _cwd, _env, home = stored
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(home), "dup"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        before = snapshot(home)
        with pytest.raises(SchemaError, match=f"run 'dup' is still running: another process writes it "
                                              f"\\(pid {holder.pid};"):
            prepare_run("tiny-cpu", {"run.run_id": "dup", "run.steps": 9}, None, False, home)
        assert snapshot(home) == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert_dup_unchanged(home)
