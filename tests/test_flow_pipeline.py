"""The step's schedule (issue 19): streamed judging stores exactly the serial order's rows, and starts judging
groups while others still roll out; the one-step overlap trains step N while step N+1 rolls out, and a run killed
in the middle of an overlapped step resumes to the uninterrupted overlapped run's results.

Real Prefect, DeepSpeed on CPU, the tiny policy, the openai judge over HTTP against the local test server.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from flow_support import JUDGE_KEY, JUDGE_KEY_ENV, judge_server, openai_judge, table, tiny_overrides

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


def stored(run_id: str, home: Path) -> dict[str, list[tuple]]:
    """Every table of the run as a sorted list of rows without the schedule's columns (rows stored in whatever
    order calls finished compare as multisets)."""
    out = {}
    for name in TABLES:
        rows = [tuple(sorted((k, _canon(v)) for k, v in r.items() if k not in SCHEDULE))
                for r in table(name, run_id, home)]
        out[name] = sorted(rows, key=repr)
    return out


@pytest.fixture(scope="module")
def serial_and_streamed(prefect_harness, sft_policy: Path, tmp_path_factory: pytest.TempPathFactory):
    """The same two-step run twice, each with its own judge server and workspace: serial, then streamed."""
    os.environ[JUDGE_KEY_ENV] = JUDGE_KEY
    out = {}
    for mode, stream in (("serial", False), ("streamed", True)):
        home = tmp_path_factory.mktemp(f"{mode}_home")
        with judge_server() as srv:
            srv.plan.latency_s = 0.02
            _train(home, RUN, {**tiny_overrides(sft_policy), **openai_judge(srv.base_url),
                                "run.stream_judging": stream})
            out[mode] = (home, list(srv.arrivals), dict(srv.counts))
    return out


def test_streamed_judging_stores_the_serial_rows(serial_and_streamed) -> None:
    (s_home, _, _), (t_home, _, t_counts) = serial_and_streamed["serial"], serial_and_streamed["streamed"]
    a, b = stored(RUN, s_home), stored(RUN, t_home)
    assert a["judge_calls"] and a["rubric_activations"] and a["draft_scores"], "nothing was judged"
    for name in TABLES:
        assert a[name] == b[name], f"{name}: streamed rows differ from the serial order's"
    assert max(t_counts.values()) == 1  # no prompt paid twice, a prefetched call included
    steps = sorted(table("steps", RUN, t_home), key=lambda r: r["step"])
    serial_steps = table("steps", RUN, s_home)
    assert all(r["prefetched_calls"] is None for r in serial_steps)
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
            during = [t for t, role in arrivals if start <= t < end and role == "pairwise" or
                      start <= t < end and role == "induction"]
            assert bool(during) == streamed, (mode, step, len(during))
