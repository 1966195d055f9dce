"""``arbor-train``: the RL loop as a Prefect flow (paper §3 and App. B.2; docs/architecture.md).

Each step runs the stage graph the run's method declares (``Method.stages``) as Prefect tasks
(``score-step3``). A stage task takes the run's resources, commits its tables to the Parquet stage store keyed by
(run_id, step, stage), and returns a ``StageRef`` to them. Its Prefect cache key is that same triple: a stage that
completed in an earlier attempt of the run shows as Cached and is not run again; the cache record is written only
after the stage store committed, and a stage the store does not hold is always recomputed (``refresh_cache``), so
the store stays the source of truth that SQL reads.

Running the flow again with the same run id (``arbor train --resume RUN_ID``, the deployment with ``run_id``, or
Retry on a flow run in the Prefect UI: a run started without ``run_id`` takes its id from the Prefect flow run)
loads completed stages, lets the method rebuild its state (ARBOR: the rubric memory from its events), restarts
the policy from its latest checkpoint and replays the training stages stored after it. The flow run is named after
the run id.

Retries: a stage declares them (``Stage.retries``). ``rollout``, ``shape`` and ``eval`` are retried once in place
(their inputs are stored and nothing of theirs is stored before their commit). ARBOR's memory stages (``score``,
``retire``, ``induce``, ``consolidate``) and ``train`` are not: they change in-process state (the rubric memory,
the optimizer) before they commit, so a failure there fails the flow run, and the next attempt rebuilds that state
from the store.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefect import Task, flow, get_run_logger, task
from prefect.cache_policies import CachePolicy
from prefect.client.schemas.objects import State
from prefect.context import TaskRunContext
from prefect.states import Failed
from prefect.utilities.annotations import quote

from arbor.flows.progress import RunProgress
from arbor.flows.run_life import recorded_run
from arbor.flows.run_setup import new_run_id, open_run, prepare_run
from arbor.paths import arbor_home
from arbor.storage.lock import release
from arbor.tasks.methods.base import Stage
from arbor.tasks.step import RunState


def flow_run_name() -> str:
    """The Prefect flow run's name: the arbor run id it trains (as ``prepare_run`` will resolve it)."""
    from prefect.runtime import flow_run

    p = flow_run.parameters
    rid = p.get("run_id") or (p.get("overrides") or {}).get("run.run_id")
    return str(rid) if rid else new_run_id(str(p.get("profile") or "tiny-cpu"))


# ------------------------------------------------------------------------------------------------ tasks
EVAL = Stage("eval", ("eval_results", "judge_calls"), retries=1)  # every run.eval_every steps, any method


@dataclass(frozen=True)
class StageRef:
    """What a stage task returns: the stored artifacts holding its output (read them with ``RunState.store``)."""

    run_id: str
    step: int
    stage: str
    tables: tuple[str, ...]


def stage_cache_key(ctx: TaskRunContext, params: dict[str, Any]) -> str:
    """A stage's Prefect cache key: (run_id, step, stage)."""
    return f"arbor-{params['run'].run_id}-step{params['step']}-{ctx.task.name}"


STAGE_CACHE = CachePolicy.from_cache_key_fn(stage_cache_key)


def _stage(run: RunState, step: int, stage: Stage, compute: Callable[[], dict[str, Any]]) -> StageRef:
    run.run_stage(step, stage, compute)
    return StageRef(run.run_id, step, stage.name, stage.tables)


def retry_unless_judge_down(_task: Any, _task_run: Any, state: State) -> bool:
    """A stage's retries (``Stage.retries``) are not spent on a judge that answered nothing or a server
    that stalled: the same calls would wait out the same timeouts again before the run ends."""
    from arbor.llm.health import JudgeUnreachable
    from arbor.runtime.liveness import DependencyStalled

    return not isinstance(state.data, JudgeUnreachable | DependencyStalled)


def _rows(run: RunState, ref: StageRef, table: str) -> list[dict[str, Any]]:
    return run.store.load(ref.step, ref.stage, (table,))[table]


@task(name="stage", cache_policy=STAGE_CACHE, persist_result=True)
def stage_task(run: RunState, step: int, stage: Stage) -> StageRef:
    """One stage of the method's graph (the task is renamed after it: ``score``, ...). A stored train stage was
    already replayed into the trainer by ``restore_policy``: it is loaded, not trained again."""
    return _stage(run, step, stage, lambda: run.compute(stage.name, step))


