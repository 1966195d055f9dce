"""The single-file cache store (storage/kvstore.py): round trips, several writing processes, kill -9
mid-write, the read-through of the old one-file-per-entry layout, and the judge cache on top of it (a run resumed
over an old workspace does not pay the judge twice)."""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai_server import OpenAIServer

from arbor.config.judge import JudgeConfig
from arbor.llm import make_judge
from arbor.llm.cache import ResponseCache
from arbor.storage.kvstore import STORE_FILE, KVStore, KVStoreError
from arbor.tasks.reporting.accuracy import ACCURACY

KEY_ENV = "ARBOR_TEST_KV_JUDGE_KEY"


def _key(i: int) -> str:
    return f"{i:064x}"


def _value(i: int) -> dict:
    return {"content": f"answer {i} é", "pad": "x" * (i % 97), "prompt_tokens": i}


def test_round_trip_replace_and_misses(tmp_path: Path) -> None:
    store = KVStore(tmp_path / "s.sqlite3")
    assert store.get(_key(1)) is None and len(store) == 0 and store.legacy_dir is None
    store.put(_key(1), _value(1))
    store.put_many((_key(i), _value(i)) for i in range(2, 1200))  # more keys than one SELECT ... IN takes
    assert store.get(_key(1)) == _value(1)
    got = store.get_many([_key(i) for i in range(0, 1300)] + [_key(5)])
    assert got == {_key(i): _value(i) for i in range(1, 1200)} and len(store) == 1199
    store.put(_key(1), {"content": "newer"})  # the last writer wins, as the atomic rename did
    assert store.get(_key(1)) == {"content": "newer"}
    store.put_many([(_key(1), {"content": "older"})], replace=False)  # an import keeps what is there
    assert store.get(_key(1)) == {"content": "newer"}
    with sqlite3.connect(store.path) as db:
        db.execute("UPDATE kv SET value = '{\"content\": ' WHERE key = ?", (_key(2),))  # a torn foreign write
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert store.get(_key(2)) is None  # unreadable: a miss
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))) == ["s.sqlite3"]
    store.close()


def test_threads_share_one_store(tmp_path: Path) -> None:
    """The judge writes through ``asyncio.to_thread`` from many threads while the event loop reads."""
    store = KVStore(tmp_path / "s.sqlite3")
    threads = [threading.Thread(target=lambda t=t: [store.put(_key(t * 100 + i), _value(i)) or store.get(_key(i))
                                                    for i in range(100)]) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store) == 800 and store.get(_key(799)) == _value(99)


def _write_many(args: tuple[str, int]) -> int:
    path, worker = args
    store = KVStore(path)
    for i in range(300):  # keys 0..199 written by every process, 200 of their own each
        key = i if i < 200 else 1000 * (worker + 1) + i
        store.put(_key(key), _value(key))
        assert store.get(_key(key)) == _value(key)
    store.put_many((_key(10_000 * (worker + 1) + i), _value(i)) for i in range(100))
    return len(store)


def test_several_processes_write_at_once(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    with mp.get_context("fork").Pool(4) as pool:
        assert all(n >= 300 for n in pool.map(_write_many, [(str(path), w) for w in range(4)]))
    store = KVStore(path)
    assert len(store) == 200 + 4 * 100 + 4 * 100
    assert store.get_many([_key(i) for i in range(200)]) == {_key(i): _value(i) for i in range(200)}
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


_INHERITED: list[KVStore] = []  # a store the fork()ed children inherit, open connections and all


def _child_uses_inherited(i: int) -> dict:
    (store,) = _INHERITED
    store.put(_key(100 + i), _value(i))
    return store.get(_key(1))


def test_a_forked_child_opens_its_own_connection(tmp_path: Path) -> None:
    store = KVStore(tmp_path / "s.sqlite3")
    store.put(_key(1), _value(1))
    _INHERITED[:] = [store]
    try:
        with mp.get_context("fork").Pool(2) as pool:  # the store crossed fork(): each child reconnects
            assert pool.map(_child_uses_inherited, range(4)) == [_value(1)] * 4
    finally:
        _INHERITED.clear()
    assert store.get_many([_key(100 + i) for i in range(4)]) == {_key(100 + i): _value(i) for i in range(4)}
    copy = pickle.loads(pickle.dumps(store))  # and pickling (a judge sent to a worker) reopens the file
    copy.put(_key(2), _value(2))
    assert store.get(_key(2)) == _value(2)


WRITER = """
import sys
from arbor.storage.kvstore import KVStore
store = KVStore(sys.argv[1])
batch = 0
while True:
    store.put_many((f"{batch:08d}-{i:04d}", {"batch": batch, "i": i, "text": "y" * 4000}) for i in range(50))
    batch += 1
    print(batch, flush=True)
"""


def test_kill_9_mid_write_leaves_no_half_written_entry(tmp_path: Path) -> None:
    """A writer killed by SIGKILL while it writes 50-entry batches: the store is intact, every entry whole, and
    every batch all there or not at all."""
    path = tmp_path / "s.sqlite3"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # committed batches, as the writer reports them
        if int(line) >= 40:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    store = KVStore(path)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        rows = db.execute("SELECT key, value FROM kv").fetchall()
    assert len(rows) >= 40 * 50 and len(rows) % 50 == 0  # committed batches survive; a torn one is gone whole
    for key, text in rows:
        value = json.loads(text)
        assert key == f"{value['batch']:08d}-{value['i']:04d}" and value["text"] == "y" * 4000
    store.put("after", {"ok": True})  # and the store takes writes again
    assert store.get("after") == {"ok": True}


def test_not_a_store_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / STORE_FILE
    path.write_bytes(b"this is not a SQLite database, just some bytes " * 100)
    with pytest.raises(KVStoreError, match=rf"{path}: not a usable SQLite cache store .*move it away"):
        KVStore(path)


def _old_layout(root: Path, key: str, value: object) -> Path:
    path = root / key[:2] / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))
    return path


