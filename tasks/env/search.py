"""Search backends behind one interface, and a persistent result cache (paper §4.1).

    backend.search(queries: list[str], k: int) -> list[list[SearchHit]]      (one list of top-k hits per query)

- ``bm25``: bm25s over a local corpus file (JSONL or Parquet rows ``{id?, title, text}``); the index is built once
  and stored under ``{home}/cache/bm25/<corpus hash>/``. Default corpus: ``data/corpus/wiki_passages.jsonl``, the
  deduplicated Wikipedia paragraphs of the shipped offline HotpotQA / MuSiQue / 2Wiki files (``build_corpus``).
  ``search.corpus: <prefix>:<name>`` is the corpus file of a registered source (``tasks.env.sources``), which the
  source writes under ``{home}`` from the run's config.
- ``http``: a retriever service with Search-R1's ``/retrieve`` interface (a batch is one request).
- ``web``: a Serper-style web search API (the paper searched Google, 10 results per query); key from the env. A
  batch's queries go out concurrently, at most ``search.concurrency`` in flight per backend; results keep the
  batch's order.
- Both remote backends retry (``RetryPolicy``): HTTP 429 / 503 after the server's ``Retry-After`` (seconds or an
  HTTP date) or else exponential backoff with jitter, other 5xx and connection errors with backoff, at most
  ``search.max_attempts`` attempts; then a ``SearchError`` naming the query. A server that takes a request and
  sends no byte for ``search.stall_s`` seconds is a stall (``arbor.runtime.liveness.DependencyStalled``): not retried,
  the run ends naming it.
- ``CachedSearch``: (backend, query, k) -> hits in one SQLite store, ``{home}/cache/search/entries.sqlite3``
  (``storage.kvstore``: atomic per entry, safe across processes and kill -9), so re-runs and resumes never call the
  backend twice. Entries of the earlier one-JSON-file-per-entry layout in that folder are read through.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from arbor.config import ArborConfig
from arbor.config.search import SearchConfig
from arbor.jsonl import jsonl_rows
from arbor.paths import PROJECT_ROOT
from arbor.plugins import PluginError, check_signature, load_plugin
from arbor.runtime.liveness import DependencyStalled, transport_timeout
from arbor.runtime.retry_after import backoff_s, requested_wait_s
from arbor.storage.kvstore import STORE_FILE, KVStore
from arbor.tasks.env.sources import spec_source

BM25_TOKENIZER = "bm25s-0.3:lower,stopwords=en,no-stemmer"  # part of the index cache key


class SearchError(RuntimeError):
    """A backend failed (HTTP status, bad response, missing key) or a corpus row is invalid (names file:line)."""


@dataclass(frozen=True)
class SearchHit:
    doc_id: str
    title: str
    text: str
    score: float


class SearchBackend(Protocol):
    """One interface for every backend. ``name`` identifies the backend *and its data* (used as cache key)."""

    name: str

    def search(self, queries: list[str], k: int) -> list[list[SearchHit]]: ...


# ----------------------------------------------------------------------------------------------- corpus + BM25


@dataclass(frozen=True)
class Passage:
    doc_id: str
    title: str
    text: str


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _check_row(row: Any, where: str, index: int) -> Passage:
    if not isinstance(row, dict):
        raise SearchError(f"{where}: expected an object {{id?, title, text}}, got {type(row).__name__}")
    title, text = row.get("title"), row.get("text")
    if not isinstance(title, str) or not isinstance(text, str) or not text.strip():
        raise SearchError(f"{where}: 'title' must be a string and 'text' a non-empty string")
    doc_id = row.get("id", row.get("doc_id"))
    if doc_id is None:
        doc_id = str(index)
    elif not isinstance(doc_id, (str, int)):
        raise SearchError(f"{where}: 'id' must be a string or integer")
    return Passage(str(doc_id), title, text)


def load_corpus(path: str | Path, limit: int | None = None) -> list[Passage]:
    """Read a corpus file (JSONL or Parquet, rows ``{id?, title, text}``); bad rows raise naming file and line.
    ``limit``: stop after that many passages (the preflight's look at a corpus it will read in full later)."""
    path = Path(path)
    if not path.exists():
        raise SearchError(f"corpus file not found: {path}")
    out: list[Passage] = []
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise SearchError(f"{path}: not a readable Parquet file: {e}") from e
        for i, row in enumerate(table.slice(0, limit).to_pylist()):
            out.append(_check_row(row, f"{path}: row {i + 1}", i))
    else:
        for i, row in jsonl_rows(path, SearchError):
            if limit is not None and len(out) >= limit:
                break
            out.append(_check_row(row, f"{path}:{i}", len(out)))
    if not out:
        raise SearchError(f"{path}: the corpus is empty")
    ids = [p.doc_id for p in out]
    if len(set(ids)) != len(ids):
        dup = next(d for d in ids if ids.count(d) > 1)
        raise SearchError(f"{path}: duplicate id {dup!r}")
    return out


def bm25_tokenize(texts: list[str]) -> list[list[str]]:
    import bm25s

    return bm25s.tokenize(texts, lower=True, stopwords="en", return_ids=False, show_progress=False)


class BM25Search:
    """bm25s (Lucene BM25, k1=1.5, b=0.75) over ``title + text`` of each passage; index cached on disk."""

    def __init__(self, corpus: str | Path, *, cache_dir: Path | None = None) -> None:
        import bm25s

        self.corpus_path = Path(corpus)
        self.passages = load_corpus(self.corpus_path)
        self.corpus_hash = file_sha256(self.corpus_path)
        self.name = f"bm25:{self.corpus_hash[:16]}"
        key = hashlib.sha256(f"{self.corpus_hash}|{BM25_TOKENIZER}".encode()).hexdigest()[:16]
        index_dir = cache_dir / key if cache_dir is not None else None
        t0 = time.perf_counter()
        if index_dir is not None and (index_dir / "params.index.json").exists():
            self.retriever = bm25s.BM25.load(index_dir, show_progress=False)
            self.built = False
        else:
            self.retriever = bm25s.BM25()
            docs = [f"{p.title}\n{p.text}" for p in self.passages]
            self.retriever.index(bm25_tokenize(docs), show_progress=False)
            self.built = True
            if index_dir is not None:
                _save_dir_atomic(lambda d: self.retriever.save(d, show_progress=False), index_dir)
        self.load_seconds = time.perf_counter() - t0

    def search(self, queries: list[str], k: int) -> list[list[SearchHit]]:
        import numpy as np

        out: list[list[SearchHit]] = []
        for tokens in bm25_tokenize(list(queries)):
            known = [t for t in tokens if t in self.retriever.vocab_dict]
            if not known:
                out.append([])
                continue
            scores = self.retriever.get_scores(known)
            top = np.argsort(-scores, kind="stable")[:k]
            out.append(
                [
                    SearchHit(self.passages[i].doc_id, self.passages[i].title, self.passages[i].text, float(scores[i]))
                    for i in top
                    if scores[i] > 0
                ]
            )
        return out


def _save_dir_atomic(write, final: Path) -> None:
    """Write a directory under a temporary name beside ``final`` and rename it into place (first writer wins)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        write(tmp)
        os.replace(tmp, final)
    except OSError:
        if not final.exists():
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------------------------- remote backends


RETRY_AFTER_STATUSES = (429, 503)  # rate limited / overloaded: the server may say when to come back


@dataclass(frozen=True)
class RetryPolicy:
    """How a remote backend retries one request (``search.max_attempts``, ``backoff_*``, ``retry_after_max_s``)."""

    max_attempts: int = 5
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    retry_after_max_s: float = 120.0

    @classmethod
    def from_config(cls, cfg: SearchConfig) -> RetryPolicy:
        return cls(cfg.max_attempts, cfg.backoff_base_s, cfg.backoff_max_s, cfg.retry_after_max_s)

    def backoff(self, retry: int) -> float:
        """``retry_after.backoff_s`` with random jitter."""
        return backoff_s(self.backoff_base_s, self.backoff_max_s, retry, random.random())


def _post_json(client: Any, url: str, payload: dict, headers: dict | None, policy: RetryPolicy,
               sleep: Callable[[float], None], what: str) -> Any:
    """POST with retries; ``what`` names the request in errors (the query, or the batch)."""
    import httpx

    for attempt in range(1, policy.max_attempts + 1):
        last = attempt == policy.max_attempts
        try:
            r = client.post(url, json=payload, headers=headers)
        except httpx.ReadTimeout as e:  # accepted, then silent: a wedged server would wedge a retry too
            raise DependencyStalled("the search server", url, client.timeout.read) from e
        except httpx.TransportError as e:
            if last:
                raise SearchError(f"search request to {url} for {what} failed after {attempt} attempts: "
                                  f"{type(e).__name__}: {e}") from e
            sleep(policy.backoff(attempt - 1))
            continue
        if r.status_code == 200:
            try:
                return r.json()
            except ValueError as e:
                raise SearchError(f"search response from {url} for {what} is not JSON") from e
        if r.status_code in RETRY_AFTER_STATUSES:
            asked = requested_wait_s(r.headers)
            if asked is not None and asked > policy.retry_after_max_s:
                raise SearchError(f"search request to {url} for {what} answered HTTP {r.status_code} asking to "
                                  f"retry after {asked:.0f} s, more than search.retry_after_max_s="
                                  f"{policy.retry_after_max_s:g}: {r.text[:200]}")
            if last:
                hint = f", last Retry-After {asked:g} s" if asked is not None else ""
                raise SearchError(f"search request to {url} for {what} still answered HTTP {r.status_code} "
                                  f"({'rate limited' if r.status_code == 429 else 'unavailable'}) after {attempt} "
                                  f"attempts (search.max_attempts{hint}): {r.text[:200]}")
            sleep(asked if asked is not None else policy.backoff(attempt - 1))
            continue
        if r.status_code >= 500 and not last:
            sleep(policy.backoff(attempt - 1))
            continue
        raise SearchError(f"search request to {url} for {what} answered HTTP {r.status_code}: {r.text[:200]}")
    raise AssertionError("unreachable: the last attempt returns or raises")


class HttpSearch:
    """A Search-R1 style retriever: POST ``{queries, topk, return_scores: true}`` to ``.../retrieve``.

    Response shape, as read by Search-R1's client (PeterGriffinJin/Search-R1,
    ``search_r1/llm_agent/generation.py``: ``_batch_search(queries)['result']`` and ``_passages2string``, and
    ``search_r1/search/retrieval_request.py``): ``{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}``
    one list per query, where ``contents`` is ``title + "\\n" + text`` (the title often in double quotes). Without
    scores each item is the document itself; we accept both.
    """

    def __init__(self, url: str, *, timeout_s: float = 30.0, retry: RetryPolicy = RetryPolicy(),
                 sleep: Callable[[float], None] = time.sleep, stall_s: float | None = None) -> None:
        import httpx

        self.url = url if url.rstrip("/").endswith("/retrieve") else url.rstrip("/") + "/retrieve"
        self.name = f"http:{self.url}"
        self._client = httpx.Client(timeout=transport_timeout(timeout_s, stall_s or timeout_s))
        self.retry, self._sleep = retry, sleep

    def search(self, queries: list[str], k: int) -> list[list[SearchHit]]:
        if not queries:
            return []
        what = f"a batch of {len(queries)} queries (first {queries[0]!r})"
        data = _post_json(self._client, self.url, {"queries": list(queries), "topk": k, "return_scores": True}, None,
                          self.retry, self._sleep, what)
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise SearchError(f"{self.url}: expected 'result' with {len(queries)} lists, got {str(data)[:200]}")
        return [[_parse_r1_item(item, self.url) for item in per_query[:k]] for per_query in result]


def _parse_r1_item(item: Any, url: str) -> SearchHit:
    doc = item.get("document", item) if isinstance(item, dict) else None
    if not isinstance(doc, dict) or not isinstance(doc.get("contents"), str):
        raise SearchError(f"{url}: a result item lacks document.contents: {str(item)[:200]}")
    title, _, text = doc["contents"].partition("\n")
    score = item.get("score", 0.0) if "document" in item else 0.0
    return SearchHit(str(doc.get("id", "")), title.strip().strip('"'), text.strip(), float(score))


class WebSearch:
    """A Serper-style web search API: POST ``{"q": query, "num": k}`` with header ``X-API-KEY``; hits from
    ``organic[*].{title, link, snippet}``. The key is read from the environment variable ``api_key_env``.

    One request per query; a batch's queries go out concurrently, at most ``concurrency`` in flight for this
    backend (all callers together: a semaphore), each retried by ``retry``; ``sleep``: how retries wait (tests
    inject their own). The first failing query in batch order raises ``SearchError`` naming it."""

    def __init__(self, url: str, api_key_env: str, *, timeout_s: float = 30.0, concurrency: int = 16,
                 retry: RetryPolicy = RetryPolicy(), sleep: Callable[[float], None] = time.sleep,
                 stall_s: float | None = None) -> None:
        import httpx

        key = os.environ.get(api_key_env)
        if not key:
            raise SearchError(f"search.api_key_env: environment variable {api_key_env} is not set")
        self.url = url
        self.name = f"web:{url}"
        self._headers = {"X-API-KEY": key}
        self.concurrency = concurrency
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self._client = httpx.Client(timeout=transport_timeout(timeout_s, stall_s or timeout_s), limits=limits)
        self._slots = threading.BoundedSemaphore(concurrency)
        self.retry, self._sleep = retry, sleep

    def _one(self, q: str, k: int) -> list[SearchHit]:
        with self._slots:
            data = _post_json(self._client, self.url, {"q": q, "num": k}, self._headers, self.retry, self._sleep,
                              f"query {q!r}")
        organic = data.get("organic", []) if isinstance(data, dict) else []
        hits = []
        for rank, o in enumerate(organic[:k]):
            if isinstance(o, dict):
                hits.append(SearchHit(str(o.get("link", "")), str(o.get("title", "")), str(o.get("snippet", "")),
                                      1.0 / (rank + 1)))
        return hits

    def search(self, queries: list[str], k: int) -> list[list[SearchHit]]:
        if len(queries) <= 1:
            return [self._one(q, k) for q in queries]
        pool = ThreadPoolExecutor(max_workers=min(self.concurrency, len(queries)), thread_name_prefix="web-search")
        try:
            futures = [pool.submit(self._one, q, k) for q in queries]
            return [f.result() for f in futures]  # batch order; the first failure in that order raises
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # after a failure: the queued queries are not sent


# ----------------------------------------------------------------------------------------------- cache


class CachedSearch:
    """Persistent (backend, query, k) -> hits cache in front of a backend; only misses reach the backend.

    The entries live in ``root/entries.sqlite3`` (``storage.kvstore.KVStore``), keyed by sha256 of
    ``[backend name, query, k]`` as before; a ``root`` of the earlier layout (``<key[:2]>/<key>.json``) is read
    through, so an old workspace's results are still found. An entry that does not match its (backend, query, k)
    or does not parse is a miss, and is rewritten with the fresh answer."""

    def __init__(self, backend: SearchBackend, root: Path) -> None:
        self.backend = backend
        self.name = backend.name
        self.root = Path(root)
        self.store = KVStore(self.root / STORE_FILE, legacy_dir=self.root)
        self.hits = 0
        self.misses = 0

    def _key(self, query: str, k: int) -> str:
        return hashlib.sha256(json.dumps([self.backend.name, query, k]).encode()).hexdigest()

    def _entry(self, data: Any, query: str, k: int) -> list[SearchHit] | None:
        if not isinstance(data, dict) or data.get("query") != query or data.get("k") != k \
                or data.get("backend") != self.backend.name:
            return None
        try:
            return [SearchHit(**h) for h in data["hits"]]
        except (KeyError, TypeError):
            return None

    def search(self, queries: list[str], k: int) -> list[list[SearchHit]]:
        keys = [self._key(q, k) for q in queries]
        found = self.store.get_many(keys)
        out: list[list[SearchHit] | None] = [self._entry(found.get(key), q, k) for q, key in zip(queries, keys,
                                                                                                 strict=True)]
        missing = sorted({q for q, r in zip(queries, out, strict=True) if r is None})
        self.hits += len(queries) - sum(r is None for r in out)
        if missing:
            self.misses += len(missing)
            fresh = dict(zip(missing, self.backend.search(missing, k), strict=True))
            self.store.put_many((self._key(q, k), {"backend": self.backend.name, "query": q, "k": k,
                                                   "hits": [asdict(h) for h in hits]}) for q, hits in fresh.items())
            out = [r if r is not None else fresh[q] for q, r in zip(queries, out, strict=True)]
        return out  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------- factory, format


def resolve_path(path: str | Path) -> Path:
    """A relative path is taken from the working directory if it exists there, else from the project root."""
    p = Path(path)
    return p if p.is_absolute() or p.exists() else PROJECT_ROOT / p


def corpus_path(spec: str, *, home: Path, config: ArborConfig | None = None) -> Path:
    """The corpus file of ``search.corpus``: a registered source's corpus (given ``config``, default: the
    defaults), else a path (``resolve_path``)."""
    found = spec_source(spec)
    if found is None:
        return resolve_path(spec)
    source, name = found
    if source.corpus is None:
        raise SearchError(f"search.corpus {spec!r}: the source {spec.partition(':')[0]!r} serves no corpus")
    return source.corpus(name, config or ArborConfig(), home)


def make_search(cfg: SearchConfig, *, home: str | Path, config: ArborConfig | None = None) -> SearchBackend:
    """The backend named by ``cfg.backend``, behind the persistent cache at ``{home}/cache/search/``.

    ``config``: the run's config, handed to the source of a named ``cfg.corpus`` (``corpus_path``)."""
    home = Path(home)
    backend: SearchBackend
    if cfg.backend == "bm25":
        backend = BM25Search(corpus_path(cfg.corpus, home=home, config=config), cache_dir=home / "cache" / "bm25")
    elif cfg.backend == "http":
        if not cfg.url:
            raise SearchError("search.url: the http backend needs the retriever's URL")
        backend = HttpSearch(cfg.url, timeout_s=cfg.timeout_s, retry=RetryPolicy.from_config(cfg),
                             stall_s=cfg.stall_s)
    elif cfg.backend == "web":
        if not cfg.url:
            raise SearchError("search.url: the web backend needs the API endpoint URL")
        backend = WebSearch(cfg.url, cfg.api_key_env, timeout_s=cfg.timeout_s, stall_s=cfg.stall_s,
                            concurrency=cfg.concurrency,
                            retry=RetryPolicy.from_config(cfg))
    else:  # the config refuses anything but these three and import paths
        backend = PluginSearch(load_search_plugin(cfg.backend)(cfg), cfg.backend)
    return CachedSearch(backend, home / "cache" / "search") if cfg.cache else backend


