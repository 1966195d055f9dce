"""Co-ReAct on the synthetic world: guided against unguided held-out answers, per checkpoint and source.

    python bench/guidance.py --checkpoint sft=DIR --checkpoint rl-s0=DIR ... --pool POOL.json --generator DIR

Every (checkpoint, seed, source) is one ``arbor eval`` of the ``--profile`` (``tiny-world``, or ``smol-world``:
SmolLM2-135M-Instruct, a policy that reads instructions) on ``world:eval``: the same
questions and seeds answered unguided, then under Co-ReAct guidance (inject, verify, retry) with the
source's step rubrics, both under the paper's inference protocol (a greedy agent, so seeds of one
checkpoint agree; ``--set guidance.agent_temperature=null`` samples at the profile's temperature instead): ``judge`` (the rules judge's prompt-only writer), ``memory`` (an ARBOR run's exported
common pool, ``--pool``) and ``generator`` (a trained generator, ``--generator``). A checkpoint named ``X-sN`` is
one training seed N of X and is evaluated with seed N; any other is evaluated with every ``--seeds`` seed.

Prints, per checkpoint kind and source, the mean over seeds (± standard error) of strict F1 unguided and guided,
their difference and its paired standard error over questions (one seed's noise: a greedy agent makes seeds agree),
the valid rates, the share of guided turns failing verification and the extra judge calls per
guided answer; writes every evaluation's figures to ``--out``/guidance.csv.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SOURCES = ("judge", "memory", "generator")
# guidance text needs context room: the rubric lands in the prompt and in the result blocks (it counts against the
# context budget, not the response budget, now; the budgets are equal for the unguided answers)
ROOM: dict[str, Any] = {"rollout.max_response_tokens": 768, "rollout.max_context_tokens": 1280}


def stats(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    se = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs)) if len(xs) > 1 else float("nan")
    return m, se


def one(name: str, checkpoint: str, seed: int, source: str, args: argparse.Namespace) -> dict[str, Any]:
    """One guided evaluation: unguided and guided figures of the same answers' questions."""
    from arbor.flows.evaluate import paired_difference, run_eval
    from arbor.paths import arbor_home
    from arbor.storage.sql import run_file

    o: dict[str, Any] = {**ROOM, **dict(kv.split("=", 1) for kv in args.sets), "run.seed": seed,
                         "guidance.mode": "co-react", "guidance.source": source}
    if source == "memory":
        o["guidance.memory_pool"] = args.pool
    if source == "generator":
        o["guidance.generator"] = args.generator
    prefix = "guided" if args.profile == "tiny-world" else f"guided-{args.profile}"
    rid, _ = run_eval(checkpoint, args.profile, o, ["world:eval"], args.runs, args.limit,
                      run_id=f"{prefix}-{name}-seed{seed}-{source}")
    home = arbor_home()
    by = {r["guidance"]: r for r in run_file("guided_eval_of_run", {"run_id": rid}, home=home)}
    turns = run_file("guided_turns_of_run", {"run_id": rid}, home=home)[0]
    tag = next(g for g in by if g.startswith(f"co-react:{source}"))  # ":inject" when guidance.verify is false
    off, on = by["off"], by[tag]
    return {"run_id": rid, "f1_off": off["strict_f1"], "f1_on": on["strict_f1"], "valid_off": off["valid_rate"],
            "valid_on": on["valid_rate"], "fail_rate": turns["fail_rate"], "calls": turns["judge_calls_per_answer"],
            "se_paired": paired_difference([(r["f1_off"], r["f1_on"]) for r in run_file(
                "guided_pairs_of_run", {"run_id": rid}, home=home) if r["guidance"] == tag])[1]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", action="append", required=True, help="NAME=DIR (NAME-sN: training seed N)")
    p.add_argument("--profile", default="tiny-world", choices=("tiny-world", "smol-world"))
    p.add_argument("--sources", nargs="+", default=list(SOURCES), choices=SOURCES)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--pool", help="an exported ARBOR common pool (source memory)")
    p.add_argument("--generator", help="a trained generator checkpoint (source generator)")
    p.add_argument("--limit", type=int, default=200, help="held-out questions")
    p.add_argument("--runs", type=int, default=1, help="evaluation runs per question")
    p.add_argument("--out", default=str(ROOT / "bench" / "out"))
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for every evaluation (e.g. guidance.max_rubric_tokens=96: what the "
                   "generator was trained to write)")
    args = p.parse_args(argv)
    import polars as pl

    rows = []
    for spec in args.checkpoint:
        name, _, path = spec.partition("=")
        m = re.match(r"(.+)-s(\d+)$", name)
        kind, seeds = (m.group(1), [int(m.group(2))]) if m else (name, args.seeds)
        for seed in seeds:
            for source in args.sources:
                r = one(name, path, seed, source, args)
                rows.append({"kind": kind, "checkpoint": name, "seed": seed, "source": source, **r})
                print(f"{name} seed {seed} {source}: F1 {100 * r['f1_off']:.1f} -> {100 * r['f1_on']:.1f}, valid "
                      f"{100 * r['valid_off']:.1f} -> {100 * r['valid_on']:.1f}, failing verification "
                      f"{100 * (r['fail_rate'] or 0):.1f}%, judge calls / answer {r['calls'] or 0:.2f}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    pl.DataFrame(rows).write_csv(Path(args.out) / "guidance.csv")
    print(f"\n{'checkpoint':<10}{'source':<11}{'F1 off':>14}{'F1 guided':>14}{'delta':>14}{'paired SE':>10}"
          f"{'valid off':>11}{'valid on':>10}{'fail':>8}{'calls':>7}")
    for kind in dict.fromkeys(r["kind"] for r in rows):
        for source in args.sources:
            mine = [r for r in rows if r["kind"] == kind and r["source"] == source]
            if not mine:
                continue
            cells = []
            for xs, sign in (([r["f1_off"] for r in mine], ""), ([r["f1_on"] for r in mine], ""),
                             ([r["f1_on"] - r["f1_off"] for r in mine], "+")):
                mu, se = stats(xs)
                cells.append(f"{100 * mu:{sign}.1f} ± {100 * se:.1f}")
            v0, v1 = stats([r["valid_off"] for r in mine])[0], stats([r["valid_on"] for r in mine])[0]
            fail = stats([r["fail_rate"] or 0.0 for r in mine])[0]
            calls = stats([r["calls"] or 0.0 for r in mine])[0]
            paired = stats([r["se_paired"] for r in mine])[0]  # one seed's question noise (the mean over seeds)
            print(f"{kind:<10}{source:<11}{cells[0]:>14}{cells[1]:>14}{cells[2]:>14}{100 * paired:>10.1f}"
                  f"{100 * v0:>11.1f}{100 * v1:>10.1f}{100 * fail:>7.1f}%{calls:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
