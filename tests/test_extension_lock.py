"""DeepSpeed's shm op is loaded under an OS lock of arbor's torch extension cache (tasks.training.engine
extension_lock): torch's own marker file, left behind by a process killed while it loaded the op, made every
later run wait forever in ``deepspeed.initialize``."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from arbor.tasks.training.engine import extension_lock, ninja_bin_dir, ninja_first

HOLD = ("import sys; from arbor.tasks.training.engine import extension_lock\n"
        "with extension_lock(sys.argv[1]):\n    print('held', flush=True); sys.stdin.read()\n")


def _locked(root: Path) -> bool:
    with open(root / "arbor.lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def test_a_killed_holder_releases_the_lock_and_its_stale_marker_is_removed(tmp_path: Path) -> None:
    root = tmp_path / "arbor-py311-test"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert _locked(root)
        (root / "deepspeed_shm_comm").mkdir()
        (root / "deepspeed_shm_comm" / "lock").touch()  # torch's marker, as a process killed mid-load leaves it
    finally:
        holder.kill()  # SIGKILL: no clean-up runs; the kernel drops the flock
        holder.wait(timeout=60)
    assert not _locked(root)
    with extension_lock(str(root)) as stale:
        assert stale == [str(root / "deepspeed_shm_comm" / "lock")]
    assert not (root / "deepspeed_shm_comm" / "lock").exists()


def test_a_cache_the_user_named_is_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "my-extensions"
    (root / "op").mkdir(parents=True)
    (root / "op" / "lock").touch()  # maybe another program's build in progress
    with extension_lock(str(root)) as stale:
        assert stale == []
    assert (root / "op" / "lock").exists() and not (root / "arbor.lock").exists()


@pytest.mark.slow
def test_the_op_loads_past_a_marker_a_killed_run_left(tmp_path: Path) -> None:
    """The real op, from a copy of this environment's built cache with torch's marker left in it: loading returns
    (before: it waited forever, here bounded by the timeout)."""
    built = Path(os.environ["TORCH_EXTENSIONS_DIR"])
    root = tmp_path / built.name
    if (built / "deepspeed_shm_comm").is_dir():
        shutil.copytree(built / "deepspeed_shm_comm", root / "deepspeed_shm_comm")  # mtimes kept: up to date
    (root / "deepspeed_shm_comm").mkdir(parents=True, exist_ok=True)
    (root / "deepspeed_shm_comm" / "lock").touch()
    code = "from arbor.tasks.training.engine import prebuild_deepspeed_ops; print(prebuild_deepspeed_ops())"
    got = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TORCH_EXTENSIONS_DIR": str(root)},
                         capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr[-2000:]
    assert "shm" in got.stdout and not (root / "deepspeed_shm_comm" / "lock").exists()


def test_the_packages_ninja_comes_first_on_the_path() -> None:
    import ninja

    mine = ninja_bin_dir()
    version = subprocess.run([str(Path(mine) / "ninja"), "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith(ninja.__version__.split("+")[0][:4])  # the package's own binary (1.13, not 1.11)
    assert ninja_first(os.pathsep.join(["/usr/bin", mine, "/bin"])) == os.pathsep.join([mine, "/usr/bin", "/bin"])
    assert ninja_first("/usr/bin") == os.pathsep.join([mine, "/usr/bin"])
    got = shutil.which("ninja", path=ninja_first("/usr/bin:/bin"))
    assert got is not None and Path(got).parent == Path(mine)


def test_the_packages_ninja_is_found_from_an_environment_that_borrows_it(tmp_path: Path) -> None:
    """A venv reaching this one's packages through a ``.pth`` line (tests/test_install.py's layout): the ninja
    package's ``BIN_DIR`` is "" there (it looks in the running interpreter's scripts folder), ``ninja_bin_dir`` still
    names this environment's binary, so a run there builds with the same ninja (it used the system's and
    rebuilt the op twice)."""
    import inspect
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=120)
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "zz_borrow.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = tmp_path / "probe.py"  # ninja_bin_dir's own source: the real function, without importing torch there
    probe.write_text("import os\nfrom pathlib import Path\n\n" + inspect.getsource(ninja_bin_dir)
                     + "\nimport ninja\nprint(repr(ninja.BIN_DIR))\nprint(ninja_bin_dir())\n")
    got = subprocess.run([str(venv / "bin" / "python"), str(probe)], env={**os.environ, "PYTHONNOUSERSITE": "1"},
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr[-2000:]
    bin_dir, found = got.stdout.split("\n")[:2]
    assert bin_dir == "''"  # the package's own lookup fails there
    assert found == ninja_bin_dir()

