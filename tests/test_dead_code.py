"""No dead code in arbor's packages: vulture finds nothing that tests, benchmarks, examples or
the short allowlist (tests/data/dead_code_allowlist.py: framework hooks it cannot see) do not use. A method's
stage hooks are found like any other call: its ``stage_hooks`` names each one."""

from __future__ import annotations

import subprocess
import sys

from arbor.paths import PROJECT_ROOT

PACKAGES = ("arbor", "storage", "llm", "tasks", "flows", "examples")
USERS = ("tests", "bench", "tests/data/dead_code_allowlist.py")


def test_vulture_finds_no_dead_code() -> None:
    proc = subprocess.run([sys.executable, "-m", "vulture", *PACKAGES, *USERS, "--min-confidence", "60"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 3), proc.stderr  # 3: dead code found
    found = [line for line in proc.stdout.splitlines() if line.split("/", 1)[0] in PACKAGES]
    assert not found, "unused code (delete it, or allowlist a framework hook):\n" + "\n".join(found)
