"""A persistent key -> JSON value store in one SQLite file, shared by the search result cache
(``tasks.env.search.CachedSearch``) and the judge reply cache (``llm.cache.ResponseCache``).

Why one SQLite file in WAL mode, and not one JSON file per entry or DuckDB:

- **Scale.** An 8B run makes ~10^5 cache entries. One file each means 10^5 inodes, a directory tree of 256
  folders, and on a shared filesystem an open / write / rename / close round trip per entry (metadata operations
  are what a network filesystem is slowest at). One table in one file holds them in a few MiB (bench/search_cache.py
  measures both).
- **Several processes writing at once.** Rollout workers and a resumed run open the same file. SQLite serialises
  writers with its own file locks and, in WAL mode, readers never wait for a writer nor a writer for readers: each
  reader sees the last committed state. A writer that finds the write lock taken waits for it (``timeout_s``, the
  busy timeout) instead of failing. DuckDB, by contrast, lets one process open a database file for writing at a
  time, so a second worker could not even open the cache.
- **Atomic per entry, and kill -9 safe.** Every ``put`` is one transaction (``put_many`` one transaction for the
  batch): after a crash, even SIGKILL mid-write, the next opener rolls back whatever was not committed, so a
  reader sees the whole entry or none of it. ``synchronous=NORMAL``: a committed entry survives a process crash
  (it is in the WAL, in the OS's page cache); only a power loss can drop the last few commits, which a cache can
  afford (a lost entry is a miss: the call is made again), and it spares an fsync on every write.
- **Last writer wins,** as with the old atomic rename: two processes that miss the same key both store it; both hold
  the same kind of validated answer.

Caveat: WAL needs the processes on one host (its index is shared memory, the ``-shm`` file). Rollout workers and a
resumed run are on one host; processes on *different* hosts sharing one cache over NFS are not supported (nor were
they safe with SQLite's other journal modes, whose locks NFS does not reliably honour).

**Migration.** A cache directory of the old layout (``<dir>/<key[:2]>/<key>.json``, the layout both caches used) is
read through: a key missing from the store is looked up there, and when found it is copied into the store, so a
run resumed over an old workspace never pays for an answer it already has. The old files are left as they are.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

STORE_FILE = "entries.sqlite3"  # the store's name inside a cache directory
_CHUNK = 500  # keys per SELECT ... IN (...): under SQLite's bound-parameter limit


class KVStoreError(RuntimeError):
    """The store file cannot be opened or is not a SQLite database (names the file)."""


class KVStore:
    """``key -> JSON value`` in the SQLite file ``path``; ``legacy_dir``: an old per-file cache read through.

    Thread-safe (one reading and one writing connection, each behind a lock, so a reader never waits behind a
    writer that waits for another process's write lock) and fork-aware (a child process opens its own
    connections). A value that no longer parses as JSON is a miss, as an unreadable file was."""

    def __init__(self, path: str | os.PathLike[str], *, legacy_dir: str | os.PathLike[str] | None = None,
                 timeout_s: float = 60.0) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s
        self.legacy_dir = Path(legacy_dir) if legacy_dir is not None and _has_legacy(Path(legacy_dir)) else None
        self.imported = 0  # entries copied from legacy_dir into the store by this instance
        self._read_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._pid = -1
        self._reader: sqlite3.Connection | None = None
        self._writer: sqlite3.Connection | None = None
        self._connect()

    # ---- connections ------------------------------------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        # isolation_level=None: autocommit; a write is its own transaction or an explicit BEGIN IMMEDIATE (which
        # takes the write lock up front, so the busy timeout applies instead of a deadlock-avoiding SQLITE_BUSY)
        conn = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def _connect(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.timeout_s
        while True:
            writer: sqlite3.Connection | None = None
            try:
                writer = self._open()
                # switching to WAL needs a moment alone with the file; several first openers may race for it
                # statements are read to their end (fetchall): a half-read cursor would hold a read transaction
                # open, and an open reader keeps checkpoints from recycling the WAL
                (mode,), = writer.execute("PRAGMA journal_mode=WAL").fetchall()
                if str(mode).lower() != "wal":
                    raise KVStoreError(f"{self.path}: SQLite refused WAL mode (journal_mode={mode}); the cache "
                                       "needs a local filesystem")
                # a rowid table, not WITHOUT ROWID: entries of ~1 KiB are far past the ~200 bytes a WITHOUT ROWID
                # row should stay under (measured: 3x the file size and a third of the write rate)
                writer.execute("CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                reader = self._open()
                break
            except sqlite3.OperationalError as e:
                if writer is not None:
                    writer.close()
                if ("locked" not in str(e) and "busy" not in str(e)) or time.monotonic() > deadline:
                    raise KVStoreError(f"{self.path}: cannot open the cache store: {e}") from e
                time.sleep(0.01)
            except sqlite3.DatabaseError as e:
                raise KVStoreError(f"{self.path}: not a usable SQLite cache store ({e}); move it away to start an "
                                   "empty cache") from e
        self._reader, self._writer, self._pid = reader, writer, os.getpid()

    def _conns(self) -> tuple[sqlite3.Connection, sqlite3.Connection]:
        if self._pid != os.getpid():  # forked: SQLite connections must not cross fork(); the parent keeps its own
            self._read_lock, self._write_lock = threading.Lock(), threading.Lock()
            self._connect()
        assert self._reader is not None and self._writer is not None
        return self._reader, self._writer

    def __getstate__(self) -> dict[str, Any]:  # pickled / deep-copied (a judge sent to a worker): reopen there
        return {"path": self.path, "timeout_s": self.timeout_s, "legacy_dir": self.legacy_dir}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path, self.timeout_s, self.legacy_dir = state["path"], state["timeout_s"], state["legacy_dir"]
        self.imported, self._pid = 0, -1
        self._read_lock, self._write_lock = threading.Lock(), threading.Lock()
        self._connect()

    def close(self) -> None:
        for conn in (self._reader, self._writer):
            if conn is not None and self._pid == os.getpid():
                conn.close()
        self._reader = self._writer = None
        self._pid = -1

    # ---- reads ------------------------------------------------------------------------------------------------
    def get(self, key: str) -> Any | None:
        return self.get_many([key]).get(key)

    def get_many(self, keys: Sequence[str]) -> dict[str, Any]:
        """The entries found (store first, then the legacy directory); missing and unreadable keys are absent."""
        reader, _ = self._conns()
        wanted = list(dict.fromkeys(keys))
        raw: dict[str, str] = {}
        with self._read_lock:
            for i in range(0, len(wanted), _CHUNK):
                part = wanted[i:i + _CHUNK]
                rows = reader.execute("SELECT key, value FROM kv WHERE key IN (SELECT value FROM json_each(?))",
                                      (json.dumps(part),))
                raw.update(rows.fetchall())
        out: dict[str, Any] = {}
        for key, text in raw.items():
            try:
                out[key] = json.loads(text)
            except ValueError:
                continue
        if self.legacy_dir is not None:
            found = {}
            for key in wanted:
                if key not in out and (value := self._legacy_get(key)) is not None:
                    found[key] = out[key] = value
            if found:
                self.put_many(found.items(), replace=False)
                self.imported += len(found)
        return out

    def _legacy_get(self, key: str) -> Any | None:
        assert self.legacy_dir is not None
        try:
            return json.loads((self.legacy_dir / key[:2] / f"{key}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def __len__(self) -> int:
        reader, _ = self._conns()
        with self._read_lock:
            (count,), = reader.execute("SELECT count(*) FROM kv").fetchall()
        return int(count)

    # ---- writes -----------------------------------------------------------------------------------------------
    def put(self, key: str, value: Any) -> None:
        self.put_many([(key, value)])

    def put_many(self, items: Iterable[tuple[str, Any]], *, replace: bool = True) -> None:
        """Store the entries in one transaction (all or none of them survive a crash). ``replace=False``: keep an
        entry already there (a legacy import never overwrites a newer answer)."""
        rows = [(key, json.dumps(value, ensure_ascii=False)) for key, value in items]
        if not rows:
            return
        _, writer = self._conns()
        verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
        with self._write_lock:
            writer.execute("BEGIN IMMEDIATE")
            try:
                writer.executemany(f"{verb} INTO kv (key, value) VALUES (?, ?)", rows)
            except BaseException:
                writer.execute("ROLLBACK")
                raise
            writer.execute("COMMIT")


def _has_legacy(root: Path) -> bool:
    """Whether ``root`` holds entries of the old layout (``<key[:2]>/`` folders); checked once, when opened."""
    try:
        return any(p.is_dir() and len(p.name) == 2 for p in root.iterdir())
    except OSError:
        return False
