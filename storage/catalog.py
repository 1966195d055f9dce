"""The workspace catalog ``{home}/catalog.duckdb``: schema version + views over the Parquet store (docs/architecture.md).

DuckDB locks a file opened read-write against every other process, readers included. So the
catalog holds no run data: a run's writer only writes Parquet and never opens it; readers open it read-only.
Creating or migrating the catalog takes the write lock briefly, and only when a read-only check finds it missing,
behind the newest migration, bound to another home (the workspace was moved), or built from other DDL.

DDL lives in ``sql/``: ``migrations/NNN_*.sql`` (forward-only, applied once each, recorded in ``schema_version``),
``tables/*.sql`` (one view per pipeline table) and ``views/*.sql`` (one view per audit question). ``{{data}}`` in
them is replaced by the workspace's data folder.

A method's own tables and views (its ``TableSet``) are declared in its package. A run declares them in
its workspace (``declare_tables``: each table's zero-row ``_schema.parquet``, each view's DDL under
``{data}/_views/``), so the catalog of any process, one that never imported the method included, has a view per
table found in the data folder and the views the workspace's methods declared.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import time
from pathlib import Path

import duckdb

from arbor.paths import SQL_DIR, arbor_home
from arbor.storage.parquet import _atomic_write_parquet, atomic_write_text, data_dir, table_dir, table_folders
from arbor.storage.schemas import (
    VIEWS,
    TableSet,
    empty_table,
    schema_fingerprint,
    schema_for,
    tables,
)

CATALOG_FILE = "catalog.duckdb"
_MIGRATION = re.compile(r"^(\d{3})_[A-Za-z0-9_]+\.sql$")


class CatalogError(RuntimeError):
    """The catalog could not be opened, created or migrated."""


def _home(home: str | os.PathLike[str] | None) -> Path:
    if home is None:
        return arbor_home()
    p = Path(home).expanduser().resolve()
    p.mkdir(parents=True, exist_ok=True)
    return p


def migrations(sql_dir: Path = SQL_DIR) -> list[tuple[int, str, Path]]:
    """``(version, name, path)`` of every migration, ordered; numbers must be 1..N without gaps."""
    out = []
    for p in sorted((sql_dir / "migrations").glob("*.sql")):
        m = _MIGRATION.match(p.name)
        if not m:
            raise CatalogError(f"{p}: migration files are named NNN_name.sql")
        out.append((int(m.group(1)), p.stem, p))
    for i, (v, _, p) in enumerate(out, start=1):
        if v != i:
            raise CatalogError(f"{p}: expected migration number {i:03d} (forward-only, no gaps or duplicates)")
    return out


TABLE_VIEW = ("create or replace view {name} as\nselect * from read_parquet('{{{{data}}}}/{name}/**/*.parquet', "
              "union_by_name = true, hive_partitioning = false);\n")
VIEWS_DIR = "_views"  # under the data folder: the views a run's method declared (``declare_tables``)


def _stored_tables(home: Path) -> list[str]:
    """Table folders with a schema file (a method's, declared by a run), whether or not this process knows them."""
    return [t for t in table_folders(home) if os.path.isfile(posixpath.join(data_dir(home), t, "_schema.parquet"))]


def _ddl(home: Path, sql_dir: Path) -> list[tuple[str, str, bool]]:
    """``(name, DDL, is a stored table)`` of every view to create: the pipeline's table files, a generic view per
    other known table, ``sql/views/``, then the views methods declared (this process's, then the workspace's)."""
    out: list[tuple[str, str, bool]] = [(p.stem, p.read_text(), True) for p in sorted((sql_dir / "tables").glob("*.sql"))]
    have = {name for name, _, _ in out}
    for t in sorted((set(tables()) | set(_stored_tables(home))) - have):
        out.append((t, TABLE_VIEW.format(name=t), True))
    views = {p.stem: p.read_text() for p in sorted((sql_dir / "views").glob("*.sql"))}
    for name, p in VIEWS.items():
        views.setdefault(name, p.read_text())
    for p in sorted(Path(data_dir(home), VIEWS_DIR).glob("*.sql")):
        views.setdefault(p.stem, p.read_text())
    return out + [(name, text, False) for name, text in views.items()]


def _fingerprint(home: Path, sql_dir: Path) -> str:
    h = hashlib.sha256(home.as_posix().encode())
    h.update(schema_fingerprint().encode())
    for p in [m[2] for m in migrations(sql_dir)]:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    for name, text, _ in _ddl(home, sql_dir):
        h.update(name.encode())
        h.update(text.encode())
    return h.hexdigest()[:16]


def declare_tables(declared: TableSet, home: str | os.PathLike[str] | None = None) -> None:
    """Record a method's tables and views in the workspace (a run does this as it starts): a zero-row
    ``_schema.parquet`` per table (what types its view before any row exists) and a copy of each view's DDL, both
    rewritten only when they changed. The steps schema with the method's columns is rewritten too."""
    home_p = _home(home)
    for t in [*declared.schemas, *(["steps"] if declared.step_columns else [])]:
        path = posixpath.join(table_dir(t, home_p), "_schema.parquet")
        if not os.path.exists(path) or not _schema_file_matches(path, t):
            _atomic_write_parquet(empty_table(t), path)
    for p in declared.views:
        target = Path(data_dir(home_p), VIEWS_DIR, p.name)
        text = p.read_text()
        if not target.is_file() or target.read_text() != text:
            atomic_write_text(text, target.as_posix())


def _schema_file_matches(path: str, table: str) -> bool:
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path).remove_metadata().equals(schema_for(table).remove_metadata())
    except (OSError, ValueError):
        return False


