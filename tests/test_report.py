"""``arbor report`` on a synthetic workspace with known events: the Table 2 / Table 3 / Figure 5 figures equal
hand-computed values, the history / lineage / sweep sections read the stored rows, and the PNGs are produced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arbor.storage.parquet import write_stage
from arbor.tasks.reporting.report import (
    ReportError,
    build_report,
    judge_cost,
    lineage,
    reuse,
    rubric_history,
    sweep,
    table2,
    zero_variance_by_step,
)

RUN = "r1"


def traj(step: int, group: int, f1: list[float], valid: list[bool] | None = None,
         shaped: list[float] | None = None, run_id: str = RUN) -> list[dict]:
    valid = valid or [True] * len(f1)
    out = []
    for i, (f, v) in enumerate(zip(f1, valid, strict=True)):
        out.append({"traj_id": f"{run_id}-{step}-{group}-{i}", "step": step, "group": group, "sample": i,
                    "question_id": f"q{step}{group}", "question": f"question {step}.{group}", "golds": ["x"],
                    "format_valid": v, "f1": f, "em": float(f == 1.0), "base_reward": f if v else -1.0,
                    "shaped_reward": None if shaped is None else shaped[i]})
    return out


# Table 2 fixture: 8 query-groups of K = 4 over two steps.
#   step 0 g0  all-correct     base [1,1,1,1]   total [1.02, .98, 1, 1]     zero base, not zero total
#   step 0 g1  all-wrong       base [0,0,0,0]   total [.01, -.01, 0, 0]     zero base, not zero total
#   step 0 g2  all-wrong, one format-invalid: base [0,-1,0,0]               not zero under either
#   step 0 g3  mixed-uniform   base [.5]*4      total = base                zero both
#   step 1 g0  all-correct     total = base                                 zero both
#   step 1 g1  mixed F1 [1, 0, .5, 0]                                        not zero
#   step 1 g2  all-wrong       shaped null (not shaped) -> total = base      zero both
#   step 1 g3  all-wrong       total [.05, 0, 0, -.0125]                    zero base, not zero total
TRAJ = {
    0: (traj(0, 0, [1.0] * 4, shaped=[1.02, 0.98, 1.0, 1.0]) + traj(0, 1, [0.0] * 4, shaped=[0.01, -0.01, 0, 0])
        + traj(0, 2, [0.0] * 4, valid=[True, False, True, True], shaped=[0.0, -1.0, 0.0, 0.0])
        + traj(0, 3, [0.5] * 4, shaped=[0.5] * 4)),
    1: (traj(1, 0, [1.0] * 4, shaped=[1.0] * 4) + traj(1, 1, [1.0, 0.0, 0.5, 0.0], shaped=[1.0, 0.0, 0.5, 0.0])
        + traj(1, 2, [0.0] * 4) + traj(1, 3, [0.0] * 4, shaped=[0.05, 0.0, 0.0, -0.0125])),
}

# Table 3 / Figure 5 fixture: 10 common rubrics; uses (activations) c01..c10 = 6,4,3,2,2,1,1,1,0,0 (20 events).
USES = {"c01": 6, "c02": 4, "c03": 3, "c04": 2, "c05": 2, "c06": 1, "c07": 1, "c08": 1, "c09": 0, "c10": 0}
# c01's activation variances and cumulative Pearson after each one (steps 0, 0, 0, 1, 1, 1; groups 0, 1, 2 in each
# step: within a step, activations are ordered by group)
C01 = [(0, 0.1, 0.30), (0, 0.2, 0.30), (0, 0.3, 0.30), (1, 0.05, 0.35), (1, 0.05, 0.38), (1, 0.2, 0.40)]


def build_workspace(home: Path) -> None:
    for step, rows in TRAJ.items():
        write_stage("trajectories", rows, run_id=RUN, step=step, stage="rollout", home=home)
    events, acts = [], {0: [], 1: []}
    for i, (rid, n) in enumerate(USES.items()):
        events.append({"step": 0, "seq": i, "rubric_id": rid, "event": "consolidated", "kind": "common",
                       "title": f"Rubric {rid}"})
        for j in range(n):
            if rid == "c01":
                step, var, rho = C01[j]
            else:
                step, var, rho = j % 2, 0.1, 0.1
            acts[step].append({"group": j % 3 if rid == "c01" else j % 4, "rubric_id": rid, "variance": var, "kept": var >= 0.05,
                               "judge_error": False, "scores": [0.5, 0.5, 0.5, 0.5], "rho_r_after": rho,
                               "n_r_after": 0, "n_activations_after": j + 1, "mean_variance_after": var})
    events += [{"step": 0, "seq": 100 + k, "rubric_id": d, "event": "induced", "kind": "draft", "title": t}
               for k, (d, t) in enumerate([("d1", "Name the entity first"), ("d2", "Canonical entity names")])]
    write_stage("rubric_events", events, run_id=RUN, step=0, stage="memory", home=home)
    for step, rows in acts.items():
        write_stage("rubric_activations", rows, run_id=RUN, step=step, stage="judge", home=home)
    write_stage("rubric_sources", [
        {"common_rubric_id": "c01", "draft_rubric_id": "d1", "draft_step": 0, "group": 1, "question_id": "q01",
         "question": "Who directed Jaws?"},
        {"common_rubric_id": "c01", "draft_rubric_id": "d2", "draft_step": 0, "group": 2, "question_id": "q02",
         "question": "Where was Kant born?"},
    ], run_id=RUN, step=0, stage="memory", home=home)
    # judge ledger: step 0 three pairwise calls (0.01 USD, 0.01 USD with an error, a free cache hit);
    # step 1 two accuracy calls of 0.005 USD
    write_stage("judge_calls", [
        {"role": "pairwise", "cost_usd": 0.01, "cache_hit": False, "prompt_tokens": 100, "completion_tokens": 5},
        {"role": "pairwise", "cost_usd": 0.01, "cache_hit": False, "error": "timeout", "prompt_tokens": 100},
        {"role": "pairwise", "cost_usd": 0.0, "cache_hit": True, "prompt_tokens": 100, "completion_tokens": 5},
    ], run_id=RUN, step=0, stage="judge", home=home)
    write_stage("judge_calls", [
        {"role": "accuracy", "cost_usd": 0.005, "cache_hit": False, "prompt_tokens": 50, "completion_tokens": 1},
        {"role": "accuracy", "cost_usd": 0.005, "cache_hit": False, "prompt_tokens": 50, "completion_tokens": 1},
    ], run_id=RUN, step=1, stage="eval", home=home)


def add_sweep_runs(home: Path) -> None:
    """Four runs of one profile: r1 (lambda .1, K 8), r2 (lambda .2, K 8), r3 (lambda .1, K 16), g (grpo).

    Official accuracy at the latest eval step (one split, two questions, one run index) is 1/2, 1, 1/2, 0; r1 also
    has an older step whose accuracy (0) must be ignored, and a second judge whose rows must not be mixed in."""
    def cfg(lam: float, k: int) -> str:
        return json.dumps({"memory": {"lambda_": lam, "k_consol": k}, "run": {"profile": "tiny-cpu"}})

    for rid, method, lam, k, correct in (("r1", "arbor", 0.1, 8, [True, False]), ("r2", "arbor", 0.2, 8, [True, True]),
                                         ("r3", "arbor", 0.1, 16, [False, True]), ("g", "grpo", 0.1, 8, [False, False])):
        write_stage("runs", [{"run_id": rid, "profile": "tiny-cpu", "method": method, "seed": 0,
                              "config_json": cfg(lam, k)}], run_id=rid, step=0, stage="run", home=home)
        rows = [{"checkpoint": "c", "split": "bamboogle", "question_id": f"q{i}", "run_index": 0, "answer": "a",
                 "format_valid": True, "em": 0.0, "f1": 0.5, "judge_correct": c, "judge_model": "main"}
                for i, c in enumerate(correct)]
        write_stage("eval_results", rows, run_id=rid, step=5, stage="eval", home=home)
    write_stage("eval_results", [{"checkpoint": "c", "split": "bamboogle", "question_id": "q0", "run_index": 0,
                                  "format_valid": True, "em": 0.0, "f1": 0.0, "judge_correct": False,
                                  "judge_model": "main"}], run_id="r1", step=2, stage="eval", home=home)
    write_stage("eval_results", [{"checkpoint": "c", "split": "bamboogle", "question_id": "q0", "run_index": 0,
                                  "format_valid": True, "em": 0.0, "f1": 0.5, "judge_correct": True,
                                  "judge_model": "second"}], run_id="r1", step=5, stage="eval-second", home=home)
    write_stage("runs", [{"run_id": "other", "profile": "qwen3-8b", "method": "arbor", "seed": 0,
                          "config_json": cfg(0.5, 4)}], run_id="other", step=0, stage="run", home=home)


@pytest.fixture
def workspace(arbor_home: Path) -> Path:
    build_workspace(arbor_home)
    return arbor_home


def test_table2_matches_hand_computation(workspace: Path) -> None:
    t = table2(RUN, workspace)
    assert t is not None and t.n_groups == 8
    # zero under base: s0 g0 (ac), g1 (aw), g3 (mu); s1 g0 (ac), g2 (aw), g3 (aw)  -> 6 / 8
    assert t.base == pytest.approx({"all_correct": 2 / 8, "all_wrong": 3 / 8, "mixed_uniform": 1 / 8, "total": 6 / 8})
    # zero under total: s0 g3 (mu); s1 g0 (ac), g2 (aw)  -> 3 / 8
    assert t.total == pytest.approx({"all_correct": 1 / 8, "all_wrong": 1 / 8, "mixed_uniform": 1 / 8,
                                     "total": 3 / 8})
    # Delta_rel = (total - base) / base: ac (1/8 - 2/8)/(2/8) = -1/2; aw (1/8 - 3/8)/(3/8) = -2/3; mu 0; total -1/2
    assert t.rel == pytest.approx({"all_correct": -0.5, "all_wrong": -2 / 3, "mixed_uniform": 0.0, "total": -0.5})


def test_zero_variance_per_step_and_judge_cost(workspace: Path) -> None:
    rows, _ = zero_variance_by_step(RUN, workspace)
    # step 0: base zero g0, g1, g3 = 3/4; total zero g3 = 1/4; converted 1 - (1/4)/(3/4) = 2/3
    # step 1: base zero g0, g2, g3 = 3/4; total zero g0, g2 = 2/4; converted 1 - (2/4)/(3/4) = 1/3
    assert [r["step"] for r in rows] == [0, 1]
    assert [r["base_total"] for r in rows] == pytest.approx([0.75, 0.75])
    assert [r["total_total"] for r in rows] == pytest.approx([0.25, 0.5])
    assert [r["converted_share"] for r in rows] == pytest.approx([2 / 3, 1 / 3])
    cost, _ = judge_cost(RUN, workspace)
    got = {r["role"]: (r["n_calls"], r["n_cache_hits"], r["n_errors"], r["prompt_tokens"]) for r in cost}
    assert got == {"accuracy": (2, 0, 0, 100), "pairwise": (3, 1, 1, 300), "all": (5, 1, 1, 400)}
    assert {r["role"]: r["cost_usd"] for r in cost} == pytest.approx({"accuracy": 0.01, "pairwise": 0.02, "all": 0.03})


def test_table3_and_figure5_match_hand_computation(workspace: Path) -> None:
    r = reuse(RUN, workspace, top_n=5)
    # ranked by uses, ties by id: c01 6, c02 4, c03 3, c04 2, c05 2
    assert [(x["rubric_id"], x["uses"]) for x in r.top] == [("c01", 6), ("c02", 4), ("c03", 3), ("c04", 2), ("c05", 2)]
    assert r.top[0]["title"] == "Rubric c01"
    assert (r.n_rubrics, r.scoring_events) == (10, 20)
    # cumulative uses 6, 10, 13, 15, 17, 18, 19, 20, 20, 20 over 20 events at fractions 0.1 ... 1.0
    expected = [(0.1 * (i + 1), c / 20) for i, c in enumerate([6, 10, 13, 15, 17, 18, 19, 20, 20, 20])]
    assert [x for x, _ in r.curve] == pytest.approx([x for x, _ in expected])
    assert [y for _, y in r.curve] == pytest.approx([y for _, y in expected])
    # top 5% of 10 rubrics = 0.5 rubric = half of c01: 0.5 * 6 / 20 = 0.15; top 20% = c01 + c02: 10 / 20 = 0.5
    assert r.concentration[0.05] == pytest.approx(0.15)
    assert r.concentration[0.2] == pytest.approx(0.5)


def test_history_and_lineage(workspace: Path) -> None:
    hist, sql = rubric_history(RUN, workspace)
    assert "from rubric_history" in sql
    assert list(hist)[0] == "c01"  # most used first
    c01 = hist["c01"]
    # step 0: variances .1, .2, .3 -> mean .2, rho_r after the last activation .30;
    # step 1: .05, .05, .2 -> mean .1, rho_r .40
    assert [(x["step"], x["n_groups"]) for x in c01] == [(0, 3), (1, 3)]
    assert [x["mean_variance"] for x in c01] == pytest.approx([0.2, 0.1])
    assert [x["rho_r"] for x in c01] == pytest.approx([0.30, 0.40])
    assert [x["n_kept"] for x in c01] == [3, 3]
    lin, _ = lineage(RUN, workspace)
    assert list(lin) == ["c01"]
    assert [(d["draft_rubric_id"], d["draft_title"], d["question"]) for d in lin["c01"]["drafts"]] == [
        ("d1", "Name the entity first", "Who directed Jaws?"), ("d2", "Canonical entity names", "Where was Kant born?")]


def test_sweep_reads_lambda_and_k_consol_from_config_json(workspace: Path) -> None:
    add_sweep_runs(workspace)
    s = sweep(RUN, workspace)
    got = {p["run_id"]: (p["method"], p["lambda_"], p["k_consol"], p["acc"]) for p in s.points}
    # latest step only (r1's step-2 row ignored), main judge only (r1's 'second' rows ignored), same profile only
    assert got == {"r1": ("arbor", 0.1, 8, 0.5), "r2": ("arbor", 0.2, 8, 1.0), "r3": ("arbor", 0.1, 16, 0.5),
                   "g": ("grpo", 0.1, 8, 0.0)}
    assert s.metric == "acc" and s.varies()


def test_build_report_writes_markdown_with_sql_and_pngs(workspace: Path) -> None:
    add_sweep_runs(workspace)
    paths = build_report(RUN, home=workspace)
    assert paths.directory == workspace / "reports" / RUN
    assert set(paths.figures) == {"table2", "zero_by_step", "figure5", "history", "figure4"}
    for p in paths.figures.values():
        assert p.exists() and p.stat().st_size > 1000
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = paths.markdown.read_text()
    # Table 2 row values, Table 3 row, Figure 5 figures, lineage question, and the SQL it used
    assert "| R_base | 25.0% | 37.5% | 12.5% | 75.0% |" in md
    assert "| Delta_rel | -50.0% | -66.7% | +0.0% | -50.0% |" in md
    assert "| 1 | Rubric c01 | c01 | 6 |" in md
    assert "top 5% of rubrics cover 15.0%" in md and "top 20% cover 50.0%" in md
    assert "Who directed Jaws?" in md
    assert "| 0 | 4 | 75.0% | 25.0% | 66.7% |" in md  # step 0 of the per-step table
    assert "| all | 5 | 1 | 1 | 400 | 12 | 0.0300 |" in md  # judge cost totals (completion 5 + 5 + 1 + 1)
    for view in ("zero_variance_groups", "rubric_reuse", "rubric_reuse_concentration", "rubric_history",
                 "rubric_lineage", "eval_results", "judge_cost_per_step"):
        assert f"from {view}" in md
    assert md.count("```sql") >= 6
    # a second report into a chosen folder; an unknown run is refused by name
    other = build_report(RUN, home=workspace, out_dir=workspace / "elsewhere")
    assert other.markdown.parent == workspace / "elsewhere"
    with pytest.raises(ReportError, match="'nope'"):
        build_report("nope", home=workspace)


def test_report_of_a_run_without_rubrics(arbor_home: Path) -> None:
    for step, rows in TRAJ.items():
        write_stage("trajectories", rows, run_id="plain", step=step, stage="rollout", home=arbor_home)
    paths = build_report("plain", home=arbor_home)
    assert set(paths.figures) == {"table2", "zero_by_step"}
    md = paths.markdown.read_text()
    assert "No common rubrics in this run." in md and "No rubric activations in this run." in md
    assert "No judge calls recorded." in md
