"""Storage benchmark: synthetic trajectories at scale through storage/ vs. raw pyarrow / raw DuckDB.

Writes ``--rows`` trajectories (~``--text-bytes`` of text each) one step partition at a time (memory stays
bounded by one partition), ``--activations`` rubric activations and one judge call per activation, then prints
  * ingest rows/s of ``storage.parquet.write_stage`` vs ``pyarrow.parquet.write_table`` of the same table (ratio),
  * read rows/s of the store's per-partition read vs ``pyarrow.parquet.read_table`` of the same file (ratio),
  * each question view's latency through ``storage.sql.query`` (catalog opened read-only per call, as `arbor sql`
    does) vs a hand-written DuckDB query over the same Parquet files on an in-memory connection (ratio).

    python bench/storage.py                 # 1M trajectories x 2 KB, 100k activations
    python bench/storage.py --rows 100000   # scaled down
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from arbor.storage.catalog import ensure_catalog
from arbor.storage.parquet import _read_file, stage_path, write_stage
from arbor.storage.sql import query


def trajectory_partition(run_id: str, step: int, n_groups: int, k: int, text_bytes: int, rng) -> pa.Table:
    """One step's trajectories: n_groups x k rows, each with ~text_bytes of distinct text."""
    n = n_groups * k
    words = np.array("search the wiki for entity attribute answer evidence query result think verify".split())
    pool = " ".join(words[rng.integers(0, len(words), size=(text_bytes // 5) * 4)])
    starts = rng.integers(0, len(pool) - text_bytes, size=n)
    group = np.repeat(np.arange(n_groups), k)
    sample = np.tile(np.arange(k), n_groups)
    valid = rng.random(n) > 0.1
    f1 = np.where(valid, rng.choice([0.0, 0.5, 1.0], size=n), 0.0)
    base = np.where(valid, f1, -1.0)
    shaped = base + np.where(valid, rng.normal(0, 0.01, size=n), 0.0)
    return pa.table({
        "traj_id": [f"{run_id}/{step}/{g}/{s}" for g, s in zip(group, sample, strict=True)],
        "run_id": [run_id] * n, "step": np.full(n, step), "group": group, "sample": sample,
        "question_id": [f"q{step}-{g}" for g in group], "question": ["which entity?"] * n,
        "golds": [["answer"]] * n, "text": [pool[s:s + text_bytes] for s in starts],
        "turns": rng.integers(1, 6, n), "search_calls": rng.integers(0, 5, n), "format_valid": valid,
        "answer": ["answer"] * n, "em": (f1 == 1.0).astype(float), "f1": f1, "base_reward": base,
        "shaped_reward": shaped, "response_tokens": rng.integers(50, 600, n),
    })


def activation_partition(run_id: str, step: int, n: int, n_groups: int, k: int, n_rubrics: int, rng) -> pa.Table:
    scores = rng.choice([0.0, 0.5, 1.0], size=(n, k))
    return pa.table({
        "run_id": [run_id] * n, "step": np.full(n, step), "group": np.arange(n) // 2 % n_groups,
        "rubric_id": [f"c{(step * 7 + j) % n_rubrics}" for j in range(n)], "variance": scores.var(axis=1),
        "kept": scores.var(axis=1) >= 0.05, "scores": list(scores), "n_r_after": rng.integers(0, 5, n),
        "rho_r_after": rng.normal(0.2, 0.1, n),
    })


def judge_partition(run_id: str, step: int, n: int, rng) -> pa.Table:
    return pa.table({
        "run_id": [run_id] * n, "step": np.full(n, step), "role": rng.choice(["pairwise", "induction"], n),
        "model": ["m"] * n, "latency_s": rng.random(n), "prompt_tokens": rng.integers(100, 2000, n),
        "completion_tokens": rng.integers(1, 50, n), "cost_usd": rng.random(n) / 1000, "cache_hit": rng.random(n) < 0.2,
    })


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def hand_queries(data: str) -> dict[str, str]:
    """The same questions written by hand straight over the Parquet files (no catalog, no views)."""
    def rp(t: str) -> str:
        return f"read_parquet('{data}/{t}/**/*.parquet', hive_partitioning = false)"
    return {
        "zero_variance_groups": f"""
            with g as (select run_id, step, "group", max(base_reward) - min(base_reward) <= 1e-9 as zb,
                              max(coalesce(shaped_reward, base_reward)) - min(coalesce(shaped_reward, base_reward))
                                  <= 1e-9 as zt, min(f1) as lo, max(f1) as hi, bool_and(format_valid) as v
                       from {rp('trajectories')} group by all)
            select run_id, step, count(*), avg((zb and lo >= 1 - 1e-9 and v)::int), avg((zb and hi <= 1e-9)::int),
                   avg(zb::int), avg(zt::int) from g group by grouping sets ((run_id, step), (run_id))""",
        "rubric_reuse": f"""
            with u as (select run_id, rubric_id, coalesce(a.n, 0) as uses, e.title
                       from (select run_id, rubric_id, any_value(title) as title from {rp('rubric_events')}
                             where event = 'consolidated' and kind = 'common' group by all) e
                       full join (select run_id, rubric_id, count(*) as n from {rp('rubric_activations')}
                                  group by all) a using (run_id, rubric_id))
            select run_id, rubric_id, title, uses, row_number() over w as rank,
                   sum(uses) over w / sum(uses) over (partition by run_id) as cum_share
            from u window w as (partition by run_id order by uses desc, rubric_id)""",
        "rubric_reuse_concentration": f"""
            with u as (select run_id, rubric_id, coalesce(a.n, 0) as uses
                       from (select distinct run_id, rubric_id from {rp('rubric_events')}
                             where event = 'consolidated' and kind = 'common') e
                       full join (select run_id, rubric_id, count(*) as n from {rp('rubric_activations')}
                                  group by all) a using (run_id, rubric_id)),
                 r as (select *, row_number() over (partition by run_id order by uses desc, rubric_id) as rank,
                              count(*) over (partition by run_id) as n, sum(uses) over (partition by run_id) as tot
                       from u)
            select run_id, f, sum(uses * least(greatest(f * n - (rank - 1), 0), 1)) / any_value(tot)
            from r, (select unnest([0.05, 0.2]) as f) group by run_id, f""",
        "rubric_history": f"""
            with s as (select run_id, step, "group", rubric_id, unnest(scores) as score,
                              generate_subscripts(scores, 1) - 1 as sample from {rp('rubric_activations')}),
                 c as (select s.run_id, s.rubric_id, s.step, corr(s.score, t.f1) as p from s join
                       {rp('trajectories')} t using (run_id, step, "group", sample) group by all)
            select a.run_id, a.rubric_id, a.step, count(*), avg(a.variance), any_value(c.p),
                   arg_max(a.rho_r_after, a."group") from {rp('rubric_activations')} a
            left join c using (run_id, rubric_id, step) group by all""",
        "judge_cost_per_step": f"""
            select run_id, step, role, count(*), sum(cost_usd), sum(prompt_tokens), avg(latency_s)
            from {rp('judge_calls')} group by grouping sets ((run_id, step, role), (run_id, step))""",
        "rubrics": f"""
            select * from (select run_id, rubric_id, arg_max(event, step * 1000000 + seq),
                                  arg_max(title, step * 1000000 + seq), min(step), max(step)
                           from {rp('rubric_events')} group by all) e
            left join (select run_id, rubric_id, count(*), arg_max(rho_r_after, step * 1000000 + "group")
                       from {rp('rubric_activations')} group by all) a using (run_id, rubric_id)""",
        "run_status": f"""
            select r.run_id, r.profile, s.last, t.st from {rp('runs')} r
            left join (select run_id, max(step) as last from {rp('steps')} group by all) s using (run_id)
            left join (select run_id, arg_max(status, started_at) as st from {rp('stage_runs')} group by all) t
            using (run_id)""",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="trajectories to write")
    ap.add_argument("--activations", type=int, default=100_000, help="rubric activations to write")
    ap.add_argument("--k", type=int, default=8, help="trajectories per group")
    ap.add_argument("--groups-per-step", type=int, default=512, help="groups per step partition")
    ap.add_argument("--text-bytes", type=int, default=2000, help="text per trajectory")
    ap.add_argument("--rubrics", type=int, default=200, help="common rubrics")
    ap.add_argument("--repeats", type=int, default=3, help="timings per view (median)")
    ap.add_argument("--home", type=Path, default=None, help="workspace (default: a temporary folder, removed)")
    args = ap.parse_args()

    home = args.home or Path(tempfile.mkdtemp(prefix="arbor-bench-"))
    raw_dir = Path(tempfile.mkdtemp(prefix="arbor-bench-raw-"))
    rng = np.random.default_rng(0)
    run_id = "bench"
    per_step = args.groups_per_step * args.k
    n_steps = max(1, -(-args.rows // per_step))
    act_per_step = -(-args.activations // n_steps)
    print(f"home={home}  {args.rows} trajectories x ~{args.text_bytes} B text in {n_steps} step partitions "
          f"of {per_step}; {act_per_step * n_steps} activations; {act_per_step * n_steps} judge calls")
    try:
        write_stage("runs", [dict(profile="bench", method="arbor", seed=0)], run_id=run_id, step=0, stage="run",
                    home=home)
        write_stage("rubric_events", [dict(seq=i, rubric_id=f"c{i}", event="consolidated", kind="common",
                                           title=f"rubric {i}") for i in range(args.rubrics)],
                    run_id=run_id, step=0, stage="memory", home=home)
        t_ours = t_raw = r_ours = r_raw = 0.0
        n_written = 0
        mb = 0.0
        for step in range(1, n_steps + 1):
            n_groups = min(args.groups_per_step, -(-(args.rows - n_written) // args.k))
            part = trajectory_partition(run_id, step, n_groups, args.k, args.text_bytes, rng)
            raw_path = str(raw_dir / "part.parquet")
            t = time.perf_counter()
            pq.write_table(part, raw_path)
            t_raw += time.perf_counter() - t
            t = time.perf_counter()
            path = write_stage("trajectories", part, run_id=run_id, step=step, stage="rollout", home=home)
            t_ours += time.perf_counter() - t
            mb += os.path.getsize(path) / 1e6
            ours_path = stage_path("trajectories", run_id=run_id, step=step, stage="rollout", home=home)
            for who in ("raw", "ours") if step % 2 else ("ours", "raw"):
                t = time.perf_counter()
                if who == "raw":
                    pq.read_table(raw_path)
                    r_raw += time.perf_counter() - t
                else:
                    _read_file("trajectories", ours_path)
                    r_ours += time.perf_counter() - t
            n_written += part.num_rows
            del part
            write_stage("rubric_activations", activation_partition(run_id, step, act_per_step, n_groups, args.k,
                                                                   args.rubrics, rng),
                        run_id=run_id, step=step, stage="score", home=home)
            write_stage("judge_calls", judge_partition(run_id, step, act_per_step, rng), run_id=run_id, step=step,
                        stage="score", home=home)
            write_stage("steps", [dict(loss=0.0)], run_id=run_id, step=step, stage="train", home=home)
        print(f"\ningest: {n_written} rows, {mb:.0f} MB Parquet")
        print(f"  storage.write_stage   {n_written / t_ours:12,.0f} rows/s   ({t_ours:.2f} s)")
        print(f"  pyarrow write_table   {n_written / t_raw:12,.0f} rows/s   ({t_raw:.2f} s)")
        print(f"  ratio (ours / raw)    {t_raw / t_ours:12.2f}   (throughput; 1.0 = as fast as raw pyarrow)")
        print("read back, partition by partition (alternating which goes first):")
        print(f"  storage read          {n_written / r_ours:12,.0f} rows/s   ({r_ours:.2f} s)")
        print(f"  pyarrow read_table    {n_written / r_raw:12,.0f} rows/s   ({r_raw:.2f} s)")
        print(f"  ratio (ours / raw)    {r_raw / r_ours:12.2f}")

        ensure_catalog(home)
        data = (home.resolve() / "data").as_posix()
        print(f"\nview latency (median of {args.repeats}; catalog opened read-only per query vs in-memory DuckDB):")
        print(f"  {'view':28s} {'rows':>8s} {'view s':>9s} {'hand s':>9s} {'ratio':>7s}")
        for view, sql in hand_queries(data).items():
            n_rows = query(f"select count(*) as n from {view}", home=home).column("n")[0].as_py()

            def via_view(view: str = view) -> None:
                query(f"select * from {view}", home=home)

            def by_hand(sql: str = sql) -> None:
                con = duckdb.connect()
                try:
                    con.sql(sql).to_arrow_table()
                finally:
                    con.close()

            via_view()
            by_hand()  # warm the OS file cache for both
            tv, th = timed(via_view, args.repeats), timed(by_hand, args.repeats)
            print(f"  {view:28s} {n_rows:8d} {tv:9.3f} {th:9.3f} {tv / th:7.2f}")
    finally:
        shutil.rmtree(raw_dir, ignore_errors=True)
        if args.home is None:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
