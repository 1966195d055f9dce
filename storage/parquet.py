"""The Parquet store: the source of truth for everything a run produces (docs/architecture.md).

One file per (run, step, stage, table) at ``{home}/data/{table}/run_id={run_id}/step={step:06d}/{stage}.parquet``,
written under a temporary name outside the read glob (``*.inprogress``) and ``os.replace``d into place, so a
reader globbing ``**/*.parquet`` never sees a half-written file and re-writing a stage replaces it (idempotent).
A stage is complete when its marker ``{home}/data/_stages/run_id=.../step=.../{stage}.done`` exists (written last).
Paths are built with posix joins on strings so that an object-store home (``s3://...``) can follow later.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from arbor.paths import arbor_home
from arbor.storage.schemas import SchemaError, conform, schema_for

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")  # 128 characters: a path component with room for its suffixes


def _home(home: str | os.PathLike[str] | None) -> str:
    return Path(home).expanduser().resolve().as_posix() if home is not None else arbor_home().as_posix()


def _check_name(what: str, value: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value) or value.endswith(".inprogress"):
        raise SchemaError(f"{what} {value!r} must match {_NAME.pattern} (it becomes part of a path)")
    return value


def _check_step(step: int) -> int:
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise SchemaError(f"step must be a non-negative int, got {step!r}")
    return step


def data_dir(home: str | os.PathLike[str] | None = None) -> str:
    return posixpath.join(_home(home), "data")


def table_dir(table: str, home: str | os.PathLike[str] | None = None) -> str:
    schema_for(table)
    return posixpath.join(data_dir(home), table)


def stage_path(table: str, *, run_id: str, step: int, stage: str, home: str | os.PathLike[str] | None = None) -> str:
    return _stage_file(table_dir(table, home), run_id, step, stage)


def _stage_file(root: str, run_id: str, step: int, stage: str) -> str:
    """The file one stage wrote under a table's folder ``root`` (the table need not be known to this process)."""
    _check_name("run_id", run_id)
    _check_name("stage", stage)
    return posixpath.join(root, f"run_id={run_id}", f"step={_check_step(step):06d}", f"{stage}.parquet")


def table_folders(home: str | os.PathLike[str] | None = None) -> list[str]:
    """Names of the table folders in the workspace's data folder: the pipeline's and any method's, whether or not
    this process imported the method (``_stages`` and ``_views`` are not tables)."""
    root = data_dir(home)
    if not os.path.isdir(root):
        return []
    return [d for d in sorted(os.listdir(root))
            if not d.startswith(("_", ".")) and os.path.isdir(posixpath.join(root, d))]


