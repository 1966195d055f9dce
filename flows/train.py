"""``arbor-train``: the ARBOR RL loop as a Prefect flow (DESIGN §1, paper §3 and App. B.2).

Each step runs the stages of ``tasks.step`` as Prefect tasks; every stage's output is a stored artifact keyed by
(run_id, step, stage), so running the flow again with the same run id (``arbor train --resume RUN_ID`` or the
deployment with ``run_id`` set) loads completed stages instead of redoing them, rebuilds the rubric memory from
its events, restarts the policy from its latest checkpoint and replays the training stages stored after it.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from arbor.config import ArborConfig, load_config
from arbor.paths import arbor_home, resolve_home_path
from flows.progress import RunProgress
from storage.liveness import Heartbeat
from tasks.stages import StageStore
from tasks.step import STAGES, RunState, rebuild_memory, timed_stage, trajectories_from_rows


def new_run_id(profile: str) -> str:
    """A fresh run id: profile, local time to the second and 16 random bits (``tiny-cpu-20260101-120000-1a2b``)."""
    return f"{profile}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def stored_config(run_id: str, home: Path) -> ArborConfig | None:
    """The config a run was started with, with the changes applied on resume since (``runs.config_changes``)."""
    from storage.runs import run_row

    row = run_row(run_id, home)
    return ArborConfig.model_validate_json(row["config_json"]) if row else None


def prepare_run(profile: str, overrides: dict[str, Any] | list[str] | None, run_id: str | None,
                resume: bool, home: Path) -> ArborConfig:
    """Resolve the config. A known run id continues that run from its stored config: overrides of the keys that
    are safe on resume (``arbor.config.resume``) are applied and recorded, any other change is refused by name
    (``ConfigError``). ``resume`` with an unknown id is refused; a new run's config is written."""
    from arbor.config.resume import amend_config
    from storage.parquet import write_stage
    from storage.runs import record_config_changes

    if run_id is not None:
        stored = stored_config(run_id, home)
        if stored is not None:
            cfg, changes = amend_config(stored, overrides)
            if changes:
                record_config_changes(run_id, cfg.to_json(), changes, home)
                print(f"run {run_id} resumed with " + ", ".join(  # logged by the flow (log_prints)
                    f"{k}: {old!r} -> {new!r}" for k, (old, new) in sorted(changes.items())))
            return cfg
        if resume:
            raise ValueError(f"cannot resume run '{run_id}': no such run in {home}")
    cfg = load_config(profile, overrides)
    rid = run_id or cfg.run.run_id or new_run_id(cfg.run.profile)
    cfg.run.run_id = rid
    write_stage("runs", [{
        "run_id": rid, "profile": cfg.run.profile, "method": cfg.run.method, "seed": cfg.run.seed,
        "config_json": cfg.to_json(), "created_at": time.time(), "git_sha": _git_sha(),
    }], run_id=rid, step=0, stage="run", home=home)
    return cfg


def _git_sha() -> str | None:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def start_checkpoint(cfg: ArborConfig, home: Path) -> Path:
    """The RL start point: an explicit checkpoint, an SFT warm start (cached), or the base policy."""
    if cfg.run.start_checkpoint and (resolve_home_path(cfg.run.start_checkpoint) / "config.json").exists():
        return resolve_home_path(cfg.run.start_checkpoint)
    if cfg.run.sft_warm_start:
        from flows.sft import sft_checkpoint

        return sft_checkpoint(cfg, home)
    from tasks.policy import policy_source

    return Path(policy_source(cfg.policy, home))


def open_run(cfg: ArborConfig, home: Path) -> RunState:
    """Build engines, judge and trainer; restore the policy and the rubric memory from stored artifacts."""
    from arbor.preflight import require
    from llm import make_judge
    from tasks.datasets import load_questions
    from tasks.policy import load_policy
    from tasks.rollout import make_engine
    from tasks.search import make_search

    require(cfg)
    run_id = cfg.run.run_id
    assert run_id is not None
    store = StageStore(run_id, home)
    questions = load_questions(cfg.data.train, size=cfg.data.train_size, seed=cfg.run.seed, world=cfg.world)
    search = make_search(cfg.search, home=home, world=cfg.world)
    start = start_checkpoint(cfg, home)
    trainer = make_trainer(cfg, start, home, run_id)
    if cfg.rollout.engine == "transformers":
        policy, tokenizer = load_policy(start, cfg.policy.dtype, home=home)
        engine = make_engine(cfg, policy, tokenizer, search=search, home=home)
    else:
        if cfg.cluster.manage_vllm:  # GPU layout: `vllm serve` on cluster.rollout_gpus, supervised by the flow
            from tasks.serving import Supervised, vllm_serve_spec

            spec = vllm_serve_spec(cfg, str(start))
            server = Supervised(spec, startup_timeout_s=cfg.cluster.startup_timeout_s,
                                log_path=str(home / f"vllm-{run_id}.log"))
            server.start()
            _SERVERS[run_id] = server
            cfg.rollout.base_url = spec.base_url
        engine = make_engine(cfg, search=search, home=home)
    judge = make_judge(cfg.judge, home=home)
    memory = rebuild_memory(cfg, store, cfg.run.steps)
    state = RunState(cfg=cfg, run_id=run_id, home=home, store=store, questions=questions, engine=engine,
                     trainer=trainer, judge=judge, memory=memory, embed=_lazy_embedder(cfg.memory.embedder))
    restore_policy(state)
    return state


