"""SS-GRPO and RubricEM through the real flow: the staged protocol from SFT to the trainer, the stagewise
rules judge, the stored stage rubrics and scores; the reflection meta-policy, its bank, retrievals and the lagged
reflection groups in the train batch; a SIGKILL in the middle of a step's stage judging (ss-grpo) and in the middle
of its reflection judging (rubricem) resumed to the same results as an uninterrupted run (the stage buffer and the
bank rebuilt from their stored events); both judges' roles through the local OpenAI-compatible server with faults."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from flow_support import STAGED, table

from arbor.format import RUBRICEM, check_format, stage_spans

pytestmark = pytest.mark.slow

RUN = "ss"


@pytest.fixture(scope="module")
def staged_start(sft_starts) -> Path:
    """The tiny-world policy SFT'd briefly on staged gold trajectories, half of them with a reflection row too."""
    return sft_starts("tiny-world", {**STAGED, "sft.questions": 600, "sft.epochs": 1, "sft.reflections": 0.5})


def _overrides(start: Path) -> dict:
    return {**STAGED, "run.method": "ss-grpo", "run.steps": 2, "run.sft_warm_start": False,
            "run.start_checkpoint": str(start), "rollout.batch_size": 4, "rollout.k": 4, "run.eval_every": None,
            "checkpoint.every": 1}


def _train(home: Path, overrides: dict, resume: bool = False, run_id: str = RUN) -> None:
    from arbor.flows.train import arbor_train

    os.environ["ARBOR_HOME"] = str(home)
    arbor_train(profile="tiny-world", overrides=overrides, run_id=run_id, resume=resume)


def _killed_run(home: Path, run_id: str, overrides: dict, fault: str, log: Path) -> None:
    """``arbor train`` in a subprocess that ``ARBOR_FAULT=fault`` SIGKILLs mid-stage; asserts it died by signal 9."""
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "ARBOR_HOME": str(home), "ARBOR_FAULT": fault,
           "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    with open(log, "w") as out:
        proc = subprocess.run([sys.executable, "-m", "arbor.cli", "train", "-p", "tiny-world", "--run-id", run_id,
                               *[f"--set={k}={'null' if v is None else v}" for k, v in overrides.items()]], env=env,
                              stdout=out, stderr=subprocess.STDOUT, timeout=600)
    assert proc.returncode == -9, log.read_text()[-2000:]


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
    grades = table("stage_grades", RUN, home)
    assert len(trajs) == 2 * 4 * 4 and len(scores) == 4 * len(trajs)
    valid = [t for t in trajs if t["format_valid"]]
    assert valid, "the staged SFT start wrote no valid staged response"
    researched = graded = 0  # trajectories the two checks below read (the run must have both)
    for t in trajs:
        fmt = check_format(t["text"], truncated=t["finish_reason"] in ("length", "max_turns"), protocol=RUBRICEM)
        assert fmt.valid == t["format_valid"]
        mine = sorted((r for r in scores if r["traj_id"] == t["traj_id"]), key=lambda r: r["stage"])
        spans = [(r["token_start"], r["token_end"]) for r in mine]
        assert spans[0][0] == 0 and spans[-1][1] == len(t["response_ids"])  # the four stages tile the response
        assert all(a[1] == b[0] and a[0] <= a[1] for a, b in zip(spans, spans[1:], strict=False))
        assert t["stage_starts"] == [a for a, _ in spans] and t["stage_rewards"] == [r["score"] for r in mine]
        assert t["shaped_reward"] == pytest.approx(mine[0]["stage_return"])  # R_total = G_1
        if stage_spans(t["text"])[1][1] > stage_spans(t["text"])[1][0]:
            researched += 1
            assert spans[1][1] > spans[1][0]  # a non-empty Research stage has tokens
        # no format gate (F.1.2): valid or not, a trajectory whose buffer held rubrics was graded against each
        n_rubrics = sum(r["n_rubrics"] for r in mine)
        if n_rubrics and mine[0]["judge_error"] is None:
            graded += 1
            assert sum(g["traj_id"] == t["traj_id"] for g in grades) == n_rubrics
    assert researched and graded
    # the rules judge proposed stage rubrics from the groups' differences, and graded every trajectory
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
    _killed_run(home, RUN, o, "2:score:kill-mid", tmp_path / "killed.log")
    assert not any(s["stage"] == "score" and s["step"] == 2 for s in table("stage_runs", RUN, home))
    _train(home, o, resume=True)
    assert _stored(home) == _stored(reference)


