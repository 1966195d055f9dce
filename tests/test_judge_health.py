"""A judge that stops helping is seen at once.

The ledger's figures (``llm/health.py`` and the ``judge_health`` view) on hand-built ``judge_calls`` rows counted by
hand; the ``degraded`` mark of ``arbor runs`` / ``arbor compare``; and real ``arbor train`` runs against real HTTP
servers on loopback: one that answers 500 to every request (the run ends non-zero with one line naming the role,
the URL and the last error, the step not committed, the run failed and resumable), the resume
against a working judge whose every other rubric call fails (the run completes and shows the failed share), and a
judge whose every rubric reply is hollow (the run completes, degraded, its summary naming the reason). The judge
that reads every request and never answers is the stop drill's case (tests/test_stop_drill.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from openai_server import FaultPlan, OpenAIServer
from raw_server import RawServer

from arbor.llm.health import call_outcome, public_url, role_health
from arbor.storage.parquet import read_table, write_stage
from arbor.storage.sql import query, run_file, sql_file
from arbor.tasks.step import judge_health_columns


# ------------------------------------------------------------------------------------ the ledger, counted by hand
def _call(role: str, error: str | None = None, group: int | None = None, **kw: object) -> dict:
    return {"role": role, "backend": kw.pop("backend", "openai"), "error": error, "group": group,
            "cache_hit": kw.pop("cache_hit", False), "attempts": kw.pop("attempts", 1), **kw}


LEDGER = [
    # induction, 8 calls: 3 answered (groups 0, 1, 2), a cache hit (group 3), 4 refused: two placeholders, one
    # hollow answer without a stored reason, one reply that did not parse
    _call("induction", None, 0), _call("induction", None, 1), _call("induction", None, 2),
    _call("induction", None, 3, cache_hit=True, attempts=0),
    _call("induction", "InvalidAnswer", 0, refusal="placeholder"),
    _call("induction", "InvalidAnswer", 1, refusal="placeholder"),
    _call("induction", "InvalidAnswer", 2),
    _call("induction", "InvalidOutput", 4, refusal="unparseable"),
    # pairwise, 5 calls: two timeouts, one 5xx after its retries, one answer (group 0; also a group 7 answer that
    # is no rollout group of the step), one never sent (the cost cap)
    _call("pairwise", "APITimeoutError", 1), _call("pairwise", "APITimeoutError", 2),
    _call("pairwise", "InternalServerError", 3), _call("pairwise", None, 0), _call("pairwise", None, 7),
    _call("pairwise", "CostCapExceeded", 4, attempts=0),
    # the offline rules judge declining a rubric it cannot read: a refusal, not a transport failure
    _call("rar_rate", "RubricWithoutFeature", 4, backend="rules", refusal="RubricWithoutFeature"),
]


def test_call_outcomes_and_role_health_by_hand() -> None:
    assert [call_outcome(r) for r in LEDGER[:8]] == ["answered"] * 3 + ["cache_hit"] + ["refused"] * 4
    assert [call_outcome(r) for r in LEDGER[8:]] == ["failed"] * 3 + ["answered"] * 2 + ["skipped", "refused"]
    # a plug-in's detail after the class; an error status that no retry fixes is no answer either
    assert call_outcome(_call("x", "InvalidOutput: not a permutation")) == "refused"
    assert call_outcome(_call("x", "APIStatusError:401")) == "failed"
    h = role_health(LEDGER)
    ind, pw = h["induction"], h["pairwise"]
    assert (ind.calls, ind.sent, ind.counts["answered"], ind.counts["cache_hit"], ind.counts["refused"]) == (8, 8, 3, 1, 4)
    assert ind.share("refused") == 0.5 and ind.top_reason() == "placeholder" and ind.reasons["hollow"] == 1
    assert (pw.calls, pw.sent, pw.counts["failed"], pw.counts["skipped"]) == (6, 5, 3, 1)
    assert pw.share("failed") == 3 / 5 and pw.last_error == "InternalServerError"
    # the steps row: 3 failed, 5 refused, groups 0-3 of the rollout groups 0-4 answered about (7 is none of
    # them); with warn_refused_share 0.4 induction (4/8) and rar_rate (1/1) are above it, pairwise (0/5) is not
    assert judge_health_columns(LEDGER, range(5), 0.4) == {
        "judge_calls_failed": 3, "judge_calls_refused": 5, "judged_groups": 4, "judge_degraded": "induction,rar_rate"}
    assert judge_health_columns(LEDGER, range(5), 0.5)["judge_degraded"] == "rar_rate"  # 4/8 is not above 0.5


def test_judge_health_view_by_hand(tmp_path: Path) -> None:
    """The view's figures on the same ledger (run config warn_refused_share 0.4; five rollout groups)."""
    write_stage("runs", [{"run_id": "jh", "method": "arbor", "config_json": json.dumps(
        {"judge": {"warn_refused_share": 0.4}})}], run_id="jh", step=0, stage="run", home=tmp_path)
    write_stage("judge_calls", LEDGER[:8], run_id="jh", step=1, stage="induce", home=tmp_path)
    write_stage("judge_calls", LEDGER[8:], run_id="jh", step=1, stage="score", home=tmp_path)
    write_stage("trajectories", [{"traj_id": f"t{g}.{s}", "group": g, "sample": s} for g in range(5) for s in range(2)],
                run_id="jh", step=1, stage="shape", home=tmp_path)
    write_stage("steps", [{"n_groups": 5}], run_id="jh", step=1, stage="train", home=tmp_path)
    got = {r["role"]: r for r in query("select * from judge_health where run_id = 'jh'", home=tmp_path).to_pylist()}
    cols = ("calls", "answered", "cache_hits", "failed", "refused", "skipped", "judged_groups", "n_groups")
    assert {k: got["induction"][k] for k in cols} == dict(zip(cols, (8, 3, 1, 0, 4, 0, 4, 5), strict=True))
    assert got["induction"]["refused_share"] == 0.5 and got["induction"]["top_refusal"] == "placeholder"
    assert got["induction"]["judged_group_share"] == 4 / 5 and got["induction"]["degraded"] is True
    assert {k: got["pairwise"][k] for k in cols} == dict(zip(cols, (6, 2, 0, 3, 0, 1, 1, 5), strict=True))
    assert got["pairwise"]["failed_share"] == 3 / 5 and got["pairwise"]["top_error"] == "APITimeoutError"
    assert got["pairwise"]["degraded"] is False and got["pairwise"]["top_refusal"] is None
    assert got["rar_rate"]["refused"] == 1 and got["rar_rate"]["degraded"] is True
    every = got["all"]  # 15 calls, 14 sent; refusals placeholder 2, hollow 1, unparseable 1, RubricWithoutFeature 1
    assert {k: every[k] for k in cols} == dict(zip(cols, (15, 5, 1, 3, 5, 1, 4, 5), strict=True))
    assert every["failed_share"] == 3 / 14 and every["refused_share"] == 5 / 14
    assert every["top_refusal"] == "placeholder" and every["top_error"] == "APITimeoutError"
    # the python figures agree with the view's, role by role
    for role, h in role_health(LEDGER).items():
        assert (got[role]["failed"], got[role]["refused"], got[role]["skipped"]) == \
            (h.counts["failed"], h.counts["refused"], h.counts["skipped"])
    shown = run_file("judge_health_of_run", {"run_id": "jh"}, home=tmp_path)
    assert [r["role"] for r in shown] == ["induction", "pairwise", "rar_rate"]


