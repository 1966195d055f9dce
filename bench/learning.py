"""Learning curves on the synthetic world: every method, several seeds, one SFT start.

    python bench/learning.py                       # grpo dapo arbor no-memory rar x seeds 0 1 2
    python bench/learning.py --quick               # grpo and arbor, one seed, fewer steps: a smoke run
    python bench/learning.py --methods grpo --seeds 0 1 --set run.steps=4
    python bench/learning.py --profile smol-world --methods grpo arbor   # SmolLM2-135M-Instruct

Each (method, seed) is an ordinary ``arbor-train`` run of the ``--profile`` (default ``tiny-world``) from the same SFT checkpoint
(trained once, seed 0), on the same batches (``run.seed``) and with held-out evaluation at step 0 and every
``run.eval_every`` steps on questions about entities never seen in SFT or RL. A finished run is reused when the
script is run again (same home), so an interrupted benchmark resumes where it stopped.

Prints the table (mean ± standard error over seeds) and writes ``curves.png`` (one panel per metric, one line per
method with a ±1 SE band) and ``curves.csv`` (every run's per-step figures) under ``--out``.

Then the final exam: the SFT start and every run's last checkpoint answer the held-out questions again with the
same sampling seeds (common random numbers). In-run evaluations sample with each run's own seed, so the start's
three readings differ by sampling noise alone; the exam removes that noise from the start -> final comparison,
and its standard error counts both the training seeds and the finite question set, paired by question
(``tasks.reporting.curves.common_dice_delta``).
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

METHODS = ("grpo", "dapo", "arbor", "no-memory", "rar", "ss-grpo", "rubricem", "arco")
PROFILES = ("tiny-world", "smol-world")
# what a method needs beyond the profile: SS-GRPO's stage scaffold (the world's short prompt in its tags); such a
# method starts from its own SFT checkpoint (same world, questions and updates, staged gold trajectories), and its
# final exam compares it with that start
STAGED_PROMPT = ("Answer the question by searching. Plan in <structured_plan></structured_plan>, search with "
                 "<search>query</search>, read the <tool_output></tool_output>, weigh it in <state_evaluation>"
                 "</state_evaluation>, review in <review></review>, and give the final answer as "
                 "<answer>\\boxed{answer}</answer>.")
# RubricEM's start (its §5 ablations all start from one RUBRICEM-SFT checkpoint): staged gold rows, and for a
# quarter of them a reflection row (App. D.6.1's two blocks), so the meta-policy starts out writing the format
# (and, for as many, a copy of the row with a bank-style reference block before its question); room in the
# context for the blocks (a plain prompt + response never reaches 768 tokens, so other methods are unaffected)
RUBRICEM_SETS: dict[str, Any] = {"rollout.protocol": "rubricem", "rollout.system_prompt": STAGED_PROMPT,
                                 "sft.reflections": 0.25, "rollout.max_context_tokens": 1024}
METHOD_SETS: dict[str, dict[str, Any]] = {"ss-grpo": RUBRICEM_SETS, "rubricem": RUBRICEM_SETS}
# the measured setting (docs/decisions/README.md): three times the demo's RL steps, held-out F1
# sampled at the rollout temperature over 4 x 200 answers at steps 0, 15 and 30; any --set overrides these
BENCH_SETS: dict[str, Any] = {"run.steps": 30, "run.eval_every": 15, "run.eval_runs": 4}
# per profile: smol-world's own file already holds its measured setting (20 steps, eval at 0, 10 and 20)
PROFILE_SETS: dict[str, dict[str, Any]] = {"tiny-world": BENCH_SETS, "smol-world": {}}


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``key=value`` strings (values are parsed as YAML by the config loader, which also names unknown keys)."""
    bad = [s for s in items if "=" not in s]
    if bad:
        raise SystemExit(f"--set {bad[0]}: expected key=value")
    return dict(s.split("=", 1) for s in items)


