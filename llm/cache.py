"""Content-hash response cache: validated judge replies by key in one SQLite store,
``{home}/cache/judge/entries.sqlite3`` (``storage.kvstore``: why SQLite in WAL mode, not a file per entry).

A reader sees a whole entry or none (each write is one transaction, kill -9 included), several processes (rollout
workers, a resumed run) read and write it at once, and 32 concurrent coroutines write through ``asyncio.to_thread``
without corrupting each other. Only validated responses are stored; failures are never cached; an unreadable entry
is a miss (the call is made again). Old workspaces (one JSON file per key under ``<k[:2]>/<k>.json``, the earlier
layout) are read through and their entries copied into the store, so a resumed run never pays the judge twice.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from arbor.storage.kvstore import STORE_FILE, KVStore


def cache_key(role: str, model: str, prompt_version: str, messages: list[dict[str, str]],
              params: dict[str, Any]) -> str:
    """sha256 over (role, model, prompt version, rendered messages, sampling params)."""
    payload = json.dumps(
        {"role": role, "model": model, "prompt_version": prompt_version, "messages": messages, "params": params},
        sort_keys=True, ensure_ascii=False,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def prompt_hash(messages: list[dict[str, str]]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


class ResponseCache:
    """``key -> entry`` (a JSON object) under ``root``: the store ``root/entries.sqlite3``, and ``root`` itself
    read through when it holds entries of the old one-file-per-key layout."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.store = KVStore(self.root / STORE_FILE, legacy_dir=self.root)

    def get(self, key: str) -> dict[str, Any] | None:
        entry = self.store.get(key)
        return entry if isinstance(entry, dict) else None

    def put(self, key: str, entry: dict[str, Any]) -> None:
        self.store.put(key, entry)
