"""ARCO hyperparameters: the authors' defaults (their code's ``configs/hotpotqa``; docs/decisions/arco-a-co-evolving-rubric-model.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from arbor.config.base import Section


class ArcoConfig(Section):
    # ---- the rubric model mu: a copy of the policy's start checkpoint with LoRA and a score head
    criteria: Literal["generate", "static", "none"] = Field(
        "generate", description="what mu's score head reads after its step prompt: criteria mu writes itself "
        "(greedy), one fixed criteria text (static_criteria), or nothing (the prompt alone): the authors' ablations")
    k: int = Field(3, ge=1, description="K: criteria (score-head outputs) per step; the step score is their mean")
    static_criteria: str = Field(
        '{"criteria": ["The action moves the search toward the entity the question asks about.", "The action uses '
        'what earlier results showed instead of repeating a search.", "A final answer is supported by a retrieved '
        'result."]}', description="the fixed criteria text of criteria=static (scored, never generated)")
    max_criteria_tokens: int = Field(128, ge=8, description="new tokens mu may write per step (criteria=generate)")
    max_prompt_tokens: int | None = Field(
        None, ge=64, description="mu's step prompt is cut to this many tokens (the oldest history first, then the "
        "middle of the step; never the question); null: the model's context less max_criteria_tokens")
    lora_rank: int = Field(8, ge=1, description="LoRA r on mu's attention projections (q_proj, v_proj)")
    lora_alpha: float = Field(32.0, gt=0.0, description="LoRA alpha (the update is scaled by alpha / r)")
    lora_dropout: float = Field(0.05, ge=0.0, lt=1.0, description="dropout on the LoRA input while mu trains")
    lr: float = Field(1e-5, gt=0.0, description="mu's LoRA learning rate (AdamW, constant)")
    head_lr: float = Field(5e-4, gt=0.0, description="the score head's learning rate (AdamW, constant)")
    weight_decay: float = Field(0.01, ge=0.0)
    grad_clip: float = Field(1.0, gt=0.0, description="global gradient norm clip of mu's update")
    kl_coef: float = Field(0.05, ge=0.0, description="beta_mu: KL(mu_ref || mu) on the criteria tokens (mean per "
                           "step, summed over steps); mu_ref is mu as the teacher warm-up left it")
    updates: int = Field(1, ge=1, description="gradient updates of mu per RL step on the step's rollouts (1 in the "
                         "authors' code)")
    # ---- the teacher warm-up (the configured judge writes criteria and step labels)
    warmup_steps: int | None = Field(
        None, ge=0, description="RL steps whose mu update learns the judge's criteria and projected step labels "
        "(LM loss + warmup_mse_coef * MSE) instead of the decomposition loss; null: half of the sparse phase")
    warmup_updates: int = Field(4, ge=1, description="gradient updates of mu per warm-up step")
    warmup_mse_coef: float = Field(10.0, ge=0.0, description="weight of the score MSE in the warm-up loss")
    warmup_lr: float = Field(5e-5, gt=0.0, description="mu's LoRA learning rate during the warm-up (mu SFT)")
    warmup_head_lr: float = Field(1e-3, gt=0.0, description="the score head's learning rate during the warm-up")
    # ---- the policy's credit
    dense_start_step: int | None = Field(
        None, ge=1, description="first RL step of the dense phase (per-step advantages from mu); earlier steps are "
        "the sparse phase (A = R - group mean on every token); null: the authors' 3 of 8 epochs, 3/8 of run.steps")
    signal: Literal["sum", "avg", "discounted"] = Field(
        "sum", description="G_t from the step scores: sum of s_t' for t' >= t, their mean, or s_t + gamma G_t+1")
    gamma: float = Field(0.9, ge=0.0, le=1.0, description="discount of signal=discounted")
    baseline: Literal["position_bucket", "global"] = Field(
        "position_bucket", description="b of A_t = c (G_t - b): the batch mean of G over steps in the same "
        "position bucket (search_1, search_2, ..., terminal; a singleton bucket uses the global mean), or over all")
    c: float = Field(0.5, gt=0.0, description="scale c of the dense advantage A_t = c (G_t - b)")
    kl_coef_dense: float = Field(0.05, ge=0.0, description="the policy's KL to its frozen start in the dense phase "
                                 "(0 in the sparse phase)")
    positive_threshold: float = Field(0.5, description="an outcome R above this is positive for the class-balance "
                                      "weights of the decomposition loss")

    def dense_start(self, steps: int) -> int:
        """The first dense step: ``dense_start_step`` or 3/8 of the run's steps (at least 2)."""
        return self.dense_start_step if self.dense_start_step is not None else max(2, round(3 * steps / 8) + 1)

    def warmup(self, steps: int) -> int:
        """Teacher warm-up steps: ``warmup_steps`` or half of the sparse phase."""
        return self.warmup_steps if self.warmup_steps is not None else (self.dense_start(steps) - 1) // 2
