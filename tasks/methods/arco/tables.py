"""ARCO's tables and ``steps`` column, declared once.

    mu_scores         every step (policy turn) of every trajectory as the rubric model mu read it in the score
                      stage: its bucket, token span, the criteria mu wrote (text and ids) and its K scores, the step
                      score s̄_t, the outcome, and during the warm-up the teacher's criteria, raw labels and the
                      labels projected onto the outcome
    turn_advantages   the policy's credit per step (shape stage): reward-to-go G_t, the baseline b of its bucket,
                      A_t, and the phase (sparse / dense)
    mu_updates        mu's update per step (mu_update stage): its phase, loss parts, and its calibration before the
                      update (mean sum_t s̄_t and mean |sum_t s̄_t - R| over positive and negative trajectories)
    steps.mu_loss     the rubric model's loss in the step's update

Views (``sql/``): ``mu_calibration``, ``turn_advantage_summary``.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from arbor.storage.schemas import F64, I64, STR, TableSet, col, key

SQL = Path(__file__).parent / "sql"

MU_SCORES = pa.schema([
    key("run_id"), key("step", I64), key("traj_id"), col("group", I64), col("sample", I64), col("question_id", STR),
    key("turn", I64), col("kind", STR), col("bucket", STR), col("token_start", I64), col("token_end", I64),
    col("searches_left", I64), col("criteria", STR), col("criteria_ids", pa.list_(pa.int32())),
    col("scores", pa.list_(F64)), col("step_score", F64), col("outcome", F64), col("mu_version", I64),
    col("teacher_criteria", pa.list_(STR)), col("teacher_scores", pa.list_(F64)),
    col("teacher_projected", pa.list_(F64)), col("teacher_lambda", F64), col("judge_error", STR),
])

TURN_ADVANTAGES = pa.schema([
    key("run_id"), key("step", I64), key("traj_id"), col("group", I64), col("sample", I64), key("turn", I64),
    col("kind", STR), col("bucket", STR), col("step_score", F64), col("reward_to_go", F64), col("baseline", F64),
    col("advantage", F64), col("phase", STR), col("outcome", F64),
])

MU_UPDATES = pa.schema([
    key("run_id"), key("step", I64), col("phase", STR), col("n_trajectories", I64), col("n_steps", I64),
    col("mu_version_before", I64), col("loss", F64), col("lm", F64), col("mse", F64), col("decomposition", F64),
    col("kl", F64), col("n_pos", I64), col("n_neg", I64), col("mean_sum_pos", F64), col("mean_sum_neg", F64),
    col("abs_error_pos", F64), col("abs_error_neg", F64),
])


TABLES = TableSet(
    owner="arco",
    schemas={"mu_scores": MU_SCORES, "turn_advantages": TURN_ADVANTAGES, "mu_updates": MU_UPDATES},
    step_columns=(col("mu_loss", F64),),
    views=(SQL / "mu_calibration.sql", SQL / "turn_advantage_summary.sql"),
)
