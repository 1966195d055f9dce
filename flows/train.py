"""``arbor-train``: the RL loop as a Prefect flow (DESIGN §1, paper §3 and App. B.2).

Each step runs the stage graph the run's method declares (``Method.stages``, issue 32) as Prefect tasks
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

import gc
import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import Task, flow, get_run_logger, task
from prefect.cache_policies import CachePolicy
from prefect.client.schemas.objects import State
from prefect.context import TaskRunContext
from prefect.states import Failed
from prefect.utilities.annotations import quote

from arbor.config import ArborConfig, load_config
from arbor.config.data import DataConfig
from arbor.config.inputs import workspace_inputs
from arbor.flows.progress import RunProgress
from arbor.paths import arbor_home, resolve_home_path
from arbor.storage.liveness import Heartbeat
from arbor.storage.lock import run_lock
from arbor.tasks.methods import make_method
from arbor.tasks.methods.base import Stage
from arbor.tasks.stages import StageStore
from arbor.tasks.step import RunState, timed_stage
from arbor.types import LossSettings


def new_run_id(profile: str) -> str:
    """A fresh run id. Inside a Prefect flow run: the profile and the flow run's id (``tiny-cpu-3f2a9c1b``), so a
    retry of that flow run resumes the same arbor run; elsewhere the local time and 16 random bits."""
    from prefect.runtime import flow_run

    fid = flow_run.id
    if fid:
        return f"{profile}-{str(fid).replace('-', '')[:8]}"
    return f"{profile}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def flow_run_name() -> str:
    """The Prefect flow run's name: the arbor run id it trains (as ``prepare_run`` will resolve it)."""
    from prefect.runtime import flow_run

    p = flow_run.parameters
    rid = p.get("run_id") or (p.get("overrides") or {}).get("run.run_id")
    return str(rid) if rid else new_run_id(str(p.get("profile") or "tiny-cpu"))


def stored_config(run_id: str, home: Path) -> ArborConfig | None:
    """The config a run was started with, with the changes applied on resume since (``runs.config_changes``)."""
    from arbor.storage.runs import run_row

    row = run_row(run_id, home)
    return ArborConfig.model_validate_json(row["config_json"]) if row else None


def prepare_run(profile: str, overrides: dict[str, Any] | list[str] | None, run_id: str | None,
                resume: bool, home: Path) -> ArborConfig:
    """Resolve the config. A known run id continues that run from its stored config: overrides of the keys that
    are safe on resume (``arbor.config.resume``) are applied and recorded, any other change is refused by name
    (``ConfigError``). ``resume`` with an unknown id is refused; a new run's config is written."""
    from arbor.config.resume import amend_config
    from arbor.config.show import config_sources, read_sources, write_run_config
    from arbor.preflight import require
    from arbor.storage.parquet import write_stage
    from arbor.storage.runs import record_config_changes

    if run_id is not None:
        stored = stored_config(run_id, home)
        if stored is not None:
            cfg, changes = amend_config(stored, overrides)
            require(cfg)  # what the run needs is here, before its record changes
            if changes:
                record_config_changes(run_id, cfg.to_json(), changes, home)
                path = run_config_path(run_id, home)
                write_run_config(path, cfg, {**read_sources(path), **{k: "override (resume)" for k in changes}})
                print(f"run {run_id} resumed with " + ", ".join(  # logged by the flow (log_prints)
                    f"{k}: {old!r} -> {new!r}" for k, (old, new) in sorted(changes.items())))
            return cfg
        if resume:
            raise ValueError(f"cannot resume run '{run_id}': no such run in {home}")
    cfg = load_config(profile, overrides)
    workspace_inputs(cfg)  # relative input paths: the current directory's, else ARBOR_HOME's
    require(cfg)  # a run that cannot start leaves nothing behind (issue 47: a deployment run on the wrong machine)
    rid = run_id or cfg.run.run_id or new_run_id(cfg.run.profile)
    cfg.run.run_id = rid
    write_stage("runs", [{
        "run_id": rid, "profile": cfg.run.profile, "method": cfg.run.method, "seed": cfg.run.seed,
        "config_json": cfg.to_json(), "created_at": time.time(), "git_sha": _git_sha(),
        "train_set": cfg.data.train, "eval_sets": cfg.data.eval_sets(),
    }], run_id=rid, step=0, stage="run", home=home)
    write_run_config(run_config_path(rid, home), cfg, config_sources(profile, _as_mapping(overrides)))
    return cfg


