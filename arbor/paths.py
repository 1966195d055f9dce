"""Workspace locations. ``ARBOR_HOME`` (default ``./.arbor``) holds everything a run writes (DESIGN §4)."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# Where configs/, data/ and sql/ live: inside the package once installed (pyproject.toml's package-dir carries them
# as package data), beside arbor/ in a source checkout.
PROJECT_ROOT = PACKAGE_DIR if (PACKAGE_DIR / "sql").is_dir() else PACKAGE_DIR.parent
DATA_DIR = PROJECT_ROOT / "data"
SQL_DIR = PROJECT_ROOT / "sql"
CONFIGS_DIR = PROJECT_ROOT / "configs"


def arbor_home(create: bool = True) -> Path:
    """The workspace root: ``$ARBOR_HOME`` or ``./.arbor``. Created on demand (unless ``create`` is False)."""
    home = Path(os.environ.get("ARBOR_HOME", ".arbor")).expanduser().resolve()
    if create:
        home.mkdir(parents=True, exist_ok=True)
    return home


def resolve_home_path(path: str | Path) -> Path:
    """Profile paths: absolute as given; relative ones live under ``ARBOR_HOME`` (checkpoints, SFT output)."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else arbor_home() / p
