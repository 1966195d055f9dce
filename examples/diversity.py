"""A user's method that adds one stage and one table, in one file (docs/methods.md).

GRPO plus a per-group diversity score: a group whose K answers all read alike teaches little, so each trajectory
earns a bonus for how much its response differs from the rest of its group.

    rollout ─► diversity ─► shape ─► train

    diversity   per group, each trajectory's d_i = 1 - mean_{j != i} J(W_i, W_j), J the Jaccard similarity of the
                responses' word sets; stored in the table ``group_diversity`` (declared below, with a view)
    shape       eq. 3/4 with d as the group's one score vector: R_total = R_base + lambda * centred, attenuated d
                (``memory.lambda_``, ``memory.alpha``, ``memory.delta_v``: a group whose d do not vary is unshaped)

    arbor train --set run.method=examples.diversity:DiversityGRPO
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import pyarrow as pa

from arbor.storage.schemas import F64, I64, STR, TableSet, col, key
from arbor.tasks.methods.base import (
    ROLLOUT,
    SHAPE,
    TRAIN,
    Rows,
    RubricScores,
    Stage,
    StageHook,
    StepResources,
)
from arbor.tasks.methods.grpo import GRPO
from arbor.tasks.stage_store import fault_point
from arbor.types import Trajectory

GROUP_DIVERSITY = pa.schema([
    key("run_id"), key("step", I64), key("traj_id"), col("group", I64), col("sample", I64), col("question_id", STR),
    col("n_words", I64), col("diversity", F64),
])


def jaccard(a: set[str], b: set[str]) -> float:
    """|a ∩ b| / |a ∪ b|; two empty responses are the same response (1)."""
    return len(a & b) / len(a | b) if a | b else 1.0


def diversity_scores(texts: Sequence[str]) -> list[float]:
    """d_i = 1 - mean_{j != i} J(W_i, W_j) over a group's responses (a group of one: 0)."""
    words = [set(t.lower().split()) for t in texts]
    out = []
    for i, w in enumerate(words):
        others = [jaccard(w, v) for j, v in enumerate(words) if j != i]
        out.append(1.0 - sum(others) / len(others) if others else 0.0)
    return out


class DiversityGRPO(GRPO):
    name = "grpo-diversity"
    tables = TableSet(owner="grpo-diversity", schemas={"group_diversity": GROUP_DIVERSITY},
                      views=(Path(__file__).with_name("diversity_by_step.sql"),))
    stages: ClassVar[tuple[Stage, ...]] = (ROLLOUT, Stage("diversity", ("group_diversity",), retries=1), SHAPE,
                                           TRAIN)

    def stage_hooks(self) -> dict[str, StageHook]:
        return {"diversity": self.diversity, "shape": self.shape}

    def diversity(self, run: StepResources, step: int, trajs: list[Trajectory]) -> dict[str, Rows]:
        """Each trajectory's d_i within its group."""
        rows: Rows = []
        for n, g in enumerate(run.groups(trajs)):
            if n == 1:
                fault_point(step, "diversity", "mid")  # SIGKILL drills stop here, half the groups scored
            for t, d in zip(g, diversity_scores([t.text for t in g]), strict=True):
                rows.append({"step": step, "traj_id": t.traj_id, "group": t.group, "sample": t.sample,
                             "question_id": t.question_id, "n_words": len(t.text.split()), "diversity": d})
        return {"group_diversity": rows}

    def rubric_scores(self, run: StepResources, step: int, trajs: list[Trajectory]) -> RubricScores:
        """The stored d of each group, in sample order, as its one score vector."""
        stored = run.store.load(step, "diversity", ("group_diversity",))["group_diversity"]
        by_group: dict[int, list[float]] = {}
        for r in sorted(stored, key=lambda r: (r["group"], r["sample"])):
            by_group.setdefault(r["group"], []).append(r["diversity"])
        return RubricScores(per_group={g: [d] for g, d in by_group.items()})
