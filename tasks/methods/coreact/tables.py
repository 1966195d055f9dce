"""Co-ReAct's tables, declared once and registered on import: whatever stores them
(a guided rollout or evaluation, the generator's training flow) imports this package first.

    guided_steps        every guided step of a guided rollout or evaluation: the rubric placed before the turn, the
                        proposed action and its verification, and the retry that replaced a failed action
    branch_points       the generator's training data (§3.1-3.2): each branching point with its slate of candidate
                        next actions, every judge's list-wise ranks (JSON) and their Borda consensus (branch stage,
                        then rank stage)
    generator_samples   every rubric the generator sampled in a GRPO update: its tokens and log-probs (the update
                        replays from them), the verification score of each slate candidate under it, and the
                        reward's parts (eq. 1-3)

View (``sql/``): ``guided_step_summary``.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from arbor.storage.schemas import BOOL, F64, I64, STR, TableSet, col, key, register_tables

SQL = Path(__file__).parent / "sql"

GUIDED_STEPS = pa.schema([
    key("run_id"), key("step", I64), col("split", STR), col("run_index", I64), key("question_id"),
    col("group", I64), col("sample", I64), key("turn", I64), col("source", STR), col("rubric", STR),
    col("n_items", I64), col("rubric_error", STR), col("action", STR), col("verify_score", F64), col("passed", BOOL),
    col("retried", BOOL), col("retry_action", STR), col("retry_score", F64), col("retry_passed", BOOL),
    col("verify_error", STR),
])

BRANCH_POINTS = pa.schema([
    key("run_id"), key("step", I64), key("point_id"), col("question_id", STR), col("question", STR),
    col("golds", pa.list_(STR)), col("turn", I64), col("history", STR), col("tool_calls", I64),
    col("candidates", pa.list_(STR)), col("judge_ranks", STR), col("n_rankings", I64),
    col("consensus", pa.list_(F64)), col("kept", BOOL),
])

GENERATOR_SAMPLES = pa.schema([
    key("run_id"), key("step", I64), key("point_id"), col("group", I64), key("sample", I64), col("rubric", STR),
    col("n_items", I64), col("candidate_scores", pa.list_(F64)), col("r_rank", F64), col("r_atom", F64),
    col("r_fmt", F64), col("repetition", F64), col("reward", F64), col("prompt_ids", pa.list_(pa.int32())),
    col("response_ids", pa.list_(pa.int32())), col("rollout_logprobs", pa.list_(pa.float32())),
    col("finish_reason", STR), col("policy_version", I64), col("eval_errors", I64),
])


TABLES = TableSet(
    owner="co-react",
    schemas={"guided_steps": GUIDED_STEPS, "branch_points": BRANCH_POINTS, "generator_samples": GENERATOR_SAMPLES},
    views=(SQL / "guided_step_summary.sql",),
)
register_tables(TABLES)