def run_config_path(run_id: str, home: Path) -> Path:
    """The run's resolved config with each value's source, beside its artifacts (``arbor config show``'s text)."""
    return home / "runs" / run_id / "config.yaml"


def _as_mapping(overrides: dict[str, Any] | list[str] | None) -> dict[str, Any]:
    from arbor.config import _split

    return dict(overrides or {}) if not isinstance(overrides, list) else dict(_split(o) for o in overrides)


def _git_sha() -> str | None:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def start_checkpoint(cfg: ArborConfig, home: Path) -> Path:
    """The RL start point: an explicit checkpoint, an SFT warm start (cached), or the base policy. An explicit
    checkpoint that ``arbor-sft`` trained in another protocol than ``rollout.protocol`` is refused
    (``PreflightError`` naming both keys); one without ``arbor_sft.json`` (a Hub model, a user's path) is taken."""
    if cfg.run.start_checkpoint and (resolve_home_path(cfg.run.start_checkpoint) / "config.json").exists():
        from arbor.preflight import PreflightError, start_protocol_problem

        start = resolve_home_path(cfg.run.start_checkpoint)
        if problem := start_protocol_problem(cfg.rollout.protocol, start, "run.start_checkpoint"):
            raise PreflightError(problem)
        return start
    if cfg.run.sft_warm_start:
        from arbor.flows.sft import sft_checkpoint

        return sft_checkpoint(cfg, home)
    from arbor.tasks.env.policy import policy_source

    return Path(policy_source(cfg.policy, home))


def open_run(cfg: ArborConfig, home: Path) -> RunState:
    """Build engines, judge, method and trainer; restore the policy and the method's state from stored artifacts.
    The returned ``RunState`` is a context manager that stops what it started."""
    from arbor.llm import make_judge
    from arbor.preflight import weight_sync_plan
    from arbor.tasks.env.datasets import fields_of, load_questions
    from arbor.tasks.env.policy import load_policy
    from arbor.tasks.env.rollout import make_engine
    from arbor.tasks.env.search import make_search
    from arbor.tasks.methods import load_judges
    from arbor.tasks.methods.coreact.guidance import make_guide

    if cfg.rollout.engine == "openai":
        # which sync this run uses and why (logged by the flow: log_prints)
        print(weight_sync_plan(cfg.cluster, cfg.rollout))
    run_id = cfg.run.run_id
    assert run_id is not None
    store = StageStore(run_id, home)
    questions = load_questions(cfg.data.train, size=cfg.data.train_size, seed=cfg.run.seed, config=cfg,
                               fields=fields_of(cfg.data))
    print(data_line(cfg.data, cfg.run.eval_every, len(questions)))  # logged by the flow (log_prints): what the run trains and evaluates on
    search = make_search(cfg.search, home=home, config=cfg)
    start = start_checkpoint(cfg, home)
    method = make_method(cfg)
    trainer = make_trainer(cfg, start, home, method.loss_settings(cfg.train))
    servers: list[Any] = []
    if cfg.rollout.engine == "transformers":
        policy, tokenizer = load_policy(start, cfg.policy.dtype, home=home, policy_cfg=cfg.policy)
        engine = make_engine(cfg, policy, tokenizer, search=search, home=home)
    else:
        if cfg.cluster.manage_vllm:  # GPU layout: `vllm serve` on cluster.rollout_gpus, supervised by the flow
            from arbor.tasks.env.serving import Supervised, vllm_serve_spec

            spec = vllm_serve_spec(cfg, str(start))
            server = Supervised(spec, startup_timeout_s=cfg.cluster.startup_timeout_s,
                                log_path=str(home / f"vllm-{run_id}.log"))
            server.start()
            servers.append(server)
            cfg.rollout.base_url = spec.base_url
        engine = make_engine(cfg, search=search, home=home)
    servers += watch_dependencies(cfg, servers)
    load_judges()  # judge.backend=world | random: registered by ARBOR's package
    judge = make_judge(cfg.judge, home=home, config=cfg)
    if cfg.run.stream_judging:  # issue 19: a group's judge work starts once its rollouts end
        from arbor.llm.stream import StreamedJudge

        judge = StreamedJudge(judge)
    state = RunState(cfg=cfg, run_id=run_id, home=home, store=store, questions=questions, engine=engine,
                     trainer=trainer, judge=judge, embed=_lazy_embedder(cfg.memory.embedder),
                     servers=servers, method=method,
                     guide=make_guide(cfg, judge, home=home))  # guidance.mode=co-react: guided training rollouts
    try:
        restore_policy(state)
    except BaseException:
        state.close()
        raise
    # The run's long-lived objects (corpus, search index, tokenizer, models, Prefect: ~0.9M) leave the collector's
    # generations: a full collection walked them all, a 1.5-2 s stall after each rollout (bench/pipeline.py, issue
    # 19). RunState.close gives them back.
    gc.collect()
    gc.freeze()
    return state


