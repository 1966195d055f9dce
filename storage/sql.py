"""Read-only SQL over a workspace (``arbor sql``, ``arbor runs``): one short read-only connection per call, so it
works while a training run writes Parquet into the same workspace (docs/architecture.md). ``arbor sql`` streams its result
(``streamed``: batches fetched by a worker thread, so Ctrl-C interrupts the query) and writes at most a cap of rows
unless told otherwise (``write_query``).

Every query arbor itself runs is a file ``sql/queries/<name>.sql`` named for its question, read with ``sql_file``;
values (run ids, steps) are bound as ``$name`` parameters, never pasted into the SQL text."""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from arbor.paths import SQL_DIR, arbor_home
from arbor.storage.catalog import CatalogError, connect
from arbor.storage.parquet import data_dir

FORMATS = ("table", "csv", "json", "parquet")
MAX_CELL = 80  # table output truncates longer cells (use csv/json/parquet for full values)
ROW_CAP = 10_000  # rows arbor sql prints unless told (--limit N, --all; --output FILE writes them all)
BATCH_ROWS = 10_000  # rows fetched at a time
QUERIES_DIR = SQL_DIR / "queries"


class SqlError(RuntimeError):
    """A query could not be run (bad SQL, a write statement on the read-only catalog, bad format/output)."""


# What arbor sql runs: statements that only read. COPY ... TO, EXPORT, ATTACH, SET, INSTALL,
# LOAD, CALL and PRAGMA are refused before anything runs, and the connection itself reads files only under the
# workspace's data folder, a setting locked for the connection's life (read_csv('/etc/...') fails, too).
READ_STATEMENTS = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """SqlError unless ``sql`` is one statement and it only reads (``READ_STATEMENTS``): several statements would
    show one result only, so each is run on its own."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as e:
        raise SqlError(str(e)) from e
    refused = [s.type.name for s in statements if s.type not in READ_STATEMENTS]
    if refused:
        raise SqlError(f"arbor sql is read-only: it runs SELECT, WITH, DESCRIBE, SHOW and EXPLAIN statements; "
                       f"refused: {', '.join(refused)}")
    if not statements:
        raise SqlError("empty query")
    if len(statements) > 1:
        raise SqlError(f"arbor sql runs one statement at a time and got {len(statements)}: run each on its own")


def confine(con: duckdb.DuckDBPyConnection, home: str | os.PathLike[str] | None) -> None:
    """Let ``con`` read files under the workspace's data folder only, and lock its configuration."""
    root = data_dir(home).rstrip("/") + "/"
    con.execute("set allowed_directories = $dirs", {"dirs": [root]})
    con.execute("set enable_external_access = false")
    con.execute("set lock_configuration = true")


@functools.cache
def sql_file(name: str) -> str:
    """The text of ``sql/queries/<name>.sql`` (read once per process)."""
    path = QUERIES_DIR / f"{name}.sql"
    if not path.is_file():
        raise SqlError(f"no query file {path} (sql/queries/{name}.sql)")
    return path.read_text()


def _open(sql: str, home: str | os.PathLike[str] | None) -> duckdb.DuckDBPyConnection:
    """A read-only, confined connection to the workspace catalog, once ``sql`` is found to be one reading statement."""
    if not sql or not sql.strip():
        raise SqlError("empty query")
    try:
        con = connect(home, read_only=True)
    except CatalogError as e:
        raise SqlError(str(e)) from e
    except (RuntimeError, duckdb.InterruptException) as e:  # Ctrl-C while the catalog's views were being built
        if "interrupted" in str(e).lower():
            raise KeyboardInterrupt from e
        raise
    try:
        check_read_only(con, sql)
        confine(con, home)
    except BaseException:
        con.close()
        raise
    return con


def _error(e: Exception) -> SqlError:
    msg = str(e)
    if "read-only mode" in msg:
        msg = f"the catalog is opened read-only; arbor sql does not run write statements ({msg})"
    return SqlError(msg)


