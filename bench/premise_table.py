"""The premise table (bench/premise.py --table HOME ...): every finished (row, seed) of the registered rows found in
the homes, its final exam, and the figures that explain a row, each from the run's stored stages through SQL.

Per row: seeds; final exam F1 per seed; ΔF1 against the start (``common_dice_delta``); the paired difference to
GRPO over the seeds both rows have (mean ± SE, and its distance in SE: the registered decision rule); Table 2's
zero-variance share under R_base -> R_total with its split (all-correct / all-wrong / mixed-uniform); the active
rubrics' agreement with the outcome order in mixed groups; the tie rate of pairwise verdicts; the shaping filter's
pass share on mixed and on zero-variance groups; common rubrics per run, their mean steps active and uses, how many
retired; the top 5 % / top 20 % reuse concentration.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import learning
import premise

from arbor.storage.sql import run_file
from arbor.tasks.reporting.curves import MeanSE, common_dice_delta, mean_se, question_f1


def _run_id(row: str, seed: int, start: Path) -> str:
    method, _ = premise.ROWS[row]
    return f"learn-{method}-s{seed}-{learning.settings_tag(premise.row_sets(row), 'tiny-world', start)}"


def _finished(home: Path) -> dict[tuple[str, int], tuple[Path, str]]:
    """(row, seed) -> (home, run id) of every run of the table whose exam is stored in ``home``."""
    from arbor.tasks.methods.arbor import Arbor  # noqa: F401  (ARBOR's tables and views are known once imported)

    starts = [p for p in (home / "sft").glob("tiny-world-*") if (p / "arbor_sft.json").exists()]
    out = {}
    for start in starts:
        for row in premise.ROWS:
            for seed in range(12):
                rid = _run_id(row, seed, start)
                if question_f1([f"exam-{rid}"], home)[f"exam-{rid}"]:
                    out[(row, seed)] = (home, rid)
    return out


def _paired(a: dict[int, float], b: dict[int, float]) -> MeanSE | None:
    seeds = sorted(set(a) & set(b))
    return mean_se([a[s] - b[s] for s in seeds]) if len(seeds) >= 2 else None


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _pct(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.0%}"


def run_figures(home: Path, rid: str) -> dict[str, Any]:
    """One run's diagnostics, summed over its steps (ratios formed by the caller over the row's seeds)."""
    p = {"run_id": rid}
    t2 = run_file("table2_zero_variance", p, home=home)[0]
    sig = run_file("judge_signal_quality_of_run", p, home=home)
    ties = [r for r in run_file("verdict_ties_of_run", p, home=home) if r["rubric_id"] is None]
    passes = {r["pattern"]: r for r in run_file("filter_pass_of_run", p, home=home)}
    lives = run_file("rubric_lifetimes_of_run", p, home=home)
    conc = {round(float(r["top_fraction"]), 2): r["share"] for r in run_file("reuse_concentration", p, home=home)}
    zero = [v for k, v in passes.items() if k != "mixed"]
    return {
        **{f"base_{k}": t2[f"base_{k}"] for k in ("total", "all_correct", "all_wrong", "mixed_uniform")},
        **{f"total_{k}": t2[f"total_{k}"] for k in ("total", "all_correct", "all_wrong", "mixed_uniform")},
        "agree": sum(r["agree"] for r in sig), "disagree": sum(r["disagree"] for r in sig),
        "judged": ties[0]["judged_edges"] if ties else 0, "ties": ties[0]["ties"] if ties else 0,
        "mixed_scorings": passes["mixed"]["scorings"] if "mixed" in passes else 0,
        "mixed_passed": passes["mixed"]["passed"] if "mixed" in passes else 0,
        "zero_scorings": sum(r["scorings"] for r in zero), "zero_passed": sum(r["passed"] for r in zero),
        "rubrics": len(lives), "retired": sum(r["status"] == "retired" for r in lives),
        "steps_active": sum(r["steps_active"] for r in lives), "uses": sum(r["uses"] for r in lives),
        "top5": conc.get(0.05), "top20": conc.get(0.2),
        "drafts_induced": sum(r["drafts_induced"] for r in {r["step"]: r for r in sig}.values()),
        "drafts_admitted": sum(r["drafts_admitted"] for r in {r["step"]: r for r in sig}.values()),
    }


def plot_rows(mean: dict[str, dict[int, float]], start: float, path: Path) -> None:
    """Each row's final exam F1 per seed (dots) and its mean ± 1 SE (bar), the start's exam F1 as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in premise.ROWS if r in mean]
    fig, ax = plt.subplots(figsize=(1.6 * len(rows) + 2, 3.6))
    for i, row in enumerate(rows):
        vals = list(mean[row].values())
        ms = mean_se(vals)
        assert ms is not None
        ax.errorbar([i], [ms.mean], yerr=[ms.se], fmt="s", color="black", capsize=6)
        ax.scatter([i + 0.12] * len(vals), vals, s=12, color="tab:blue", alpha=0.7)
    ax.axhline(start, ls="--", color="grey", lw=1, label="SFT start")
    ax.set_xticks(range(len(rows)), rows, rotation=15)
    ax.set_ylabel("final exam F1 (world:eval)")
    ax.set_title("tiny-world two-hop mix, 30 steps: mean ± 1 SE over seeds (dots: seeds)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_table(homes: list[Path], plot: Path | None = None) -> None:
    runs: dict[tuple[str, int], tuple[Path, str]] = {}
    for h in homes:
        runs.update(_finished(h))
    if not runs:
        print("no finished run of the table in", ", ".join(map(str, homes)))
        return
    start_q: dict[str, float] | None = None
    finals: dict[str, dict[int, dict[str, float]]] = {}
    figs: dict[str, dict[int, dict[str, Any]]] = {}
    for (row, seed), (home, rid) in sorted(runs.items()):
        start = next(p for p in (home / "sft").glob("tiny-world-*") if (p / "arbor_sft.json").exists())
        sq = question_f1([f"exam-{start.name}-premise"], home)[f"exam-{start.name}-premise"]
        if start_q is None:
            start_q = sq
        assert sq == start_q, f"{home}: the start's exam differs from the first home's (not the same start or dice)"
        finals.setdefault(row, {})[seed] = question_f1([f"exam-{rid}"], home)[f"exam-{rid}"]
        figs.setdefault(row, {})[seed] = run_figures(home, rid)
    assert start_q is not None
    mean = {row: {s: sum(q.values()) / len(q) for s, q in per.items()} for row, per in finals.items()}
    head = ["row", "seeds", "exam F1 per seed", "ΔF1 exam (common dice)", "vs GRPO (paired)", "SE distance",
            "zero-var base → total", "split base (corr/wrong/uni)", "split total", "agreement", "tie rate",
            "filter pass mixed / zero-var", "rubrics/run, steps active, uses, retired", "drafts induced/admitted",
            "reuse top5/top20"]
    body = []
    print(f"start: exam F1 {sum(start_q.values()) / len(start_q):.4f} over {len(start_q)} questions")
    for row in premise.ROWS:
        if row not in finals:
            continue
        seeds = sorted(finals[row])
        d = common_dice_delta(start_q, [finals[row][s] for s in seeds])
        pair = _paired(mean[row], mean.get("grpo", {})) if row != "grpo" else None
        dist = f"{pair.mean / pair.se:+.1f}" if pair is not None and pair.se > 0 else ""
        f = figs[row]

        def avg(key: str, f: dict[int, dict[str, Any]] = f) -> float:
            return sum(float(x[key]) for x in f.values()) / len(f)

        def tot(key: str, f: dict[int, dict[str, Any]] = f) -> float:
            return sum(float(x[key] or 0) for x in f.values())

        n = len(f)
        rub = (f"{avg('rubrics'):.1f}, {_ratio(tot('steps_active'), tot('rubrics')) or 0:.1f}, "
               f"{_ratio(tot('uses'), tot('rubrics')) or 0:.1f}, {avg('retired'):.1f}") if tot("rubrics") else "-"
        t5 = [x["top5"] for x in f.values() if x["top5"] is not None]
        t20 = [x["top20"] for x in f.values() if x["top20"] is not None]
        body.append([
            row, str(len(seeds)), ", ".join(f"{mean[row][s]:.3f}" for s in seeds), f"{d.mean:+.4f} ± {d.se:.4f}",
            f"{pair.mean:+.4f} ± {pair.se:.4f}" if pair is not None else "", dist,
            f"{avg('base_total'):.3f} → {avg('total_total'):.3f}",
            f"{avg('base_all_correct'):.3f} / {avg('base_all_wrong'):.3f} / {avg('base_mixed_uniform'):.3f}",
            f"{avg('total_all_correct'):.3f} / {avg('total_all_wrong'):.3f} / {avg('total_mixed_uniform'):.3f}",
            f"{_pct(_ratio(tot('agree'), tot('agree') + tot('disagree')))} ({tot('agree'):.0f}/{tot('disagree'):.0f})"
            if tot("agree") + tot("disagree") else "-",
            _pct(_ratio(tot("ties"), tot("judged"))),
            f"{_pct(_ratio(tot('mixed_passed'), tot('mixed_scorings')))} / "
            f"{_pct(_ratio(tot('zero_passed'), tot('zero_scorings')))}" if tot("mixed_scorings") else "-",
            rub, f"{tot('drafts_induced') / n:.1f} / {tot('drafts_admitted') / n:.1f}",
            f"{_pct(sum(t5) / len(t5))} / {_pct(sum(t20) / len(t20))}" if t5 and t20 else "-",
        ])
    print(learning._render(head, body))
    if plot is not None:
        plot_rows(mean, sum(start_q.values()) / len(start_q), plot)
        print(f"plot: {plot}")
