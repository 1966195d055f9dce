"""Read-only SQL over a workspace (``arbor sql``, ``arbor runs``): one short read-only connection per call, so it
works while a training run writes Parquet into the same workspace (DESIGN §4).

Every query arbor itself runs is a file ``sql/queries/<name>.sql`` named for its question, read with ``sql_file``;
values (run ids, steps) are bound as ``$name`` parameters, never pasted into the SQL text."""

from __future__ import annotations

import csv
import functools
import io
import json
import os
from collections.abc import Mapping
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from arbor.paths import SQL_DIR
from arbor.storage.catalog import CatalogError, connect
from arbor.storage.parquet import data_dir

FORMATS = ("table", "csv", "json", "parquet")
MAX_CELL = 80  # table output truncates longer cells (use csv/json/parquet for full values)
QUERIES_DIR = SQL_DIR / "queries"


class SqlError(RuntimeError):
    """A query could not be run (bad SQL, a write statement on the read-only catalog, bad format/output)."""


# What arbor sql runs (issue 35 item 1): statements that only read. COPY ... TO, EXPORT, ATTACH, SET, INSTALL,
# LOAD, CALL and PRAGMA are refused before anything runs, and the connection itself reads files only under the
# workspace's data folder, a setting locked for the connection's life (read_csv('/etc/...') fails, too).
READ_STATEMENTS = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """SqlError unless every statement of ``sql`` only reads (``READ_STATEMENTS``)."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as e:
        raise SqlError(str(e)) from e
    refused = [s.type.name for s in statements if s.type not in READ_STATEMENTS]
    if refused:
        raise SqlError(f"arbor sql is read-only: it runs SELECT, WITH, DESCRIBE, SHOW and EXPLAIN statements; "
                       f"refused: {', '.join(refused)}")


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


def query(sql: str, params: Mapping[str, Any] | None = None, *,
          home: str | os.PathLike[str] | None = None) -> pa.Table:
    """Run ``sql`` with ``$name`` placeholders bound from ``params`` on a read-only connection to the workspace
    catalog; the result as Arrow."""
    if not sql or not sql.strip():
        raise SqlError("empty query")
    try:
        con = connect(home, read_only=True)
    except CatalogError as e:
        raise SqlError(str(e)) from e
    try:
        check_read_only(con, sql)
        confine(con, home)
        rel = con.sql(sql, params=dict(params) if params else None)  # a statement without a result returns None
        return rel.to_arrow_table() if rel is not None else pa.table({})
    except duckdb.Error as e:
        msg = str(e)
        if "read-only mode" in msg:
            msg = f"the catalog is opened read-only; arbor sql does not run write statements ({msg})"
        raise SqlError(msg) from e
    finally:
        con.close()


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


def render_table(tbl: pa.Table) -> str:
    """A plain aligned text table with a row count footer."""
    names = tbl.column_names
    rows = [[_cell(v) for v in r.values()] for r in tbl.to_pylist()]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
    out = [line(names), line(["-" * w for w in widths])] + [line(r) for r in rows]
    out.append(f"({tbl.num_rows} row{'s' if tbl.num_rows != 1 else ''})")
    return "\n".join(out)


def render_csv(tbl: pa.Table) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(tbl.column_names)
    for r in tbl.to_pylist():
        w.writerow(["" if v is None else json.dumps(_plain(v)) if isinstance(v, list | dict) else _plain(v)
                    for v in r.values()])
    return buf.getvalue()


def render_json(tbl: pa.Table) -> str:
    return json.dumps([_plain(r) for r in tbl.to_pylist()], indent=None, default=str)


def query_and_render(
    sql: str,
    fmt: str = "table",
    output: str | os.PathLike[str] | None = None,
    home: str | os.PathLike[str] | None = None,
    params: Mapping[str, Any] | None = None,
) -> str:
    """Run ``sql`` read-only (``$name`` placeholders bound from ``params``) and render it as ``table``, ``csv``,
    ``json`` or ``parquet``.

    With ``output`` the result goes to that file and a one-line note is returned; parquet needs ``output``.
    """
    check_format(fmt, output)
    return render(query(sql, params, home=home), fmt, output)


def check_format(fmt: str, output: str | os.PathLike[str] | None = None) -> None:
    """Refuse an unknown format, parquet without a file, or an output file in a folder that does not exist."""
    if fmt not in FORMATS:
        raise SqlError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "parquet" and output is None:
        raise SqlError("--format parquet needs --output FILE")
    if output is not None and not Path(output).expanduser().resolve().parent.is_dir():
        raise SqlError(f"--output {output}: folder {Path(output).expanduser().resolve().parent} does not exist")


def render(tbl: pa.Table, fmt: str = "table", output: str | os.PathLike[str] | None = None) -> str:
    """``tbl`` as ``table``, ``csv``, ``json`` or ``parquet`` text, or written to ``output`` (a one-line note)."""
    check_format(fmt, output)
    if fmt == "parquet":
        pq.write_table(tbl, str(output))
        return f"wrote {tbl.num_rows} rows to {output}"
    text = {"table": render_table, "csv": render_csv, "json": render_json}[fmt](tbl)
    if output is not None:
        Path(output).write_text(text if text.endswith("\n") else text + "\n")
        return f"wrote {tbl.num_rows} rows to {output}"
    return text
