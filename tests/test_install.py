"""One installable namespace: ``pip install .`` (a wheel, not editable) into a fresh virtual
environment, then ``arbor demo`` from another directory. Configs, world data, SQL and prompts must all come from
the installed package, and every module must import as ``arbor.*``.

The fresh environment gets arbor's dependencies by pointing a ``.pth`` line at this environment's site-packages
(installing torch and DeepSpeed again would take minutes and gigabytes); ``.pth`` lines are plain path entries, so
the editable finder that this checkout's ``make setup`` installed there is never run, and the checkout itself is not
on the path: the test asserts that the code which ran came from the wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from arbor.paths import PROJECT_ROOT

# the demo at its smallest: a short SFT, one RL step, a few held-out questions (what is tested is the install)
DEMO_SETS = ["sft.questions=120", "sft.epochs=1", "run.steps=1", "run.eval_every=1", "run.eval_size=8",
             "rollout.k=2", "rollout.batch_size=2"]


def _only(paths: list[Path]) -> Path:
    assert len(paths) == 1, paths
    return paths[0]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # built from a copy: setuptools' build/ folder would otherwise carry stale files from earlier builds into it
    src = tmp_path_factory.mktemp("src") / "arbor"
    shutil.copytree(PROJECT_ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", ".arbor", "__pycache__", "out", ".*_cache", ".hypothesis"))
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(src)], check=True, capture_output=True, timeout=300)
    return _only(sorted(dist.glob("arbor_rl-*.whl")))


def test_wheel_holds_one_namespace_and_its_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"arbor"}, tops  # no top-level tasks/, flows/, storage/ or llm/ to collide with a user's
    for src, packaged in [("tasks", "arbor/tasks"), ("flows", "arbor/flows"), ("storage", "arbor/storage"),
                          ("llm", "arbor/llm"), ("sql", "arbor/sql"), ("configs", "arbor/configs"), ("data", "arbor/data")]:
        source = PROJECT_ROOT / src  # every file of every folder: a subpackage missing from pyproject's list fails
        files = [p for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        missing = [str(p.relative_to(PROJECT_ROOT)) for p in files
                   if f"{packaged}{str(p)[len(str(source)):]}" not in names]
        assert not missing, f"not in the wheel: {missing[:5]}"
    entry_points = _only([n for n in names if n.endswith(".dist-info/entry_points.txt")])
    assert "world = arbor.tasks.env.world:SOURCE" in zipfile.ZipFile(wheel).read(entry_points).decode()  # tasks.env.sources


@pytest.mark.slow
def test_installed_wheel_runs_the_demo_from_another_directory(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=120)
    python = venv / "bin" / "python"
    # install first, while the fresh environment sees nothing else (pip must not touch this checkout's install)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    site = _only(sorted(venv.glob("lib/python*/site-packages")))
    (site / "zz_arbor_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PREFECT_API_URL", "ARBOR_HOME")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PYTHONNOUSERSITE="1", ARBOR_HOME=str(elsewhere / ".arbor"))
    where = subprocess.run([str(python), "-c", "import arbor.paths, arbor.tasks.training.losses as l, arbor.flows.train as f; "
                            "print(arbor.paths.PROJECT_ROOT, l.__file__, f.__file__, sep='\\n')"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert where.returncode == 0, where.stderr[-3000:]
    for line in where.stdout.split():
        assert line.startswith(str(site)) and not line.startswith(str(PROJECT_ROOT)), where.stdout

    op = Path(os.environ["TORCH_EXTENSIONS_DIR"]) / "deepspeed_shm_comm" / "deepspeed_shm_comm.so"  # built at set-up
    built = op.stat().st_mtime_ns if op.exists() else None
    sets = [a for s in DEMO_SETS for a in ("--set", s)]
    proc = subprocess.run([str(venv / "bin" / "arbor"), "demo", *sets], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "held-out F1" in proc.stdout and "Table 2 for this run" in proc.stdout, proc.stdout[-3000:]
    assert list((elsewhere / ".arbor").glob("catalog.duckdb")), "the demo's workspace is under the new directory"
    assert "policy: " in proc.stdout and "/checkpoints/" in proc.stdout  # where the trained model is
    # the op built at set-up is reused: the environment borrows this one's ninja too (a system ninja rebuilt it, and
    # the next run here rebuilt it back: 60-90 s each)
    assert built is None or op.stat().st_mtime_ns == built
    out = proc.stdout + proc.stderr  # the quiet default: none of the libraries' own chatter
    for noise in ("Loading weights", "Setting accelerator to CPU", "built successfully", "temporary server",
                  "FutureWarning", "| DEBUG", "Finished in state Completed()"):
        assert noise not in out, (noise, out[-3000:])


def test_own_extras_name_this_distribution() -> None:
    """An extra that pulls in another extra of this project must use the distribution name (``arbor-rl[...]``):
    ``arbor[...]`` names an unrelated PyPI project, which pip would install without complaint."""
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    name = project["name"]
    for extra, reqs in project["optional-dependencies"].items():
        for req in reqs:
            base = req.split("[", 1)[0].split(">", 1)[0].split("=", 1)[0].split("<", 1)[0].strip()
            assert base == name or not base.startswith("arbor"), f"extra {extra!r}: {req!r} is not {name}"
