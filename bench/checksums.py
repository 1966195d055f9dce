"""What the stage checksums cost (goal: at most 2% of a step).

Trains a short run (default: tiny-world, the rules judge, no SFT), then, per step, times what the checksums add:
hashing every file the step's stages committed (the commit records each file's size and SHA-256) and checking
them again (what a resume's load does), against the step's time (the sum of its stages' wall seconds) measured in the same run.

    python bench/checksums.py                       # tiny-world, 3 steps
    python bench/checksums.py --profile tiny-cpu --steps 2
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="tiny-world")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5, help="hash passes per step (the median is reported)")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="arbor-checksums-"))
    os.environ["ARBOR_HOME"] = str(home)

    from arbor.flows.train import arbor_train
    from arbor.storage.parquet import (
        file_digest,
        read_table,
        stage_marker,
        stage_path,
        stored_stages,
        verify_stage,
    )

    run = "checksums"
    arbor_train(profile=args.profile, run_id=run, overrides={"run.steps": args.steps, "run.sft_warm_start": False,
                                                              "run.eval_every": None})
    walls: dict[int, float] = {}  # a step's time as the sum of its stages' (what the run itself measured; less
    for s in read_table("stage_runs", run_id=run, home=home).to_pylist():  # than its wall: a conservative ratio)
        if int(s["step"]) >= 1 and s.get("wall_seconds") is not None:
            walls[int(s["step"])] = walls.get(int(s["step"]), 0.0) + float(s["wall_seconds"])
    print(f"{'step':>4} {'wall s':>8} {'files':>6} {'MB':>7} {'hash ms':>8} {'verify ms':>9} {'overhead':>9}")
    ratios = []
    for step in sorted(walls):
        stages = [st for s, st in stored_stages(run, home) if s == step]
        paths = [stage_path(t, run_id=run, step=step, stage=st, home=home) for st in stages
                 for t in (stage_marker(run_id=run, step=step, stage=st, home=home) or {}).get("files", {})]
        hashes, verifies = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for p in paths:
                file_digest(p)
            hashes.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for st in stages:
                verify_stage(run_id=run, step=step, stage=st, home=home)
            verifies.append(time.perf_counter() - t0)
        h, v = sorted(hashes)[len(hashes) // 2], sorted(verifies)[len(verifies) // 2]
        size = sum(os.path.getsize(p) for p in paths) / 1e6
        ratios.append((h + v) / walls[step])
        print(f"{step:>4} {walls[step]:>8.2f} {len(paths):>6} {size:>7.2f} {1e3 * h:>8.2f} {1e3 * v:>9.2f} "
              f"{100 * ratios[-1]:>8.3f}%")
    print(f"checksums (commit + resume check) cost {100 * max(ratios):.3f}% of a step at most (goal: <= 2%)")


if __name__ == "__main__":
    main()