@task(name="eval", retries=1, retry_delay_seconds=2, cache_policy=STAGE_CACHE, persist_result=True)
def eval_task(run: RunState, step: int) -> StageRef:
    return _stage(run, step, EVAL, lambda: run.evaluate(step))


def call_stage(stage: Stage, run: RunState, step: int) -> StageRef:
    """Run a stage as the Prefect task ``{stage}-step{step}``; a stage the store does not hold is recomputed even
    when Prefect holds a record of it (the store is the source of truth), one it holds is Cached."""
    if stage.name == "eval":
        return _configured(eval_task, stage, run, step)(quote(run), step)
    return _configured(stage_task, stage, run, step)(quote(run), step, stage)


def submit_stage(stage: Stage, run: RunState, step: int) -> Any:
    """``call_stage`` on the flow's task runner (a worker thread): returns its future."""
    return _configured(stage_task, stage, run, step).submit(quote(run), step, stage)


def _configured(t: Task[..., StageRef], stage: Stage, run: RunState, step: int) -> Task[..., StageRef]:
    fresh = not run.store.done(step, stage.name)
    keys = STAGE_CACHE.configure(key_storage=str(run.home / "prefect" / "stage-cache"))
    return t.with_options(name=stage.name, task_run_name=f"{stage.name}-step{step}", cache_policy=keys,
                          refresh_cache=fresh, retries=stage.retries, retry_delay_seconds=2 if stage.retries else 0,
                          retry_condition_fn=retry_unless_judge_down)


def run_step(run: RunState, step: int) -> dict[str, Any]:
    """One RL step: the stages of the method's graph in order; returns the step's metrics row.

    ``run.overlap=one-step``: step N+1's rollout is submitted to the task runner when step N's judging
    is done and runs, with the engine's weights of step N-1, while step N trains; the weights are synced once both
    have finished. A resumed run replays the same schedule (``restore_policy``)."""
    run.stage_seconds.pop(step - 2, None)
    *before, train = run.method.stages
    for stage in before:
        call_stage(stage, run, step)
    run.end_judging(step)
    trained = run.store.done(step, "train")  # then restore_policy replayed it
    ahead = None
    if run.cfg.run.overlap == "one-step" and step < run.cfg.run.steps:
        ahead = submit_stage(run.method.stages[0], run, step + 1)
    try:
        ref = call_stage(train, run, step)
    finally:
        if ahead is not None:  # never leave a rollout running on weights about to change
            ahead.result()
    if not trained:
        run.after_train(step)
    elif ahead is not None and run.trainer.policy_version == step:  # replayed by restore_policy past the version
        run.trainer.maybe_save(step)                                # the engine kept for this rollout
        run.sync_weights()
    every = run.cfg.run.eval_every
    if (every and step % every == 0) or (run.cfg.run.eval_final and step == run.cfg.run.steps):
        call_stage(EVAL, run, step)
    metrics = _rows(run, ref, "steps")[0]
    publish_step(run, step, metrics)
    return metrics


