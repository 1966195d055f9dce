"""What the ``arbor`` commands share: the one-line refusal, how the user called us, ``--set`` items, a stored run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn

import typer


def _fail(message: object) -> NoReturn:
    """Refuse bad input: one line on stderr naming what is wrong, exit status 2."""
    typer.echo("error: " + " ".join(str(message).split("\n")).strip(), err=True)
    raise typer.Exit(2)


def _me() -> str:
    """How the user called us, for the commands we suggest (``arbor`` or ``.venv/bin/arbor``)."""
    argv0 = sys.argv[0] if sys.argv else ""
    return argv0 if Path(argv0).name == "arbor" else "arbor"


def _overrides(sets: list[str] | None) -> dict[str, str]:
    """``--set key=value`` items as an ordered mapping (values are parsed as YAML when applied); relative file paths
    made absolute from the current directory (``arbor.config.inputs``). Bad input exits 2 naming it."""
    from arbor.config import ConfigError, _split
    from arbor.config.inputs import resolve_override_paths

    out: dict[str, str] = {}
    try:
        for item in sets or []:
            key, value = _split(item)
            out[key] = value
        return resolve_override_paths(out)
    except ConfigError as e:
        _fail(f"--set {e}")


def load_run(run_id: str) -> dict[str, Any] | None:
    """The ``runs`` row of a stored run (None when there is none), its tables made known to this process first (its
    method's class registers them: ``tasks.methods.load_run_tables``); every command that reads a run calls this
    before touching them. A run id that cannot be one, or a method not importable here, exits 2."""
    from arbor.paths import arbor_home
    from arbor.storage.runs import check_run_id, run_row
    from arbor.storage.schemas import SchemaError

    try:
        row = run_row(check_run_id(run_id), arbor_home())
    except SchemaError as e:
        _fail(e)
    if row is None:
        return None
    from arbor.tasks.methods import MethodError, load_run_tables

    try:
        load_run_tables(row)
    except MethodError as e:
        _fail(f"run '{run_id}' was stored by a method this process cannot load ({e}); run the command where its "
              "method imports (its folder, or with its package installed)")
    return row


def stored_run(run_id: str) -> dict[str, Any]:
    """``load_run``, refusing a run id that names no stored run."""
    row = load_run(run_id)
    if row is None:
        from arbor.paths import arbor_home

        _fail(f"no run '{run_id}' in {arbor_home()} (`{_me()} runs` lists them)")
    return row
