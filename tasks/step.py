"""One RL step of ``arbor-train``, stage by stage (paper §3, App. B.2; docs/architecture.md).

The run's method declares the step's stage graph (``Method.stages``): the pipeline's ``rollout``,
``shape`` and ``train`` and the stages it adds between them. ARBOR's:

    rollout ─► score ─► retire ─► induce ─► shape ─► consolidate ─► train
    (K per     (active    (n_r >     (anchors,  (eq. 3/4)  (every        (the policy
     prompt,    commons,   kappa,     drafts,              K_consol      update,
     base       sparse     rho_r <    admission            drafts)       checkpoint,
     reward)    judging)   rho_min)   eq. 2)                             weight sync)

Every stage returns the rows of its declared tables; ``tasks.stages.StageStore`` turns it into an artifact keyed by
(run, step, stage): a stage found complete is loaded, never recomputed. State a method keeps between steps (ARBOR's
rubric memory) lives in the method and is rebuilt from the stored stages by ``Method.restore``.

This module owns what every method shares: batches, storage, the pipeline's stages, the update sent to the
trainer, metrics.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from arbor.config import ArborConfig
from arbor.group_stats import classify_group
from arbor.llm.base import Judge
from arbor.llm.health import check_outage, degraded_roles, judged_groups, public_url, role_health
from arbor.llm.stream import StreamedJudge, StreamStats
from arbor.storage.catalog import declare_tables
from arbor.storage.parquet import read_stage
from arbor.tasks.env.datasets import Question
from arbor.tasks.methods import make_method
from arbor.tasks.methods.base import Method, Stage, check_hooks, check_stages
from arbor.tasks.stage_store import Rows, StageStore
from arbor.tasks.training.update import policy_update
from arbor.tasks.training.weight_sync import sync_policy
from arbor.types import Trajectory, UpdateBatch

if TYPE_CHECKING:
    from arbor.tasks.env.rollout_driver import RolloutGuide

T = TypeVar("T")


@dataclass
class RunState:
    """Everything one run's steps share: config, stores, engines, judge, the method, and the processes the run
    started (a supervised ``vllm serve``, a trainer service). A context manager: leaving it stops them."""

    cfg: ArborConfig
    run_id: str
    home: Path
    store: StageStore
    questions: list[Question]
    engine: Any  # tasks.env.rollout engine
    trainer: Any  # tasks.training.train.Trainer
    judge: Judge
    embed: Callable[[list[str]], Any]
    on_progress: Callable[[str, int, int], None] | None = None
    progress: Any = None  # flows.progress.RunProgress, when a flow shows one
    servers: list[Any] = field(default_factory=list)  # started processes with .stop() (tasks.env.serving.Supervised)
    stage_seconds: dict[int, dict[str, float]] = field(default_factory=dict)  # step -> stage -> seconds
    last_train_metrics: dict[str, float] = field(default_factory=dict)
    stream_stats: StreamStats | None = None  # the step's streamed judging (None: not streamed, or resumed after it)
    method: Method = None  # type: ignore[assignment]  # the configured one (``run.method``; None: built here)
    # what the rollouts run under (Co-ReAct's guided training rollouts, guidance.mode=co-react; None: plain turns):
    # given here, handed to the engine here, and its records stored by the rollout stage
    guide: RolloutGuide | None = None
    reloader: Any = None  # cluster.weight_sync=reload: tasks.training.weight_sync.ReloadSync (its last good weights)

    def __post_init__(self) -> None:
        if self.method is None:
            self.method = make_method(self.cfg)
        if self.guide is not None:
            self.engine.guide = self.guide
        check_stages(self.method.stages, self.cfg.run.method)
        check_hooks(self.method, self.cfg.run.method)
        if self.method.tables is not None:  # its tables and views, known to every reader of the workspace
            declare_tables(self.method.tables, self.home)
        self.method.restore(self)  # its own state (ARBOR's memory, SS-GRPO's stage buffer) from the stored stages

    @property
    def seed(self) -> int:
        return self.cfg.run.seed

    def __enter__(self) -> RunState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the trainer service and servers this run started (idempotent)."""
        if hasattr(self.trainer, "close"):
            self.trainer.close()
        if isinstance(self.judge, StreamedJudge):
            self.judge.close()
        gc.unfreeze()  # open_run froze the run's long-lived objects
        while self.servers:
            self.servers.pop().stop()

    def trajectories(self, step: int, stage: str, table: str) -> list[Trajectory]:
        """The trajectories a completed stage stored (``rollout``: as sampled; ``shape``: with R_total)."""
        return trajectories_from_rows(self.store.load(step, stage, (table,))[table])

    def rows(self, step: int, table: str) -> Rows:
        """Every row of ``table`` that ``step``'s stages stored."""
        return read_stage_rows(self, step, table)

    # ------------------------------------------------------------------------------------------ helpers
    def judge_rows(self) -> Rows:
        """The judge calls made since the last drain (each stage stores its own)."""
        return self.judge.drain_calls()

    def judge_cost_so_far(self) -> float:
        from arbor.storage.parquet import read_table

        t = read_table("judge_calls", run_id=self.run_id, home=self.home)
        return judge_cost(t.select(["cost_usd"]).to_pylist()) if t.num_rows else 0.0

    def judge_url(self, role: str) -> str:
        """Where role ``role``'s judge is, as it may be shown (no credentials)."""
        jc = self.cfg.judge
        if jc.backend != "openai":
            return f"judge.backend={jc.backend}"
        return public_url(jc.for_role(role)["base_url"])  # type: ignore[arg-type]

    def check_judge(self, step: int, stage: str, out: dict[str, Rows]) -> dict[str, Rows]:
        """``out`` (a stage's rows, before they commit) unless a judge role answered nothing: when a role's calls
        of the step so far (the stages committed before this one and this stage's) failed in transport at
        ``judge.max_failed_share`` or more, ``llm.health.JudgeUnreachable`` names the role, its URL and the last
        error, and the stage, hence the step, is not committed. Every method's roles, one rule."""
        rows = out.get("judge_calls") or []
        if rows:
            earlier = [r for s in self.stage_names() if s != stage and self.store.done(step, s)
                       for r in read_stage("judge_calls", run_id=self.run_id, step=step, stage=s, home=self.home) or []]
            check_outage([*earlier, *rows], self.cfg.judge.max_failed_share, self.judge_url, step, stage)
        return out

    def judge_capped(self) -> bool:
        cap = self.cfg.judge.cost_cap_usd
        return cap is not None and self.judge_cost_so_far() >= cap

    def run_async(self, coro: Awaitable[T]) -> T:
        return asyncio.run(coro)  # type: ignore[arg-type]

    def groups(self, trajs: Sequence[Trajectory]) -> list[list[Trajectory]]:
        out: dict[int, list[Trajectory]] = {}
        for t in trajs:
            out.setdefault(t.group, []).append(t)
        return [sorted(out[g], key=lambda t: t.sample) for g in sorted(out)]

    def scoring_progress(self, stage: str, total: int) -> Callable[[], None]:
        done = [0]

        def tick() -> None:
            done[0] += 1
            if self.on_progress is not None:
                self.on_progress(stage, done[0], total)

        return tick

    # ------------------------------------------------------------------------------------------ stages
    def rollout(self, step: int) -> dict[str, Rows]:
        """K trajectories per prompt with the policy of version step-1, base reward, great-expectations check."""
        from arbor.llm.base import CallContext
        from arbor.storage.validation import validate_trajectories

        batch, extra = self.method.batch(self, step)
        guide = self.guide
        if guide is not None:
            guide.set_context(CallContext(run_id=self.run_id, step=step, stage="rollout"), run_id=self.run_id,
                              step=step)
        streamed: set[int] = set()
        on_group = self._streamer(step, streamed)
        report = self._reporter(on_group, len(batch))
        takes = "on_group" in inspect.signature(self.engine.generate_groups).parameters  # a user's engine may not
        more = {"on_group": report} if takes and report is not None else {}
        trajs = self.engine.generate_groups(batch, self.cfg.rollout.k, self.seed, step, run_id=self.run_id, **more)
        trajs += self.method.extra_rollouts(self, step, batch, trajs)
        if on_group is not None:  # groups the engine did not report (a method's extra rollouts)
            for g in self.groups(trajs):
                if g[0].group not in streamed:
                    on_group(g)
        rows = [t.to_row() for t in trajs]
        validate_trajectories(rows, k=self.cfg.rollout.k, custom_reward=self.cfg.reward.fn is not None,
                              format_gate=self.cfg.reward.format_gate)
        if guide is not None:  # the guided turns and the rubric writer's and verifier's calls
            extra = {"guided_steps": guide.drain_records(), "judge_calls": self.judge_rows(), **extra}
        return {"rollouts": rows, **extra}

    def _reporter(self, on_group: Callable[[list[Trajectory]], None] | None, total: int,
                  unit: str = "groups") -> Callable[[list[Trajectory]], None] | None:
        """Each finished group: to the streamed judge (``on_group``) and to the progress display."""
        if self.progress is None:
            return on_group
        done = [0]

        def report(group: list[Trajectory]) -> None:
            if on_group is not None:
                on_group(group)
            done[0] += 1
            self.progress.groups(done[0], total, unit)

        return report

    def _streamer(self, step: int, streamed: set[int]) -> Callable[[list[Trajectory]], None] | None:
        """Streamed judging: each finished group goes to the method's ``prefetch`` on the judge's loop."""
        judge = self.judge
        if not isinstance(judge, StreamedJudge):
            return None
        judge.take_stats()  # a fresh ledger of guesses for this step

        def on_group(group: list[Trajectory]) -> None:
            streamed.add(group[0].group)
            judge.stream(lambda: self.method.prefetch(self, step, group))

        return on_group

    def settle_judge(self) -> None:
        """Before a stage claims prefetched answers: every streamed prefetch has registered its calls."""
        if isinstance(self.judge, StreamedJudge):
            self.judge.settle()

    def end_judging(self, step: int) -> None:
        """After the step's last judging stage: the streaming figures of the step (unclaimed guesses dropped)."""
        self.stream_stats = self.judge.take_stats() if isinstance(self.judge, StreamedJudge) else None

    def run_stage(self, step: int, stage: Stage, compute: Callable[[], dict[str, Rows]] | None = None) -> None:
        """Compute ``stage`` of ``step`` (default: ``compute(stage.name, step)``) and commit its tables to the stage
        store, its seconds in ``stage_seconds``; a stage the store holds is loaded, not computed. A judge that
        answered nothing is refused before the commit (``check_judge``). What a flow's stage task runs."""
        if self.progress is not None:
            self.progress.stage_started(step, stage.name)
        rows = compute or (lambda: self.compute(stage.name, step))
        judged = lambda: self.check_judge(step, stage.name, rows())  # noqa: E731
        self.store.run(step, stage.name, stage.tables, timed_stage(self, step, stage.name, judged))

    def compute(self, stage: str, step: int) -> dict[str, Rows]:
        """The rows of ``stage`` of ``step``: the pipeline's rollout or train, else the hook the method runs for it
        (``Method.stage_hooks``: ``shape`` and the method's own stages), given the step's rollouts (judge work a
        prefetch began is claimed there)."""
        if stage == "rollout":
            return self.rollout(step)
        if stage == "train":
            return self.train(step, self.trajectories(step, "shape", "trajectories"))
        trajs = self.trajectories(step, "rollout", "rollouts")
        self.settle_judge()
        return self.method.stage_hooks()[stage](self, step, trajs)

    def stage_names(self) -> tuple[str, ...]:
        """The step's stages in order (the method's graph)."""
        return self.method.stage_names()

    def update_batch(self, step: int, trajs: list[Trajectory] | None = None) -> UpdateBatch:
        """What the trainer updates on at ``step`` (``tasks.training.update.policy_update``): the shaped rollouts (default:
        the stored ones, so a resumed run replays the same update) and what the method adds
        (``Method.train_batch``), with the method's group choice, per-token advantages and KL coefficient."""
        shaped = self.trajectories(step, "shape", "trajectories") if trajs is None else trajs
        return policy_update(self.method.train_batch(self, step, shaped), step, self.cfg.train, self.cfg.run.overlap,
                             self.method, source=self.cfg.run.method)

    def train(self, step: int, trajs: list[Trajectory]) -> dict[str, Rows]:
        """One policy update on the shaped batch (plus the method's additions, ``Method.train_batch``); the
        step's metrics row (the stage's artifact) describes the shaped rollouts."""
        metrics = self.trainer.train_step(self.update_batch(step, trajs), step)
        self.last_train_metrics = metrics
        return {"steps": [self.step_row(step, trajs, metrics)]}

    def after_train(self, step: int) -> None:
        """Once the train stage is committed: checkpoint (every N steps) and weight sync. A crash between the
        commit and the checkpoint is repaired on resume by replaying the stored batch (``restore_policy``). Under
        ``checkpoint.async_save`` the save returns once the state is copied and is written while the next step
        runs; ``close`` waits for it at the run's end and abandons it under a stop."""
        from arbor.tasks.training.checkpoint import checkpoint_due

        if self.stream_stats is not None and isinstance(self.judge, StreamedJudge):
            self.judge.settle_wasted(self.stream_stats)  # their cost is in the committed steps row
        if self.progress is not None and checkpoint_due(step, self.cfg.checkpoint.every, self.cfg.run.steps):
            self.progress.stage_started(step, "checkpoint")  # the progress line names the phase
        seconds = self.stage_seconds.setdefault(step, {})
        t0 = time.perf_counter()
        self.trainer.maybe_save(step, self.last_train_metrics)  # the step's share of the save (timing_s/checkpoint)
        t1 = time.perf_counter()
        self.method.after_train(self, step, self.last_train_metrics)
        t2 = time.perf_counter()
        self.sync_weights()
        seconds |= {"checkpoint": t1 - t0, "sync": time.perf_counter() - t2}

    def finish_saves(self) -> None:
        """The run's last save in flight (``checkpoint.async_save``) written and committed under the progress
        line's checkpoint phase, before the run reports its end: the final policy is on disk when it does."""
        if self.cfg.checkpoint.async_save and self.progress is not None:
            self.progress.stage_started(self.trainer.step, "checkpoint")
        self.trainer.finish_save()

    def evaluate(self, step: int) -> dict[str, Rows]:
        """Held-out evaluation every ``run.eval_every`` steps on the first ``run.eval_size`` questions of each set
        of ``data.eval``, each set's rows under its own split name (ARBOR B.1's per-benchmark table)."""
        from arbor.tasks.env.datasets import fields_of, load_questions
        from arbor.tasks.reporting.evaluate import evaluate_questions

        by_set = {spec: load_questions(spec, config=self.cfg, fields=fields_of(self.cfg.data))[: self.cfg.run.eval_size]
                  for spec in self.cfg.data.eval_sets()}
        answers = sum(len(qs) for qs in by_set.values()) * self.cfg.run.eval_runs
        rows = evaluate_questions(self.engine, self.judge, by_set,
                                  runs=self.cfg.run.eval_runs, seed=self.seed, run_id=self.run_id, step=step,
                                  checkpoint=f"policy-v{self.trainer.policy_version}",
                                  temperature=self.cfg.eval.temperature,
                                  on_group=self._reporter(None, answers, "answers"))
        return {"eval_results": rows, "judge_calls": self.judge_rows()}

    def sync_weights(self) -> None:
        """After each step: the rollout engine gets the trainer's weights and version (``tasks.training.weight_sync``)."""
        managed = bool(self.servers) and hasattr(self.servers[0], "restart_on")  # the `vllm serve` we launched
        restart = self._restart_server if managed else None
        c = self.cfg.cluster
        if c.weight_sync == "reload" and self.reloader is None and self.cfg.rollout.base_url:
            from arbor.tasks.training.weight_sync import ReloadSync

            self.reloader = ReloadSync(self.cfg.rollout.base_url, restart, reset_tries=c.sync_reset_tries)
        sync_policy(self.trainer, self.engine, self.home / "trainer" / self.run_id / "sync", self.cfg.rollout.base_url,
                    weight_sync=c.weight_sync, restart=restart, reloader=self.reloader)

    def _restart_server(self, path: Path) -> None:
        """cluster.weight_sync=restart: relaunch the managed `vllm serve` on the exported ``hf/`` at ``path``."""
        from arbor.tasks.env.serving import vllm_serve_spec

        self.servers[0].restart_on(vllm_serve_spec(self.cfg, str(path)))

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
            "wall_seconds": sum(self.stage_seconds.get(step, {}).values()),
            "mean_base_reward": sum(t.base_reward for t in trajs) / n,
            "mean_total_reward": sum(t.shaped_reward or 0.0 for t in trajs) / n,
            "format_valid_rate": sum(t.format_valid for t in trajs) / n,
            "zero_var_base": zb / max(len(groups), 1),
            "zero_var_total": zt / max(len(groups), 1),
            "n_groups": len(groups),
            "mean_searches": sum(t.search_calls for t in trajs) / n,
            "mean_response_tokens": sum(t.response_tokens for t in trajs) / n,
            "judge_calls": len(calls),
            "judge_cost_usd": judge_cost(calls),
            **judge_health_columns(calls, [g[0].group for g in groups], self.cfg.judge.warn_refused_share),
            "policy_version": self.trainer.policy_version,
            **stream_columns(self.stream_stats),
            "dropped_groups": int(train_metrics.get("dropped_groups", 0)),  # the method's select_groups
        }
        for key in ("loss", "clip_frac", "approx_kl", "tis_mean", "tis_clip_frac", "entropy", "grad_norm"):
            v = train_metrics.get(key)
            row[key] = None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)
        row.update(self.method.step_metrics(self, step, train_metrics))
        return row


