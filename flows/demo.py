"""``arbor demo``: the main job on the embedded default.

A profile end to end on two cores (the synthetic world ``tiny-world`` by default; ``--profile tiny-cpu`` for the
shipped Wikipedia passages): build the tiny policy, SFT warm start, then ARBOR steps with the offline rules judge
and local BM25. With held-out evaluation in the profile (tiny-world), it prints the held-out F1 at the SFT start
and after RL; it always writes the run's curves as a PNG. A demonstration, not the paper's numbers: ``bench/learning.py`` runs every method over
three seeds.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from arbor.paths import arbor_home
from arbor.tasks.training.checkpoint import final_policy, run_root_from_config

QUERIES = (
    ("rubric lifecycle, step by step",
     "select step, event, rubric_id, kind, title, round(variance, 3) as var, round(pearson, 3) as pearson, "
     "n_r, round(rho_r, 3) as rho_r, reason from rubric_events order by step, seq"),
    ("where a common rubric came from (drafts and their questions)",
     "select common_rubric_id, draft_rubric_id, question from rubric_sources order by common_rubric_id"),
    ("zero-variance groups under base vs total reward (paper Table 2)",
     "select * from zero_variance_groups"),
)


PROFILE = "tiny-world"  # the synthetic world: held-out F1 at the SFT start and after RL


def run_demo(steps: int | None = None, overrides: dict[str, Any] | None = None, profile: str = PROFILE) -> str:
    from arbor.config import ArborConfig
    from arbor.flows.train import arbor_train
    from arbor.storage.runs import run_row
    from arbor.storage.sql import query, render, sql_file
    from arbor.tasks.reporting.curves import collect_curve_rows, plot_curves

    sets = dict(overrides or {})
    if steps is not None:
        sets["run.steps"] = steps
    t0 = time.perf_counter()
    run_id = arbor_train(profile=profile, overrides=sets or None)
    home = arbor_home()
    print(f"\nrun {run_id} finished in {time.perf_counter() - t0:.0f} s")
    row = run_row(run_id, home) or {}
    method = row.get("method") or "arbor"
    how = "as configured"
    if row.get("config_json"):
        cfg = ArborConfig.model_validate_json(row["config_json"])
        temp = cfg.eval.temperature if cfg.eval.temperature is not None else cfg.rollout.temperature
        how = f"{cfg.run.eval_runs} sampled answers per question at temperature {temp}" if temp else "greedy"
    rows = collect_curve_rows({run_id: (method, 0)}, home)
    evals = rows.drop_nulls("strict_f1").select("step", "strict_f1", "valid_rate").rows()
    if len(evals) >= 2:
        (s0, f0, v0), (s1, f1, v1) = evals[0], evals[-1]
        print(f"held-out F1 (entities never seen in SFT or RL; {how}): {f0:.3f} at step {s0} (SFT start) -> "
              f"{f1:.3f} at step {s1} ({f1 - f0:+.3f}); format-valid {v0:.2f} -> {v1:.2f}")
    png = home / "reports" / run_id / "curves.png"
    plot_curves(rows, [method], png, title=f"run {run_id} ({profile}, {method})")
    print(f"curves: {png}  (bench/learning.py: every method over three seeds)")
    me = sys.argv[0] if Path(sys.argv[0]).name == "arbor" else "arbor"  # as the user called us
    print(f"results: {home}  (Parquet under data/, catalog.duckdb holds the views)")
    root = run_root_from_config(row.get("config_json"), run_id, home)
    if (policy := final_policy(root)) is not None:
        print(f"policy: {policy}  (a plain HF folder: {me} export {run_id} --out DIR copies it)")
    print()
    print("Three SQL queries to try:")
    for title, sql in QUERIES:
        print(f"\n-- {title}\n{me} sql \"{sql}\"")
    print("\nTable 2 for this run:")
    print(render(query(sql_file("zero_variance_of_run"), {"run_id": run_id})))
    return run_id