def query(sql: str, params: Mapping[str, Any] | None = None, *,
          home: str | os.PathLike[str] | None = None) -> pa.Table:
    """Run ``sql`` with ``$name`` placeholders bound from ``params`` on a read-only connection to the workspace
    catalog; the result as Arrow."""
    con = _open(sql, home)
    try:
        rel = con.sql(sql, params=dict(params) if params else None)  # a statement without a result returns None
        return rel.to_arrow_table() if rel is not None else pa.table({})
    except duckdb.Error as e:
        raise _error(e) from e
    finally:
        con.close()


_END = object()


@contextlib.contextmanager
def streamed(sql: str, params: Mapping[str, Any] | None = None, *, home: str | os.PathLike[str] | None = None,
             batch_rows: int = BATCH_ROWS) -> Iterator[tuple[pa.Schema, Iterator[pa.RecordBatch]]]:
    """``query``'s result as its schema and its record batches, fetched by a worker thread at most two batches
    ahead: a large result never sits in memory whole, and the caller's thread stays free for Ctrl-C. Leaving the
    block before the last batch (a cap reached, KeyboardInterrupt) interrupts the query."""
    con = _open(sql, home)
    handoff: queue.Queue[Any] = queue.Queue(maxsize=2)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            reader = con.sql(sql, params=dict(params) if params else None).to_arrow_reader(batch_rows)
            if put(reader.schema):
                for batch in reader:
                    if not put(batch):
                        return
                put(_END)
        except Exception as e:  # noqa: BLE001 - handed to the caller's thread
            put(e)

    def items() -> Iterator[Any]:  # the schema, then the batches
        while (item := handoff.get()) is not _END:
            if isinstance(item, Exception):  # an error while streaming arrives through Arrow's reader as OSError
                raise _error(item) if isinstance(item, duckdb.Error | pa.ArrowException | OSError) else item
            yield item

    worker = threading.Thread(target=work, name="arbor sql", daemon=True)
    worker.start()
    try:
        rows = items()
        yield next(rows), rows
    finally:
        stop.set()
        deadline = time.monotonic() + 5.0
        while worker.is_alive() and time.monotonic() < deadline:  # an interrupt sent before the query began is lost
            con.interrupt()
            worker.join(0.05)
        if not worker.is_alive():  # else left open: closing a connection under a running query is not safe
            con.close()


class Capped:
    """The first ``cap`` rows of ``batches`` (every row when ``cap`` is None); ``more``: whether rows were left."""

    def __init__(self, batches: Iterable[pa.RecordBatch], cap: int | None) -> None:
        self.batches, self.cap, self.more = batches, cap, False

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        room = self.cap
        for batch in self.batches:
            if room is not None and batch.num_rows > room:
                if room:
                    yield batch.slice(0, room)
                self.more = True
                return
            if room is not None:
                room -= batch.num_rows
            yield batch


def has_relation(name: str, *, home: str | os.PathLike[str] | None = None) -> bool:
    """Whether the workspace catalog has a table view or view ``name`` (a method's exist once a run of it declared
    them: ``storage.catalog.declare_tables``)."""
    rows = query("select 1 from duckdb_views() where view_name = $name", {"name": name}, home=home)
    return rows.num_rows > 0


def run_file(name: str, params: Mapping[str, Any] | None = None, *,
             home: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """The rows of ``sql/queries/<name>.sql`` with ``params`` bound, as dicts."""
    return query(sql_file(name), params, home=home).to_pylist()


def _plain(v: Any) -> Any:
    if isinstance(v, datetime | date):
        return v.isoformat()
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def _cell(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list | dict):
        v = json.dumps(_plain(v))
    s = str(_plain(v)).replace("\n", "\\n")
    return s if len(s) <= MAX_CELL else s[: MAX_CELL - 1] + "…"


def _rows(batch: pa.RecordBatch) -> list[tuple[Any, ...]]:
    return list(zip(*(c.to_pylist() for c in batch.columns), strict=True))


def write_table(schema: pa.Schema, batches: Iterable[pa.RecordBatch], out: IO[str]) -> int:
    """A plain aligned text table with a row count footer; columns are as wide as the first batch needs."""
    names, widths, n = schema.names, None, 0

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths or [], strict=True)).rstrip() + "\n"

    for batch in batches:
        rows = [[_cell(v) for v in r] for r in _rows(batch)]
        if widths is None:
            widths = [max([len(name)] + [len(r[i]) for r in rows]) for i, name in enumerate(names)]
            out.write(line(names) + line(["-" * w for w in widths]))
        out.writelines(line(r) for r in rows)
        n += len(rows)
    if widths is None:
        widths = [len(name) for name in names]
        out.write(line(names) + line(["-" * w for w in widths]))
    out.write(f"({n} row{'s' if n != 1 else ''})\n")
    return n


