"""A training run's set-up (``arbor-train``, ``arbor-guidance-train``): its config resolved and recorded, its start
point, the engines, judge, method and trainer it holds, and its policy restored from the stored artifacts."""

from __future__ import annotations

import gc
import secrets
import time
from pathlib import Path
from typing import Any

from arbor.config import ArborConfig, ConfigError, load_config
from arbor.config.data import DataConfig
from arbor.config.inputs import workspace_inputs
from arbor.config.train import CheckpointConfig
from arbor.flows.run_life import watch_dependencies
from arbor.paths import resolve_home_path
from arbor.tasks.methods import make_method
from arbor.tasks.stage_store import StageStore
from arbor.tasks.step import RunState
from arbor.types import LossSettings


def new_run_id(profile: str) -> str:
    """A fresh run id. Inside a Prefect flow run: the profile and the flow run's id (``tiny-cpu-3f2a9c1b``), so a
    retry of that flow run resumes the same arbor run; elsewhere the local time and 16 random bits."""
    from prefect.runtime import flow_run

    fid = flow_run.id
    if fid:
        return f"{profile}-{str(fid).replace('-', '')[:8]}"
    return f"{profile}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def stored_config(run_id: str, home: Path) -> ArborConfig | None:
    """The config a run was started with, with the changes applied on resume since (``runs.config_changes``)."""
    from arbor.storage.runs import run_row

    row = run_row(run_id, home)
    return ArborConfig.model_validate_json(row["config_json"]) if row else None


def redo_stages(method: str, checkpoint: CheckpointConfig, run_id: str, spec: str, home: Path) -> tuple[int, list[int]]:
    """``STEP:STAGE`` (``arbor train --redo``, the flow's ``redo``): discard that stage of the stored run, the stages
    after it and the checkpoints from that step on, so the resume computes them again (the judge's cache answers
    what was already paid for): (stages discarded, checkpoint steps discarded). A bad spec raises ConfigError."""
    from arbor.storage.parquet import discard_from
    from arbor.tasks.methods import resolve_method
    from arbor.tasks.training.checkpoint import discard_from as discard_checkpoints
    from arbor.tasks.training.checkpoint import run_checkpoint_root

    step_text, _, stage = spec.partition(":")
    if not step_text.isdigit() or not stage:
        raise ConfigError(f"redo {spec}: expected STEP:STAGE, e.g. 3:shape")
    try:
        gone = discard_from(run_id, int(step_text), stage, resolve_method(method).stage_names(), home)
    except ValueError as e:
        raise ConfigError(f"redo {spec}: {e}") from e
    return len(gone), discard_checkpoints(run_checkpoint_root(checkpoint, run_id, home), int(step_text))


