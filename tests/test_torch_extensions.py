"""DeepSpeed's CPU shm op is compiled into torch's extension cache; arbor gives each Python environment its own
folder per torch installation there (arbor/__init__.py), so two checkouts do not recompile it for each other."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from arbor import torch_extensions_dir


def test_each_torch_installation_gets_its_own_folder_under_the_users_cache(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    a, b = torch_extensions_dir("/work/a/.venv/lib/python3.11/site-packages/torch", env), torch_extensions_dir("/work/b/.venv/lib/python3.11/site-packages/torch", env)
    assert a != b
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}"
    for d in (a, b):
        assert Path(d).parent == tmp_path / "cache" / "torch_extensions" and Path(d).name.startswith(f"arbor-{tag}-")
    assert torch_extensions_dir("/work/a/.venv/lib/python3.11/site-packages/torch", env) == a  # stable: the next run finds its build
    (tmp_path / "link").symlink_to("/work/a/.venv/lib/python3.11/site-packages/torch")
    assert torch_extensions_dir(str(tmp_path / "link"), env) == a  # the installation, however it is reached
    home = torch_extensions_dir("/work/a/.venv/lib/python3.11/site-packages/torch", {})
    assert home.startswith(os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions", "arbor-"))


def test_importing_arbor_sets_it_and_a_users_value_wins(tmp_path: Path) -> None:
    code = "import os, arbor; print(os.environ['TORCH_EXTENSIONS_DIR'])"
    env = {k: v for k, v in os.environ.items() if k != "TORCH_EXTENSIONS_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    import torch

    assert got.stdout.strip() == torch_extensions_dir(str(Path(torch.__file__).parent), env)
    mine = str(tmp_path / "mine")
    got = subprocess.run([sys.executable, "-c", code], env={**env, "TORCH_EXTENSIONS_DIR": mine},
                         capture_output=True, text=True, check=True)
    assert got.stdout.strip() == mine
