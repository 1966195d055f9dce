"""The commands that run flows: ``train``, ``guidance-train``, ``demo``, ``eval`` and ``compare``. Each checks its
whole input before it imports the flow machinery, then runs on the stop path (``arbor.cli.stop_path``)."""

from __future__ import annotations

import re
import shlex
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from arbor.cli.common import _fail, _me, _overrides
from arbor.cli.stop_path import _cause, _on_stop_path, _stop_line, _why
from arbor.cli.store import _final_policy


def _train_config(profile: str | None, run_id: str | None, resume: str | None, overrides: dict[str, str],
                  redo: str | None, home: Path) -> tuple[Any, str | None]:
    """The config ``arbor train`` will run with and the run it names (None: the flow makes a fresh id), every input
    checked and ``--redo`` applied (raises ConfigError / PreflightError / SchemaError). A named run, whichever way
    it is named (``--run-id``, ``--resume``, ``--set run.run_id``, the profile), is taken through
    ``storage.runs.claim_run``: one writer, held until this process ends; a refusal gives it back."""
    from arbor.config import ArborConfig, ConfigError, load_config, profile_path
    from arbor.config.resume import amend_config
    from arbor.preflight import require
    from arbor.storage.heartbeat import owner_alive, read_owner
    from arbor.storage.lock import release
    from arbor.storage.runs import claim_run, one_run_id

    if run_id is not None and resume is not None and run_id != resume:
        raise ConfigError(f"--run-id {run_id} and --resume {resume} name different runs; give --resume alone")
    cfg = None if resume is not None else load_config(profile or "tiny-cpu", overrides)
    rid = resume if cfg is None else one_run_id("--run-id", run_id, cfg.run.run_id)
    row = None if rid is None else claim_run(rid, home, exists=resume is not None)
    try:
        if row is not None and resume is not None:
            stored = ArborConfig.model_validate_json(row["config_json"])
            if profile is not None and profile_path(profile).stem != stored.run.profile:
                raise ConfigError(f"--profile {profile}: run '{resume}' was started with profile "
                                  f"'{stored.run.profile}' and resumes with its stored config (drop --profile)")
            owner = read_owner(resume, home)
            if owner is not None and owner_alive(owner):
                raise ConfigError(f"run '{resume}' is still running (pid {owner['pid']} on {owner['host']}); stop "
                                  "it before resuming")
            cfg = amend_config(stored, overrides)[0]
        require(cfg)
        if redo is not None:
            _redo(cfg, resume, redo, home)
    except BaseException:
        if rid is not None:
            release(rid, home)
        raise
    return cfg, rid


# suggested to the user after a run, the run id bound with --param run_id=...
STEPS_OF_RUN = ("select step, mean_base_reward, mean_total_reward, format_valid_rate from steps where run_id = $run_id "
                "order by step")


def _next_steps(run_id: str, home: Path, seconds: float) -> None:
    """Where the results are and what to run next (as ``arbor demo`` ends)."""
    me = _me()
    typer.echo(f"\nrun {run_id} finished in {seconds:.0f} s")
    typer.echo(f"results: {home}  (Parquet under data/, catalog.duckdb holds the SQL views)")
    if (policy := _final_policy(run_id)) is not None:
        typer.echo(f"policy: {policy}  (a plain HF folder; `{me} export {run_id} --out DIR` copies it)")
    typer.echo("next:")
    typer.echo(f"  {me} report {run_id}")
    typer.echo(f"  {me} sql '{STEPS_OF_RUN}' --param {shlex.quote('run_id=' + run_id)}")
    typer.echo(f"  {me} runs")


def _redo(cfg: Any, resume: str | None, spec: str, home: Path) -> None:
    """``--redo STEP:STAGE``: discard that stage of the resumed run, the stages after it and the checkpoints from
    that step on (``flows.run_setup.redo_stages``, the flow's ``redo`` parameter); the resume computes them again."""
    from arbor.config import ConfigError
    from arbor.flows.run_setup import redo_stages

    if resume is None:
        raise ConfigError(f"--redo {spec}: needs --resume RUN (it changes a stored run)")
    try:
        stages, ckpts = redo_stages(cfg.run.method, cfg.checkpoint, resume, spec, home)
    except ConfigError as e:
        raise ConfigError(f"--{e}") from None
    typer.echo(f"redo: discarded {stages} stored stages of run {resume} from step {spec.partition(':')[0]} "
               f"({spec.partition(':')[2]} on){f' and checkpoints of steps {ckpts}' if ckpts else ''}", err=True)