def data_line(d: DataConfig, eval_every: int | None, n_train: int) -> str:
    """The run's start line naming its question sets and how many training questions it samples from (issue 56: a
    paper profile trained on the 129 shipped questions, 2,000 asked of them, and no line said so). ``n_train``: the
    questions loaded (``data.train_size`` caps them; a larger size takes the whole set, and the line says so)."""
    every = eval_every
    sample = ""
    if d.train_size is not None and d.train_size > n_train:  # never silent (issue 56: 2,000 asked, 129 given)
        sample = f"; data.train_size={d.train_size} asks for more than it holds: all {n_train} are used"
    elif d.train_size is not None:
        sample = f", a seeded sample of data.train_size={d.train_size}"
    when = f"every {every} steps" if every else "by `arbor eval` (no in-run evaluation: run.eval_every unset)"
    return (f"data: trains on {d.train} ({n_train} questions{sample}); evaluates on {', '.join(d.eval_sets())} "
            f"{when}")


def dependency_endpoints(cfg: ArborConfig, *, council: bool = False,
                         rollout_served: bool = False) -> list[tuple[str, str]]:
    """(name, URL) of every server the run talks to and did not start (issue 60 item 2), each URL once under the
    first name that claims it: the judge (``judge.base_url``), every role with an endpoint of its own
    (``judge.roles.<role>.base_url``), with ``council`` Co-ReAct's ranking judges (``guidance.rank_judges``), the
    search service (``search.url``), the rollout server (unless the flow serves it: ``rollout_served``). A judge
    left at the client's default endpoint (no base_url) is the vendor's, left to the client."""
    from arbor.config.judge import JudgeRoles

    out: dict[str, str] = {}

    def add(name: str, url: object) -> None:
        if url and str(url) not in out:
            out[str(url)] = name

    j = cfg.judge
    if j.backend == "openai":
        add("the judge server", j.base_url)
        for role in JudgeRoles.model_fields:
            add(f"the judge of role {role!r}", getattr(j.roles, role).base_url)
        if council:
            from arbor.tasks.methods.coreact.council import rank_judge_config, rank_judge_names

            for name, entry in zip(rank_judge_names(cfg.guidance, j), cfg.guidance.rank_judges, strict=True):
                add(f"the ranking judge {name!r}", rank_judge_config(j, entry).for_role("rank_actions")["base_url"])
    if cfg.search.backend in ("http", "web"):
        add("the search server", cfg.search.url)
    if cfg.rollout.engine == "openai" and not rollout_served:
        add("the rollout server", cfg.rollout.base_url)
    return [(name, url) for url, name in out.items()]


