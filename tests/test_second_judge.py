"""The second judge of App. C.2 / Table 6: ``eval.second_judge_model`` re-judges the same answers with another model
on the same OpenAI-compatible endpoint (the local test server, real HTTP), rows and ledger kept apart by model."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arbor.cli import app
from arbor.config.judge import JudgeConfig
from arbor.flows.evaluate import run_eval
from arbor.llm import make_judge
from arbor.storage.sql import query
from arbor.tasks.env.datasets import load_questions
from arbor.tasks.reporting.evaluate import (
    EvalError,
    Prediction,
    format_judges,
    judge_predictions,
    load_eval_results,
    second_judge_config,
    summarize,
)
from tests.flow_support import JUDGE_KEY, JUDGE_KEY_ENV, openai_judge
from tests.openai_server import FaultPlan, OpenAIServer, _norm

MAIN, SECOND = "test-judge", "judge-b"  # judge-b answers the opposite of the main judge on every valid answer
PLAN = {SECOND: "inverse"}


def ans(x: str) -> str:
    return f"<think>reasoning</think><answer>The answer is \\boxed{{{x}}}</answer>"


GOLDS = {"q1": ("Paris",), "q2": ("George Washington",), "q3": ("1984",), "q4": ("blue whale", "Balaenoptera")}
PREDS = [
    Prediction("bamboogle", "q1", 0, "Capital of France?", GOLDS["q1"], ans("Paris")),
    Prediction("bamboogle", "q2", 0, "First US president?", GOLDS["q2"], ans("Washington")),
    Prediction("bamboogle", "q1", 1, "Capital of France?", GOLDS["q1"], "The answer is Paris"),  # invalid format
    Prediction("bamboogle", "q2", 1, "First US president?", GOLDS["q2"], ans("George Washington")),
    Prediction("hotpotqa", "q3", 0, "Orwell's novel year?", GOLDS["q3"], ans("1984")),
    Prediction("hotpotqa", "q3", 1, "Orwell's novel year?", GOLDS["q3"], ans("1985")),
    Prediction("hotpotqa", "q4", 1, "Largest animal?", GOLDS["q4"], ans("The blue whale")),
]


def test_second_judge_on_fixed_answers_matches_hand_computation(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(JUDGE_KEY_ENV, JUDGE_KEY)
    with OpenAIServer(FaultPlan(accuracy_by_model=PLAN), api_key=JUDGE_KEY) as srv:
        cfg = JudgeConfig.model_validate({k.removeprefix("judge."): v for k, v in openai_judge(srv.base_url).items()})
        judges = [make_judge(cfg, home=tmp_path), make_judge(second_judge_config(cfg, SECOND), home=tmp_path)]

        async def go() -> list[dict]:
            try:
                return [row for j in judges
                        for row in await judge_predictions(j, PREDS, run_id="r", step=0, checkpoint="c")]
            finally:
                for j in judges:
                    await j.aclose()

        rows = asyncio.run(go())
    # same endpoint and key, only the model name differs: 6 valid answers each (the invalid one is never sent)
    assert sorted(b["model"] for b in srv.bodies) == [SECOND] * 6 + [MAIN] * 6
    assert [c["model"] for c in judges[1].drain_calls()] == [SECOND] * 6
    s = summarize(rows, splits=["bamboogle", "hotpotqa"], judge_model=MAIN, second_judge_model=SECOND)
    # main (string match): bamboogle run 0 [T, F] .5, run 1 [F (invalid), T] .5 -> .5; hotpotqa 1, [F, T] .5 -> .75
    # judge-b (inverse):   bamboogle run 0 [F, T] .5, run 1 [F (invalid), F] 0 -> .25; hotpotqa 0, [T, F] .5 -> .25
    b, h, avg = s.splits["bamboogle"], s.splits["hotpotqa"], s.average
    assert (b.acc, b.acc_second, h.acc, h.acc_second) == pytest.approx((0.5, 0.25, 0.75, 0.25))
    assert (avg.acc, avg.acc_second) == pytest.approx((0.625, 0.25))
    table = format_judges(s).splitlines()
    assert table[0].split() == ["Benchmark", MAIN, SECOND, "Delta"]
    assert [r.split() for r in table[2:]] == [["Bamboogle", "50.0", "25.0", "-25.0"],
                                              ["HotpotQA", "75.0", "25.0", "-50.0"],
                                              ["Avg.", "62.5", "25.0", "-37.5"]]


def test_second_judge_config_swaps_only_the_accuracy_model() -> None:
    cfg = JudgeConfig(backend="openai", base_url="http://127.0.0.1:9/v1", model="main-m")
    second = second_judge_config(cfg, "other-m")
    assert second.for_role("accuracy") == {**cfg.for_role("accuracy"), "model": "other-m"}
    assert cfg.for_role("accuracy")["model"] == "main-m"  # the main config is not touched
    with pytest.raises(EvalError, match="main judge's own model"):
        second_judge_config(cfg, "main-m")
    with pytest.raises(EvalError, match=r"eval\.second_judge_model='x' needs an LLM judge"):
        second_judge_config(JudgeConfig(backend="rules"), "x")


def test_rules_judge_refuses_a_second_judge_up_front(arbor_home: Path) -> None:
    o = {"eval.second_judge_model": SECOND}
    with pytest.raises(EvalError, match=r"eval\.second_judge_model"):
        run_eval(None, "tiny-cpu", o, splits=["bench:local"], runs=1, limit=1, run_id="refused")
    assert not list(arbor_home.rglob("*.parquet"))  # refused before the run was registered or a rollout ran
    res = CliRunner().invoke(app, ["eval", "--set", f"eval.second_judge_model={SECOND}"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: eval.second_judge_model=") and "rules" in lines[0]


SPLITS = ["offline:train", "bench:local"]


@pytest.mark.slow  # an eval flow from the SFT start (make test-fast would otherwise build that start: ~4 min)
def test_eval_flow_rejudges_the_same_answers_with_the_second_model(sft_policy: Path, arbor_home: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(JUDGE_KEY_ENV, JUDGE_KEY)
    limit, runs = 3, 2
    with OpenAIServer(FaultPlan(accuracy_by_model=PLAN), api_key=JUDGE_KEY) as srv:
        o = {**openai_judge(srv.base_url), "eval.second_judge_model": SECOND}
        rid, table = run_eval(str(sft_policy), "tiny-cpu", o, splits=SPLITS, runs=runs, limit=limit, run_id="ev2")
    rows = load_eval_results(rid, home=arbor_home)
    assert len(rows) == 2 * len(SPLITS) * limit * runs
    by_judge: dict[str, dict[tuple, dict]] = defaultdict(dict)
    for r in rows:
        by_judge[r["judge_model"]][(r["split"], r["question_id"], r["run_index"])] = r
    assert set(by_judge) == {MAIN, SECOND}
    main, second = by_judge[MAIN], by_judge[SECOND]
    assert main.keys() == second.keys()
    same = ("checkpoint", "answer", "format_valid", "em", "f1")
    assert all({c: main[k][c] for c in same} == {c: second[k][c] for c in same} for k in main)  # the same answers
    golds = {q.question_id: q.golds for s in SPLITS for q in load_questions(s)[:limit]}
    n_valid = sum(r["format_valid"] for r in main.values())
    assert n_valid > 0, "the SFT'd tiny policy gave no well-formed answer: nothing was judged"

    # hand computation: the main judge says Correct iff the normalised answer is a normalised gold, judge-b the
    # opposite; invalid answers are 0 under both (strict gate); pass@1 = mean over runs of the per-run mean
    def verdict(r: dict, judge: str) -> bool:
        hit = _norm(r["answer"] or "") in {_norm(g) for g in golds[r["question_id"]]}
        return r["format_valid"] and (hit if judge == MAIN else not hit)

    expected: dict[str, dict[str, float]] = {MAIN: {}, SECOND: {}}
    for judge, rs in by_judge.items():
        for r in rs.values():
            assert r["judge_correct"] is verdict(r, judge)
        for split in SPLITS:
            per_run = [[verdict(r, judge) for (s, _q, i), r in rs.items() if s == split and i == run]
                       for run in range(runs)]
            expected[judge][split] = sum(sum(v) / len(v) for v in per_run) / runs
        expected[judge]["Avg."] = sum(expected[judge][s] for s in SPLITS) / len(SPLITS)
    assert expected[MAIN]["Avg."] != expected[SECOND]["Avg."]

    s = summarize(rows, splits=SPLITS, judge_model=MAIN, second_judge_model=SECOND)
    for split, m in [*s.splits.items(), ("Avg.", s.average)]:
        assert m.acc == pytest.approx(expected[MAIN][split]) and m.acc_second == pytest.approx(expected[SECOND][split])
    # the printed Table 6 columns: per split and Avg., judge 1, judge 2, delta
    lines = table.splitlines()
    head = lines.index(next(ln for ln in lines if ln.split()[:1] == ["Benchmark"]))
    assert lines[head].split() == ["Benchmark", MAIN, SECOND, "Delta"]
    for line, split in zip(lines[head + 2:], [*SPLITS, "Avg."], strict=True):
        a, b = expected[MAIN][split], expected[SECOND][split]
        assert line.split() == [split, f"{100 * a:.1f}", f"{100 * b:.1f}", f"{100 * (b - a):+.1f}"]

    # the ledger: each judge's calls under its own model (and stage), one per valid answer, through the SQL views
    ledger = query(f"select model, stage, count(*) as n from judge_calls where run_id = '{rid}' "
                   "group by model, stage order by model", home=arbor_home).to_pylist()
    assert ledger == [{"model": SECOND, "stage": "eval-second", "n": n_valid},
                      {"model": MAIN, "stage": "eval", "n": n_valid}]
    stored = query(f"select judge_model, count(*) as n from eval_results where run_id = '{rid}' "
                   "group by judge_model order by judge_model", home=arbor_home).to_pylist()
    assert stored == [{"judge_model": SECOND, "n": len(main)}, {"judge_model": MAIN, "n": len(main)}]
    # the same endpoint served both models: one request per call that missed the response cache
    sent = query(f"select model, count(*) as n from judge_calls where run_id = '{rid}' and not cache_hit "
                 "group by model order by model", home=arbor_home).to_pylist()
    assert sent == [{"model": m, "n": sum(b["model"] == m for b in srv.bodies)} for m in (SECOND, MAIN)]