def judge_cost(calls: Sequence[dict[str, Any]]) -> float:
    """The step's judge spend: the calls' ``cost_usd`` summed exactly (``math.fsum``), so that the ledger's row order
    (the order concurrent calls finished in) cannot change the stored figure in its last bit."""
    return math.fsum(c.get("cost_usd") or 0.0 for c in calls)


def judge_health_columns(calls: Rows, groups: Sequence[int], warn_refused_share: float) -> dict[str, Any]:
    """The ``steps`` columns of judge health (``llm.health``): calls that failed in transport, calls
    refused, the rollout groups the judge answered about, and the roles whose refused share passed
    ``judge.warn_refused_share`` (null: none, the step is not degraded)."""
    health = role_health(calls)
    degraded = degraded_roles(health, warn_refused_share)
    return {"judge_calls_failed": sum(h.counts["failed"] for h in health.values()),
            "judge_calls_refused": sum(h.counts["refused"] for h in health.values()),
            "judged_groups": judged_groups(calls, groups),
            "judge_degraded": ",".join(h.role for h in degraded) or None}


def stream_columns(stats: StreamStats | None) -> dict[str, Any]:
    """The ``steps`` columns of streamed judging: calls made ahead, wrong guesses and their cost (null: serial)."""
    if stats is None:
        return {"prefetched_calls": None, "prefetch_wasted_calls": None, "prefetch_wasted_cost_usd": None}
    return {"prefetched_calls": stats.prefetched, "prefetch_wasted_calls": stats.wasted,
            "prefetch_wasted_cost_usd": stats.wasted_cost_usd}


