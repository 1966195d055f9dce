"""Pipeline benchmark.

    python bench/pipeline.py [--steps 3] [--home bench/out/pipeline] [--start-checkpoint PATH]   # schedules
    python bench/pipeline.py --stages [--steps 2]                                                 # stages, resume

Schedules: the world profile (tiny-world) against the local OpenAI-compatible judge in its own process,
200 ms a call, judge.concurrency 32, the same seed three times: serial (``run.stream_judging=false``), streamed
(the default) and one-step (streamed + ``run.overlap=one-step``). Per step, from the run's own records:

    rollout   the rollout stage's wall time
    judge     the time the judge was busy with the step: the union of [arrival, arrival + 200 ms] of its requests
    pre-train the step's wall time from its rollout's start to the end of its judging (consolidate)
    period    from the previous step's training end to this step's (the step's share of the run's wall time)

and the ratios pre-train / max(rollout, judge) and pre-train / (rollout + judge); over the run: the idle share of
the rollout engine (1 - rollout seconds / run wall) and of the trainer (1 - train seconds / run wall).

``--stages``: per-stage wall time of a tiny step, the rubric machinery's share against rollout +
training, and the cost of resuming a run killed mid-step against the time of the stage that was lost.

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


SCHEDULES = {"serial": {"run.stream_judging": False}, "streamed": {}, "one-step": {"run.overlap": "one-step"}}
LATENCY_S = 0.2


def busy_seconds(starts: list[float], width: float) -> float:
    """Length of the union of the intervals [t, t + width]."""
    total, end = 0.0, float("-inf")
    for t in sorted(starts):
        total += min(width, t + width - end) if t < end else width
        end = max(end, t + width)
    return total


def schedules(args: argparse.Namespace, home: Path) -> None:
    import json
    import urllib.request

    from arbor.flows.train import arbor_train
    from arbor.storage.parquet import read_table

    sys.path.insert(0, str(ROOT / "tests"))
    from openai_server import start_server_process

    base: dict[str, object] = {"run.steps": args.steps, "run.eval_every": None, "judge.backend": "openai",
                               "judge.model": "bench-judge", "judge.concurrency": 32, "judge.api_key_env": "ARBOR_BENCH_JUDGE_KEY",
                               "checkpoint.every": args.steps}
    if args.start_checkpoint:
        base |= {"run.start_checkpoint": args.start_checkpoint, "run.sft_warm_start": False}
    os.environ.setdefault("ARBOR_BENCH_JUDGE_KEY", "bench-key")  # the local server takes any key
    rows = []
    for name, sets in SCHEDULES.items():
        proc, url = start_server_process(latency_s=LATENCY_S)
        sched_home = home / f"{name}-{int(time.time())}"  # its own judge cache: every call reaches the judge
        os.environ["ARBOR_HOME"] = str(sched_home)
        try:
            rid = f"sched-{name}"
            t0 = time.time()
            arbor_train(profile="tiny-world", overrides={**base, **sets, "judge.base_url": url}, run_id=rid)
            t1 = time.time()
            with urllib.request.urlopen(url.removesuffix("/v1") + "/_arbor/counts") as r:
                arrivals = [t for t, _role in json.loads(r.read())["arrivals"]]
        finally:
            proc.terminate()
            proc.wait()
        runs = {(r["step"], r["stage"]): r for r in read_table("stage_runs", run_id=rid, home=sched_home).to_pylist()
                if r["status"] == "completed"}
        roll_total = train_total = 0.0
        last_end = runs[(1, "rollout")]["started_at"].timestamp()
        for step in range(1, args.steps + 1):
            ro, co, tr = runs[(step, "rollout")], runs[(step, "consolidate")], runs[(step, "train")]
            start, end = ro["started_at"].timestamp(), co["finished_at"].timestamp()
            rollout = ro["wall_seconds"]
            judge = busy_seconds([t for t in arrivals if start <= t <= end], LATENCY_S)
            pre = end - start
            roll_total += rollout
            train_total += tr["wall_seconds"]
            period, last_end = tr["finished_at"].timestamp() - last_end, tr["finished_at"].timestamp()
            rows.append((name, step, rollout, judge, pre, tr["wall_seconds"], period, pre / max(rollout, judge),
                         pre / (rollout + judge)))
        wall = t1 - t0
        print(f"{name}: run wall {wall:.1f} s, rollout engine idle {1 - roll_total / wall:.0%}, "
              f"trainer idle {1 - train_total / wall:.0%}", flush=True)
    print(f"\n== tiny-world, judge {LATENCY_S * 1000:.0f} ms a call, concurrency 32, {args.steps} steps ==")
    print(f"{'schedule':<9} {'step':>4} {'rollout s':>9} {'judge s':>8} {'pre-train s':>11} {'train s':>8} "
          f"{'period s':>8} {'pre/max(r,j)':>12} {'pre/(r+j)':>9}")
    for name, step, rollout, judge, pre, train, period, r_max, r_sum in rows:
        print(f"{name:<9} {step:>4} {rollout:>9.2f} {judge:>8.2f} {pre:>11.2f} {train:>8.2f} {period:>8.2f} "
              f"{r_max:>12.2f} {r_sum:>9.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--home", default=str(ROOT / "bench" / "out" / "pipeline"))
    ap.add_argument("--start-checkpoint", default=None, help="an SFT checkpoint of tiny-world (else: trained once)")
    ap.add_argument("--stages", action="store_true", help="the per-stage and resume benchmark")
    args = ap.parse_args()
    home = Path(args.home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["ARBOR_HOME"] = str(home)
    if not args.stages:
        schedules(args, home)
        return
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
