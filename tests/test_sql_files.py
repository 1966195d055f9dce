"""SQL lives in sql/: every query arbor runs is a file ``sql/queries/<name>.sql``, every such file
is used, values are bound as ``$name`` parameters (never pasted into SQL text), and a quote in a value is harmless."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arbor.cli import app
from arbor.paths import PROJECT_ROOT
from arbor.storage.sql import QUERIES_DIR, SqlError, query, run_file, sql_file

CODE_DIRS = ("arbor", "tasks", "flows", "storage")
QUOTED = "it's"  # a run id that breaks any query built by pasting it between quotes
EXAMPLE = {"run_id": QUOTED, "run_ids": [QUOTED, "other"], "top_n": 5, "step": None, "checkpoint": None}


def _query_files() -> list[Path]:
    return sorted(QUERIES_DIR.glob("*.sql"))


def _python_files() -> list[Path]:
    return [p for d in CODE_DIRS for p in sorted((PROJECT_ROOT / d).rglob("*.py"))]


def _params(text: str) -> set[str]:
    """The ``$name`` placeholders of a query, comments left out."""
    return set(re.findall(r"\$([a-z_]+)", re.sub(r"--[^\n]*", "", text)))


def test_every_query_file_is_named_for_its_question_and_used() -> None:
    files = _query_files()
    assert files, QUERIES_DIR
    code = "\n".join(p.read_text() for p in _python_files())
    for f in files:
        assert f.read_text().startswith(f"-- {f.stem}: "), f"{f.name}: start with '-- {f.stem}: <its question>'"
        assert f'"{f.stem}"' in code, f"sql/queries/{f.name} is used by no module under {', '.join(CODE_DIRS)}"


def _pasted(tree: ast.AST) -> list[int]:
    """Lines of f-strings or ``.format`` calls that build a ``select`` from interpolated values."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and any(isinstance(v, ast.FormattedValue) for v in node.values):
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
            if "select " in text.lower():
                lines.append(node.lineno)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"
                and isinstance(node.func.value, ast.Constant) and "select " in str(node.func.value.value).lower()):
            lines.append(node.lineno)
    return lines


def test_no_values_pasted_into_sql() -> None:
    bad = [f"{p.relative_to(PROJECT_ROOT)}:{n}" for p in _python_files() for n in _pasted(ast.parse(p.read_text()))]
    assert not bad, f"SQL built from interpolated values (use a sql/queries file and params): {bad}"
    assert _pasted(ast.parse("q = f\"select * from steps where run_id = '{r}'\"")) == [1]  # the check bites
    assert _pasted(ast.parse("q = 'select * from t where x in ({ids})'.format(ids=i)")) == [1]


def test_every_query_file_runs_on_a_fresh_workspace(tmp_path: Path) -> None:
    """Each file binds its parameters and answers (zero rows is fine) against the views of an empty workspace, in a
    process that knows every built-in method's tables (a method's views exist once it is imported or declared)."""
    import arbor.tasks.methods.coreact  # noqa: F401 - Co-ReAct's tables and view
    from arbor.tasks.methods import BUILTIN, resolve_method

    for name in BUILTIN:
        resolve_method(name)
    for f in _query_files():
        names = _params(f.read_text())
        assert names <= set(EXAMPLE), f"{f.name}: parameters {sorted(names - set(EXAMPLE))} need an example here"
        run_file(f.stem, {k: EXAMPLE[k] for k in names}, home=tmp_path)


def test_a_quote_in_a_value_round_trips(arbor_home: Path) -> None:
    """Run ids cannot hold a quote (they name folders), but checkpoints can: bound, it selects exactly its rows."""
    from arbor.tasks.reporting.evaluate import eval_rows, load_eval_results, store_eval_results
    from arbor.tasks.reporting.report import _known_run
    from tests.test_evaluate import PREDS

    for stage, ckpt in (("eval", QUOTED), ("eval-b", "plain")):
        rows = eval_rows(PREDS, run_id="r1", step=10, checkpoint=ckpt)
        store_eval_results(rows, run_id="r1", step=10, stage=stage, home=arbor_home)
    assert query("select $v as v", {"v": QUOTED}, home=arbor_home).to_pylist() == [{"v": QUOTED}]
    back = load_eval_results("r1", checkpoint=QUOTED, home=arbor_home)
    assert len(back) == len(PREDS) and {r["checkpoint"] for r in back} == {QUOTED}
    assert load_eval_results("r1", checkpoint="it''s", home=arbor_home) == []  # no SQL unquoting of the value
    assert len(load_eval_results("r1", 10, home=arbor_home)) == 2 * len(PREDS)
    assert load_eval_results(QUOTED, home=arbor_home) == [] and not _known_run(QUOTED, arbor_home)


def test_report_prints_a_rerunnable_arbor_sql_line(arbor_home: Path) -> None:
    from arbor.tasks.reporting.report import _shown

    shown = _shown("run_row_count", run_id=QUOTED)
    first, rest = shown.split("\n", 1)
    assert first.startswith(f"-- arbor sql --file {QUERIES_DIR / 'run_row_count.sql'} --param")
    assert rest == sql_file("run_row_count").strip()
    args = shlex.split(first.removeprefix("-- arbor "))  # as printed: an absolute path, from any folder
    res = CliRunner().invoke(app, [*args, "--format", "json"])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == '[{"n": 0}]'


def test_arbor_sql_param_and_missing_file(arbor_home: Path) -> None:
    res = CliRunner().invoke(app, ["sql", "select $run_id as r, $n as n", "--param", f"run_id={QUOTED}",
                                   "--param", "n=a=b", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == '[{"r": "it\'s", "n": "a=b"}]'
    res = CliRunner().invoke(app, ["sql", "select 1", "--param", "oops"])
    assert res.exit_code == 2 and "--param oops: expected NAME=VALUE" in res.output
    res = CliRunner().invoke(app, ["sql", "select $run_id"])
    assert res.exit_code == 2 and "run_id" in res.output
    with pytest.raises(SqlError, match=r"sql/queries/no_such_question\.sql"):
        sql_file("no_such_question")
