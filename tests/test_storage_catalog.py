"""The DuckDB catalog: created on first use, forward-only migrations, re-bound when the workspace moves."""

from __future__ import annotations

import shutil

import duckdb
import pytest

from arbor.paths import SQL_DIR
from arbor.storage import catalog
from arbor.storage.catalog import (
    CATALOG_FILE,
    CatalogError,
    connect,
    ensure_catalog,
    migrations,
    schema_version,
)
from arbor.storage.parquet import write_stage
from arbor.storage.sql import SqlError, query

REQUIRED = {"runs", "steps", "trajectories", "rubrics", "rubric_events", "rubric_activations", "rubric_sources",
            "judge_calls", "stage_runs", "eval_results", "run_status", "rubric_reuse", "rubric_reuse_concentration",
            "rubric_history", "zero_variance_groups", "judge_cost_per_step", "rubric_lineage"}


def _names(home) -> set[str]:
    return set(query("select table_name from information_schema.tables", home=home).column("table_name").to_pylist())


def test_empty_workspace_gets_catalog_with_every_name(tmp_path):
    assert not (tmp_path / CATALOG_FILE).exists()
    assert REQUIRED <= _names(tmp_path)
    assert schema_version(tmp_path) == len(migrations()) >= 1
    # every view answers (typed, zero rows) before any run wrote anything
    for name in REQUIRED:
        assert query(f"select * from {name}", home=tmp_path).num_rows == 0
    cols = {r["column_name"]: r["data_type"] for r in query(
        "select column_name, data_type from information_schema.columns where table_name = 'trajectories'",
        home=tmp_path).to_pylist()}
    assert cols["golds"] == "VARCHAR[]" and cols["f1"] == "DOUBLE" and cols["format_valid"] == "BOOLEAN"


def test_views_see_new_files_without_touching_the_catalog(tmp_path):
    ensure_catalog(tmp_path)
    mtime = (tmp_path / CATALOG_FILE).stat().st_mtime_ns
    write_stage("steps", [{"loss": 1.0}, {"loss": 2.0}], run_id="r", step=1, stage="train", home=tmp_path)
    assert query("select sum(loss) as s from steps", home=tmp_path).to_pylist() == [{"s": 3.0}]
    assert (tmp_path / CATALOG_FILE).stat().st_mtime_ns == mtime  # readers never wrote it


def _sql_copy(tmp_path, upto: int | None = None):
    """A copy of sql/ with only the first ``upto`` migrations (to build an 'old' catalog)."""
    d = tmp_path / "sql"
    shutil.copytree(SQL_DIR, d)
    if upto is not None:
        for v, _, p in migrations(d):
            if v > upto:
                (d / "migrations" / p.name).unlink()
    return d


def test_migration_on_existing_catalog_is_forward_only(tmp_path):
    home = tmp_path / "home"
    sql_dir = _sql_copy(tmp_path)
    n = len(migrations(sql_dir))
    assert ensure_catalog(home, sql_dir=sql_dir) == n
    write_stage("runs", [{"profile": "tiny-cpu", "method": "arbor"}], run_id="r1", step=0, stage="run", home=home)
    # a new migration arrives with a code update: it is applied once, data and history kept
    (sql_dir / "migrations" / f"{n + 1:03d}_annotations.sql").write_text(
        "create table annotations (run_id varchar, note varchar);\n"
        "insert into annotations values ('r1', 'baseline');\n")
    assert ensure_catalog(home, sql_dir=sql_dir) == n + 1
    assert ensure_catalog(home, sql_dir=sql_dir) == n + 1  # idempotent: not re-applied
    con = connect(home, sql_dir=sql_dir)
    try:
        assert con.sql("select count(*) from annotations").fetchall() == [(1,)]  # applied exactly once
        assert [r[0] for r in con.sql("select version from schema_version order by version").fetchall()] == \
            list(range(1, n + 2))
        assert con.sql("select run_id, status from run_status").fetchall() == [("r1", "created")]
    finally:
        con.close()


def test_catalog_newer_than_code_is_refused(tmp_path):
    sql_dir = _sql_copy(tmp_path)
    n = len(migrations(sql_dir))
    (sql_dir / "migrations" / f"{n + 1:03d}_later.sql").write_text("create table later (x int);\n")
    ensure_catalog(tmp_path / "home", sql_dir=sql_dir)
    with pytest.raises(CatalogError, match="newer than this code"):
        ensure_catalog(tmp_path / "home")


def test_bad_migration_names_refused(tmp_path):
    sql_dir = _sql_copy(tmp_path)
    (sql_dir / "migrations" / "009_gap.sql").write_text("select 1;\n")
    with pytest.raises(CatalogError, match="expected migration number"):
        migrations(sql_dir)


