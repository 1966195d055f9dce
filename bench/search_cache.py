"""Cache store at scale: ``--entries`` cache entries written and read through the single-file
store (``storage.kvstore.KVStore``, what ``CachedSearch`` and the judge cache use) against the layout both caches
had before, one JSON file per entry (``<root>/<key[:2]>/<key>.json`` written to a temporary name and renamed),
reimplemented here as the reference and measured in the same run on the same disk.

    python bench/search_cache.py                    # 100,000 entries of ~1 KiB (about a minute on 2 cores)
    python bench/search_cache.py --entries 20000 --dir /shared/fs/tmp

Prints, for each layout: writes/s one entry per write (the judge cache: one reply at a time), writes/s in batches
(``CachedSearch``: one batch of misses per search call), reads/s one at a time and batched (in a shuffled order),
the file count and bytes on disk (allocated blocks; the store after its last connection closed, WAL checkpointed),
and the ratio store / per-file. Each measurement runs in rounds of ``--round`` entries alternating between the two
layouts, so that load from elsewhere on the machine falls on both alike. Then the migration: reading the per-file
entries through the store (``legacy_dir``), which imports them. Reads are warm (the OS page cache holds both
layouts); the per-file layout suffers more on a shared filesystem, where every entry is a few metadata round trips,
than on the local disk this measures by default.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from arbor.storage.kvstore import STORE_FILE, KVStore


class PerFileCache:
    """The old layout (of ``llm/cache.py`` and ``CachedSearch`` before the key-value store): one JSON file per key, written to a
    unique temporary name in its folder and ``os.replace``d into place."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._dirs: set[Path] = set()

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> object | None:
        try:
            return json.loads(self._path(key).read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def put(self, key: str, value: object) -> None:
        path = self._path(key)
        if path.parent not in self._dirs:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._dirs.add(path.parent)
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:8]}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(value, f, ensure_ascii=False)
        os.replace(tmp, path)


def entries(n: int, value_bytes: int) -> list[tuple[str, dict]]:
    """Search-cache-shaped entries: sha256 keys, {backend, query, k, hits} values of about ``value_bytes``."""
    rng = random.Random(0)
    words = "search the wiki for entity attribute answer evidence query result passage title film born".split()
    out = []
    for i in range(n):
        query = f"bench query {i} " + " ".join(rng.choices(words, k=6))
        hits = [{"doc_id": f"doc{i}-{h}", "title": f"Title {h}", "score": 1.0 / (h + 1),
                 "text": " ".join(rng.choices(words, k=max(1, value_bytes // 5 // 8)))} for h in range(5)]
        key = hashlib.sha256(json.dumps(["bench", query, 5]).encode()).hexdigest()
        out.append((key, {"backend": "bench", "query": query, "k": 5, "hits": hits}))
    return out


def disk_usage(root: Path) -> tuple[int, int]:
    """(files, allocated bytes) under ``root``."""
    files = blocks = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            files += 1
            blocks += os.stat(os.path.join(dirpath, name)).st_blocks
    return files, blocks * 512


def batches(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def interleaved(work: list, round_size: int, ops: dict[str, object]) -> dict[str, float]:
    """items/s of each op over ``work``, run in rounds of ``round_size`` items that alternate between the ops (and
    which goes first), so that load from elsewhere on the machine falls on both alike."""
    spent = dict.fromkeys(ops, 0.0)
    for r, chunk in enumerate(batches(work, round_size)):
        names = list(ops) if r % 2 == 0 else list(ops)[::-1]
        for name in names:
            t0 = time.perf_counter()
            ops[name](chunk)  # type: ignore[operator]
            spent[name] += time.perf_counter() - t0
    return {name: len(work) / t for name, t in spent.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--value-bytes", type=int, default=1024, help="approximate JSON size of one entry")
    ap.add_argument("--batch", type=int, default=64, help="entries per batched write / read (a search call)")
    ap.add_argument("--round", type=int, default=5000, help="entries per round; rounds alternate the layouts")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary folder)")
    args = ap.parse_args()
    started = time.perf_counter()
    data = entries(args.entries, args.value_bytes)
    half = len(data) // 2
    single, batched = data[:half], data[half:]  # one half written entry by entry, the other in batches
    order = [k for k, _ in data]
    random.Random(1).shuffle(order)
    mean = sum(len(json.dumps(v)) for _, v in data[:1000]) / min(1000, len(data))
    print(f"search cache bench: {len(data)} entries, ~{mean:.0f} bytes of JSON each, batches of {args.batch}")

    work = Path(tempfile.mkdtemp(prefix="arbor-cache-bench-", dir=args.dir))
    try:
        old = PerFileCache(work / "per-file")
        store = KVStore(work / "store" / STORE_FILE)
        b = args.batch

        def old_put(chunk: list) -> None:
            for k, v in chunk:
                old.put(k, v)

        def old_get(keys: list) -> None:
            for k in keys:
                old.get(k)

        def store_put(chunk: list) -> None:
            for k, v in chunk:
                store.put(k, v)

        def store_get(keys: list) -> None:
            for k in keys:
                store.get(k)

        results = {
            "write1": interleaved(single, args.round, {"per-file": old_put, "store": store_put}),
            "writeB": interleaved(batched, args.round, {
                "per-file": lambda c: [old_put(x) for x in batches(c, b)],  # no batch write: entry by entry
                "store": lambda c: [store.put_many(x) for x in batches(c, b)]}),
            "read1": interleaved(order, args.round, {"per-file": old_get, "store": store_get}),
            "readB": interleaved(order, args.round, {
                "per-file": lambda c: [old_get(x) for x in batches(c, b)],
                "store": lambda c: [store.get_many(x) for x in batches(c, b)]}),
        }
        for cache in (old, store):
            assert cache.get(data[-1][0]) == data[-1][1] and cache.get(data[0][0]) == data[0][1]
        assert len(store) == len(data)
        store.close()  # the last connection checkpoints the WAL into the file and removes it
        for name, root in (("per-file", work / "per-file"), ("store", work / "store")):
            files, size = disk_usage(root)
            results.setdefault("files", {})[name] = files
            results.setdefault("bytes", {})[name] = size / 2**20

        rows = (("writes/s, one entry per write", "write1", ".0f"), ("writes/s, batches", "writeB", ".0f"),
                ("reads/s, one at a time", "read1", ".0f"), ("reads/s, batches", "readB", ".0f"),
                ("files on disk", "files", ".0f"), ("MiB on disk", "bytes", ".1f"))
        print(f"  {'':32s} {'per-file':>12s} {'store':>12s} {'store/per-file':>15s}")
        for label, key, fmt in rows:
            x, y = results[key]["per-file"], results[key]["store"]
            print(f"  {label:32s} {x:12{fmt}} {y:12{fmt}} {y / x:14.3f}x")

        migrated = KVStore(work / "per-file" / STORE_FILE, legacy_dir=work / "per-file")
        t0 = time.perf_counter()
        for x in batches(order, b):
            migrated.get_many(x)
        imported = len(order) / (time.perf_counter() - t0)
        assert migrated.imported == len(data) and len(migrated) == len(data)
        print(f"  migration: per-file entries read through the store (and imported into it): {imported:.0f}/s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"  bench wall time {time.perf_counter() - started:.0f} s (entries built, both layouts, clean-up)")


if __name__ == "__main__":
    main()
