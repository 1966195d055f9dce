"""A method named by import path is found in the working directory by the installed `arbor` console script, as
`python -m` users expect, and a failed import names its real cause (docs/methods.md, docs/plugins.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ARBOR = str(Path(sys.executable).parent / "arbor")  # the console script pip wrote, not `python -m arbor.cli`


def _arbor(args: list[str], cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    return subprocess.run([ARBOR, *args], cwd=cwd, env={**env, "ARBOR_HOME": str(home)}, capture_output=True,
                          text=True, timeout=300)


def test_console_script_imports_plugins_from_the_working_directory(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    # imported from the working directory, then refused for its shape: the message proves which import happened
    (work / "cwd_plugin_probe.py").write_text("class NotAMethod:\n    pass\n")
    got = _arbor(["train", "-p", "tiny-world", "--set", "run.method=cwd_plugin_probe:NotAMethod"], work,
                 tmp_path / "home")
    out = got.stdout + got.stderr
    assert got.returncode != 0, out
    assert "'cwd_plugin_probe:NotAMethod' is not a subclass of arbor.tasks.methods.base.Method" in out, out
    assert "No module named" not in out, out
    # the same through `arbor compare`: the import's own reason, not "unknown method(s)"
    got = _arbor(["compare", "-p", "tiny-world", "--methods", "grpo,cwd_plugin_probe:NotAMethod"], work,
                 tmp_path / "home")
    out = got.stdout + got.stderr
    assert got.returncode != 0 and "unknown method" not in out, out
    assert "is not a subclass of arbor.tasks.methods.base.Method" in out, out
    got = _arbor(["compare", "-p", "tiny-world", "--methods", "grpo,no_such_plugin_mod:Mine"], work,
                 tmp_path / "home")
    out = got.stdout + got.stderr
    assert got.returncode != 0 and "No module named 'no_such_plugin_mod'" in out and "unknown method" not in out, out
