"""Search backends: local BM25, HTTP retriever, web API (§4.1, DESIGN §5)."""

from __future__ import annotations

from pydantic import Field, field_validator

from arbor.config.base import Section, builtin_or_plugin

SEARCH_BACKENDS = ("bm25", "http", "web")


class SearchConfig(Section):
    backend: str = Field("bm25", description="bm25 (local corpus), http (a Search-R1 /retrieve service), web (a "
                         "search API), or a plug-in class 'pkg.module:Class' (docs/plugins.md)")
    corpus: str = "data/corpus/wiki_passages.jsonl"
    top_k: int = Field(10, ge=1)
    url: str | None = None  # http retriever (Search-R1 /retrieve) or web API endpoint
    api_key_env: str = "SERPER_API_KEY"
    max_result_chars: int | None = Field(None, ge=1, description="truncate each result's text")
    timeout_s: float = Field(30.0, gt=0)
    cache: bool = Field(True, description="persistent (backend, query, k) -> hits cache under {home}/cache/search")

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        return builtin_or_plugin(v, SEARCH_BACKENDS)
