"""Co-ReAct guidance (issue 17): rubric-guided, verified steps at inference, and the rubric generator's training.

Defaults are the paper's (Kang et al., 2026, §3, App. A) unless the help text says otherwise.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from arbor.config.base import Section


class GuidanceConfig(Section):
    # ---- guided inference (§3.3): inject, verify, retry
    mode: Literal["off", "co-react"] = Field(
        "off", description="co-react: before every agent turn a step rubric is written and placed in the agent's "
        "context (loss-masked), and the proposed action is verified against it (rollouts and evaluation)")
    source: Literal["generator", "memory", "judge"] = Field(
        "judge", description="who writes the step rubric: a trained generator checkpoint (guidance.generator), an "
        "exported ARBOR common pool (guidance.memory_pool), or the judge endpoint's step_rubric role (prompt-only)")
    verify: bool = Field(True, description="verify each proposed action and retry a failed one; false: inject only "
                         "(the paper's plug-in variant, §4.6)")
    tau: float = Field(0.5, ge=0.0, le=1.0, description="tau: an action passes when its weighted share of satisfied "
                       "items exceeds tau (strictly)")
    max_retries: int = Field(1, ge=0, le=3, description="re-plans of a step that failed verification, with the "
                             "verifier's feedback in context; the retried action replaces the failed one")
    max_history_chars: int = Field(4000, ge=200, description="the rubric writer and the verifier read the question "
                                   "and the last this-many characters of the agent's history")
    generator: str | None = Field(None, description="source=generator: a generator checkpoint directory (written by "
                                  "arbor-guidance-train) or a Hugging Face model id")
    generator_temperature: float = Field(0.7, ge=0.0, description="the generator samples at T = 0.7 (App. A)")
    generator_top_p: float = Field(0.95, gt=0.0, le=1.0, description="and top-p 0.95 (App. A)")
    max_rubric_tokens: int = Field(1024, ge=8, description="new tokens the generator may write per rubric (1,024 in "
                                   "App. A)")
    memory_pool: str | None = Field(None, description="source=memory: an exported common pool (JSON from `arbor "
                                    "rubrics export RUN`)")
    memory_pick: Literal["top", "retrieve"] = Field(
        "top", description="source=memory: the pool's rubrics with the highest rho_r, or those most similar to the "
        "question and history (token overlap)")
    memory_items: int = Field(4, ge=1, le=8, description="source=memory: items per step rubric (3-5 in the paper); "
                              "weights are proportional to max(rho_r, 0.1), summing to 1")
    # ---- generator training (§3.1, §3.2, App. A)
    branch_questions: int = Field(64, ge=1, description="training questions whose trajectories give branching points")
    branch_temperatures: list[float] = Field(
        default_factory=lambda: [0.1, 0.4, 0.7, 1.0], description="candidate next actions are sampled at each of "
        "these temperatures (App. A), branch_samples each")
    branch_samples: int = Field(3, ge=1, description="candidates per temperature at a branching point (the paper "
                                "mixes three agents: 3 x 4 = 12)")
    slate_k: int = Field(4, ge=2, le=8, description="k: diverse candidates kept per branching point (MMR over BM25)")
    rank_models: list[str] = Field(
        default_factory=list, description="judge models that rank each slate list-wise (the judge endpoint's "
        "rank_actions role with its model swapped); empty: the rank_actions role's own model only")
    min_rankings: int = Field(2, ge=1, description="a branching point is kept when at least this many judges returned "
                              "a valid ranking (capped at the number of judges)")
    group_size: int = Field(8, ge=2, description="G: rubrics sampled per branching point")
    clip_eps: float = Field(0.2, gt=0.0, description="GRPO clip epsilon")
    kl_coef: float = Field(5e-3, ge=0.0, description="beta: KL to the frozen reference generator")
    lr: float = Field(2e-6, gt=0.0, description="the generator's learning rate")
    epochs: int = Field(2, ge=1, description="passes over the branching points")
    batch_points: int = Field(8, ge=1, description="branching points per GRPO update")
    grad_clip: float = Field(1.0, gt=0.0, description="gradient-norm clip")
    warm_start: bool = Field(True, description="SFT the generator on the judge's own step rubrics at the kept "
                             "branching points before GRPO (a tiny model cannot write the format unprompted; the "
                             "paper starts from Qwen3-14B, which can)")
    warm_epochs: int = Field(3, ge=1, description="epochs of that warm-start SFT (its other settings: sft.*)")
    generator_init: str | None = Field(None, description="the generator's start checkpoint; null: the policy's "
                                       "start checkpoint (the paper starts from the base model, Qwen3-14B)")
