"""DAPO's dynamic sampling and overlong punishment are DAPO's (``tasks/methods/dapo/``), the update
and the step name no method, and the step gets Co-ReAct's guide as a typed field rather than from the engine."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from arbor.config import load_config
from arbor.tasks.env.datasets import Question
from arbor.tasks.methods import make_method
from arbor.tasks.methods.dapo import DAPO
from arbor.tasks.training.update import policy_update
from arbor.types import Trajectory


def traj(group: int, sample: int, reward: float, n_tokens: int, step: int = 1) -> Trajectory:
    return Trajectory(run_id="r", step=step, group=group, sample=sample, question_id=f"q{group}", question="?",
                      golds=["a"], prompt_ids=[1, 2], response_ids=[3] * n_tokens, loss_mask=[1] * n_tokens,
                      rollout_logprobs=[-1.0] * n_tokens, base_reward=reward, format_valid=True, f1=reward)


# group 0: R_base = 1 for all four, responses of 6..9 tokens; group 1: R_base = 0, all 6 tokens
BATCH = [traj(0, s, 1.0, 6 + s) for s in range(4)] + [traj(1, s, 0.0, 6) for s in range(4)]
OVERLONG = {"run.run_id": "r", "train.overlong_penalty": True, "train.overlong_buffer": 4,
            "rollout.max_response_tokens": 10}


def test_dapo_overlong_punishment_reaches_the_update_before_the_group_filter() -> None:
    # L_max 10, L_cache 4: lengths 6, 7, 8, 9 get 0, -1/4, -2/4, -3/4 (eq. 13), so group 0's rewards differ
    # (1, 0.75, 0.5, 0.25) and dynamic sampling keeps it; group 1 stays homogeneous and is dropped
    cfg = load_config("tiny-cpu", {**OVERLONG, "run.method": "dapo"})
    u = policy_update(BATCH, 1, cfg.train, cfg.run.overlap, make_method(cfg), source="dapo")
    assert [t.group for t in u.trajectories] == [0, 0, 0, 0]
    assert u.metrics["dropped_groups"] == 1.0 and u.metrics["zero_var_groups"] == 1.0
    # A_i = (R_i - 0.625) / (sample std + 1e-6); sample std = sqrt((2 * 0.375^2 + 2 * 0.125^2) / 3) = 0.3227486
    std = ((2 * 0.375**2 + 2 * 0.125**2) / 3) ** 0.5
    want = [(r - 0.625) / (std + 1e-6) for r in (1.0, 0.75, 0.5, 0.25)]
    assert [float(a[0]) for a in u.advantages] == pytest.approx(want, rel=1e-6)


def test_the_overlong_punishment_is_dapos_alone_and_any_rules_drops_are_counted() -> None:
    # plain GRPO under the same settings trains on R_i as shaped (no punishment): both groups homogeneous,
    # advantage 0 everywhere, nothing dropped (GRPO keeps every group)
    cfg = load_config("tiny-cpu", {**OVERLONG, "run.method": "grpo"})
    u = policy_update(BATCH, 1, cfg.train, cfg.run.overlap, make_method(cfg), source="grpo")
    assert len(u.trajectories) == 8 and u.metrics["dropped_groups"] == 0.0
    assert all(float(a.abs().max()) == 0.0 for a in u.advantages)
    # DAPO without the punishment drops both homogeneous groups, counted by the update, not by DAPO's own metric
    cfg = load_config("tiny-cpu", {"run.run_id": "r", "run.method": "dapo"})
    u = policy_update(BATCH, 1, cfg.train, cfg.run.overlap, make_method(cfg), source="dapo")
    assert u.trajectories == [] and u.metrics["dropped_groups"] == 2.0
    assert "dapo_dropped_groups" not in u.metrics


class Guide:
    """A rollout guide (``tasks.env.rollout_driver.RolloutGuide``) that records what the step asked of it."""

    def __init__(self) -> None:
        self.contexts: list[tuple[Any, dict[str, Any]]] = []

    def run(self, engine: Any, states: Any, keys: Any) -> None:
        raise AssertionError("the engine below does its own turns")

    def set_context(self, ctx: Any, **columns: Any) -> None:
        self.contexts.append((ctx, columns))

    def drain_records(self) -> list[dict[str, Any]]:
        return [{"turn": len(self.contexts)}]


class Engine:
    """A user's engine with no ``guide`` attribute of its own: the step gives it the run's guide."""

    def generate_groups(self, questions: list[Question], k: int, seed: int, step: int, run_id: str = "",
                        first_group: int = 0) -> list[Trajectory]:
        return [traj(g, s, float(s % 2), 6, step) for g in range(len(questions)) for s in range(k)]


def test_the_step_hands_its_typed_guide_to_the_engine_and_stores_its_records(tmp_path: Path) -> None:
    from arbor.tasks.stage_store import StageStore
    from arbor.tasks.step import RunState

    cfg = load_config("tiny-cpu", {"run.run_id": "r", "rollout.batch_size": 2, "rollout.k": 2})
    questions = [Question(f"q{i}", "?", ["a"]) for i in range(2)]
    guide, engine = Guide(), Engine()
    state = RunState(cfg=cfg, run_id="r", home=tmp_path, store=StageStore("r", tmp_path), questions=questions,
                     engine=engine, trainer=SimpleNamespace(), judge=SimpleNamespace(drain_calls=lambda: []),
                     embed=None, guide=guide)  # type: ignore[arg-type]
    assert engine.guide is guide  # type: ignore[attr-defined]
    out = state.rollout(1)
    assert out["guided_steps"] == [{"turn": 1}]
    ((ctx, columns),) = guide.contexts
    assert (ctx.run_id, ctx.step, ctx.stage) == ("r", 1, "rollout") and columns == {"run_id": "r", "step": 1}
    assert len(out["rollouts"]) == 4


def test_a_switch_only_dapo_reads_is_refused_under_another_method() -> None:
    """The update no longer applies the overlong punishment for any method, so turning it on under GRPO would do
    nothing: preflight's requirement check refuses it (a DAPO subclass, e.g. a user's plug-in, may set it)."""
    from arbor.config import ArborConfig
    from arbor.tasks.methods import requirement_problems

    on = {"train": {"overlong_penalty": True}}
    assert requirement_problems(ArborConfig.model_validate({**on, "run": {"method": "dapo"}})) == []
    assert requirement_problems(ArborConfig.model_validate({**on, "run": {"method": "grpo"}})) == [
        "train.overlong_penalty: only run.method=dapo (or a subclass) reads it; run.method=grpo would ignore it"]
    assert requirement_problems(ArborConfig.model_validate({"run": {"method": "grpo"}})) == []
    plugin = {**on, "run": {"method": "tests.test_method_blind:MyDAPO"}}
    assert requirement_problems(ArborConfig.model_validate(plugin)) == []


class MyDAPO(DAPO):  # a user's DAPO plug-in, named by import path above
    name = "my-dapo"


def test_the_steps_judge_cost_does_not_depend_on_the_ledgers_order() -> None:
    """Concurrent judge calls finish (and are ledgered) in any order; the steps row's judge_cost_usd must not change
    with it: sum() gives 0.6000000000000001 for (0.1, 0.2, 0.3) and 0.6 reversed, the exact sum 0.6 for both."""
    from arbor.tasks.step import judge_cost

    calls = [{"cost_usd": 0.1}, {"cost_usd": 0.2}, {"cost_usd": 0.3}, {"cost_usd": None}]
    assert judge_cost(calls) == judge_cost(calls[::-1]) == 0.6


def test_the_cost_cap_reads_the_stored_ledger_summed_exactly(tmp_path) -> None:
    """``judge.cost_cap_usd`` compares the run's stored spend (every committed stage's ledger) with the cap: the same
    exact sum as the steps row's, so (0.1, 0.2, 0.3) over two stages is 0.6, not sum()'s 0.6000000000000001."""
    from types import SimpleNamespace

    from arbor.storage.parquet import write_stage
    from arbor.tasks.step import RunState

    write_stage("judge_calls", [{"role": "pairwise", "cost_usd": 0.1}, {"role": "pairwise", "cost_usd": 0.2}],
                run_id="r", step=1, stage="score", home=tmp_path)
    write_stage("judge_calls", [{"role": "induction", "cost_usd": 0.3}, {"role": "induction", "cost_usd": None}],
                run_id="r", step=2, stage="induce", home=tmp_path)
    assert RunState.judge_cost_so_far(SimpleNamespace(run_id="r", home=tmp_path)) == 0.6  # type: ignore[arg-type]
