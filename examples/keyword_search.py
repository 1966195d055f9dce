"""A user's search tool in one class (docs/plugins.md): word-overlap ranking over a JSONL corpus of
``{title, text}`` rows (``search.corpus``). A stand-in for a company's own retriever.

    arbor train search.backend=examples.keyword_search:KeywordSearch search.corpus=my_passages.jsonl
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from arbor.config.search import SearchConfig
from arbor.tasks.env.search import SearchHit

WORD = re.compile(r"\w+")


class KeywordSearch:
    def __init__(self, search_config: SearchConfig) -> None:
        path = Path(search_config.corpus)
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        self.docs = [(f"{path.stem}-{i}", r["title"], r["text"]) for i, r in enumerate(rows)]
        self.words = [set(WORD.findall(f"{t} {x}".lower())) for _, t, x in self.docs]
        self.name = f"keyword:{path.resolve()}"  # names the backend and its data: the search cache's key

    def search(self, queries: list[str], k: int) -> list[list[SearchHit]]:
        out = []
        for q in queries:
            want = set(WORD.findall(q.lower()))
            overlap = [len(want & w) for w in self.words]
            best = sorted(range(len(self.docs)), key=lambda i: (-overlap[i], i))[:k]  # ties: corpus order
            out.append([SearchHit(*self.docs[i], float(overlap[i])) for i in best if overlap[i] > 0])
        return out