def watch_dependencies(cfg: ArborConfig, servers: list[Any], *, council: bool = False,
                       on_death: Callable[[str], None] | None = None) -> list[Any]:
    """Under a command on the stop path, a server the run relies on that dies ends the run naming it (issue 49):
    the `vllm serve` the flow started, by its process; every other endpoint (``dependency_endpoints``) by its
    port (``arbor.liveness``), one on another machine asked less often and given longer (a network blip is not a
    dead server). ``on_death``: what a death calls (default: ``stop.request``, only when the stop path is
    installed). Returns the port watches (stopped with the run's servers)."""
    from arbor import stop

    if on_death is None:
        if not stop.installed():
            return []
        on_death = stop.request
    from arbor.liveness import DEAD_AFTER_S, is_local, watch_endpoint

    for server in servers:
        server.watch("vLLM's server", on_death)
    slow = {"every_s": 1.0, "dead_after_s": 5 * DEAD_AFTER_S}
    return [watch_endpoint(name, url, on_death, **({} if is_local(url) else slow))
            for name, url in dependency_endpoints(cfg, council=council, rollout_served=bool(servers))]


def make_trainer(cfg: ArborConfig, start: Path, home: Path, loss: LossSettings) -> Any:
    """In-process DeepSpeed on CPU; under DeepSpeed's launcher (a supervised process group) on GPUs or when
    ``train.service`` is set — the flow drives it step by step through ``tasks.training.trainer_service``'s channel. Either
    way it is a pure update worker: ``loss`` is the method's clip and KL term, each step's update is sent to it."""
    if cfg.train.num_gpus > 0 or cfg.train.hostfile or cfg.train.service:
        from arbor.tasks.training.trainer_service import RemoteTrainer

        return RemoteTrainer(cfg, start, home, loss)
    from arbor.tasks.training.train import Trainer

    return Trainer(cfg, start, home, loss)


def _lazy_embedder(name: str) -> Any:
    """Load sentence-transformers only when a consolidation actually needs it."""
    fn: list[Any] = []

    def embed(texts: list[str]) -> Any:
        if not fn:
            from arbor.tasks.env.embed import make_embedder

            fn.append(make_embedder(name))
        return fn[0](texts)

    return embed


def restore_policy(state: RunState) -> None:
    """Load the latest complete checkpoint, then replay every later stored training stage (issue 6 item 3).

    Under ``run.overlap=one-step`` the rollout engine must hold the policy its next rollout was scheduled with,
    two versions behind: it is synced when the replay passes that version, and no checkpoint is written past it
    (so a later resume can still reach it)."""
    last = state.trainer.load_latest() or 0
    engine_at = lagged_engine_version(state)
    if engine_at is not None and engine_at < last:
        raise RuntimeError(f"run {state.run_id}: checkpoint {last} is newer than policy {engine_at}, which the next "
                           "overlapped rollout needs (run.overlap=one-step)")
    step = last + 1
    synced = False
    while state.store.done(step, "train"):
        if engine_at == step - 1 and not synced:
            state.sync_weights()
            synced = True
        state.trainer.train_step(state.update_batch(step), step)
        if engine_at is None or step <= engine_at:
            state.trainer.maybe_save(step)
        step += 1
    if not synced:
        state.sync_weights()


def lagged_engine_version(state: RunState) -> int | None:
    """The policy version the next rollout to run needs under ``run.overlap=one-step`` (None: the trainer's own,
    the on-policy schedule, or every rollout of the run is stored): rollout R runs while step R-1 trains, with the
    policy of step R-2."""
    if state.cfg.run.overlap != "one-step":
        return None
    r = 1
    while state.store.done(r, "rollout"):
        r += 1
    return max(r - 2, 0) if r <= state.cfg.run.steps else None


def end_status(e: BaseException) -> str:
    """How a run that raised ``e`` ended: ``stopped`` when it was asked to stop (a signal), else ``failed`` (a
    dependency found dead included)."""
    from prefect.exceptions import TerminationSignal

    from arbor.stop import RunStopped

    if isinstance(e, RunStopped):
        return "stopped" if e.signalled else "failed"
    return "stopped" if isinstance(e, KeyboardInterrupt | TerminationSignal) else "failed"


