"""Diagnostics that explain a row (ARBOR's views ``verdict_ties``, ``filter_pass_by_pattern``, ``rubric_lifetimes``
and their report panel) over Parquet written by the storage layer, on hand-built groups with figures by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbor.storage.catalog import declare_tables
from arbor.storage.parquet import write_stage
from arbor.storage.sql import run_file
from arbor.tasks.methods.arbor import Arbor
from arbor.tasks.methods.arbor.tables import TABLES, verdict_rows
from arbor.types import Trajectory

assert Arbor.tables is TABLES  # defining the method registers its tables and views

# K = 4. Step 1: g0 mixed, g1 all-correct, g2 all-wrong, g3 mixed-uniform (F1 0.5 everywhere), g4 mixed by the
# format gate alone (one invalid trajectory, base -1; F1 0 everywhere). Step 2: g0 mixed.
BASES = {(1, 0): [0, 0, 1, 1], (1, 1): [1, 1, 1, 1], (1, 2): [0, 0, 0, 0], (1, 3): [.5, .5, .5, .5],
         (1, 4): [-1, 0, 0, 0], (2, 0): [0, 1, 0, 1]}
# (step, group, rubric, kept, judge_error, variance)
ACTS = [(1, 0, "c1", True, False, .1), (1, 1, "c1", False, False, 0.0), (1, 2, "c1", True, False, .06),
        (1, 3, "c1", False, False, 0.0), (1, 4, "c1", False, True, None), (1, 0, "c2", False, False, .02),
        (1, 2, "c2", True, False, .07), (2, 0, "c1", True, False, .2)]
EDGES = ((0, 1), (1, 2), (2, 3), (0, 2), (1, 3))  # sparse_edges of K = 4
# outcomes per (rubric, group) at step 1; edges of equal base rewards in g0: (0, 1), (2, 3); in g2: all
VERDICTS = {("c1", 0): (0.5, 1.0, 0.5, 0.0, None), ("c1", 2): (0.5, 0.5, 1.0, 0.5, 0.0),
            ("c2", 0): (1.0, 0.5, 0.5, 0.5, 0.5)}


def trajectory_rows() -> list[dict]:
    return [Trajectory(run_id="r", step=step, group=g, sample=s, question_id=f"q{g}", question="?", golds=["x"],
                       base_reward=b, shaped_reward=b, f1=max(b, 0.0), format_valid=b >= 0).to_row()
            for (step, g), bases in BASES.items() for s, b in enumerate(bases)]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    declare_tables(TABLES, home)
    for step in (1, 2):
        write_stage("trajectories", [t for t in trajectory_rows() if t["step"] == step], run_id="r", step=step,
                    stage="shape", home=home)
        write_stage("rubric_activations", [
            {"group": g, "rubric_id": rid, "kept": kept, "judge_error": err, "variance": var, "n_edges": 5,
             "n_failed_edges": 5 if err else 0} for s, g, rid, kept, err, var in ACTS if s == step],
            run_id="r", step=step, stage="score", home=home)
    write_stage("rubric_verdicts", [row for (rid, g), outs in VERDICTS.items()
                                    for row in verdict_rows(g, rid, [float(b) for b in BASES[(1, g)]], EDGES, outs)],
                run_id="r", step=1, stage="score", home=home)
    events = {0: [("c1", "consolidated", "common", None), ("c2", "consolidated", "common", None)],
              1: [("c2", "retired", "common", "n_r=6 > kappa=5 at the activation on group 2 of step 1"),
                  ("d1", "consolidated", "draft", "consumed by consolidation at step 1"),
                  ("c3", "consolidated", "common", "from 8 drafts")],
              2: [("c3", "replaced", "common", "lowest mean within-group variance among matured")]}
    for step, evs in events.items():
        write_stage("rubric_events", [{"seq": i, "rubric_id": rid, "event": e, "kind": kind, "reason": why,
                                       "title": f"title {rid}"} for i, (rid, e, kind, why) in enumerate(evs)],
                    run_id="r", step=step, stage="consolidate", home=home)
    return home


def test_verdict_ties(workspace: Path) -> None:
    """c1: 9 judged edges (one failed), 5 ties, all on equal-outcome edges (5 of 7); its 2 decisive verdicts are
    no ties. c2: 5 judged, 4 ties; equal edges 1 of 2, decisive 3 of 3. The run: 9 of 14; 6 of 9; 3 of 5."""
    rows = {r["rubric_id"]: r for r in run_file("verdict_ties_of_run", {"run_id": "r"}, home=workspace)}
    want = {None: (15, 14, 9, 9 / 14, 9, 6 / 9, 5, 3 / 5), "c1": (10, 9, 5, 5 / 9, 7, 5 / 7, 2, 0.0),
            "c2": (5, 5, 4, 0.8, 2, 0.5, 3, 1.0)}
    assert set(rows) == set(want)
    for rid, (edges, judged, ties, rate, eq, rate_eq, dec, rate_dec) in want.items():
        r = rows[rid]
        assert (r["edges"], r["judged_edges"], r["ties"], r["equal_outcome_edges"], r["decisive_edges"]) == (
            edges, judged, ties, eq, dec), rid
        assert (r["tie_rate"], r["tie_rate_equal_outcome"], r["tie_rate_decisive"]) == pytest.approx(
            (rate, rate_eq, rate_dec)), rid


def test_filter_pass_by_pattern(workspace: Path) -> None:
    """mixed: step 1's g0 (c1 kept, c2 not), g4 (mixed by the format gate; a judge error, never kept) and step 2's
    g0 (kept): 2 of 4, mean variance (0.1 + 0.02 + 0.2) / 3; all-correct 0 of 1; all-wrong 2 of 2; mixed-uniform
    0 of 1."""
    rows = run_file("filter_pass_of_run", {"run_id": "r"}, home=workspace)
    assert [r["pattern"] for r in rows] == ["mixed", "all_correct", "all_wrong", "mixed_uniform"]
    got = {r["pattern"]: (r["scorings"], r["passed"], r["pass_share"], r["judge_errors"]) for r in rows}
    assert got == {"mixed": (4, 2, 0.5, 1), "all_correct": (1, 0, 0.0, 0), "all_wrong": (2, 2, 1.0, 0),
                   "mixed_uniform": (1, 0, 0.0, 0)}
    assert rows[0]["mean_variance"] == pytest.approx(0.32 / 3)
    assert rows[2]["mean_variance"] == pytest.approx(0.065)


def test_rubric_lifetimes(workspace: Path) -> None:
    rows = run_file("rubric_lifetimes_of_run", {"run_id": "r"}, home=workspace)
    got = [(r["rubric_id"], r["entered_step"], r["left_step"], r["status"], r["steps_active"], r["uses"],
            r["kept_uses"]) for r in rows]
    assert got == [("c1", 0, None, "active", 2, 6, 3), ("c2", 0, 1, "retired", 1, 2, 1),
                   ("c3", 1, 2, "replaced", 0, 0, 0)]  # the draft d1's consolidation is no common rubric's
    assert rows[1]["reason"].startswith("n_r=6 > kappa=5") and rows[0]["title"] == "title c1"


def test_the_report_panel(workspace: Path) -> None:
    from arbor.tasks.reporting.report import lifecycle_panel

    queries: list[str] = []
    md = "\n".join(lifecycle_panel("r", workspace, queries))
    assert len(queries) == 3 and "from rubric_lifetimes" in md
    assert "| (all) | 14 | 64.3% | 9 | 66.7% | 5 | 60.0% |" in md
    assert "| all_wrong | 2 | 2 | 100.0% | 0 | 0.0650 |" in md
    assert "| c2 | title c2 | 0 | 1 | retired | 1 | 2 | 1 | n_r=6 > kappa=5" in md
    assert lifecycle_panel("other-run", workspace, []) == []
