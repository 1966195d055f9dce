"""RubricEM's tables (§3.4, App. D), beside SS-GRPO's (it is SS-GRPO plus the meta-policy).

    reflections       every reflection candidate as a trainable trajectory (prompt = the reflection request,
                      response = the candidate; group = REFLECTION_GROUP + source group, its reward = utility
                      u = 0.4 d + 0.3 s + 0.3 c, D.6.2), with the judge's three dimensions and whether it entered
                      the bank
    rubric_bank       the agent rubric bank's events (D.5): an accepted reflection is 'written' for its question, or
                      'replaced' the question's earlier item (replaced_item_id)
    bank_retrievals   each bank item shown in a rollout prompt (D.5, D.6.3): the step and group it was shown to,
                      mode 'within' (the question's own item) or 'cross' (a related question's, rank 1..k by
                      similarity), and the step the item was written at

Views (``sql/``): ``reflection_scores``, ``bank_reuse``.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from arbor.storage.schemas import BOOL, F64, I64, SCHEMAS, STR, TableSet, col, key
from arbor.tasks.methods.ss_grpo.tables import TABLES as SS_GRPO_TABLES

SQL = Path(__file__).parent / "sql"

REFLECTIONS = pa.schema([
    *SCHEMAS["trajectories"], col("source_traj_id", STR), col("diagnosis", F64), col("specificity", F64),
    col("scope", F64), col("utility", F64), col("chosen", BOOL), col("judge_error", STR),
])

RUBRIC_BANK = pa.schema([
    key("run_id"), key("step", I64), col("group", I64), key("item_id"), key("event"), col("question_id", STR),
    col("question", STR), col("rubrics", STR), col("takeaways", STR), col("source_traj_id", STR), col("utility", F64),
    col("replaced_item_id", STR),
])

BANK_RETRIEVALS = pa.schema([
    key("run_id"), key("step", I64), col("group", I64), col("question_id", STR), key("item_id"), col("mode", STR),
    col("rank", I64), col("similarity", F64), col("item_step", I64),
])


TABLES = TableSet(
    owner="rubricem",
    schemas={**SS_GRPO_TABLES.schemas, "reflections": REFLECTIONS, "rubric_bank": RUBRIC_BANK,
             "bank_retrievals": BANK_RETRIEVALS},
    views=(*SS_GRPO_TABLES.views, SQL / "reflection_scores.sql", SQL / "bank_reuse.sql"),
)
