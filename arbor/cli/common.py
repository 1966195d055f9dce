"""What the ``arbor`` commands share: the one-line refusal, how the user called us, ``--set`` items."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

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
