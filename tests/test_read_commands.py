"""Every command that reads a run works on a stored run of every method: ``verify``, ``report``, ``export``,
``rubrics export``, ``disk``, ``runs`` and ``sql`` over the methods' tables and views, each in a new process that
never imported the method (its class registers its tables when defined, so the command must load it).

The workspace is built as a run builds it: ``prepare_run`` writes the run's row and config, the method's tables are
declared in the workspace (``declare_tables``, as ``RunState`` does), and each stage of step 1 is committed through
``StageStore`` with one row per table; a complete checkpoint holds the exported policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from arbor.flows.run_setup import prepare_run
from arbor.paths import PROJECT_ROOT
from arbor.storage.catalog import declare_tables
from arbor.storage.schemas import schema_for
from arbor.tasks.methods import BUILTIN, BUILTIN_REQUIRES, resolve_method
from arbor.tasks.stage_store import StageStore

# run id -> run.method: every built-in, and a user's method named by import path
METHODS = {**{name: name for name in BUILTIN}, "diversity": "examples.diversity:DiversityGRPO"}
# stages of step 1 per method (Method.stages), counted by hand from each method's stage graph
STAGES = {"arbor": 7, "grpo": 3, "dapo": 3, "rar": 3, "no-memory": 4, "ss-grpo": 4, "rubricem": 5, "arco": 5,
          "diversity": 4}
# a table of the method's own per run (none for grpo, rar, no-memory; dapo adds a steps column only)
OWN_TABLE = {"arbor": "rubric_verdicts", "ss-grpo": "stage_grades", "rubricem": "reflections", "arco": "mu_updates",
             "diversity": "group_diversity"}
# the methods' views (their TableSets' sql/ files)
VIEWS = ("judge_signal_quality", "verdict_ties", "filter_pass_by_pattern", "rubric_lifetimes",  # arbor
         "stage_credit_groups", "stage_rubric_buffer",  # ss-grpo (and rubricem)
         "reflection_scores", "bank_reuse",  # rubricem
         "mu_calibration", "turn_advantage_summary",  # arco
         "diversity_by_step")  # examples/diversity.py

# the rubric lifecycle's rows must tell a consistent story (``rubrics export`` replays them): none here
LIFECYCLE = ("rubric_events", "rubric_activations", "rubric_sources", "draft_scores")


def _value(typ: pa.DataType) -> object:
    """A placeholder of ``typ``: every column holds a value, as a real row's do."""
    if pa.types.is_string(typ):
        return "x"
    if pa.types.is_integer(typ):
        return 0
    if pa.types.is_floating(typ):
        return 0.0
    if pa.types.is_boolean(typ):
        return False
    return [] if pa.types.is_list(typ) else None


def _rows(table: str) -> list[dict]:
    if table in LIFECYCLE:
        return []
    return [{f.name: _value(f.type) for f in schema_for(table) if f.name not in ("run_id", "step")}]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("read_commands")
    for rid, spec in METHODS.items():
        cls = resolve_method(spec)
        prepare_run("tiny-cpu", {"run.method": spec, "run.steps": 1, **BUILTIN_REQUIRES.get(spec, {})}, rid, False,
                    home)
        if cls.tables is not None:
            declare_tables(cls.tables, home)
        store = StageStore(rid, home)
        for stage in cls.stages:
            store.commit(1, stage.name, {t: _rows(t) for t in stage.tables})
        ckpt = home / "checkpoints" / rid / "step_000001"
        (ckpt / "hf").mkdir(parents=True)
        (ckpt / "hf" / "config.json").write_text("{}")
        (ckpt / "state.json").write_text(json.dumps({"step": 1}))
        (ckpt / "COMPLETE").write_text("")
    return home


COMMANDS = {"verify": ["verify", "{rid}"], "report": ["report", "{rid}"], "export": ["export", "{rid}", "--out", "{out}"],
            "rubrics export": ["rubrics", "export", "{rid}"], "disk": ["disk", "{rid}"]}


@pytest.fixture(scope="module")
def ran(workspace: Path) -> dict[tuple[str, str], tuple[int, str, str]]:
    """(run id or "", command) -> (exit status, stdout, stderr): each command in a new process that never imported
    the method (``fresh_cli``), from the project root (the user's method imports from there, as from the folder it
    was trained in)."""
    counts = " union all ".join(f"select '{t}' as t, run_id, count(*) as n from {t} group by run_id"
                                for t in OWN_TABLE.values())
    views = " union all ".join(f"select '{v}' as v, count(*) as n from {v}" for v in VIEWS)
    todo = {(rid, name): [a.format(rid=rid, out=workspace.parent / f"policy-{rid}") for a in args]
            for rid in METHODS for name, args in COMMANDS.items()}
    todo |= {("", "runs"): ["runs", "--format", "json"], ("", "sql tables"): ["sql", counts, "--format", "json"],
             ("", "sql views"): ["sql", views, "--format", "json"]}
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("fresh_cli.py")), json.dumps(list(todo.values()))],
                         cwd=PROJECT_ROOT, env={**os.environ, "ARBOR_HOME": str(workspace)}, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    return {key: tuple(r) for key, r in zip(todo, json.loads(out.stdout), strict=True)}


def _ok(result: tuple[int, str, str]) -> str:
    code, stdout, stderr = result
    assert "Traceback" not in stderr and code == 0, stderr
    return stdout


@pytest.mark.parametrize("rid", list(METHODS))
def test_each_read_command_on_a_run_of_each_method(ran: dict, workspace: Path, rid: str) -> None:
    verify = _ok(ran[rid, "verify"])
    assert verify.startswith(f"run {rid}: {STAGES[rid]} stages, ") and verify.endswith(" 0 damaged\n")
    _ok(ran[rid, "report"])
    assert (workspace / "reports" / rid / "report.md").is_file()
    _ok(ran[rid, "export"])
    assert json.loads((workspace.parent / f"policy-{rid}" / "config.json").read_text()) == {}
    pool = json.loads(_ok(ran[rid, "rubrics export"]))
    assert pool["source_run"] == rid and pool["rubrics"] == []
    disk = _ok(ran[rid, "disk"])
    assert "parquet/trajectories" in disk and "checkpoints" in disk
    if rid in OWN_TABLE:
        assert f"parquet/{OWN_TABLE[rid]}" in disk


def test_runs_and_sql_over_every_method(ran: dict) -> None:
    assert {r["run_id"]: r["method"] for r in json.loads(_ok(ran["", "runs"]))} == METHODS
    # each method's own table holds its run's one row (one stage stores it)
    rows = json.loads(_ok(ran["", "sql tables"]))
    assert sorted((r["t"], r["run_id"], r["n"]) for r in rows) == [
        ("group_diversity", "diversity", 1), ("mu_updates", "arco", 1), ("reflections", "rubricem", 1),
        ("rubric_verdicts", "arbor", 1), ("stage_grades", "rubricem", 1), ("stage_grades", "ss-grpo", 1)]
    assert sorted(r["v"] for r in json.loads(_ok(ran["", "sql views"]))) == sorted(VIEWS)
