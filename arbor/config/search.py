"""Search backends: local BM25, HTTP retriever, web API (§4.1, DESIGN §5)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from arbor.config.base import Section


class SearchConfig(Section):
    backend: Literal["bm25", "http", "web"] = "bm25"
    corpus: str = "data/corpus/wiki_passages.jsonl"
    top_k: int = Field(10, ge=1)
    url: str | None = None  # http retriever (Search-R1 /retrieve) or web API endpoint
    api_key_env: str = "SERPER_API_KEY"
    max_result_chars: int | None = Field(None, ge=1, description="truncate each result's text")
    timeout_s: float = Field(30.0, gt=0)
    cache: bool = Field(True, description="persistent (backend, query, k) -> hits cache under {home}/cache/search")
