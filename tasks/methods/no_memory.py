"""ARBOR without memory (App. C.3 ablation): contrastive drafts score only their source group, then are discarded.

Induction is ARBOR's (eq. 1, A.1) but there is no admission, no common pool, no retirement or consolidation: each
group that diverges in correctness is shaped (eq. 3/4) by the drafts induced from it, and nothing is reused.
"""

from __future__ import annotations

from arbor.tasks.methods.arbor import induce_drafts, induce_group
from arbor.tasks.methods.base import (
    ROLLOUT,
    SHAPE,
    TRAIN,
    Method,
    Rows,
    RubricScores,
    Stage,
    StageHook,
    StepResources,
)
from arbor.types import Trajectory


class NoMemory(Method):
    name = "no-memory"
    stages = (ROLLOUT, Stage("induce", ("judge_calls", "draft_scores")), SHAPE, TRAIN)

    def stage_hooks(self) -> dict[str, StageHook]:
        return {"induce": self.induce, "shape": self.shape}

    async def prefetch(self, run: StepResources, step: int, group: list[Trajectory]) -> None:
        """The group's induction and its drafts' scoring, ahead of ``induce`` (the pool stays empty)."""
        if not (self.cfg.memory.frozen or run.judge_capped()):
            await induce_group(run, step, group, [])

    def induce(self, run: StepResources, step: int, trajs: list[Trajectory]) -> dict[str, Rows]:
        if self.cfg.memory.frozen or run.judge_capped():
            return {"judge_calls": [], "draft_scores": []}
        _jobs, _results, draft_scores = induce_drafts(run, step, trajs, [])  # no common pool, ever
        return {"judge_calls": run.judge_rows(), "draft_scores": draft_scores}

    def rubric_scores(self, run: StepResources, step: int, trajs: list[Trajectory]) -> RubricScores:
        """Each group's own drafts, as the induce stage stored them (a draft whose every edge failed has no scores
        and is left out)."""
        out = RubricScores()
        for d in run.store.load(step, "induce", ("draft_scores",))["draft_scores"]:
            if d["scores"] is not None:
                out.per_group.setdefault(d["group"], []).append(d["scores"])
        return out
