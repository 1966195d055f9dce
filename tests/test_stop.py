"""A stop whose raise was lost still ends the run (seen in the stop drill under load).

The signal handler raises ``RunStopped`` wherever the main thread is. When that is a finalizer, Python prints
"Exception ignored in ..." and goes on: the stop is lost and the run would train to its end. ``stop.raise_pending``
(at each step boundary and before the run records itself completed) raises it again. The loss is real here: a
real SIGTERM, delivered to a child process while it runs a ``__del__``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from arbor.runtime import stop

    stop.install(lambda s: f"stopped: {s.cause}")

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs inside __del__: its raise is ignored
            for _ in range(1000):
                pass

    Finalized()  # collected at once
    print("survived the signal", flush=True)
    try:
        stop.raise_pending()
    except stop.RunStopped as s:
        print(f"raised {s.cause} {s.code} {s.signalled}", flush=True)
        sys.exit(3)
    print("nothing raised", flush=True)
""")


def test_a_stop_lost_in_a_finalizer_is_raised_at_the_next_boundary() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60,
                         env={"ARBOR_STOP_DEADLINE_S": "30", "PATH": "/usr/bin:/bin"})
    assert "Exception ignored" in out.stderr and "RunStopped" in out.stderr, out.stderr  # the raise was lost
    assert out.stdout.splitlines() == ["survived the signal", f"raised SIGTERM {128 + signal.SIGTERM} True"], out
    assert out.returncode == 3


DEFERRED = textwrap.dedent("""
    import os, signal, sys
    from arbor.runtime import stop

    stop.install(lambda s: f"stopped: {s.cause}")
    kept = None
    try:
        with stop.deferred():
            os.kill(os.getpid(), signal.SIGINT)  # lands inside the block: recorded, not raised
            for _ in range(100000):
                pass
            kept = "the handle"  # what the block keeps (a started process) is kept
            print("the block ran to its end", flush=True)
    except stop.RunStopped as s:
        print(f"raised at the block's end: {s.cause} {s.code}; kept {kept}", flush=True)
        sys.exit(3)
    print("nothing raised", flush=True)
""")


def test_a_stop_inside_deferred_is_raised_at_the_blocks_end() -> None:
    """``stop.deferred`` (the temporary API server's spawn: its handle kept before a stop can leave it behind): a
    real SIGINT inside the block lets the block finish, then raises the stop once, with the signal's cause."""
    out = subprocess.run([sys.executable, "-c", DEFERRED], capture_output=True, text=True, timeout=60,
                         env={"ARBOR_STOP_DEADLINE_S": "30", "PATH": "/usr/bin:/bin"})
    assert out.stdout.splitlines() == ["the block ran to its end",
                                       f"raised at the block's end: SIGINT (Ctrl-C) {128 + signal.SIGINT}; kept "
                                       "the handle"], (out.stdout, out.stderr)
    assert out.returncode == 3