def test_runs_and_compare_carry_the_degraded_mark(tmp_path: Path) -> None:
    """A run with a degraded step and a healthy one: `arbor runs` (view run_status) and `arbor compare`'s table."""
    for rid, marks in (("sick", [None, "rar_rubrics"]), ("well", [None, None])):
        write_stage("runs", [{"run_id": rid, "method": "rar"}], run_id=rid, step=0, stage="run", home=tmp_path)
        for step, mark in enumerate(marks, 1):
            write_stage("steps", [{"judge_degraded": mark, "judge_calls": 4}], run_id=rid, step=step, stage="train",
                        home=tmp_path)
    runs = {r["run_id"]: r["degraded"] for r in query(sql_file("run_statuses"), home=tmp_path).to_pylist()}
    assert runs == {"sick": "degraded 1/2 steps", "well": None}
    table = {r["run_id"]: r["degraded"] for r in run_file("compare_runs", {"run_ids": ["sick", "well"]}, home=tmp_path)}
    assert table == {"sick": "degraded 1/2 steps", "well": None}


def test_the_steps_row_health_columns_reach_the_trackers() -> None:
    """The degraded roles' names (a string) go to the loggers as a 0/1 figure; the counts under judge/."""
    from arbor.tasks.reporting.tracking import clean_metrics, grouped_metrics

    row = {"step": 1, "judge_calls": 4, "judge_calls_failed": 1, "judge_calls_refused": 2, "judged_groups": 1}
    assert clean_metrics(grouped_metrics({**row, "judge_degraded": "rar_rubrics"})) == {
        "judge/calls": 4.0, "judge/calls_failed": 1.0, "judge/calls_refused": 2.0, "judge/judged_groups": 1.0,
        "judge/degraded": 1.0}
    assert clean_metrics(grouped_metrics({**row, "judge_degraded": None}))["judge/degraded"] == 0.0


