"""The commands that read the workspace: ``sql``, ``runs``, ``export``, ``verify``, ``disk``, ``report`` and
``rubrics export``."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from arbor.cli.common import _fail, _me, load_run, stored_run


class SqlFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"
    parquet = "parquet"


class RunsFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


def sql_cmd(
    query: Annotated[str | None, typer.Argument(help="SQL to run (read-only, one statement) against the workspace "
                                                "catalog")] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="read the SQL from this file")] = None,
    fmt: Annotated[SqlFormat, typer.Option("--format", help="output format")] = SqlFormat.table,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write every row to this file, outside the "
                                                "workspace (parquet needs it)")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace the --output file if it exists")] = False,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="print at most N rows (default 10000)")] = None,
    all_rows: Annotated[bool, typer.Option("--all", help="print every row")] = False,
    param: Annotated[list[str] | None, typer.Option("--param", help="NAME=VALUE, bound to $NAME in the SQL "
                                                    "(repeatable), e.g. --param run_id=r1")] = None,
) -> None:
    """Query runs with SQL, read-only; works while a training run writes to the same workspace. Ctrl-C stops a
    query."""
    from arbor.storage.sql import ROW_CAP, SqlError, check_format, check_output, write_query

    if (query is None) == (file is None):
        _fail("give either a query or --file FILE")
    if limit is not None and all_rows:
        _fail("give --limit N or --all, not both")
    bad = [p for p in param or [] if "=" not in p or not p.split("=", 1)[0]]
    if bad:
        _fail(f"--param {bad[0]}: expected NAME=VALUE")
    params = dict(p.split("=", 1) for p in param or [])
    try:
        text = file.read_text() if file is not None else query
    except OSError as e:
        _fail(f"--file {file}: {e.strerror or e}")
    cap = None if all_rows or (output is not None and limit is None) else limit or ROW_CAP
    try:
        check_format(fmt.value, output)
        target = check_output(output, force=force) if output is not None else None
        n, more = write_query(text or "", fmt.value, target, cap=cap, params=params)
    except SqlError as e:
        _fail(e)
    except KeyboardInterrupt:
        typer.echo("error: interrupted (Ctrl-C): the query was stopped" + (f"; {output} is unchanged" if output
                                                                           else ""), err=True)
        raise typer.Exit(130) from None
    if output is not None:
        typer.echo(f"wrote {n} rows to {output}")
    if more:
        typer.echo(f"stopped after {n} rows: --limit N prints up to N, --all prints every row, --output FILE writes "
                   "them all to a file", err=True)


def runs_cmd(
    fmt: Annotated[RunsFormat, typer.Option("--format", help="output format")] = RunsFormat.table,
) -> None:
    """List runs with their status (created, running, completed, failed, crashed) and last completed step.

    A run whose process is gone shows `crashed`: its owner (host, pid) is checked on this host, and on another host
    its heartbeat must be younger than two minutes."""
    import pyarrow as pa

    from arbor.storage.heartbeat import run_status_table
    from arbor.storage.sql import SqlError, render

    try:
        tbl = run_status_table()
        policies = [str(p) if (p := _final_policy(rid)) else None for rid in tbl.column("run_id").to_pylist()]
        sys.stdout.write(render(tbl.append_column("policy", pa.array(policies, pa.string())), fmt=fmt.value) + "\n")
    except SqlError as e:
        _fail(e)


def _run_root(row: dict[str, Any], home: Path) -> Path:
    """A stored run's checkpoint folder, found through its stored config (its ``runs`` row)."""
    from arbor.tasks.training.checkpoint import run_root_from_config

    return run_root_from_config(row["config_json"], row["run_id"], home)


def _final_policy(run_id: str) -> Path | None:
    """The run's trained policy (``hf/`` of its latest complete checkpoint); None when there is none."""
    from arbor.paths import arbor_home
    from arbor.storage.runs import run_row
    from arbor.storage.schemas import SchemaError
    from arbor.tasks.training.checkpoint import final_policy

    try:
        row = run_row(run_id, arbor_home())
    except SchemaError:
        return None
    return final_policy(_run_root(row, arbor_home())) if row is not None else None