def _render(sql: str, home: Path) -> str:
    return sql.replace("{{data}}", data_dir(home).replace("'", "''"))


def _open(path: Path, read_only: bool, timeout_s: float = 30.0) -> duckdb.DuckDBPyConnection:
    """Open the catalog, retrying while another process briefly holds the write lock (creation/migration)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while True:
        try:
            # no replacement scans: a table name must never resolve to a Python variable of the caller
            return duckdb.connect(str(path), read_only=read_only, config={"python_enable_replacements": False})
        except duckdb.IOException as e:
            if "lock" not in str(e).lower() or time.monotonic() > deadline:
                raise CatalogError(f"cannot open {path} ({'read-only' if read_only else 'read-write'}): {e}") from e
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


def _state(con: duckdb.DuckDBPyConnection) -> tuple[int, dict[str, str]]:
    """(applied schema version, catalog_meta) — (0, {}) for a catalog that was never migrated."""
    try:
        version = con.execute("select coalesce(max(version), 0) from schema_version").fetchall()[0][0]
    except duckdb.CatalogException:
        return 0, {}
    try:
        meta = dict(con.execute("select key, value from catalog_meta").fetchall())
    except duckdb.CatalogException:
        meta = {}
    return int(version), meta


def schema_version(home: str | os.PathLike[str] | None = None) -> int:
    """The catalog's applied migration number (0 when it does not exist yet)."""
    path = _home(home) / CATALOG_FILE
    if not path.exists():
        return 0
    con = _open(path, read_only=True)
    try:
        return _state(con)[0]
    finally:
        con.close()


def _ensure_schema_files(home: Path) -> bool:
    """Zero-row ``_schema.parquet`` per table: keeps each view typed (and valid) before any data exists."""
    wrote = False
    for table in tables():
        p = posixpath.join(table_dir(table, home), "_schema.parquet")
        if not os.path.exists(p):
            _atomic_write_parquet(empty_table(table), p)
            wrote = True
    return wrote


def _rewrite_schema_files(home: Path) -> None:
    for table in tables():
        _atomic_write_parquet(empty_table(table), posixpath.join(table_dir(table, home), "_schema.parquet"))


def unreadable_view(table: str, home: Path, error: str) -> str:
    """The DDL of a stored table's view when a file under it cannot be read (after a workspace
    moved, one truncated file failed the catalog's rebuild and so every query, ``select 1`` included). The view
    keeps the table's columns (its ``_schema.parquet``), so views over it and queries naming its columns still
    bind; reading it raises DuckDB's own error, which names the file."""
    message = f"table {table}: {error.splitlines()[0]}".replace("'", "''")
    schema = posixpath.join(data_dir(home), table, "_schema.parquet").replace("'", "''")
    ddl = (SQL_DIR / "unreadable_table.sql").read_text()
    return ddl.replace("{{table}}", table).replace("{{message}}", message).replace("{{schema}}", schema)