def prepare_run(profile: str, overrides: dict[str, Any] | list[str] | None, run_id: str | None,
                resume: bool, home: Path, redo: str | None = None) -> ArborConfig:
    """Resolve the config. The run is taken through ``storage.runs.claim_run`` whichever way its id comes (``run_id``,
    a ``run.run_id`` override, the profile's, or a fresh one) and stays locked by this process (the caller gives it
    back: ``storage.lock.release``). A known run id continues that run from its stored config: overrides of the keys
    that are safe on resume (``arbor.config.resume``) are applied and recorded, any other change is refused by name
    (``ConfigError``). ``resume`` with an unknown id is refused; a new run's config is written. A refusal writes
    nothing and gives the lock back."""
    from arbor.config.resume import amend_config
    from arbor.config.show import config_sources, read_sources, write_run_config
    from arbor.preflight import require
    from arbor.storage.lock import release
    from arbor.storage.parquet import write_stage
    from arbor.storage.runs import RunRefused, claim_run, one_run_id, record_config_changes

    fresh = load_config(profile, overrides) if run_id is None else None  # the config names the run, if anything
    rid = run_id or (fresh.run.run_id if fresh is not None else None)
    if rid is None and resume:
        raise RunRefused("resume names no run: give its run_id")
    rid = rid or new_run_id(fresh.run.profile if fresh is not None else profile)
    row = claim_run(rid, home, exists=True if resume else None)
    try:
        if redo is not None and row is None:
            raise ConfigError(f"redo {redo}: run {rid!r} is not stored (redo recomputes stages of a stored run)")
        if row is not None:
            if fresh is not None:  # the flow run again (a Retry): its overrides as the first attempt stored them
                overrides = resolved_overrides(overrides, fresh)
            cfg, changes = amend_config(ArborConfig.model_validate_json(row["config_json"]), overrides)
            require(cfg)  # what the run needs is here, before its record changes
            if redo is not None:
                stages, ckpts = redo_stages(cfg.run.method, cfg.checkpoint, rid, redo, home)
                print(f"redo {redo}: discarded {stages} stored stages of run {rid} and checkpoints of steps {ckpts}")
            if changes:
                record_config_changes(rid, cfg.to_json(), changes, home)
                path = run_config_path(rid, home)
                write_run_config(path, cfg, {**read_sources(path), **{k: "override (resume)" for k in changes}})
                print(f"run {rid} resumed with " + ", ".join(  # logged by the flow (log_prints)
                    f"{k}: {old!r} -> {new!r}" for k, (old, new) in sorted(changes.items())))
            return cfg
        cfg = fresh or load_config(profile, overrides)
        one_run_id("run_id", rid, cfg.run.run_id)  # a new run named twice (run_id, run.run_id): the same run
        workspace_inputs(cfg)  # relative input paths: the current directory's, else ARBOR_HOME's
        require(cfg)  # a run that cannot start leaves nothing behind (a deployment run on the wrong machine)
        cfg.run.run_id = rid
        write_stage("runs", [{
            "run_id": rid, "profile": cfg.run.profile, "method": cfg.run.method, "seed": cfg.run.seed,
            "config_json": cfg.to_json(), "created_at": time.time(), "git_sha": _git_sha(),
            "train_set": cfg.data.train, "eval_sets": cfg.data.eval_sets(),
        }], run_id=rid, step=0, stage="run", home=home)
        write_run_config(run_config_path(rid, home), cfg, config_sources(profile, _as_mapping(overrides)))
        return cfg
    except BaseException:
        release(rid, home)
        raise


def run_config_path(run_id: str, home: Path) -> Path:
    """The run's resolved config with each value's source, beside its artifacts (``arbor config show``'s text)."""
    return home / "runs" / run_id / "config.yaml"


def resolved_overrides(overrides: dict[str, Any] | list[str] | None, fresh: ArborConfig) -> dict[str, Any]:
    """``overrides`` with each value read back from ``fresh`` after ``workspace_inputs`` (a relative input path made
    absolute, as a new run stores it), so the same overrides given again compare equal to the stored run's."""
    workspace_inputs(fresh)
    out: dict[str, Any] = {}
    for key, value in _as_mapping(overrides).items():
        node: Any = fresh
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else getattr(node, part, None)
            if node is None:
                break
        out[key] = value if node is None or not isinstance(node, str | int | float | bool) else node
    return out


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
        from arbor.preflight import PreflightError
        from arbor.preflight.inputs import start_protocol_problem

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
    from arbor.preflight.serving import weight_sync_plan
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
    if cfg.run.stream_judging:  # a group's judge work starts once its rollouts end
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
    """The run's start line naming its question sets and how many training questions it samples from (a
    paper profile trained on the 129 shipped questions, 2,000 asked of them, and no line said so). ``n_train``: the
    questions loaded (``data.train_size`` caps them; a larger size takes the whole set, and the line says so)."""
    every = eval_every
    sample = ""
    if d.train_size is not None and d.train_size > n_train:  # never silent (2,000 asked, 129 given)
        sample = f"; data.train_size={d.train_size} asks for more than it holds: all {n_train} are used"
    elif d.train_size is not None:
        sample = f", a seeded sample of data.train_size={d.train_size}"
    when = f"every {every} steps" if every else "by `arbor eval` (no in-run evaluation: run.eval_every unset)"
    return (f"data: trains on {d.train} ({n_train} questions{sample}); evaluates on {', '.join(d.eval_sets())} "
            f"{when}")


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
    """Load the latest complete checkpoint, then replay every later stored training stage.

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
