"""Workspace locations. ``ARBOR_HOME`` (default ``./.arbor``) holds everything a run writes (DESIGN §4)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# Where configs/, data/ and sql/ live: inside the package once installed (pyproject.toml's package-dir carries them
# as package data), beside arbor/ in a source checkout.
PROJECT_ROOT = PACKAGE_DIR if (PACKAGE_DIR / "sql").is_dir() else PACKAGE_DIR.parent
DATA_DIR = PROJECT_ROOT / "data"
SQL_DIR = PROJECT_ROOT / "sql"
CONFIGS_DIR = PROJECT_ROOT / "configs"
VLLM_ENV = PROJECT_ROOT / ".venv-vllm"  # vLLM's own environment in a checkout (`make vllm-env`; docs/gpu.md)


def arbor_home() -> Path:
    """The workspace root: ``$ARBOR_HOME`` or ``./.arbor``. Created on demand."""
    home = Path(os.environ.get("ARBOR_HOME", ".arbor")).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home


def resolve_home_path(path: str | Path) -> Path:
    """Profile paths: absolute as given; relative ones live under ``ARBOR_HOME`` (checkpoints, SFT output)."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else arbor_home() / p


def vllm_command(executable: str, vllm_env: Path | None = None) -> str:
    """The ``vllm`` a flow starts for ``cluster.vllm_executable``: as configured, except that the bare name ``vllm``,
    with none on PATH, is the checkout's ``.venv-vllm/bin/vllm`` where ``make vllm-env`` built it, as an absolute
    path (a Prefect worker runs each flow in a directory of its own)."""
    local = (VLLM_ENV if vllm_env is None else vllm_env).resolve() / "bin" / "vllm"
    if executable != "vllm" or shutil.which("vllm") is not None or not (local.is_file() and os.access(local, os.X_OK)):
        return executable
    return str(local)
