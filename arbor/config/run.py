"""What a run is: identity, method, length, seeds, evaluation cadence."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from arbor.config.base import Section


class RunConfig(Section):
    profile: str = "tiny-cpu"
    run_id: str | None = None
    method: str = Field("arbor", pattern=r"^([a-z][a-z0-9_-]*|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$",
                        description="the training method: a registered name (arbor, grpo, dapo, rar, no-memory; "
                        "tasks/methods/) or a Method subclass as 'pkg.module:ClassName' (docs/methods.md)")
    seed: int = 0
    steps: int = Field(60, ge=1, le=10_000_000, description="RL steps, at least 1 (a run that trains nothing would "
                       "be stored as completed with no policy)")
    eval_every: int | None = Field(None, ge=1, description="held-out evaluation every N steps (None: never)")
    eval_at_start: bool = Field(True, description="with eval_every: also evaluate the starting policy (step 0), "
                                "so every curve has its SFT point")
    eval_final: bool = Field(False, description="evaluate the final policy on data.eval after the last step (its "
                             "eval stage, stored and resumable like any; the paper profiles' Table 1)")
    eval_size: int = Field(32, ge=1)
    eval_runs: int = Field(5, ge=1)
    sft_warm_start: bool = False
    start_checkpoint: str | None = Field(None, description="RL start point (an SFT checkpoint path)")
    stream_judging: bool = Field(True, description="start a group's judge work (the method's prefetch: ARBOR's "
                                 "scoring and induction) as soon as its K trajectories end, while other groups still "
                                 "roll out; stored rows are those of the serial order")
    overlap: Literal["off", "one-step"] = Field("off", description="one-step: roll out step N+1 with the policy of "
                                                "step N-1 while step N trains (one step off-policy, corrected by "
                                                "TIS); off: the paper's on-policy schedule")


class EvalConfig(Section):
    splits: list[str] = Field(default_factory=lambda: ["bamboogle", "hotpotqa", "musique", "2wiki"])
    runs: int = Field(5, ge=1, description="pass@1 averaged over n runs")
    temperature: float | None = Field(None, ge=0.0, description="sampling temperature of evaluation rollouts (in-run "
                                      "and `arbor eval`); None: rollout.temperature; 0: greedy")
    second_judge_model: str | None = None