def _create_views(con: duckdb.DuckDBPyConnection, home: Path, sql_dir: Path) -> list[str]:
    """(Re-)create every view; a view may use others, so retry failures until no more progress is made. A stored
    table whose files cannot be read gets ``unreadable_view``; returns those tables."""
    pending = _ddl(home, sql_dir)
    existing = [r[0] for r in con.execute(
        "select view_name from duckdb_views() where not internal and database_name = current_database()").fetchall()]
    for v in existing:
        con.execute(f'drop view if exists "{v}" cascade')
    broken: list[str] = []
    while pending:
        failed: list[tuple[tuple[str, str, bool], Exception]] = []
        for item in pending:
            try:
                con.execute(_render(item[1], home))
            except duckdb.Error as e:
                failed.append((item, e))
        if len(failed) == len(pending):
            unreadable = [(item, e) for item, e in failed
                          if item[2] and isinstance(e, (duckdb.InvalidInputException, duckdb.IOException))]
            if not unreadable:
                raise CatalogError("; ".join(f"view {item[0]}: {e}" for item, e in failed))
            for item, e in unreadable:  # a data file, not the DDL, is at fault: the others stay queryable
                con.execute(unreadable_view(item[0], home, str(e)))
                broken.append(item[0])
            failed = [(item, e) for item, e in failed if (item, e) not in unreadable]
        pending = [item for item, _ in failed]
    return broken


def ensure_catalog(home: str | os.PathLike[str] | None = None, *, sql_dir: Path = SQL_DIR) -> int:
    """Create or migrate the catalog if needed; return its schema version.

    Checks read-only first; takes the write lock only when something must change, and re-checks under it.
    """
    home_p = _home(home)
    path = home_p / CATALOG_FILE
    target = len(migrations(sql_dir))
    fp = _fingerprint(home_p, sql_dir)
    files_missing = _ensure_schema_files(home_p)
    if path.exists() and not files_missing:
        con = _open(path, read_only=True)
        try:
            version, meta = _state(con)
        finally:
            con.close()
        if version > target:
            raise CatalogError(f"{path} is at schema version {version}, newer than this code's {target}")
        if version == target and meta.get("fingerprint") == fp:
            return version
    con = _open(path, read_only=False)
    try:
        version, meta = _state(con)
        if version == target and meta.get("fingerprint") == fp:
            return version
        con.execute("create table if not exists schema_version "
                    "(version integer primary key, name varchar, applied_at timestamptz default now())")
        for v, name, p in migrations(sql_dir):
            if v <= version:
                continue
            con.execute("begin transaction")
            try:
                con.execute(_render(p.read_text(), home_p))
                con.execute("insert into schema_version (version, name) values (?, ?)", [v, name])
                con.execute("commit")
            except duckdb.Error as e:
                con.execute("rollback")
                raise CatalogError(f"migration {p} failed: {e}") from e
        _rewrite_schema_files(home_p)  # the declared schemas may have changed with the code
        broken = _create_views(con, home_p, sql_dir)
        # with a table unreadable, no fingerprint: the next connection rebuilds, so a repaired file is seen again
        con.execute("insert or replace into catalog_meta values ('fingerprint', ?), ('home', ?)",
                    ["" if broken else fp, home_p.as_posix()])
        return target
    finally:
        con.close()


def connect(
    home: str | os.PathLike[str] | None = None, read_only: bool = True, *, sql_dir: Path = SQL_DIR
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection to ``{home}/catalog.duckdb``, created/migrated on first use. Close it when done:
    a read-write connection locks every other process out (never hold one during a run)."""
    home_p = _home(home)
    path = home_p / CATALOG_FILE
    if read_only and path.exists() and not _ensure_schema_files(home_p):
        con = _open(path, read_only=True)  # fast path: one read-only open that also checks the version
        try:
            version, meta = _state(con)
            if version == len(migrations(sql_dir)) and meta.get("fingerprint") == _fingerprint(home_p, sql_dir):
                return con
        except BaseException:
            con.close()
            raise
        con.close()
    ensure_catalog(home_p, sql_dir=sql_dir)
    return _open(path, read_only=read_only)
