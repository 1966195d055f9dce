"""``arbor`` commands, each in a process that imported no method, cheaply: this interpreter imports the CLI and torch
(the costly part of a command that loads a method), checks that no method is loaded, then forks one child per
command. A method's class registers its tables when defined, so a command that reads a run must load its method
itself, which a process reused from an earlier command would not show (tests/test_read_commands.py).

    python tests/fresh_cli.py '[["verify", "r1"], ["runs"]]'    prints [[exit status, stdout, stderr], ...] as JSON
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback

from arbor.cli import app, working_dir_importable
from arbor.storage.schemas import OWNER


def run_forked(args: list[str]) -> tuple[int, str, str]:
    """``arbor ARGS`` in a forked child: its exit status, stdout and stderr."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            code = 1
            try:
                app(args, prog_name="arbor")
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else int(e.code is not None)
            except BaseException:  # noqa: BLE001 - what the console script would print
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return os.waitstatus_to_exitcode(status), out.read(), err.read()


def main() -> None:
    import torch  # noqa: F401 - what every method imports: paid once here

    import arbor.tasks.methods.base  # noqa: F401 - the interface, which registers no table
    import arbor.tasks.training.checkpoint  # noqa: F401

    methods = [m for m in sys.modules if m.startswith("arbor.tasks.methods.") and m.count(".") >= 3
               and m.split(".")[3] not in ("base", "__init__")]
    owned = sorted({o for o in OWNER.values() if o != "pipeline"})
    if methods or owned:
        sys.exit(f"fresh_cli: a method is loaded before any command ran: {methods or owned}")
    working_dir_importable()
    print(json.dumps([run_forked(args) for args in json.loads(sys.argv[1])]))


if __name__ == "__main__":
    main()
