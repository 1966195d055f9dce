"""Workspace locations. ``ARBOR_HOME`` (default ``./.arbor``) holds everything a run writes (docs/architecture.md)."""

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


def arbor_home(create: bool = True) -> Path:
    """The workspace root: ``$ARBOR_HOME`` or ``./.arbor``. Created on demand (unless ``create`` is False)."""
    home = Path(os.environ.get("ARBOR_HOME", ".arbor")).expanduser().resolve()
    if create:
        home.mkdir(parents=True, exist_ok=True)
    return home


def home_problem(home: Path, *, writes: bool) -> str | None:
    """Why ``home`` cannot be the workspace of a command (None: it can): a file, a folder under a file, one that
    cannot be made, or one this process may not write. A command that only reads (``writes`` False) may read a
    folder it cannot write once that holds a catalog (a read-only copy of a workspace)."""
    if os.path.exists(home) and not os.path.isdir(home):
        return f"ARBOR_HOME={home} is a file, not a folder: point ARBOR_HOME at a folder (it is created if missing)"
    if not os.path.isdir(home):
        above = next(p for p in Path(os.path.abspath(home)).parents if os.path.exists(p))
        if not os.path.isdir(above):
            return (f"ARBOR_HOME={home} lies under {above}, a file: point ARBOR_HOME at a folder (it is created if "
                    "missing)")
        if not os.access(above, os.W_OK | os.X_OK):
            return (f"ARBOR_HOME={home} does not exist and cannot be made: {above} is not writable here; point "
                    "ARBOR_HOME at a folder you can write")
        return None
    if os.access(home, os.W_OK | os.X_OK):
        return None
    if writes:
        return f"ARBOR_HOME={home} is not writable here (a read-only workspace?): runs store every stage under it"
    if not os.path.exists(os.path.join(home, "catalog.duckdb")):
        return (f"ARBOR_HOME={home} is not writable here and holds no catalog (catalog.duckdb) to read: point "
                "ARBOR_HOME at a workspace or a folder you can write")
    return None


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
