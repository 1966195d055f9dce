"""The writer commands' exit (arbor.cli._leave): what the interpreter's own exit does, less its last garbage
collection. A non-daemon thread still working is joined, every exit handler runs (in their order), logging's
handlers are flushed before the exit handlers (the temporary API must still be up for Prefect's last lines), the
streams are flushed, and the exit status is the command's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = r'''
import atexit, logging, sys, threading, time
from pathlib import Path
from arbor.cli import _leave

out = Path(sys.argv[1])
seen = []

class Handler(logging.Handler):
    def emit(self, record):
        pass
    def flush(self):
        seen.append("logging flushed")

log = logging.getLogger("exit-test")
log.addHandler(Handler())
atexit.register(lambda: out.write_text("\n".join(seen + ["first handler"])))
atexit.register(lambda: seen.append("second handler"))  # registered last: runs first

def late():
    time.sleep(0.3)  # still working when the command returns
    seen.append("thread done")

threading.Thread(target=late).start()
print("buffered line", end="")  # no newline: only a flush writes it
_leave(int(sys.argv[2]) if sys.argv[2].isdigit() else sys.argv[2])
'''


def test_leave_joins_threads_runs_exit_handlers_flushes_and_keeps_the_status(tmp_path: Path) -> None:
    out = tmp_path / "order.txt"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(out), "3"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stdout == "buffered line"
    assert out.read_text().splitlines() == ["thread done", "logging flushed", "second handler", "first handler"]


def test_leave_with_a_message_prints_it_and_exits_1(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "o.txt"), "no such run"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.strip().endswith("no such run"), proc.stderr[-2000:]
