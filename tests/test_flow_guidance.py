"""Co-ReAct end to end, offline and through the local OpenAI-compatible server.

``arbor-guidance-train`` with the rules judges: branching points with slates, list-wise ranks and their Borda
consensus, the warm start, GRPO updates whose rewards are eq. 1-3 of the stored scores; a SIGKILL in the middle
of update 2's training resumes to the very same samples, judge calls and generator weights. Guided evaluation with
the trained generator, verified by the OpenAI-compatible judge with faults injected, stores guided and unguided
answers to the same questions and every guided turn.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flow_support import JUDGE_KEY, JUDGE_KEY_ENV, openai_judge, table
from openai_server import FaultPlan, OpenAIServer

from arbor.tasks.methods.coreact.equations import consensus_ranks, parse_rubric, rubric_reward

pytestmark = pytest.mark.slow

RUN = "gen"


def _overrides(start: Path, **extra: object) -> dict:
    return {"run.sft_warm_start": False, "run.start_checkpoint": str(start), "guidance.branch_questions": 4,
            "guidance.branch_temperatures": [0.7, 1.0], "guidance.branch_samples": 2, "guidance.slate_k": 3,
            "guidance.group_size": 4, "guidance.batch_points": 3, "guidance.epochs": 1, "guidance.warm_epochs": 30,
            "guidance.max_rubric_tokens": 64, "guidance.lr": 1e-4, "checkpoint.every": 1, "checkpoint.keep_last": 3,
            **extra}


def _train(home: Path, overrides: dict) -> tuple[str, Path, dict]:
    from arbor.flows.guidance import run_guidance_train

    os.environ["ARBOR_HOME"] = str(home)
    return run_guidance_train("tiny-cpu", overrides, None, RUN)


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(next(path.glob("*.safetensors"))))


@pytest.fixture(scope="module")
def reference(sft_policy: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    home = tmp_path_factory.mktemp("gen_ref")
    _, path, summary = _train(home, _overrides(sft_policy))
    assert path == home / "guidance" / RUN / "generator"
    return home, summary


def test_generator_training_stores_points_consensus_and_rewards(reference: tuple[Path, dict]) -> None:
    home, summary = reference
    points = [p for p in table("branch_points", RUN, home) if p["kept"] is not None]  # the rank stage's rows
    assert points and summary["kept"] == len([p for p in points if p["kept"]]) >= 3
    for p in points:
        assert len(p["candidates"]) == 3 and len(set(p["candidates"])) == 3  # slate_k distinct actions
        by_judge = json.loads(p["judge_ranks"])
        assert sorted(by_judge) == ["rules-1", "rules-2", "rules-3"]  # the paper's J = 3, offline
        ranks = [v for v in by_judge.values() if v is not None]
        assert p["n_rankings"] == len(ranks) == 3 and p["kept"]  # at least min_rankings = 2 valid
        assert p["consensus"] == consensus_ranks(ranks)
    samples = table("generator_samples", RUN, home)
    assert summary["updates"] == max(s["step"] for s in samples) == -(-summary["kept"] // 3)
    consensus = {p["point_id"]: p["consensus"] for p in points}
    for s in samples:  # the stored reward is eq. 1-3 of the stored scores
        parts = rubric_reward(parse_rubric(s["rubric"]), s["rubric"], s["candidate_scores"], consensus[s["point_id"]])
        assert s["reward"] == pytest.approx(parts["reward"]) and s["r_rank"] == pytest.approx(parts["r_rank"])
        assert len(s["response_ids"]) == len(s["rollout_logprobs"]) > 0
    assert sum(s["n_items"] > 0 for s in samples) > len(samples) / 2  # the warm start taught the format
    steps = sorted(table("steps", RUN, home), key=lambda r: r["step"])
    assert [r["step"] for r in steps] == list(range(1, summary["updates"] + 1))
    assert [r["policy_version"] for r in steps] == [r["step"] for r in steps]
    calls = table("judge_calls", RUN, home)
    assert {(c["stage"], c["role"]) for c in calls} == {("rank", "rank_actions"), ("warm", "step_rubric"),
                                                        ("sample", "step_verify")}
    n_scored = sum(len(s["candidate_scores"] or []) for s in samples)
    assert sum(c["role"] == "step_verify" for c in calls) == n_scored  # every candidate under every rubric, once
    runs = table("runs", RUN, home)
    assert runs[0]["method"] == "co-react-generator"


def test_resume_after_sigkill_mid_update_replays_without_the_judge(reference: tuple[Path, dict], sft_policy: Path,
                                                                   tmp_path: Path) -> None:
    ref_home, _ = reference
    home = tmp_path / "home"
    o = _overrides(sft_policy)
    code = ("import sys; from arbor.flows.guidance import run_guidance_train; "
            f"run_guidance_train('tiny-cpu', {o!r}, None, {RUN!r})")
    env = {**os.environ, "ARBOR_HOME": str(home), "ARBOR_FAULT": "2:train:kill"}
    log = tmp_path / "killed.log"
    with open(log, "w") as out:
        proc = subprocess.run([sys.executable, "-c", code], env=env, stdout=out, stderr=subprocess.STDOUT,
                              timeout=900)
    assert proc.returncode == -9, log.read_text()[-2000:]
    assert [r["step"] for r in table("steps", RUN, home)] == [1]
    verify_before = sum(c["role"] == "step_verify" for c in table("judge_calls", RUN, home))
    _train(home, o)
    key = lambda r: (r["step"], r["point_id"], r["sample"])  # noqa: E731
    mine = sorted(table("generator_samples", RUN, home), key=key)
    ref = sorted(table("generator_samples", RUN, ref_home), key=key)
    assert [(r["rubric"], r["reward"]) for r in mine] == [(r["rubric"], r["reward"]) for r in ref]
    steps = lambda h: [(r["step"], r["loss"]) for r in sorted(table("steps", RUN, h), key=lambda r: r["step"])]  # noqa: E731
    assert steps(home) == steps(ref_home)
    calls = table("judge_calls", RUN, home)
    assert sum(c["role"] == "step_verify" for c in calls) == sum(
        c["role"] == "step_verify" for c in table("judge_calls", RUN, ref_home))  # update 2's scores were not redone
    assert verify_before == sum(c["role"] == "step_verify" and c["step"] <= 2 for c in calls)
    a, b = _weights(home / "guidance" / RUN / "generator"), _weights(ref_home / "guidance" / RUN / "generator")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_guided_eval_with_the_generator_through_a_faulty_judge(reference: tuple[Path, dict], sft_policy: Path,
                                                               arbor_home: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from arbor.flows.evaluate import run_eval
    from arbor.tasks.reporting.evaluate import load_eval_results

    ref_home, _ = reference
    monkeypatch.setenv(JUDGE_KEY_ENV, JUDGE_KEY)
    # One fault and no retry (judge.max_retries 0): whichever verification arrives first fails for good and every
    # later one scores, so both outcomes are stored whatever the order of concurrent calls and however many there
    # are (at least two). A fixed fault count with retries held only for exactly three first-turn verifications,
    # which depends on the rubrics the generator writes (the changed its training points)
    faults = FaultPlan(by_role={"step_verify": ["invalid"]})
    with OpenAIServer(faults, api_key=JUDGE_KEY) as srv:
        o = {**openai_judge(srv.base_url), "judge.max_retries": 0, "guidance.mode": "co-react",
             "guidance.source": "generator", "guidance.generator": str(ref_home / "guidance" / RUN / "generator"),
             "guidance.max_rubric_tokens": 40}
        rid, printed = run_eval(str(sft_policy), "tiny-cpu", o, splits=["offline:train"], runs=1, limit=3,
                                run_id="guided")
    unguided = load_eval_results(rid, home=arbor_home)
    guided = [r for r in table("eval_results", rid, arbor_home) if r["guidance"] is not None]
    assert {r["guidance"] for r in guided} == {"co-react:generator"}
    assert sorted(r["question_id"] for r in guided) == sorted(r["question_id"] for r in unguided)
    turns = table("guided_steps", rid, arbor_home)
    assert turns and {t["source"] for t in turns} == {"generator"}
    assert {t["question_id"] for t in turns} == {r["question_id"] for r in guided}
    # verifications that failed past the retries are recorded and their actions stand; the others scored
    assert any(t["verify_error"] for t in turns) and any(t["verify_score"] is not None for t in turns)
    for t in turns:
        assert t["retried"] == (t["passed"] is False)  # exactly the failed actions were re-planned
    calls = [c for c in table("judge_calls", rid, arbor_home) if c["role"] == "step_verify"]
    assert calls and {c["stage"] for c in calls} == {"eval-guided"} and JUDGE_KEY not in str(calls)
    assert "co-react:generator" in printed and "guided turns (generator)" in printed
    # guidance's effect: the mean and standard error of the per-question differences of strict F1 (3 questions)
    strict = {(r["question_id"], r["guidance"]): r["f1"] if r["format_valid"] else 0.0 for r in unguided + guided}
    d = [strict[(q, "co-react:generator")] - strict[(q, None)] for q in {r["question_id"] for r in guided}]
    mean = sum(d) / 3
    se = (sum((x - mean) ** 2 for x in d) / 2 / 3) ** 0.5
    assert (f"co-react:generator: guided - unguided strict F1 {100 * mean:+.1f} ± {100 * se:.1f} (paired standard "
            "error over 3 questions)") in printed


def test_generator_training_through_a_faulty_openai_judge(sft_policy: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every role through HTTP with one fault each (retried); a council of three rank judges,
    each answering with a rationale and then its final answer; the server ranks the shown slate in reverse, so
    each judge's stored ranks must undo its own seeded label shuffle exactly."""
    from arbor.tasks.methods.coreact.generator import shuffled_order

    monkeypatch.setenv(JUDGE_KEY_ENV, JUDGE_KEY)
    faults = FaultPlan(by_role={"rank_actions": ["invalid"], "step_rubric": ["malformed"], "step_verify": ["429"]})
    council = [{"model": "test-judge"}, {"model": "judge-b"}, {"name": "judge-c", "model": "judge-c"}]
    with OpenAIServer(faults, api_key=JUDGE_KEY) as srv:
        o = _overrides(sft_policy, **openai_judge(srv.base_url), **{"guidance.branch_questions": 2,
                                                                     "guidance.rank_judges": council})
        _, path, summary = _train(tmp_path / "home", o)
        ranked_by = {b["model"] for b in srv.bodies if "Final answer:" in b["messages"][0]["content"]}
    assert ranked_by == {"test-judge", "judge-b", "judge-c"}  # every judge was asked for a reasoned ranking
    home = tmp_path / "home"
    assert (path / "config.json").exists() and summary["updates"] >= 1
    points = [p for p in table("branch_points", RUN, home) if p["kept"] is not None]
    assert points and all(p["kept"] and p["n_rankings"] == 3 for p in points)
    for p in points:
        for name in ("test-judge", "judge-b", "judge-c"):
            ranks = json.loads(p["judge_ranks"])[name]
            order = shuffled_order(0, p["point_id"], name, len(p["candidates"]))
            assert [ranks[order[j]] for j in range(len(order))] == list(range(len(order), 0, -1))
    samples = table("generator_samples", RUN, home)
    assert any(s["n_items"] for s in samples)  # some rubrics were verified on the slate
    calls = table("judge_calls", RUN, home)
    for role in ("rank_actions", "step_rubric", "step_verify"):
        mine = [c for c in calls if c["role"] == role]
        assert mine and max(c["attempts"] for c in mine) == 2 and not any(c["error"] for c in mine)
    assert JUDGE_KEY not in str(calls)