SEARCH_PLUGIN_SHAPE = ("a class built as Class(search_config) with a `name` and search(queries, k) -> one list of "
                       "SearchHit per query (docs/plugins.md)")


def load_search_plugin(spec: str) -> type:
    """The ``search.backend`` plug-in class, checked (``PluginError`` naming ``search.backend``)."""
    cls = load_plugin(spec, "search.backend", SEARCH_PLUGIN_SHAPE)
    if not isinstance(cls, type) or not callable(getattr(cls, "search", None)):
        raise PluginError(f"search.backend: {spec} is not a class with a search method; expected {SEARCH_PLUGIN_SHAPE}")
    check_signature(cls, "search.backend", spec, ("search_config",), SEARCH_PLUGIN_SHAPE)
    check_signature(cls.search, "search.backend", f"{spec}.search", ("self", "queries", "k"), SEARCH_PLUGIN_SHAPE)
    return cls


class PluginSearch:
    """A user's backend, its answers checked: one list of ``SearchHit`` per query, at most k each."""

    def __init__(self, inner: Any, spec: str) -> None:
        self.inner, self.spec = inner, spec
        self.name = str(getattr(inner, "name", "") or spec)

    def search(self, queries: list[str], k: int) -> list[list[SearchHit]]:
        out = self.inner.search(list(queries), k)
        if not isinstance(out, list) or len(out) != len(queries) or not all(
                isinstance(hits, list) and all(isinstance(h, SearchHit) for h in hits) for hits in out):
            raise SearchError(f"search.backend {self.spec}: search() must return one list of SearchHit per query "
                              f"({len(queries)} queries)")
        return [hits[:k] for hits in out]


def format_results(hits: Sequence[SearchHit], max_chars: int | None = None,
                   line: str = "Doc {i} (Title: {title}) {text}") -> str:
    """The tool text the agent reads: one ``line`` per hit (arbor's ``Doc i (Title: ...) text``; the protocol
    names its own, ``arbor.format.TagProtocol.passage_line``); each text cut at max_chars."""
    lines = []
    for i, h in enumerate(hits, 1):
        text = " ".join(h.text.split())
        if max_chars is not None and len(text) > max_chars:
            text = text[:max_chars].rstrip() + " ..."
        lines.append(line.format(i=i, title=h.title, text=text))
    return "\n".join(lines) if lines else "No results."

