"""RaR-style rubrics (Gunjal et al., 2025; paper App. C.3): query-specific items written from the question and its
gold answer only, a holistic 1-10 rating of each trajectory against them, mapped to (r - 1) / 9, then centred and
added with the same lambda as ARBOR (eq. 3/4) but without the variance filter. The items are never reused.

Negative centred ratings: attenuated by ARBOR's alpha (``memory.rar_attenuate`` true, the method's default) or not
(false: C.3 names only "the same shaping coefficient as ARBOR", lambda; the qwen3 ARBOR profiles and arbor compare):
    R_total_i = R_base_i + lambda * (s_i - mean_j s_j)
"""

from __future__ import annotations

import asyncio

from arbor.llm.base import CallContext
from arbor.tasks.methods.base import Method, RubricScores, StepResources
from arbor.tasks.methods.rar.roles import RAR_RATE, RAR_RUBRICS
from arbor.types import Trajectory


def rating_to_score(rating: float) -> float:
    """A 1-10 rating on the [0, 1] scale of process scores: (r - 1) / 9."""
    return (rating - 1) / 9


class RaR(Method):
    name = "rar"

    def rubric_scores(self, run: StepResources, step: int, trajs: list[Trajectory]) -> RubricScores:
        """Items from the question and gold answer, a 1-10 rating of each trajectory, (r - 1) / 9; no variance
        filter (App. C.3: delta_v 0); alpha 1 (no attenuation) when ``memory.rar_attenuate`` is off."""
        alpha = None if self.cfg.memory.rar_attenuate else 1.0
        if run.judge_capped():
            return RubricScores(delta_v=0.0, alpha=alpha)
        groups = run.groups(trajs)

        async def rate_all() -> tuple[list[list[float | None]], list[list[str]]]:
            items = await asyncio.gather(*[
                run.judge.ask(RAR_RUBRICS, question=g[0].question, golds=g[0].golds,
                              ctx=CallContext(run.run_id, step, "shape", g[0].group))
                for g in groups
            ])
            out = []
            for g, it in zip(groups, items, strict=True):
                if not it.value:
                    out.append([None] * len(g))
                    continue
                ratings = await asyncio.gather(*[
                    run.judge.ask(RAR_RATE, question=t.question, trajectory=t, items=it.value,
                                  ctx=CallContext(run.run_id, step, "shape", t.group, None, t.sample))
                    for t in g
                ])
                out.append([None if r.value is None else rating_to_score(r.value) for r in ratings])
            return out, [list(it.value or []) for it in items]

        scores, items = run.run_async(rate_all())
        rows = [  # the query-specific items, kept for audit: they score their source group only (never reused)
            {"step": step, "group": g[0].group, "rubric_id": f"rar{step}.{g[0].group}", "title": "RaR items",
             "description": "\n".join(it), "counter_description": None, "scores": s, "n_edges": 0,
             "n_failed_edges": sum(x is None for x in s)}
            for g, s, it in zip(groups, scores, items, strict=True)
        ]
        return RubricScores({g[0].group: [s] for g, s in zip(groups, scores, strict=True)}, run.judge_rows(), rows,
                            delta_v=0.0, alpha=alpha)
