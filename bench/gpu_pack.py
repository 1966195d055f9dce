"""The folder a device run carries for ``make gpu-check``.

The GPU machine's image has Python 3.12, torch, transformers, accelerate, peft, safetensors, numpy and pandas, but
not DeepSpeed, pydantic (and its three helpers), hjson, dill, bm25s or DuckDB, and it has no network. This builds,
under 50 MiB (the device tool carries 64 MiB per call):

- the project's own wheel (``pip wheel --no-deps`` of this working tree: arbor.* lives in top-level folders mapped
  by ``package-dir``, so the source tree cannot be imported as is);
- DeepSpeed built from its sdist with ``DS_BUILD_OPS=0`` (it publishes no wheel; the ops are JIT-built if needed);
- cp312 manylinux wheels of the rest, at the versions of ``constraints.txt`` (what CI runs).

``manifest.json`` lists every file with its size and sha256; the device side unpacks the wheels into a site folder
(``unpack``: a wheel is a zip, so this needs no pip there) and puts it first on ``PYTHONPATH``.

    python bench/gpu_pack.py build [--dest bench/out/gpu-pack]     # what `make gpu-check` runs
    python bench/gpu_pack.py plan                                  # the plan only (no network)
    python3 bench/gpu_pack.py unpack bench/out/gpu-pack /tmp/arbor-site   # on the device (stdlib only)

Standard library only: the device side runs it before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEST = ROOT / "bench" / "out" / "gpu-pack"  # bench/out/ is git-ignored: the device call must name it in `carry`
LIMIT_BYTES = 50 * 2**20
DEVICE_SITE = "/tmp/arbor-site"
DEVICE_PYTHON = "3.12"
# the image is glibc 2.39 (Ubuntu 24.04's Python 3.12.3); DuckDB 2 publishes manylinux_2_27/2_28 wheels only
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_28_x86_64")
# What importing the trainer path (DeepSpeed, arbor.config, arbor.tasks.training, the rollout bench) and one ARBOR
# step (the stage store's catalog: DuckDB, 24 MB) need and the device image lacks. typing_extensions is in the image
# (torch's), but pydantic_core wants a newer one.
BINARY = ("pydantic", "pydantic_core", "annotated-types", "typing-inspection", "typing_extensions", "hjson", "dill",
          "bm25s", "duckdb")
DEEPSPEED = "deepspeed"


@dataclass(frozen=True)
class Item:
    """One thing to put in the folder: ``kind`` is ``project`` (this tree's wheel), ``sdist`` (a wheel built here
    from the registry's sdist) or ``binary`` (a cp312 manylinux / pure-Python wheel downloaded as is)."""

    kind: str
    name: str
    version: str | None = None

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}" if self.version else self.name


def norm(name: str) -> str:
    """PEP 503 normalised name (``pydantic_core`` == ``pydantic-core``)."""
    return name.lower().replace("_", "-").replace(".", "-")


def read_constraints(path: Path) -> dict[str, str]:
    """``name==version`` pins of a constraints file, by normalised name."""
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line and not line.startswith("-"):
            name, version = line.split("==", 1)
            pins[norm(name.split("[", 1)[0])] = version.split(";", 1)[0].strip()
    return pins


def plan(constraints: dict[str, str]) -> list[Item]:
    """What the folder holds, pinned to ``constraints`` (every name must be pinned: the device has no resolver)."""
    missing = [n for n in (DEEPSPEED, *BINARY) if norm(n) not in constraints]
    if missing:
        raise ValueError(f"not pinned in constraints.txt: {', '.join(missing)}")
    items = [Item("project", "arbor-rl"), Item("sdist", DEEPSPEED, constraints[DEEPSPEED])]
    items += [Item("binary", n, constraints[norm(n)]) for n in BINARY]
    return items


def commands(item: Item, dest: Path, python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """The pip command (and extra environment) that puts ``item``'s wheel into ``dest``."""
    pip = [python, "-m", "pip", "-q", "--disable-pip-version-check"]
    if item.kind == "project":
        return [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dest), str(ROOT)], {}
    if item.kind == "sdist":
        # DS_BUILD_OPS=0: no op compiled at build time (a ~2 MB py3 wheel whose recorded accelerator is "cpu";
        # the device run sets DS_ACCELERATOR=cuda)
        return ([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-binary", item.name, "-w", str(dest),
                 item.spec], {"DS_BUILD_OPS": "0"})
    if item.kind == "binary":
        plats = [a for p in PLATFORMS for a in ("--platform", p)]
        return ([*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", DEVICE_PYTHON,
                 "--implementation", "cp", *plats, "-d", str(dest), item.spec], {})
    raise ValueError(f"unknown item kind {item.kind!r}")


SOURCE_DIRS = ("arbor", "flows", "tasks", "storage", "llm", "sql", "configs")  # pyproject's package-dir


def source_hash(root: Path = ROOT) -> str:
    """sha256 over the project's Python and config sources (paths and contents): the wheel's origin, so that the
    device run can tell a stale wheel (built before the tree last changed) from a current one."""
    h = hashlib.sha256()
    for d in SOURCE_DIRS:
        for p in sorted((root / d).rglob("*")):
            if p.is_file() and p.suffix in (".py", ".yaml", ".json", ".sql") and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def wheel_name(filename: str) -> str:
    """The normalised distribution name of a wheel file (its first dash-separated field)."""
    return norm(filename.split("-", 1)[0])