def test_public_url_drops_credentials() -> None:
    assert public_url("http://user:s3cret@127.0.0.1:8000/v1?api_key=sk-abc#x") == "http://127.0.0.1:8000/v1"
    assert public_url("https://KEY@judge.example.com/v1") == "https://judge.example.com/v1"
    assert public_url(None) == "https://api.openai.com/v1"


# ------------------------------------------------------------------------------ real runs against real servers
ARBOR = str(Path(sys.executable).parent / "arbor")
KEY_ENV = "ARBOR_TEST_JUDGE_KEY"
TINY = ("run.steps=1", "run.method=rar", "run.sft_warm_start=false", "rollout.batch_size=2", "rollout.k=2",
        "rollout.max_turns=2", "rollout.max_new_tokens_per_turn=16", "search.corpus=corpus.jsonl",
        "checkpoint.every=1", "judge.backend=openai", f"judge.api_key_env={KEY_ENV}", "judge.model=test-judge",
        "judge.timeout_s=1", "judge.max_retries=0", "judge.stall_s=1")


@pytest.fixture
def workspace(tmp_path: Path, prefect_harness) -> tuple[Path, dict[str, str]]:
    """A workspace of its own for each case: the judge cache is shared by the runs of a workspace (a resumed or a
    repeated run does not pay twice), and these cases ask the same questions of different judges."""
    from prefect.settings import PREFECT_API_URL

    (tmp_path / "corpus.jsonl").write_text("".join(
        json.dumps({"title": f"Book {i}", "text": f"Book {i} was written by Author {i}."}) + "\n" for i in range(20)))
    env = {k: v for k, v in os.environ.items() if k not in ("ARBOR_FAULT",)}
    env.update(ARBOR_HOME=str(tmp_path / "home"), PREFECT_API_URL=str(PREFECT_API_URL.value()),
               PREFECT_LOGGING_LEVEL="INFO", **{KEY_ENV: "sk-test-secret-0123456789"})
    return tmp_path, env


