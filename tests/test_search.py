"""Search backends: BM25 recall on the shipped corpus, index cache, http / web over real local HTTP, result cache."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flow_support import JsonServer
from search_server import SearchServer

from arbor.config.search import SearchConfig
from arbor.storage.kvstore import KVStore
from arbor.tasks.env.datasets import CORPUS_FILE, offline_questions
from arbor.tasks.env.search import (
    BM25Search,
    CachedSearch,
    HttpSearch,
    RetryPolicy,
    SearchError,
    SearchHit,
    WebSearch,
    format_results,
    load_corpus,
    make_search,
)


@pytest.fixture(scope="module")
def bm25(tmp_path_factory: pytest.TempPathFactory) -> BM25Search:
    return BM25Search(CORPUS_FILE, cache_dir=tmp_path_factory.mktemp("bm25"))


def test_bm25_recall_at_10_on_offline_questions(bm25: BM25Search) -> None:
    """Queried with the question text, a gold paragraph is in the top 10 for >= 90% of the offline questions."""
    qs = offline_questions()
    results = bm25.search([q.question for q in qs], 10)
    report = {}
    for source in ("hotpotqa", "musique"):
        pairs = [(q, r) for q, r in zip(qs, results, strict=True) if q.source == source]
        one = sum(any(s in {h.doc_id for h in r} for s in q.support) for q, r in pairs) / len(pairs)
        every = sum(all(s in {h.doc_id for h in r} for s in q.support) for q, r in pairs) / len(pairs)
        report[source] = (one, every)
    print("recall@10 (one gold, all golds):", report)
    overall = sum(report[s][0] for s in report) / 2  # 100 questions each
    assert overall >= 0.90
    assert report["hotpotqa"][0] >= 0.97 and report["musique"][0] >= 0.90  # measured 0.99 / 0.93
    assert all(len(r) == 10 for r in results)
    assert all(r[i].score >= r[i + 1].score for r in results for i in range(9))


def test_bm25_index_is_cached_on_disk(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        json.dumps({"id": "a", "title": "Dune", "text": "Dune is a novel by Frank Herbert."}) + "\n"
        + json.dumps({"id": "b", "title": "Paris", "text": "Paris is the capital of France."}) + "\n"
        + json.dumps({"id": "c", "title": "Herbert", "text": "Frank Herbert wrote science fiction."}) + "\n"
    )
    first = BM25Search(corpus, cache_dir=tmp_path / "idx")
    second = BM25Search(corpus, cache_dir=tmp_path / "idx")
    assert first.built and not second.built
    hits = second.search(["Who wrote Dune?", "zzzz unknown words", ""], 2)
    assert hits == first.search(["Who wrote Dune?", "zzzz unknown words", ""], 2)
    assert [h.doc_id for h in hits[0]] == ["a", "c"] and hits[1] == [] and hits[2] == []
    corpus.write_text(json.dumps({"title": "Other", "text": "Dune again"}) + "\n")  # new content -> new index
    third = BM25Search(corpus, cache_dir=tmp_path / "idx")
    assert third.built and third.search(["dune"], 5)[0][0].doc_id == "0"


def test_parquet_corpus_and_bad_rows(tmp_path: Path) -> None:
    pq.write_table(pa.Table.from_pylist([{"title": "T", "text": "alpha beta"}, {"title": "U", "text": "gamma"}]),
                   tmp_path / "c.parquet")
    assert [p.doc_id for p in load_corpus(tmp_path / "c.parquet")] == ["0", "1"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"title": "T", "text": "x"}\n{"title": "T"}\n')
    with pytest.raises(SearchError, match=rf"{bad}:2: 'title' must be a string and 'text' a non-empty string"):
        load_corpus(bad)
    bad.write_text('{"id": 1, "title": "T", "text": "x"}\n{"id": 1, "title": "T", "text": "y"}\n')
    with pytest.raises(SearchError, match="duplicate id '1'"):
        load_corpus(bad)


def test_format_results() -> None:
    hits = [SearchHit("1", "Dune", "Dune is  a\nnovel.", 2.0), SearchHit("2", "Herbert", "x" * 50, 1.0)]
    # "Dune is a novel." is 16 characters after whitespace squeezing: kept whole; 50 x cut to 16
    assert format_results(hits, 16) == "Doc 1 (Title: Dune) Dune is a novel.\nDoc 2 (Title: Herbert) " + "x" * 16 + " ..."
    assert format_results([], None) == "No results."


# ----------------------------------------------------------------------------------------------- local servers


def _answer(path: str, body: dict, headers: Any) -> tuple[int, Any]:
    """A Search-R1 retriever at /retrieve and a Serper-style API at /search (key "sekret")."""
    if path == "/retrieve":
        return 200, {"result": [
            [{"document": {"id": f"{q}-{i}", "contents": f'"Title {i}"\ntext for {q}'}, "score": 1.0 - i / 10}
             for i in range(body["topk"])]
            for q in body["queries"]]}
    if path == "/search" and headers.get("X-API-KEY") == "sekret":
        return 200, {"organic": [{"title": f"T{i}", "link": f"https://x/{i}", "snippet": f"{body['q']} {i}",
                                  "position": i + 1} for i in range(body["num"])]}
    return 403, None


@pytest.fixture()
def server() -> Iterator[JsonServer]:
    with JsonServer(_answer) as s:
        yield s


def test_http_backend_speaks_search_r1_retrieve(server: JsonServer, tmp_path: Path) -> None:
    cfg = SearchConfig(backend="http", url=server.url, cache=False)
    backend = make_search(cfg, home=tmp_path)
    hits = backend.search(["who wrote dune", "capital of france"], 3)
    assert server.requests[0]["path"] == "/retrieve"
    assert server.requests[0]["body"] == {"queries": ["who wrote dune", "capital of france"], "topk": 3,
                                          "return_scores": True}
    assert hits[1][0] == SearchHit("capital of france-0", "Title 0", "text for capital of france", 1.0)
    assert [len(h) for h in hits] == [3, 3]


def test_cache_hits_make_no_second_backend_call(server: JsonServer, tmp_path: Path) -> None:
    cfg = SearchConfig(backend="http", url=server.url + "/retrieve")
    first = make_search(cfg, home=tmp_path)
    assert isinstance(first, CachedSearch)
    a = first.search(["q1", "q2", "q1"], 2)
    assert len(server.requests) == 1 and server.requests[0]["body"]["queries"] == ["q1", "q2"]  # duplicates merged
    assert a[0] == a[2]
    # a new process-like instance over the same workspace: everything is served from disk
    second = make_search(cfg, home=tmp_path)
    assert second.search(["q2", "q1"], 2) == [a[1], a[0]]
    assert len(server.requests) == 1 and second.hits == 2 and second.misses == 0
    # a different k or a new query is a miss; only the miss goes to the backend
    second.search(["q1", "q3"], 2)
    second.search(["q1"], 3)
    assert [r["body"]["queries"] for r in server.requests[1:]] == [["q3"], ["q1"]]
    root = tmp_path / "cache" / "search"
    assert len(second.store) == 4 and [p.name for p in root.glob("*.sqlite3")] == ["entries.sqlite3"]
    assert not list(root.rglob("*.json"))  # one store, not a file per entry


def test_web_backend_reads_key_from_env(server: JsonServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = SearchConfig(backend="web", url=server.url + "/search", api_key_env="ARBOR_TEST_SERPER_KEY", cache=False)
    monkeypatch.delenv("ARBOR_TEST_SERPER_KEY", raising=False)
    with pytest.raises(SearchError, match="ARBOR_TEST_SERPER_KEY is not set"):
        make_search(cfg, home=tmp_path)
    monkeypatch.setenv("ARBOR_TEST_SERPER_KEY", "sekret")
    hits = make_search(cfg, home=tmp_path).search(["dune author"], 2)
    assert server.requests[0]["body"] == {"q": "dune author", "num": 2} and server.requests[0]["key"] == "sekret"
    assert hits == [[SearchHit("https://x/0", "T0", "dune author 0", 1.0), SearchHit("https://x/1", "T1",
                                                                                    "dune author 1", 0.5)]]
    monkeypatch.setenv("ARBOR_TEST_SERPER_KEY", "wrong")
    with pytest.raises(SearchError, match="HTTP 403"):
        make_search(cfg, home=tmp_path).search(["x"], 1)


def test_default_config_searches_the_shipped_corpus(tmp_path: Path) -> None:
    backend = make_search(SearchConfig(), home=tmp_path)
    hits = backend.search(["Scott Derrickson director"], 3)[0]
    assert hits[0].title == "Scott Derrickson"
    assert (tmp_path / "cache" / "bm25").is_dir() and (tmp_path / "cache" / "search").is_dir()


def test_unreadable_cache_entry_is_a_miss_and_is_repaired(server: JsonServer, tmp_path: Path) -> None:
    cached = make_search(SearchConfig(backend="http", url=server.url), home=tmp_path)
    assert isinstance(cached, CachedSearch)
    good = cached.search(["q"], 1)
    with sqlite3.connect(cached.store.path) as db:  # e.g. a foreign or truncated value: never trusted
        db.execute("""UPDATE kv SET value = '{"backend": "http:'""")
    assert cached.search(["q"], 1) == good and len(server.requests) == 2
    with sqlite3.connect(cached.store.path) as db:
        ((value,),) = db.execute("SELECT value FROM kv").fetchall()
    assert json.loads(value)["query"] == "q"
    with sqlite3.connect(cached.store.path) as db:  # an entry of another (backend, query, k) is a miss too
        db.execute("UPDATE kv SET value = ?", (json.dumps({**json.loads(value), "query": "other"}),))
    assert cached.search(["q"], 1) == good and len(server.requests) == 3


def _search_in_child(args: tuple[str, str, list[str]]) -> list[list[dict]]:
    url, home, queries = args
    backend = make_search(SearchConfig(backend="http", url=url), home=home)
    return [[h.__dict__ for h in hits] for hits in backend.search(queries, 3)]


def test_cache_is_safe_across_processes(server: JsonServer, tmp_path: Path) -> None:
    import multiprocessing as mp

    queries = [f"query {i}" for i in range(30)]
    with mp.get_context("fork").Pool(4) as pool:
        outs = pool.map(_search_in_child, [(server.url, str(tmp_path), queries[i:] + queries[:i]) for i in range(4)])
    for i, out in enumerate(outs):  # every process saw the same hits for the same query
        assert out == outs[0][i:] + outs[0][:i]
    store = KVStore(tmp_path / "cache" / "search" / "entries.sqlite3")
    assert len(store) == 30 and not list((tmp_path / "cache" / "search").rglob("*.json"))
    with sqlite3.connect(store.path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert sorted(json.loads(v)["query"] for (v,) in db.execute("SELECT value FROM kv")) == sorted(queries)
    n = len(server.requests)
    make_search(SearchConfig(backend="http", url=server.url), home=tmp_path).search(queries, 3)
    assert len(server.requests) == n  # all served from the cache the processes wrote


def _old_layout_write(root: Path, backend: str, query: str, k: int, hits: list[SearchHit]) -> Path:
    """An entry as the one-JSON-file-per-entry cache wrote it (the old layout)."""
    key = hashlib.sha256(json.dumps([backend, query, k]).encode()).hexdigest()
    path = root / key[:2] / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"backend": backend, "query": query, "k": k, "hits": [asdict(h) for h in hits]}))
    return path


def test_old_per_file_cache_is_read_through(server: JsonServer, tmp_path: Path) -> None:
    """A run resumed over an old workspace finds the results the old layout holds: no backend call for them; they
    are copied into the store (the old files stay), and only new queries reach the backend."""
    cfg = SearchConfig(backend="http", url=server.url)
    root = tmp_path / "cache" / "search"
    name = f"http:{server.url}/retrieve"
    old = {q: [SearchHit(f"{q}-old", "Old", f"cached {q}", 0.5)] for q in ("q1", "q2")}
    paths = [_old_layout_write(root, name, q, 1, hits) for q, hits in old.items()]
    cached = make_search(cfg, home=tmp_path)
    assert isinstance(cached, CachedSearch)
    assert cached.search(["q1", "q2"], 1) == [old["q1"], old["q2"]] and not server.requests
    assert cached.store.imported == 2 and len(cached.store) == 2 and all(p.exists() for p in paths)
    assert cached.search(["q2", "q3"], 1)[0] == old["q2"]
    assert [r["body"]["queries"] for r in server.requests] == [["q3"]]
    for p in paths:  # imported: found in the store without the old files
        p.unlink()
    again = make_search(cfg, home=tmp_path)
    assert again.search(["q1", "q2", "q3"], 1)[:2] == [old["q1"], old["q2"]] and len(server.requests) == 1


# ----------------------------------------------------------------------------------------------- web at scale


@pytest.fixture()
def _serper_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARBOR_TEST_SERPER_KEY", "sekret")


def _web(url: str, *, concurrency: int = 4, sleeps: list[float] | None = None, **retry: Any) -> WebSearch:
    """A web backend whose retries record their waits instead of sleeping."""
    return WebSearch(url + "/search", "ARBOR_TEST_SERPER_KEY", concurrency=concurrency,
                     retry=RetryPolicy(**retry), sleep=(sleeps if sleeps is not None else []).append)


@pytest.mark.usefixtures("_serper_key")
@pytest.mark.parametrize("concurrency", [1, 4, 8])
def test_web_batch_reaches_the_concurrency_bound_and_never_exceeds_it(tmp_path: Path, concurrency: int) -> None:
    queries = [f"query {i}" for i in range(24)]
    with SearchServer(peak=concurrency, expected=len(queries)) as srv:
        cfg = SearchConfig(backend="web", url=srv.url + "/search", api_key_env="ARBOR_TEST_SERPER_KEY",
                           concurrency=concurrency, cache=False)
        hits = make_search(cfg, home=tmp_path).search(queries, 2)
    assert srv.max_inflight == concurrency  # the server held each request until this many were in flight
    assert sorted(srv.requests) == sorted(queries)
    assert [h[0].text for h in hits] == [f"{q} 0" for q in queries]  # the batch's order


@pytest.mark.usefixtures("_serper_key")
def test_web_results_keep_batch_order_when_answers_arrive_reversed() -> None:
    queries = [f"q{i}" for i in range(6)]
    with SearchServer(order=queries[::-1]) as srv:
        hits = _web(srv.url, concurrency=6).search(queries, 1)
    assert srv.answered == queries[::-1]  # the last query was answered first
    assert [h[0].doc_id for h in hits] == [f"https://x/{q}/0" for q in queries]


@pytest.mark.usefixtures("_serper_key")
def test_web_bound_holds_across_concurrent_callers() -> None:
    """Two threads (two rollout workers sharing a backend) searching at once share the bound."""
    batches = [[f"a{i}" for i in range(8)], [f"b{i}" for i in range(8)]]
    out: dict[int, list] = {}
    with SearchServer(peak=3, expected=16) as srv:
        web = _web(srv.url, concurrency=3)
        threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, web.search(batches[i], 1)))
                   for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert srv.max_inflight == 3 and len(srv.requests) == 16
    assert [[h[0].text for h in out[i]] for i in range(2)] == [[f"{q} 0" for q in b] for b in batches]


@pytest.mark.usefixtures("_serper_key")
def test_429_honours_retry_after_then_succeeds() -> None:
    sleeps: list[float] = []
    script = {"rate limited": [(429, {"Retry-After": "0"}), (429, {"Retry-After": "1"})],
              "overloaded": [(503, {"Retry-After": "2"})]}
    with SearchServer(script=script) as srv:
        hits = _web(srv.url, concurrency=1, sleeps=sleeps).search(["rate limited", "fine", "overloaded"], 1)
    assert srv.requests == ["rate limited"] * 3 + ["fine"] + ["overloaded"] * 2
    assert sleeps == [0.0, 1.0, 2.0]  # exactly what the server asked, in order
    assert [h[0].text for h in hits] == ["rate limited 0", "fine 0", "overloaded 0"]


@pytest.mark.usefixtures("_serper_key")
def test_429_without_retry_after_backs_off_exponentially_with_jitter() -> None:
    sleeps: list[float] = []
    with SearchServer(script={"q": [(429, {}), (503, {}), (429, {"Retry-After": "soon"}), (500, {})]}) as srv:
        assert _web(srv.url, sleeps=sleeps, backoff_base_s=0.5, backoff_max_s=1.5).search(["q"], 1)[0]
    assert len(srv.requests) == 5 and len(sleeps) == 4  # an unreadable Retry-After: our own backoff
    for wait, b in zip(sleeps, [0.5, 1.0, 1.5, 1.5], strict=True):  # b = min(max, base * 2^retry): in [b/2, b]
        assert b / 2 <= wait <= b


@pytest.mark.usefixtures("_serper_key")
def test_retry_after_as_an_http_date() -> None:
    sleeps: list[float] = []
    with SearchServer(script={"q": [(429, {"Retry-After": formatdate(time.time() + 30, usegmt=True)})]}) as srv:
        _web(srv.url, sleeps=sleeps).search(["q"], 1)
    assert len(sleeps) == 1 and 25 < sleeps[0] <= 30


@pytest.mark.usefixtures("_serper_key")
def test_429_after_the_last_attempt_is_a_clear_error() -> None:
    sleeps: list[float] = []
    with SearchServer(script={"stuck": [(429, {"Retry-After": "0"})] * 10}) as srv:
        with pytest.raises(SearchError, match=r"for query 'stuck' still answered HTTP 429 \(rate limited\) after 3 "
                                              r"attempts \(search.max_attempts, last Retry-After 0 s\)"):
            _web(srv.url, sleeps=sleeps, max_attempts=3).search(["fine", "stuck"], 1)
    assert srv.requests.count("stuck") == 3 and sleeps == [0.0, 0.0]


@pytest.mark.usefixtures("_serper_key")
def test_retry_after_beyond_the_cap_fails_at_once() -> None:
    sleeps: list[float] = []
    with SearchServer(script={"quota": [(429, {"Retry-After": "86400"})]}) as srv:
        with pytest.raises(SearchError, match=r"query 'quota' answered HTTP 429 asking to retry after 86400 s, "
                                              r"more than search.retry_after_max_s=120"):
            _web(srv.url, sleeps=sleeps).search(["quota"], 1)
    assert srv.requests == ["quota"] and not sleeps


@pytest.mark.usefixtures("_serper_key")
def test_a_failing_query_in_a_concurrent_batch_is_named() -> None:
    with SearchServer(script={"bad query": [(400, {})]}) as srv:
        with pytest.raises(SearchError, match=r"for query 'bad query' answered HTTP 400"):
            _web(srv.url).search(["ok 1", "bad query", "ok 2"], 1)


def test_http_backend_retries_429_too() -> None:
    sleeps: list[float] = []
    with SearchServer(script={"first": [(429, {"Retry-After": "1"})]}) as srv:
        backend = HttpSearch(srv.url, retry=RetryPolicy(max_attempts=2), sleep=sleeps.append)
        hits = backend.search(["first", "second"], 2)
        assert sleeps == [1.0] and srv.requests == ["first", "first"]
        assert [h[0].text for h in hits] == ["first", "second"]
        srv.script["first"] = [(503, {"Retry-After": "0"})] * 2
        with pytest.raises(SearchError, match=r"batch of 1 queries \(first 'first'\) still answered HTTP 503 "
                                              r"\(unavailable\) after 2 attempts"):
            backend.search(["first"], 2)


def test_search_config_retry_and_concurrency_keys() -> None:
    cfg = SearchConfig(concurrency=32, max_attempts=2, backoff_base_s=0.1, backoff_max_s=1.0, retry_after_max_s=5)
    assert RetryPolicy.from_config(cfg) == RetryPolicy(2, 0.1, 1.0, 5.0)
    assert SearchConfig().concurrency == 16 and SearchConfig().max_attempts == 5
    for bad in ({"concurrency": 0}, {"max_attempts": 0}, {"backoff_base_s": -1}):
        with pytest.raises(ValueError):
            SearchConfig(**bad)  # type: ignore[arg-type]
