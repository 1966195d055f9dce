"""Search backends: local BM25, HTTP retriever, web API (§4.1)."""

from __future__ import annotations

from pydantic import Field, field_validator

from arbor.config.base import EnvName, Section, Url, builtin_or_plugin

SEARCH_BACKENDS = ("bm25", "http", "web")


class SearchConfig(Section):
    backend: str = Field("bm25", description="bm25 (local corpus), http (a Search-R1 /retrieve service), web (a "
                         "search API), or a plug-in class 'pkg.module:Class' (docs/plugins.md)")
    corpus: str = "data/corpus/wiki_passages.jsonl"
    top_k: int = Field(10, ge=1)
    url: Url | None = None  # http retriever (Search-R1 /retrieve) or web API endpoint
    api_key_env: EnvName = "SERPER_API_KEY"
    max_result_chars: int | None = Field(None, ge=1, description="truncate each result's text")
    timeout_s: float = Field(30.0, gt=0)
    stall_s: float | None = Field(None, gt=0, description="http / web: seconds without a byte from the server "
                                  "after which a request is a stall: not retried, the run ends naming the server "
                                  "(resumable). null: search.timeout_s (a search's reply is small)")
    concurrency: int = Field(16, ge=1, description="web backend: queries of a batch in flight at once (one "
                             "request each; results keep the batch's order). The http backend sends a batch as "
                             "one request")
    max_attempts: int = Field(5, ge=1, description="http / web: attempts per request, the first included; "
                              "retried: HTTP 429 / 503 (after Retry-After when given), other 5xx, connection errors")
    backoff_base_s: float = Field(0.5, ge=0, description="retry backoff without Retry-After: a random wait in "
                                  "[b/2, b], b = min(backoff_max_s, backoff_base_s * 2^retry)")
    backoff_max_s: float = Field(30.0, ge=0)
    retry_after_max_s: float = Field(120.0, ge=0, description="a 429 / 503 asking to wait longer than this (a spent "
                                     "daily quota) fails at once instead of waiting")
    cache: bool = Field(True, description="persistent (backend, query, k) -> hits cache, one SQLite file: "
                        "{home}/cache/search/entries.sqlite3")

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        return builtin_or_plugin(v, SEARCH_BACKENDS)
