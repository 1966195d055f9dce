"""`arbor sql` as a console a user can trust and stop: ``--output`` never replaces a file of the workspace and
replaces another only with ``--force``; a result stops at a cap with a line saying how to get every row, without
holding the rest in memory; one statement at a time; Ctrl-C stops a running query at once, in one line."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from arbor.cli import app
from arbor.storage.parquet import stage_path, write_stage

ARBOR = [sys.executable, "-m", "arbor.cli"]


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace with one stored row and its catalog built, beside the folder results are written to."""
    home = tmp_path / "home"
    monkeypatch.setenv("ARBOR_HOME", str(home))
    write_stage("steps", [{"loss": 0.5}], run_id="r1", step=1, stage="train", home=home)
    assert _run("sql", "select 1").exit_code == 0
    return home


def _run(*args: str):
    return CliRunner().invoke(app, list(args))


def _one_line_error(res, *named: str) -> None:
    assert res.exit_code == 2 and res.stdout == "", res.output
    assert len(res.stderr.splitlines()) == 1 and res.stderr.startswith("error: "), res.stderr
    for text in named:
        assert text in res.stderr, res.stderr


def test_output_never_replaces_a_file_of_the_workspace(home: Path) -> None:
    catalog, parquet = home / "catalog.duckdb", Path(stage_path("steps", run_id="r1", step=1, stage="train", home=home))
    before = {p: p.read_bytes() for p in (catalog, parquet)}
    link = home.parent / "link.duckdb"
    link.symlink_to(catalog)  # a name outside that is the catalog
    for target in (catalog, parquet, home / "new.csv", home / "data" / "steps" / "extra.parquet", link):
        for force in ([], ["--force"]):
            res = _run("sql", "select 1 as a", "--format", "csv", "-o", str(target), *force)
            _one_line_error(res, f"--output {target}", "inside the workspace", "outside it")
    assert {p: p.read_bytes() for p in (catalog, parquet)} == before
    assert not (home / "new.csv").exists() and not (home / "data" / "steps" / "extra.parquet").exists()
    res = _run("sql", "select loss from steps", "--format", "csv")  # the catalog still opens
    assert res.exit_code == 0 and res.stdout == "loss\n0.5\n"


def test_output_replaces_another_file_only_with_force(home: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine.csv"
    mine.write_text("what I had\n")
    _one_line_error(_run("sql", "select 1 as a", "--format", "csv", "-o", str(mine)), "already exists", "--force")
    assert mine.read_text() == "what I had\n"
    res = _run("sql", "select 1 as a", "--format", "csv", "-o", str(mine), "--force")
    assert res.exit_code == 0 and res.stdout == f"wrote 1 rows to {mine}\n"
    assert mine.read_text() == "a\n1\n" and sorted(p.name for p in tmp_path.iterdir()) == ["home", "mine.csv"]


def test_output_a_folder_is_one_line(home: Path, tmp_path: Path) -> None:
    res = _run("sql", "select 1", "-o", str(tmp_path))
    _one_line_error(res, f"--output {tmp_path} is a folder", f"{tmp_path}/result.csv")


def test_a_result_stops_at_the_cap_and_says_how_to_get_all(home: Path, tmp_path: Path) -> None:
    many = "select range as n from range(25000)"
    res = _run("sql", many, "--format", "csv")
    assert res.exit_code == 0 and res.stdout.splitlines() == ["n", *map(str, range(10000))]
    assert res.stderr == ("stopped after 10000 rows: --limit N prints up to N, --all prints every row, "
                          "--output FILE writes them all to a file\n")
    table = _run("sql", many)
    assert table.stdout.splitlines()[-2:] == ["9999", "(10000 rows)"] and "stopped after 10000 rows" in table.stderr
    res = _run("sql", many, "--format", "json", "--limit", "3")
    assert res.stdout == '[{"n": 0}, {"n": 1}, {"n": 2}]\n' and "stopped after 3 rows" in res.stderr
    res = _run("sql", many, "--format", "csv", "--all")
    assert res.stdout.splitlines() == ["n", *map(str, range(25000))] and res.stderr == ""
    res = _run("sql", many, "--format", "csv", "--limit", "25000")  # exactly all: nothing was left
    assert len(res.stdout.splitlines()) == 25001 and res.stderr == ""
    out = tmp_path / "all.parquet"
    res = _run("sql", many, "--format", "parquet", "-o", str(out))
    assert res.stdout == f"wrote 25000 rows to {out}\n" and res.stderr == ""
    assert pq.read_table(out).column("n").to_pylist() == list(range(25000))
    _one_line_error(_run("sql", many, "--limit", "5", "--all"), "--limit N or --all")


def test_a_capped_or_written_result_is_never_held_whole(home: Path, tmp_path: Path) -> None:
    """A million rows of 300 characters (300 MB as Arrow, far more as Python strings): the process printing the
    first 10,000, or writing every row to a file, stays near the ~125 MiB an `arbor sql "select 1"` takes."""
    big = "select range as n, repeat('x', 300) as pad from range(1000000)"
    out = tmp_path / "big.csv"
    for args in ([big, "--format", "csv"], [big, "--format", "csv", "-o", str(out)]):
        code = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
                "print(r.returncode, len(r.stdout.splitlines()), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
        got = subprocess.run([sys.executable, "-c", code, *ARBOR, "sql", *args], capture_output=True, text=True,
                             timeout=600, env={**os.environ, "ARBOR_HOME": str(home)})
        rc, lines, max_rss_kib = map(int, got.stdout.split())
        assert rc == 0 and lines == (10001 if "-o" not in args else 1), got.stderr
        assert max_rss_kib < 400 * 1024, max_rss_kib
    with out.open() as fh:
        assert list(csv.reader([next(fh), next(fh)])) == [["n", "pad"], ["0", "x" * 300]]
        assert sum(1 for _ in fh) == 999999


def test_one_statement_at_a_time(home: Path, tmp_path: Path) -> None:
    _one_line_error(_run("sql", "select 1; select 2"), "one statement at a time", "got 2")
    two = tmp_path / "two.sql"
    two.write_text("select 1 as a;\nselect 2 as b;\n")
    _one_line_error(_run("sql", "--file", str(two)), "one statement at a time", "got 2")
    res = _run("sql", "select 1 as a;", "--format", "csv")  # one statement and its semicolon
    assert res.exit_code == 0 and res.stdout == "a\n1\n"
    _one_line_error(_run("sql", " ; "), "empty query")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime, every thread


def _has_open(pid: int, path: Path) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    try:
        return any(os.readlink(fd) == str(path) for fd in fds.iterdir())
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process's state from /proc (Linux)")
def test_ctrl_c_stops_a_long_query_in_one_line(home: Path) -> None:
    """A 10^12-row cross join (hours): once the process holds the catalog open and has computed for half a second
    after that (the query runs: nothing else is left to do), one SIGINT ends it at once: one line, status 130."""
    catalog = (home / "catalog.duckdb").resolve()
    proc = subprocess.Popen([*ARBOR, "sql", "select count(*) from range(1000000) a, range(1000000) b"],
                            env={**os.environ, "ARBOR_HOME": str(home)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not _has_open(proc.pid, catalog):  # polled, each wait bounded
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        opened = _cpu_seconds(proc.pid)
        while _cpu_seconds(proc.pid) < opened + 0.5:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130 and out == "", err
    assert err == "error: interrupted (Ctrl-C): the query was stopped\n"
    assert took < 3.0, took  # a second, with room for a loaded machine's process exit