def settings_tag(sets: dict[str, Any], profile: str = "tiny-world", start: Path | None = None) -> str:
    """Six hex digits naming what a run is made of: the overrides, the profile file's text and the SFT start (its
    directory name is content-addressed), so a run is only reused under the same settings (an edited profile or a
    new SFT start gives new runs instead of a refused resume)."""
    text = (ROOT / "configs" / f"{profile}.yaml").read_text()
    what = {"sets": sets, "profile": hashlib.sha256(text.encode()).hexdigest(), "start": start.name if start else None}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:6]


def completed(run_id: str, home: Path) -> bool:
    from arbor.storage.parquet import read_stage

    rows = read_stage("stage_runs", run_id=run_id, step=0, stage="run", home=home) or []
    return any(r["status"] == "completed" for r in rows)


def run_one(method: str, seed: int, start: Path, sets: dict[str, Any], home: Path,
            profile: str = "tiny-world") -> tuple[str, float]:
    """Train (or reuse) one run; (run id, wall seconds, 0 when reused)."""
    from arbor.flows.train import arbor_train
    from arbor.storage.runs import run_row

    prefix = "learn" if profile == "tiny-world" else f"learn-{profile}"
    rid = f"{prefix}-{method}-s{seed}-{settings_tag(sets, profile, start)}"
    row = run_row(rid, home)
    if row is not None and completed(rid, home):
        return rid, 0.0
    t0 = time.perf_counter()
    overrides = {**sets, **METHOD_SETS.get(method, {}), "run.method": method, "run.seed": seed,
                 "run.sft_warm_start": False, "run.start_checkpoint": str(start)}
    arbor_train(profile=profile, overrides=overrides, run_id=rid, resume=row is not None)
    return rid, time.perf_counter() - t0


EXAM_SEED = 0  # the common dice: every checkpoint's final exam samples with this seed


def start_for(method: str, sets: dict[str, Any], home: Path, profile: str = "tiny-world") -> Path:
    """The SFT start of ``method``: one per protocol (trained once, seed 0, reused)."""
    from arbor.config import load_config
    from arbor.flows.sft import sft_checkpoint

    extra = METHOD_SETS.get(method, {})
    return sft_checkpoint(load_config(profile, {**{k: v for k, v in sets.items() if not k.startswith("run.")},
                                                **extra}), home)


def final_exam(checkpoint: Path, exam_id: str, sets: dict[str, Any], home: Path, method: str = "grpo",
               profile: str = "tiny-world") -> str:
    """Evaluate ``checkpoint`` on the held-out split with the common dice (``run.seed = EXAM_SEED``, step 0), the
    run's own number of answers per question (in ``method``'s protocol); stored as the evaluation run ``exam_id``
    and reused when present."""
    from arbor.config import load_config
    from arbor.flows.evaluate import arbor_eval
    from arbor.tasks.reporting.evaluate import load_eval_results

    if load_eval_results(exam_id, home=home):
        return exam_id
    overrides = {**{k: v for k, v in sets.items() if not k.startswith("run.")}, **METHOD_SETS.get(method, {}),
                 "run.seed": EXAM_SEED}
    cfg = load_config(profile, {**sets, **overrides})
    arbor_eval(checkpoint=str(checkpoint), profile=profile, overrides=overrides, splits=cfg.data.eval_sets(),
               runs=cfg.run.eval_runs, run_id=exam_id)
    return exam_id


def exam_table(start_ids: dict[str, str], finals: dict[str, tuple[str, int]], methods: list[str],
               home: Path) -> tuple[str, dict[str, Any]]:
    """Final F1 of every run against its method's start (``start_ids``: method -> the start's exam), all read with
    the common dice: the table and {method: delta}."""
    from arbor.tasks.reporting.curves import common_dice_delta, mean_se, question_f1, rises_by

    per_q = question_f1([*dict.fromkeys(start_ids.values()), *finals], home)
    head = ["method", "seeds", "F1 start", "F1 final per seed", "F1 final", "ΔF1 (common dice)", "≥3 SE"]
    body, deltas = [], {}
    for m in methods:
        fin = [per_q[r] for r, (mm, _) in sorted(finals.items(), key=lambda x: x[1]) if mm == m and per_q[r]]
        if not fin:
            continue
        start = per_q[start_ids[m]]
        d = deltas[m] = common_dice_delta(start, fin)
        means = [sum(f.values()) / len(f) for f in fin]
        body.append([m, str(len(fin)), f"{sum(start.values()) / len(start):.3f}",
                     ", ".join(f"{f:.3f}" for f in means), str(mean_se(means)), f"{d.mean:+.3f} ± {d.se:.3f}",
                     "yes" if rises_by(d) else "no"])
    return _render(head, body), deltas


