"""Paper Table 1 (§4.2): one row per run, one column per benchmark plus the average, for EM, F1 and LLM-judge
accuracy at each run's final evaluation (``sql/queries/table1_of_runs.sql``), each with its standard error over the
benchmark's questions. The average is the unweighted mean of the benchmarks, as the paper's Avg. column; its SE adds
the benchmarks' in quadrature (independent question sets)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

METRICS = (("em", "EM"), ("f1", "F1"), ("acc", "LLM-judge acc."))
# Table 1's column order for the ARPO test splits; any other split follows in name order
PAPER_ORDER = ("bamboogle", "hotpotqa", "musique", "2wiki")


@dataclass(frozen=True)
class Cell:
    mean: float | None
    se: float

    def __str__(self) -> str:
        return "-" if self.mean is None else f"{100 * self.mean:.1f} ± {100 * self.se:.1f}"


def split_name(split: str) -> str:
    """``bench:hotpotqa`` -> ``hotpotqa``."""
    return split.split(":", 1)[-1]


def average(cells: Sequence[Cell]) -> Cell:
    """The unweighted mean over benchmarks; SE = sqrt(sum SE^2) / n. None when a benchmark has no value."""
    if not cells or any(c.mean is None for c in cells):
        return Cell(None, 0.0)
    n = len(cells)
    return Cell(sum(c.mean for c in cells if c.mean is not None) / n, math.sqrt(sum(c.se ** 2 for c in cells)) / n)


def table1_rows(run_ids: Sequence[str], home: Any = None) -> tuple[list[str], dict[str, dict[str, dict[str, Cell]]],
                                                                    str]:
    """(splits in Table 1's order, {run: {metric: {split or "avg": Cell}}}, the SQL as run)."""
    from arbor.storage.sql import run_file, sql_file

    rows = run_file("table1_of_runs", {"run_ids": list(run_ids)}, home=home)
    names = {split_name(r["split"]) for r in rows}
    splits = [s for s in PAPER_ORDER if s in names] + sorted(names - set(PAPER_ORDER))
    out: dict[str, dict[str, dict[str, Cell]]] = {}
    for r in rows:
        per = out.setdefault(r["run_id"], {m: {} for m, _ in METRICS})
        for m, _ in METRICS:
            per[m][split_name(r["split"])] = Cell(None if r[m] is None else float(r[m]), float(r[f"{m}_se"] or 0))
    for per in out.values():
        for m, _ in METRICS:
            per[m]["avg"] = average([per[m].get(s, Cell(None, 0.0)) for s in splits])
    return splits, out, sql_file("table1_of_runs")


def format_table1(run_ids: Sequence[str], home: Any = None) -> str:
    """Markdown: one table per metric (rows: runs; columns: benchmarks and Avg.), in percent ± SE; "" without any
    evaluation stored for these runs."""
    splits, cells, _ = table1_rows(run_ids, home)
    if not cells:
        return ""
    parts = []
    for m, label in METRICS:
        head = ["Run", *splits, "Avg."]
        body = [[rid, *(str(cells[rid][m].get(s, Cell(None, 0.0))) for s in splits), str(cells[rid][m]["avg"])]
                for rid in run_ids if rid in cells]
        parts.append(f"**{label}** (%, ± SE over questions)\n\n" + "\n".join(
            ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(b) + " |" for b in body)]))
    return "\n\n".join(parts)