def _train(root: Path, env: dict[str, str], *args: str) -> tuple[int, list[str]]:
    proc = subprocess.run([ARBOR, "train", *args], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode, (proc.stdout + proc.stderr).splitlines()


def _runs(root: Path, env: dict[str, str]) -> dict[str, dict]:
    out = subprocess.run([ARBOR, "runs", "--format", "json"], cwd=root, env=env, capture_output=True, text=True,
                         timeout=120).stdout
    return {r["run_id"]: r for r in json.loads(out)}



@pytest.mark.slow
def test_a_judge_that_answers_500_ends_the_run_and_it_resumes(workspace) -> None:
    """Every call answered 500: the run ends non-zero naming the role and the URL, the step not
    committed, the run failed; resumed against a judge whose every other rubric call fails, it completes from its
    stored rollouts and shows the failed share. (A judge that never answers: the stop drill's silent-judge case.)"""
    root, env = workspace
    home = Path(env["ARBOR_HOME"])
    rid = "down-500"
    with RawServer("500") as server:
        url = f"http://127.0.0.1:{server.port}/v1"
        rc, lines = _train(root, env, "--run-id", rid, *[f"--set={s}" for s in TINY], f"--set=judge.base_url={url}")
    assert rc == 1, "\n".join(lines[-30:])
    last = lines[-1]
    assert last.startswith(f"error: run {rid} stopped: JudgeUnreachable: the judge of role 'rar_rubrics' at "
                           f"http://127.0.0.1:{server.port}/v1 failed all 2 of its calls at step 1 (stage shape), "
                           "last error InternalServerError; step 1 was not committed"), last
    assert f"arbor train --resume {rid}" in last
    assert "sk-test-secret" not in "\n".join(lines)  # the key, from the environment variable api_key_env names
    chats = [line for line in server.lines if line.startswith("POST ")]  # the rest: the judge's GET /v1/models
    assert len(chats) == 2  # one attempt per call (judge.max_retries=0), the shape stage not retried
    assert read_table("steps", run_id=rid, home=home).num_rows == 0  # the step did not commit
    assert read_table("judge_calls", run_id=rid, home=home).num_rows == 0  # nor did the stage that asked the judge
    assert _runs(root, env)[rid]["status"] == "failed"
    # back with a working judge whose every other rubric call fails: step 1 is computed from its stored rollouts
    rollouts = read_table("rollouts", run_id=rid, home=home).to_pylist()
    with OpenAIServer(FaultPlan(by_role={"rar_rubrics": ["500", "ok"]})) as ok:
        rc, lines = _train(root, env, "--resume", rid, f"--set=judge.base_url={ok.base_url}")
    assert rc == 0, "\n".join(lines[-30:])
    steps = read_table("steps", run_id=rid, home=home).to_pylist()
    assert [s["step"] for s in steps] == [1]
    assert read_table("rollouts", run_id=rid, home=home).to_pylist() == rollouts  # resumed, not sampled again
    # half the rubric calls failed: the run completes, its steps row and summary show it
    assert steps[0]["judge_calls_failed"] == 1 and steps[0]["judge_calls_refused"] == 0
    assert steps[0]["judged_groups"] == 1 and steps[0]["judge_degraded"] is None
    assert any("rar_rubrics 2 calls: 1 answered, 1 failed (InternalServerError)" in line for line in lines), lines
    assert any("groups judged 1/2" in line for line in lines)
    assert _runs(root, env)[rid]["status"] == "completed"


@pytest.mark.slow
def test_hollow_rubric_replies_degrade_the_run_visibly(workspace) -> None:
    root, env = workspace
    home = Path(env["ARBOR_HOME"])
    rid = "hollow"
    with OpenAIServer(FaultPlan(by_role={"rar_rubrics": ["echo"] * 8})) as srv:
        rc, lines = _train(root, env, "--run-id", rid, *[f"--set={s}" for s in TINY],
                           f"--set=judge.base_url={srv.base_url}")
    assert rc == 0, "\n".join(lines[-30:])
    calls = read_table("judge_calls", run_id=rid, home=home).to_pylist()
    rubric = [c for c in calls if c["role"] == "rar_rubrics"]
    # the real SmolLM2 judge's recorded reply (tests/data/smollm2_replies.json): five items, two of them the
    # prompt's placeholders ("<item 1>", "..."), so it validates and the answer filter refuses it
    assert [c["error"] for c in rubric] == ["InvalidAnswer"] * 2
    assert [c["attempt_errors"] for c in rubric] == [["InvalidAnswer:placeholder"]] * 2
    reason = rubric[0]["refusal"]
    assert reason == "placeholder"
    assert reason and all(c["refusal"] == reason for c in rubric)
    steps = read_table("steps", run_id=rid, home=home).to_pylist()
    assert steps[0]["judge_degraded"] == "rar_rubrics" and steps[0]["judge_calls_refused"] == 2
    assert steps[0]["judged_groups"] == 0
    assert any(f"rar_rubrics 2 calls: 0 answered, 2 refused ({reason})" in line for line in lines), lines
    warning = [line for line in lines if "WARNING judge role rar_rubrics" in line]
    assert warning and f"commonest reason {reason} (2)" in warning[0], lines
    assert _runs(root, env)[rid]["degraded"] == "degraded 1/1 steps"