def read_stage_rows(state: RunState, step: int, table: str) -> Rows:
    """Every row of ``table`` the step's stages stored."""
    out: Rows = []
    for stage in state.stage_names():
        out += read_stage(table, run_id=state.run_id, step=step, stage=stage, home=state.home) or []
    return out


def tracked_metrics(state: RunState, step: int) -> dict[str, float | None]:
    """What the loggers show beside the ``steps`` row: each stage's seconds (``timing_s/``), what the method
    logs of itself (``Method.logged_metrics``) and, when the step evaluated, held-out scores per split (``eval/``;
    split names reduced to MLflow's metric-name characters)."""
    import re

    from arbor.tasks.reporting.evaluate import split_metrics

    out: dict[str, float | None] = {f"timing_s/{stage}": secs
                                    for stage, secs in state.stage_seconds.get(step, {}).items()}
    if step > 0:  # every stage of the step, train and eval included (the steps row is written before train runs),
        # with the checkpoint's and the weight sync's share after train
        out["timing_s/step"] = sum(state.stage_seconds.get(step, {}).values())
        # inside train: the update's passes (the trainer of this process; a trainer service reports none)
        trained = "train" in state.stage_seconds.get(step, {})  # computed in this process, not loaded
        timing = (getattr(state.trainer, "last_timing", None) or {}) if trained else {}
        out |= {f"timing_s/train_{k}": float(timing[k]) for k in ("old_logprobs", "forward", "backward", "optimizer")
                if k in timing}
        out |= state.method.logged_metrics(state, step)  # ARBOR: its rubric lifecycle and its judge's signal
    evals = read_stage("eval_results", run_id=state.run_id, step=step, stage="eval", home=state.home) or []
    for split in sorted({r["split"] for r in evals}):
        m = split_metrics([r for r in evals if r["split"] == split], split)  # strict pass@1, as `arbor eval` prints
        name = re.sub(r"[^A-Za-z0-9_.\- ]", "_", split)
        out |= {f"eval/{name}/strict_f1": m.f1, f"eval/{name}/strict_em": m.em,
                f"eval/{name}/format_valid_rate": m.valid_rate}
    return out


