"""ARCO through the real flow, offline: the rules teacher labels the warm-up step, the rubric model mu
writes criteria and scores every turn, its update runs on DeepSpeed beside the policy's and is checkpointed with
it; the dense phase trains the policy on per-turn advantages. A SIGKILL in the middle of step 3's scoring, with no
checkpoint yet, resumes to exactly the reference run's numbers (mu rebuilt by replaying its stored updates)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from flow_support import table, tiny_overrides, train_until_killed

from arbor.format import turn_spans
from arbor.tasks.methods.arco import equations as arco

pytestmark = pytest.mark.slow

RUN = "arco"


def _overrides(start: Path, **extra: object) -> dict:
    """Three steps of 2 prompts x 4: step 1 the teacher warm-up, step 2 decomposition (sparse), step 3 dense."""
    return {**tiny_overrides(start), "run.method": "arco", "run.steps": 3, "rollout.batch_size": 2,
            "rollout.max_new_tokens_per_turn": 64, "rollout.max_response_tokens": 256,
            "arco.warmup_steps": 1, "arco.dense_start_step": 3, "arco.max_criteria_tokens": 24,
            "arco.lr": 1e-3, "arco.head_lr": 1e-3, "checkpoint.every": 5, **extra}


def _train(home: Path, overrides: dict, resume: bool = False) -> None:
    from arbor.flows.train import arbor_train

    os.environ["ARBOR_HOME"] = str(home)
    arbor_train(profile="tiny-cpu", overrides=overrides, run_id=RUN, resume=resume)


def _stored(home: Path) -> tuple:
    key = lambda r: (r["step"], r["traj_id"], r["turn"])  # noqa: E731
    scores = [(r["step"], r["traj_id"], r["turn"], r["criteria"], [round(x, 6) for x in r["scores"]])
              for r in sorted(table("mu_scores", RUN, home), key=key)]
    advs = [(r["step"], r["traj_id"], r["turn"], round(r["advantage"], 6))
            for r in sorted(table("turn_advantages", RUN, home), key=key)]
    updates = [(r["step"], r["phase"], round(r["loss"], 6)) for r in sorted(table("mu_updates", RUN, home),
                                                                              key=lambda r: r["step"])]
    steps = [(r["step"], round(r["loss"], 6), round(r["mu_loss"], 6)) for r in sorted(table("steps", RUN, home),
                                                                                    key=lambda r: r["step"])]
    return scores, advs, updates, steps


@pytest.fixture(scope="module")
def reference(sft_policy: Path, prefect_harness, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("arco_ref")
    _train(home, _overrides(sft_policy))
    return home


def test_arco_scores_turns_teaches_mu_and_trains_on_turn_credit(reference: Path) -> None:
    home = reference
    trajs = {t["traj_id"]: t for t in table("trajectories", RUN, home)}
    scores = table("mu_scores", RUN, home)
    assert len(trajs) == 3 * 2 * 4
    for tid, t in trajs.items():  # the turns are the policy's loss-mask runs, in order
        mine = sorted((r for r in scores if r["traj_id"] == tid), key=lambda r: r["turn"])
        assert [(r["token_start"], r["token_end"]) for r in mine] == turn_spans(t["loss_mask"])
        assert [r["bucket"] for r in mine] == arco.step_buckets([r["kind"] for r in mine])
        assert all(len(r["scores"]) == 3 and r["step_score"] == pytest.approx(sum(r["scores"]) / 3) for r in mine)
        assert t["shaped_reward"] == t["base_reward"] and t["stage_starts"] == [r["token_start"] for r in mine]
    # the warm-up step only: the teacher's labels, projected so that a trajectory's step means add up to R
    taught = [r for r in scores if r["teacher_projected"] is not None]
    assert taught and {r["step"] for r in taught} == {1}
    for tid in {r["traj_id"] for r in taught}:
        mine = [r for r in taught if r["traj_id"] == tid]
        target = max(-len(mine), min(len(mine), mine[0]["outcome"]))
        assert sum(sum(r["teacher_projected"]) / 3 for r in mine) == pytest.approx(target, abs=1e-6)
    calls = table("judge_calls", RUN, home)
    assert {c["role"] for c in calls} == {"step_labels"} and {c["step"] for c in calls} == {1}  # no judge later
    # mu's updates: warm-up, then the decomposition loss; its loss is in the steps rows
    updates = sorted(table("mu_updates", RUN, home), key=lambda r: r["step"])
    assert [u["phase"] for u in updates] == ["warmup", "decomposition", "decomposition"]
    assert updates[0]["lm"] > 0 and updates[0]["mse"] is not None and updates[1]["kl"] is not None
    steps = sorted(table("steps", RUN, home), key=lambda r: r["step"])
    assert [s["mu_loss"] for s in steps] == pytest.approx([u["loss"] for u in updates])
    assert [u["mu_version_before"] for u in updates] == [0, 1, 2]
    # credit: sparse steps carry R - group mean on every turn; the dense step c (G_t - b_bucket)
    advs = table("turn_advantages", RUN, home)
    assert {(r["step"], r["phase"]) for r in advs} == {(1, "sparse"), (2, "sparse"), (3, "dense")}
    dense = [r for r in advs if r["step"] == 3]
    for r in dense:
        assert r["advantage"] == pytest.approx(0.5 * (r["reward_to_go"] - r["baseline"]))
    for r in (r for r in advs if r["step"] == 2):
        group = [trajs[x["traj_id"]]["base_reward"] for x in advs if x["step"] == 2 and x["group"] == r["group"]
                 and x["turn"] == 0]
        assert r["advantage"] == pytest.approx(r["outcome"] - sum(group) / len(group))
    # checkpoints every 5 steps and at the run's last: step 3 only, mu's beside the policy's
    root = home / "checkpoints" / RUN
    assert sorted(p.name for p in (root / "mu").iterdir()) == ["step_000003"]
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000003"]


def test_report_draws_mu_calibration_and_turn_advantages(reference: Path, tmp_path: Path) -> None:
    from arbor.tasks.reporting.report import build_report

    paths = build_report(RUN, reference, tmp_path / "report")
    assert paths.figures["mu_calibration"].stat().st_size > 0 and paths.figures["turn_advantages"].stat().st_size > 0
    md = paths.markdown.read_text()
    assert "## ARCO: the rubric model's calibration" in md and "from mu_calibration" in md
    rows = [line for line in md.splitlines() if line.startswith("| 1 | ") or line.startswith("| 3 | ")]
    assert rows  # one row per (step, outcome class) of the calibration table


def test_resume_after_sigkill_mid_scoring_replays_mu(reference: Path, sft_policy: Path, tmp_path: Path,
                                                     prefect_harness) -> None:
    home = tmp_path / "home"
    o = _overrides(sft_policy)
    train_until_killed(home, RUN, o, "3:score:kill-mid", tmp_path / "killed.log")
    assert not any(s["stage"] == "score" and s["step"] == 3 for s in table("stage_runs", RUN, home))
    _train(home, o, resume=True)  # mu: no checkpoint, so both stored updates are replayed before step 3 scores
    assert _stored(home) == _stored(reference)


def test_mu_checkpoints_follow_the_policys(sft_policy: Path, tmp_path: Path, prefect_harness) -> None:
    """With a checkpoint every step and keep_last 1, mu keeps its last checkpoint beside the policy's; a resumed
    run that finds both complete loads them instead of replaying. Two steps of one prompt x 2: what is checked is
    where the checkpoints are and that mu's criteria are the static text, not what the steps learn."""
    home = tmp_path / "home"
    o = _overrides(sft_policy, **{"run.steps": 2, "rollout.batch_size": 1, "rollout.k": 2, "checkpoint.every": 1,
                                  "checkpoint.keep_last": 1, "arco.criteria": "static"})
    _train(home, o)
    root = home / "checkpoints" / RUN
    assert sorted(p.name for p in (root / "mu").iterdir()) == ["step_000002"]
    assert "step_000002" in {p.name for p in root.iterdir()}
    rows = table("mu_scores", RUN, home)
    static = {r["criteria"] for r in rows}
    assert len(static) == 1 and "criteria" in next(iter(static))  # the fixed text, never generated
