"""One writer per run: a second process is refused in one line naming the holder; a holder that
dies (even by SIGKILL) leaves no stale lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from arbor.storage.lock import RunLocked, acquire, lock_path, release, run_lock

ARBOR = str(Path(sys.executable).parent / "arbor")
HOLD = "import sys, time; from arbor.storage.lock import acquire; acquire('r1', sys.argv[1]); print('held', flush=True); time.sleep(600)"


def test_a_second_process_is_refused_naming_the_holder(tmp_path: Path) -> None:
    env = {**os.environ, "ARBOR_HOME": str(tmp_path)}
    with run_lock("r1", tmp_path):
        with run_lock("r1", tmp_path):  # re-entrant in the holder
            pass
        out = subprocess.run([ARBOR, "train", "--run-id", "r1", "--set", "run.steps=1"], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert f"run 'r1' is still running: another process writes it (pid {os.getpid()}" in out.stderr
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLocked, match=f"pid {holder.pid}"):
            acquire("r1", tmp_path)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    acquire("r1", tmp_path)  # the kernel released the dead holder's lock: never stale
    assert lock_path("r1", tmp_path).read_text().strip() == str(os.getpid())
    release("r1", tmp_path)