def _render(head: list[str], body: list[list[str]]) -> str:
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *(line(b) for b in body)])


def table(rows: pl.DataFrame, methods: list[str]) -> str:
    from arbor.tasks.reporting.curves import mean_se, rises_by, start_final_delta

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
    return _render(head, body)


def reflection_table(run_ids: dict[str, tuple[str, int]], home: Path, window: int = 5) -> str:
    """The reflection meta-policy of each method that has one (RubricEM): the judge's mean utility of the
    candidates over the first and the last ``window`` steps, their valid share, bank writes and retrievals
    (mean ± SE over seeds); "" when no run reflected."""
    from arbor.storage.parquet import read_table
    from arbor.tasks.methods import resolve_method
    from arbor.tasks.reporting.curves import mean_se

    per: dict[str, list[dict[str, float]]] = {}
    for rid, (m, _) in run_ids.items():
        own = resolve_method(m).tables  # the reflection tables are RubricEM's (its TableSet), known once resolved
        if own is None or "reflections" not in own.schemas:
            continue
        refl = pl.from_arrow(read_table("reflections", run_id=rid, home=home))
        if refl.is_empty():  # type: ignore[union-attr]
            continue
        bank = read_table("rubric_bank", run_id=rid, home=home)
        got = pl.from_arrow(read_table("bank_retrievals", run_id=rid, home=home))
        last = int(refl["step"].max())  # type: ignore[index]
        early = refl.filter(pl.col("step") <= window)  # type: ignore[union-attr]
        late = refl.filter(pl.col("step") > last - window)  # type: ignore[union-attr]
        per.setdefault(m, []).append({
            "u0": float(early["utility"].mean()), "u1": float(late["utility"].mean()),  # type: ignore[arg-type]
            "v0": float(early["format_valid"].mean()), "v1": float(late["format_valid"].mean()),  # type: ignore[arg-type]
            "bank": float(bank.num_rows), "within": float(got.filter(pl.col("mode") == "within").height),  # type: ignore[union-attr]
            "cross": float(got.filter(pl.col("mode") == "cross").height)})  # type: ignore[union-attr]
    if not per:
        return ""
    head = ["method", "seeds", f"utility steps 1-{window}", f"utility last {window}", "valid first→last",
            "bank writes", "retrievals within / cross"]
    body = []
    for m, rows in per.items():
        ms = {k: mean_se(r[k] for r in rows) for k in rows[0]}
        body.append([m, str(len(rows)), str(ms["u0"]), str(ms["u1"]), f"{ms['v0'].mean:.2f} → {ms['v1'].mean:.2f}",  # type: ignore[union-attr]
                     f"{ms['bank'].mean:.0f}", f"{ms['within'].mean:.0f} / {ms['cross'].mean:.0f}"])  # type: ignore[union-attr]
    return _render(head, body)


