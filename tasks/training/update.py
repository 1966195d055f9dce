"""What the trainer updates on, decided by the controller (paper App. B.2).

verl's single controller computes advantages, group selection and KL coefficients and sends its workers tensors;
arbor does the same. ``policy_update`` turns a step's shaped trajectories into an ``UpdateBatch``:

  1. R_i per trajectory (an ``UpdateRule``'s ``update_rewards``; GRPO: the shaped reward (eq. 4) when shaping ran,
     else the base reward; DAPO adds its soft overlong punishment);
  2. the trajectories to keep (``select_groups``: DAPO drops zero-variance groups), and how many groups that drops;
  3. one advantage per response token (``token_advantages``; GRPO: A_i of ``group_advantages`` on every token);
  4. the KL coefficient of this update (``kl_coef_at``) and how many policy versions behind the trainer each
     trajectory is (``policy_lag``, plus the run's overlap);
  5. each trajectory's update phase (``update_phase``; RubricEM: its reflections before the task batch, Alg. 1
     lines 10 and 29) and the temperature its tokens are scored at (``scoring_temperature``).

The trainer (``tasks.training.train``) only checks and applies it: it imports no method and builds none, and this
module names none. An ``UpdateRule`` is anything with the seven decisions below, a training method
(``tasks.methods.base.Method``) among them; ``GRPO_RULE`` is plain GRPO, which Co-ReAct's generator training and the
trainer's tests use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from torch import Tensor

from arbor.config.train import TrainConfig
from arbor.tasks.training.losses import group_advantages, zero_variance_groups
from arbor.types import LossSettings, Trajectory, UpdateBatch


class UpdateRule(Protocol):
    """The decisions of a policy update a method makes (``tasks.methods.base.Method`` implements them)."""

    def update_rewards(self, batch: Sequence[Trajectory], train: TrainConfig) -> list[float]: ...

    def policy_lag(self, t: Trajectory) -> int: ...

    def kl_coef_at(self, step: int, train: TrainConfig) -> float: ...

    def select_groups(self, rewards: Sequence[float], groups: Sequence[int]) -> tuple[list[int], dict[str, float]]:
        ...

    def token_advantages(self, batch: Sequence[Trajectory], rewards: Sequence[float], groups: Sequence[int],
                         train: TrainConfig) -> list[Tensor]: ...

    def update_phase(self, t: Trajectory) -> int: ...

    def scoring_temperature(self, t: Trajectory) -> float | None: ...


def reward_of(t: Trajectory) -> float:
    """R_i: the shaped reward (eq. 4) when shaping ran, else the base reward."""
    return float(t.shaped_reward if t.shaped_reward is not None else t.base_reward)


def grpo_token_advantages(batch: Sequence[Trajectory], rewards: Sequence[float], groups: Sequence[int],
                          train: TrainConfig) -> list[Tensor]:
    """GRPO: A_i = (R_i - mean_g) / (std_g + eps) on every response token of trajectory i (App. B.2)."""
    adv = group_advantages(rewards, groups, norm=train.adv_norm, eps=train.adv_eps)
    return [adv[i].expand(len(t.response_ids)) for i, t in enumerate(batch)]


class GRPORule:
    """Plain GRPO's decisions: on-policy, every group kept, the configured KL coefficient every step. The
    defaults of every training method (``tasks.methods.base.Method`` inherits them)."""

    def update_rewards(self, batch: Sequence[Trajectory], train: TrainConfig) -> list[float]:
        """R_i of each trajectory, the reward its group advantage is computed from (default: ``reward_of``; DAPO
        adds its overlong punishment)."""
        return [reward_of(t) for t in batch]

    def policy_lag(self, t: Trajectory) -> int:
        """How many steps before the one it is trained in ``t`` was sampled (default 0: on-policy; RubricEM's
        reflections: 1). The trainer refuses a trajectory whose policy version does not match."""
        return 0

    def kl_coef_at(self, step: int, train: TrainConfig) -> float:
        return train.kl_coef

    def select_groups(self, rewards: Sequence[float], groups: Sequence[int]) -> tuple[list[int], dict[str, float]]:
        """Indices of the trajectories to train on, and metrics about the choice (default: all)."""
        return list(range(len(rewards))), {}

    def token_advantages(self, batch: Sequence[Trajectory], rewards: Sequence[float], groups: Sequence[int],
                         train: TrainConfig) -> list[Tensor]:
        """One advantage per response token of each trajectory (masked tokens are ignored by the loss).
        GRPO: A_i = (R_i - mean_g) / (std_g + eps) on every token (App. B.2)."""
        return grpo_token_advantages(batch, rewards, groups, train)

    def update_phase(self, t: Trajectory) -> int:
        """The phase of the step's update ``t`` is trained in (default 0: one phase, one token-mean over the whole
        batch). Phases run in ascending order, each with its own pi_old, token-mean and optimiser steps."""
        return 0

    def scoring_temperature(self, t: Trajectory) -> float | None:
        """The temperature ``t``'s tokens are scored at (pi_old, pi_theta); None: the trainer's, the rollout
        temperature. A trajectory sampled at another temperature names it here, so that TIS weighs only the
        staleness and not the temperature (RubricEM's reflections)."""
        return None


GRPO_RULE = GRPORule()


def overlap_lag(overlap: str, step: int) -> int:
    """Versions the rollouts of ``step`` lag the trainer: under ``run.overlap=one-step`` step N's rollouts
    (N >= 2) were sampled with policy N-2 while step N-1 trained, one version behind; on-policy: none."""
    return 1 if overlap == "one-step" and step >= 2 else 0


def check_token_advantages(batch: Sequence[Trajectory], adv: Sequence[Tensor], source: str) -> None:
    """``token_advantages`` must give one value per response token of every trajectory."""
    if len(adv) != len(batch):
        raise ValueError(f"{source}: token_advantages returned {len(adv)} vectors for {len(batch)} trajectories")
    for t, a in zip(batch, adv, strict=True):
        if a.ndim != 1 or a.shape[0] != len(t.response_ids):
            raise ValueError(f"{source}: token_advantages for {t.traj_id} has shape {tuple(a.shape)}, "
                             f"expected ({len(t.response_ids)},): one advantage per response token")


def policy_update(batch: Sequence[Trajectory], step: int, train: TrainConfig, overlap: str,
                  rule: UpdateRule = GRPO_RULE, source: str = "grpo") -> UpdateBatch:
    """The ``UpdateBatch`` of ``step`` for ``batch`` under ``rule`` (module docstring), with the ``train`` section's
    settings; ``overlap`` (``run.overlap``) sets how far the step's own rollouts lag; ``source`` names the rule in
    errors (``run.method``)."""
    if not batch:
        raise ValueError(f"step {step}: empty batch")
    tc = train
    behind = []
    for t in batch:
        # a method may train on trajectories sampled ``lag`` steps earlier (RubricEM's reflections, App. D.2): they
        # carry that step's version, and TIS weighs them by pi_old / pi_behaviour
        lag = rule.policy_lag(t)
        if lag and t.step != step - lag:
            raise AssertionError(f"step {step}: trajectory {t.traj_id} of step {t.step} was generated by policy "
                                 f"version {t.policy_version}; {source} trains it {lag} step(s) late, at step "
                                 f"{t.step + lag}")
        behind.append(lag + (overlap_lag(overlap, step) if t.step == step else 0))
    rewards = rule.update_rewards(batch, tc)
    if len(rewards) != len(batch):
        raise ValueError(f"method {source}: update_rewards returned {len(rewards)} rewards for {len(batch)} "
                         "trajectories")
    groups = [t.group for t in batch]
    metrics = {"n_groups": float(len(set(groups))), "zero_var_groups": float(len(zero_variance_groups(rewards, groups)))}
    keep, chosen = rule.select_groups(rewards, groups)
    metrics["dropped_groups"] = metrics["n_groups"] - len({groups[i] for i in keep})  # the steps row's column
    metrics.update(chosen)
    kept = [batch[i] for i in keep]
    adv: list[Tensor] = []
    if kept:
        adv = rule.token_advantages(kept, [rewards[i] for i in keep], [groups[i] for i in keep], tc)
        check_token_advantages(kept, adv, f"method {source}")
    return UpdateBatch(trajectories=kept, advantages=adv, versions_behind=[behind[i] for i in keep],
                       kl_coef=float(rule.kl_coef_at(step, tc)), metrics=metrics,
                       phases=[rule.update_phase(t) for t in kept],
                       temperatures=[rule.scoring_temperature(t) for t in kept])


def grpo_loss_settings(train: TrainConfig) -> LossSettings:
    """Plain GRPO's loss settings: the configured clip, KL term and aggregation (default: token-mean)."""
    return LossSettings(eps_clip_high=train.eps_clip_high, kl_coef=train.kl_coef, kl_reference=train.kl_reference,
                        loss_agg=train.loss_agg or "token-mean")


__all__ = ["GRPO_RULE", "GRPORule", "UpdateRule", "check_token_advantages", "grpo_loss_settings",
           "grpo_token_advantages", "overlap_lag", "policy_update", "reward_of"]
