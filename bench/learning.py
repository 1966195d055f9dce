"""Learning curves on the synthetic world (issue 12 item 3): every method, several seeds, one SFT start.

    python bench/learning.py                       # grpo dapo arbor no-memory rar x seeds 0 1 2
    python bench/learning.py --quick               # grpo and arbor, one seed, fewer steps: a smoke run
    python bench/learning.py --methods grpo --seeds 0 1 --set run.steps=4

Each (method, seed) is an ordinary ``arbor-train`` run of the ``tiny-world`` profile from the same SFT checkpoint
(trained once, seed 0), on the same batches (``run.seed``) and with held-out evaluation at step 0 and every
``run.eval_every`` steps on questions about entities never seen in SFT or RL. A finished run is reused when the
script is run again (same home), so an interrupted benchmark resumes where it stopped.

Prints the table (mean ± standard error over seeds) and writes ``curves.png`` (one panel per metric, one line per
method with a ±1 SE band) and ``curves.csv`` (every run's per-step figures) under ``--out``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import polars as pl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

METHODS = ("grpo", "dapo", "arbor", "no-memory", "rar")
PROFILE = "tiny-world"
# the measured setting (docs/decisions.md, "Issue 12, session 6"): three times the demo's RL steps, held-out F1
# sampled at the rollout temperature over 4 x 200 answers at steps 0, 15 and 30; any --set overrides these
BENCH_SETS: dict[str, Any] = {"run.steps": 30, "run.eval_every": 15, "run.eval_runs": 4}


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``key=value`` strings (values are parsed as YAML by the config loader, which also names unknown keys)."""
    bad = [s for s in items if "=" not in s]
    if bad:
        raise SystemExit(f"--set {bad[0]}: expected key=value")
    return dict(s.split("=", 1) for s in items)


def settings_tag(sets: dict[str, Any]) -> str:
    """Six hex digits naming the overrides, so a run is only reused under the same settings."""
    return hashlib.sha256(json.dumps(sets, sort_keys=True, default=str).encode()).hexdigest()[:6]


def completed(run_id: str, home: Path) -> bool:
    from arbor.storage.parquet import read_stage

    rows = read_stage("stage_runs", run_id=run_id, step=0, stage="run", home=home) or []
    return any(r["status"] == "completed" for r in rows)


def run_one(method: str, seed: int, start: Path, sets: dict[str, Any], home: Path) -> tuple[str, float]:
    """Train (or reuse) one run; (run id, wall seconds, 0 when reused)."""
    from arbor.flows.train import arbor_train
    from arbor.storage.runs import run_row

    rid = f"learn-{method}-s{seed}-{settings_tag(sets)}"
    row = run_row(rid, home)
    if row is not None and completed(rid, home):
        return rid, 0.0
    t0 = time.perf_counter()
    overrides = {**sets, "run.method": method, "run.seed": seed, "run.sft_warm_start": False,
                 "run.start_checkpoint": str(start)}
    arbor_train(profile=PROFILE, overrides=overrides, run_id=rid, resume=row is not None)
    return rid, time.perf_counter() - t0


def table(rows: pl.DataFrame, methods: list[str]) -> str:
    from arbor.tasks.curves import mean_se, rises_by, start_final_delta

    f1 = start_final_delta(rows, "strict_f1")
    em = start_final_delta(rows, "strict_em")
    vf1 = start_final_delta(rows, "valid_f1")
    head = ["method", "seeds", "F1 start", "F1 final", "ΔF1", "≥3 SE", "EM final", "F1 valid-only final",
            "train R_base first→last", "train valid", "zero-var base→total", "searches", "repeat (all-correct)"]
    body = []
    for m in methods:
        mine = rows.filter(pl.col("method") == m)
        if mine.is_empty() or m not in f1:
            continue
        s0, s1, d = f1[m]
        steps = mine.drop_nulls("mean_base_reward")["step"]
        first, last = (mean_se(mine.filter(pl.col("step") == at)["mean_base_reward"]) if len(steps) else None
                       for at in (steps.min(), steps.max()))
        body.append([
            m, str(d.n), str(s0), str(s1), f"{d.mean:+.3f} ± {d.se:.3f}", "yes" if rises_by(d) else "no", str(em[m][1]) if m in em else "-",
            str(vf1[m][1]) if m in vf1 else "-", f"{first.mean:.3f} → {last.mean:.3f}" if first and last else "-",
            _avg(mine, "format_valid_rate"), f"{_avg(mine, 'zero_var_base')} → {_avg(mine, 'zero_var_total')}",
            _avg(mine, "mean_searches"), _avg(mine, "repeated_query_share_all_correct"),
        ])
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *(line(b) for b in body)])


def _avg(rows: pl.DataFrame, key: str) -> str:
    from arbor.tasks.curves import mean_se

    ms = mean_se(rows[key])
    return "-" if ms is None else f"{ms.mean:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", nargs="+", default=None, choices=METHODS)
    ap.add_argument("--seeds", nargs="+", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="grpo and arbor, seed 0, 4 steps")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="override a tiny-world key: k=v")
    ap.add_argument("--home", default=str(ROOT / "bench" / "out" / "learning"), help="workspace (runs are reused)")
    ap.add_argument("--out", default=None, help="where curves.png / curves.csv go (default: --home)")
    args = ap.parse_args(argv)
    methods = args.methods or (["grpo", "arbor"] if args.quick else list(METHODS))
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    sets = {**BENCH_SETS, **({"run.steps": 4, "run.eval_every": 4} if args.quick else {}), **parse_sets(args.sets)}
    home = Path(args.home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    out = Path(args.out).resolve() if args.out else home
    out.mkdir(parents=True, exist_ok=True)
    os.environ["ARBOR_HOME"] = str(home)

    from arbor.config import load_config
    from arbor.flows.sft import sft_checkpoint
    from arbor.tasks.curves import collect_curve_rows, plot_curves, rises_by, start_final_delta

    cfg = load_config(PROFILE, {k: v for k, v in sets.items() if not k.startswith("run.")})
    t0 = time.perf_counter()
    start = sft_checkpoint(cfg, home)  # one SFT start (seed 0) for every method and seed
    print(f"SFT start {start} ({time.perf_counter() - t0:.0f} s)", flush=True)
    run_ids: dict[str, tuple[str, int]] = {}
    walls: list[tuple[str, int, float]] = []
    for seed in seeds:
        for m in methods:
            rid, wall = run_one(m, seed, start, sets, home)
            run_ids[rid] = (m, seed)
            walls.append((m, seed, wall))
            print(f"{rid}: {'reused' if wall == 0 else f'{wall:.0f} s'}", flush=True)
    rows = collect_curve_rows(run_ids, home)
    rows.write_csv(out / "curves.csv")
    plot_curves(rows, methods, out / "curves.png")
    print("\n" + table(rows, methods))
    ran = [x for _, _, x in walls if x > 0]
    if ran:
        print(f"\nwall time per run: mean {sum(ran) / len(ran):.0f} s, max {max(ran):.0f} s ({len(ran)} runs)")
    print(f"curves: {out / 'curves.png'}  per-step figures: {out / 'curves.csv'}")
    f1 = start_final_delta(rows, "strict_f1")
    for m in ("grpo", "arbor"):
        if m in f1:
            d = f1[m][2]
            print(f"{m}: held-out F1 {f1[m][0]} -> {f1[m][1]} (change {d.mean:+.3f} ± {d.se:.3f}, "
                  f"{'at least' if rises_by(d) else 'less than'} 3 SE over {d.n} seed(s))")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
