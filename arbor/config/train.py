"""Policy optimisation: GRPO with TIS (App. B.2), DAPO baseline, DeepSpeed, checkpoints, SFT warm start."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from arbor.config.base import Section

Beta = Annotated[float, Field(ge=0, lt=1)]


def _old_checkpointing_flag(value: Any) -> Any:
    """Configs from earlier say true / false: every layer / none."""
    if isinstance(value, bool) or (isinstance(value, str) and value.lower() in ("true", "false")):
        return "all" if str(value).lower() == "true" else "none"
    return value


Recompute = Annotated[Literal["auto", "none", "every_other", "all"], BeforeValidator(_old_checkpointing_flag)]


class TrainConfig(Section):
    lr: float = Field(1e-6, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    eps_clip_low: float = Field(0.2, gt=0, lt=1, description="PPO clip eps (lower side), in (0, 1)")
    eps_clip_high: float = Field(0.2, gt=0, lt=1, description="PPO clip eps (upper side), in (0, 1)")
    tis_cap: float | None = Field(2.0, ge=1, description="TIS truncation C >= 1; None disables TIS")
    kl_coef: float = Field(0.0, ge=0, description="coefficient of the k3 KL term in the loss (0: none)")
    kl_reference: Literal["old", "frozen"] = Field(
        "old", description="what the KL term measures against: old (pi_old, this step's starting weights) or "
        "frozen (the start checkpoint, kept as a reference model: RubricEM's eq. 1, DeepSeekMath's GRPO)")
    entropy_coef: float = Field(0.0, ge=0)
    adv_norm: Literal["std", "mean"] = "std"
    loss_agg: Literal["token-mean", "seq-mean-token-mean"] | None = Field(
        None, description="how a mini-batch's per-token losses are averaged: token-mean (one mean over all its loss "
        "tokens), seq-mean-token-mean (each sample's token mean, then the mean over its samples: slime's default, "
        "calculate_per_token_loss off, the framework of ARBOR §4.1); None: the method's own (arbor: "
        "seq-mean-token-mean; every other method: token-mean)")
    adv_eps: float = Field(1e-6, gt=0)
    updates_per_batch: int = Field(1, ge=1, description="optimizer updates (mini-batches) per rollout batch")
    micro_batch_tokens: int = Field(16384, ge=1)
    grad_clip: float = Field(1.0, ge=0, description="gradient norm clip (0: none)")
    zero_stage: int = Field(2, ge=0, le=3)
    bf16: bool = False
    gradient_checkpointing: Recompute = Field(
        "auto", description="activation recompute: none, every_other (odd decoder layers), all, or auto: the least "
        "recompute whose estimated peak fits the memory budget (tasks.training.recompute; true/false: all/none)")
    memory_budget_gib: float | None = Field(
        None, gt=0, description="the memory gradient_checkpointing=auto may plan for, GiB per rank (None: the "
        "device's free memory x memory_fraction on CUDA, no limit on CPU)")
    memory_fraction: float = Field(0.8, gt=0, le=1, description="share of the device's free memory auto plans for "
                                   "(the rest: headroom for what the estimate leaves out)")
    lr_schedule: Literal["constant", "cosine"] = "constant"
    warmup_ratio: float = Field(0.0, ge=0, lt=1, description="linear warm-up share of the updates, in [0, 1)")
    overlong_penalty: bool = False
    overlong_buffer: int = Field(4096, ge=0, description="DAPO soft overlong buffer L_cache (tokens)")
    dapo_variant: Literal["dapo-paper", "arbor-paper"] = Field(
        "dapo-paper", description="which DAPO run.method=dapo runs: dapo-paper (Yu et al. 2025: clip-higher "
        "dapo_eps_clip_high, dynamic sampling's refill dapo_oversample, zero-variance groups dropped) or arbor-paper "
        "(ARBOR §4.1's baseline: zero-variance groups dropped from the update, nothing refilled, the symmetric clip "
        "of B.2; the qwen3 ARBOR profiles and arbor compare)")
    dapo_eps_clip_high: float = Field(0.28, gt=0, lt=1, description="DAPO clip-higher eps_high (used when run.method=dapo)")
    dapo_oversample: bool = Field(True, description="DAPO dynamic sampling: roll out more prompts until the batch "
                                  "holds rollout.batch_size groups with reward variance (run.method=dapo)")
    dapo_max_resample_rounds: int = Field(3, ge=0, description="bound on DAPO's resampling rounds per step; the "
                                          "shortfall is recorded in steps.dapo_shortfall")
    entropy_diagnostic: bool = Field(True, description="log token entropy even when entropy_coef is 0")
    deepspeed_config: str | None = Field(None, description="DeepSpeed JSON file (relative: to the project root in a "
                                             "profile, to the current directory in --set)")
    deepspeed: dict[str, Any] = Field(default_factory=dict, description="extra DeepSpeed config merged in (last)")
    num_gpus: int = Field(0, ge=0)
    service: bool = Field(False, description="run the trainer as a supervised process group (always on GPUs)")
    hostfile: str | None = Field(None, description="DeepSpeed hostfile: training on several nodes")


class CheckpointConfig(Section):
    every: int = Field(1, ge=1, description="save every N steps")
    keep_last: int = Field(2, ge=1)
    keep_best: bool = True
    best_metric: str = Field("mean_total_reward", description="metric (higher is better) that picks the best")
    dir: str | None = Field(None, description="checkpoint root (default: {ARBOR_HOME}/checkpoints/{run_id})")
    async_save: bool = Field(True, description="the step's checkpoint is copied to host memory and written and "
                             "committed by a background thread while the next step runs (the same "
                             "files); false: the step waits for the write")


class SFTConfig(Section):
    data: str = "synth:offline-train"
    variants: int = Field(1, ge=1, description="synthesised responses per question (synth: data only)")
    reflections: float | None = Field(
        None, ge=0.0, le=1.0, description="share of the gold rows that also get a reflection row and a copy behind a "
        "<reference_examples> block (RubricEM's meta-policy format, App. D.6; run.method=rubricem), for every kind of "
        "sft.data; None: 0.25 under rollout.protocol=rubricem (the share its measured start uses, docs/sft.md), "
        "else 0")
    guided: float = Field(
        0.0, ge=0.0, le=1.0, description="share of the clean gold rows that also get a copy reading Co-ReAct's step "
        "rubrics where guided inference places them (the rules writer's, tasks/methods/coreact/sft.py): an SFT start "
        "that has seen guided turns; 0: none")
    questions: int | None = Field(None, ge=1, description="synth:train uses the first N of the run's questions")
    epochs: int = Field(3, ge=1)
    lr: float = Field(7e-6, gt=0)
    lr_schedule: Literal["constant", "cosine"] = "cosine"
    warmup_ratio: float = Field(0.1, ge=0, lt=1, description="linear warm-up share of the updates, in [0, 1)")
    max_length: int = Field(15000, ge=2)
    batch_size: int = Field(16, ge=1)
    zero_stage: int = Field(3, ge=0, le=3)
    bf16: bool = False
    max_minutes: float | None = Field(None, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, ge=0, description="gradient norm clip (0: none)")
    output: str | None = Field(None, description="HF checkpoint directory, relative paths under ARBOR_HOME (default: "
                               "{ARBOR_HOME}/sft/{profile}-{key}, content-addressed: the same settings and data "
                               "reuse it)")
    processes: int | None = Field(
        None, ge=1, description="ranks of the SFT process group. None: one per GPU of the node layout "
        "(cluster.rollout_gpus + train_gpus, or train.num_gpus / train.hostfile) under the deepspeed launcher, and "
        "on CPU one rank in the flow's process; N: the first N GPUs, or on CPU N gloo ranks under torchrun")
    dist_timeout_s: float | None = Field(
        None, gt=0, description="a launched group's collective timeout in seconds: how long a rank waits on a peer "
        "that stopped answering before it fails (a peer that exits is seen at once by the launcher). "
        "None: 120 s for CPU ranks (gloo), DeepSpeed's default (10 min, DEEPSPEED_TIMEOUT) on GPUs")
    save_every: int = Field(
        0, ge=0, description="keep the resumable SFT state every N optimizer updates (0: every tenth of the run); "
        "arbor-sft run again after a failure resumes from the latest")
