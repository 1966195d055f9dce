"""SS-GRPO's tables (RubricEM App. C): what its score stage stores, declared once.

    stage_rubrics   the stage rubric buffer, one row per lifecycle event: generated (by the judge, contrasting a
                    group), kept / dropped after the group's grading (variance = the population variance of its
                    0/1/2 grades across the group, which decided a drop at the stage's cap)
    stage_scores    per trajectory and stage (1 plan, 2 research, 3 review, 4 answer): the stage's response-token
                    span [token_start, token_end), its score R in [0, 1], its return G and advantage A (eq. 1), and
                    the judge error when the grading call failed (then R falls back to the answer score only)
    stage_grades    every 0/1/2 grade the stage judge gave a trajectory against a rubric of its question's buffer
                    (C.3; a negative rubric's grade is how fully the flaw is there), with the judge's justification:
                    the privileged context RubricEM's reflection judge reads (D.6.2)

Views (``sql/``): ``stage_credit_groups``, ``stage_rubric_buffer``.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from arbor.storage.schemas import BOOL, F64, I64, STR, TableSet, col, key

SQL = Path(__file__).parent / "sql"

STAGE_RUBRICS = pa.schema([
    key("run_id"), key("step", I64), col("group", I64), col("question_id", STR), key("rubric_id"), key("event"),
    col("stage", I64), col("title", STR), col("description", STR), col("weight", I64), col("polarity", I64),
    col("persistent", BOOL), col("feature", STR), col("variance", F64),
])

STAGE_SCORES = pa.schema([
    key("run_id"), key("step", I64), key("traj_id"), col("group", I64), col("sample", I64), col("question_id", STR),
    key("stage", I64), col("stage_name", STR), col("token_start", I64), col("token_end", I64), col("score", F64),
    col("stage_return", F64), col("advantage", F64), col("format_valid", BOOL), col("f1", F64), col("n_rubrics", I64),
    col("judge_error", STR),
])

STAGE_GRADES = pa.schema([
    key("run_id"), key("step", I64), key("traj_id"), col("group", I64), col("sample", I64), key("rubric_id"),
    col("stage", I64), col("title", STR), col("weight", I64), col("polarity", I64), col("feature", STR),
    col("grade", I64), col("justification", STR),
])


TABLES = TableSet(
    owner="ss-grpo",
    schemas={"stage_rubrics": STAGE_RUBRICS, "stage_scores": STAGE_SCORES, "stage_grades": STAGE_GRADES},
    views=(SQL / "stage_credit_groups.sql", SQL / "stage_rubric_buffer.sql"),
)