def sample_rows(state: RunState, step: int, n: int) -> list[dict[str, Any]]:
    """The sample table of a step: the first trajectory of each of the first ``n`` groups, with its rewards and
    the scores the method gave it (``Method.sample_scores``; ARBOR: ``rubric_id score`` per active rubric)."""
    trajs = [t for t in trajectories_from_rows(read_stage_rows(state, step, "trajectories")) if t.sample == 0][:n]
    scores = state.method.sample_scores(state, step) if trajs else {}
    return [{"step": step, "group": t.group, "sample": t.sample, "question": t.question, "gold": " | ".join(t.golds),
             "answer": t.answer or "", "format_valid": t.format_valid, "base_reward": t.base_reward,
             "total_reward": t.shaped_reward, "scores": scores.get((t.group, t.sample), ""), "response": t.text}
            for t in trajs]


def trajectories_from_rows(rows: Rows) -> list[Trajectory]:
    return sorted((Trajectory.from_row(r) for r in rows), key=lambda t: (t.group, t.sample))


def timed_stage(state: RunState, step: int, stage: str,
                fn: Callable[[], dict[str, Rows]]) -> Callable[[], dict[str, Rows]]:
    def run() -> dict[str, Rows]:
        t0 = time.perf_counter()
        out = fn()
        state.stage_seconds.setdefault(step, {})[stage] = time.perf_counter() - t0
        return out

    return run


__all__ = ["RunState", "trajectories_from_rows"]
