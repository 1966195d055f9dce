"""The step's schedule: streamed judging stores exactly the serial order's rows, and starts judging
groups while others still roll out; the one-step overlap trains step N while step N+1 rolls out, and a run killed
in the middle of an overlapped step resumes to the uninterrupted overlapped run's results.

Real Prefect, DeepSpeed on CPU, the tiny policy, the openai judge over HTTP against the local test server.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from flow_support import JUDGE_KEY, JUDGE_KEY_ENV, judge_server, openai_judge, table, tiny_overrides

from arbor.config import ArborConfig
from arbor.storage.kvstore import STORE_FILE

pytestmark = pytest.mark.slow
RUN = "ref"  # one run id in two workspaces: trajectory ids name it

TABLES = ("rollouts", "trajectories", "rubric_events", "rubric_activations", "rubric_sources", "draft_scores",
          "judge_calls", "steps")
# what measures time or the schedule itself, not what the run computed
SCHEDULE = {"run_id", "completed_at", "wall_seconds", "latency_s", "prefetched_calls", "prefetch_wasted_calls",
            "prefetch_wasted_cost_usd", "gen_seconds"}


def _train(home: Path, run_id: str, overrides: dict[str, Any], resume: bool = False) -> str:
    from arbor.flows.train import arbor_train

    os.environ["ARBOR_HOME"] = str(home)
    return arbor_train(profile="tiny-cpu", overrides=overrides, run_id=run_id, resume=resume)


def _canon(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 9)
    if isinstance(v, list):
        return tuple(_canon(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _canon(x)) for k, x in v.items()))
    return v


def stored(run_id: str, home: Path, leave_out: frozenset[str] = frozenset()) -> dict[str, list[tuple]]:
    """Every table of the run as a sorted list of rows without the schedule's columns (rows stored in whatever
    order calls finished compare as multisets)."""
    out = {}
    for name in TABLES:
        rows = [tuple(sorted((k, _canon(v)) for k, v in r.items() if k not in SCHEDULE | leave_out))
                for r in table(name, run_id, home)]
        out[name] = sorted(rows, key=repr)
    return out


@pytest.fixture(scope="module")
def serial_and_streamed(reference_run, sft_policy: Path, tmp_path_factory: pytest.TempPathFactory):
    """The reference run (streamed judging, conftest) and the same run with ``run.stream_judging=false``."""
    home = tmp_path_factory.mktemp("serial_home")
    os.environ[JUDGE_KEY_ENV] = JUDGE_KEY
    with judge_server() as srv:
        srv.plan.latency_s = 0.02
        _train(home, RUN, {**tiny_overrides(sft_policy), **openai_judge(srv.base_url), "run.stream_judging": False})
        serial = (home, list(srv.arrivals), dict(srv.counts))
    ref_home, counts, arrivals = reference_run
    return {"serial": serial, "streamed": (ref_home, arrivals, counts)}


def test_streamed_judging_stores_the_serial_rows(serial_and_streamed) -> None:
    (s_home, _, _), (t_home, _, t_counts) = serial_and_streamed["serial"], serial_and_streamed["streamed"]
    a, b = stored(RUN, s_home), stored(RUN, t_home)
    assert a["judge_calls"] and a["rubric_activations"] and a["draft_scores"], "nothing was judged"
    for name in TABLES:
        assert a[name] == b[name], f"{name}: streamed rows differ from the serial order's"
    assert max(t_counts.values()) == 1  # no prompt paid twice, a prefetched call included
    steps = sorted(table("steps", RUN, t_home), key=lambda r: r["step"])
    assert all(r["prefetched_calls"] is None for r in table("steps", RUN, s_home))
    events = table("rubric_events", RUN, t_home)
    for r in steps:  # the stored calls were made ahead of their stage; a wrong guess is counted, not stored
        calls = [c for c in table("judge_calls", RUN, t_home) if c["step"] == r["step"]
                 and c["stage"] in ("score", "induce")]
        claimed = r["prefetched_calls"] - r["prefetch_wasted_calls"]
        if any(e["event"] == "retired" and e["step"] == r["step"] for e in events):
            assert 0 < claimed <= len(calls), r  # induction saw another pool: its stage called again
        else:
            assert claimed == len(calls) > 0 and r["prefetch_wasted_calls"] == 0, r


def test_streamed_judging_starts_before_the_rollout_ends(serial_and_streamed) -> None:
    """Judge requests of a step arrive while its rollout stage is still running (streamed), never before it
    finished (serial)."""
    for mode, streamed in (("serial", False), ("streamed", True)):
        home, arrivals, _ = serial_and_streamed[mode]
        runs = {(r["step"], r["stage"]): r for r in table("stage_runs", RUN, home) if r["status"] == "completed"}
        for step in (1, 2):
            ro = runs[(step, "rollout")]
            start, end = ro["started_at"].timestamp(), ro["finished_at"].timestamp()
            during = [t for t, role in arrivals if start <= t < end and role in ("pairwise", "induction")]
            assert bool(during) == streamed, (mode, step, len(during))


# ------------------------------------------------------------------------------------------ one-step overlap
OVERLAP_BATCH = 4  # prompts a step of the overlapped runs (tiny_overrides' 8 halved, for CI time); K stays 4


def _overlapped(sft_policy: Path, base_url: str) -> dict[str, Any]:
    return {**tiny_overrides(sft_policy), **openai_judge(base_url), "run.overlap": "one-step",
            "rollout.batch_size": OVERLAP_BATCH}


@pytest.fixture(scope="module")
def overlapped(prefect_harness, sft_policy: Path, tmp_path_factory: pytest.TempPathFactory):
    """An uninterrupted two-step run under ``run.overlap=one-step`` (``OVERLAP_BATCH`` prompts x K=4 a step)."""
    home = tmp_path_factory.mktemp("overlap_home")
    os.environ[JUDGE_KEY_ENV] = JUDGE_KEY
    with judge_server() as srv:
        _train(home, RUN, _overlapped(sft_policy, srv.base_url))
    return home


def test_next_rollout_overlaps_training(overlapped: Path) -> None:
    runs = {(r["step"], r["stage"]): r for r in table("stage_runs", RUN, overlapped) if r["status"] == "completed"}
    train1, rollout2 = runs[(1, "train")], runs[(2, "rollout")]
    assert rollout2["started_at"] < train1["finished_at"] and train1["started_at"] < rollout2["finished_at"]
    assert runs[(1, "consolidate")]["finished_at"] <= rollout2["started_at"]  # after step 1's judging
    # step 2 was sampled by policy 0 while step 1 trained; the trainer (version 1) weighs it by TIS
    versions = {(t["step"], t["policy_version"]) for t in table("trajectories", RUN, overlapped)}
    assert versions == {(1, 0), (2, 0)}
    steps = sorted(table("steps", RUN, overlapped), key=lambda r: r["step"])
    assert [r["policy_version"] for r in steps] == [1, 2]
    assert abs(steps[0]["tis_mean"] - 1.0) < 1e-3  # on-policy step 1
    assert steps[1]["tis_mean"] is not None and abs(steps[1]["tis_mean"] - 1.0) > 1e-6  # one version behind
    cfg = ArborConfig.model_validate_json(table("runs", RUN, overlapped)[0]["config_json"])
    assert cfg.run.overlap == "one-step"  # recorded with the run


def test_sigkill_mid_overlapped_step_resumes_exactly(overlapped: Path, sft_policy: Path, tmp_path: Path,
                                                     prefect_harness) -> None:
    """SIGKILL while step 1 trains and step 2 rolls out; the resumed run stores the uninterrupted run's rows."""
    home = tmp_path / "home"
    with judge_server() as srv:
        o = _overlapped(sft_policy, srv.base_url)
        from prefect.settings import PREFECT_API_URL

        env = {**os.environ, "ARBOR_HOME": str(home), "ARBOR_FAULT": "1:train:kill", JUDGE_KEY_ENV: JUDGE_KEY,
               "PREFECT_API_URL": str(PREFECT_API_URL.value())}
        log = tmp_path / "killed.log"
        with open(log, "w") as out:
            proc = subprocess.run([sys.executable, "-m", "arbor.cli", "train", "--run-id", RUN,
                                   *[f"--set={k}={v}" for k, v in o.items()]], env=env, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=600)
        assert proc.returncode == -9, log.read_text()[-2000:]
        assert not any(s["stage"] == "train" for s in table("stage_runs", RUN, home) if s["status"] == "completed")
        with sqlite3.connect(home / "cache" / "judge" / STORE_FILE) as con:
            stored_keys = {k for (k,) in con.execute("select key from kv")}
        resumed_at = time.time()
        _train(home, RUN, o, resume=True)
        # what the killed run asked the judge (step 2's rollout streams its judging): every request that reached
        # the server before the resume started, one the server read only after the SIGKILL included
        asked = {k for t, k in srv.keyed if t < resumed_at}
        # the judge is not paid twice for any answer the killed run received and stored; only a call in flight at
        # the SIGKILL (asked, its answer never stored) may be asked again, at most one per concurrent call
        again = {k for k, n in srv.counts.items() if n > 1}
        assert not again & stored_keys and again <= asked - stored_keys and max(srv.counts.values()) <= 2
        assert len(again) <= int(o.get("judge.concurrency", 32))
    # a call the killed attempt paid for is answered from the judge cache on resume, and its ledger row says so
    # (no attempts, so no attempt_errors or attempt_replies either); it carries the killed attempt's payment
    #, so cost_usd and judge_cost_usd equal the uninterrupted run's
    ledger = frozenset({"cache_hit", "attempts", "attempt_errors", "attempt_replies"})
    a, b = stored(RUN, overlapped, ledger), stored(RUN, home, ledger)
    for name in TABLES:
        assert a[name] == b[name], f"{name}: the resumed overlapped run differs from the uninterrupted one"