def publish_step(state: RunState, step: int, metrics: dict[str, Any]) -> None:
    """Prefect artifacts per step: the method's report of it (``Method.step_report``; ARBOR: its rubric events
    and pool) and the step metrics."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    key = f"{state.run_id}-step-{step}".lower().replace("_", "-").replace(".", "-")
    try:
        if (report := state.method.step_report(state, step)) is not None:
            create_markdown_artifact(key=f"report-{key}", markdown=report)
        row = {k: (v if isinstance(v, int | float | str) or v is None else str(v)) for k, v in metrics.items()}
        create_table_artifact(key=f"metrics-{key}", table=[row])
    except Exception as e:  # noqa: BLE001 - artifacts are a view; never fail a step for them
        get_run_logger().warning("could not publish artifacts for step %s: %s", step, e)


def report_judge_health(state: RunState, step: int, metrics: dict[str, Any], logger: Any) -> None:
    """The step's judge-health lines under its summary whenever a judge call failed or was refused, and a WARNING
    for each role whose answers were mostly refused (``tasks.reporting.judge_health``)."""
    from arbor.tasks.reporting.judge_health import health_lines, refusal_warnings
    from arbor.tasks.step import read_stage_rows

    calls = read_stage_rows(state, step, "judge_calls")
    lines = health_lines(calls, int(metrics.get("n_groups") or 0), int(metrics.get("judged_groups") or 0))
    if lines:
        print("\n".join(lines), flush=True)
    for line in refusal_warnings(calls, state.cfg.judge.warn_refused_share):
        logger.warning(line)


def tag_flow_run(*new: str) -> None:
    """Tag the flow run (profile, method: filters in the Prefect UI). Not its task runs: Prefect acquires a
    concurrency slot for every tag of a task run, an API round trip that stalled the stage after each rollout by
    ~2 s (bench/pipeline.py)."""
    from prefect import get_client
    from prefect.runtime import flow_run

    if not flow_run.id:
        return
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run.id, tags=sorted({*flow_run.tags, *new}))
    except Exception as e:  # noqa: BLE001 - tags are a view; never fail a run for them
        get_run_logger().warning("could not tag flow run %s: %s", flow_run.id, e)


@flow(name="arbor-train", log_prints=True, flow_run_name=flow_run_name)
def arbor_train(profile: str = "tiny-cpu", overrides: dict[str, Any] | None = None, run_id: str | None = None,
                resume: bool = False, redo: str | None = None) -> str | State:
    """Run (or resume) a training run; returns its run id, or a Failed state naming what refused it (a bad key
    or value, a missing resource) before anything of the run was written. ``redo`` (``STEP:STAGE``, a stored run
    only): discard that stage, every later one and the checkpoints from that step, and compute them again."""
    from arbor.runtime.quiet import quiet

    quiet()  # a worker's flow run has no CLI to do it
    from arbor.config import ConfigError
    from arbor.preflight import PreflightError
    from arbor.runtime import stop
    from arbor.storage.schemas import SchemaError

    stop.rearm()  # under `arbor train`: SIGTERM takes arbor's stop path, not the handler Prefect set for the flow
    from arbor.storage.catalog import ensure_catalog
    from arbor.tasks.reporting.tracking import Tracker, grouped_metrics
    from arbor.tasks.step import sample_rows, tracked_metrics

    home = arbor_home()
    ensure_catalog(home)  # create / migrate once, up front; the run never holds the catalog open
    try:  # takes the run (storage.runs.claim_run): one writer, locked from before its record is read
        cfg = prepare_run(profile, overrides, run_id, resume, home, redo=redo)
    except (ConfigError, PreflightError, SchemaError) as e:
        # refused before anything of the run was written: the flow run ends Failed with the reason as its one
        # line (a deployment run has no CLI to print it; a traceback would bury it)
        return Failed(message=f"{type(e).__name__}: {e}")
    rid = cfg.run.run_id or ""
    stop.set_run(rid)
    logger = get_run_logger()
    try:
        tag_flow_run(f"profile:{cfg.run.profile}", f"method:{cfg.run.method}")
        with recorded_run(cfg, rid, home, watch=False):  # running, then completed / stopped / failed
            with open_run(cfg, home) as run, RunProgress(cfg.run.steps) as progress, \
                    Tracker(rid, home, tracking=cfg.tracking, config=cfg.model_dump(mode="json"),
                            method_lines=run.method.console_lines) as tracker:
                run.progress, run.on_progress = progress, progress.calls
                if cfg.run.eval_every and cfg.run.eval_at_start:  # the start point of every learning curve
                    call_stage(EVAL, run, 0)
                    tracker.log(0, tracked_metrics(run, 0))
                for step in range(1, cfg.run.steps + 1):
                    stop.raise_pending()  # a stop whose raise was lost (arbor/runtime/stop.py) ends the run here
                    t0 = time.perf_counter()
                    m = run_step(run, step)
                    progress.step_done()
                    logged = tracker.log(step, {**grouped_metrics(m), **tracked_metrics(run, step)})
                    report_judge_health(run, step, m, logger)
                    tracker.log_samples(step, sample_rows(run, step, cfg.tracking.samples_per_step))
                    if "console" not in cfg.tracking.loggers:  # the console tracker prints the step's summary itself
                        own = "".join(f"; {' '.join(line.split())}" for line in run.method.console_lines(logged))
                        logger.info(
                            "step %d/%d: base %.3f total %.3f valid %.2f zero-var %.2f -> %.2f%s (%.1f s)", step,
                            cfg.run.steps, m["mean_base_reward"], m["mean_total_reward"], m["format_valid_rate"],
                            m["zero_var_base"], m["zero_var_total"], own, time.perf_counter() - t0,
                        )
                run.finish_saves()
                stop.raise_pending()
            stop.raise_pending()  # and one lost while the run closed (the final save, the servers)
    finally:
        release(rid, home)  # the run's lock, given back once its end is recorded
    return rid

__all__ = ["arbor_train", "run_step"]

if __name__ == "__main__":  # pragma: no cover
    arbor_train(profile=os.environ.get("ARBOR_PROFILE", "tiny-cpu"))
