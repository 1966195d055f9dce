"""ARBOR's baselines as its paper ran them: DAPO dropping outcome-homogeneous groups without
refill or clip-higher (§4.1, B.2), RaR-style shaped with lambda alone (App. C.3), and ``arbor compare``'s rollouts
per step beside each method, from stored rows written by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from flow_support import OneJudgeStep

from arbor.config import ArborConfig, load_config
from arbor.config.judge import JudgeConfig
from arbor.flows.compare import PAPER_BASELINES, plan_compare
from arbor.llm import make_judge
from arbor.storage.parquet import write_stage
from arbor.storage.sql import run_file
from arbor.tasks.env.datasets import Question
from arbor.tasks.methods.dapo import DAPO
from arbor.tasks.methods.rar.method import RaR
from arbor.types import Trajectory

Q = "Who directed the film Ed Wood starring Johnny Depp?"


def cfg(**sections: dict[str, Any]) -> ArborConfig:
    return ArborConfig.model_validate(sections)


# ---- DAPO --------------------------------------------------------------------------------------------------------
class Engine:
    """The rollout engine the refill asks for fresh groups: every group it rolls out has rewards 0 and 1."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def generate_groups(self, qs: list[Question], k: int, seed: int, step: int, run_id: str,
                        first_group: int) -> list[Trajectory]:
        self.asked += [q.question_id for q in qs]
        return [Trajectory(run_id, step, first_group + g, s, q.question_id, q.question, q.golds, base_reward=float(s % 2),
                           f1=float(s % 2), format_valid=True) for g, q in enumerate(qs) for s in range(k)]


class Run:
    """What DAPO's refill reads of a run (``tasks.methods.base.StepResources``)."""

    def __init__(self) -> None:
        self.engine, self.seed, self.run_id = Engine(), 0, "r"
        self.questions = [Question(f"q{i}", f"question {i}?", ["a"]) for i in range(10)]

    def groups(self, ts: list[Trajectory]) -> list[list[Trajectory]]:
        return [[t for t in ts if t.group == g] for g in sorted({t.group for t in ts})]


def batch_of(rewards: list[list[float]]) -> list[Trajectory]:
    return [Trajectory("r", 1, g, s, f"q{g}", f"question {g}?", ["a"], base_reward=r, f1=r, format_valid=True)
            for g, rs in enumerate(rewards) for s, r in enumerate(rs)]


def test_arbor_papers_dapo_drops_homogeneous_groups_without_refill_or_clip_higher() -> None:
    """§4.1: "DAPO ..., which discards outcome-homogeneous query-groups from policy updates"; B.2: "symmetric
    clipping with eps_clip = 0.2". Two of three groups are homogeneous: both variants drop them; only DAPO's own
    rolls out two fresh prompts to refill the batch, and only it clips at 0.28 above."""
    rewards = [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]
    flat, groups = [r for rs in rewards for r in rs], [g for g, rs in enumerate(rewards) for _ in rs]
    base = {"run": {"method": "dapo"}, "rollout": {"k": 2, "batch_size": 3}}
    paper, own = DAPO(cfg(**base, train={"dapo_variant": "arbor-paper"})), DAPO(cfg(**base))
    for m in (paper, own):
        assert m.select_groups(flat, groups) == ([2, 3], {"dapo_kept_groups": 1.0})
    run = Run()
    assert paper.extra_rollouts(run, 1, run.questions[:3], batch_of(rewards)) == [] and run.engine.asked == []
    extra = own.extra_rollouts(run, 1, run.questions[:3], batch_of(rewards))
    assert len(run.engine.asked) == 2 and len(extra) == 4 and not set(run.engine.asked) & {"q0", "q1", "q2"}
    assert paper.loss_settings(paper.cfg.train).eps_clip_high == 0.2
    assert own.loss_settings(own.cfg.train).eps_clip_high == 0.28


# ---- RaR ---------------------------------------------------------------------------------------------------------
GOOD = ("<think>x</think>\n<search>Ed Wood Johnny Depp</search>\n<result>Ed Wood was directed by Tim Burton."
        "</result>\n<answer>\\boxed{Tim Burton}</answer>")
BAD = ("<search>film</search><result>A film.</result><search>film</search><result>A film.</result>"
       "<answer>\\boxed{Orson Welles}</answer>")


