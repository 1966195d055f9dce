"""What an ARBOR step reports beyond every run's figures: the trackers' rubric lifecycle counts and judge-signal
metrics (``Arbor.logged_metrics``), the console's rubric and signal rows (``Arbor.console_lines``), and the step's
rubric events as the Prefect artifact's markdown (``Arbor.step_report``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from arbor.tasks.reporting.tracking import short_number, summary_row

Rows = list[dict[str, Any]]
LIFECYCLE = ("induced", "admitted", "consolidated", "retired")  # the events counted per step (``rubric/<event>``)


def lifecycle_counts(events: Rows) -> dict[str, float | None]:
    """``rubric/<event>``: how many rubrics the step induced, admitted, consolidated and retired."""
    return {f"rubric/{kind}": float(sum(e["event"] == kind for e in events)) for kind in LIFECYCLE}


def judge_signal_metrics(verdicts: Rows, trajectories: Rows) -> dict[str, float | None]:
    """Is the judge helping (``judge_signal_quality`` in SQL): the step's pairwise verdicts against
    the outcome order (``signal/``: agreement over decisive edges, ties) when a method stored ``rubric_verdicts``,
    and in zero-variance groups the share shaping gave a signal and the mean |A_total - A_base|."""
    from arbor.group_stats import verdict_agreement, zero_var_shaping

    out: dict[str, float | None] = {}
    if verdicts:
        agree, disagree, tie = verdict_agreement([(v["outcome"], v["base_i"], v["base_j"]) for v in verdicts])
        out["signal/agree_edges"] = float(agree)
        out["signal/disagree_edges"] = float(disagree)
        out["signal/tie_edges"] = float(tie)
        out["signal/agreement"] = agree / (agree + disagree) if agree + disagree else None
    groups: dict[int, tuple[list[float], list[float]]] = {}
    for t in trajectories:
        base, total = groups.setdefault(t["group"], ([], []))
        base.append(t["base_reward"])
        total.append(t["base_reward"] if t["shaped_reward"] is None else t["shaped_reward"])
    if verdicts and groups:
        n, shaped, shift = zero_var_shaping(list(groups.values()))
        out["signal/zero_var_shaped_share"] = shaped / n if n else None
        out["signal/zero_var_abs_shift"] = shift
    return out


def activation_scores(activations: Rows) -> dict[tuple[int, int], str]:
    """``rubric_id score`` pairs per (group, sample), from the step's ``rubric_activations`` rows."""
    out: dict[tuple[int, int], list[str]] = {}
    for a in activations:
        for i, s in enumerate(a.get("scores") or []):
            if s is not None:
                out.setdefault((a["group"], i), []).append(f"{a['rubric_id']} {s:+.2f}")
    return {k: ", ".join(v) for k, v in out.items()}


RUBRIC_ROW = ("rubrics", (("pool", "rubric/pool_size"), ("admitted", "rubric/admitted"), ("retired", "rubric/retired")))


def signal_line(metrics: Mapping[str, float]) -> str | None:
    """Is the judge helping: the step's verdict agreement with the outcome order in mixed groups
    and what shaping moved in zero-variance groups; None when the step judged no edge."""
    if "signal/agreement" not in metrics and "signal/agree_edges" not in metrics:
        return None
    agree, disagree = metrics.get("signal/agree_edges", 0.0), metrics.get("signal/disagree_edges", 0.0)
    rate = metrics.get("signal/agreement")
    cells = [f"agree {'-' if rate is None else short_number(rate)} ({agree:.0f}/{agree + disagree:.0f} edges, "
             f"{metrics.get('signal/tie_edges', 0.0):.0f} ties)"]
    if "signal/zero_var_shaped_share" in metrics:
        cells.append(f"zero-var shaped {short_number(metrics['signal/zero_var_shaped_share'])}")
    if "signal/zero_var_abs_shift" in metrics:
        cells.append(f"|dA| {short_number(metrics['signal/zero_var_abs_shift'])}")
    return f"  {'signal':<8} " + "   ".join(cells)


def console_lines(metrics: Mapping[str, float]) -> list[str]:
    """ARBOR's console rows under every run's: the common pool and the step's lifecycle, then the judge signal."""
    rows = (summary_row(*RUBRIC_ROW, metrics), signal_line(metrics))
    return [row for row in rows if row is not None]


def events_markdown(step: int, events: Rows, pool: str | None) -> str:
    """The step's rubric events as a markdown table (variance, Pearson, n_r and rho_r as stored), then the pool."""
    lines = [f"## Step {step} rubric events", "",
             "| seq | event | rubric | title | variance | pearson | n_r | rho_r | reason |",
             "|---|---|---|---|---|---|---|---|---|"]
    for e in sorted(events, key=lambda e: e["seq"]):
        cells: Sequence[Any] = [e.get(k) for k in ("seq", "event", "rubric_id", "title", "variance", "pearson", "n_r",
                                                   "rho_r", "reason")]
        lines.append("| " + " | ".join("" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
                                       for v in cells) + " |")
    return "\n".join(lines) + (f"\n\n**Common pool:** {pool}\n" if pool else "\n")
