"""Rubric reward shaping (paper §3.4 "Centering and reward integration", eq. 3 and 4).

Per group, per active rubric r:  keep r only if Var_i(s_i^r) >= delta_v   (variance filter; memory.variance)
    s_i      = mean over kept rubrics of s_i^r                            (composite process score)
    s~_i     = s_i - (1/|G_q|) sum_j s_j                                   (eq. 3, centring)
    term_i   = s~_i if s~_i >= 0 else alpha * s~_i                        (attenuate negatives)
    term_i   = 0 for format-invalid trajectories                          (keep the format penalty)
    R_total  = R_base + lambda_ * term_i                                   (eq. 4)
A trajectory without a score under a rubric (None: all its judge edges failed) takes that rubric's mean over the
scored trajectories, so it contributes a zero centred term; the filter's variance uses scored trajectories only. A
rubric with no score at all (every call failed) is never kept, whatever delta_v (RaR's is 0): it has no mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from arbor.group_stats import VarianceKind, group_variance, mean

VAR_TOL = 1e-12  # variance >= delta_v is tested as variance + VAR_TOL >= delta_v (float noise at the threshold)


def rubric_variance(scores: Sequence[float | None] | None, kind: VarianceKind = "population") -> float:
    """Variance (``memory.variance``'s kind) over the scored trajectories (0.0 for a discarded rubric)."""
    if scores is None:
        return 0.0
    return group_variance([s for s in scores if s is not None], kind)


def passes_variance(variance: float, delta_v: float) -> bool:
    return variance + VAR_TOL >= delta_v


@dataclass(frozen=True)
class Shaped:
    total: list[float]  # R_total per trajectory
    term: list[float]  # lambda_-free rubric term after centring, attenuation and the format gate
    centred: list[float]  # s~_i before attenuation (all zeros when no rubric was kept)
    kept: list[bool]  # per rubric: passed the variance filter
    variances: list[float]  # per rubric: within-group variance (memory.variance's kind)


def shape_group(
    base: Sequence[float],
    rubric_scores: Sequence[Sequence[float | None] | None],
    format_valid: Sequence[bool],
    lambda_: float = 0.1,
    alpha: float = 0.25,
    delta_v: float = 0.05,
    variance: VarianceKind = "population",
) -> Shaped:
    """Eq. 3/4 with the variance filter; also returns which rubrics were kept (for ``rubric_activations``)."""
    k = len(base)
    if len(format_valid) != k:
        raise ValueError(f"shape_rewards: {k} base rewards vs {len(format_valid)} format flags")
    for r, sc in enumerate(rubric_scores):
        if sc is not None and len(sc) != k:
            raise ValueError(f"shape_rewards: rubric {r} has {len(sc)} scores for a group of {k}")
    variances = [rubric_variance(sc, variance) for sc in rubric_scores]
    kept = [sc is not None and any(s is not None for s in sc) and passes_variance(v, delta_v)
            for sc, v in zip(rubric_scores, variances, strict=True)]  # a rubric no trajectory got a score under: out
    filled: list[list[float]] = []
    for sc, keep in zip(rubric_scores, kept, strict=True):
        if not keep or sc is None:
            continue
        m = mean([s for s in sc if s is not None])
        filled.append([m if s is None else s for s in sc])
    if not filled or k == 0:
        zeros = [0.0] * k
        return Shaped(total=[float(b) for b in base], term=zeros, centred=zeros, kept=kept, variances=variances)
    composite = [mean([f[i] for f in filled]) for i in range(k)]
    m = mean(composite)
    centred = [s - m for s in composite]  # eq. 3
    term = [
        (c if c >= 0 else alpha * c) if ok else 0.0 for c, ok in zip(centred, format_valid, strict=True)
    ]
    total = [b + lambda_ * t for b, t in zip(base, term, strict=True)]  # eq. 4
    return Shaped(total=total, term=term, centred=centred, kept=kept, variances=variances)


def shape_rewards(
    base: Sequence[float],
    rubric_scores: Sequence[Sequence[float | None] | None],
    format_valid: Sequence[bool],
    lambda_: float = 0.1,
    alpha: float = 0.25,
    delta_v: float = 0.05,
    variance: VarianceKind = "population",
) -> list[float]:
    """R_total per trajectory (eq. 4); with no kept rubric (or none active) it is the base reward."""
    return shape_group(base, rubric_scores, format_valid, lambda_, alpha, delta_v, variance).total