def write_csv(schema: pa.Schema, batches: Iterable[pa.RecordBatch], out: IO[str]) -> int:
    w = csv.writer(out, lineterminator="\n")
    w.writerow(schema.names)
    n = 0
    for batch in batches:
        for r in _rows(batch):
            w.writerow(["" if v is None else json.dumps(_plain(v)) if isinstance(v, list | dict) else _plain(v)
                        for v in r])
            n += 1
    return n


def write_json(schema: pa.Schema, batches: Iterable[pa.RecordBatch], out: IO[str]) -> int:
    """One JSON array of row objects (what ``json.dumps`` of the list of rows gives), written row by row."""
    out.write("[")
    n = 0
    for batch in batches:
        for r in _rows(batch):
            out.write((", " if n else "") + json.dumps(_plain(dict(zip(schema.names, r, strict=True))), default=str))
            n += 1
    out.write("]\n")
    return n


def write_parquet(schema: pa.Schema, batches: Iterable[pa.RecordBatch], out: IO[bytes]) -> int:
    n = 0
    with pq.ParquetWriter(out, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
            n += batch.num_rows
    return n


WRITERS: dict[str, Callable[[pa.Schema, Iterable[pa.RecordBatch], Any], int]] = {
    "table": write_table, "csv": write_csv, "json": write_json, "parquet": write_parquet}


def render(tbl: pa.Table, fmt: str = "table") -> str:
    """``tbl`` as ``table``, ``csv`` or ``json`` text."""
    buf = io.StringIO()
    WRITERS[fmt](tbl.schema, tbl.combine_chunks().to_batches(), buf)  # one batch: the table's columns aligned
    return buf.getvalue().rstrip("\n")


def check_format(fmt: str, output: str | os.PathLike[str] | None = None) -> None:
    """Refuse an unknown format or parquet without a file."""
    if fmt not in FORMATS:
        raise SqlError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "parquet" and output is None:
        raise SqlError("--format parquet needs --output FILE")


def check_output(output: str | os.PathLike[str], home: str | os.PathLike[str] | None = None, *,
                 force: bool = False) -> Path:
    """Where ``--output`` may write, resolved: a file outside the workspace (whose files are never replaced), in a
    folder that exists, and not an existing file unless ``force``."""
    target = Path(output).expanduser().resolve()
    root = Path(home).expanduser().resolve() if home is not None else arbor_home()
    if target.is_dir():
        raise SqlError(f"--output {output} is a folder: name a file, e.g. --output {Path(output) / 'result.csv'}")
    if target == root or root in target.parents:
        raise SqlError(f"--output {output} is inside the workspace {root}: name a file outside it")
    if not target.parent.is_dir():
        raise SqlError(f"--output {output}: folder {target.parent} does not exist")
    if target.exists() and not force:
        raise SqlError(f"--output {output} already exists: add --force to replace it, or name a new file")
    return target


def write_query(sql: str, fmt: str = "table", output: str | os.PathLike[str] | None = None, *,
                cap: int | None = ROW_CAP, params: Mapping[str, Any] | None = None,
                home: str | os.PathLike[str] | None = None, out: IO[str] | None = None) -> tuple[int, bool]:
    """Run ``sql`` read-only and write at most ``cap`` rows (None: all) as ``fmt`` to the file ``output`` (as
    ``check_output`` passed it; it appears only once complete) or to ``out`` (default stdout). Returns (rows
    written, whether more were left)."""
    check_format(fmt, output)
    with streamed(sql, params, home=home) as (schema, batches):
        rows = Capped(batches, cap)
        if output is None:
            return WRITERS[fmt](schema, rows, out or sys.stdout), rows.more
        target = Path(output)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.inprogress")
        try:
            with open(tmp, "wb" if fmt == "parquet" else "w") as fh:
                n = WRITERS[fmt](schema, rows, fh)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return n, rows.more
