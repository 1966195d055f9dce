"""Within-group statistics shared by admission, shaping, the rubric memory and the paper's Table 2 (§3.3, §4.3).

A rubric's within-group variance (eq. 2's admission, the shaping filter, n_r) is ``group_variance`` of the kind
``memory.variance`` names: population (divide by n, the default) or sample (n - 1); "equal" means equal within
``EPS`` = 1e-9.

Table 2 (§4.3): a group is *zero-variance* under a reward (base or total) when all its rewards are equal.
Zero-variance groups are split by outcome pattern:
  all_correct    F1 = 1 on every trajectory (every one format-valid: an invalid one has base reward -1),
  all_wrong      F1 = 0 on every trajectory, format-invalid ones included (F1 is format-gated, so 0),
  mixed_uniform  every trajectory shares the same partial F1 (0 < F1 < 1).
The pattern is a property of the outcomes only; the zero-variance flag is a property of the reward. A group mixing
format-invalid (base -1) and valid-but-wrong (base 0) trajectories has pattern ``all_wrong`` but non-zero base
reward variance, so it is *not* counted as reward-homogeneous under R_base (the format penalty still gives it a
gradient); see docs/decisions/arbor-method-anchors-scoring-admission-lifecycle-shaping.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

EPS = 1e-9

Pattern = Literal["all_correct", "all_wrong", "mixed_uniform", "mixed"]
VarianceKind = Literal["population", "sample"]


def mean(xs: Sequence[float]) -> float:
    if not xs:
        raise ValueError("mean of an empty sequence")
    return math.fsum(xs) / len(xs)


def population_variance(xs: Sequence[float]) -> float:
    """Var(x) = (1/n) sum (x_i - mean)^2; 0.0 for fewer than two values."""
    if len(xs) < 2:
        return 0.0
    m = mean(xs)
    return math.fsum((x - m) ** 2 for x in xs) / len(xs)


def sample_variance(xs: Sequence[float]) -> float:
    """Var(x) = (1/(n-1)) sum (x_i - mean)^2 (Bessel's correction); 0.0 for fewer than two values."""
    if len(xs) < 2:
        return 0.0
    return population_variance(xs) * len(xs) / (len(xs) - 1)


def group_variance(xs: Sequence[float], kind: VarianceKind = "population") -> float:
    """Within-group variance of ``kind`` (``memory.variance``): population (1/n) or sample (1/(n-1))."""
    if kind == "population":
        return population_variance(xs)
    if kind == "sample":
        return sample_variance(xs)
    raise ValueError(f"memory.variance must be 'population' or 'sample', got {kind!r}")


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson correlation; None (undefined) when either side has zero variance or fewer than two pairs."""
    if len(xs) != len(ys):
        raise ValueError(f"pearson: {len(xs)} scores vs {len(ys)} F1 values")
    n = len(xs)
    if n < 2:
        return None
    mx, my = mean(xs), mean(ys)
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    syy = math.fsum((y - my) ** 2 for y in ys)
    if sxx <= EPS * EPS * n or syy <= EPS * EPS * n:
        return None
    sxy = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


def all_equal(xs: Sequence[float], eps: float = EPS) -> bool:
    """max - min <= eps (an empty or single-value group is uniform): the one definition of a zero-variance group,
    shared by DAPO's filter (``tasks.training.losses``), Table 2 and ``sql/views/zero_variance_groups.sql``."""
    return max(xs) - min(xs) <= eps if xs else True


def outcome_pattern(f1: Sequence[float], format_valid: Sequence[bool]) -> Pattern:
    """Outcome pattern of a group (§4.3): all_correct / all_wrong / mixed_uniform, else ``mixed``."""
    if len(f1) != len(format_valid):
        raise ValueError(f"outcome_pattern: {len(f1)} F1 values vs {len(format_valid)} format flags")
    if not f1:
        raise ValueError("outcome_pattern: empty group")
    if all(abs(x - 1.0) <= EPS for x in f1) and all(format_valid):
        return "all_correct"
    if all(abs(x) <= EPS for x in f1):
        return "all_wrong"
    if all_equal(f1) and all(format_valid):
        return "mixed_uniform"
    return "mixed"


@dataclass(frozen=True)
class GroupClass:
    """Table 2 classification of one group under one reward."""

    zero_variance: bool
    pattern: Pattern

    @property
    def table2_bucket(self) -> Pattern | None:
        """The Table 2 column this group counts in (None: it has reward variance, so it is not counted)."""
        return self.pattern if self.zero_variance else None


def classify_group(rewards: Sequence[float], f1: Sequence[float], format_valid: Sequence[bool]) -> GroupClass:
    """Zero-variance flag under ``rewards`` plus the outcome pattern of the group (§4.3, Table 2)."""
    if len(rewards) != len(f1):
        raise ValueError(f"classify_group: {len(rewards)} rewards vs {len(f1)} F1 values")
    return GroupClass(zero_variance=all_equal(rewards), pattern=outcome_pattern(f1, format_valid))


def table2_fractions(classes: Sequence[GroupClass]) -> dict[str, float]:
    """Fractions of groups that are zero-variance, per pattern and in total (one row of Table 2)."""
    n = len(classes)
    out = {"all_correct": 0.0, "all_wrong": 0.0, "mixed_uniform": 0.0, "other": 0.0, "total": 0.0}
    if n == 0:
        return out
    for c in classes:
        b = c.table2_bucket
        if b is None:
            continue
        out["other" if b == "mixed" else b] += 1.0 / n
        out["total"] += 1.0 / n
    return out


# ---- is the judge helping? (the SQL of the same figures: ARBOR's judge_signal_quality view) ------
def verdict_agreement(verdicts: Sequence[tuple[float | None, float, float]]) -> tuple[int, int, int]:
    """(agree, disagree, tie) over judged edges ``(outcome, base_i, base_j)`` whose base rewards differ: agree when
    the trajectory with the higher base reward wins (outcome 1: i wins, 0: j wins, 0.5 tie); failed edges (None)
    and edges between equal base rewards are not counted."""
    agree = disagree = tie = 0
    for o, bi, bj in verdicts:
        if o is None or abs(bi - bj) <= EPS:
            continue
        if o == 0.5:
            tie += 1
        elif (o == 1.0) == (bi > bj):
            agree += 1
        else:
            disagree += 1
    return agree, disagree, tie


def zero_var_shaping(groups: Sequence[tuple[Sequence[float], Sequence[float]]]) -> tuple[int, int, float | None]:
    """Over groups ``(base rewards, total rewards)``: (zero-variance groups under the base reward, those whose total
    reward varies, mean |A_total - A_base| over their trajectories with A = reward minus its group mean: A_base is
    0 there, so the mean |total - mean(total)|)."""
    n = shaped = 0
    shifts: list[float] = []
    for base, total in groups:
        if not all_equal(base):
            continue
        n += 1
        shaped += not all_equal(total)
        m = mean(total)
        shifts += [abs(t - m) for t in total]
    return n, shaped, (sum(shifts) / len(shifts) if shifts else None)