_SERVERS: dict[str, Any] = {}


def make_trainer(cfg: ArborConfig, start: Path, home: Path, run_id: str) -> Any:
    """In-process DeepSpeed on CPU; under DeepSpeed's launcher (a supervised process group) on GPUs or when
    ``train.service`` is set — the flow drives it step by step through ``tasks.trainer_service``'s channel."""
    if cfg.train.num_gpus > 0 or cfg.train.hostfile or cfg.train.service:
        from storage.parquet import stage_path
        from tasks.trainer_service import RemoteTrainer

        def batch_path(step: int) -> Path:
            return Path(stage_path("trajectories", run_id=run_id, step=step, stage="shape", home=home))

        return RemoteTrainer(cfg, start, home, batch_path)
    from tasks.train import Trainer

    return Trainer(cfg, start, home)


def _lazy_embedder(name: str) -> Any:
    """Load sentence-transformers only when a consolidation actually needs it."""
    fn: list[Any] = []

    def embed(texts: list[str]) -> Any:
        if not fn:
            from tasks.embed import make_embedder

            fn.append(make_embedder(name))
        return fn[0](texts)

    return embed


def restore_policy(state: RunState) -> None:
    """Load the latest complete checkpoint, then replay every later stored training stage (issue 6 item 3)."""
    last = state.trainer.load_latest() or 0
    step = last + 1
    while state.store.done(step, "train"):
        trajs = trajectories_from_rows(state.store.load(step, "shape", ("trajectories",))["trajectories"])
        state.trainer.train_step(trajs, step)
        state.trainer.maybe_save(step)
        step += 1
    state.sync_weights()


# ------------------------------------------------------------------------------------------------ tasks
# Tasks take (run_id, step) only: their inputs are the stored artifacts of earlier stages, so Prefect never walks
# large objects, and a task reads exactly what a resumed run would read.
_RUNS: dict[str, RunState] = {}


_PROGRESS: dict[str, Any] = {}


def _stage(run_id: str, step: int, stage: str, tables: tuple[str, ...], compute: Any) -> dict[str, Any]:
    state = _RUNS[run_id]
    if run_id in _PROGRESS:
        _PROGRESS[run_id].stage_started(step, stage)
    out, _resumed = state.store.run(step, stage, tables, timed_stage(state, stage, lambda: compute(state)))
    return out


def _trajs(state: RunState, step: int, stage: str, table: str) -> list[Any]:
    return trajectories_from_rows(state.store.load(step, stage, (table,))[table])


@task(name="rollout", retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE)
def rollout_task(run_id: str, step: int) -> None:
    _stage(run_id, step, "rollout", ("rollouts",), lambda s: s.rollout(step))


@task(name="score", cache_policy=NO_CACHE)
def score_task(run_id: str, step: int) -> None:
    _stage(run_id, step, "score", ("rubric_events", "rubric_activations", "judge_calls"),
           lambda s: s.score(step, _trajs(s, step, "rollout", "rollouts")))


@task(name="induce", cache_policy=NO_CACHE)
def induce_task(run_id: str, step: int) -> None:
    _stage(run_id, step, "induce", ("rubric_events", "judge_calls", "draft_scores"),
           lambda s: s.induce(step, _trajs(s, step, "rollout", "rollouts")))


@task(name="shape", cache_policy=NO_CACHE)
def shape_task(run_id: str, step: int) -> None:
    def compute(s: RunState) -> dict[str, Any]:
        acts = s.store.load(step, "score", ("rubric_activations",))["rubric_activations"]
        drafts = s.store.load(step, "induce", ("draft_scores",))["draft_scores"]
        return s.shape(step, _trajs(s, step, "rollout", "rollouts"), acts, drafts)

    _stage(run_id, step, "shape", ("trajectories", "judge_calls", "draft_scores"), compute)


@task(name="consolidate", cache_policy=NO_CACHE)
def consolidate_task(run_id: str, step: int) -> None:
    _stage(run_id, step, "consolidate", ("rubric_events", "rubric_sources", "judge_calls"),
           lambda s: s.consolidate(step))


@task(name="retire", cache_policy=NO_CACHE)
def retire_task(run_id: str, step: int) -> None:
    _stage(run_id, step, "retire", ("rubric_events",), lambda s: s.retire(step))


@task(name="train", cache_policy=NO_CACHE)
def train_task(run_id: str, step: int) -> dict[str, Any]:
    state = _RUNS[run_id]
    resumed = state.store.done(step, "train")  # then restore_policy already replayed it
    out = _stage(run_id, step, "train", ("steps",),
                 lambda s: s.train(step, _trajs(s, step, "shape", "trajectories")))
    if not resumed:
        state.after_train(step)
    return out["steps"][0]


