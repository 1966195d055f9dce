"""Is my judge helping? ARBOR's ``judge_signal_quality`` view over Parquet written by the storage
layer, its step-summary line and its report panel, on hand-built groups whose figures are computed by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbor.group_stats import verdict_agreement, zero_var_shaping
from arbor.storage.catalog import declare_tables
from arbor.storage.parquet import write_stage
from arbor.storage.sql import run_file
from arbor.tasks.methods.arbor import Arbor
from arbor.tasks.methods.arbor.report import console_lines, judge_signal_metrics
from arbor.tasks.methods.arbor.tables import TABLES, verdict_rows
from arbor.types import Trajectory

# step 1, K = 4: groups 0 and 1 mixed, 2 and 3 zero-variance; (base rewards, total rewards)
assert Arbor.tables is TABLES  # defining the method registers its table
GROUPS = {0: ([0, 0, 1, 1], [0, 0, 1, 1]), 1: ([0, .5, 1, 1], [0, .5, 1, 1]),
          2: ([0, 0, 0, 0], [.02, -.02, 0, 0]), 3: ([1, 1, 1, 1], [1, 1, 1, 1])}
EDGES = ((0, 1), (1, 2), (2, 3), (0, 2), (1, 3))  # sparse_edges of K = 4
# rubric c1, group 0: (0,1) equal bases -> not counted; (1,2) j wins, j higher -> agree; (2,3) equal; (0,2) j wins
# -> agree; (1,3) i wins, i lower -> disagree.  group 1: (0,1) tie; (1,2) failed; (2,3) equal; (0,2) agree;
# (1,3) agree.  c1: agree 4, disagree 1, tie 1, failed 1 -> agreement 0.8.
# rubric c2, group 0 only: (1,2) i wins, i lower -> disagree; (0,2) and (1,3) ties on differing bases; the rest
# ties on equal bases (not counted) -> agree 0, disagree 1, tie 2, agreement 0.0
VERDICTS = {("c1", 0): (1.0, 0.0, 0.5, 0.0, 1.0), ("c1", 1): (0.5, None, 1.0, 0.0, 0.0),
            ("c2", 0): (0.5, 1.0, 0.5, 0.5, 0.5)}
ACTIVATIONS = [("c1", 0, True), ("c1", 1, True), ("c1", 2, True), ("c1", 3, False), ("c2", 0, True)]
# zero-variance groups 2 and 3: one got a shaped signal (share 1/2); |total - mean| = .02, .02, 0, 0 and four 0s
# -> mean |dA| = .04 / 8 = .005


def trajectory_rows(groups: dict[int, tuple[list[float], list[float]]], step: int) -> list[dict]:
    return [Trajectory(run_id="r", step=step, group=g, sample=s, question_id=f"q{g}", question="?", golds=["x"],
                       base_reward=b, shaped_reward=t, f1=max(b, 0.0), format_valid=True).to_row()
            for g, (base, total) in groups.items() for s, (b, t) in enumerate(zip(base, total, strict=True))]


def verdict_table() -> list[dict]:
    return [row for (rid, g), outs in VERDICTS.items()
            for row in verdict_rows(g, rid, [float(b) for b in GROUPS[g][0]], EDGES, outs)]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    declare_tables(TABLES, home)
    write_stage("trajectories", trajectory_rows(GROUPS, 1), run_id="r", step=1, stage="shape", home=home)
    write_stage("rubric_verdicts", verdict_table(), run_id="r", step=1, stage="score", home=home)
    write_stage("rubric_activations", [{"group": g, "rubric_id": rid, "kept": kept, "judge_error": False,
                                        "variance": 0.1, "n_edges": 5, "n_failed_edges": 0}
                                       for rid, g, kept in ACTIVATIONS], run_id="r", step=1, stage="score", home=home)
    events = [("induced", None)] * 4 + [("admitted", None), ("rejected", "variance < delta_v"),
                                        ("rejected", "variance < delta_v"), ("rejected", "pearson < rho_min")]
    write_stage("rubric_events", [{"seq": i, "rubric_id": f"d{i}", "event": e, "kind": "draft", "reason": why}
                                  for i, (e, why) in enumerate(events)], run_id="r", step=1, stage="induce", home=home)
    # step 2: one zero-variance group, no active rubric, nothing shaped
    write_stage("trajectories", trajectory_rows({0: ([0, 0], [0, 0])}, 2), run_id="r", step=2, stage="shape",
                home=home)
    return home


def test_the_view_answers_per_step_and_rubric(workspace: Path) -> None:
    rows = run_file("judge_signal_quality_of_run", {"run_id": "r"}, home=workspace)
    by = {(r["step"], r["rubric_id"]): r for r in rows}
    assert set(by) == {(1, "c1"), (1, "c2"), (2, None)}
    c1, c2, s2 = by[(1, "c1")], by[(1, "c2")], by[(2, None)]
    assert (c1["agree"], c1["disagree"], c1["ties"], c1["failed"]) == (4, 1, 1, 1)
    assert c1["agreement_rate"] == pytest.approx(0.8)
    assert (c1["mixed_groups"], c1["zero_var_activations"], c1["zero_var_kept"]) == (2, 2, 1)
    assert (c2["agree"], c2["disagree"], c2["ties"], c2["agreement_rate"]) == (0, 1, 2, 0.0)
    assert (c2["mixed_groups"], c2["zero_var_activations"]) == (1, 0)
    for r in (c1, c2):  # the step's figures, beside each rubric
        assert (r["zero_var_groups"], r["zero_var_groups_shaped"]) == (2, 1)
        assert r["zero_var_shaped_share"] == pytest.approx(0.5)
        assert r["zero_var_mean_abs_shift"] == pytest.approx(0.005)
        assert (r["drafts_induced"], r["drafts_admitted"], r["drafts_rejected"]) == (4, 1, 3)
        assert (r["rejected_variance"], r["rejected_pearson"], r["rejected_other"]) == (2, 1, 0)
    assert (s2["zero_var_groups"], s2["zero_var_shaped_share"], s2["zero_var_mean_abs_shift"]) == (1, 0.0, 0.0)
    assert s2["agreement_rate"] is None and s2["drafts_induced"] == 0


def test_the_step_metrics_and_summary_line_give_the_same_figures() -> None:
    rows = verdict_table()
    assert verdict_agreement([(v["outcome"], v["base_i"], v["base_j"]) for v in rows]) == (4, 2, 3)
    assert zero_var_shaping(list(GROUPS.values())) == (2, 1, pytest.approx(0.005))
    m = judge_signal_metrics(rows, trajectory_rows(GROUPS, 1))
    assert m["signal/agreement"] == pytest.approx(4 / 6) and m["signal/tie_edges"] == 3.0
    assert m["signal/zero_var_shaped_share"] == 0.5
    line = console_lines({k: v for k, v in m.items() if v is not None})[-1]  # ARBOR's console rows
    assert line.split() == ["signal", "agree", "0.6667", "(4/6", "edges,", "3", "ties)", "zero-var", "shaped", "0.5",
                            "|dA|", "0.005"]
    assert judge_signal_metrics([], trajectory_rows(GROUPS, 1)) == {}  # a method without verdicts: no line
    assert console_lines({"reward/base_mean": 0.5}) == []  # no pool, no verdicts: no row


def test_the_report_panel(workspace: Path) -> None:
    from arbor.tasks.reporting.report import judge_signal_panel

    queries: list[str] = []
    md = "\n".join(judge_signal_panel("r", workspace, queries))
    assert "## Is the judge helping?" in md and "from judge_signal_quality" in md and len(queries) == 1
    assert "| 1 | c1 | 2 | 4 / 1 / 1 | 80.0% | 2 | 50.0% | 0.005 | 1 / 3 (2, 1, 0) |" in md
    assert "| 2 | (none active) |" in md
    assert judge_signal_panel("other-run", workspace, []) == []


class StoredRun:
    """The stored stages of run ``r`` as a method reads them after a step: ``RunState.rows``' own reader over a
    workspace and a method's stage list, without the run's trainer, engine and judge."""

    run_id = "r"

    def __init__(self, home: Path, method: type) -> None:
        self.home, self.stage_names = home, method.stage_names

    def rows(self, step: int, table: str) -> list[dict]:
        from arbor.tasks.step import read_stage_rows

        return read_stage_rows(self, step, table)  # type: ignore[arg-type]


def test_arbor_logs_its_lifecycle_and_signal_and_grpo_nothing_of_them(workspace: Path) -> None:
    """The trackers' figures of an ARBOR step come from ARBOR's package (by hand above: 4 induced, 1 admitted;
    agree 4, disagree 2, tie 3; zero-variance shaped 1 of 2, |dA| 0.005); a GRPO step logs none of them."""
    from arbor.config import load_config
    from arbor.tasks.methods import resolve_method

    cfg = load_config("tiny-cpu")
    arbor = resolve_method("arbor")(cfg)
    m = arbor.logged_metrics(StoredRun(workspace, Arbor), 1)  # type: ignore[arg-type]
    assert {k: v for k, v in m.items() if k.startswith("rubric/")} == {
        "rubric/induced": 4.0, "rubric/admitted": 1.0, "rubric/consolidated": 0.0, "rubric/retired": 0.0,
        "rubric/pool_size": 0.0}
    assert (m["signal/agree_edges"], m["signal/disagree_edges"], m["signal/tie_edges"]) == (4.0, 2.0, 3.0)
    assert m["signal/zero_var_shaped_share"] == 0.5 and m["signal/zero_var_abs_shift"] == pytest.approx(0.005)
    report = arbor.step_report(StoredRun(workspace, Arbor), 1)  # type: ignore[arg-type]
    assert report is not None and report.startswith("## Step 1 rubric events\n\n| seq | event |")
    assert "| 5 | rejected | d5 |  |  |  |  |  | variance < delta_v |" in report.splitlines()
    assert report.endswith("**Common pool:** (empty)\n")
    grpo = resolve_method("grpo")(cfg)
    assert grpo.logged_metrics(StoredRun(workspace, grpo), 1) == {} and grpo.step_report(None, 1) is None  # type: ignore[arg-type]


def test_a_sampled_trajectorys_scores_are_its_active_rubrics() -> None:
    """``Arbor.sample_scores`` (the trackers' sample table): per (group, sample), each activated rubric's score of
    that trajectory, in activation order; a failed score (None) and a rubric with no scores are left out."""
    from arbor.tasks.methods.arbor.report import activation_scores

    acts = [{"group": 0, "rubric_id": "r1", "scores": [0.5, None, -0.25]},
            {"group": 0, "rubric_id": "r2", "scores": [1.0, 0.0, 0.0]},
            {"group": 1, "rubric_id": "r1", "scores": None}]
    assert activation_scores(acts) == {(0, 0): "r1 +0.50, r2 +1.00", (0, 1): "r2 +0.00",
                                       (0, 2): "r1 -0.25, r2 +0.00"}
    assert activation_scores([]) == {}
