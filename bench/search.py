"""BM25 search on the shipped corpus: index build time, per-query latency p50 / p99, ratios against references.

    python bench/search.py [--queries N]

References measured in the same run: rank-bm25 (BM25Okapi, pure Python) when installed, and the persistent search
cache (a hit is a file read). Queries: the offline questions, then the benchmark questions (real multi-hop text).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from arbor.tasks.env.datasets import BENCHMARKS, CORPUS_FILE, benchmark_questions, offline_questions
from arbor.tasks.env.search import BM25Search, CachedSearch, bm25_tokenize, load_corpus


def percentiles(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs), xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))]


def per_query(fn, queries: list[str]) -> list[float]:
    out = []
    for q in queries:
        t0 = time.perf_counter()
        fn(q)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queries", type=int, default=400)
    args = ap.parse_args()
    queries = [q.question for q in offline_questions()] + [q.question for b in BENCHMARKS for q in benchmark_questions(b)]
    queries = queries[: args.queries]
    n_docs = len(load_corpus(CORPUS_FILE))
    print(f"corpus: {CORPUS_FILE.name}, {n_docs} passages; {len(queries)} queries, k = 10")

    with tempfile.TemporaryDirectory() as tmp:
        built = BM25Search(CORPUS_FILE, cache_dir=Path(tmp) / "idx")
        loaded = BM25Search(CORPUS_FILE, cache_dir=Path(tmp) / "idx")
        print(f"bm25s    build (tokenise + index + save): {built.load_seconds:.3f} s; load cached index: "
              f"{loaded.load_seconds:.3f} s  (ratio build/load {built.load_seconds / loaded.load_seconds:.1f}x)")
        lat = per_query(lambda q: loaded.search([q], 10), queries)
        p50, p99 = percentiles(lat)
        print(f"bm25s    per query: p50 {p50 * 1e3:.2f} ms  p99 {p99 * 1e3:.2f} ms")
        t0 = time.perf_counter()
        loaded.search(queries, 10)
        print(f"bm25s    batched: {len(queries) / (time.perf_counter() - t0):.0f} queries/s")

        cached = CachedSearch(loaded, Path(tmp) / "cache")
        cached.search(queries, 10)
        hit = per_query(lambda q: cached.search([q], 10), queries)
        h50, h99 = percentiles(hit)
        print(f"cache    hit per query: p50 {h50 * 1e3:.3f} ms  p99 {h99 * 1e3:.3f} ms  "
              f"(bm25s p50 / cache-hit p50 = {p50 / h50:.1f}x)")

    try:
        from rank_bm25 import BM25Okapi
    except ImportError:
        print("rank-bm25 not installed: reference skipped (pip install rank-bm25)")
        return
    passages = load_corpus(CORPUS_FILE)
    t0 = time.perf_counter()
    ref = BM25Okapi(bm25_tokenize([f"{p.title}\n{p.text}" for p in passages]))
    ref_build = time.perf_counter() - t0
    ref_queries = queries[: min(len(queries), 100)]  # rank-bm25 scores every document in Python: keep it short
    toks = bm25_tokenize(ref_queries)
    ref_lat = per_query(lambda i: ref.get_top_n(toks[i], passages, n=10), list(range(len(ref_queries))))
    r50, r99 = percentiles(ref_lat)
    print(f"rank-bm25 build: {ref_build:.3f} s; per query ({len(ref_queries)} queries): p50 {r50 * 1e3:.2f} ms  "
          f"p99 {r99 * 1e3:.2f} ms")
    print(f"ratio rank-bm25 / bm25s: build {ref_build / built.load_seconds:.1f}x, p50 latency {r50 / p50:.1f}x, "
          f"p99 latency {r99 / p99:.1f}x")


if __name__ == "__main__":
    main()
