"""SS-GRPO through the real flow (issue 15): the staged protocol from SFT to the trainer, the stagewise rules judge,
the stored stage rubrics and scores, and a SIGKILL in the middle of a step's stage judging resumed to the same
results as an uninterrupted run (the stage buffer rebuilt from its stored events)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from flow_support import sft_start, table

from arbor.tasks.format import RUBRICEM, check_format, stage_spans

pytestmark = pytest.mark.slow

RUN = "ss"
# the world's short prompt, in the staged protocol's tags (tiny-world's own names <result>, which it refuses)
STAGED = {"rollout.protocol": "rubricem", "rollout.system_prompt": (
    "Answer the question by searching. Plan in <structured_plan></structured_plan>, search with <search>query"
    "</search>, read the <tool_output></tool_output>, weigh it in <state_evaluation></state_evaluation>, review in "
    "<review></review>, and give the final answer as <answer>\\boxed{answer}</answer>.")}


@pytest.fixture(scope="module")
def staged_start(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny-world policy SFT'd briefly on staged gold trajectories (150 updates)."""
    return sft_start("tiny-world", lambda: tmp_path_factory.mktemp("staged_sft"),
                     {**STAGED, "sft.questions": 600, "sft.epochs": 1})


def _overrides(start: Path) -> dict:
    return {**STAGED, "run.method": "ss-grpo", "run.steps": 2, "run.sft_warm_start": False,
            "run.start_checkpoint": str(start), "rollout.batch_size": 4, "rollout.k": 4, "run.eval_every": None,
            "checkpoint.every": 1}


def _train(home: Path, overrides: dict, resume: bool = False) -> None:
    from arbor.flows.train import arbor_train

    os.environ["ARBOR_HOME"] = str(home)
    arbor_train(profile="tiny-world", overrides=overrides, run_id=RUN, resume=resume)


def _stored(home: Path) -> tuple:
    key = lambda r: (r["step"], r.get("traj_id") or "", r.get("stage") or 0, r.get("rubric_id") or "")  # noqa: E731
    scores = [(r["step"], r["traj_id"], r["stage"], r["token_start"], r["token_end"], round(r["score"], 9),
               round(r["advantage"], 6)) for r in sorted(table("stage_scores", RUN, home), key=key)]
    rubrics = [(r["step"], r["rubric_id"], r["event"], r["title"], r["variance"])
               for r in sorted(table("stage_rubrics", RUN, home), key=key)]
    trajs = [(t["step"], t["traj_id"], t["stage_starts"], [round(x, 9) for x in t["stage_rewards"]],
              round(t["shaped_reward"], 9)) for t in sorted(table("trajectories", RUN, home), key=key)]
    losses = [round(r["loss"], 6) for r in sorted(table("steps", RUN, home), key=lambda r: r["step"])]
    return scores, rubrics, trajs, losses