def test_old_layout_is_read_through_and_imported(tmp_path: Path) -> None:
    old = {_key(i): _value(i) for i in (1, 2, 3)}
    paths = [_old_layout(tmp_path, k, v) for k, v in old.items()]
    (tmp_path / _key(4)[:2] / f"{_key(4)}.json").write_text('{"content": "tor')  # a torn old entry: a miss
    store = KVStore(tmp_path / STORE_FILE, legacy_dir=tmp_path)
    assert store.legacy_dir == tmp_path and len(store) == 0
    assert store.get(_key(1)) == old[_key(1)] and store.imported == 1
    assert store.get_many([_key(i) for i in range(5)]) == old and store.imported == 3 and len(store) == 3
    for p in paths:
        p.unlink()  # imported: the store answers alone
    assert KVStore(tmp_path / STORE_FILE, legacy_dir=tmp_path).get_many(list(old)) == old
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert KVStore(fresh / STORE_FILE, legacy_dir=fresh).legacy_dir is None  # nothing old: no look-ups at all


def test_response_cache_round_trip_and_old_entries(tmp_path: Path) -> None:
    root = tmp_path / "cache" / "judge"
    _old_layout(root, "cd" * 32, {"content": "old"})
    c = ResponseCache(root)
    assert c.get("ab" * 32) is None and c.get("cd" * 32) == {"content": "old"}
    c.put("ab" * 32, {"content": "x"})
    c.put("ab" * 32, {"content": "y"})  # a second writer of the same key replaces, never corrupts
    assert c.get("ab" * 32) == {"content": "y"}
    assert ResponseCache(root).get("ab" * 32) == {"content": "y"}  # another instance (process) sees it
    assert (root / STORE_FILE).is_file() and not list(root.rglob("*.tmp"))


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIServer]:
    monkeypatch.setenv(KEY_ENV, "sk-kv-test")
    with OpenAIServer(api_key="sk-kv-test") as srv:
        yield srv


def _judge_batch(server: OpenAIServer, home: Path) -> list:
    cfg = JudgeConfig(backend="openai", base_url=server.base_url, api_key_env=KEY_ENV, model="test-judge",
                      timeout_s=5.0, max_retries=1, backoff_base_s=0.001, backoff_max_s=0.01)
    judge = make_judge(cfg, home=home)

    async def go() -> list:
        try:
            return list(await asyncio.gather(*[judge.ask(ACCURACY, question=f"Capital of country {i}?",
                                                         golds=["Paris"], prediction="Paris")
                                                for i in range(6)]))
        finally:
            await judge.aclose()

    return asyncio.run(go())


def test_resumed_run_over_an_old_judge_cache_does_not_pay_twice(server: OpenAIServer, tmp_path: Path) -> None:
    """An old workspace's judge cache (one JSON file per key) is found by the new store: a resume makes no call."""
    first = _judge_batch(server, tmp_path / "new")
    assert all(o.ok and not o.cache_hit for o in first) and sum(server.counts.values()) == 6
    old_root = tmp_path / "old" / "cache" / "judge"  # the same answers, as the old layout held them
    with sqlite3.connect(tmp_path / "new" / "cache" / "judge" / STORE_FILE) as db:
        for key, text in db.execute("SELECT key, value FROM kv"):
            _old_layout(old_root, key, json.loads(text))
    resumed = _judge_batch(server, tmp_path / "old")
    assert all(o.cache_hit for o in resumed) and [o.value for o in resumed] == [o.value for o in first]
    assert sum(server.counts.values()) == 6  # not one paid call more
    assert len(KVStore(old_root / STORE_FILE)) == 6  # imported into the store on the way
