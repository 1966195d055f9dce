"""Every question view on a small synthetic run whose figures were computed by hand (in the comments)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from arbor.storage.parquet import write_stage
from arbor.storage.sql import query

K = 4

# run r1, K = 4. (valid, F1, shaped total reward) per trajectory; base = F1 if valid else -1.
R1_GROUPS = {
    1: [
        # g0 all-correct; shaping gave no signal -> zero variance under base and under total
        [(True, 1.0, 1.0)] * 4,
        # g1 all-wrong (valid): base 0,0,0,0 zero-var; rubric shaping separated them -> not zero-var under total
        [(True, 0.0, 0.02), (True, 0.0, -0.005), (True, 0.0, -0.005), (True, 0.0, -0.01)],
        # g2 mixed outcome: base 1, .5, 0, 0 -> never zero-var
        [(True, 1.0, 1.0), (True, 0.5, 0.5), (True, 0.0, 0.0), (True, 0.0, 0.0)],
        # g3 all-wrong but one format-invalid: base 0,0,0,-1 -> unequal, NOT zero-var under base (nor total)
        [(True, 0.0, 0.0), (True, 0.0, 0.0), (True, 0.0, 0.0), (False, 0.0, -1.0)],
    ],
    2: [
        # g0 mixed-uniform: F1 .5 on all, base .5 each, total .5 each -> zero-var under both
        [(True, 0.5, 0.5)] * 4,
        # g1 all format-invalid: base -1 each -> zero-var all-wrong under both; shaped_reward null (= base)
        [(False, 0.0, None)] * 4,
    ],
}

# activations (step, group, rubric, scores, kept, n_r_after, rho_r_after)
R1_ACTIVATIONS = [
    (1, 0, "c1", [0.5, 0.5, 0.5, 0.5], False, 1, 0.1),  # population variance 0
    (1, 1, "c1", [1.0, 0.5, 0.5, 0.0], True, 0, 0.2),  # mean .5, (.25+0+0+.25)/4 = .125
    (1, 2, "c1", [1.0, 0.5, 0.5, 0.0], True, 0, 0.3),  # .125
    (1, 3, "c1", [0.75, 0.25, 0.5, 0.5], False, 1, 0.4),  # (.0625+.0625+0+0)/4 = .03125 < delta_v
    (1, 1, "c2", [1.0, 0.5, 0.5, 0.0], True, 0, 0.5),
    (1, 2, "c2", [1.0, 0.5, 0.5, 0.0], True, 0, 0.6),
    (2, 0, "c1", [0.5, 0.5, 0.5, 0.5], False, 2, 0.45),
    (2, 1, "c3", [0.5, 0.5, 0.5, 0.5], False, 6, -0.1),
]


def _var(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)


def _ev(seq, rubric_id, event, kind, **kw):
    return dict(seq=seq, rubric_id=rubric_id, event=event, kind=kind, **kw)


R1_EVENTS_STEP0 = [
    _ev(0, "d1", "induced", "draft", group=2, title="D1", description="targets entity attributes"),
    _ev(1, "d1", "admitted", "draft", group=2, variance=0.1, pearson=0.8, candidate_pool_size=1),
    _ev(2, "d2", "induced", "draft", group=2, title="D2"),
    _ev(3, "d2", "rejected", "draft", group=2, variance=0.1, pearson=-0.2, reason="pearson < rho_min"),
    _ev(4, "d3", "induced", "draft", group=3, title="D3"),
    _ev(5, "d3", "admitted", "draft", group=3, variance=0.2, pearson=0.5, candidate_pool_size=2),
    _ev(6, "c1", "consolidated", "common", title="C1", pool_size=1),
    _ev(7, "d1", "consolidated", "draft", candidate_pool_size=0),
    _ev(8, "d3", "consolidated", "draft", candidate_pool_size=0),
    _ev(9, "c2", "consolidated", "common", title="C2", pool_size=2),
    _ev(10, "c3", "consolidated", "common", title="C3", pool_size=3),
    _ev(11, "c4", "consolidated", "common", title="C4", pool_size=4),
    _ev(12, "c5", "duplicate", "common", title="C5", other_rubric_id="c1", similarity=0.95),
    _ev(13, "d4", "induced", "draft", group=1, title="D4"),
    _ev(14, "d4", "admitted", "draft", group=1, candidate_pool_size=1),
]
R1_EVENTS_STEP2 = [
    _ev(0, "c1", "activated", "common"),
    _ev(1, "c3", "activated", "common"),
    _ev(2, "c3", "retired", "common", n_r=6, rho_r=-0.1, pool_size=3, reason="n_r > kappa"),
]


def _traj_rows(step: int) -> list[dict]:
    rows = []
    for g, members in enumerate(R1_GROUPS[step]):
        for s, (valid, f1, shaped) in enumerate(members):
            rows.append(dict(traj_id=f"r1/{step}/{g}/{s}", group=g, sample=s, question_id=f"q{step}{g}",
                             question=f"question {step}-{g}", text="...", format_valid=valid, em=float(f1 == 1.0),
                             f1=f1, base_reward=f1 if valid else -1.0, shaped_reward=shaped))
    return rows


def _ts(day: int, hour: int = 0) -> datetime:
    return datetime(2026, 1, day, hour, tzinfo=UTC)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    h = tmp_path_factory.mktemp("views")
    w = lambda table, rows, run_id="r1", step=0, stage="s": write_stage(  # noqa: E731
        table, rows, run_id=run_id, step=step, stage=stage, home=h)
    for i, run in enumerate(["r1", "r2", "r3", "r4"]):
        w("runs", [dict(profile="tiny-cpu", method="arbor", seed=i, created_at=_ts(1 + i))], run_id=run, stage="run")
    for step in (1, 2):
        w("trajectories", _traj_rows(step), step=step, stage="rollout")
        w("steps", [dict(completed_at=_ts(1, step), loss=0.1)], step=step, stage="train")
    # stage_runs: r1 completed, r2 failed at its latest stage, r3 still running, r4 never started
    w("stage_runs", [dict(stage="rollout", started_at=_ts(1, 1), finished_at=_ts(1, 1), status="completed")], step=1)
    w("stage_runs", [dict(stage="run", started_at=_ts(1, 0), finished_at=_ts(1, 3), status="completed")], step=2)
    w("stage_runs", [dict(stage="rollout", started_at=_ts(2, 1), status="completed"),
                     dict(stage="train", started_at=_ts(2, 2), status="failed")], run_id="r2", step=1)
    w("stage_runs", [dict(stage="rollout", started_at=_ts(3, 1), status="running")], run_id="r3", step=1)
    w("rubric_events", R1_EVENTS_STEP0, step=0, stage="memory")
    w("rubric_events", R1_EVENTS_STEP2, step=2, stage="memory")
    for step in (1, 2):
        w("rubric_activations", [
            dict(group=g, rubric_id=r, scores=sc, variance=_var(sc), kept=kept, judge_error=False, n_r_after=nr,
                 rho_r_after=rho, n_activations_after=None) for (st, g, r, sc, kept, nr, rho) in R1_ACTIVATIONS
            if st == step], step=step, stage="score")
    w("rubric_sources", [dict(common_rubric_id="c1", draft_rubric_id="d1", draft_step=0, group=2, question_id="q02"),
                         dict(common_rubric_id="c1", draft_rubric_id="d3", draft_step=0, group=3, question_id="q03")],
      stage="memory")
    w("judge_calls", [
        dict(role="pairwise", model="m", cost_usd=0.01, prompt_tokens=100, completion_tokens=5, latency_s=1.0),
        dict(role="pairwise", model="m", cost_usd=0.02, prompt_tokens=200, completion_tokens=5, latency_s=3.0,
             error="timeout", attempts=3),
        dict(role="pairwise", model="m", cost_usd=0.0, cache_hit=True, latency_s=0.0),
        dict(role="induction", model="m", cost_usd=0.05, prompt_tokens=1000, completion_tokens=300, latency_s=8.0),
    ], step=1, stage="score")
    w("judge_calls", [dict(role="pairwise", model="m", cost_usd=0.01, latency_s=2.0)], step=2, stage="score")
    # run r2: 30 common rubrics y00..y29 with uses y00: 10, y01: 6, y02-y05: 3 each, y06-y29: 1 each
    # -> scoring events 10 + 6 + 4*3 + 24*1 = 52
    uses = [10, 6] + [3] * 4 + [1] * 24
    w("rubric_events", [_ev(i, f"y{i:02d}", "consolidated", "common", title=f"Y{i}") for i in range(30)],
      run_id="r2", stage="memory")
    w("rubric_activations", [dict(group=j, rubric_id=f"y{i:02d}", variance=0.1, scores=[])
                             for i, u in enumerate(uses) for j in range(u)], run_id="r2", step=1, stage="score")
    return h


def q(sql: str, home) -> list[dict]:
    return query(sql, home=home).to_pylist()


def test_zero_variance_groups_table2(home):
    rows = {(r["level"], r["step"]): r for r in q("select * from zero_variance_groups where run_id = 'r1'", home)}
    s1 = rows[("step", 1)]
    # step 1, 4 groups. base zero-var: g0 (all-correct), g1 (all-wrong) -> 1/4 each, total 2/4; g3 mixes -1 and 0
    # total zero-var: only g0 (all-correct) -> 1/4; converted = 1 - (1/4)/(2/4) = 0.5
    assert s1["n_groups"] == 4
    assert (s1["base_all_correct"], s1["base_all_wrong"], s1["base_mixed_uniform"], s1["base_total"]) == \
        (0.25, 0.25, 0.0, 0.5)
    assert (s1["total_all_correct"], s1["total_all_wrong"], s1["total_mixed_uniform"], s1["total_total"]) == \
        (0.25, 0.0, 0.0, 0.25)
    assert s1["converted_share"] == pytest.approx(0.5)
    s2 = rows[("step", 2)]
    # step 2, 2 groups: g0 mixed-uniform, g1 all-invalid all-wrong; both zero-var under base and total
    assert (s2["base_all_wrong"], s2["base_mixed_uniform"], s2["base_total"], s2["total_total"]) == (0.5, 0.5, 1.0, 1.0)
    assert s2["converted_share"] == pytest.approx(0.0)
    run = rows[("run", None)]
    # run: 6 groups. base zero-var: s1g0 (AC), s1g1 (AW), s2g0 (MU), s2g1 (AW) = 4/6
    # total zero-var: s1g0 (AC), s2g0 (MU), s2g1 (AW) = 3/6; converted = 1 - (3/6)/(4/6) = 0.25
    assert run["n_groups"] == 6
    assert run["base_all_correct"] == pytest.approx(1 / 6) and run["base_all_wrong"] == pytest.approx(2 / 6)
    assert run["base_mixed_uniform"] == pytest.approx(1 / 6) and run["base_total"] == pytest.approx(4 / 6)
    assert run["total_all_correct"] == pytest.approx(1 / 6) and run["total_all_wrong"] == pytest.approx(1 / 6)
    assert run["total_total"] == pytest.approx(3 / 6) and run["converted_share"] == pytest.approx(0.25)


def test_rubric_reuse_table3_figure5(home):
    rows = q("select rank, rubric_id, title, uses, n_rubrics, scoring_events, rubric_fraction, cum_share "
             "from rubric_reuse where run_id = 'r1' order by rank", home)
    # r1 common rubrics: c1..c4 (c5 was a duplicate, never in P). uses: c1 4+1 = 5, c2 2, c3 1, c4 0 -> 8 events
    # cumulative share 5/8, 7/8, 8/8, 8/8 at rubric fractions 1/4, 2/4, 3/4, 4/4
    assert [(r["rubric_id"], r["uses"]) for r in rows] == [("c1", 5), ("c2", 2), ("c3", 1), ("c4", 0)]
    assert rows[0]["title"] == "C1" and {r["n_rubrics"] for r in rows} == {4} and rows[0]["scoring_events"] == 8
    assert [r["rubric_fraction"] for r in rows] == [0.25, 0.5, 0.75, 1.0]
    assert [r["cum_share"] for r in rows] == [0.625, 0.875, 1.0, 1.0]


def test_rubric_reuse_concentration(home):
    rows = {(r["run_id"], r["top_fraction"]): r for r in q("select * from rubric_reuse_concentration", home)}
    # r1: N = 4, 8 events. top 5%: 0.2 rubrics = 0.2 * c1's 5 events -> 1/8 = 0.125
    #                      top 20%: 0.8 rubrics = 0.8 * 5 = 4 events -> 0.5
    assert rows[("r1", 0.05)]["share"] == pytest.approx(0.125)
    assert rows[("r1", 0.2)]["share"] == pytest.approx(0.5)
    # r2: N = 30, 52 events. top 5%: 1.5 rubrics = y00 (10) + half of y01 (6/2 = 3) = 13 -> 13/52 = 0.25
    #                        top 20%: 6 rubrics = 10 + 6 + 3*4 = 28 -> 28/52 = 0.5384615...
    assert rows[("r2", 0.05)]["rubrics_covered"] == pytest.approx(1.5)
    assert rows[("r2", 0.05)]["share"] == pytest.approx(0.25)
    assert rows[("r2", 0.2)]["share"] == pytest.approx(28 / 52)


def test_rubric_history(home):
    rows = {(r["rubric_id"], r["step"]): r for r in q("select * from rubric_history where run_id = 'r1'", home)}
    c1 = rows[("c1", 1)]
    # c1 step 1: 4 groups, variances 0, .125, .125, .03125 -> mean .28125/4 = .0703125, min 0; kept g1, g2
    # cumulative stats after its last activation of the step (group 3): n_r 1, rho_r 0.4
    assert (c1["n_groups"], c1["n_kept"]) == (4, 2)
    assert c1["mean_variance"] == pytest.approx(0.0703125) and c1["min_variance"] == 0.0
    assert (c1["n_r"], c1["rho_r"]) == (1, 0.4)
    c2 = rows[("c2", 1)]
    # c2 step 1: scores x on g1 and g2 = [1,.5,.5,0, 1,.5,.5,0]; F1 y = [0,0,0,0, 1,.5,0,0]
    # mean x = .5, mean y = 1.5/8 = .1875; sum dx*dy = .5*(-.1875) - .5*(-.1875) + .5*.8125 - .5*(-.1875) = .5
    # sum dx^2 = 4 * .25 = 1; sum dy^2 = 6 * .1875^2 + .8125^2 + .3125^2 = .2109375 + .66015625 + .09765625 = .96875
    # Pearson = .5 / sqrt(1 * .96875) = 0.508000...
    assert c2["step_pearson"] == pytest.approx(0.5 / 0.96875**0.5)
    assert c2["mean_variance"] == pytest.approx(0.125) and (c2["n_r"], c2["rho_r"]) == (0, 0.6)
    # c3 step 2 scored g1 whose F1 is constant (all 0): correlation undefined -> null
    assert rows[("c3", 2)]["step_pearson"] is None and rows[("c3", 2)]["n_r"] == 6
    assert rows[("c1", 2)]["rho_r"] == 0.45


def test_rubrics_status_from_events(home):
    rows = {r["rubric_id"]: r for r in q("select * from rubrics where run_id = 'r1'", home)}
    assert {k: v["status"] for k, v in rows.items()} == {
        "d1": "consolidated", "d2": "rejected", "d3": "consolidated", "d4": "candidate",
        "c1": "in_pool", "c2": "in_pool", "c3": "retired", "c4": "in_pool", "c5": "duplicate"}
    assert rows["d2"]["status_reason"] == "pearson < rho_min" and rows["c3"]["status_reason"] == "n_r > kappa"
    assert (rows["d1"]["origin"], rows["d1"]["kind"], rows["d1"]["title"]) == ("induced", "draft", "D1")
    assert (rows["c1"]["origin"], rows["c1"]["n_activations"], rows["c1"]["last_event_step"]) == ("consolidated", 5, 2)
    assert rows["c4"]["n_activations"] == 0 and rows["c3"]["n_r"] == 6


def test_rubric_lineage(home):
    rows = q("select * from rubric_lineage order by draft_rubric_id", home)
    assert [(r["common_rubric_id"], r["common_title"], r["draft_rubric_id"], r["draft_title"], r["question_id"])
            for r in rows] == [("c1", "C1", "d1", "D1", "q02"), ("c1", "C1", "d3", "D3", "q03")]
    assert rows[0]["draft_description"] == "targets entity attributes"


def test_judge_cost_per_step(home):
    rows = {(r["step"], r["role"]): r for r in q("select * from judge_cost_per_step where run_id = 'r1'", home)}
    # step 1: pairwise .01 + .02 + 0 = .03 (3 calls, 1 cache hit, 1 error); induction .05; all = .08 over 4 calls
    a = rows[(1, "all")]
    assert (a["n_calls"], a["n_cache_hits"], a["n_errors"]) == (4, 1, 1)
    assert a["cost_usd"] == pytest.approx(0.08) and a["prompt_tokens"] == 1300 and a["completion_tokens"] == 310
    assert a["mean_latency_s"] == pytest.approx(3.0)  # (1 + 3 + 0 + 8) / 4
    assert rows[(1, "pairwise")]["cost_usd"] == pytest.approx(0.03) and rows[(1, "induction")]["n_calls"] == 1
    assert rows[(2, "all")]["cost_usd"] == pytest.approx(0.01) and rows[(2, "all")]["prompt_tokens"] == 0


def test_run_status(home):
    rows = {r["run_id"]: r for r in q("select * from run_status", home)}
    assert {k: v["status"] for k, v in rows.items()} == {
        "r1": "completed", "r2": "failed", "r3": "running", "r4": "created"}
    assert rows["r1"]["last_completed_step"] == 2 and rows["r3"]["last_completed_step"] is None
    assert rows["r1"]["profile"] == "tiny-cpu" and rows["r1"]["method"] == "arbor"


def test_eval_summary(tmp_path):
    # 4 answers on split 'hotpotqa': (valid, em, f1, judge) = (T,1,1,T), (T,0,.5,T), (T,0,0,F), (F,0,0,None)
    # strict: em (1+0+0+0)/4 = .25, f1 (1+.5+0+0)/4 = .375, judge (1+1+0+0)/4 = .5, valid_rate 3/4
    # valid-only: em 1/3, f1 1.5/3 = .5, judge 2/3
    rows = [dict(question_id=f"q{i}", split="hotpotqa", checkpoint="ckpt-10", run_index=0, format_valid=v, em=em,
                 f1=f1, judge_correct=j, judge_model="m")
            for i, (v, em, f1, j) in enumerate([(True, 1.0, 1.0, True), (True, 0.0, 0.5, True),
                                               (True, 0.0, 0.0, False), (False, 0.0, 0.0, None)])]
    write_stage("eval_results", rows, run_id="e", step=10, stage="eval", home=tmp_path)
    (r,) = q("select * from eval_summary", tmp_path)
    assert (r["n_answers"], r["n_questions"], r["valid_rate"]) == (4, 4, 0.75)
    assert (r["strict_em"], r["strict_f1"], r["strict_judge_acc"]) == (0.25, 0.375, 0.5)
    assert r["valid_em"] == pytest.approx(1 / 3) and r["valid_f1"] == pytest.approx(0.5)
    assert r["valid_judge_acc"] == pytest.approx(2 / 3)


def test_search_behaviour(tmp_path):
    """Searches and repeated queries per step, overall and on all-correct groups (hand figures below)."""
    rows = [  # (group, valid, f1, queries)
        (0, True, 1.0, ["Tobara", "tobara "]),          # all-correct group; repeated (case and spaces folded)
        (0, True, 1.0, ["Tobara", "Melin  Gab"]),        # all-correct group; not repeated
        (1, True, 1.0, ["Kar"]),                         # mixed group (F1 1 and 0)
        (1, True, 0.0, ["Kar", "Kar", "Kar"]),           # repeated
        (2, False, 1.0, []),                             # F1 1 but format-invalid: group 2 is not all-correct
        (2, True, 1.0, ["Sal"]),
    ]
    write_stage("trajectories", [
        dict(traj_id=f"t{i}", group=g, sample=i, format_valid=v, f1=f, search_queries=qs, search_calls=len(qs))
        for i, (g, v, f, qs) in enumerate(rows)], run_id="s", step=1, stage="rollout", home=tmp_path)
    (r,) = q("select * from search_behaviour where run_id = 's'", tmp_path)
    assert r["n_trajectories"] == 6
    assert r["mean_searches"] == pytest.approx((2 + 2 + 1 + 3 + 0 + 1) / 6)
    assert r["repeated_query_share"] == pytest.approx(2 / 6)
    assert r["n_all_correct"] == 2  # group 0 only
    assert r["mean_searches_all_correct"] == pytest.approx(2.0)
    assert r["repeated_query_share_all_correct"] == pytest.approx(0.5)


def test_zero_variance_sql_and_python_agree(tmp_path):
    """One definition of a zero-variance group (max - min <= 1e-9): the SQL view, Table 2's ``classify_group`` and
    DAPO's filter count the same groups, including spreads just inside and just outside the tolerance (a group
    whose values all lie within 1e-9 of the first but spread 1.6e-9 is not zero-variance anywhere)."""
    from arbor.group_stats import classify_group
    from arbor.tasks.training.losses import zero_variance_groups

    spreads = [[0.0, 0.0, 0.0], [0.5, 0.5 + 0.9e-9, 0.5], [0.5, 0.5 + 0.8e-9, 0.5 - 0.8e-9],
               [0.0, 2e-9, 0.0], [1.0, 0.0, 0.0], [-1.0, -1.0, -1.0]]
    rows = [dict(traj_id=f"zv/1/{g}/{s}", group=g, sample=s, question_id=f"q{g}", question="?", text="...",
                 format_valid=True, em=0.0, f1=0.5, base_reward=r, shaped_reward=r)
            for g, rs in enumerate(spreads) for s, r in enumerate(rs)]
    write_stage("trajectories", rows, run_id="zv", step=1, stage="shape", home=tmp_path)
    sql = q("select n_groups, base_total from zero_variance_groups where run_id = 'zv' and level = 'step'", tmp_path)
    by_sql = round(sql[0]["n_groups"] * sql[0]["base_total"])
    by_table2 = sum(classify_group(rs, [0.5] * 3, [True] * 3).zero_variance for rs in spreads)
    by_dapo = len(zero_variance_groups([r for rs in spreads for r in rs], [g for g, rs in enumerate(spreads) for _ in rs]))
    assert by_sql == by_table2 == by_dapo == 3  # groups 0, 1 and 5


def test_judge_attempts_by_role_counts_each_attempt(tmp_path):
    """sql/queries/judge_attempts_by_role.sql on hand-written ledger rows (the ledger shows attempts)."""
    from arbor.storage.sql import run_file

    rows = [  # pairwise: fixed at the 2nd attempt; cut off twice then fixed; cache hit (not sent); failed for good
        dict(role="pairwise", attempts=2, error=None, attempt_errors=["InvalidOutput", None]),
        dict(role="pairwise", attempts=3, error=None, attempt_errors=["Truncated", "Truncated", None]),
        dict(role="pairwise", attempts=0, error=None, cache_hit=True, attempt_errors=[]),
        dict(role="pairwise", attempts=3, error="InvalidOutput",
             attempt_errors=["InvalidOutput", "RateLimitError", "InvalidOutput"]),
        dict(role="accuracy", attempts=1, error=None, attempt_errors=[None]),
        dict(role="induction", attempts=2, error=None, attempt_errors=["InvalidAnswer", None]),
        # an attempt refused by the answer filter carries its reason
        dict(role="rar_rubrics", attempts=5, error="InvalidAnswer",
             attempt_errors=["InvalidAnswer:placeholder_words", "InvalidAnswer:echo", "InvalidOutput",
                             "InvalidAnswer:placeholder_words", "InvalidAnswer:echo"]),
        dict(role="rar_rubrics", attempts=2, error=None, attempt_errors=["InvalidAnswer:placeholder_words", None]),
    ]
    write_stage("judge_calls", [{**r, "cache_hit": r.get("cache_hit", False)} for r in rows], run_id="ra", step=1,
                stage="score", home=tmp_path)
    got = {r["role"]: r for r in run_file("judge_attempts_by_role", {"run_id": "ra"}, home=tmp_path)}
    p = got["pairwise"]
    assert (p["calls"], p["valid"], p["first_attempt_valid"]) == (3, 2, 0)
    assert p["valid_rate"] == pytest.approx(2 / 3) and p["mean_attempts"] == pytest.approx(8 / 3)
    assert (p["invalid_attempts"], p["truncated_attempts"], p["other_failed_attempts"]) == (3, 2, 1)
    i = got["induction"]  # a reply that validated but echoed the prompt's placeholders is an invalid attempt
    assert (i["invalid_attempts"], i["other_failed_attempts"], i["valid"]) == (1, 0, 1)
    a = got["accuracy"]
    assert (a["calls"], a["valid"], a["first_attempt_valid"], a["mean_attempts"]) == (1, 1, 1, 1.0)
    r = got["rar_rubrics"]  # 6 refused attempts: placeholder_words 3, echo 2, unparseable 1
    assert (r["invalid_attempts"], r["other_failed_attempts"]) == (6, 0)
    assert r["top_reasons"] == "placeholder_words 3, echo 2, unparseable 1"
    assert p["top_reasons"] == "unparseable 3, truncated 2" and a["top_reasons"] is None