@pytest.fixture(scope="module")
def reference(staged_start: Path, prefect_harness, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("ss_ref")
    _train(home, _overrides(staged_start))
    return home


def test_ss_grpo_run_stores_stage_credit(reference: Path) -> None:
    home = reference
    trajs = table("trajectories", RUN, home)
    scores = table("stage_scores", RUN, home)
    assert len(trajs) == 2 * 4 * 4 and len(scores) == 4 * len(trajs)
    valid = [t for t in trajs if t["format_valid"]]
    assert valid, "the staged SFT start wrote no valid staged response"
    for t in trajs:
        fmt = check_format(t["text"], truncated=t["finish_reason"] in ("length", "max_turns"), protocol=RUBRICEM)
        assert fmt.valid == t["format_valid"]
        mine = sorted((r for r in scores if r["traj_id"] == t["traj_id"]), key=lambda r: r["stage"])
        spans = [(r["token_start"], r["token_end"]) for r in mine]
        assert spans[0][0] == 0 and spans[-1][1] == len(t["response_ids"])  # the four stages tile the response
        assert all(a[1] == b[0] and a[0] <= a[1] for a, b in zip(spans, spans[1:], strict=False))
        assert t["stage_starts"] == [a for a, _ in spans] and t["stage_rewards"] == [r["score"] for r in mine]
        assert t["shaped_reward"] == pytest.approx(mine[0]["stage_return"])  # R_total = G_1
        if not t["format_valid"]:
            assert [r["score"] for r in mine] == [0.0] * 4  # the format gate
        elif stage_spans(t["text"])[1][1] > stage_spans(t["text"])[1][0]:
            assert spans[1][1] > spans[1][0]  # a non-empty Research stage has tokens
    # the rules judge proposed stage rubrics from the groups' differences, and graded every valid trajectory
    events = table("stage_rubrics", RUN, home)
    assert {e["event"] for e in events} >= {"generated", "kept"}
    assert all(1 <= e["stage"] <= 4 and e["weight"] in (1, 2, 3) and e["polarity"] in (1, -1) for e in events)
    calls = table("judge_calls", RUN, home)
    assert {c["role"] for c in calls} >= {"stage_rubrics", "stage_grades"}
    steps = sorted(table("steps", RUN, home), key=lambda r: r["step"])
    assert [s["step"] for s in steps] == [1, 2] and all(s["loss"] is not None for s in steps)


def test_resume_after_sigkill_mid_stage_judging(reference: Path, staged_start: Path, tmp_path: Path,
                                                prefect_harness) -> None:
    home = tmp_path / "home"
    o = _overrides(staged_start)
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "ARBOR_HOME": str(home), "ARBOR_FAULT": "2:score:kill-mid",
           "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    log = tmp_path / "killed.log"
    with open(log, "w") as out:
        proc = subprocess.run([sys.executable, "-m", "arbor.cli", "train", "-p", "tiny-world", "--run-id", RUN,
                               *[f"--set={k}={'null' if v is None else v}" for k, v in o.items()]], env=env, stdout=out,
                              stderr=subprocess.STDOUT, timeout=600)
    assert proc.returncode == -9, log.read_text()[-2000:]
    assert not any(s["stage"] == "score" and s["step"] == 2 for s in table("stage_runs", RUN, home))
    _train(home, o, resume=True)
    assert _stored(home) == _stored(reference)


def test_one_step_with_the_openai_judge_under_faults(staged_start: Path, tmp_path: Path, prefect_harness,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage judge through the local OpenAI-compatible server: a rate limit, a malformed reply and an invalid
    one are retried; a grading call that keeps failing falls back to the answer score and is recorded."""
    from flow_support import JUDGE_KEY, JUDGE_KEY_ENV, openai_judge
    from openai_server import FaultPlan, OpenAIServer

    monkeypatch.setenv(JUDGE_KEY_ENV, JUDGE_KEY)
    plan = FaultPlan(queue=["429", "malformed", "invalid"] + ["invalid"] * 3)
    with OpenAIServer(plan) as srv:
        _train(tmp_path / "home", {**_overrides(staged_start), **openai_judge(srv.base_url), "run.steps": 1})
    home = tmp_path / "home"
    calls = table("judge_calls", RUN, home)
    assert {c["role"] for c in calls} == {"stage_rubrics", "stage_grades"}
    assert max(c["attempts"] for c in calls) > 1  # faults were retried
    events = table("stage_rubrics", RUN, home)
    assert {e["title"] for e in events if e["event"] == "generated"} <= {"Plan names the entities", "Repeated queries"}
    scores = table("stage_scores", RUN, home)
    failed = {c["group"] for c in calls if c["error"]}
    for r in scores:  # a failed grading call: the stages before the answer score 0 (C.4's fallback)
        if r["judge_error"]:
            assert r["stage"] == 4 or r["score"] == 0.0
    assert all(r["judge_error"] is None for r in scores if r["group"] not in failed)
    valid = [r for r in scores if r["format_valid"] and r["stage"] in (1, 2) and not r["judge_error"]]
    assert valid and any(r["score"] > 0 for r in valid)  # the server's grades reached the stage scores