def train_cmd(
    profile: Annotated[str | None, typer.Option("--profile", "-p", help="configs/<profile>.yaml or a YAML path "
                                                "(default: tiny-cpu)")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="name a new run (default: generated)")] = None,
    resume: Annotated[str | None, typer.Option("--resume", help="resume this run from its stored artifacts; with "
                                               "--set, change its length, eval cadence, judge endpoint, "
                                               "concurrency, cost cap or checkpointing")] = None,
    sets: Annotated[list[str] | None, typer.Option("--set", help="override any config value: section.key=value")] = None,
    redo: Annotated[str | None, typer.Option("--redo", metavar="STEP:STAGE", help="with --resume: discard this "
                                             "stored stage and everything computed after it (later stages, "
                                             "checkpoints), then compute them again")] = None,
    args: Annotated[list[str] | None, typer.Argument(help="key=value overrides, the same as --set (Hydra style)",
                                                     show_default=False)] = None,
) -> None:
    """Run (or resume) the arbor-train flow: `arbor train -p tiny-world train.lr=3e-4 run.steps=20`."""
    from arbor.config import ConfigError
    from arbor.paths import arbor_home
    from arbor.preflight import PreflightError
    from arbor.storage.schemas import SchemaError

    overrides = _overrides([*(sets or []), *(args or [])])
    home = arbor_home(create=False)  # made once the input is good: a refused command leaves nothing behind
    try:  # refuse unknown keys, bad values, unknown or live runs and missing resources before anything runs
        cfg, name = _train_config(profile, run_id, resume, overrides, redo, home)
    except (ConfigError, PreflightError, SchemaError) as e:
        _fail(e)
    arbor_home()
    t0 = time.perf_counter()

    def train() -> str:
        from arbor.flows.train import arbor_train

        return arbor_train(profile=profile or cfg.run.profile, overrides=overrides or None, run_id=name,
                           resume=resume is not None)

    try:
        rid = _on_stop_path(lambda s: _stop_line(s, name, home), home, train)
    except Exception as e:  # noqa: BLE001 - the flow's log above holds the traceback; the last line says what now
        typer.echo(f"error: {f'run {name}' if name else 'the run'} stopped: {_cause(e)}; what was stored is kept: "
                   f"fix that and resume it with `{_me()} train --resume {name or 'RUN'}`"
                   + ("" if name else f" (`{_me()} runs` lists RUN)"), err=True)
        raise typer.Exit(1) from None
    _next_steps(rid, home, time.perf_counter() - t0)


def guidance_train_cmd(
    profile: Annotated[str, typer.Option("--profile", "-p", help="configs/<profile>.yaml or a YAML path")] = "tiny-world",
    run_id: Annotated[str | None, typer.Option("--run-id", help="name the run; the same id resumes it")] = None,
    checkpoint: Annotated[str | None, typer.Option(help="the policy whose trajectories give the branching points "
                                                   "(default: the profile's start policy)")] = None,
    sets: Annotated[list[str] | None, typer.Option("--set", help="override any config value: section.key=value")] = None,
) -> None:
    """Train a Co-ReAct rubric generator (the arbor-guidance-train flow): branching points, list-wise judges, GRPO.
    Then evaluate with `--set guidance.mode=co-react --set guidance.source=generator --set guidance.generator=DIR`."""
    from arbor.config import ConfigError, load_config
    from arbor.paths import arbor_home
    from arbor.preflight import PreflightError, check
    from arbor.preflight.judges import council_problems
    from arbor.storage.runs import check_run_id, run_row
    from arbor.storage.schemas import SchemaError

    overrides = _overrides(sets)
    try:  # a new run: what the profile needs here and the ranking council, before the run row is written
        cfg = load_config(profile, overrides)
        # the generator is what this command makes: the profile's guided inference (guidance.mode) is not checked
        unguided = cfg.model_copy(update={"guidance": cfg.guidance.model_copy(update={"mode": "off"})})
        if (run_id is None or run_row(check_run_id(run_id), arbor_home()) is None) and \
                (missing := check(unguided) + council_problems(cfg.guidance, cfg.judge)):
            raise PreflightError(f"profile '{cfg.run.profile}' cannot start here: {'; '.join(missing)}")
    except (ConfigError, PreflightError, SchemaError, ValueError) as e:
        _fail(e)

    def guidance() -> Any:
        from arbor.flows.guidance import arbor_guidance_train

        return arbor_guidance_train(profile=profile, overrides=overrides or None, checkpoint=checkpoint, run_id=run_id)

    # a known run id continues that run from its stored config (flows.run_setup.prepare_run)
    typer.echo(_on_stop_path(lambda s: _stop_line(s, run_id, arbor_home(),
                                                  lambda rid: f"{_me()} guidance-train --run-id {rid}"),
                             arbor_home(), guidance))


def demo_cmd(
    steps: Annotated[int | None, typer.Option(help="RL steps (default: the profile's)")] = None,
    sets: Annotated[list[str] | None, typer.Option("--set", help="override any config value: section.key=value")] = None,
    profile: Annotated[str, typer.Option("--profile", "-p", help="tiny-world (the synthetic world, held-out F1 before "
                                         "and after RL) or tiny-cpu (Wikipedia passages, mechanics)")] = "tiny-world",
    args: Annotated[list[str] | None, typer.Argument(help="key=value overrides, the same as --set",
                                                     show_default=False)] = None,
) -> None:
    """The embedded default end to end: tiny policy, SFT warm start, ARBOR steps with the rules judge and BM25
    (tiny-world: held-out F1 before and after RL)."""
    from arbor.config import ConfigError, load_config
    from arbor.preflight import PreflightError, require

    overrides = _overrides([*(sets or []), *(args or [])])
    try:
        require(load_config(profile, {**overrides, **({"run.steps": steps} if steps is not None else {})}))
    except (ConfigError, PreflightError) as e:
        _fail(e)
    from arbor.paths import arbor_home

    def demo() -> str:
        from arbor.flows.demo import run_demo

        return run_demo(steps=steps, overrides=overrides, profile=profile)

    _on_stop_path(lambda s: _stop_line(s, None, arbor_home()), arbor_home(), demo)


