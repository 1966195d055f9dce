"""The ``arbor`` command line. One typer app; each command is a thin shell over flows/, tasks/ and storage/.

Every command validates its whole input (config keys and values, files, run ids, methods) before it imports the
flow machinery (Prefect, torch) or starts anything, and refuses bad input with exit status 2 and one line
``error: ...`` naming the key, file or run. Imports at module level stay light for that reason.

Here: the app, its commands in order and the process's exit; the commands themselves are in ``store`` (reading
the workspace), ``run`` (running flows, on ``stop_path``) and ``tools`` (the rest).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from arbor.cli.common import _fail
from arbor.cli.run import compare_cmd, demo_cmd, eval_cmd, guidance_train_cmd, train_cmd
from arbor.cli.store import (
    disk_cmd,
    export_cmd,
    report_cmd,
    rubrics_export_cmd,
    runs_cmd,
    sql_cmd,
    verify_cmd,
)
from arbor.cli.tools import config_show_cmd, judge_serve_cmd, sft_convert_cmd
from arbor.paths import home_problem

# no telemetry: arbor/__init__.py sets the offline defaults before Prefect is imported

app = typer.Typer(
    name="arbor",
    help="ARBOR: RL for search agents with reusable process rubrics. Runs live in $ARBOR_HOME (default ./.arbor).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"arbor {version('arbor-rl')}")
        except PackageNotFoundError:  # pragma: no cover - running from a tree that was never installed
            typer.echo("arbor (not installed)")
        raise typer.Exit()


_WRITERS = ("train", "guidance-train", "demo", "eval", "compare")  # the commands that store runs
_HOME_WRITERS = (*_WRITERS, "report")  # and the one that stores files beside them (the rest read)


@app.callback()
def _main(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="print the version and exit")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="show the libraries' own lines too (weight-loading "
                                          "bars, warnings, DeepSpeed and Prefect notices)")] = False,
) -> None:
    """ARBOR: RL for search agents with reusable process rubrics. Runs live in $ARBOR_HOME (default ./.arbor)."""
    from arbor.runtime.quiet import quiet, set_verbose

    # a flow run without a server starts Prefect's temporary one; its default 20 s to come up is too short on a busy
    # two-core machine ("Timed out while attempting to connect to ephemeral Prefect API server")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

    if verbose:
        set_verbose()
    else:
        quiet()
    home = Path(os.environ.get("ARBOR_HOME", ".arbor")).expanduser()
    # every command reads or writes under it: refused before anything is made there
    if problem := home_problem(home, writes=ctx.invoked_subcommand in _HOME_WRITERS):
        _fail(problem)


# the commands, in the order `arbor --help` lists them
app.command("sql")(sql_cmd)
app.command("runs")(runs_cmd)
app.command("export")(export_cmd)
app.command("verify")(verify_cmd)
app.command("disk")(disk_cmd)
app.command("train")(train_cmd)
app.command("guidance-train")(guidance_train_cmd)
app.command("demo")(demo_cmd)

config_app = typer.Typer(help="The resolved config: every value and where it came from.", no_args_is_help=True)
app.add_typer(config_app, name="config")
config_app.command("show")(config_show_cmd)

judge_app = typer.Typer(help="A local judge: llama.cpp's OpenAI-compatible server on a shipped or local GGUF.",
                        no_args_is_help=True)
app.add_typer(judge_app, name="judge")
judge_app.command("serve")(judge_serve_cmd)

rubrics_app = typer.Typer(help="The rubric pool as an artifact: export it, warm-start another run from it.",
                          no_args_is_help=True)
app.add_typer(rubrics_app, name="rubrics")
rubrics_app.command("export")(rubrics_export_cmd)

sft_app = typer.Typer(help="SFT data: the paper's sources in arbor's rows.", no_args_is_help=True)
app.add_typer(sft_app, name="sft")
sft_app.command("convert")(sft_convert_cmd)

app.command("eval")(eval_cmd)
app.command("report")(report_cmd)
app.command("compare")(compare_cmd)


def working_dir_importable() -> None:
    """Make the working directory importable, as ``python -m arbor.cli`` does and a console script does not: a
    plug-in named by import path (``run.method=examples.length_penalty:LengthPenaltyGRPO``) is found beside the
    user's shell. Python's own ``-P`` / ``PYTHONSAFEPATH`` opt-out is respected."""
    if os.environ.get("PYTHONSAFEPATH") or sys.flags.safe_path:
        return
    cwd = os.getcwd()
    if not any(os.path.abspath(p or ".") == cwd for p in sys.path):
        sys.path.insert(0, cwd)


def _leave(code: int | str | None) -> NoReturn:
    """Exit as the interpreter would, without its last garbage collection: the non-daemon threads are joined, the
    exit handlers run (Prefect's, the temporary API's stop, the trackers'), the streams are flushed, and then the
    process ends. After a run, collecting the heap Prefect, torch and pydantic leave behind took ~7 s on two cores
    (py-spy: ``gc_collect_main`` under ``Py_Finalize``) between the run's last line and the shell's prompt, past
    the stop drill's bound when a dependency had ended the run."""
    import atexit
    import contextlib
    import logging
    import threading

    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    if isinstance(code, str):  # SystemExit("message"): what the interpreter would print
        print(code, file=sys.stderr)
        code = 1
    logging.shutdown()  # while the temporary API still runs: Prefect's API log handler sends its last lines there
    atexit._run_exitfuncs()  # noqa: SLF001 - what Py_Finalize runs first (the temporary API's stop among them)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(code or 0)


def main() -> None:  # pragma: no cover
    working_dir_importable()
    writer = bool(sys.argv[1:2]) and sys.argv[1] in (*_WRITERS, "judge")
    if writer:  # they start servers: none outlives us
        from arbor.runtime.watchdog import guard

        guard()
    try:
        app()
    except SystemExit as e:
        if writer:
            _leave(e.code)
        raise
