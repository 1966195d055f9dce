"""RubricEM hyperparameters: the paper's defaults (its App. C.4, F.1.2, D.3-D.5)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from arbor.config.base import Section

# F.1.2: the causal stage-dependence matrix of SS-GRPO (rows: the stage credited; columns: the stage scored)
Cap = Annotated[int, Field(ge=0)]
Weight = Annotated[float, Field(ge=0.0)]
DEFAULT_LAMBDA = ((1.0, 0.4, 0.6, 0.8), (0.0, 1.0, 0.4, 0.8), (0.0, 0.0, 1.0, 0.8), (0.0, 0.0, 0.0, 1.0))


class RubricEMConfig(Section):
    lambda_matrix: tuple[tuple[float, ...], ...] = Field(
        DEFAULT_LAMBDA, description="SS-GRPO's Lambda (eq. 1, F.1.2): K x K, upper triangular, unit diagonal; row k "
        "gives G_k = sum_j lambda_kj R_j")
    stage_caps: tuple[Cap, Cap, Cap, Cap] = Field(
        (3, 2, 2, 3), description="active adaptive rubrics kept per stage after scoring (C.4: Plan, Research, "
        "Review, Answer); over the cap, the lowest-variance rubrics are dropped")
    outcome_weight: float = Field(
        3.0, ge=0.0, description="weight of the persistent Answer-stage rubric 'the answer matches the gold' (scored "
        "by token F1, C.1's ground-truth rubric); 0 leaves the Answer stage to the judge's rubrics alone")
    kl_coef: float = Field(0.001, ge=0.0, description="beta of eq. 1: KL to the frozen reference policy (k3, F.1.2)")
    format_gate: bool = Field(
        False, description="false (F.1.2: no format reward): every trajectory is graded on its stages and its answer "
        "(token F1 of the answer it states), scaffold-valid or not, and a reflection candidate's reward is the judge's "
        "utility (D.6.2), valid or not; only the bank takes valid candidates (D.4). true (arbor's gate): a trajectory "
        "that fails the strict scaffold check scores 0 in every stage, and an invalid candidate's utility is 0")
    # ---- the reflection meta-policy and the rubric bank (run.method=rubricem; §3.4, App. D)
    reflection_samples: int = Field(8, ge=2, description="m: reflection candidates sampled per reflected query (D.4); "
                                    "their judge scores are one GRPO group on the reflection tokens")
    reflection_temperature: float = Field(0.7, gt=0.0, description="sampling temperature of the candidates (D.4)")
    reflection_max_tokens: int = Field(
        4096, ge=16, description="new tokens a reflection candidate may use, thinking included (the paper is silent): "
        "D.6.1's four rubric sections and 1-4 takeaways after a Qwen3 <think> block; capped by what "
        "rollout.max_context_tokens leaves after the reflection prompt (which holds the whole trajectory)")
    reflection_utility: Literal["weighted", "within-cross"] = Field(
        "weighted", description="weighted: u = w . (diagnosis, specificity, scope) with reflection_weights (D.6.2's "
        "judge prompt); within-cross: u = (u_within + u_cross) / 2 (Alg. 1 lines 37-38) with u_within = (diagnosis + "
        "specificity) / 2 (the next attempt at this question) and u_cross = (diagnosis + scope) / 2 (other "
        "questions)")
    reflection_weights: tuple[Weight, Weight, Weight] = Field(
        (0.4, 0.3, 0.3), description="utility u = w . (diagnosis, specificity, scope) of a candidate's grade (D.6.2; "
        "reflection_utility=weighted), each >= 0")
    retrieval_top_k: int = Field(2, ge=0, description="bank items of related questions retrieved per query "
                                 "(cross-episode transfer, D.5; inner product of normalised question embeddings)")
    curriculum: Literal["windowed", "off"] = Field(
        "windowed", description="windowed: each window of 2K steps samples K fresh batches with cross-episode "
        "retrieval, then replays them in order with within-episode retrieval (D.3); off: every batch fresh, "
        "cross-episode retrieval only")
    window: int = Field(3, ge=1, description="K of the windowed curriculum (D.3, F.1.2)")
    reflect_in: Literal["new-query", "every-step"] = Field(
        "new-query", description="which steps reflect: new-query, the windowed curriculum's fresh batches only "
        "(D.3, D.4: a replayed batch was conditioned on its own bank item); every-step, replays too (the new item "
        "replaces the question's old one)")
    reflection_update: Literal["two-phase", "joint"] = Field(
        "two-phase", description="two-phase: last step's reflection candidates are their own update before the "
        "task update (Alg. 1 lines 10 and 29, D.1 Phase A / B), each a token-mean over its own tokens; joint: one "
        "update over both, the reflections weighted by their share of the tokens")

    @field_validator("lambda_matrix")
    @classmethod
    def _causal(cls, v: tuple[tuple[float, ...], ...]) -> tuple[tuple[float, ...], ...]:
        k = len(v)
        if k != 4 or any(len(row) != k for row in v):
            raise ValueError(f"must be 4 x 4 (Plan, Research, Review, Answer), got {[len(r) for r in v]}")
        for i, row in enumerate(v):
            if row[i] != 1.0:
                raise ValueError(f"lambda_kk must be 1 (row {i + 1} has {row[i]})")
            if any(row[j] != 0.0 for j in range(i)):
                raise ValueError(f"lambda_kj must be 0 for j < k (row {i + 1}: {list(row)})")
        return v
