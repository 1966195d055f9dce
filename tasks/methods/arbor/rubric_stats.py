"""A common rubric's lifetime statistics (paper §3.3 Retirement): n_r, the count of consecutive low-variance
activations against its tolerance kappa, and the cumulative Pearson rho_r, kept as sufficient statistics."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from arbor.tasks.shaping import passes_variance

RHO_TOL = 1e-12  # Pearson >= rho_min is tested as pearson + RHO_TOL >= rho_min
VAR_UNDEFINED = 1e-10  # pooled population variance at or below this counts as zero (rho_r undefined)


def exceeds_kappa(n_r: int, kappa: int) -> bool:
    """§3.3 Retirement: n_r (consecutive low-variance activations) exceeding its tolerance kappa."""
    return n_r > kappa


def next_n_r(n_r: int, variance: float, delta_v: float) -> int:
    """§3.3 Retirement: n_r counts consecutive low-variance activations; one with variance above delta_v resets it."""
    return 0 if passes_variance(variance, delta_v) else n_r + 1


def step_variance(group_variances: Sequence[float]) -> float:
    """count_activations=step: a step's activation variance is the mean of its groups' within-group variances
    (each group's variance is the one eq. 2 and the shaping filter test; pooling across groups would add the
    between-question spread, which says nothing about separating one question's trajectories)."""
    return sum(group_variances) / len(group_variances)


@dataclass
class RubricStats:
    """Lifetime statistics of a common rubric (§3.3 Retirement), kept as sufficient statistics."""

    birth: int  # order of entry into P (older = smaller)
    n_activations: int = 0  # scored groups
    n_steps: int = 0  # steps in which it scored at least one group
    scored_step: int | None = None  # the last such step
    n_r: int = 0  # consecutive low-variance activations
    sum_variance: float = 0.0
    n: int = 0  # pooled (score, F1) pairs over all activations
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    syy: float = 0.0
    sxy: float = 0.0
    last_used: int | None = None  # step of the last activation (LRU)
    # (step, group, n_r) of the first activation at which n_r exceeded kappa, until ``retire`` acts on it (§3.3;
    # decided on the activation sequence, so a later reset in the same step does not undo it). group is
    # None when activations are counted per step.
    over_kappa: tuple[int, int | None, int] | None = None
    # count_activations=step: this step's group variances, until the step closes
    step_variances: list[float] = field(default_factory=list)

    @property
    def rho(self) -> float | None:
        """Cumulative Pearson rho_r; None until pooled scores and F1 both have non-zero variance."""
        n = self.n
        if n < 2:
            return None
        vx = self.sxx / n - (self.sx / n) ** 2
        vy = self.syy / n - (self.sy / n) ** 2
        if vx <= VAR_UNDEFINED or vy <= VAR_UNDEFINED:
            return None
        cov = self.sxy / n - (self.sx / n) * (self.sy / n)
        return max(-1.0, min(1.0, cov / math.sqrt(vx * vy)))

    def activations(self, unit: str) -> int:
        """Its activations in the lifecycle's unit (``memory.count_activations``): scored groups or steps."""
        return self.n_steps if unit == "step" else self.n_activations

    @property
    def mean_variance(self) -> float | None:
        return self.sum_variance / self.n_activations if self.n_activations else None

    def add(self, scores: Sequence[float], f1: Sequence[float], variance: float, delta_v: float,
            per_step: bool = False) -> None:
        """One scored group: the pooled Pearson sums, and n_r now (per group) or at the step's close (per step)."""
        self.n_activations += 1
        if per_step:
            self.step_variances.append(variance)
        else:
            self.n_r = next_n_r(self.n_r, variance, delta_v)
        self.sum_variance += variance
        for x, y in zip(scores, f1, strict=True):
            self.n += 1
            self.sx += x
            self.sy += y
            self.sxx += x * x
            self.syy += y * y
            self.sxy += x * y
