"""Judge throughput: 704 pairwise calls (64 groups x 11 sparse edges, paper §3.4) at concurrency 32 against the
local OpenAI-compatible server with 200 ms injected latency.

Prints the wall time against the ideal 704 x 0.2 / 32 s (goal <= 1.15x), against a bare httpx loop sending the
same requests at the same concurrency (our overhead: prompts, validation, cache, ledger), and the rerun time
(all cache hits, no network). Usage: ``python bench/judge.py [--calls 704] [--concurrency 32] [--latency 0.2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from openai_server import start_server_process  # noqa: E402

from arbor.config.judge import JudgeConfig  # noqa: E402
from arbor.llm import CallContext, make_judge  # noqa: E402
from arbor.llm.cache import cache_key  # noqa: E402
from arbor.llm.text import WHOLE  # noqa: E402
from arbor.seeding import coin  # noqa: E402
from arbor.tasks.methods.arbor.roles import ask_pairwise, pairwise_messages  # noqa: E402
from arbor.tasks.methods.arbor.sparse_graph import sparse_edges  # noqa: E402
from arbor.types import Rubric, Trajectory  # noqa: E402

KEY_ENV = "ARBOR_BENCH_JUDGE_KEY"
RUBRIC = Rubric("bench", "Precise Entity Queries", "Names the question's entities in each query.",
                "Issues vague queries without the key entities.", kind="common")


def workload(n_calls: int) -> list[tuple[str, Trajectory, Trajectory, bool, CallContext]]:
    """n_calls distinct pairwise judgements over groups of K = 8 (11 edges each)."""
    calls = []
    g = 0
    while len(calls) < n_calls:
        q = f"Bench question {g}: who founded the company that built the landmark?"
        trajs = [Trajectory("bench", 0, g, i, f"q{g}", q, ["x"], base_reward=i / 7, text=(
            f"<think>group {g} sample {i}</think>\n" + "".join(
                f"<search>landmark founder {g} {i} {k}</search>\n<result>Passage {k} about the landmark "
                f"and its founder, {'long text ' * 40}</result>\n" for k in range(1 + i % 3))
            + f"<answer>\\boxed{{answer {i}}}</answer>")) for i in range(8)]
        for e, (a, b) in enumerate(sparse_edges([t.base_reward for t in trajs])):
            if len(calls) < n_calls:
                swap = coin(0, 0, g, RUBRIC.rubric_id, e)
                calls.append((q, trajs[a], trajs[b], swap, CallContext("bench", 0, "score", g, RUBRIC.rubric_id, e)))
        g += 1
    return calls


async def run_judge(cfg: JudgeConfig, home: Path, calls: list) -> tuple[float, list]:
    judge = make_judge(cfg, home=home)
    t0 = time.perf_counter()
    outs = await asyncio.gather(*[ask_pairwise(judge, q, a, b, RUBRIC, swap=s, ctx=c)
                                  for q, a, b, s, c in calls])
    wall = time.perf_counter() - t0
    await judge.aclose()
    rows = judge.drain_calls()
    assert all(o.ok for o in outs), [o.error for o in outs if not o.ok][:3]
    return wall, rows


async def run_bare(base_url: str, cfg: JudgeConfig, calls: list) -> float:
    """The same HTTP requests with nothing of ours around them: one httpx client, one semaphore."""
    bodies = []
    for q, a, b, s, _ in calls:
        version, messages = pairwise_messages(q, *((b, a) if s else (a, b)), RUBRIC, cfg.max_judge_tokens or WHOLE)
        params = {"temperature": cfg.temperature, "max_tokens": cfg.max_tokens}
        key = cache_key("pairwise", cfg.model, version, messages, params)
        bodies.append(({"model": cfg.model, "messages": messages, **params}, key))
    sem = asyncio.Semaphore(cfg.concurrency)
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=base_url, timeout=cfg.timeout_s, limits=limits) as client:
        async def one(body: dict, key: str) -> None:
            async with sem:
                r = await client.post("/chat/completions", json=body, headers={
                    "Authorization": f"Bearer {os.environ[KEY_ENV]}", "X-Arbor-Cache-Key": key})
                r.raise_for_status()
                r.json()

        t0 = time.perf_counter()
        await asyncio.gather(*[one(b, k) for b, k in bodies])
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=704)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--latency", type=float, default=0.2)
    args = ap.parse_args()
    os.environ.setdefault(KEY_ENV, "bench-key")
    proc, base_url = start_server_process(latency_s=args.latency)
    try:
        cfg = JudgeConfig(backend="openai", base_url=base_url, api_key_env=KEY_ENV, model="bench-judge",
                          concurrency=args.concurrency, timeout_s=30.0)
        calls = workload(args.calls)
        ideal = max(args.calls * args.latency / args.concurrency, 1e-9)
        with tempfile.TemporaryDirectory() as home:
            asyncio.run(run_judge(cfg, Path(home) / "warmup", calls[:32]))  # imports, first connections
            bare = asyncio.run(run_bare(base_url, cfg, calls))
            wall, rows = asyncio.run(run_judge(cfg, Path(home), calls))
            rerun, rows2 = asyncio.run(run_judge(cfg, Path(home), calls))
        misses = sum(not r["cache_hit"] for r in rows)
        hits2 = sum(r["cache_hit"] for r in rows2)
        print(f"judge bench: {args.calls} pairwise calls, concurrency {args.concurrency}, "
              f"server latency {args.latency * 1000:.0f} ms")
        print(f"  ideal  {ideal:7.3f} s  (calls x latency / concurrency)")
        print(f"  bare   {bare:7.3f} s  httpx loop, same requests  -> {bare / ideal:.3f}x ideal")
        print(f"  judge  {wall:7.3f} s  ({misses} network calls)   -> {wall / ideal:.3f}x ideal "
              f"(goal <= 1.15x), {wall / bare:.3f}x bare (overhead {wall - bare:+.3f} s)")
        print(f"  rerun  {rerun:7.3f} s  ({hits2}/{len(rows2)} cache hits) -> {rerun / wall:.4f}x first run")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
