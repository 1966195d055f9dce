"""Bad input to every command that reads or stores runs: an unknown run id, a malformed one, a bad ``--set`` key or
value, an unusable ARBOR_HOME (a file, a folder under a file, a folder this process may not write). Each is refused
with exit status 2 and exactly one line on stderr, no traceback, and the workspace is left as it was: not a file
added (no lock, no catalog), changed or removed.

The commands run through the real CLI app in-process (typer's CliRunner, as tests/test_cli_sql.py), and the real
entry point in a subprocess for the workspace checks that run before any command; the workspace is built by hand
(one stored run 'r1'), so nothing trains.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arbor.cli import app
from arbor.config import load_config
from arbor.storage.parquet import write_stage

COMMANDS = [  # every command that reads or stores runs, with a stored run where it takes one
    ["train"], ["runs"], ["verify", "r1"], ["report", "r1"], ["export", "r1", "--out", "policy"],
    ["rubrics", "export", "r1"], ["sql", "select 1"], ["disk", "r1"], ["config", "show"], ["eval"],
]
BAD_RUNS = [  # (arguments, what the line names)
    *[(args, "'nope'") for args in (["verify", "nope"], ["report", "nope"], ["export", "nope", "--out", "policy"],
                                    ["rubrics", "export", "nope"], ["disk", "nope"], ["train", "--resume", "nope"])],
    *[(args, "'../x' must match") for args in (["verify", "../x"], ["report", "../x"],
                                               ["export", "../x", "--out", "policy"], ["rubrics", "export", "../x"],
                                               ["disk", "../x"], ["train", "--resume", "../x"],
                                               ["train", "--run-id", "../x"], ["train", "--set", "run.run_id=../x"])],
]
BAD_SETS = [  # (arguments, what the line names)
    *[([*cmd, "--set", "run.nonexistent=1"], "unknown config key 'run.nonexistent'")
      for cmd in (["train"], ["train", "--resume", "r1"], ["eval"], ["config", "show"])],
    *[([*cmd, "--set", "rollout.k=many"], "rollout.k")
      for cmd in (["train"], ["train", "--resume", "r1"], ["eval"], ["config", "show"])],
]


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root``: a file's bytes, None for a folder."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """ARBOR_HOME holding one stored run 'r1' (tiny-cpu), the working directory beside it."""
    home = tmp_path / "home"
    cfg = load_config("tiny-cpu")
    cfg.run.run_id = "r1"
    write_stage("runs", [{"profile": "tiny-cpu", "method": "arbor", "seed": 0, "config_json": cfg.to_json(),
                          "created_at": time.time()}], run_id="r1", step=0, stage="run", home=home)
    monkeypatch.setenv("ARBOR_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    return home


def refused(args: list[str], root: Path) -> str:
    """Run ``arbor ARGS``; check it was refused in one line with exit status 2 and ``root`` is as it was."""
    before = snapshot(root)
    result = CliRunner().invoke(app, args)
    lines = result.stderr.splitlines()
    assert isinstance(result.exception, SystemExit), result.exception  # anything else is a traceback
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output[-3000:]
    assert "Traceback" not in result.output
    assert snapshot(root) == before
    return lines[0]


def refused_without_dac_override(args: list[str], root: Path) -> str:
    """``refused`` for a root process: the real entry point under setpriv, with the capabilities that let root
    write any folder dropped from its bounding set, so a folder's mode binds it as it binds a user."""
    before = snapshot(root)
    out = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-m",
                          "arbor.cli", *args], cwd=root, env=dict(os.environ), capture_output=True, text=True,
                         timeout=120)
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-3000:]
    assert snapshot(root) == before
    return lines[0]


@pytest.mark.parametrize(("args", "named"), BAD_RUNS + BAD_SETS, ids=[" ".join(a) for a, _ in BAD_RUNS + BAD_SETS])
def test_a_bad_run_id_or_setting_is_refused_in_one_line_leaving_the_workspace(workspace: Path, args: list[str],
                                                                              named: str) -> None:
    assert named in refused(args, workspace.parent)


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("kind", ["a file", "under a file", "not writable"])
def test_an_unusable_arbor_home_is_refused_before_anything_is_made(workspace: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   args: list[str], kind: str) -> None:
    root = workspace.parent
    (root / "afile").write_text("x")
    (root / "ro").mkdir()
    (root / "ro").chmod(0o555)
    home = {"a file": root / "afile", "under a file": root / "afile" / "sub", "not writable": root / "ro"}[kind]
    monkeypatch.setenv("ARBOR_HOME", str(home))
    if kind == "not writable" and os.access(root / "ro", os.W_OK):  # root writes a folder whatever its mode:
        line = refused_without_dac_override(args, root)              # the real entry, without that capability
    else:
        line = refused(args, root)
    assert line.startswith(f"error: ARBOR_HOME={home} "), line
    said = {"a file": "is a file, not a folder", "under a file": f"lies under {root / 'afile'}, a file",
            "not writable": "is not writable here"}[kind]
    assert said in line, line


def test_a_refused_train_in_a_new_workspace_makes_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run id that names no run (its lock taken and given back) or a bad value: ARBOR_HOME is not made."""
    monkeypatch.setenv("ARBOR_HOME", str(tmp_path / "new" / "home"))
    monkeypatch.chdir(tmp_path)
    for args in (["train", "--resume", "nope"], ["train", "--run-id", "r2", "--set", "rollout.k=1"],
                 ["train", "--run-id", "r2", "--set", "search.corpus=nothing.jsonl"]):
        refused(args, tmp_path)
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("args", [["train"], ["verify", "r1"], ["sql", "select 1"]], ids=" ".join)
def test_the_real_entry_refuses_a_home_under_a_file_in_one_line(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "afile").write_text("x")
    env = {**os.environ, "ARBOR_HOME": str(tmp_path / "afile" / "sub")}
    out = subprocess.run([sys.executable, "-m", "arbor.cli", *args], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == "", out.stderr[-3000:]
    assert out.stderr.splitlines() == [f"error: ARBOR_HOME={tmp_path / 'afile' / 'sub'} lies under "
                                       f"{tmp_path / 'afile'}, a file: point ARBOR_HOME at a folder (it is created "
                                       "if missing)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