def _avg(rows: pl.DataFrame, key: str) -> str:
    from arbor.tasks.reporting.curves import mean_se

    ms = mean_se(rows[key])
    return "-" if ms is None else f"{ms.mean:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", nargs="+", default=None, choices=METHODS)
    ap.add_argument("--seeds", nargs="+", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="grpo and arbor, seed 0, 4 steps")
    ap.add_argument("--profile", default="tiny-world", choices=PROFILES, help="the world profile the runs train")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="override a profile key: k=v")
    ap.add_argument("--home", default=None, help="workspace (runs are reused; default bench/out/learning, "
                    "bench/out/learning-PROFILE for another profile)")
    ap.add_argument("--no-exam", action="store_true", help="skip the final exam (common-dice re-evaluation)")
    ap.add_argument("--out", default=None, help="where curves.png / curves.csv go (default: --home)")
    args = ap.parse_args(argv)
    methods = args.methods or (["grpo", "arbor"] if args.quick else list(METHODS))
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    sets = {**PROFILE_SETS[args.profile], **({"run.steps": 4, "run.eval_every": 4} if args.quick else {}), **parse_sets(args.sets)}
    suffix = "" if args.profile == "tiny-world" else f"-{args.profile}"
    home = Path(args.home or ROOT / "bench" / "out" / f"learning{suffix}").resolve()
    home.mkdir(parents=True, exist_ok=True)
    out = Path(args.out).resolve() if args.out else home
    out.mkdir(parents=True, exist_ok=True)
    os.environ["ARBOR_HOME"] = str(home)

    from arbor.tasks.reporting.curves import collect_curve_rows, plot_curves, rises_by, start_final_delta

    t0 = time.perf_counter()
    starts = {m: start_for(m, sets, home, args.profile) for m in methods}  # one SFT start (seed 0) per protocol
    print(f"SFT start(s) {sorted({str(s) for s in starts.values()})} ({time.perf_counter() - t0:.0f} s)", flush=True)
    run_ids: dict[str, tuple[str, int]] = {}
    walls: list[tuple[str, int, float]] = []
    for seed in seeds:
        for m in methods:
            rid, wall = run_one(m, seed, starts[m], sets, home, args.profile)
            run_ids[rid] = (m, seed)
            walls.append((m, seed, wall))
            print(f"{rid}: {'reused' if wall == 0 else f'{wall:.0f} s'}", flush=True)
    rows = collect_curve_rows(run_ids, home)
    rows.write_csv(out / "curves.csv")
    plot_curves(rows, methods, out / "curves.png")
    print("\n" + table(rows, methods))
    if refl := reflection_table(run_ids, home):
        print("\nreflection meta-policy (judge utility of the candidates, mean ± SE over seeds):\n" + refl)
    ran = [x for _, _, x in walls if x > 0]
    if ran:
        print(f"\nwall time per run: mean {sum(ran) / len(ran):.0f} s, max {max(ran):.0f} s ({len(ran)} runs)")
    print(f"curves: {out / 'curves.png'}  per-step figures: {out / 'curves.csv'}")
    f1 = start_final_delta(rows, "strict_f1")
    for m in ("grpo", "arbor"):
        if m in f1:
            d = f1[m][2]
            print(f"{m} (in-run, each run's own dice): held-out F1 {f1[m][0]} -> {f1[m][1]} "
                  f"(change {d.mean:+.3f} ± {d.se:.3f}, {'at least' if rises_by(d) else 'less than'} 3 SE)")
    if args.no_exam:
        return 0
    # the final exam: the start and every run's last checkpoint answer with the same dice (common random numbers)
    from arbor.tasks.training.checkpoint import latest_complete

    tag = settings_tag(sets, args.profile)
    start_ids = {m: final_exam(starts[m], f"exam-{starts[m].name}-{tag}", sets, home, m, args.profile)
                 for m in methods}
    finals = {}
    for rid, ms in run_ids.items():
        ckpt = latest_complete(home / "checkpoints" / rid)
        if ckpt is not None:
            finals[final_exam(ckpt / "hf", f"exam-{rid}", sets, home, ms[0], args.profile)] = ms
    text, deltas = exam_table(start_ids, finals, methods, home)
    print("\nfinal exam (start and final checkpoints, same questions, same sampling seeds):\n" + text)
    for m in ("grpo", "arbor"):
        if m in deltas:
            d = deltas[m]
            print(f"{m} (final exam): held-out F1 change {d.mean:+.3f} ± {d.se:.3f} over {d.n} seed(s), "
                  f"{'at least' if rises_by(d) else 'less than'} 3 SE")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