def wheel_matches(filename: str, item: Item) -> bool:
    """Whether ``filename`` is ``item``'s wheel (name and, when pinned, version)."""
    parts = filename.split("-")
    if len(parts) < 5 or not filename.endswith(".whl") or wheel_name(filename) != norm(item.name):
        return False
    return item.version is None or parts[1] == item.version


def manifest(dest: Path, items: list[Item], limit: int = LIMIT_BYTES) -> dict:
    """Every file in ``dest`` (size, sha256), the item each one came from, the total against ``limit``. Raises if
    an item has no wheel, a wheel matches no item, or the total is over the limit."""
    files = sorted(p for p in dest.iterdir() if p.is_file() and p.name != "manifest.json")
    rows = []
    for p in files:
        owner = [it for it in items if wheel_matches(p.name, it)]
        if not owner:
            raise ValueError(f"{p.name}: in {dest} but not in the plan (stale file?)")
        rows.append(dict(file=p.name, item=owner[0].spec, bytes=p.stat().st_size,
                         sha256=hashlib.sha256(p.read_bytes()).hexdigest()))
    for it in items:
        if not any(wheel_matches(r["file"], it) for r in rows):
            raise ValueError(f"{it.spec}: no wheel in {dest}")
    total = sum(r["bytes"] for r in rows)
    if total > limit:
        raise ValueError(f"{dest}: {total / 2**20:.1f} MiB, over the {limit / 2**20:.0f} MiB limit")
    return dict(files=rows, total_bytes=total, limit_bytes=limit, items=[asdict(i) for i in items],
                python=DEVICE_PYTHON, platforms=list(PLATFORMS), source_hash=source_hash())


def build(dest: Path, constraints_file: Path = ROOT / "constraints.txt") -> dict:
    """Build (or refresh) the folder: the project wheel always anew, the others only when absent."""
    items = plan(read_constraints(constraints_file))
    dest.mkdir(parents=True, exist_ok=True)
    for p in dest.iterdir():  # drop stale files: an older project wheel, versions no longer pinned
        if p.is_file() and (p.name == "manifest.json" or not any(
                wheel_matches(p.name, it) and it.kind != "project" for it in items)):
            p.unlink()
    for it in items:
        if it.kind != "project" and any(wheel_matches(p.name, it) for p in dest.iterdir()):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            cmd, env = commands(it, Path(tmp))
            print(f"gpu-pack: {it.kind} {it.spec}", flush=True)
            subprocess.run(cmd, check=True, env={**os.environ, **env}, cwd=tmp)
            for w in Path(tmp).glob("*.whl"):
                shutil.move(str(w), dest / w.name)
    m = manifest(dest, items)
    (dest / "manifest.json").write_text(json.dumps(m, indent=1))
    return m


def unpack(src: Path, site: Path) -> list[str]:
    """Install every wheel of ``src`` into ``site`` by unzipping it (what ``pip install --target`` does for these
    wheels, minus scripts); returns the wheels' names. Run on the device with the image's python3."""
    site.mkdir(parents=True, exist_ok=True)
    names = []
    for w in sorted(src.glob("*.whl")):
        with zipfile.ZipFile(w) as z:
            z.extractall(site)
        names.append(w.name)
    return names


def device_command(dest: Path = DEST, budget_s: int = 300) -> str:
    """The one command for the device tool (run in the repository root; $OUT comes back)."""
    rel = dest.resolve().relative_to(ROOT)
    return (f"python3 bench/gpu_pack.py unpack {rel} {DEVICE_SITE} >/dev/null && "
            f"PYTHONPATH={DEVICE_SITE} DS_ACCELERATOR=cuda HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false "
            f"python3 bench/gpu_check.py --out \"$OUT\" --budget {budget_s}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the folder and print the device command")
    b.add_argument("--dest", type=Path, default=DEST)
    b.add_argument("--budget", type=int, default=300, help="gpu_check.py's total budget in seconds")
    sub.add_parser("plan", help="print the plan (no network)")
    u = sub.add_parser("unpack", help="(device) unzip the folder's wheels into a site folder")
    u.add_argument("src", type=Path)
    u.add_argument("site", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "plan":
        for it in plan(read_constraints(ROOT / "constraints.txt")):
            print(f"{it.kind:8} {it.spec}")
        return 0
    if args.cmd == "unpack":
        print("\n".join(unpack(args.src, args.site)))
        return 0
    m = build(args.dest)
    rel = args.dest.resolve().relative_to(ROOT)
    for r in m["files"]:
        print(f"  {r['bytes'] / 2**20:6.2f} MiB  {r['file']}")
    print(f"gpu-pack: {rel}: {m['total_bytes'] / 2**20:.1f} MiB (limit {m['limit_bytes'] / 2**20:.0f} MiB)")
    cmd = device_command(args.dest, args.budget)
    print("\nrun on the device (tool `run`, kind nvidia-h200 or nvidia-h100-x1, timeout_s 600):")
    print(f"  carry:   [\"{rel}\"]")
    print(f"  command: {cmd}")
    print("results come back under $OUT: gpu_check.txt (the table), gpu_check.json, gpu_check.log")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