def test_one_step_with_the_openai_judge_under_faults(staged_start: Path, tmp_path: Path, prefect_harness,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage judge through the local OpenAI-compatible server, without retries (which call a shared list of
    faults reaches is up to the concurrent calls' order, so retries could absorb it): the first grading call to
    arrive gets a server error and fails, is recorded, and its trajectory's stage scores fall back to its group's
    mean grades; every other call answers."""
    from flow_support import JUDGE_KEY, JUDGE_KEY_ENV, openai_judge
    from openai_server import FaultPlan, OpenAIServer

    monkeypatch.setenv(JUDGE_KEY_ENV, JUDGE_KEY)
    plan = FaultPlan(by_role={"stage_grades": ["500"]})
    with OpenAIServer(plan) as srv:
        _train(tmp_path / "home", {**_overrides(staged_start), **openai_judge(srv.base_url), "run.steps": 1,
                                   "judge.max_retries": 0})
    home = tmp_path / "home"
    calls = table("judge_calls", RUN, home)
    assert {c["role"] for c in calls} == {"stage_rubrics", "stage_grades"}
    assert [c["role"] for c in calls if c["error"]] == ["stage_grades"]
    events = table("stage_rubrics", RUN, home)
    assert {e["title"] for e in events if e["event"] == "generated"} <= {"Plan names the entities", "Repeated queries"}
    scores = table("stage_scores", RUN, home)
    failed = {c["group"] for c in calls if c["error"]}
    # a failed grading call: the group's mean grades over its graded trajectories, valid or not (no format gate,
    # F.1.2); a stage score is affine in its grades, so it is the mean of the others' scores
    fell_back = [r for r in scores if r["judge_error"] and r["stage"] < 4]
    assert failed and fell_back
    for r in fell_back:
        graded = [x["score"] for x in scores if (x["group"], x["stage"]) == (r["group"], r["stage"])
                  and not x["judge_error"]]
        assert r["score"] == pytest.approx(sum(graded) / len(graded) if graded else 0.0)
    assert all(r["judge_error"] is None for r in scores if r["group"] not in failed)
    valid = [r for r in scores if r["format_valid"] and r["stage"] in (1, 2) and not r["judge_error"]]
    assert valid and any(r["score"] > 0 for r in valid)  # the server's grades reached the stage scores


# ---------------------------------------------------------------------------------------------- RubricEM
REM = "rem"


def _rem_overrides(start: Path) -> dict:
    """Three steps with window K = 1: step 1 fresh (empty bank), step 2 replays it (within), step 3 fresh (cross).
    Only the fresh steps 1 and 3 reflect (D.4, ``rubricem.reflect_in=new-query``)."""
    return {**_overrides(start), "run.method": "rubricem", "run.steps": 3, "rubricem.window": 1,
            "rubricem.reflection_samples": 4}


def _rem_stored(home: Path) -> tuple:
    key = lambda r: (r["step"], r.get("traj_id") or "", r.get("item_id") or "", r.get("group") or 0)  # noqa: E731
    refl = [(r["step"], r["traj_id"], r["text"], r["source_traj_id"], round(r["utility"], 9), r["chosen"],
             r["policy_version"]) for r in sorted(table("reflections", REM, home), key=key)]
    bank = [(r["step"], r["item_id"], r["event"], r["rubrics"], r["takeaways"])
            for r in sorted(table("rubric_bank", REM, home), key=key)]
    got = [(r["step"], r["group"], r["item_id"], r["mode"], r["rank"]) for r in sorted(
        table("bank_retrievals", REM, home), key=lambda r: (r["step"], r["group"], r["rank"]))]
    trajs = [(t["step"], t["traj_id"], t["text"], round(t["shaped_reward"], 9))
             for t in sorted(table("trajectories", REM, home), key=key)]
    losses = [round(r["loss"], 6) for r in sorted(table("steps", REM, home), key=lambda r: r["step"])]
    return refl, bank, got, trajs, losses


@pytest.fixture(scope="module")
def rem_reference(staged_start: Path, prefect_harness, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("rem_ref")
    _train(home, _rem_overrides(staged_start), run_id=REM)
    return home


def test_rubricem_reflects_banks_retrieves_and_trains_on_lagged_reflections(rem_reference: Path) -> None:
    from arbor.config import load_config
    from arbor.tasks.methods.rubricem import RubricEM
    from arbor.tasks.reflection import REFLECTION_GROUP, reflection_utility
    from arbor.tasks.stage_store import StageStore
    from arbor.types import ReflectionGrade

    home = rem_reference
    refl = table("reflections", REM, home)
    rollouts = {t["traj_id"]: t for t in table("rollouts", REM, home)}
    assert len(refl) == 2 * 4 * 4  # reflecting steps (1 and 3: the new-query phase) x groups x m
    assert {r["step"] for r in refl} == {1, 3}
    assert any(r["format_valid"] for r in refl), "the SFT start wrote no valid reflection"
    by_group: dict = {}
    for r in refl:
        src = rollouts[r["source_traj_id"]]  # one sampled trajectory of the same step and group
        assert (src["step"], src["group"] + REFLECTION_GROUP) == (r["step"], r["group"])
        want = reflection_utility(ReflectionGrade(r["diagnosis"], r["specificity"], r["scope"]))
        assert r["utility"] == pytest.approx(want)  # no format gate: the judge's score (rules: 0 without blocks)
        assert r["base_reward"] == r["utility"] and r["policy_version"] == r["step"] - 1
        assert r["prompt_ids"] != src["prompt_ids"]  # the reflection request, not the task prompt
        by_group.setdefault((r["step"], r["group"]), []).append(r)
    assert all(len({r["source_traj_id"] for r in g}) == 1 for g in by_group.values())
    bank = table("rubric_bank", REM, home)
    banked = 0
    for g in by_group.values():  # the best valid candidate with u > 0, and nothing else, is banked
        chosen = [r for r in g if r["chosen"]]
        best = max((r["utility"] for r in g if r["format_valid"]), default=0.0)
        assert len(chosen) == (1 if best > 0 else 0)
        if chosen:
            banked += 1
            assert chosen[0]["utility"] == best and chosen[0]["format_valid"]
            [item] = [b for b in bank if b["source_traj_id"] == chosen[0]["source_traj_id"]]
            assert item["rubrics"] in chosen[0]["text"] and item["takeaways"] in chosen[0]["text"]
    assert banked == len(bank) > 0
    got = table("bank_retrievals", REM, home)
    assert not [r for r in got if r["step"] == 1]  # the bank starts empty
    step1 = {b["question_id"]: b["item_id"] for b in bank if b["step"] == 1}
    within = [r for r in got if r["step"] == 2]
    assert within and all(r["mode"] == "within" and step1[r["question_id"]] == r["item_id"] for r in within)
    assert {r["question_id"] for r in within} == set(step1)  # window 1: step 2 replays step 1's questions
    cross = [r for r in got if r["step"] == 3]
    items = {b["item_id"]: b for b in bank}
    assert cross and all(r["mode"] == "cross" and items[r["item_id"]]["question_id"] != r["question_id"]
                         for r in cross)
    assert all(r["rank"] in (1, 2) for r in cross)
    shown = {(r["step"], r["question_id"]) for r in got}  # a prompt with a reference block is longer
    plain = {t["question_id"]: len(t["prompt_ids"]) for t in rollouts.values() if t["step"] == 1}
    step2 = [t for t in rollouts.values() if t["step"] == 2]
    assert step2 and [t["traj_id"] for t in step2
                      if (len(t["prompt_ids"]) > plain[t["question_id"]]) != ((2, t["question_id"]) in shown)] == []
    # the train batch of step s: its shaped rollouts plus step s-1's reflection groups whose utilities vary
    cfg = load_config("tiny-world", _rem_overrides(Path(".")))

    class Resources:
        store = StageStore(REM, home)

    for step in (2, 3):
        shaped = [t for t in table("trajectories", REM, home) if t["step"] == step]
        from arbor.tasks.step import trajectories_from_rows

        batch = RubricEM(cfg).train_batch(Resources(), step, trajectories_from_rows(shaped))  # type: ignore[arg-type]
        extra = [t for t in batch if t.group >= REFLECTION_GROUP]
        varying = [g for (s, _), g in by_group.items() if s == step - 1 and len({r["utility"] for r in g}) > 1]
        assert len(extra) == sum(len(g) for g in varying) and all(t.step == step - 1 for t in extra)
    # the audit views
    from arbor.storage.catalog import connect

    with connect(home) as con:
        reuse = con.execute("select item_id, retrievals, within_retrievals, cross_retrievals from bank_reuse "
                            "where run_id = ?", [REM]).fetchall()
        per_step = con.execute("select step, candidates, written_to_bank from reflection_scores where run_id = ? "
                               "order by step", [REM]).fetchall()
    counts = {i: sum(r["item_id"] == i for r in got) for i in items}
    assert {i: n for i, n, _, _ in reuse} == counts and all(n == w + c for _, n, w, c in reuse)
    assert [(s, n) for s, n, _ in per_step] == [(1, 16), (3, 16)]
    assert [w for _, _, w in per_step] == [sum(b["step"] == s for b in bank) for s in (1, 3)]


def test_rubricem_resume_after_sigkill_mid_reflection_judging(rem_reference: Path, staged_start: Path,
                                                               tmp_path: Path, prefect_harness) -> None:
    home = tmp_path / "home"
    o = _rem_overrides(staged_start)
    _killed_run(home, REM, o, "3:reflect:kill-mid", tmp_path / "killed.log")  # step 2 (a replay) reflects nothing
    assert not any(s["stage"] == "reflect" and s["step"] == 3 for s in table("stage_runs", REM, home))
    assert table("reflections", REM, home) and all(r["step"] == 1 for r in table("reflections", REM, home))
    _train(home, o, resume=True, run_id=REM)
    assert _rem_stored(home) == _rem_stored(rem_reference)


def test_reflection_judge_through_the_openai_server_under_faults(staged_start: Path, tmp_path: Path,
                                                                 prefect_harness,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Reflection grading over HTTP. Step 1: every attempt fails (a rate limit, a malformed and invalid replies;
    2 retries each), so its candidates stay at u = 0 with the error recorded and nothing is banked. Step 2: the
    two faults left are retried and the server's grades reach the utilities."""
    from flow_support import JUDGE_KEY, JUDGE_KEY_ENV, openai_judge
    from openai_server import FaultPlan, OpenAIServer

    monkeypatch.setenv(JUDGE_KEY_ENV, JUDGE_KEY)
    plan = FaultPlan(by_role={"reflection_grades": ["429", "malformed"] + ["invalid"] * 12})
    with OpenAIServer(plan) as srv:
        # every-step: step 2 (a replay under window 1) reflects too, so two steps show both sides of the faults
        _train(tmp_path / "home", {**_rem_overrides(staged_start), **openai_judge(srv.base_url), "run.steps": 2,
                                   "rubricem.reflect_in": "every-step"}, run_id=REM)
        assert srv.roles["reflection_grades"] == 4 * 3 + 4 + 2
    home = tmp_path / "home"
    calls = [c for c in table("judge_calls", REM, home) if c["role"] == "reflection_grades"]
    assert sorted(c["step"] for c in calls) == [1] * 4 + [2] * 4
    assert all(c["error"] and c["attempts"] == 3 for c in calls if c["step"] == 1)
    assert not any(c["error"] for c in calls if c["step"] == 2) and sum(c["attempts"] for c in calls
                                                                        if c["step"] == 2) == 6
    refl = table("reflections", REM, home)
    for r in refl:
        if r["step"] == 1:
            assert r["judge_error"] and r["utility"] == 0.0 and not r["chosen"]
        else:
            assert r["judge_error"] is None
            # the server's grades: diagnosis 0, .5, 1, 0 by candidate index, specificity = scope = .5
            d = (r["sample"] % 3) / 2
            # no format gate (F.1.2): a candidate without its blocks keeps the judge's grade; only a valid one
            # may be banked
            assert r["utility"] == pytest.approx(0.4 * d + 0.3) and (r["format_valid"] or not r["chosen"])
    assert {b["step"] for b in table("rubric_bank", REM, home)} <= {2}
