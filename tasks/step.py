"""One RL step of ``arbor-train``, stage by stage (DESIGN §1; paper §3, App. B.2).

    rollout ─► score ─► retire ─► induce ─► shape ─► consolidate ─► train
    (K per     (active    (n_r >     (anchors,  (eq. 3/4)  (every        (GRPO / DAPO,
     prompt,    commons,   kappa,     drafts,              K_consol      checkpoint,
     base       sparse     rho_r <    admission            drafts)       weight sync)
     reward)    judging)   rho_min)   eq. 2)

Retirement is decided at the end of the step's scoring (issue 3), before consolidation, so a retiring rubric
frees its slot instead of a live one being replaced at capacity (DESIGN §1 draws it after consolidation; the
memory records either order, and this one wastes no capacity).

Every stage is a method that returns the rows of its tables; ``tasks.stages.StageStore`` turns it into an artifact
keyed by (run, step, stage): a stage found complete is loaded, never recomputed. The rubric memory is mutated only
by score / induce / consolidate / retire, each through the ``RubricMemory`` calls of its phase, so on resume the
memory is rebuilt from the stored events of completed stages (``RubricMemory.from_events``).

Methods (issue 8): ``arbor`` (the paper), ``grpo`` (base reward only), ``dapo`` (base reward; the trainer drops
zero-variance groups and clips higher), ``rar`` (App. C.3: query-specific items from question + answer, a holistic
1-10 rating, centred, same lambda, never reused), ``no-memory`` (contrastive drafts score only their source group,
then are discarded; the common pool stays empty).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arbor.config import ArborConfig
from llm.base import CallContext, Judge
from storage.parquet import read_stage
from tasks.datasets import Question, batch_for_step, resample_questions
from tasks.group_stats import classify_group
from tasks.induction import select_anchors
from tasks.judge import GroupScoring
from tasks.losses import dynamic_sampling_refill
from tasks.memory import Activation, DraftResult, Records, RubricMemory, group_info_from_rows
from tasks.scoring import ScoringJob, score_jobs
from tasks.shaping import shape_group
from tasks.stages import Rows, StageStore, fault_point
from tasks.types import Rubric, Trajectory

STAGES = ("rollout", "score", "retire", "induce", "shape", "consolidate", "train")
MEMORY_STAGES = ("score", "retire", "induce", "consolidate")


def uses_memory(method: str) -> bool:
    return method == "arbor"


@dataclass
class RunState:
    """Everything one run's steps share: config, stores, engines, judge, memory."""

    cfg: ArborConfig
    run_id: str
    home: Path
    store: StageStore
    questions: list[Question]
    engine: Any  # tasks.rollout engine
    trainer: Any  # tasks.train.Trainer
    judge: Judge
    memory: RubricMemory
    embed: Callable[[list[str]], Any]
    on_progress: Callable[[str, int, int], None] | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)
    last_train_metrics: dict[str, float] = field(default_factory=dict)

    @property
    def seed(self) -> int:
        return self.cfg.run.seed

    # ------------------------------------------------------------------------------------------ helpers
    def _judge_rows(self) -> Rows:
        return self.judge.drain_calls()

    def judge_cost_so_far(self) -> float:
        from storage.parquet import read_table

        t = read_table("judge_calls", run_id=self.run_id, home=self.home)
        return float(sum(c or 0.0 for c in t.column("cost_usd").to_pylist())) if t.num_rows else 0.0

    def judge_capped(self) -> bool:
        cap = self.cfg.judge.cost_cap_usd
        return cap is not None and self.judge_cost_so_far() >= cap

    def _run(self, coro: Any) -> Any:
        return asyncio.run(coro)

    def groups(self, trajs: Sequence[Trajectory]) -> list[list[Trajectory]]:
        out: dict[int, list[Trajectory]] = {}
        for t in trajs:
            out.setdefault(t.group, []).append(t)
        return [sorted(out[g], key=lambda t: t.sample) for g in sorted(out)]

    def _scoring_progress(self, stage: str, total: int) -> Callable[[], None]:
        done = [0]

        def tick() -> None:
            done[0] += 1
            if self.on_progress is not None:
                self.on_progress(stage, done[0], total)

        return tick

    # ------------------------------------------------------------------------------------------ stages
    def rollout(self, step: int) -> dict[str, Rows]:
        """K trajectories per prompt with the policy of version step-1, base reward, great-expectations check."""
        from storage.validation import validate_trajectories

        batch = batch_for_step(self.questions, self.seed, step, self.cfg.rollout.batch_size)
        trajs = self.engine.generate_groups(batch, self.cfg.rollout.k, self.seed, step, run_id=self.run_id)
        if self.cfg.run.method == "dapo" and self.cfg.train.dapo_oversample:
            trajs += self._dapo_resample(step, batch, trajs)
        rows = [t.to_row() for t in trajs]
        validate_trajectories(rows, k=self.cfg.rollout.k)
        return {"rollouts": rows}

    def _dapo_resample(self, step: int, batch: list[Question], trajs: list[Trajectory]) -> list[Trajectory]:
        """DAPO dynamic sampling (Yu et al., 2025, §3.2): while fewer than ``batch_size`` groups have reward variance,
        roll out groups for as many fresh prompts as are missing, for at most ``train.dapo_max_resample_rounds``
        rounds. Every sampled group is stored (Table 2 counts them); the trainer drops the zero-variance ones and
        the step row records the shortfall. The extra groups are numbered after the batch's."""
        k = self.cfg.rollout.k
        extra: list[Trajectory] = []
        used = {q.question_id for q in batch}
        rounds = [0]

        def resample(n: int) -> list[list[float]]:
            rounds[0] += 1
            qs = resample_questions(self.questions, self.seed, step, rounds[0], n, used)
            used.update(q.question_id for q in qs)
            new = self.engine.generate_groups(qs, k, self.seed, step, run_id=self.run_id,
                                              first_group=len(batch) + len(extra) // k)
            extra.extend(new)
            return [[t.base_reward for t in g] for g in self.groups(new)]

        dynamic_sampling_refill([[t.base_reward for t in g] for g in self.groups(trajs)], len(batch), resample,
                                max_rounds=self.cfg.train.dapo_max_resample_rounds)
        return extra

    def score(self, step: int, trajs: list[Trajectory]) -> dict[str, Rows]:
        """Active selection (§3.4), sparse pairwise judging of every group, n_r / rho_r updates."""
        rec = Records()
        if not uses_memory(self.cfg.run.method):
            return {"rubric_events": [], "rubric_activations": [], "judge_calls": []}
        if step == 1 and self.cfg.memory.init_from:  # warm start from another run's exported pool (issue 7)
            from tasks.memory import load_pool_file

            src = self.cfg.memory.init_from
            rec.extend(self.memory.load_pool(step, load_pool_file(src), source=src))
        active, sel = self.memory.select_active(step)
        rec.extend(sel)
        if active and self.judge_capped():
            active = []
        groups = self.groups(trajs)
        jobs = [ScoringJob(g[0].group, r, g) for g in groups for r in active]
        n_calls = sum(max(len(j.trajectories) - 1, 0) + len(j.trajectories) // 2 for j in jobs)
        results = self._run(score_jobs(
            self.judge, jobs, run_id=self.run_id, seed=self.seed, step=step, stage="score",
            on_call_done=self._scoring_progress("score", n_calls),
        )) if jobs else []
        fault_point(step, "score", "mid")
        acts = [Activation(j.rubric.rubric_id, j.group, res, [t.f1 for t in j.trajectories])
                for j, res in zip(jobs, results, strict=True)]
        rec.extend(self.memory.apply_activations(step, acts))
        return {"rubric_events": rec.events, "rubric_activations": rec.activations, "judge_calls": self._judge_rows()}

    def induce(self, step: int, trajs: list[Trajectory]) -> dict[str, Rows]:
        """Contrastive induction on groups with correctness divergence (eq. 1, A.1), then admission (eq. 2)."""
        method = self.cfg.run.method
        empty = {"rubric_events": [], "judge_calls": [], "draft_scores": []}
        if method not in ("arbor", "no-memory") or self.cfg.memory.frozen or self.judge_capped():
            return empty
        groups = self.groups(trajs)
        plans = []
        for g in groups:
            anchors = select_anchors([t.f1 for t in g], [t.response_tokens for t in g], [t.format_valid for t in g])
            if anchors["mode"] != "skip":
                plans.append((g, anchors))
        existing: list[Rubric] = list(self.memory.pool)  # E.1: the previously established (common) rubrics only

        async def induce_all() -> list[Any]:
            return await asyncio.gather(*[
                self.judge.induce(g[0].question, g[0].golds, g, anchors, existing,
                                  ctx=CallContext(self.run_id, step, "induce", g[0].group))
                for g, anchors in plans
            ])

        outcomes = self._run(induce_all()) if plans else []
        drafts: list[tuple[list[Trajectory], Rubric]] = []
        for (g, _anchors), out in zip(plans, outcomes, strict=True):
            for r in RubricMemory.make_drafts(step, g[0].group, out.value or []):
                drafts.append((g, r))
        jobs = [ScoringJob(g[0].group, r, g) for g, r in drafts]
        results = self._run(score_jobs(
            self.judge, jobs, run_id=self.run_id, seed=self.seed, step=step, stage="induce",
        )) if jobs else []
        fault_point(step, "induce", "mid")
        draft_scores = [
            {"step": step, "group": j.group, "rubric_id": j.rubric.rubric_id, "title": j.rubric.title,
             "description": j.rubric.description, "counter_description": j.rubric.counter_description,
             "feature": j.rubric.feature, "direction": j.rubric.direction,
             "scores": res.scores, "n_edges": res.n_edges, "n_failed_edges": res.n_failed_edges}
            for j, res in zip(jobs, results, strict=True)
        ]
        if method == "no-memory":  # drafts score their own group only, then are discarded (App. C.3)
            return {"rubric_events": [], "judge_calls": self._judge_rows(), "draft_scores": draft_scores}
        results_in = [
            DraftResult(j.rubric, j.group, j.trajectories[0].question_id, j.trajectories[0].question, res,
                        [t.f1 for t in j.trajectories])
            for j, res in zip(jobs, results, strict=True)
        ]
        rec = self.memory.admit_drafts(step, results_in)
        return {"rubric_events": rec.events, "judge_calls": self._judge_rows(), "draft_scores": draft_scores}

    def shape(self, step: int, trajs: list[Trajectory], activations: Rows, draft_scores: Rows) -> dict[str, Rows]:
        """R_total = R_base + lambda_ * centred, attenuated rubric term (eq. 3/4), per group."""
        m = self.cfg.memory
        method = self.cfg.run.method
        per_group: dict[int, list[Sequence[float | None] | None]] = {}
        rar_calls: Rows = []
        rar_rows: Rows = []
        if method == "arbor":
            for a in sorted(activations, key=lambda a: (a["group"], a["rubric_id"])):
                per_group.setdefault(a["group"], []).append(None if a["judge_error"] else a["scores"])
        elif method == "no-memory":
            for d in draft_scores:
                if d["scores"] is not None:
                    per_group.setdefault(d["group"], []).append(d["scores"])
        elif method == "rar" and not self.judge_capped():
            per_group, rar_calls, rar_rows = self._rar_scores(step, trajs)
        out: list[dict[str, Any]] = []
        delta_v = 0.0 if method == "rar" else m.delta_v  # RaR has no variance filter (App. C.3)
        for g in self.groups(trajs):
            scores = per_group.get(g[0].group, [])
            shaped = shape_group([t.base_reward for t in g], scores, [t.format_valid for t in g],
                                 lambda_=m.lambda_, alpha=m.alpha, delta_v=delta_v)
            for t, total in zip(g, shaped.total, strict=True):
                t.shaped_reward = total
                out.append(t.to_row())
        return {"trajectories": out, "judge_calls": rar_calls, "draft_scores": rar_rows}

    def _rar_scores(self, step: int, trajs: list[Trajectory]) -> tuple[dict[int, list[Any]], Rows, Rows]:
        """RaR-style (App. C.3): items from question + gold only; a 1-10 holistic rating -> (r - 1) / 9."""
        groups = self.groups(trajs)

        async def rate_all() -> tuple[list[list[float | None]], list[list[str]]]:
            items = await asyncio.gather(*[
                self.judge.rar_rubrics(g[0].question, g[0].golds, ctx=CallContext(self.run_id, step, "shape", g[0].group))
                for g in groups
            ])
            out = []
            for g, it in zip(groups, items, strict=True):
                if not it.value:
                    out.append([None] * len(g))
                    continue
                ratings = await asyncio.gather(*[
                    self.judge.rar_rate(t.question, t, it.value,
                                        ctx=CallContext(self.run_id, step, "shape", t.group, None, t.sample))
                    for t in g
                ])
                out.append([None if r.value is None else (r.value - 1) / 9 for r in ratings])
            return out, [list(it.value or []) for it in items]

        scores, items = self._run(rate_all())
        rows = [  # the query-specific items, kept for audit: they score their source group only (never reused)
            {"step": step, "group": g[0].group, "rubric_id": f"rar{step}.{g[0].group}", "title": "RaR items",
             "description": "\n".join(it), "counter_description": None, "scores": s, "n_edges": 0,
             "n_failed_edges": sum(x is None for x in s)}
            for g, s, it in zip(groups, scores, items, strict=True)
        ]
        return {g[0].group: [s] for g, s in zip(groups, scores, strict=True)}, self._judge_rows(), rows

    def consolidate(self, step: int) -> dict[str, Rows]:
        """Every K_consol admitted drafts: LLM abstraction + embedding de-dup, capacity, lineage (§3.3)."""
        empty = {"rubric_events": [], "rubric_sources": [], "judge_calls": []}
        if not uses_memory(self.cfg.run.method) or not self.memory.consolidation_due() or self.judge_capped():
            return empty
        out = self._run(self.judge.consolidate(self.memory.candidates_by_query(), self.memory.pool,
                                               ctx=CallContext(self.run_id, step, "consolidate")))
        if out.value is None:  # the judge failed after retries: keep D, try again at the next step
            return {**empty, "judge_calls": self._judge_rows()}
        rec = self.memory.consolidate(step, out.value, self.embed)
        return {"rubric_events": rec.events, "rubric_sources": rec.sources, "judge_calls": self._judge_rows()}

    def retire(self, step: int) -> dict[str, Rows]:
        """End of the step's scoring: retire rubrics with n_r > kappa or rho_r < rho_min (§3.3)."""
        if not uses_memory(self.cfg.run.method):
            return {"rubric_events": []}
        return {"rubric_events": self.memory.retire(step).events}

    def train(self, step: int, trajs: list[Trajectory]) -> dict[str, Rows]:
        """One GRPO / DAPO update on the shaped batch; the step's metrics row (the stage's artifact)."""
        metrics = self.trainer.train_step(trajs, step)
        self.last_train_metrics = metrics
        return {"steps": [self.step_row(step, trajs, metrics)]}

    def after_train(self, step: int) -> None:
        """Once the train stage is committed: checkpoint (every N steps) and weight sync. A crash between the
        commit and the checkpoint is repaired on resume by replaying the stored batch (``restore_policy``)."""
        self.trainer.maybe_save(step, self.last_train_metrics)
        self.sync_weights()

    def evaluate(self, step: int) -> dict[str, Rows]:
        """Held-out evaluation every ``run.eval_every`` steps on a fixed small split (issue 8 item 2)."""
        from flows.evaluate import evaluate_questions
        from tasks.datasets import load_questions

        questions = load_questions(self.cfg.data.eval, world=self.cfg.world)[: self.cfg.run.eval_size]
        rows = evaluate_questions(self.engine, self.judge, {self.cfg.data.eval: questions},
                                  runs=self.cfg.run.eval_runs, seed=self.seed, run_id=self.run_id, step=step,
                                  checkpoint=f"policy-v{self.trainer.policy_version}",
                                  temperature=self.cfg.eval.temperature)
        return {"eval_results": rows, "judge_calls": self._judge_rows()}

    def sync_weights(self) -> None:
        """After each step: the rollout engine gets the trainer's weights and version (issue 6 item 4)."""
        version = self.trainer.policy_version
        if hasattr(self.trainer, "state_dict_for_sync") and hasattr(self.engine, "load_state_dict"):
            self.engine.load_state_dict(self.trainer.state_dict_for_sync(), version)  # in-process
        elif hasattr(self.engine, "load_state_dict"):  # trainer in its own process group: via an HF export
            from safetensors.torch import load_file

            path = self.trainer.export_hf(self.home / "trainer" / self.run_id / "sync")
            sd: dict[str, Any] = {}
            for f in sorted(Path(path).glob("*.safetensors")):
                sd.update(load_file(str(f)))
            self.engine.load_state_dict(sd, version)
        else:  # `vllm serve`: the trainer pushes over vLLM's weight-transfer API (docs/gpu.md)
            if hasattr(self.trainer, "sync_vllm"):
                self.trainer.sync_vllm(self.cfg.rollout.base_url)
            self.engine.set_policy_version(version)

    # ------------------------------------------------------------------------------------------ metrics
    def step_row(self, step: int, trajs: list[Trajectory], train_metrics: dict[str, float]) -> dict[str, Any]:
        groups = self.groups(trajs)
        zb = zt = 0
        for g in groups:
            f1 = [t.f1 for t in g]
            valid = [t.format_valid for t in g]
            zb += classify_group([t.base_reward for t in g], f1, valid).zero_variance
            zt += classify_group([t.shaped_reward for t in g], f1, valid).zero_variance  # type: ignore[misc]
        n = max(len(trajs), 1)
        calls = read_stage_rows(self, step, "judge_calls")
        row: dict[str, Any] = {
            "completed_at": time.time(),
            "wall_seconds": sum(self.stage_seconds.values()),
            "mean_base_reward": sum(t.base_reward for t in trajs) / n,
            "mean_total_reward": sum(t.shaped_reward or 0.0 for t in trajs) / n,
            "format_valid_rate": sum(t.format_valid for t in trajs) / n,
            "zero_var_base": zb / max(len(groups), 1),
            "zero_var_total": zt / max(len(groups), 1),
            "n_groups": len(groups),
            "mean_searches": sum(t.search_calls for t in trajs) / n,
            "mean_response_tokens": sum(t.response_tokens for t in trajs) / n,
            "judge_calls": len(calls),
            "judge_cost_usd": float(sum(c.get("cost_usd") or 0.0 for c in calls)),
            "policy_version": self.trainer.policy_version,
            "dropped_groups": int(train_metrics.get("dapo_dropped_groups", 0)),  # DAPO dynamic sampling
            # groups with reward variance DAPO still lacked after its resampling rounds (null for other methods)
            "dapo_shortfall": (max(0, self.cfg.rollout.batch_size - int(train_metrics["dapo_kept_groups"]))
                               if "dapo_kept_groups" in train_metrics else None),
        }
        for key in ("loss", "clip_frac", "approx_kl", "tis_mean", "tis_clip_frac", "entropy", "grad_norm"):
            v = train_metrics.get(key)
            row[key] = None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)
        return row


def read_stage_rows(state: RunState, step: int, table: str) -> Rows:
    out: Rows = []
    for stage in STAGES:
        out += read_stage(table, run_id=state.run_id, step=step, stage=stage, home=state.home) or []
    return out


def trajectories_from_rows(rows: Rows) -> list[Trajectory]:
    return sorted((Trajectory.from_row(r) for r in rows), key=lambda t: (t.group, t.sample))


def rebuild_memory(cfg: ArborConfig, store: StageStore, upto_step: int) -> RubricMemory:
    """The rubric memory from the stored events of every completed memory stage (resume, issue 7)."""
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
    mem = RubricMemory.from_events(cfg.memory, events, activations, sources, group_info_from_rows(rollouts),
                                   partial_phase=partial_phase)
    return mem


def timed_stage(state: RunState, stage: str, fn: Callable[[], dict[str, Rows]]) -> Callable[[], dict[str, Rows]]:
    def run() -> dict[str, Rows]:
        t0 = time.perf_counter()
        out = fn()
        state.stage_seconds[stage] = time.perf_counter() - t0
        return out

    return run


__all__ = ["STAGES", "RunState", "rebuild_memory", "trajectories_from_rows", "GroupScoring"]