@contextmanager
def recorded_run(cfg: ArborConfig, rid: str, home: Path, *, council: bool = False) -> Iterator[StageStore]:
    """The life of a run that is not ``arbor train``'s (``arbor eval``, ``arbor guidance-train``), recorded as
    ``arbor_train`` records its own (issue 60 item 3): ``running``, then ``completed``, ``stopped`` (a signal) or
    ``failed`` in its ``stage_runs`` row, also when the stop's bound forces the exit; owned by this process (its
    heartbeat); its endpoints watched (``watch_dependencies``). Its ``runs`` row must exist."""
    from arbor import stop

    store = StageStore(rid, home)
    started = time.time()
    store.record(0, "run", "running", started, None)
    forget = stop.on_hard_stop(lambda s: store.record(0, "run", end_status(s), started, time.time()))
    heartbeat = Heartbeat(rid, home).start()
    watches = watch_dependencies(cfg, [], council=council)
    try:
        yield store
    except BaseException as e:
        store.record(0, "run", end_status(e), started, time.time())
        raise
    finally:
        forget()
        heartbeat.stop()
        for w in watches:
            w.stop()
    store.record(0, "run", "completed", started, time.time())


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
    if run.progress is not None:
        run.progress.stage_started(step, stage.name)
    judged = lambda: run.check_judge(step, stage.name, compute())  # noqa: E731 - a judge that answered nothing: no commit
    run.store.run(step, stage.name, stage.tables, timed_stage(run, step, stage.name, judged))
    return StageRef(run.run_id, step, stage.name, stage.tables)


def retry_unless_judge_down(_task: Any, _task_run: Any, state: State) -> bool:
    """A stage's retries (``Stage.retries``) are not spent on a judge that answered nothing (issue 62) or a server
    that stalled (issue 60): the same calls would wait out the same timeouts again before the run ends."""
    from arbor.liveness import DependencyStalled
    from arbor.llm.health import JudgeUnreachable

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

    ``run.overlap=one-step`` (issue 19): step N+1's rollout is submitted to the task runner when step N's judging
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
    if every and step % every == 0:
        call_stage(EVAL, run, step)
    metrics = _rows(run, ref, "steps")[0]
    publish_step(run, step, metrics)
    return metrics


