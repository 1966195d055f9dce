"""Content-hash response cache: validated judge replies by key in one SQLite store,
``{home}/cache/judge/entries.sqlite3`` (``storage.kvstore``: why SQLite in WAL mode, not a file per entry).

A reader sees a whole entry or none (each write is one transaction, kill -9 included), several processes (rollout
workers, a resumed run) read and write it at once, and 32 concurrent coroutines write through ``asyncio.to_thread``
without corrupting each other. Only validated responses are stored; failures are never cached; an unreadable entry
is a miss (the call is made again). Old workspaces (one JSON file per key under ``<k[:2]>/<k>.json``, the earlier
layout) are read through and their entries copied into the store, so a resumed run never pays the judge twice.

An entry also records who paid for it: ``paid_by`` = {run_id, attempt} (``attempt``: the paying
process, ``process_attempt``) and ``cost_usd``, so that a run's spend survives a kill (``payment_carried``).

The key holds the served model's identity (``served_identity``: what the endpoint's ``GET /models`` reports for it),
not the endpoint's URL: another GGUF behind the same model name misses, the same model behind a new URL hits.
Entries written before the identity was part of the key are keyed by the name alone; they are read only where the
endpoint reports nothing of its model (no ``/models`` route, the model not listed), since which model wrote them
is unknown.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from arbor.storage.heartbeat import host_name, pid_start_time
from arbor.storage.kvstore import STORE_FILE, KVStore


@cache
def _attempt(pid: int) -> str:
    return f"{host_name()}:{pid}:{pid_start_time(pid) or ''}"


def process_attempt() -> str:
    """This process as a payer: host, pid and the pid's start time (a reused pid is another process)."""
    return _attempt(os.getpid())


def payment_carried(entry: Mapping[str, Any], run_id: str | None, attempt: str, ledger_has: bool,
                    carried: bool) -> float:
    """What a cache hit of run ``run_id`` in process ``attempt`` costs the run: the entry's
    ``cost_usd`` when an earlier process of the same run paid for it (killed before its stage committed the paid
    call), the run's committed ledger does not hold that payment (``ledger_has``: a row of the key with a cost), no
    hit of this process carried it yet (``carried``), and it was not settled as a wasted prefetch (counted in
    ``steps.prefetch_wasted_cost_usd``); else 0: another run paid, this process paid, or the ledger has it."""
    paid = entry.get("paid_by")
    if not isinstance(paid, Mapping) or run_id is None or paid.get("run_id") != run_id:
        return 0.0
    if paid.get("attempt") == attempt or paid.get("settled") or ledger_has or carried:
        return 0.0
    return float(entry.get("cost_usd") or 0.0)


# The fields of a ``/models`` entry that name the weights. Left out: ``created`` (llama.cpp's server and vLLM stamp
# the time of the request), ``permission(s)`` (vLLM: a fresh random id each request), ``object``, and launch
# settings (vLLM's ``max_model_len``; llama.cpp's ``aliases``, ``tags`` and the slot context ``meta.n_ctx``).
IDENTITY_FIELDS = ("id", "owned_by", "root", "parent", "meta")
LAUNCH_META = ("n_ctx",)


def served_identity(listing: Any, model: str) -> dict[str, Any] | None:
    """What a ``GET /models`` answer says of the model that requests naming ``model`` reach: the entry with that id,
    else the only entry (a one-model server, llama.cpp's or llama-cpp-python's, answers any name with its model),
    cut to ``IDENTITY_FIELDS``; None when the answer lists no such model."""
    data = listing.get("data") if isinstance(listing, Mapping) else None
    entries = [e for e in data if isinstance(e, Mapping)] if isinstance(data, list) else []
    entry = next((e for e in entries if e.get("id") == model), entries[0] if len(entries) == 1 else None)
    if entry is None:
        return None
    out = {k: entry[k] for k in IDENTITY_FIELDS if k in entry}
    if isinstance(out.get("meta"), Mapping):
        out["meta"] = {k: v for k, v in out["meta"].items() if k not in LAUNCH_META}
    return out


def cache_key(role: str, model: str, prompt_version: str, messages: list[dict[str, str]],
              params: dict[str, Any], served: Mapping[str, Any] | None = None) -> str:
    """sha256 over (role, model, prompt version, rendered messages, sampling params) and, when the endpoint reports
    it, the served model's identity (``served_identity``); without it the key is the one of earlier releases."""
    fields = {"role": role, "model": model, "prompt_version": prompt_version, "messages": messages, "params": params}
    if served is not None:
        fields["served"] = dict(served)
    payload = json.dumps(fields, sort_keys=True, ensure_ascii=False)
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

    def settle(self, key: str) -> None:
        """Mark the payment of ``key``'s entry as accounted elsewhere (a wasted prefetch: its cost is in
        ``steps.prefetch_wasted_cost_usd``), so no later hit carries it."""
        entry = self.get(key)
        if entry is not None and isinstance(entry.get("paid_by"), dict) and not entry["paid_by"].get("settled"):
            self.put(key, {**entry, "paid_by": {**entry["paid_by"], "settled": True}})