@pytest.mark.parametrize(("attenuate", "low"), [(False, -0.1 * 7 / 18), (True, -0.25 * 0.1 * 7 / 18)])
def test_rar_adds_its_centred_rating_with_the_shaping_coefficient_alone(tmp_path: Path, attenuate: bool,
                                                                        low: float) -> None:
    """App. C.3: the 1-10 rating "normalize[d] to [0, 1], center[ed] within the rollout group, and add[ed] to the
    base F1/format reward with the same shaping coefficient as ARBOR". The rules judge rates GOOD 10 and BAD 3
    (tests/test_judge_rules.py::test_rar_roles): scores 1 and 2/9, mean 11/18, centred +7/18 and -7/18; lambda 0.1.
    GOOD: 1 + 0.1 * 7/18 = 1.03889; BAD: 0 - 0.1 * 7/18 = -0.03889, or with alpha 0.25: -0.00972."""
    c = cfg(run={"method": "rar"}, memory={"rar_attenuate": attenuate})
    trajs = [Trajectory("r", 1, 0, s, "q", Q, ["Tim Burton"], text=text, f1=f1, base_reward=f1, format_valid=True)
             for s, (text, f1) in enumerate([(GOOD, 1.0), (BAD, 0.0)])]
    RaR(c).shape(OneJudgeStep(make_judge(JudgeConfig(backend="rules"), home=tmp_path)), 1, trajs)
    assert trajs[0].shaped_reward == pytest.approx(1.0 + 0.1 * 7 / 18, abs=1e-12)
    assert trajs[1].shaped_reward == pytest.approx(low, abs=1e-12)


# ---- which rows follow which paper ---------------------------------------------------------------------------------
def test_the_arbor_profiles_and_compare_run_arbors_baselines_and_tiny_keeps_its_own() -> None:
    for p in ("qwen3-4b", "qwen3-8b", "qwen3-14b"):
        c = load_config(p)
        assert (c.train.dapo_variant, c.memory.rar_attenuate) == ("arbor-paper", False), p
    for p in ("tiny-cpu", "tiny-world", "smol-world"):  # arbor train's rows there are unchanged
        c = load_config(p)
        assert (c.train.dapo_variant, c.memory.rar_attenuate) == ("dapo-paper", True), p
    plan = plan_compare(["dapo", "rar"], "tiny-cpu")
    assert all(sets.items() >= PAPER_BASELINES.items() for sets in plan.values())
    own = plan_compare(["dapo"], "tiny-cpu", {"train.dapo_variant": "dapo-paper"})  # a --set wins
    assert own["dapo"]["train.dapo_variant"] == "dapo-paper"


# ---- compare's table ---------------------------------------------------------------------------------------------
def test_compare_reports_rollouts_per_step(tmp_path: Path) -> None:
    """Hand-built runs of two steps, K = 4, two prompts a step: GRPO rolls out 8 a step; DAPO's own refill adds
    one group (4) at step 1 and two (8) at step 2, (12 + 16) / 2 = 14 a step; ARBOR's DAPO 8. A stored step 3 of
    DAPO without its steps row (not committed) does not count."""
    per_step = {"grpo": [8, 8], "dapo": [12, 16], "dapo-arbor": [8, 8]}
    for run_id, counts in per_step.items():
        method = "grpo" if run_id == "grpo" else "dapo"
        write_stage("runs", [{"profile": "tiny-cpu", "method": method, "seed": 0}], run_id=run_id, step=0,
                    stage="start", home=tmp_path)
        for step, n in enumerate(counts + ([4] if run_id == "dapo" else []), start=1):
            rows = [{"traj_id": f"{run_id}-{step}-{i}", "group": i // 4, "sample": i % 4, "base_reward": 0.5,
                     "shaped_reward": 0.5, "format_valid": True, "f1": 0.5} for i in range(n)]
            write_stage("trajectories", rows, run_id=run_id, step=step, stage="shape", home=tmp_path)
            if step <= len(counts):
                write_stage("steps", [{"mean_base_reward": 0.5, "mean_total_reward": 0.5, "judge_calls": 0}],
                            run_id=run_id, step=step, stage="train", home=tmp_path)
    got = {r["run_id"]: r["rollouts_per_step"] for r in
           run_file("compare_runs", {"run_ids": list(per_step)}, home=tmp_path)}
    assert got == {"grpo": 8.0, "dapo": 14.0, "dapo-arbor": 8.0}
