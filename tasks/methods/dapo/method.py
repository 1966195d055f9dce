"""DAPO (Yu et al., 2025) as a baseline, in two variants (``train.dapo_variant``).

dapo-paper, DAPO's own (the method's default): clip-higher and dynamic sampling on the outcome reward.
    eps_high = train.dapo_eps_clip_high (0.28)                       (§3.1, clip-higher: ``loss_settings``)
    drop groups with max R - min R <= tol from the update            (§3.2, dynamic sampling: ``select_groups``)
    optionally re-sample fresh prompts until batch_size groups have variance (train.dapo_oversample:
                                                                      ``extra_rollouts``)
    R_i + R_length(|o_i|) when train.overlong_penalty is on          (§3.4, eq. 13: ``update_rewards``)
arbor-paper, the baseline of ARBOR §4.1 ("DAPO ..., which discards outcome-homogeneous query-groups from policy
updates"): the same drop, no refill (the step trains on what its batch rolled out, as GRPO and ARBOR do) and the
run's clip (B.2: "symmetric clipping with eps_clip = 0.2"); the overlong punishment only when configured.

The equations are ``equations.py``'s; this class only wires them into the method hooks (``tasks.methods.base``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from arbor.config.train import TrainConfig
from arbor.storage.schemas import I64, TableSet, col
from arbor.tasks.env.datasets import Question, resample_questions
from arbor.tasks.methods.base import Method, StepResources
from arbor.tasks.methods.dapo.equations import (
    dynamic_sampling_filter,
    dynamic_sampling_refill,
    overlong_penalty,
)
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
        if not self.cfg.train.dapo_oversample or self.arbor_paper:
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

    @property
    def arbor_paper(self) -> bool:
        """ARBOR §4.1's DAPO: drop, no refill, no clip-higher (``train.dapo_variant``)."""
        return self.cfg.train.dapo_variant == "arbor-paper"

    def loss_settings(self, train: TrainConfig) -> LossSettings:
        """Clip-higher (§3.1) under dapo-paper; the run's clip under arbor-paper."""
        if train.dapo_variant == "arbor-paper":
            return super().loss_settings(train)
        return replace(super().loss_settings(train), eps_clip_high=train.dapo_eps_clip_high)

    def update_rewards(self, batch: Sequence[Trajectory], train: TrainConfig) -> list[float]:
        """R_i plus the soft overlong punishment (eq. 13) when ``train.overlong_penalty`` is on: L = the response's
        tokens (tool results included: what ``rollout.max_response_tokens`` = L_max bounds), L_cache =
        ``train.overlong_buffer``."""
        rewards = super().update_rewards(batch, train)
        if not train.overlong_penalty:
            return rewards
        max_len = self.cfg.rollout.max_response_tokens
        return [r + overlong_penalty(len(t.response_ids), max_len, train.overlong_buffer)
                for r, t in zip(rewards, batch, strict=True)]

    def select_groups(self, rewards: Sequence[float], groups: Sequence[int]) -> tuple[list[int], dict[str, float]]:
        """Dynamic sampling's filter (§3.2): only the groups whose rewards differ are trained on (the update counts
        the dropped ones in ``steps.dropped_groups``)."""
        keep, _ = dynamic_sampling_filter(rewards, groups)
        return keep, {"dapo_kept_groups": float(len({groups[i] for i in keep}))}

    def step_metrics(self, run: StepResources, step: int, train_metrics: dict[str, float]) -> dict[str, float | None]:
        if "dapo_kept_groups" not in train_metrics:
            return {"dapo_shortfall": None}
        return {"dapo_shortfall": max(0, self.cfg.rollout.batch_size - int(train_metrics["dapo_kept_groups"]))}