def eval_cmd(
    checkpoint: Annotated[str | None, typer.Argument(help="HF checkpoint dir (default: the profile's policy)")] = None,
    profile: Annotated[str, typer.Option("--profile", "-p")] = "tiny-cpu",
    splits: Annotated[list[str] | None, typer.Option("--split", help="bamboogle|hotpotqa|musique|2wiki or a spec")] = None,
    runs: Annotated[int | None, typer.Option(help="pass@1 averaged over this many runs (default 5)")] = None,
    limit: Annotated[int | None, typer.Option(help="first N questions of each split")] = None,
    sets: Annotated[list[str] | None, typer.Option("--set", help="override any config value: section.key=value")] = None,
) -> None:
    """Evaluate a checkpoint: EM, F1, LLM-judge accuracy, strict and valid-only (paper Tables 1 and 5); with
    `--set eval.second_judge_model=MODEL` the same answers are re-judged by MODEL (Table 6, App. C.2)."""
    from arbor.config import ConfigError, load_config
    from arbor.tasks.reporting.evaluate import EvalError, second_judge_config

    for flag, value in (("--runs", runs), ("--limit", limit)):
        if value is not None and value < 1:
            _fail(f"{flag} {value}: expected a whole number of at least 1")
    overrides = _overrides(sets)
    try:  # refuse bad keys and an impossible second judge before any rollout
        cfg = load_config(profile, overrides)
        if cfg.eval.second_judge_model:
            second_judge_config(cfg.judge, cfg.eval.second_judge_model)
        from arbor.preflight.judges import guidance_problems

        if problems := guidance_problems(cfg.guidance, cfg.judge):
            raise ConfigError("; ".join(problems))
        hub_id = checkpoint is not None and re.fullmatch(r"[\w.-]+/[\w.-]+", checkpoint)  # the loader's to find
        if checkpoint is not None and not hub_id and not Path(checkpoint).expanduser().exists():
            raise ConfigError(f"checkpoint {checkpoint!r} does not exist (a checkpoint folder, e.g. "
                              "ARBOR_HOME/checkpoints/RUN/step_000010/hf, or a model id in the local cache)")
        from arbor.tasks.env.datasets import DatasetError, load_questions, split_spec

        for split in splits or cfg.eval.splits:  # an unknown split or an unreadable file, before any model loads
            try:
                load_questions(split_spec(split), config=cfg)
            except DatasetError as e:
                raise ConfigError(f"--split {split}: {e}") from e
    except (ConfigError, EvalError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    from arbor.paths import arbor_home

    def evaluate() -> str:
        from arbor.flows.evaluate import arbor_eval

        return arbor_eval(checkpoint=checkpoint, profile=profile, overrides=overrides or None, splits=splits,
                          runs=runs, limit=limit)

    def line(s: Any) -> str:  # an evaluation keeps its results only once it is complete: nothing to resume
        head, why = _why(s)
        return f"{head}: the evaluation stopped {why}; nothing of it is kept: start it again with the same command"

    _on_stop_path(line, arbor_home(), evaluate)


def compare_cmd(
    methods: Annotated[str, typer.Option(help="comma-separated built-in methods: arbor, grpo, dapo, rar, no-memory, ss-grpo, rubricem, arco (ss-grpo and rubricem need --set rollout.protocol=rubricem; on tiny-world also --set rollout.system_prompt=null), or a Method subclass as pkg.module:Class")] = "arbor,grpo,dapo,rar,no-memory",
    profile: Annotated[str, typer.Option("--profile", "-p")] = "tiny-cpu",
    sets: Annotated[list[str] | None, typer.Option("--set", help="override any config value: section.key=value")] = None,
) -> None:
    """Run several methods on the same data and seeds and print the comparison table."""
    from arbor.config import ConfigError
    from arbor.flows.compare import CompareError, plan_compare
    from arbor.preflight import PreflightError

    chosen = [m.strip() for m in methods.split(",") if m.strip()]
    overrides = _overrides(sets)
    try:  # every method's config, before the first run starts
        plan_compare(chosen, profile, overrides)
    except (CompareError, ConfigError, PreflightError) as e:
        _fail(e)
    from arbor.paths import arbor_home

    def compare() -> tuple[list[str], str]:
        from arbor.flows.compare import run_compare

        return run_compare(chosen, profile, overrides)

    _ids, table = _on_stop_path(lambda s: _stop_line(s, None, arbor_home()), arbor_home(), compare)
    sys.stdout.write(table + "\n")
