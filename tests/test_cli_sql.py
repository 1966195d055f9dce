"""`arbor sql` and `arbor runs` through the real CLI (typer's CliRunner and one real subprocess)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from datetime import UTC, datetime

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from arbor.cli import app
from arbor.storage.parquet import write_stage

EIGHT = {"runs", "steps", "trajectories", "rubrics", "rubric_events", "rubric_activations", "rubric_sources",
         "judge_calls"}


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("ARBOR_HOME", str(tmp_path / "home"))  # results written beside it, never into it
    return tmp_path / "home"


def _run(*args):
    return CliRunner().invoke(app, list(args))


def test_acceptance_fresh_home_lists_the_eight_names(tmp_path):
    """The issue's acceptance command, as a real process: ARBOR_HOME=$(mktemp -d) arbor sql "..."."""
    env = dict(os.environ, ARBOR_HOME=str(tmp_path / "fresh"))
    out = subprocess.run([sys.executable, "-m", "arbor.cli", "sql", "select table_name from information_schema.tables"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    names = {line.strip() for line in out.stdout.splitlines()}
    assert EIGHT <= names


def test_formats(home, tmp_path):
    write_stage("steps", [{"loss": 0.5, "n_groups": 4}], run_id="r1", step=1, stage="train", home=home)
    sql = "select run_id, step, loss from steps"
    table = _run("sql", sql)
    assert table.exit_code == 0, table.output
    assert table.output.splitlines()[0].split() == ["run_id", "step", "loss"] and "r1" in table.output
    assert "(1 row)" in table.output
    rows = list(csv.DictReader(io.StringIO(_run("sql", sql, "--format", "csv").output)))
    assert rows == [{"run_id": "r1", "step": "1", "loss": "0.5"}]
    assert json.loads(_run("sql", sql, "--format", "json").output) == [{"run_id": "r1", "step": 1, "loss": 0.5}]
    target = tmp_path / "out.parquet"
    res = _run("sql", sql, "--format", "parquet", "--output", str(target))
    assert res.exit_code == 0 and pq.read_table(target).to_pylist() == [{"run_id": "r1", "step": 1, "loss": 0.5}]
    qfile = tmp_path / "q.sql"
    qfile.write_text("select count(*) as n from steps;\n")
    assert _run("sql", "--file", str(qfile), "--format", "json").output.strip() == '[{"n": 1}]'


def test_sql_is_read_only_in_fact(home, tmp_path):
    """No statement that writes, attaches or configures runs, and no file outside the workspace's
    data folder can be read, whatever the statement (the setting is locked for the connection)."""
    write_stage("steps", [{"loss": 0.5, "n_groups": 4}], run_id="r1", step=1, stage="train", home=home)
    record = next((home / "data" / "steps").rglob("run_id=r1/**/*.parquet"))
    before = record.read_bytes()
    for sql in [f"copy (select 'x' as run_id) to '{record}' (format parquet)",
                f"copy (select 1 as a) to '{tmp_path / 'out.csv'}'", f"attach '{tmp_path / 'x.duckdb'}'",
                "set enable_external_access = true", "install httpfs", "select 1; copy (select 1) to 'y.csv'"]:
        res = _run("sql", sql)
        assert res.exit_code == 2 and "read-only" in res.output and "refused" in res.output, (sql, res.output)
    assert record.read_bytes() == before and not (tmp_path / "out.csv").exists() and not (tmp_path / "x.duckdb").exists()
    outside = tmp_path / "secret.csv"
    outside.write_text("a\n1\n")
    for sql in [f"select * from read_csv('{outside}')", "select * from read_text('/etc/hostname')"]:
        res = _run("sql", sql)
        assert res.exit_code == 2 and "Permission" in res.output, (sql, res.output)
    assert _run("sql", "with s as (select count(*) as n from steps) select n from s").exit_code == 0  # reads still work


def test_errors_are_clear(home):
    res = _run("sql", "insert into catalog_meta values ('a', 'b')")
    assert res.exit_code == 2 and "read-only" in res.output
    res = _run("sql", "select * from no_such_table")
    assert res.exit_code == 2 and "no_such_table" in res.output
    res = _run("sql", "select 1", "--format", "parquet")
    assert res.exit_code == 2 and "--output" in res.output
    res = _run("sql", "select 1", "--format", "xml")
    assert res.exit_code == 2 and "'xml' is not one of" in res.output
    res = _run("sql", "--file", str(home / "nope.sql"))
    assert res.exit_code == 2 and res.output.strip() == f"error: --file {home / 'nope.sql'}: No such file or directory"
    res = _run("sql", "select 1", "--output", str(home.parent / "no_dir" / "x.csv"), "--format", "csv")
    assert res.exit_code == 2 and "no_dir" in res.output and not (home.parent / "no_dir").exists()


def test_format_options_are_choices() -> None:
    """`--format` lists its choices in --help (and a bad one is refused by the parser)."""
    assert "table|csv|json|parquet" in _run("sql", "--help").output
    assert "table|csv|json" in _run("runs", "--help").output
    assert _run("runs", "--format", "parquet").exit_code == 2


def test_version() -> None:
    from importlib.metadata import version

    res = _run("--version")
    assert res.exit_code == 0 and res.output.strip() == f"arbor {version('arbor-rl')}"


def test_cli_turns_telemetry_off_itself(tmp_path) -> None:
    """A user's shell without DO_NOT_TRACK: arbor sets it (and Prefect's server analytics off) before Prefect, for
    the CLI and for a script that imports a flow (a benchmark, a notebook)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DO_NOT_TRACK", "PREFECT_SERVER_ANALYTICS_ENABLED", "HF_HUB_DISABLE_TELEMETRY")}
    code = ("import arbor.cli, os; from prefect.settings import get_current_settings; "
            "print(os.environ['DO_NOT_TRACK'], get_current_settings().server.analytics_enabled)")
    out = subprocess.run([sys.executable, "-c", code], env={**env, "PREFECT_HOME": str(tmp_path)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "False"]
    code = code.replace("import arbor.cli", "import arbor.flows.train")
    out = subprocess.run([sys.executable, "-c", code], env={**env, "PREFECT_HOME": str(tmp_path)},
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["1", "False"], out.stderr
    env.update(PREFECT_SERVER_ANALYTICS_ENABLED="true", DO_NOT_TRACK="0")  # values the user exported win
    code = "import arbor.cli, os; print(os.environ['DO_NOT_TRACK'], os.environ['PREFECT_SERVER_ANALYTICS_ENABLED'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["0", "true"], out.stderr


def test_runs_lists_status_and_last_step(home):
    write_stage("runs", [dict(profile="tiny-cpu", method="grpo", created_at=datetime(2026, 1, 1, tzinfo=UTC))],
                run_id="demo", step=0, stage="run", home=home)
    write_stage("steps", [{"loss": 0.1}], run_id="demo", step=3, stage="train", home=home)
    write_stage("stage_runs", [dict(stage="rollout", status="running")], run_id="demo", step=4, stage="rollout",
                home=home)
    res = _run("runs", "--format", "json")
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.output)
    assert (row["run_id"], row["method"], row["last_completed_step"], row["status"]) == ("demo", "grpo", 3, "running")
    assert "demo" in _run("runs").output


def test_runs_tells_running_from_crashed(home):
    """`arbor runs` decides each unfinished run's status from its owner process: on this host the pid (and its start
    time, against pid reuse), elsewhere the heartbeat's age; the SQL view applies the heartbeat rule alone."""
    from arbor.storage.heartbeat import host_name, pid_start_time

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process now
    me, host, now = os.getpid(), host_name(), datetime.now(UTC)
    old = datetime.fromtimestamp(now.timestamp() - 600, UTC)
    owners = {
        "alive": dict(host=host, pid=me, pid_start=pid_start_time(me), heartbeat_at=old),  # a live pid needs no beat
        "killed": dict(host=host, pid=gone.pid, pid_start=None, heartbeat_at=now),
        "reused": dict(host=host, pid=me, pid_start="1", heartbeat_at=now),  # same pid number, another process
        "remote_fresh": dict(host="elsewhere", pid=1, heartbeat_at=now),
        "remote_stale": dict(host="elsewhere", pid=1, heartbeat_at=old),
        "ended": dict(host=host, pid=me, pid_start=pid_start_time(me), heartbeat_at=now, flow_ended_at=now),
        "legacy": None,  # recorded before heartbeats existed
    }
    for i, (rid, owner) in enumerate(owners.items()):
        write_stage("runs", [dict(profile="tiny-cpu", method="arbor", created_at=datetime(2026, 1, 1, 0, i, tzinfo=UTC),
                                  **(owner or {}))], run_id=rid, step=0, stage="run", home=home)
        write_stage("stage_runs", [dict(stage="run", status="running", started_at=now)], run_id=rid, step=0,
                    stage="run", home=home)
    res = _run("runs", "--format", "json")
    assert res.exit_code == 0, res.output
    status = {r["run_id"]: r["status"] for r in json.loads(res.output)}
    assert status == {"alive": "running", "killed": "crashed", "reused": "crashed", "remote_fresh": "running",
                      "remote_stale": "crashed", "ended": "crashed", "legacy": "running"}
    sql = json.loads(_run("sql", "select run_id, status, pid from run_status", "--format", "json").output)
    assert {r["run_id"]: r["status"] for r in sql} == {
        "alive": "crashed", "killed": "running", "reused": "running", "remote_fresh": "running",
        "remote_stale": "crashed", "ended": "crashed", "legacy": "running"}
    assert {r["run_id"]: r["pid"] for r in sql}["killed"] == gone.pid
