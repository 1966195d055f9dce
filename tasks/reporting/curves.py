"""Learning curves across seeds: mean and standard error per method and step, pure functions.

Rows are a polars frame (``collect_curve_rows``) from the SQL views (``eval_summary``, ``steps``, ``zero_variance_groups``, ``search_behaviour``) joined per
(run, step); a run is one (method, seed). The standard error is over seeds, SE = s / sqrt(n) with the sample
standard deviation s (n - 1 in the denominator), the convention of CleanRL's and verl's benchmark tables.
The change from the start, ``delta``, is taken per seed first (final - start of the same run), then averaged: the
seeds share the SFT start, so the paired difference removes the start's evaluation noise from the comparison.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

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


Rows = pl.DataFrame | Sequence[Mapping[str, Any]]


def as_frame(rows: Rows) -> pl.DataFrame:
    """Curve rows as a polars frame (a list of dicts is converted; every row's keys count)."""
    return rows if isinstance(rows, pl.DataFrame) else pl.DataFrame(list(rows), infer_schema_length=None)


def _measured(rows: Rows, metric: str, *keys: str) -> pl.DataFrame:
    """``keys`` and ``metric`` of the rows where ``metric`` is measured (null and NaN dropped)."""
    df = as_frame(rows)
    if metric not in df.columns or df.is_empty():
        return pl.DataFrame(schema={**{k: pl.Int64 for k in keys}, metric: pl.Float64})
    return (df.select(*keys, pl.col("step").cast(pl.Int64), pl.col(metric).cast(pl.Float64).fill_nan(None))
            .drop_nulls(metric))


def _mean_se(col: str) -> list[pl.Expr]:
    """mean, SE = s / sqrt(n) (sample s, ddof 1; 0 for one value) and n of ``col`` as aggregation expressions."""
    x = pl.col(col)
    return [x.mean().alias(f"{col}_mean"), (x.std(ddof=1) / x.count().sqrt()).fill_null(0.0).alias(f"{col}_se"),
            x.count().alias(f"{col}_n")]


def _ms(row: Mapping[str, Any], col: str) -> MeanSE:
    return MeanSE(float(row[f"{col}_mean"]), float(row[f"{col}_se"]), int(row[f"{col}_n"]))


def curves(rows: Rows, metric: str) -> dict[str, dict[int, MeanSE]]:
    """{method: {step: mean ± SE over the method's seeds}} of ``metric`` (rows: method, seed, step, metric)."""
    agg = (_measured(rows, metric, "method").group_by("method", "step").agg(_mean_se(metric))
           .sort("method", "step"))
    out: dict[str, dict[int, MeanSE]] = {}
    for r in agg.iter_rows(named=True):
        out.setdefault(r["method"], {})[r["step"]] = _ms(r, metric)
    return out


def start_final_delta(rows: Rows, metric: str) -> dict[str, tuple[MeanSE, MeanSE, MeanSE]]:
    """{method: (start, final, final - start)}: per seed, the first and last step where ``metric`` is measured;
    each of the three is a mean ± SE over seeds (the delta is paired within a seed)."""
    x = pl.col(metric).sort_by("step")
    per_seed = (_measured(rows, metric, "method", "seed").group_by("method", "seed")
                .agg(x.first().alias("start"), x.last().alias("final"), pl.len().alias("points"))
                .filter(pl.col("points") >= 2).with_columns((pl.col("final") - pl.col("start")).alias("delta")))
    agg = per_seed.group_by("method").agg(*_mean_se("start"), *_mean_se("final"), *_mean_se("delta")).sort("method")
    return {r["method"]: (_ms(r, "start"), _ms(r, "final"), _ms(r, "delta")) for r in agg.iter_rows(named=True)}


def rises_by(delta: MeanSE, n_se: float = 3.0) -> bool:
    """The learning test's acceptance figure: the mean change exceeds ``n_se`` standard errors (and is positive).
    One seed has no standard error, so it never passes."""
    return delta.n > 1 and delta.mean > 0 and delta.mean >= n_se * delta.se


def common_dice_delta(start: Mapping[str, float], finals: Sequence[Mapping[str, float]]) -> MeanSE:
    """final - start where the start and every seed's final checkpoint answered the same held-out questions with
    the same sampling seeds (common random numbers); scores are per question (question key -> mean F1).

    The change is the mean over seeds of mean_q(final_s(q) - start(q)). Its standard error adds in quadrature
    the two sources of error: the training seeds (SE over seeds of the per-seed change) and the finite question
    set (SE over questions of each question's change averaged over seeds, paired because every checkpoint
    answered the same questions)."""
    qs = sorted(start)
    if not finals or any(sorted(f) != qs for f in finals):
        raise ValueError("common_dice_delta needs at least one final scored on exactly the start's questions")
    per_seed = mean_se([sum(f[q] - start[q] for q in qs) / len(qs) for f in finals])
    per_question = mean_se([sum(f[q] for f in finals) / len(finals) - start[q] for q in qs])
    assert per_seed is not None and per_question is not None
    return MeanSE(per_seed.mean, math.sqrt(per_seed.se ** 2 + per_question.se ** 2), per_seed.n)


# what each SQL file of sql/queries/ contributes to a curve row
CURVE_SOURCES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("eval_summary_of_runs", ("strict_f1", "strict_em", "valid_f1", "valid_em", "valid_rate")),
    ("steps_of_runs", ("mean_base_reward", "mean_total_reward", "format_valid_rate", "zero_var_base",
                       "zero_var_total", "wall_seconds")),
    ("search_behaviour_of_runs", ("mean_searches", "repeated_query_share", "repeated_query_share_all_correct",
                                  "n_all_correct")),
)


def collect_curve_rows(run_ids: Mapping[str, tuple[str, int]], home: Path) -> pl.DataFrame:
    """One row per (run, step) of the runs ``{run_id: (method, seed)}``: every metric of ``CURVE_METRICS`` and a
    few more, read through the SQL views ``eval_summary``, ``steps`` and ``search_behaviour`` and joined in polars."""
    from arbor.storage.sql import query, sql_file

    runs = pl.DataFrame({"run_id": list(run_ids), "method": [m for m, _ in run_ids.values()],
                         "seed": [s for _, s in run_ids.values()]}, schema_overrides={"seed": pl.Int64})
    out: pl.DataFrame | None = None
    for name, keys in CURVE_SOURCES:
        part = pl.from_arrow(query(sql_file(name), {"run_ids": list(run_ids)}, home=home))
        assert isinstance(part, pl.DataFrame)
        part = part.select("run_id", pl.col("step").cast(pl.Int64), *keys)
        out = part if out is None else out.join(part, on=["run_id", "step"], how="full", coalesce=True)
    assert out is not None
    return runs.join(out, on="run_id", how="inner").sort("method", "seed", "step")


def question_f1(run_ids: Sequence[str], home: Path) -> dict[str, dict[str, float]]:
    """{run_id: {"split/question_id": strict F1 (mean over its answers)}} at each run's latest evaluated step,
    through ``sql/queries/question_f1_of_runs.sql``."""
    from arbor.storage.sql import query, sql_file

    df = pl.from_arrow(query(sql_file("question_f1_of_runs"), {"run_ids": list(run_ids)}, home=home))
    assert isinstance(df, pl.DataFrame)
    out: dict[str, dict[str, float]] = {r: {} for r in run_ids}
    for row in df.iter_rows(named=True):
        out[row["run_id"]][f"{row['split']}/{row['question_id']}"] = float(row["strict_f1"])
    return out


def plot_curves(rows: Rows, methods: Sequence[str], path: Path,
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