@task(name="eval", cache_policy=NO_CACHE)
def eval_task(run_id: str, step: int) -> None:
    _stage(run_id, step, "eval", ("eval_results", "judge_calls"), lambda s: s.evaluate(step))


def run_step(state: RunState, step: int) -> dict[str, Any]:
    """One RL step: the stages of ``tasks.step.STAGES`` in order, each loaded if already complete."""
    _RUNS[state.run_id] = state
    state.stage_seconds = {}
    rid = state.run_id
    rollout_task(rid, step)
    score_task(rid, step)
    retire_task(rid, step)
    induce_task(rid, step)
    shape_task(rid, step)
    consolidate_task(rid, step)
    metrics = train_task(rid, step)
    every = state.cfg.run.eval_every
    if every and step % every == 0:
        eval_task(rid, step)
    publish_step(state, step, metrics)
    return metrics


def publish_step(state: RunState, step: int, metrics: dict[str, Any]) -> None:
    """Prefect artifacts per step: the rubric events and pool, and the step metrics (issue 7 item 1)."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    from tasks.step import read_stage_rows

    events = read_stage_rows(state, step, "rubric_events")
    lines = ["| seq | event | rubric | title | variance | pearson | n_r | rho_r | reason |", "|---|---|---|---|---|---|---|---|---|"]
    for e in sorted(events, key=lambda e: e["seq"]):
        lines.append("| {seq} | {event} | {rubric_id} | {title} | {variance} | {pearson} | {n_r} | {rho_r} | {reason} |".format(
            **{k: ("" if v is None else (f"{v:.3f}" if isinstance(v, float) else v)) for k, v in e.items()}))
    pool = ", ".join(f"{r.rubric_id} {r.title}" for r in state.memory.pool) or "(empty)"
    key = f"{state.run_id}-step-{step}".lower().replace("_", "-").replace(".", "-")
    try:
        create_markdown_artifact(key=f"rubrics-{key}", markdown=f"## Step {step} rubric events\n\n"
                                 + "\n".join(lines) + f"\n\n**Common pool:** {pool}\n")
        row = {k: (v if isinstance(v, int | float | str) or v is None else str(v)) for k, v in metrics.items()}
        create_table_artifact(key=f"metrics-{key}", table=[row])
    except Exception as e:  # noqa: BLE001 - artifacts are a view; never fail a step for them
        get_run_logger().warning("could not publish artifacts for step %s: %s", step, e)


@flow(name="arbor-train", log_prints=True)
def arbor_train(profile: str = "tiny-cpu", overrides: dict[str, Any] | None = None, run_id: str | None = None,
                resume: bool = False) -> str:
    """Run (or resume) an ARBOR training run; returns its run id."""
    from storage.catalog import ensure_catalog
    from tasks.tracking import Tracker

    home = arbor_home()
    ensure_catalog(home)  # create / migrate once, up front; the run never holds the catalog open
    cfg = prepare_run(profile, overrides, run_id, resume, home)
    rid = cfg.run.run_id or ""
    store = StageStore(rid, home)
    started = time.time()
    store.record(0, "run", "running", started, None)
    heartbeat = Heartbeat(rid, home).start()  # host, pid, heartbeat: `arbor runs` tells running from crashed
    logger = get_run_logger()
    try:
        state = open_run(cfg, home)
        with Tracker(rid, home, config=cfg.model_dump(mode="json"), resume_step=None) as tracker, \
                RunProgress(cfg.run.steps) as progress:
            _PROGRESS[rid] = progress
            state.on_progress = progress.calls
            if cfg.run.eval_every and cfg.run.eval_at_start:  # the start point of every learning curve
                _RUNS[rid] = state
                eval_task(rid, 0)
            for step in range(1, cfg.run.steps + 1):
                t0 = time.perf_counter()
                m = run_step(state, step)
                progress.step_done()
                tracker.log(step, {k: v for k, v in m.items() if isinstance(v, int | float) and k != "step"})
                logger.info(
                    "step %d/%d: base %.3f total %.3f valid %.2f zero-var %.2f -> %.2f, pool %d (%.1f s)", step,
                    cfg.run.steps, m["mean_base_reward"], m["mean_total_reward"], m["format_valid_rate"],
                    m["zero_var_base"], m["zero_var_total"], len(state.memory.pool), time.perf_counter() - t0,
                )
    except BaseException:
        store.record(0, "run", "failed", started, time.time())
        raise
    finally:
        heartbeat.stop()
        _PROGRESS.pop(rid, None)
        state_ = _RUNS.pop(rid, None)
        if state_ is not None and hasattr(state_.trainer, "close"):
            state_.trainer.close()
        if rid in _SERVERS:
            _SERVERS.pop(rid).stop()
    store.record(0, "run", "completed", started, time.time())
    return rid


__all__ = ["arbor_train", "run_step", "prepare_run", "open_run", "STAGES"]

if __name__ == "__main__":  # pragma: no cover
    arbor_train(profile=os.environ.get("ARBOR_PROFILE", "tiny-cpu"))
