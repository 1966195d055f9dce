"""ARBOR's own table and view; its rubric lifecycle tables are the pipeline's (storage/schemas.py).

    rubric_verdicts   every pairwise verdict of the score stage (§3.4): the group, the active rubric, the sparse
                      graph's edge (i, j: sample indices), its outcome (1 i wins, 0.5 tie, 0 j wins, null failed) and
                      the two trajectories' base rewards, so that a verdict can be set against the outcome order

Views (``sql/``): ``judge_signal_quality`` — is my judge helping? Per step and active rubric: agreement of its
verdicts with the outcome order in mixed groups, what shaping moved in zero-variance groups, admission counts.
``verdict_ties`` — the tie rate of pairwise verdicts; ``filter_pass_by_pattern`` — the share of (rubric, group)
scorings that pass the shaping filter, by group pattern; ``rubric_lifetimes`` — each common rubric's steps active,
uses and how it left the pool.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from arbor.storage.schemas import F64, I64, TableSet, col, key

SQL = Path(__file__).parent / "sql"
# the lifecycle's diagnostics beside "is my judge helping?": ties, the filter by group pattern, lifetimes
VIEWS = ("judge_signal_quality", "verdict_ties", "filter_pass_by_pattern", "rubric_lifetimes")

RUBRIC_VERDICTS = pa.schema([
    key("run_id"), key("step", I64), key("group", I64), key("rubric_id"), key("edge", I64), col("i", I64),
    col("j", I64), col("outcome", F64), col("base_i", F64), col("base_j", F64),
])

TABLES = TableSet(owner="arbor", schemas={"rubric_verdicts": RUBRIC_VERDICTS},
                  views=tuple(SQL / f"{v}.sql" for v in VIEWS))


def verdict_rows(group: int, rubric_id: str, base_rewards: list[float], edges: tuple[tuple[int, int], ...],
                 outcomes: tuple[float | None, ...]) -> list[dict[str, object]]:
    """One ``rubric_verdicts`` row (without run_id / step) per judged edge of one (group, rubric)."""
    return [{"group": group, "rubric_id": rubric_id, "edge": e, "i": i, "j": j, "outcome": o,
             "base_i": base_rewards[i], "base_j": base_rewards[j]}
            for e, ((i, j), o) in enumerate(zip(edges, outcomes, strict=True))]