def test_failed_migration_rolls_back(tmp_path):
    sql_dir = _sql_copy(tmp_path)
    n = len(migrations(sql_dir))
    ensure_catalog(tmp_path / "home", sql_dir=sql_dir)
    (sql_dir / "migrations" / f"{n + 1:03d}_broken.sql").write_text(
        "create table half (x int);\nselect * from no_such_table;\n")
    with pytest.raises(CatalogError, match="no_such_table"):
        ensure_catalog(tmp_path / "home", sql_dir=sql_dir)
    assert schema_version(tmp_path / "home") == n
    con = duckdb.connect(str(tmp_path / "home" / CATALOG_FILE), read_only=True)
    try:
        assert con.sql("select count(*) from information_schema.tables where table_name = 'half'").fetchall() == [(0,)]
    finally:
        con.close()


def test_moved_workspace_is_rebound(tmp_path):
    old = tmp_path / "old"
    write_stage("steps", [{"loss": 1.0}], run_id="r", step=1, stage="train", home=old)
    assert query("select count(*) as n from steps", home=old).to_pylist() == [{"n": 1}]
    new = tmp_path / "new"
    old.rename(new)
    # the stored views pointed at old/data; the catalog notices the home changed and re-creates them
    assert query("select count(*) as n from steps", home=new).to_pylist() == [{"n": 1}]


def test_readers_never_take_the_write_lock(tmp_path):
    ensure_catalog(tmp_path)
    held = connect(tmp_path)  # a read-only reader holding the catalog open...
    try:
        assert query("select 1 as x", home=tmp_path).to_pylist() == [{"x": 1}]  # ...does not block another
    finally:
        held.close()


def test_write_statements_refused(tmp_path):
    with pytest.raises(SqlError, match="read-only"):
        query("create table t (x int)", home=tmp_path)
    with pytest.raises(SqlError, match="read-only"):
        query("insert into catalog_meta values ('a', 'b')", home=tmp_path)


def test_fingerprint_changes_with_home(tmp_path):
    sql_dir = SQL_DIR
    assert catalog._fingerprint(tmp_path / "a", sql_dir) != catalog._fingerprint(tmp_path / "b", sql_dir)


def test_table_names_never_resolve_to_python_variables(tmp_path):
    # DuckDB's Python client would otherwise read a caller's local variable named like a missing table
    with pytest.raises(SqlError, match="sql"):
        query("select * from sql", home=tmp_path)


def test_files_from_an_older_schema_read_new_columns_as_null(tmp_path):
    """A file written before a column existed (here: without most judge_calls columns) stays readable."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from arbor.storage.parquet import read_stage, stage_path

    old = stage_path("judge_calls", run_id="r", step=1, stage="score", home=tmp_path)
    (tmp_path / "data/judge_calls/run_id=r/step=000001").mkdir(parents=True)
    pq.write_table(pa.table({"run_id": ["r"], "step": [1], "cost_usd": [0.5]}), old)
    write_stage("judge_calls", [{"role": "pairwise", "cost_usd": 0.25}], run_id="r", step=2, stage="score",
                home=tmp_path)
    rows = query("select step, role, cost_usd, cache_hit from judge_calls order by step", home=tmp_path).to_pylist()
    assert rows == [{"step": 1, "role": None, "cost_usd": 0.5, "cache_hit": None},
                    {"step": 2, "role": "pairwise", "cost_usd": 0.25, "cache_hit": None}]
    assert read_stage("judge_calls", run_id="r", step=1, stage="score", home=tmp_path)[0]["role"] is None


def test_a_moved_workspace_with_one_unreadable_file_keeps_every_other_table(tmp_path):
    """After a move, one truncated Parquet file failed the catalog's rebuild, and with it every
    query, `select 1` included. Now only the table holding it fails, naming the file; a repaired file is seen."""
    old = tmp_path / "old"
    write_stage("steps", [{"loss": 1.0}], run_id="r", step=1, stage="train", home=old)
    write_stage("steps", [{"loss": 2.0}], run_id="r", step=2, stage="train", home=old)
    write_stage("judge_calls", [{"role": "pairwise", "attempts": 1}], run_id="r", step=1, stage="score", home=old)
    ensure_catalog(old)
    new = tmp_path / "new"
    shutil.move(old, new)
    [bad] = [p for p in (new / "data" / "steps").rglob("*.parquet") if "step=000002" in str(p)]
    good = bad.read_bytes()
    bad.write_bytes(good[: len(good) // 2])
    assert query("select 1 as one", home=new).to_pylist() == [{"one": 1}]
    assert query("select count(*) as n from judge_calls", home=new).to_pylist() == [{"n": 1}]
    assert REQUIRED - {"steps"} <= _names(new)
    with pytest.raises(SqlError, match=f"table steps: .*{bad.name}"):
        query("select loss from steps", home=new)
    bad.write_bytes(good)  # repaired: the catalog was left unfingerprinted, so the next reader rebuilds it
    assert sorted(query("select loss from steps", home=new).column("loss").to_pylist()) == [1.0, 2.0]
