"""Learning curves across seeds (issue 12 item 3): mean and standard error per method and step, pure functions.

Rows come from the SQL views (``eval_summary``, ``steps``, ``zero_variance_groups``, ``search_behaviour``) joined per
(run, step); a run is one (method, seed). The standard error is over seeds, SE = s / sqrt(n) with the sample
standard deviation s (n - 1 in the denominator), the convention of CleanRL's and verl's benchmark tables.
The change from the start, ``delta``, is taken per seed first (final - start of the same run), then averaged: the
seeds share the SFT start, so the paired difference removes the start's evaluation noise from the comparison.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# (key in the joined rows, label in the table); eval metrics are null at steps without an evaluation
CURVE_METRICS: tuple[tuple[str, str], ...] = (
    ("strict_f1", "held-out F1"),
    ("strict_em", "held-out EM"),
    ("valid_f1", "held-out F1 (valid only)"),
    ("valid_rate", "held-out format-valid"),
    ("mean_base_reward", "train reward R_base"),
    ("format_valid_rate", "train format-valid"),
    ("zero_var_base", "zero-variance groups, R_base"),
    ("zero_var_total", "zero-variance groups, R_total"),
    ("mean_searches", "searches per trajectory"),
    ("repeated_query_share_all_correct", "repeated-query share, all-correct groups"),
)


@dataclass(frozen=True)
class MeanSE:
    mean: float
    se: float
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.3f} ± {self.se:.3f}" if self.n > 1 else f"{self.mean:.3f}"


def mean_se(xs: Iterable[float | None]) -> MeanSE | None:
    """Mean and standard error of the non-null values; None when there are none (SE 0 for a single value)."""
    v = [float(x) for x in xs if x is not None and not math.isnan(float(x))]
    if not v:
        return None
    m = sum(v) / len(v)
    if len(v) == 1:
        return MeanSE(m, 0.0, 1)
    s2 = sum((x - m) ** 2 for x in v) / (len(v) - 1)
    return MeanSE(m, math.sqrt(s2 / len(v)), len(v))


def curves(rows: Sequence[Mapping[str, Any]], metric: str) -> dict[str, dict[int, MeanSE]]:
    """{method: {step: mean ± SE over the method's seeds}} of ``metric`` (rows: method, seed, step, metric)."""
    by: dict[str, dict[int, list[float | None]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by[r["method"]][int(r["step"])].append(r.get(metric))
    out: dict[str, dict[int, MeanSE]] = {}
    for method, steps in by.items():
        got = {s: ms for s, xs in sorted(steps.items()) if (ms := mean_se(xs)) is not None}
        if got:
            out[method] = got
    return out


def start_final_delta(rows: Sequence[Mapping[str, Any]], metric: str) -> dict[str, tuple[MeanSE, MeanSE, MeanSE]]:
    """{method: (start, final, final - start)}: per seed, the first and last step where ``metric`` is measured;
    each of the three is a mean ± SE over seeds (the delta is paired within a seed)."""
    per_seed: dict[tuple[str, Any], dict[int, float]] = defaultdict(dict)
    for r in rows:
        if r.get(metric) is not None:
            per_seed[(r["method"], r["seed"])][int(r["step"])] = float(r[metric])
    by: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (method, _seed), pts in per_seed.items():
        if len(pts) >= 2:
            by[method].append((pts[min(pts)], pts[max(pts)]))
    out: dict[str, tuple[MeanSE, MeanSE, MeanSE]] = {}
    for method, pairs in sorted(by.items()):
        start, final, delta = (mean_se(x) for x in ([a for a, _ in pairs], [b for _, b in pairs],
                                                     [b - a for a, b in pairs]))
        assert start is not None and final is not None and delta is not None
        out[method] = (start, final, delta)
    return out


def rises_by(delta: MeanSE, n_se: float = 3.0) -> bool:
    """The acceptance figure of issue 12: the mean change exceeds ``n_se`` standard errors (and is positive).
    One seed has no standard error, so it never passes."""
    return delta.n > 1 and delta.mean > 0 and delta.mean >= n_se * delta.se


def collect_curve_rows(run_ids: Mapping[str, tuple[str, int]], home: Path) -> list[dict[str, Any]]:
    """One row per (run, step) of the runs ``{run_id: (method, seed)}``: every metric of ``CURVE_METRICS`` and a
    few more, read through the SQL views ``eval_summary``, ``steps`` and ``search_behaviour``."""
    from storage.sql import run_file

    ids = {"run_ids": list(run_ids)}
    rows: dict[tuple[str, int], dict[str, Any]] = {}

    def put(name: str, keys: tuple[str, ...]) -> None:
        for r in run_file(name, ids, home=home):
            method, seed = run_ids[r["run_id"]]
            row = rows.setdefault((r["run_id"], int(r["step"])),
                                  {"run_id": r["run_id"], "method": method, "seed": seed, "step": int(r["step"])})
            row.update({k: r[k] for k in keys})

    put("eval_summary_of_runs", ("strict_f1", "strict_em", "valid_f1", "valid_em", "valid_rate"))
    put("steps_of_runs", ("mean_base_reward", "mean_total_reward", "format_valid_rate", "zero_var_base",
                          "zero_var_total", "wall_seconds"))
    put("search_behaviour_of_runs", ("mean_searches", "repeated_query_share", "repeated_query_share_all_correct",
                                     "n_all_correct"))
    return sorted(rows.values(), key=lambda r: (r["method"], r["seed"], r["step"]))


def plot_curves(rows: Sequence[Mapping[str, Any]], methods: Sequence[str], path: Path,
                title: str = "arbor on the synthetic world (tiny-world): mean ± 1 SE over seeds") -> None:
    """One panel per metric of ``CURVE_METRICS``, one line per method with a ±1 SE band; a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(CURVE_METRICS)
    cols = 5
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(4 * cols, 3.2 * ((n + cols - 1) // cols)))
    for ax, (key, label) in zip(axes.flat, CURVE_METRICS, strict=False):
        c = curves(rows, key)
        for m in methods:
            if m not in c:
                continue
            xs = sorted(c[m])
            ys = [c[m][x].mean for x in xs]
            se = [c[m][x].se for x in xs]
            ax.plot(xs, ys, marker="o", ms=3, label=m)
            ax.fill_between(xs, [y - e for y, e in zip(ys, se, strict=True)],
                            [y + e for y, e in zip(ys, se, strict=True)], alpha=0.2)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("RL step")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
