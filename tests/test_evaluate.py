"""Evaluation maths (paper §4.1, App. C.1, C.2) on a fixed set of predictions with hand-computed figures, and the
accuracy judge (App. E.4) through the local OpenAI-compatible test server (real HTTP on 127.0.0.1)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from arbor.config.judge import JudgeConfig
from arbor.llm import make_judge
from arbor.tasks.reporting.evaluate import (
    EvalError,
    Prediction,
    eval_rows,
    format_table1,
    format_table5,
    format_table6,
    judge_predictions,
    load_eval_results,
    pass_at_1,
    prediction_from_trajectory,
    store_eval_results,
    summarize,
)
from arbor.types import Trajectory
from tests.openai_server import FaultPlan, OpenAIServer


def ans(x: str) -> str:
    return f"<think>reasoning</think><answer>The answer is \\boxed{{{x}}}</answer>"


GOLDS = {"q1": ("Paris",), "q2": ("George Washington",), "q3": ("1984",), "q4": ("blue whale", "Balaenoptera")}
QUESTIONS = {"q1": "Capital of France?", "q2": "First US president?", "q3": "Orwell's novel year?",
             "q4": "Largest animal?"}


def P(split: str, qid: str, r: int, text: str, truncated: bool = False) -> Prediction:
    return Prediction(split, qid, r, QUESTIONS[qid], GOLDS[qid], text, truncated)


# bamboogle: 2 questions x 2 runs; hotpotqa: run 0 answered q3 only, run 1 answered q3 and q4 (unequal runs, so
# pass@1 averaged over runs (0.75) differs from a pooled mean over rows (2/3)).
PREDS = [
    P("bamboogle", "q1", 0, ans("Paris")),                  # valid, EM 1, F1 1
    P("bamboogle", "q2", 0, ans("Washington")),             # valid, EM 0, F1 2/3 (p = 1/1, r = 1/2)
    P("bamboogle", "q1", 1, "The answer is Paris"),          # invalid (no answer block): all metrics 0
    P("bamboogle", "q2", 1, ans("George Washington")),      # valid, EM 1, F1 1
    P("hotpotqa", "q3", 0, ans("1984")),                    # valid, EM 1, F1 1
    P("hotpotqa", "q3", 1, ans("1985")),                    # valid, EM 0, F1 0
    P("hotpotqa", "q4", 1, ans("The blue whale")),          # valid, EM 1 (article dropped), F1 1
]
# Judge verdicts (hand-chosen): Washington judged correct; q3 run 1 a failed judge call (None).
VERDICTS = [True, True, True, True, True, None, True]


def rows_fixed(judge_model: str | None = "judge-a") -> list[dict]:
    return eval_rows(PREDS, run_id="r1", step=10, checkpoint="ckpt-10",
                     verdicts=VERDICTS if judge_model else None, judge_model=judge_model)


def test_rows_apply_the_strict_gate() -> None:
    rows = rows_fixed()
    assert [r["format_valid"] for r in rows] == [True, True, False, True, True, True, True]
    assert [r["em"] for r in rows] == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert rows[1]["f1"] == pytest.approx(2 / 3)
    # invalid response: judge_correct forced to False even though the verdict list said True (C.1)
    assert rows[2]["judge_correct"] is False and rows[2]["answer"] is None
    assert rows[5]["judge_correct"] is None  # a failed call is recorded as such
    # a truncated response is invalid even with a well-formed answer block
    trunc = eval_rows([P("bamboogle", "q1", 0, ans("Paris"), truncated=True)], run_id="r", step=0, checkpoint=None)
    assert trunc[0]["format_valid"] is False and trunc[0]["em"] == 0.0
    t = Trajectory(run_id="e", step=0, group=0, sample=0, question_id="q1", question="?", golds=["Paris"],
                   text=ans("Paris"), finish_reason="max_turns")
    p = prediction_from_trajectory(t, "bamboogle", 2)
    assert (p.question_id, p.run_index, p.golds, p.truncated) == ("q1", 2, ("Paris",), True)


def test_pass_at_1_is_a_mean_over_runs_not_over_rows() -> None:
    hot = [r for r in rows_fixed() if r["split"] == "hotpotqa"]
    # run 0: EM [1] -> 1; run 1: EM [0, 1] -> 0.5; pass@1 = (1 + 0.5) / 2 = 0.75 (a pooled mean would be 2/3)
    assert pass_at_1(hot, "em") == pytest.approx(0.75)
    # judge: run 0 [True] -> 1; run 1 [None (failed = wrong), True] -> 0.5; = 0.75
    assert pass_at_1(hot, "judge_correct") == pytest.approx(0.75)
    assert pass_at_1([], "em") is None


def test_summary_matches_hand_computation() -> None:
    s = summarize(rows_fixed(), splits=["bamboogle", "hotpotqa"])
    b, h, avg = s.splits["bamboogle"], s.splits["hotpotqa"], s.average
    # bamboogle per run:  run 0: EM (1+0)/2 = 0.5, F1 (1 + 2/3)/2 = 5/6, Acc 1, valid 1
    #                     run 1: EM (0+1)/2 = 0.5, F1 (0 + 1)/2 = 1/2, Acc (0+1)/2 = 0.5, valid 0.5
    assert b.em == pytest.approx(0.5)
    assert b.f1 == pytest.approx((5 / 6 + 1 / 2) / 2)  # 2/3
    assert b.acc == pytest.approx(0.75)
    assert b.valid_rate == pytest.approx(0.75)
    # valid-only: run 0 over q1, q2: EM 0.5, F1 5/6, Acc 1; run 1 over q2 only: EM 1, F1 1, Acc 1
    assert b.valid_em == pytest.approx(0.75)
    assert b.valid_f1 == pytest.approx((5 / 6 + 1) / 2)  # 11/12
    assert b.valid_acc == pytest.approx(1.0)
    assert b.recovery == pytest.approx(0.25)  # 1.0 - 0.75
    assert (b.n_questions, b.n_runs) == (2, 2)
    # hotpotqa: EM 0.75 (above), F1 run 0: 1, run 1: (0 + 1)/2 -> 0.75; every response valid -> recovery 0
    assert (h.em, h.f1, h.acc, h.valid_rate, h.valid_acc) == pytest.approx((0.75, 0.75, 0.75, 1.0, 0.75))
    assert h.recovery == pytest.approx(0.0)
    assert h.n_judge_failed == 1
    # Avg. = unweighted mean over the two benchmarks
    assert avg.em == pytest.approx((0.5 + 0.75) / 2)            # 0.625
    assert avg.f1 == pytest.approx((2 / 3 + 0.75) / 2)          # 17/24
    assert avg.acc == pytest.approx(0.75)
    assert avg.valid_rate == pytest.approx((0.75 + 1.0) / 2)    # 0.875
    assert avg.valid_acc == pytest.approx((1.0 + 0.75) / 2)     # 0.875
    assert avg.recovery == pytest.approx(0.125)


def test_second_judge_and_table6() -> None:
    # judge-b (the independent judge) rejects "Washington" for q2 run 0: bamboogle run 0 Acc 0.5, run 1 0.5 -> 0.5
    second = eval_rows(PREDS, run_id="r1", step=10, checkpoint="ckpt-10",
                       verdicts=[True, False, True, True, True, None, True], judge_model="judge-b")
    rows = rows_fixed() + second
    with pytest.raises(EvalError, match="several judge models"):
        summarize(rows)
    s = summarize(rows, judge_model="judge-a", second_judge_model="judge-b")
    assert s.splits["bamboogle"].acc == pytest.approx(0.75)
    assert s.splits["bamboogle"].acc_second == pytest.approx(0.5)
    assert s.average.acc_second == pytest.approx((0.5 + 0.75) / 2)
    assert s.average.em == pytest.approx(0.625)  # EM read from the main judge's rows only, not doubled
    # the main judge is inferred as the one that is not the second judge
    assert summarize(rows, second_judge_model="judge-b").judge_model == "judge-a"
    # unjudged main rows + a second judge: EM from the unjudged rows only, no main accuracy
    only_second = summarize(rows_fixed(judge_model=None) + second, second_judge_model="judge-b")
    assert only_second.average.em == pytest.approx(0.625) and only_second.average.acc is None
    assert only_second.splits["bamboogle"].acc_second == pytest.approx(0.5)
    base = summarize(rows_fixed(), judge_model="judge-a")
    table = format_table6({"grpo": summarize(rows, judge_model="judge-a", second_judge_model="judge-b"), "arbor": s})
    # delta = 62.5 - 75.0 = -12.5; gains over itself (grpo row) are 0
    assert "-12.5" in table and "+0.0" in table
    assert base.second_judge_model is None


def test_printers_use_the_paper_layout() -> None:
    s = summarize(rows_fixed(), splits=["bamboogle", "hotpotqa"])
    t1 = format_table1({"ARBOR": s})
    header, sub, _rule, row = t1.splitlines()
    assert header.split() == ["Method", "Bamboogle", "HotpotQA", "Avg."]
    assert sub.split() == ["EM", "F1", "Acc."] * 3
    # 50.0 66.7 75.0 | 75.0 75.0 75.0 | 62.5 70.8 75.0
    assert row.split() == ["ARBOR", "50.0", "66.7", "75.0", "75.0", "75.0", "75.0", "62.5", "70.8", "75.0"]
    t5 = format_table5({"TIR": s}).splitlines()[-1].split()
    assert t5 == ["TIR", "87.5", "75.0", "87.5", "+12.5"]


def test_bad_rows_are_refused() -> None:
    with pytest.raises(EvalError, match="row 0: missing column"):
        summarize([{"split": "x"}])
    with pytest.raises(EvalError, match="no eval rows for split"):
        summarize(rows_fixed(), splits=["bamboogle", "musique"])
    with pytest.raises(EvalError, match="verdicts for"):
        eval_rows(PREDS, run_id="r", step=0, checkpoint=None, verdicts=[True])


def test_eval_results_round_trip_through_the_sql_view(arbor_home: Path) -> None:
    store_eval_results(rows_fixed(), run_id="r1", step=10, home=arbor_home)
    back = load_eval_results("r1", home=arbor_home)
    assert len(back) == len(PREDS)
    s = summarize(back, splits=["bamboogle", "hotpotqa"])
    assert s.average.em == pytest.approx(0.625) and s.average.acc == pytest.approx(0.75)


def test_accuracy_judge_over_the_local_openai_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARBOR_TEST_KEY", "sk-test")
    # The first request gets an unparseable verdict; with no retries that call fails (value None).
    with OpenAIServer(FaultPlan(queue=["invalid"]), api_key="sk-test") as srv:
        cfg = JudgeConfig(backend="openai", base_url=srv.base_url, api_key_env="ARBOR_TEST_KEY", model="judge-x",
                          max_retries=0, cache=False)
        judge = make_judge(cfg, home=tmp_path)

        async def go() -> list[dict]:
            try:
                return await judge_predictions(judge, PREDS, run_id="r1", step=3, checkpoint="c", concurrency=1)
            finally:
                await judge.aclose()

        rows = asyncio.run(go())
    # 6 valid responses were sent; the invalid one (bamboogle q1 run 1) never was (strict gate).
    assert srv.roles["accuracy"] == 6
    calls = judge.drain_calls()
    assert len(calls) == 6 and all(c["run_id"] == "r1" and c["step"] == 3 and c["stage"] == "eval" for c in calls)
    # The server judges by normalised string match: "Washington" != "george washington" -> Incorrect;
    # the first valid response (q1 run 0) drew the fault -> None.
    assert [r["judge_correct"] for r in rows] == [None, False, False, True, True, False, True]
    assert {r["judge_model"] for r in rows} == {"judge-x"}
    s = summarize(rows, splits=["bamboogle", "hotpotqa"])
    # bamboogle: run 0 [None, False] -> 0; run 1 [False (invalid), True] -> 0.5; Acc = 0.25
    # hotpotqa:  run 0 [True] -> 1; run 1 [False, True] -> 0.5; Acc = 0.75.  Avg = 0.5
    assert s.splits["bamboogle"].acc == pytest.approx(0.25)
    assert s.splits["hotpotqa"].acc == pytest.approx(0.75)
    assert s.average.acc == pytest.approx(0.5)
    assert s.average.n_judge_failed == 1
