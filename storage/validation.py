"""great-expectations suite for trajectory batches (docs/architecture.md).

A batch is refused before anything is written when any expectation fails; the error names each failing
expectation and the offending rows by ``traj_id``. great-expectations is imported lazily (it takes ~2-3 s) and runs
on an ephemeral context with progress bars off; it accepts pandas DataFrames only.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import pyarrow as pa

REQUIRED = ("traj_id", "run_id", "step", "group", "sample", "question_id", "question", "text",
            "format_valid", "em", "f1", "base_reward")
MAX_LISTED = 10


class ValidationError(ValueError):
    """A trajectory batch failed the suite; the message names the expectations and offending traj_ids."""


@lru_cache(maxsize=1)
def _batch_definition() -> Any:
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = ctx.data_sources.add_pandas("arbor_trajectories").add_dataframe_asset("batch")
    return asset.add_batch_definition_whole_dataframe("whole_batch")


def _invalid_rows_carry_minus_one(custom_reward: bool, format_gate: bool) -> bool:
    """Eq. 4's gate: a format-invalid row's base reward is -1, unless a ``reward.fn`` plug-in runs with the gate off
    (then the row carries the plug-in's value)."""
    return format_gate or not custom_reward


def _suite(k: int, custom_reward: bool = False,
           format_gate: bool = True) -> tuple[Any, dict[tuple[str, str], str]]:
    """The suite and, per (expectation type, column), the rule it checks in words (paper §3.1, eq. 4).

    ``custom_reward``: the base reward comes from a ``reward.fn`` plug-in, whose value may be any finite number (an
    EM minus a search price goes below 0); ``format_gate=False`` with it: format-invalid rows carry its value too."""
    import great_expectations as gx

    E = gx.expectations
    checks: list[tuple[Any, str]] = [
        (E.ExpectColumnValuesToNotBeNull(column=c), f"required column {c} is non-null") for c in REQUIRED
    ]
    checks += [
        (E.ExpectColumnValuesToBeUnique(column="traj_id"), "traj_id is unique"),
        (E.ExpectColumnValuesToBeBetween(column="f1", min_value=0.0, max_value=1.0), "F1 in [0, 1]"),
        (E.ExpectColumnValuesToBeBetween(column="em", min_value=0.0, max_value=1.0), "EM in [0, 1]"),
        (E.ExpectColumnValuesToBeInSet(column="base_reward_in_range", value_set=[True]),
         "base reward is a finite number (reward.fn)" if custom_reward else "base reward in {-1} ∪ [0, 1]"),
        (E.ExpectColumnValuesToBeInSet(column="group_size", value_set=[k]),
         f"every query-group has exactly K = {k} trajectories"),
        (E.ExpectColumnValuesToBeInSet(column="format_invalid_consistent", value_set=[True]),
         "format-invalid rows have F1 = 0, EM = 0 and base reward -1"
         if _invalid_rows_carry_minus_one(custom_reward, format_gate)
         else "format-invalid rows have F1 = 0 and EM = 0"),
    ]
    suite = gx.ExpectationSuite(name=f"trajectories_k{k}_{'fn' if custom_reward else 'f1'}_{format_gate}")
    words = {}
    for exp, text in checks:
        suite.add_expectation(exp)
        words[(exp.expectation_type, exp.column)] = text
    return suite, words


def _frame(rows: list[dict[str, Any]] | pa.Table, custom_reward: bool = False, format_gate: bool = True) -> Any:
    import numpy as np
    import pandas as pd

    df = rows.to_pandas() if isinstance(rows, pa.Table) else pd.DataFrame(list(rows))
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValidationError(f"trajectory batch is missing required column(s): {', '.join(missing)}")
    df = df.reset_index(drop=True)
    base = pd.to_numeric(df["base_reward"], errors="coerce")
    f1 = pd.to_numeric(df["f1"], errors="coerce")
    em = pd.to_numeric(df["em"], errors="coerce")
    valid = df["format_valid"].astype("boolean")
    in_range = np.isfinite(base) if custom_reward else (base == -1.0) | base.between(0.0, 1.0)
    df["base_reward_in_range"] = in_range.fillna(False).astype(bool)
    df["group_size"] = df.groupby(["run_id", "step", "group"], dropna=False)["traj_id"].transform("size")
    gated = (base == -1.0) if _invalid_rows_carry_minus_one(custom_reward, format_gate) else True
    df["format_invalid_consistent"] = (valid.fillna(True) | ((f1 == 0) & (em == 0) & gated)).fillna(False).astype(bool)
    return df


def validate_trajectories(rows: list[dict[str, Any]] | pa.Table, k: int, *, custom_reward: bool = False,
                          format_gate: bool = True) -> None:
    """Run the suite on one batch; raise ValidationError naming every failing expectation and its rows.
    ``custom_reward`` / ``format_gate``: a ``reward.fn`` plug-in and ``reward.format_gate`` (see ``_suite``)."""
    if len(rows) == 0:
        return
    df = _frame(rows, custom_reward, format_gate)
    batch_definition = _batch_definition()  # creates the (ephemeral) context the suite needs
    suite, words = _suite(k, custom_reward, format_gate)
    result = batch_definition.get_batch(batch_parameters={"dataframe": df}).validate(
        suite, result_format="COMPLETE")
    if result.success:
        return
    problems = []
    for r in result.results:
        if r.success:
            continue
        cfg = r.expectation_config
        idx = r.result.get("unexpected_index_list") or []
        ids = [str(df.at[i, "traj_id"]) if df.at[i, "traj_id"] is not None else f"row {i}" for i in idx]
        listed = ", ".join(ids[:MAX_LISTED]) + (f" … and {len(ids) - MAX_LISTED} more" if len(ids) > MAX_LISTED else "")
        problems.append(f"{cfg.type}(column={cfg.kwargs.get('column')!r}) — {words.get((cfg.type, cfg.kwargs.get('column')), '')}: "
                        f"{len(ids)} offending row(s): {listed}")
    raise ValidationError("trajectory batch refused; nothing was written:\n  " + "\n  ".join(problems))


def write_trajectories(
    rows: list[dict[str, Any]] | pa.Table,
    k: int,
    *,
    run_id: str,
    step: int,
    stage: str = "rollout",
    home: str | os.PathLike[str] | None = None,
) -> Path:
    """Validate a trajectory batch (arbor's own reward, eq. 4), then write it as one stage file (nothing is written
    when it fails)."""
    from arbor.storage.parquet import write_stage

    validate_trajectories(rows, k)
    return write_stage("trajectories", rows, run_id=run_id, step=step, stage=stage, home=home)
