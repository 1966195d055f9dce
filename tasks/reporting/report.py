"""``arbor report RUN_ID``: the paper's analyses of one run as markdown + PNG, every figure from the SQL views.

Written under ``{home}/reports/{run_id}/`` (``report.md`` and one PNG per figure). Sections (paper refs):

- Table 1 (§4.2): EM, F1 and LLM-judge accuracy of the final evaluation per test split and their average, ± SE over
  questions (``tasks.reporting.table1``).
- Table 2 (§4.3): zero-variance group fractions under R_base and R_total, split all-correct / all-wrong /
  mixed-uniform, with the relative change  Delta_rel = (total - base) / base  (view ``zero_variance_groups``).
- Table 3 (§4.5): most reused common rubrics, uses = query-groups scored (view ``rubric_reuse``).
- Figure 5 (App. C.4): cumulative share of scoring events against the fraction of rubrics ranked by reuse, with the
  top-5% / top-20% shares (views ``rubric_reuse``, ``rubric_reuse_concentration``).
- The lifecycle (§3.3, §3.4): the tie rate of pairwise verdicts, the shaping filter's pass share by group pattern and
  each common rubric's lifetime (ARBOR's views ``verdict_ties``, ``filter_pass_by_pattern``, ``rubric_lifetimes``).
- Rubric history (§3.3): each common rubric's within-group score variance and cumulative Pearson rho_r per step
  (view ``rubric_history``).
- Consolidation lineage (App. D): each common rubric's drafts and the questions they were induced from
  (view ``rubric_lineage``).
- Judge calls, cache hits, errors, tokens and cost per role (view ``judge_cost_per_step``).
- ARCO, for a run of ``run.method=arco``: the rubric model's calibration per step (sum of step scores
  against the outcome, by outcome class; view ``mu_calibration``) and the distribution of the per-turn advantages
  by phase and position bucket (``turn_advantages``).
- Figure 4 (§4.6): when runs of the same profile differ in lambda or K_consol, average official LLM-judge accuracy
  (pass@1, App. C.1) against each, one at a time, with the GRPO runs as the dashed baseline (``runs``,
  ``eval_results``).

Every query is a file in ``sql/queries/`` with the run id bound as ``$run_id``; the report prints each one next to
what it produced, with the ``arbor sql --file ... --param run_id=...`` line that reruns it.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arbor.paths import arbor_home

TOP_RUBRICS = 10  # Table 3 rows (the paper shows the top 5)
HISTORY_RUBRICS = 8  # rubrics drawn in the history figure (most used first)
# the paper's Table 2, Qwen3-8B (§4.3): zero-variance group fractions under R_base and R_total over ARBOR training
PAPER_TABLE2_QWEN3_8B = {"R_base": {"all_correct": 0.235, "all_wrong": 0.143, "mixed_uniform": 0.029, "total": 0.407},
                         "R_total": {"all_correct": 0.162, "all_wrong": 0.056, "mixed_uniform": 0.016, "total": 0.234}}
TABLE2_KINDS = (("all_correct", "All-corr."), ("all_wrong", "All-wrong"), ("mixed_uniform", "Mixed-uni."),
                ("total", "Total"))


class ReportError(ValueError):
    """A report that cannot be built (unknown run id)."""


@dataclass(frozen=True)
class ReportPaths:
    directory: Path
    markdown: Path
    figures: dict[str, Path] = field(default_factory=dict)
    queries: list[str] = field(default_factory=list)


def _shown(name: str, **params: Any) -> str:
    """``sql/queries/<name>.sql`` as the report prints it: the ``arbor sql`` line that reruns it, then its SQL."""
    from arbor.storage.sql import QUERIES_DIR, sql_file

    args = " ".join("--param " + shlex.quote(f"{k}={v}") for k, v in params.items())
    path = shlex.quote(str(QUERIES_DIR / f"{name}.sql"))  # absolute: it runs from any folder, installed or not
    return f"-- arbor sql --file {path} {args}\n{sql_file(name).strip()}"


def _query(name: str, home: Any, **params: Any) -> tuple[list[dict[str, Any]], str]:
    """The rows of ``sql/queries/<name>.sql`` with ``params`` bound, and the query as the report prints it."""
    from arbor.storage.sql import run_file

    return run_file(name, params, home=home), _shown(name, **params)


# ---- the figures' data (each returns the SQL it ran and what it computed) ------------------------------------------

@dataclass(frozen=True)
class Table2:
    """Fractions of query-groups with zero reward variance (§4.3); ``rel`` = (total - base) / base per kind."""

    n_groups: int
    base: dict[str, float]
    total: dict[str, float]
    rel: dict[str, float | None]
    sql: str


def table2(run_id: str, home: Any = None) -> Table2 | None:
    rows, sql = _query("table2_zero_variance", home, run_id=run_id)
    if not rows:
        return None
    r = rows[0]
    base = {k: float(r[f"base_{k}"]) for k, _ in TABLE2_KINDS}
    total = {k: float(r[f"total_{k}"]) for k, _ in TABLE2_KINDS}
    rel = {k: (total[k] - base[k]) / base[k] if base[k] > 0 else None for k, _ in TABLE2_KINDS}
    return Table2(int(r["n_groups"]), base, total, rel, sql)


def zero_variance_by_step(run_id: str, home: Any = None) -> tuple[list[dict[str, Any]], str]:
    """Per-step fractions of zero-variance groups under R_base and R_total (the Table 2 view at level 'step')."""
    return _query("zero_variance_by_step", home, run_id=run_id)


def judge_cost(run_id: str, home: Any = None) -> tuple[list[dict[str, Any]], str]:
    """Judge calls, cache hits, errors, tokens and cost per role over the run (view ``judge_cost_per_step``)."""
    return _query("judge_cost_by_role", home, run_id=run_id)


@dataclass(frozen=True)
class Reuse:
    """Table 3 rows, the Figure 5 curve and the concentration figures (App. C.4)."""

    top: list[dict[str, Any]]  # rank, rubric_id, title, uses
    curve: list[tuple[float, float]]  # (fraction of rubrics, cumulative share of scoring events)
    concentration: dict[float, float | None]  # top fraction -> share
    n_rubrics: int
    scoring_events: int
    sql: list[str]


def reuse(run_id: str, home: Any = None, top_n: int = TOP_RUBRICS) -> Reuse:
    top, sql_top = _query("top_reused_rubrics", home, run_id=run_id, top_n=int(top_n))
    curve_rows, sql_curve = _query("reuse_curve", home, run_id=run_id)
    conc_rows, sql_conc = _query("reuse_concentration", home, run_id=run_id)
    conc = {round(float(r["top_fraction"]), 6): (None if r["share"] is None else float(r["share"]))
            for r in conc_rows}
    curve = [(float(r["rubric_fraction"]), float(r["cum_share"] or 0.0)) for r in curve_rows]
    n = int(curve_rows[0]["n_rubrics"]) if curve_rows else 0
    events = int(curve_rows[0]["scoring_events"] or 0) if curve_rows else 0
    return Reuse(top, curve, conc, n, events, [sql_top, sql_curve, sql_conc])


def rubric_history(run_id: str, home: Any = None) -> tuple[dict[str, list[dict[str, Any]]], str]:
    """rubric_id -> per-step rows (step, n_groups, mean_variance, rho_r, ...), rubrics ordered by uses."""
    rows, sql = _query("rubric_history_by_reuse", home, run_id=run_id)
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["rubric_id"], []).append(r)
    return out, sql


def lineage(run_id: str, home: Any = None) -> tuple[dict[str, dict[str, Any]], str]:
    """common_rubric_id -> {title, status, drafts: [draft_rubric_id, draft_title, draft_step, group, question]}."""
    rows, sql = _query("consolidation_lineage", home, run_id=run_id)
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        c = out.setdefault(r["common_rubric_id"], {"title": r["common_title"], "status": r["common_status"],
                                                   "step": r["consolidated_step"], "drafts": []})
        c["drafts"].append({k: r[k] for k in ("draft_rubric_id", "draft_title", "draft_step", "group",
                                              "question_id", "question")})
    return out, sql


@dataclass(frozen=True)
class Sweep:
    """Figure 4: one point per run of the profile; ``metric`` names what y is (accuracy when judged)."""

    points: list[dict[str, Any]]  # run_id, method, lambda_, k_consol, acc, f1
    this: dict[str, Any] | None
    metric: str
    sql: str

    def varies(self) -> bool:
        arbor = [p for p in self.points if p["method"] == "arbor"]
        return len({p["lambda_"] for p in arbor}) > 1 or len({p["k_consol"] for p in arbor}) > 1


def sweep(run_id: str, home: Any = None) -> Sweep:
    """Runs of ``run_id``'s profile with their lambda, K_consol (from ``config_json``) and average pass@1 at their
    latest evaluated step: accuracy under the judge with the most rows there (ties: name), and F1."""
    points, sql = _query("profile_sweep", home, run_id=run_id)
    metric = "acc" if points and all(p["acc"] is not None for p in points if p["f1"] is not None) else "f1"
    this = next((p for p in points if p["run_id"] == run_id), None)
    return Sweep(points, this, metric, sql)


# ---- rendering ---------------------------------------------------------------------------------------------------

def _pct(v: float | None, signed: bool = False) -> str:
    return "-" if v is None else (f"{100 * v:+.1f}%" if signed else f"{100 * v:.1f}%")


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda c: str(c).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows])


def _sql_block(*sqls: str) -> str:
    return "\n".join(f"```sql\n{s.strip()};\n```" for s in sqls)


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_table2(t: Table2, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = range(len(TABLE2_KINDS))
    ax.bar([x - 0.2 for x in xs], [100 * t.base[k] for k, _ in TABLE2_KINDS], 0.4, label="R_base")
    ax.bar([x + 0.2 for x in xs], [100 * t.total[k] for k, _ in TABLE2_KINDS], 0.4, label="R_total")
    ax.set_xticks(list(xs), [lab for _, lab in TABLE2_KINDS])
    ax.set_ylabel("% of query-groups with zero variance")
    ax.set_title("Zero-variance groups (Table 2)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_zero_by_step(rows: list[dict[str, Any]], path: Path) -> None:
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = [r["step"] for r in rows]
    ax.plot(steps, [100 * r["base_total"] for r in rows], marker="o", ms=3, label="R_base")
    ax.plot(steps, [100 * r["total_total"] for r in rows], marker="o", ms=3, label="R_total")
    ax.set_xlabel("step")
    ax.set_ylabel("% zero-variance groups")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Zero-variance groups per step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_reuse(r: Reuse, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4))
    xs = [0.0] + [x for x, _ in r.curve]
    ys = [0.0] + [y for _, y in r.curve]
    ax.plot(xs, ys, marker="o", ms=3, label="common rubrics ranked by reuse")
    ax.plot([0, 1], [0, 1], ls="--", c="gray", label="even distribution")
    for f, share in r.concentration.items():
        if share is not None:
            ax.axvline(f, ls=":", c="k", lw=0.8)
            ax.annotate(f"top {100 * f:.0f}%: {100 * share:.0f}%", (f, share), textcoords="offset points",
                        xytext=(5, -12))
    ax.set_xlabel("fraction of common rubrics")
    ax.set_ylabel("cumulative share of scoring events")
    ax.set_title("Reuse distribution (Figure 5)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_history(hist: dict[str, list[dict[str, Any]]], path: Path) -> None:
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for rid, rows in list(hist.items())[:HISTORY_RUBRICS]:
        steps = [r["step"] for r in rows]
        a1.plot(steps, [r["mean_variance"] for r in rows], marker="o", ms=3, label=rid)
        a2.plot(steps, [r["rho_r"] for r in rows], marker="o", ms=3, label=rid)
    a1.set_title("within-group score variance (mean over groups)")
    a2.set_title("cumulative Pearson rho_r with F1")
    from matplotlib.ticker import MaxNLocator

    for a in (a1, a2):
        a.set_xlabel("step")
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
    a2.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_sweep(s: Sweep, path: Path) -> None:
    plt = _plt()
    this = s.this or {}
    arbor = [p for p in s.points if p["method"] == "arbor" and p[s.metric] is not None]
    base = [p[s.metric] for p in s.points if p["method"] == "grpo" and p[s.metric] is not None]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, key, fixed, label in ((axes[0], "lambda_", "k_consol", "lambda"), (axes[1], "k_consol", "lambda_", "K_consol")):
        pts = sorted((p[key], 100 * p[s.metric]) for p in arbor if p[fixed] == this.get(fixed))
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label="ARBOR")
        if base:
            ax.axhline(100 * sum(base) / len(base), ls="--", c="gray", label="GRPO")
        ax.set_xlabel(f"{label} ({fixed} = {this.get(fixed)})")
        ax.set_ylabel("avg. LLM-judge accuracy (%)" if s.metric == "acc" else "avg. F1 (%)")
        ax.legend(fontsize=8)
    axes[0].set_title("(a) lambda")
    axes[1].set_title("(b) K_consol")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_calibration(rows: list[dict[str, Any]], path: Path) -> None:
    """Per step: mean sum of mu's step scores (solid) against mean R (dashed), one colour per outcome class."""
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for cls, colour in (("positive", "tab:green"), ("negative", "tab:red")):
        mine = [r for r in rows if r["outcome_class"] == cls]
        if not mine:
            continue
        steps = [r["step"] for r in mine]
        ax.plot(steps, [r["mean_score_sum"] for r in mine], marker="o", ms=3, color=colour,
                label=f"{cls}: sum of step scores")
        ax.plot(steps, [r["mean_outcome"] for r in mine], ls="--", color=colour, label=f"{cls}: R")
    ax.set_xlabel("step")
    ax.set_ylabel("mean over trajectories")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("mu's calibration (decomposition constraint)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_advantages(rows: list[dict[str, Any]], path: Path) -> None:
    """Histograms of the per-turn advantages, one panel per phase, one series per position bucket."""
    plt = _plt()
    phases = [p for p in ("sparse", "dense") if any(r["phase"] == p for r in rows)] or ["sparse"]
    fig, axes = plt.subplots(1, len(phases), figsize=(5 * len(phases), 3.5), squeeze=False)
    for ax, phase in zip(axes[0], phases, strict=True):
        mine = [r for r in rows if r["phase"] == phase]
        for bucket in sorted({r["bucket"] for r in mine}):
            vals = [float(r["advantage"]) for r in mine if r["bucket"] == bucket]
            ax.hist(vals, bins=30, alpha=0.5, label=f"{bucket} ({len(vals)})")
        ax.set_xlabel("advantage A_t")
        ax.set_ylabel("turns")
        ax.set_title(f"{phase} phase")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _num(v: Any, fmt: str = "{:.3f}") -> str:
    return "" if v is None else fmt.format(v)


def judge_signal_panel(run_id: str, home: Any, queries: list[str]) -> list[str]:
    """Is my judge helping?: the ``judge_signal_quality`` view of an ARBOR run, one row per step
    and active rubric; nothing for a run (or workspace) without ARBOR's verdicts."""
    from arbor.storage.sql import has_relation

    if not has_relation("judge_signal_quality", home=home):
        return []
    rows, sql = _query("judge_signal_quality_of_run", home, run_id=run_id)
    if not rows:
        return []
    queries.append(sql)
    return ["## Is the judge helping? Verdicts against the outcome, shaping in zero-variance groups", "",
            "Agreement: in mixed groups, the share of the rubric's decisive verdicts on edges whose base rewards differ "
            "that prefer the higher-reward trajectory (ties and failed calls apart). Zero-variance groups: the share "
            "that shaping gave a signal and the mean |A_total - A_base| there (A: reward minus group mean).", "",
            _md_table(["Step", "Rubric", "Mixed groups", "Agree / disagree / tie", "Agreement", "Zero-var groups",
                       "Shaped share", "Mean |dA|", "Drafts admitted / rejected (variance, Pearson, other)"],
                      [[str(x["step"]), x["rubric_id"] or "(none active)", _num(x["mixed_groups"], "{}"),
                        f"{x['agree']} / {x['disagree']} / {x['ties']}", _num(x["agreement_rate"], "{:.1%}"),
                        str(x["zero_var_groups"]), _num(x["zero_var_shaped_share"], "{:.1%}"),
                        _num(x["zero_var_mean_abs_shift"]),
                        f"{x['drafts_admitted']} / {x['drafts_rejected']} ({x['rejected_variance']}, "
                        f"{x['rejected_pearson']}, {x['rejected_other']})"] for x in rows]), "",
            _sql_block(sql), ""]


def lifecycle_panel(run_id: str, home: Any, queries: list[str]) -> list[str]:
    """Why a row reads as it does (ARBOR's lifecycle): the tie rate of the judge's pairwise verdicts, the share of
    (rubric, group) scorings that pass the shaping filter by group pattern, and each common rubric's lifetime
    (views ``verdict_ties``, ``filter_pass_by_pattern``, ``rubric_lifetimes``); nothing for a run without
    rubric scorings."""
    from arbor.storage.sql import has_relation

    if not has_relation("rubric_lifetimes", home=home):
        return []
    ties, sql_t = _query("verdict_ties_of_run", home, run_id=run_id)
    passes, sql_p = _query("filter_pass_of_run", home, run_id=run_id)
    lives, sql_l = _query("rubric_lifetimes_of_run", home, run_id=run_id)
    if not (ties or passes or lives):
        return []
    queries += [sql_t, sql_p, sql_l]
    md = ["## The lifecycle: ties, the shaping filter, rubric lifetimes (§3.3, §3.4)", ""]
    if ties:
        md += ["Ties among the judge's pairwise verdicts (failed calls apart), on edges whose base rewards are equal "
               "(only a process difference can break them) and on decisive edges.", "",
               _md_table(["Rubric", "Judged edges", "Tie rate", "Equal-outcome edges", "Tie rate there",
                          "Decisive edges", "Tie rate there"],
                         [[x["rubric_id"] or "(all)", str(x["judged_edges"]), _num(x["tie_rate"], "{:.1%}"),
                           str(x["equal_outcome_edges"]), _num(x["tie_rate_equal_outcome"], "{:.1%}"),
                           str(x["decisive_edges"]), _num(x["tie_rate_decisive"], "{:.1%}")] for x in ties]), "",
               _sql_block(sql_t), ""]
    if passes:
        md += ["(Rubric, group) scorings that passed the shaping filter, by the group's pattern (mixed: the base "
               "reward varies; the others are Table 2's zero-variance groups).", "",
               _md_table(["Pattern", "Scorings", "Passed", "Pass share", "Judge errors", "Mean variance"],
                         [[x["pattern"], str(x["scorings"]), str(x["passed"]), _num(x["pass_share"], "{:.1%}"),
                           str(x["judge_errors"]), _num(x["mean_variance"], "{:.4f}")] for x in passes]), "",
               _sql_block(sql_p), ""]
    if lives:
        md += ["Each common rubric's lifetime: steps in which it scored, uses (query-groups scored, Table 3's count) "
               "and uses whose scores passed the filter.", "",
               _md_table(["Rubric", "Title", "Entered", "Left", "Status", "Steps active", "Uses", "Kept uses",
                          "Reason"],
                         [[x["rubric_id"], x["title"] or "", str(x["entered_step"]), _num(x["left_step"], "{}"),
                           x["status"], str(x["steps_active"]), str(x["uses"]), str(x["kept_uses"]),
                           x["reason"] or ""] for x in lives]), "", _sql_block(sql_l), ""]
    return md


def judge_health_section(run_id: str, home: Any) -> tuple[list[str], str]:
    """The report's judge-health panel (view ``judge_health``): per step and role, the calls answered,
    cached, failed and refused, the commonest failure and refusal, and the groups the judge answered about. Empty
    when no judge call was recorded."""
    rows, sql = _query("judge_health_of_run", home, run_id=run_id)
    if not rows:
        return [], sql
    degraded = sorted({r["step"] for r in rows if r["degraded"]})
    note = (f"Degraded steps (a role's answers mostly refused): {', '.join(map(str, degraded))}." if degraded
            else "No step degraded.")

    def share(v: float | None) -> str:
        return "" if v is None else f"{v:.0%}"

    body = [[str(r["step"]), r["role"], str(r["calls"]), str(r["answered"]), str(r["cache_hits"]),
             f"{r['failed']} {share(r['failed_share'])}".strip(), f"{r['refused']} {share(r['refused_share'])}".strip(),
             r["top_error"] or "", r["top_refusal"] or "",
             f"{r['judged_groups']}/{r['n_groups']}" if r["n_groups"] is not None else str(r["judged_groups"]),
             "yes" if r["degraded"] else ""] for r in rows]
    return ["## Judge health: answered, failed, refused per step and role", "", note, "",
            _md_table(["Step", "Role", "Calls", "Answered", "Cached", "Failed", "Refused", "Commonest error",
                       "Commonest refusal", "Groups judged", "Degraded"], body), "", _sql_block(sql), ""], sql


def _known_run(run_id: str, home: Any) -> bool:
    rows, _ = _query("run_row_count", home, run_id=run_id)
    return bool(rows[0]["n"])


def build_report(run_id: str, home: str | os.PathLike[str] | None = None,
                 out_dir: str | os.PathLike[str] | None = None) -> ReportPaths:
    """Write ``report.md`` and its PNGs for ``run_id`` under ``out_dir`` (default ``{home}/reports/{run_id}``)."""
    home_p = Path(home).expanduser() if home is not None else arbor_home()
    if not _known_run(run_id, home_p):
        raise ReportError(f"run {run_id!r} has no rows in runs, trajectories or rubric_events of {home_p}")
    out = Path(out_dir) if out_dir is not None else home_p / "reports" / run_id
    out.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Path] = {}
    queries: list[str] = []
    md = [f"# ARBOR report: run `{run_id}`", "",
          f"Workspace `{home_p}`. Every figure below is computed by the SQL printed with it "
          f"(rerun any of them with `arbor sql`).", ""]

    # Table 1
    from arbor.tasks.reporting.table1 import format_table1

    t1 = format_table1([run_id], home_p)
    queries.append(_shown("table1_of_runs", run_ids=[run_id]))
    md += ["## Table 1: the final evaluation on the test splits (§4.2)", ""]
    md += ([t1, "", f"Compare runs side by side: `arbor report {run_id} OTHER_RUN ...`.", ""] if t1 else
           ["No evaluation stored for this run (`run.eval_final`, `run.eval_every`).", ""])
    md += [_sql_block(queries[-1]), ""]

    # Table 2
    t2 = table2(run_id, home_p)
    md += ["## Table 2: zero-variance query-groups under R_base and R_total (§4.3)", ""]
    if t2 is None:
        md += ["No trajectories stored for this run.", ""]
        queries.append(_shown("table2_zero_variance", run_id=run_id))
    else:
        queries.append(t2.sql)
        rows = [["R_base"] + [_pct(t2.base[k]) for k, _ in TABLE2_KINDS],
                ["R_total"] + [_pct(t2.total[k]) for k, _ in TABLE2_KINDS],
                ["Delta_rel"] + [_pct(t2.rel[k], signed=True) for k, _ in TABLE2_KINDS]]
        rows += [[f"Paper, Qwen3-8B, {r}"] + [_pct(PAPER_TABLE2_QWEN3_8B[r][k]) for k, _ in TABLE2_KINDS]
                 for r in ("R_base", "R_total")]
        md += [_md_table(["Reward"] + [lab for _, lab in TABLE2_KINDS], rows), "",
               f"{t2.n_groups} query-groups over the run. Delta_rel = (R_total - R_base) / R_base. The paper's rows "
               "are its Table 2 for Qwen3-8B over ARBOR training, for scale.", ""]
        figures["table2"] = out / "table2_zero_variance.png"
        _plot_table2(t2, figures["table2"])
        md += [f"![zero-variance groups]({figures['table2'].name})", "", _sql_block(t2.sql), ""]
        per_step, sql_s = zero_variance_by_step(run_id, home_p)
        queries.append(sql_s)
        figures["zero_by_step"] = out / "zero_variance_by_step.png"
        _plot_zero_by_step(per_step, figures["zero_by_step"])
        md += [_md_table(["Step", "Groups", "Zero var. R_base", "Zero var. R_total", "Converted"],
                         [[str(x["step"]), str(x["n_groups"]), _pct(x["base_total"]), _pct(x["total_total"]),
                           _pct(x["converted_share"])] for x in per_step]), "",
               "Converted = share of R_base zero-variance groups given nonzero variance by rubric shaping.", "",
               f"![zero-variance groups per step]({figures['zero_by_step'].name})", "", _sql_block(sql_s), ""]

    # Table 3 + Figure 5
    r = reuse(run_id, home_p)
    queries += r.sql
    md += ["## Table 3: most reused common rubrics (§4.5)", ""]
    if not r.top:
        md += ["No common rubrics in this run.", ""]
    else:
        md += [_md_table(["Rank", "Common rubric", "Id", "Uses"],
                         [[str(x["rank"]), x["title"] or "", x["rubric_id"], str(x["uses"])] for x in r.top]), "",
               "Uses = number of query-groups the rubric was activated to score.", "", _sql_block(r.sql[0]), ""]
    md += ["## Figure 5: reuse distribution (App. C.4)", ""]
    if r.n_rubrics and r.scoring_events:
        t5, t20 = r.concentration.get(0.05), r.concentration.get(0.2)
        md += [f"{r.n_rubrics} common rubrics, {r.scoring_events} scoring events. The top 5% of rubrics cover "
               f"{_pct(t5)} of scoring events and the top 20% cover {_pct(t20)} (paper: 20% and 44%).", ""]
        figures["figure5"] = out / "figure5_reuse.png"
        _plot_reuse(r, figures["figure5"])
        md += [f"![reuse distribution]({figures['figure5'].name})", "", _sql_block(r.sql[1], r.sql[2]), ""]
    else:
        md += ["No scoring events yet.", "", _sql_block(r.sql[1], r.sql[2]), ""]

    # Rubric history
    hist, sql_h = rubric_history(run_id, home_p)
    queries.append(sql_h)
    md += ["## Rubric history: variance and cumulative Pearson per step (§3.3)", ""]
    if hist:
        figures["history"] = out / "rubric_history.png"
        _plot_history(hist, figures["history"])
        shown = list(hist)[:HISTORY_RUBRICS]
        md += [f"![rubric history]({figures['history'].name})", "",
               f"Most used {len(shown)} of {len(hist)} rubrics drawn.", ""]
        rows = [[rid, str(x["step"]), str(x["n_groups"]), str(x["n_kept"]), f"{x['mean_variance']:.4f}"
                 if x["mean_variance"] is not None else "-",
                 f"{x['rho_r']:.3f}" if x["rho_r"] is not None else "-", str(x["n_r"])]
                for rid in shown for x in hist[rid]]
        md += [_md_table(["Rubric", "Step", "Groups", "Kept", "Mean variance", "rho_r", "n_r"], rows), ""]
    else:
        md += ["No rubric activations in this run.", ""]
    md += [_sql_block(sql_h), ""]

    # Lineage
    lin, sql_l = lineage(run_id, home_p)
    queries.append(sql_l)
    md += ["## Consolidation lineage (App. D)", ""]
    if not lin:
        md += ["No consolidations recorded.", ""]
    for cid, c in lin.items():
        md += [f"### {c['title'] or cid} (`{cid}`, step {c['step']}, {c['status'] or 'unknown'})", ""]
        md += [_md_table(["Draft", "Title", "Induced at step", "Group", "Source question"],
                         [[d["draft_rubric_id"], d["draft_title"] or "", str(d["draft_step"]), str(d["group"]),
                           d["question"] or d["question_id"] or ""] for d in c["drafts"]]), ""]
    md += [_sql_block(sql_l), ""]

    # Judge cost
    cost, sql_c = judge_cost(run_id, home_p)
    queries.append(sql_c)
    md += ["## Judge calls and cost", ""]
    if cost:
        md += [_md_table(["Role", "Calls", "Cache hits", "Errors", "Prompt tokens", "Completion tokens", "Cost (USD)"],
                         [[x["role"], str(x["n_calls"]), str(x["n_cache_hits"]), str(x["n_errors"]),
                           str(x["prompt_tokens"]), str(x["completion_tokens"]), f"{x['cost_usd']:.4f}"]
                          for x in cost]), ""]
    else:
        md += ["No judge calls recorded.", ""]
    md += [_sql_block(sql_c), ""]
    tries, sql_t = _query("judge_attempts_by_role", home_p, run_id=run_id)
    if any(x["mean_attempts"] != 1 for x in tries):  # a judge that needed retries: what each attempt ended in
        queries.append(sql_t)
        md += ["### Judge attempts (calls sent; retries and what they fixed)", "",
               _md_table(["Role", "Calls", "Valid", "Valid at first attempt", "Mean attempts", "Invalid attempts",
                          "Truncated attempts", "Other failed attempts"],
                         [[x["role"], str(x["calls"]), f"{x['valid_rate']:.1%}", str(x["first_attempt_valid"]),
                           f"{x['mean_attempts']:.2f}", str(x["invalid_attempts"]), str(x["truncated_attempts"]),
                           str(x["other_failed_attempts"])] for x in tries]), "", _sql_block(sql_t), ""]

    health_md, sql_h = judge_health_section(run_id, home_p)
    if health_md:
        queries.append(sql_h)
        md += health_md

    # ARCO (its view exists in a workspace where an ARCO run declared its tables)
    from arbor.storage.sql import has_relation

    md += judge_signal_panel(run_id, home_p, queries)
    md += lifecycle_panel(run_id, home_p, queries)

    calib, sql_cal = (_query("mu_calibration_of_run", home_p, run_id=run_id)
                      if has_relation("mu_calibration", home=home_p) else ([], ""))
    if calib:
        advs, sql_adv = _query("turn_advantages_of_run", home_p, run_id=run_id)
        queries += [sql_cal, sql_adv]
        figures["mu_calibration"] = out / "mu_calibration.png"
        _plot_calibration(calib, figures["mu_calibration"])
        figures["turn_advantages"] = out / "turn_advantages.png"
        _plot_advantages(advs, figures["turn_advantages"])
        md += ["## ARCO: the rubric model's calibration and the per-turn credit", "",
               "The decomposition constraint asks the step scores of a trajectory to add up to its outcome R.", "",
               _md_table(["Step", "Outcome", "Trajectories", "Mean R", "Mean sum of step scores", "Mean abs. gap",
                          "Within-trajectory spread"],
                         [[str(x["step"]), x["outcome_class"], str(x["trajectories"]), f"{x['mean_outcome']:.3f}",
                           f"{x['mean_score_sum']:.3f}", f"{x['mean_abs_gap']:.3f}",
                           f"{x['mean_within_spread']:.3f}"] for x in calib]), "",
               f"![mu calibration]({figures['mu_calibration'].name})", "", _sql_block(sql_cal), "",
               f"![per-turn advantages]({figures['turn_advantages'].name})", "", _sql_block(sql_adv), ""]

    # Figure 4
    sw = sweep(run_id, home_p)
    if sw.varies():
        queries.append(sw.sql)
        figures["figure4"] = out / "figure4_sweep.png"
        _plot_sweep(sw, figures["figure4"])
        name = "avg. official LLM-judge accuracy" if sw.metric == "acc" else "avg. F1 (no judge verdicts stored)"
        md += ["## Figure 4: hyperparameter sensitivity (§4.6)", "",
               _md_table(["Run", "Method", "lambda", "K_consol", name],
                         [[p["run_id"], p["method"] or "", str(p["lambda_"]), str(p["k_consol"]),
                           _pct(p[sw.metric])] for p in sw.points]), "",
               f"![hyperparameter sweep]({figures['figure4'].name})", "", _sql_block(sw.sql), ""]

    path = out / "report.md"
    tmp = out / "report.md.inprogress"
    tmp.write_text("\n".join(md))
    os.replace(tmp, path)
    (out / "queries.json").write_text(json.dumps(queries, indent=1))
    return ReportPaths(out, path, figures, queries)
