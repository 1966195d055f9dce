"""DAPO (Yu et al., 2025) as the paper's baseline: clip-higher and dynamic sampling on the outcome reward.

    eps_high = train.dapo_eps_clip_high (0.28)                       (§3.1, clip-higher)
    drop groups with max R - min R <= tol from the update            (§3.2, dynamic sampling)
    optionally re-sample fresh prompts until batch_size groups have variance (train.dapo_oversample)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from arbor.config.train import TrainConfig
from arbor.storage.schemas import I64, TableSet, col
from arbor.tasks.env.datasets import Question, resample_questions
from arbor.tasks.methods.base import Method, StepResources
from arbor.tasks.training.losses import dynamic_sampling_filter, dynamic_sampling_refill
from arbor.types import LossSettings, Trajectory


class DAPO(Method):
    name = "dapo"
    # groups with reward variance DAPO still lacked after its resampling rounds (null for other methods)
    tables = TableSet(owner="dapo", step_columns=(col("dapo_shortfall", I64),))

    def extra_rollouts(self, run: StepResources, step: int, batch: list[Question],
                       trajs: list[Trajectory]) -> list[Trajectory]:
        """Dynamic sampling (§3.2): while fewer than ``batch_size`` groups have reward variance, roll out groups for
        as many fresh prompts as are missing, for at most ``train.dapo_max_resample_rounds`` rounds. Every sampled
        group is stored (Table 2 counts them); the trainer drops the zero-variance ones and the step row records
        the shortfall. The extra groups are numbered after the batch's."""
        if not self.cfg.train.dapo_oversample:
            return []
        k = self.cfg.rollout.k
        extra: list[Trajectory] = []
        used = {q.question_id for q in batch}
        rounds = [0]

        def resample(n: int) -> list[list[float]]:
            rounds[0] += 1
            qs = resample_questions(run.questions, run.seed, step, rounds[0], n, used)
            used.update(q.question_id for q in qs)
            new = run.engine.generate_groups(qs, k, run.seed, step, run_id=run.run_id,
                                             first_group=len(batch) + len(extra) // k)
            extra.extend(new)
            return [[t.base_reward for t in g] for g in run.groups(new)]

        dynamic_sampling_refill([[t.base_reward for t in g] for g in run.groups(trajs)], len(batch), resample,
                                max_rounds=self.cfg.train.dapo_max_resample_rounds)
        return extra

    def loss_settings(self, train: TrainConfig) -> LossSettings:
        return replace(super().loss_settings(train), eps_clip_high=train.dapo_eps_clip_high)

    def select_groups(self, rewards: Sequence[float], groups: Sequence[int]) -> tuple[list[int], dict[str, float]]:
        keep, dropped = dynamic_sampling_filter(rewards, groups)
        return keep, {"dapo_dropped_groups": float(dropped),
                      "dapo_kept_groups": float(len({groups[i] for i in keep}))}

    def step_metrics(self, run: StepResources, step: int, train_metrics: dict[str, float]) -> dict[str, float | None]:
        if "dapo_kept_groups" not in train_metrics:
            return {"dapo_shortfall": None}
        return {"dapo_shortfall": max(0, self.cfg.rollout.batch_size - int(train_metrics["dapo_kept_groups"]))}
