"""Group-stage process scoring through a judge (paper §3.4): sparse graph, randomised order, verdicts mapped back.

For every (group, rubric) job the trajectories are ranked by base reward and joined by the sparse comparison graph
of ``tasks.methods.arbor.sparse_graph.sparse_edges``; every edge is one pairwise judge call, shown in the order drawn by
``presentation_swapped(seed, step, group, rubric_id, edge)`` so that a re-run (or a resume) sends the same prompts
and hits the judge cache. All calls of all jobs run concurrently (the judge bounds concurrency); results are
collected per job in job order, whatever order the calls finish in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from arbor.llm.base import CallContext, Judge
from arbor.tasks.methods.arbor.roles import ask_pairwise
from arbor.tasks.methods.arbor.sparse_graph import (
    GroupScoring,
    presentation_swapped,
    score_group,
    sparse_edges,
    verdict_to_outcome,
)
from arbor.types import Rubric, Trajectory


@dataclass(frozen=True)
class ScoringJob:
    """Score one query-group under one rubric."""

    group: int
    rubric: Rubric
    trajectories: Sequence[Trajectory]  # the group's trajectories, in sample order


async def score_jobs(
    judge: Judge,
    jobs: Sequence[ScoringJob],
    *,
    run_id: str,
    seed: int,
    step: int,
    stage: str,
    on_call_done: Callable[[], None] | None = None,
) -> list[GroupScoring]:
    """Judge every edge of every job concurrently; return one ``GroupScoring`` per job, in job order."""
    plans: list[list[tuple[int, int]]] = []
    calls = []
    for job in jobs:
        trajs = job.trajectories
        edges = sparse_edges([t.base_reward for t in trajs])
        plans.append(edges)
        for e, (i, j) in enumerate(edges):
            swap = presentation_swapped(seed, step, job.group, job.rubric.rubric_id, e)
            ctx = CallContext(run_id=run_id, step=step, stage=stage, group=job.group,
                              rubric_id=job.rubric.rubric_id, edge=e)
            calls.append(_call(judge, trajs[0].question, trajs[i], trajs[j], job.rubric, swap, ctx, on_call_done))
    verdicts = await asyncio.gather(*calls)
    out: list[GroupScoring] = []
    pos = 0
    for job, edges in zip(jobs, plans, strict=True):
        # ask_pairwise already undid the swap: the verdict refers to (i, j) as given.
        outcomes = [verdict_to_outcome(v, swapped=False) for v in verdicts[pos: pos + len(edges)]]
        pos += len(edges)
        out.append(score_group(len(job.trajectories), edges, outcomes))
    return out


async def _call(judge: Judge, question: str, a: Trajectory, b: Trajectory, rubric: Rubric, swap: bool,
                ctx: CallContext, on_done: Callable[[], None] | None) -> str | None:
    res = await ask_pairwise(judge, question, a, b, rubric, swap=swap, ctx=ctx)
    if on_done is not None:
        on_done()
    return res.value
