"""Pipeline benchmark (issue 7): per-stage wall time of a tiny step, the rubric machinery's share against rollout +
training, and the cost of resuming a run killed mid-step against the time of the stage that was lost.

    python bench/pipeline.py [--steps 2] [--home bench/out/pipeline]

The workspace keeps the SFT warm start between invocations (content-addressed), so only the first run pays it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MACHINERY = ("score", "retire", "induce", "shape", "consolidate")


def stage_times(run_id: str, home: Path) -> dict[tuple[int, str], float]:
    from arbor.storage.parquet import read_table

    rows = read_table("stage_runs", run_id=run_id, home=home).to_pylist()
    return {(r["step"], r["stage"]): r["wall_seconds"] or 0.0 for r in rows if r["status"] == "completed"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--home", default=str(ROOT / "bench" / "out" / "pipeline"))
    args = ap.parse_args()
    home = Path(args.home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["ARBOR_HOME"] = str(home)
    from arbor.flows.train import arbor_train

    sets = {"run.steps": args.steps}
    rid = f"bench-{int(time.time())}"
    t0 = time.perf_counter()
    arbor_train(profile="tiny-cpu", overrides=sets, run_id=rid)
    total = time.perf_counter() - t0
    times = stage_times(rid, home)
    print(f"\n== per-stage wall time (s), tiny-cpu, {args.steps} steps, total run {total:.1f} s ==")
    stages = ("rollout", "score", "retire", "induce", "shape", "consolidate", "train")
    print("step  " + "  ".join(f"{s:>11}" for s in stages))
    for step in range(1, args.steps + 1):
        print(f"{step:>4}  " + "  ".join(f"{times.get((step, s), 0.0):>11.2f}" for s in stages))
    mach = sum(v for (st, s), v in times.items() if st > 0 and s in MACHINERY)
    base = sum(v for (st, s), v in times.items() if st > 0 and s in ("rollout", "train"))
    print(f"rubric machinery {mach:.2f} s vs rollout + training {base:.2f} s: ratio {mach / max(base, 1e-9):.2f}")

    # Resume cost: kill the process (SIGKILL) when step `steps`' training stage has computed but not committed.
    rid2 = rid + "-killed"
    env = {**os.environ, "ARBOR_FAULT": f"{args.steps}:train:kill"}
    sets_cli = [f"--set=run.steps={args.steps}"]
    t1 = time.perf_counter()
    log = home / f"{rid2}.log"  # a file, not a pipe: children of the killed process may keep a pipe open
    with open(log, "w") as out:
        proc = subprocess.run([sys.executable, "-m", "arbor.cli", "train", "--run-id", rid2, *sets_cli], env=env,
                              stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    killed_after = time.perf_counter() - t1
    assert proc.returncode == -9, log.read_text()[-2000:]
    env.pop("ARBOR_FAULT")
    t2 = time.perf_counter()
    with open(log, "a") as out:
        subprocess.run([sys.executable, "-m", "arbor.cli", "train", "--resume", rid2], env=env, check=True,
                       stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    resume = time.perf_counter() - t2
    lost = times.get((args.steps, "train"), 0.0)
    print(f"\n== resume after SIGKILL in step {args.steps}'s train stage (run took {killed_after:.1f} s to die) ==")
    print(f"resume wall {resume:.1f} s (process start, Prefect, engines, memory rebuild, checkpoint load, redo) "
          f"vs the lost stage {lost:.2f} s: ratio {resume / max(lost, 1e-9):.1f}")


if __name__ == "__main__":
    main()
