"""Disk usage per run: Parquet per table, checkpoints, TensorBoard events, reports."""

from __future__ import annotations

import os
from pathlib import Path


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += (Path(root) / f).stat().st_size
            except OSError:  # removed while we walked (retention, atomic renames)
                pass
    return total


def run_disk_usage(run_id: str, home: Path) -> dict[str, int]:
    """Bytes per component of one run (components with nothing on disk are left out)."""
    out: dict[str, int] = {}
    data = home / "data"
    if data.exists():
        for table in sorted(p for p in data.iterdir() if p.is_dir() and not p.name.startswith("_")):
            n = _size(table / f"run_id={run_id}")
            if n:
                out[f"parquet/{table.name}"] = n
    for name in ("checkpoints", "tb", "reports"):
        n = _size(home / name / run_id)
        if n:
            out[name] = n
    return out


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
