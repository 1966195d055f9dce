"""ARBOR (paper §3): a rubric memory shared across queries shapes the reward of zero-variance groups.

    score        active selection (§3.4), sparse pairwise judging of every group by the active common rubrics,
                 n_r / rho_r updates (§3.3)
    retire       n_r > kappa or rho_r < rho_min (§3.3), at the end of the step's scoring, so a retiring rubric
                 frees its slot before consolidation
    induce       contrastive anchors (eq. 1, A.1) -> drafts -> admission by variance and Pearson tests (eq. 2)
    shape        R_total = R_base + lambda * centred, attenuated rubric term (eq. 3/4; ``tasks.shaping``)
    consolidate  every K_consol admitted drafts: LLM abstraction + embedding de-duplication (§3.3)

The method owns its ``RubricMemory`` (``self.memory``). It is changed only through the memory's calls in these
stages; each returns the events it caused, so a resumed run rebuilds the memory from stored events
(``rebuild_memory``, called by ``restore``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from arbor.config import ArborConfig, MemoryConfig
from arbor.config.train import TrainConfig
from arbor.llm.base import CallContext
from arbor.tasks.methods.arbor.induction import select_anchors
from arbor.tasks.methods.arbor.memory import RubricMemory, load_pool_file
from arbor.tasks.methods.arbor.records import Activation, DraftResult, Records, group_info_from_rows
from arbor.tasks.methods.arbor.report import (
    activation_scores,
    console_lines,
    events_markdown,
    judge_signal_metrics,
    lifecycle_counts,
)
from arbor.tasks.methods.arbor.roles import CONSOLIDATION, INDUCTION
from arbor.tasks.methods.arbor.scoring import ScoringJob, score_jobs
from arbor.tasks.methods.arbor.sparse_graph import GroupScoring
from arbor.tasks.methods.arbor.tables import TABLES, verdict_rows
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
from arbor.tasks.stage_store import StageStore, fault_point
from arbor.types import LossSettings, Rubric, Trajectory

SCORE = Stage("score", ("rubric_events", "rubric_activations", "judge_calls", "rubric_verdicts"))
RETIRE = Stage("retire", ("rubric_events",))
INDUCE = Stage("induce", ("rubric_events", "judge_calls", "draft_scores"))
CONSOLIDATE = Stage("consolidate", ("rubric_events", "rubric_sources", "judge_calls"))
MEMORY_STAGES = ("score", "retire", "induce", "consolidate")  # the stages that change the memory, in step order


def rebuild_memory(memory: MemoryConfig, store: StageStore, upto_step: int) -> RubricMemory:
    """The rubric memory from the stored events of every completed memory stage (resume)."""
    events: Rows = []
    activations: Rows = []
    sources: Rows = []
    rollouts: Rows = []
    partial_phase: str | None = None
    for step in range(1, upto_step + 1):
        if not store.done(step, "rollout"):
            break
        rollouts += store.load(step, "rollout", ("rollouts",))["rollouts"]
        for stage in MEMORY_STAGES:
            if not store.done(step, stage):
                break
            got = store.load(step, stage, ("rubric_events", "rubric_activations", "rubric_sources"))
            events += got["rubric_events"]
            activations += got["rubric_activations"]
            sources += got["rubric_sources"]
            partial_phase = stage
    return RubricMemory.from_events(memory, events, activations, sources, group_info_from_rows(rollouts),
                                    partial_phase=partial_phase)


def induce_drafts(run: StepResources, step: int, trajs: list[Trajectory], existing: list[Rubric]
                  ) -> tuple[list[ScoringJob], list[Any], Rows]:
    """Contrastive induction on every group with correctness divergence (eq. 1, A.1), each draft scored on its
    source group: (scoring jobs, their results, the ``draft_scores`` rows). ``existing``: the common rubrics the
    induction prompt lists (E.1: the previously established ones only)."""

    async def induce_all() -> list[list[tuple[ScoringJob, GroupScoring]]]:
        return await asyncio.gather(*[induce_group(run, step, g, existing) for g in run.groups(trajs)])

    done = [pair for per_group in run.run_async(induce_all()) for pair in per_group]
    jobs, results = [j for j, _ in done], [r for _, r in done]
    fault_point(step, "induce", "mid")
    draft_scores = [
        {"step": step, "group": j.group, "rubric_id": j.rubric.rubric_id, "title": j.rubric.title,
         "description": j.rubric.description, "counter_description": j.rubric.counter_description,
         "feature": j.rubric.feature, "direction": j.rubric.direction,
         "scores": res.scores, "n_edges": res.n_edges, "n_failed_edges": res.n_failed_edges}
        for j, res in zip(jobs, results, strict=True)
    ]
    return jobs, results, draft_scores


async def induce_group(run: StepResources, step: int, g: list[Trajectory], existing: list[Rubric]
                       ) -> list[tuple[ScoringJob, GroupScoring]]:
    """One group's induction (skipped without correctness divergence) and its drafts' scoring on the group."""
    anchors = select_anchors([t.f1 for t in g], [t.response_tokens for t in g], [t.format_valid for t in g])
    if anchors["mode"] == "skip":
        return []
    out = await run.judge.ask(INDUCTION, question=g[0].question, golds=g[0].golds, trajectories=g, anchors=anchors,
                              existing=existing, ctx=CallContext(run.run_id, step, "induce", g[0].group))
    jobs = [ScoringJob(g[0].group, r, g) for r in RubricMemory.make_drafts(step, g[0].group, out.value or [])]
    results = await score_jobs(run.judge, jobs, run_id=run.run_id, seed=run.seed, step=step,
                               stage="induce") if jobs else []
    return list(zip(jobs, results, strict=True))


class Arbor(Method):
    name = "arbor"
    stages = (ROLLOUT, SCORE, RETIRE, INDUCE, SHAPE, CONSOLIDATE, TRAIN)
    tables = TABLES

    def __init__(self, cfg: ArborConfig) -> None:
        super().__init__(cfg)
        self.memory = RubricMemory(cfg.memory)  # rebuilt from the stored events by ``restore``

    def restore(self, run: StepResources) -> None:
        self.memory = rebuild_memory(self.cfg.memory, run.store, self.cfg.run.steps)

    def loss_settings(self, train: TrainConfig) -> LossSettings:
        """§4.1 / App. B.2: GRPO with TIS in slime, whose default loss averages each sample's tokens, then the
        samples (``train.loss_agg`` unset: seq-mean-token-mean)."""
        return replace(super().loss_settings(train), loss_agg=train.loss_agg or "seq-mean-token-mean")

    def summary(self) -> dict[str, float | str]:
        return {"rubric/pool_size": float(len(self.memory.pool)),
                "pool": ", ".join(f"{r.rubric_id} {r.title}" for r in self.memory.pool) or "(empty)"}

    def logged_metrics(self, run: StepResources, step: int) -> dict[str, float | None]:
        """The step's lifecycle counts (``rubric/``), the pool's size, and whether the judge helps (``signal/``:
        its pairwise verdicts against the outcome order, what shaping moved in zero-variance groups)."""
        return (lifecycle_counts(run.rows(step, "rubric_events")) | super().logged_metrics(run, step)
                | judge_signal_metrics(run.rows(step, "rubric_verdicts"), run.rows(step, "trajectories")))

    def stage_hooks(self) -> dict[str, StageHook]:
        """ARBOR's step between rollout and train (§3, App. A): score each group by the active common rubrics,
        retire the rubrics that stopped separating, induce and admit drafts from contrasts, shape R_total with the
        activated scores (eq. 3/4), consolidate the admitted drafts into common rubrics."""
        return {"score": self.score, "retire": self.retire, "induce": self.induce, "shape": self.shape,
                "consolidate": self.consolidate}

    def sample_scores(self, run: StepResources, step: int) -> dict[tuple[int, int], str]:
        """Each trajectory's score under every rubric the step activated for its group (``rubric_id score``)."""
        return activation_scores(run.rows(step, "rubric_activations"))

    def console_lines(self, metrics: Mapping[str, float]) -> list[str]:
        return console_lines(metrics)

    def step_report(self, run: StepResources, step: int) -> str | None:
        return events_markdown(step, run.rows(step, "rubric_events"), str(self.summary()["pool"]))

    async def prefetch(self, run: StepResources, step: int, group: list[Trajectory]) -> None:
        """Ahead of the stages: the group's pairwise scoring by the rubrics ``score`` will activate, and
        its induction with its drafts' scoring. Induction is a guess: its prompt lists the pool after ``retire``,
        and the pool of the step's start is used here, so a step that retires a rubric (or loads a pool at step 1)
        re-induces in its stage and the guess is counted as wasted (``steps.prefetch_wasted_calls``)."""
        if run.judge_capped():
            return
        active = self.memory.peek_active()
        scoring = score_jobs(run.judge, [ScoringJob(group[0].group, r, group) for r in active], run_id=run.run_id,
                             seed=run.seed, step=step, stage="score")
        if self.cfg.memory.frozen:
            await scoring
            return
        await asyncio.gather(scoring, induce_group(run, step, group, list(self.memory.pool)))

    def score(self, run: StepResources, step: int, trajs: list[Trajectory]) -> dict[str, Rows]:
        """Active selection (§3.4), sparse pairwise judging of every group, n_r / rho_r updates."""
        rec = Records()
        if step == 1 and self.cfg.memory.init_from:  # warm start from another run's exported pool
            src = self.cfg.memory.init_from
            rec.extend(self.memory.load_pool(step, load_pool_file(src), source=src))
        active, sel = self.memory.select_active(step)
        rec.extend(sel)
        if active and run.judge_capped():
            active = []
        groups = run.groups(trajs)
        jobs = [ScoringJob(g[0].group, r, g) for g in groups for r in active]
        n_calls = sum(max(len(j.trajectories) - 1, 0) + len(j.trajectories) // 2 for j in jobs)
        results = run.run_async(score_jobs(
            run.judge, jobs, run_id=run.run_id, seed=run.seed, step=step, stage="score",
            on_call_done=run.scoring_progress("score", n_calls),
        )) if jobs else []
        fault_point(step, "score", "mid")
        acts = [Activation(j.rubric.rubric_id, j.group, res, [t.f1 for t in j.trajectories])
                for j, res in zip(jobs, results, strict=True)]
        rec.extend(self.memory.apply_activations(step, acts))
        verdicts = [row for j, res in zip(jobs, results, strict=True)
                    for row in verdict_rows(j.group, j.rubric.rubric_id, [t.base_reward for t in j.trajectories],
                                            res.edges, res.outcomes)]
        return {"rubric_events": rec.events, "rubric_activations": rec.activations, "judge_calls": run.judge_rows(),
                "rubric_verdicts": verdicts}

    def retire(self, run: StepResources, step: int, trajs: list[Trajectory]) -> dict[str, Rows]:
        """End of the step's scoring: retire rubrics with n_r > kappa or rho_r < rho_min (§3.3)."""
        return {"rubric_events": self.memory.retire(step).events}

    def induce(self, run: StepResources, step: int, trajs: list[Trajectory]) -> dict[str, Rows]:
        """Drafts from contrastive anchors (eq. 1), admitted into the candidate set D by eq. 2."""
        if self.cfg.memory.frozen or run.judge_capped():
            return {"rubric_events": [], "judge_calls": [], "draft_scores": []}
        jobs, results, draft_scores = induce_drafts(run, step, trajs, list(self.memory.pool))
        results_in = [
            DraftResult(j.rubric, j.group, j.trajectories[0].question_id, j.trajectories[0].question, res,
                        [t.f1 for t in j.trajectories])
            for j, res in zip(jobs, results, strict=True)
        ]
        rec = self.memory.admit_drafts(step, results_in)
        return {"rubric_events": rec.events, "judge_calls": run.judge_rows(), "draft_scores": draft_scores}

    def rubric_scores(self, run: StepResources, step: int, trajs: list[Trajectory]) -> RubricScores:
        """The active common rubrics' scores of each group, as the score stage stored them (a failed activation
        counts as no score). ``memory.shaping_filter=batch``: the score stage decided each rubric's filter for the
        whole step (its rows' ``kept``), so a rubric that failed it gives no score and one that passed enters every
        group it scored, with no filter per group."""
        batch = self.cfg.memory.shaping_filter == "batch"
        out = RubricScores(delta_v=0.0 if batch else None)
        activations = run.store.load(step, "score", ("rubric_activations",))["rubric_activations"]
        for a in sorted(activations, key=lambda a: (a["group"], a["rubric_id"])):
            dropped = a["judge_error"] or (batch and not a["kept"])
            out.per_group.setdefault(a["group"], []).append(None if dropped else a["scores"])
        return out

    def consolidate(self, run: StepResources, step: int, trajs: list[Trajectory]) -> dict[str, Rows]:
        """Every K_consol admitted drafts: LLM abstraction + embedding de-dup, capacity, lineage (§3.3). One judge
        call per batch of K_consol drafts, oldest first, in order (each sees the pool the previous one left), while
        |D| >= K_consol (``memory.consolidation_batch=all``: one call over all of D). The stage stores every call's
        rows together: a stage cut short is redone whole from the memory the induce stage left."""
        rec = Records()
        if not self.memory.consolidation_due() or run.judge_capped():
            return {"rubric_events": [], "rubric_sources": [], "judge_calls": []}
        while self.memory.consolidation_due():
            drafts = self.memory.consolidation_batch()
            out = run.run_async(run.judge.ask(CONSOLIDATION, candidates_by_query=self.memory.candidates_by_query(drafts),
                                              existing=self.memory.pool, ctx=CallContext(run.run_id, step, "consolidate")))
            if out.value is None:  # the judge failed after retries: keep these drafts in D, try again next step
                break
            rec.extend(self.memory.consolidate(step, out.value, run.embed))
        return {"rubric_events": rec.events, "rubric_sources": rec.sources, "judge_calls": run.judge_rows()}