def atomic_write_text(text: str, path: str) -> None:
    """Write ``text`` to ``path`` through a temporary name outside every read glob: readers see the old file or
    the new one, never half of one."""
    os.makedirs(posixpath.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.inprogress"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _atomic_write_parquet(tbl: pa.Table, path: str) -> None:
    os.makedirs(posixpath.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.inprogress"  # outside the **/*.parquet glob
    try:
        pq.write_table(tbl, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _with_keys(table: str, rows: list[dict[str, Any]] | pa.Table, run_id: str, step: int) -> pa.Table:
    """Fill run_id / step (when the table has them) and refuse rows that disagree with the file's key."""
    names = schema_for(table).names
    if isinstance(rows, pa.Table):
        for key, val in (("run_id", run_id), ("step", step)):
            if key in names and key not in rows.column_names:
                rows = rows.append_column(key, pa.array([val] * rows.num_rows))
        tbl = conform(table, rows)
    else:
        filled = []
        for i, r in enumerate(rows):
            r = dict(r)
            for key, val in (("run_id", run_id), ("step", step)):
                if key in names:
                    if r.get(key) is None:
                        r[key] = val
                    elif r[key] != val:
                        raise SchemaError(f"table {table!r}, row {i}: {key}={r[key]!r} but the stage is {key}={val!r}")
            if table == "trajectories":  # token counts follow from the token lists when not given
                for n_key, ids_key in (("prompt_tokens", "prompt_ids"), ("response_tokens", "response_ids")):
                    if r.get(n_key) is None and r.get(ids_key) is not None:
                        r[n_key] = len(r[ids_key])
            filled.append(r)
        tbl = conform(table, filled)
    for key, val in (("run_id", run_id), ("step", step)):
        if key in tbl.column_names and tbl.num_rows:
            bad = [v for v in set(tbl.column(key).to_pylist()) if v != val]
            if bad:
                raise SchemaError(f"table {table!r}: {key} values {bad[:3]} differ from the stage's {key}={val!r}")
    return tbl


def write_stage(
    table: str,
    rows: list[dict[str, Any]] | pa.Table,
    *,
    run_id: str,
    step: int,
    stage: str,
    home: str | os.PathLike[str] | None = None,
) -> Path:
    """Write one stage's rows of ``table`` atomically; re-writing replaces the file (never duplicates)."""
    path = stage_path(table, run_id=run_id, step=step, stage=stage, home=home)
    tbl = _with_keys(table, rows, run_id, step)  # validate fully before touching the filesystem
    _atomic_write_parquet(tbl, path)
    return Path(path)


def read_stage(
    table: str, *, run_id: str, step: int, stage: str, home: str | os.PathLike[str] | None = None
) -> list[dict[str, Any]] | None:
    """The rows one stage wrote, or None when it has not been written."""
    path = stage_path(table, run_id=run_id, step=step, stage=stage, home=home)
    if not os.path.exists(path):
        return None
    return _read_file(table, path).to_pylist()


def _read_file(table: str, path: str) -> pa.Table:
    """Read one file and bring it to the current schema (columns added since it was written become null)."""
    schema = schema_for(table)
    tbl = pq.ParquetFile(path).read()  # not pq.read_table: its dataset layer imports pandas (~1 s of every CLI call)
    cols = [
        tbl.column(f.name).cast(f.type) if f.name in tbl.column_names else pa.nulls(tbl.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(cols, schema=schema)


def stage_files(table: str, run_id: str | None = None, home: str | os.PathLike[str] | None = None) -> list[str]:
    """Every committed file of ``table`` (optionally of one run), in path order (run, step, stage)."""
    root = table_dir(table, home)
    if run_id is not None:
        root = posixpath.join(root, f"run_id={_check_name('run_id', run_id)}")
    out: list[str] = []
    for dirpath, _dirs, files in os.walk(root):
        out += [posixpath.join(Path(dirpath).as_posix(), f) for f in files if f.endswith(".parquet") and f != "_schema.parquet"]
    return sorted(out)


def read_table(table: str, run_id: str | None = None, home: str | os.PathLike[str] | None = None) -> pa.Table:
    """All rows of ``table`` (optionally one run), conformed to the current schema."""
    parts = [_read_file(table, p) for p in stage_files(table, run_id, home)]
    return pa.concat_tables(parts) if parts else schema_for(table).empty_table()


# ---- stage markers -------------------------------------------------------------------------------------------

def marker_path(*, run_id: str, step: int, stage: str, home: str | os.PathLike[str] | None = None) -> str:
    _check_name("run_id", run_id)
    _check_name("stage", stage)
    return posixpath.join(data_dir(home), "_stages", f"run_id={run_id}", f"step={_check_step(step):06d}", f"{stage}.done")


def mark_stage_done(
    *, run_id: str, step: int, stage: str, home: str | os.PathLike[str] | None = None, info: dict[str, Any] | None = None
) -> Path:
    """Write the stage's completion marker (atomically; call it after every file of the stage is written)."""
    path = marker_path(run_id=run_id, step=step, stage=stage, home=home)
    atomic_write_text(json.dumps({"completed_at": datetime.now(UTC).isoformat(), **(info or {})}), path)
    return Path(path)


class StageCorrupt(RuntimeError):
    """A committed stage's file no longer matches the size and checksum its completion marker recorded."""


def file_digest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What a completion marker records of one file: its size in bytes and its SHA-256."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return {"bytes": os.path.getsize(path), "sha256": h.hexdigest()}


def stage_marker(*, run_id: str, step: int, stage: str,
                 home: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """A stage's completion marker (completion time, wall seconds, its files' digests), or None when not done."""
    path = marker_path(run_id=run_id, step=step, stage=stage, home=home)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as fh:
            return dict(json.load(fh))
    except (OSError, ValueError) as e:
        raise StageCorrupt(f"{path}: the completion marker of stage {stage!r} (step {step}) of run {run_id!r} cannot "
                           f"be read ({e}); delete it to compute the stage again") from e


def verify_stage(*, run_id: str, step: int, stage: str, tables: tuple[str, ...] | None = None,
                 home: str | os.PathLike[str] | None = None) -> int:
    """Check the files of a committed stage (``tables``, or all it recorded) against the sizes and checksums its
    marker recorded; StageCorrupt naming the file, the stage and the remedy on the first mismatch. Markers written
    before checksums were recorded check nothing. Returns how many files were checked."""
    marker = stage_marker(run_id=run_id, step=step, stage=stage, home=home) or {}
    files: dict[str, dict[str, Any]] = marker.get("files") or {}
    checked = 0
    for table, want in sorted(files.items()):
        if tables is not None and table not in tables:
            continue
        path = stage_path(table, run_id=run_id, step=step, stage=stage, home=home)
        got = file_digest(path) if os.path.exists(path) else None
        if got != want:
            what = "is missing" if got is None else (f"has {got['bytes']} bytes, {want['bytes']} recorded"
                                                     if got["bytes"] != want["bytes"] else "fails its checksum")
            redo = (f"`arbor train --resume {run_id} --redo {step}:{stage}` computes it and what follows again"
                    if step >= 1 else f"delete its marker {marker_path(run_id=run_id, step=step, stage=stage, home=home)}"
                    " to compute it again")
            raise StageCorrupt(f"{path} {what}: stage {stage!r} of step {step} of run {run_id!r} is damaged; {redo}")
        checked += 1
    return checked


def verify_run(run_id: str, home: str | os.PathLike[str] | None = None) -> tuple[int, int, list[str]]:
    """Every committed stage of a run checked (``verify_stage``): (stages, files checked, problems)."""
    stages = files = 0
    problems: list[str] = []
    for step, stage in stored_stages(run_id, home):
        stages += 1
        try:
            files += verify_stage(run_id=run_id, step=step, stage=stage, home=home)
        except StageCorrupt as e:
            problems.append(str(e))
    return stages, files, problems


def stored_stages(run_id: str, home: str | os.PathLike[str] | None = None) -> list[tuple[int, str]]:
    """Every committed (step, stage) of a run, by step."""
    root = Path(data_dir(home), "_stages", f"run_id={_check_name('run_id', run_id)}")
    return [(int(d.name.removeprefix("step=")), m.stem) for d in sorted(root.glob("step=*")) for m in sorted(d.glob("*.done"))]


def discard_from(run_id: str, step: int, stage: str, order: tuple[str, ...],
                 home: str | os.PathLike[str] | None = None) -> list[tuple[int, str]]:
    """Forget ``stage`` of ``step`` and everything computed after it (``--redo``): the stages of
    that step not listed before ``stage`` in ``order`` (the step's stage order; a stage outside it is dropped too)
    and every stage of every later step, markers first, then each of their files in every table. Returns the
    discarded (step, stage) pairs. Checkpoints are the trainer's to drop (``tasks.training.checkpoint``)."""
    if step < 1:
        raise ValueError(f"step {step}: only training steps (1 and later) can be redone")
    done = stored_stages(run_id, home)
    if (step, stage) not in done:
        here = sorted(s for t, s in done if t == step)
        raise ValueError(f"run {run_id!r} has no committed stage {stage!r} at step {step} "
                         f"(committed there: {', '.join(here) or 'none'})")
    keep = set(order[:order.index(stage)]) if stage in order else set()
    gone = [(t, s) for t, s in done if t > step or (t == step and s not in keep)]
    for t, s in gone:
        path = marker_path(run_id=run_id, step=t, stage=s, home=home)
        if os.path.exists(path):
            os.remove(path)
    for table in table_folders(home):  # files of later steps without a marker of their own (a judge ledger, ...)
        for d in Path(data_dir(home), table, f"run_id={run_id}").glob("step=*"):
            t = int(d.name.removeprefix("step="))
            for f in d.glob("*.parquet"):
                if t > step or (t == step and f.stem not in keep):
                    f.unlink()
    return gone


def stage_done(*, run_id: str, step: int, stage: str, home: str | os.PathLike[str] | None = None) -> bool:
    return os.path.exists(marker_path(run_id=run_id, step=step, stage=stage, home=home))


def clear_stage(*, run_id: str, step: int, stage: str, home: str | os.PathLike[str] | None = None) -> None:
    """Forget a stage: its marker first (so it is never 'done' without files), then its files in every table."""
    path = marker_path(run_id=run_id, step=step, stage=stage, home=home)
    if os.path.exists(path):
        os.remove(path)
    for table in table_folders(home):  # a method's table too, imported by this process or not
        f = _stage_file(posixpath.join(data_dir(home), table), run_id, step, stage)
        if os.path.exists(f):
            os.remove(f)