def publish_step(state: RunState, step: int, metrics: dict[str, Any]) -> None:
    """Prefect artifacts per step: the rubric events and pool, and the step metrics (issue 7 item 1)."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    from arbor.tasks.step import read_stage_rows

    events = read_stage_rows(state, step, "rubric_events")
    lines = ["| seq | event | rubric | title | variance | pearson | n_r | rho_r | reason |", "|---|---|---|---|---|---|---|---|---|"]
    for e in sorted(events, key=lambda e: e["seq"]):
        lines.append("| {seq} | {event} | {rubric_id} | {title} | {variance} | {pearson} | {n_r} | {rho_r} | {reason} |".format(
            **{k: ("" if v is None else (f"{v:.3f}" if isinstance(v, float) else v)) for k, v in e.items()}))
    pool = state.method.summary().get("pool")
    key = f"{state.run_id}-step-{step}".lower().replace("_", "-").replace(".", "-")
    try:
        create_markdown_artifact(key=f"rubrics-{key}", markdown=f"## Step {step} rubric events\n\n"
                                 + "\n".join(lines) + (f"\n\n**Common pool:** {pool}\n" if pool else "\n"))
        row = {k: (v if isinstance(v, int | float | str) or v is None else str(v)) for k, v in metrics.items()}
        create_table_artifact(key=f"metrics-{key}", table=[row])
    except Exception as e:  # noqa: BLE001 - artifacts are a view; never fail a step for them
        get_run_logger().warning("could not publish artifacts for step %s: %s", step, e)


def report_judge_health(state: RunState, step: int, metrics: dict[str, Any], logger: Any) -> None:
    """The step's judge-health lines under its summary whenever a judge call failed or was refused, and a WARNING
    for each role whose answers were mostly refused (issue 62; ``tasks.reporting.judge_health``)."""
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
    ~2 s (bench/pipeline.py, issue 19)."""
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
                resume: bool = False) -> str | State:
    """Run (or resume) a training run; returns its run id, or a Failed state naming what refused it (a bad key
    or value, a missing resource) before anything of the run was written."""
    from arbor.quiet import quiet

    quiet()  # a worker's flow run has no CLI to do it
    from arbor import stop
    from arbor.config import ConfigError
    from arbor.preflight import PreflightError
    from arbor.storage.schemas import SchemaError

    stop.rearm()  # under `arbor train`: SIGTERM takes arbor's stop path, not the handler Prefect set for the flow
    from arbor.storage.catalog import ensure_catalog
    from arbor.tasks.reporting.tracking import Tracker, grouped_metrics
    from arbor.tasks.step import sample_rows, tracked_metrics

    home = arbor_home()
    ensure_catalog(home)  # create / migrate once, up front; the run never holds the catalog open
    locks = ExitStack()  # one writer per run (storage.lock): before a known id is read, and for the whole run
    if run_id is not None:
        locks.enter_context(run_lock(run_id, home))
    try:
        cfg = prepare_run(profile, overrides, run_id, resume, home)
    except (ConfigError, PreflightError, SchemaError) as e:
        # refused before anything of the run was written: the flow run ends Failed with the reason as its one
        # line (a deployment run has no CLI to print it; a traceback would bury it)
        locks.close()
        return Failed(message=f"{type(e).__name__}: {e}")
    except BaseException:
        locks.close()
        raise
    rid = cfg.run.run_id or ""
    stop.set_run(rid)
    locks.enter_context(run_lock(rid, home))
    store = StageStore(rid, home)
    started = time.time()
    store.record(0, "run", "running", started, None)
    # if the stop's bound forces the exit before the flow unwinds, the run is still recorded as stopped
    forget = stop.on_hard_stop(lambda s: store.record(0, "run", end_status(s), started, time.time()))
    heartbeat = Heartbeat(rid, home).start()  # host, pid, heartbeat: `arbor runs` tells running from crashed
    logger = get_run_logger()
    try:
        tag_flow_run(f"profile:{cfg.run.profile}", f"method:{cfg.run.method}")
        with open_run(cfg, home) as run, RunProgress(cfg.run.steps) as progress, \
                Tracker(rid, home, tracking=cfg.tracking, config=cfg.model_dump(mode="json")) as tracker:
            run.progress, run.on_progress = progress, progress.calls
            if cfg.run.eval_every and cfg.run.eval_at_start:  # the start point of every learning curve
                call_stage(EVAL, run, 0)
                tracker.log(0, tracked_metrics(run, 0))
            for step in range(1, cfg.run.steps + 1):
                stop.raise_pending()  # a stop whose raise was lost (arbor/stop.py) ends the run here
                t0 = time.perf_counter()
                m = run_step(run, step)
                progress.step_done()
                tracker.log(step, {**grouped_metrics(m), **tracked_metrics(run, step)})
                report_judge_health(run, step, m, logger)
                tracker.log_samples(step, sample_rows(run, step, cfg.tracking.samples_per_step))
                pool = run.method.summary().get("rubric/pool_size")
                if "console" not in cfg.tracking.loggers:  # the console tracker prints the step's summary itself
                    logger.info(
                        "step %d/%d: base %.3f total %.3f valid %.2f zero-var %.2f -> %.2f%s (%.1f s)", step,
                        cfg.run.steps, m["mean_base_reward"], m["mean_total_reward"], m["format_valid_rate"],
                        m["zero_var_base"], m["zero_var_total"], "" if pool is None else f", pool {pool:.0f}",
                        time.perf_counter() - t0,
                    )
            stop.raise_pending()
        stop.raise_pending()  # and one lost while the run closed (the final save, the servers)
    except BaseException as e:
        store.record(0, "run", end_status(e), started, time.time())
        locks.close()
        raise
    finally:
        forget()
        heartbeat.stop()
    store.record(0, "run", "completed", started, time.time())
    locks.close()
    return rid


__all__ = ["arbor_train", "run_step", "prepare_run", "open_run"]

if __name__ == "__main__":  # pragma: no cover
    arbor_train(profile=os.environ.get("ARBOR_PROFILE", "tiny-cpu"))
