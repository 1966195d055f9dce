"""Paper Table 1 from stored evaluations (``sql/queries/table1_of_runs.sql``, ``tasks.reporting.table1``): hand-built
``eval_results`` of two runs, figures by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from arbor.storage.parquet import write_stage
from arbor.tasks.reporting.table1 import Cell, average, format_table1, table1_rows


def answer(split: str, q: str, run: int, valid: bool, em: float, f1: float, acc: bool | None) -> dict:
    return {"checkpoint": "c", "split": split, "question_id": q, "run_index": run, "answer": "x",
            "format_valid": valid, "em": em, "f1": f1, "judge_correct": acc, "judge_model": "j", "guidance": None}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    # run A: its step-1 evaluation (older, ignored) and its final one at step 3; two runs per question.
    # bench:hotpotqa q1: F1 1 and 0.5 -> 0.75; q2: F1 0.5 and an invalid answer (scores 0) -> 0.25.
    #   F1 mean 0.5, SE = sd(0.75, 0.25) / sqrt(2) = 0.353553 / 1.414214 = 0.25. EM: q1 (1 + 0) / 2, q2 0 -> 0.25.
    #   judge: q1 both right (1), q2 right then the invalid answer (0) -> 0.5; mean 0.75, SE 0.25.
    # bench:2wiki q3: F1 0.2 both runs; q4: 0.6 both -> mean 0.4, SE sd(0.2, 0.6)/sqrt(2) = 0.2828/1.4142 = 0.2.
    write_stage("eval_results", [answer("bench:hotpotqa", "q1", 0, True, 0, 0.1, False)], run_id="A", step=1,
                stage="eval", home=home)
    write_stage("eval_results", [
        answer("bench:hotpotqa", "q1", 0, True, 1, 1.0, True), answer("bench:hotpotqa", "q1", 1, True, 0, 0.5, True),
        answer("bench:hotpotqa", "q2", 0, True, 0, 0.5, True), answer("bench:hotpotqa", "q2", 1, False, 1, 1.0, None),
        answer("bench:2wiki", "q3", 0, True, 0, 0.2, False), answer("bench:2wiki", "q3", 1, True, 0, 0.2, False),
        answer("bench:2wiki", "q4", 0, True, 0, 0.6, True), answer("bench:2wiki", "q4", 1, True, 0, 0.6, True),
    ], run_id="A", step=3, stage="eval", home=home)
    # run B: one question of hotpotqa only (no 2wiki): its average is undefined
    write_stage("eval_results", [answer("bench:hotpotqa", "q1", 0, True, 1, 1.0, True)], run_id="B", step=2,
                stage="eval", home=home)
    return home


def test_table1_by_hand(workspace: Path) -> None:
    splits, cells, _ = table1_rows(["A", "B"], workspace)
    assert splits == ["hotpotqa", "2wiki"]  # Table 1's column order
    a = cells["A"]
    assert (a["f1"]["hotpotqa"].mean, a["f1"]["hotpotqa"].se) == pytest.approx((0.5, 0.25))
    assert (a["em"]["hotpotqa"].mean, a["acc"]["hotpotqa"].mean, a["acc"]["hotpotqa"].se) == pytest.approx(
        (0.25, 0.75, 0.25))
    assert (a["f1"]["2wiki"].mean, a["f1"]["2wiki"].se) == pytest.approx((0.4, 0.2))
    # Avg.: the unweighted mean of the two benchmarks, SEs in quadrature over 2
    assert (a["f1"]["avg"].mean, a["f1"]["avg"].se) == pytest.approx((0.45, math.sqrt(0.25 ** 2 + 0.2 ** 2) / 2))
    assert cells["B"]["f1"]["hotpotqa"] == Cell(1.0, 0.0) and cells["B"]["f1"]["avg"].mean is None


def test_the_comparison_table(workspace: Path) -> None:
    md = format_table1(["A", "B"], workspace)
    f1 = md.split("**F1**")[1].split("**LLM-judge acc.**")[0]
    assert "| Run | hotpotqa | 2wiki | Avg. |" in f1
    assert "| A | 50.0 ± 25.0 | 40.0 ± 20.0 | 45.0 ± 16.0 |" in f1
    assert "| B | 100.0 ± 0.0 | - | - |" in f1
    assert format_table1(["nobody"], workspace) == ""


def test_average_of_nothing() -> None:
    assert average([]).mean is None and str(average([])) == "-"


def test_arbor_report_compares_existing_runs(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``arbor report A B``: each run's report, then their Table 1 side by side (nothing is trained or evaluated)."""
    import time

    from typer.testing import CliRunner

    from arbor.cli import app
    from arbor.config import load_config

    for rid in ("A", "B"):
        cfg = load_config("tiny-world", {"run.method": "grpo"})
        cfg.run.run_id = rid
        write_stage("runs", [{"profile": "tiny-world", "method": "grpo", "seed": 0, "config_json": cfg.to_json(),
                              "created_at": time.time()}], run_id=rid, step=0, stage="run", home=workspace)
    monkeypatch.setenv("ARBOR_HOME", str(workspace))
    result = CliRunner().invoke(app, ["report", "A", "B"])
    assert result.exit_code == 0, result.output[-3000:]
    assert f"report: {workspace / 'reports' / 'A' / 'report.md'}" in result.output
    f1 = result.output.split("**F1**")[1].split("**LLM-judge acc.**")[0]
    assert "| A | 50.0 ± 25.0 | 40.0 ± 20.0 | 45.0 ± 16.0 |" in f1 and "| B | 100.0 ± 0.0 | - | - |" in f1
    assert "## Table 1" in (workspace / "reports" / "B" / "report.md").read_text()