def export_cmd(
    run_id: Annotated[str, typer.Argument(help="the run whose policy to export")],
    out: Annotated[Path, typer.Option("--out", "-o", help="a new folder for the HF model")],
    step: Annotated[int | None, typer.Option(help="a checkpointed step (default: the latest, the final policy)")] = None,
) -> None:
    """Export a run's trained policy as a plain Hugging Face folder (safetensors, config, tokenizer): load it with
    `AutoModelForCausalLM.from_pretrained(OUT)`, serve it with vLLM, or pass it as policy.model."""
    from arbor.paths import arbor_home

    root = _run_root(stored_run(run_id), arbor_home())
    from arbor.tasks.training.checkpoint import export_policy

    try:
        done = export_policy(root, out.expanduser(), step)
    except (FileNotFoundError, FileExistsError) as e:
        _fail(e)
    typer.echo(f"exported {run_id} to {done}")


def verify_cmd(run_id: Annotated[str, typer.Argument(help="the run to check")]) -> None:
    """Check every committed stage of a run against the sizes and checksums its markers recorded (exit 1 on any
    damaged file, naming it and the stage)."""
    from arbor.paths import arbor_home
    from arbor.storage.parquet import verify_run

    stored_run(run_id)
    stages, files, problems = verify_run(run_id, arbor_home())
    for p in problems:
        typer.echo(f"damaged: {p}", err=True)
    typer.echo(f"run {run_id}: {stages} stages, {files} files checked, {len(problems)} damaged")
    if problems:
        raise typer.Exit(1)


def disk_cmd(run_id: Annotated[str, typer.Argument(help="the run to measure")]) -> None:
    """Disk usage of one run: Parquet per table, checkpoints, TensorBoard events, reports."""
    from arbor.paths import arbor_home
    from arbor.storage.usage import human, run_disk_usage

    load_run(run_id)  # a run id is a path component: '../..' would walk outside ARBOR_HOME
    usage = run_disk_usage(run_id, arbor_home())
    if not usage:
        _fail(f"nothing on disk for run '{run_id}' in {arbor_home()}")
    width = max(len(k) for k in usage)
    for k, v in usage.items():
        typer.echo(f"{k:<{width}}  {human(v):>10}")
    typer.echo(f"{'total':<{width}}  {human(sum(usage.values())):>10}")


def report_cmd(run_ids: Annotated[list[str], typer.Argument(help="the run to report on; with more runs, their "
                                                                  "Table 1 side by side")]) -> None:
    """Markdown + PNG report of a run (Tables 1-3, Figure 5, rubric histories, lineage), from the SQL views; given
    several stored runs, also prints their Table 1 side by side (one row per run)."""
    from arbor.paths import arbor_home
    from arbor.storage.parquet import stage_files
    from arbor.storage.schemas import SchemaError

    home = arbor_home()
    for run_id in run_ids:
        load_run(run_id)
        try:  # a run id that names nothing is refused before the catalog is opened
            if not any(stage_files(t, run_id, home) for t in ("runs", "trajectories", "rubric_events")):
                _fail(f"no run '{run_id}' in {home} (`{_me()} runs` lists them)")
        except SchemaError as e:
            _fail(e)
    from arbor.tasks.reporting.report import ReportError, build_report
    from arbor.tasks.reporting.table1 import format_table1

    for run_id in run_ids:
        try:
            paths = build_report(run_id)
        except ReportError as e:
            _fail(e)
        typer.echo(f"report: {paths.markdown}")
    if len(run_ids) > 1:
        table = format_table1(run_ids, home)
        typer.echo("\nTable 1 (each run's last evaluation; %, ± SE over questions):\n\n" + (table or
                   "no evaluation stored for these runs (run.eval_final, run.eval_every, or arbor eval)"))


def rubrics_export_cmd(
    run_id: Annotated[str, typer.Argument(help="the run whose current common pool to export")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="JSON file (default: stdout)")] = None,
    step: Annotated[int | None, typer.Option(help="the pool as it stood after this step (default: the last)")] = None,
) -> None:
    """Export a run's common rubric pool (JSON) for `--set memory.init_from=FILE`."""
    import json

    from arbor.paths import arbor_home

    home = arbor_home()
    stored_run(run_id)
    if output is not None and not output.expanduser().resolve().parent.is_dir():
        _fail(f"--output {output}: folder {output.expanduser().resolve().parent} does not exist")
    from arbor.flows.pool import export_pool

    try:
        data = export_pool(run_id, home, step)
    except ValueError as e:
        _fail(f"--step: {e}")
    text = json.dumps(data, indent=1)
    if output is None:
        sys.stdout.write(text + "\n")
    else:
        output.write_text(text + "\n")
        typer.echo(f"wrote {len(data.get('rubrics', []))} rubrics to {output}", err=True)
