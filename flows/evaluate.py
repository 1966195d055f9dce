"""``arbor-eval``: evaluate any checkpoint on the benchmark splits (paper §4.1, Table 1, Table 5, App. E.4).

pass@1 averaged over ``eval.runs`` sampled runs (default 5) of EM, F1 and LLM-judge accuracy, under the strict
format gate and valid-only; results stored as ``eval_results`` rows and printed in the paper's table layout.
With ``eval.second_judge_model`` the same answers are re-judged by that model on the same judge endpoint
(App. C.2, Table 6): its rows and judge calls are stored under the stage ``eval-second``.
The same ``tasks.reporting.evaluate.evaluate_questions`` serves the held-out evaluation that ``arbor-train`` runs every ``run.eval_every``
steps on a fixed small split.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from arbor.config import load_config
from arbor.config.inputs import workspace_inputs
from arbor.paths import arbor_home


def resolve_checkpoint(checkpoint: str, home: Path) -> str:
    """``checkpoint`` as a path, or the id of a stored training run: that run's final policy (``hf/`` of its latest
    complete checkpoint, as ``arbor export`` copies it). A run id that names no trained policy is refused."""
    from arbor.config import ConfigError
    from arbor.storage.runs import run_row
    from arbor.storage.schemas import SchemaError
    from arbor.tasks.training.checkpoint import final_policy, run_root_from_config

    if Path(checkpoint).expanduser().exists() or "/" in checkpoint:
        return checkpoint
    try:
        row = run_row(checkpoint, home)
    except SchemaError:  # not a name a run can have
        row = None
    if row is None:
        return checkpoint  # a model name (Qwen/Qwen3-8B style names hold a slash; a bare one is the loader's)
    policy = final_policy(run_root_from_config(row["config_json"], checkpoint, home))
    if policy is None:
        raise ConfigError(f"checkpoint={checkpoint}: run {checkpoint!r} has no complete checkpoint yet (`arbor runs` "
                          "shows its last completed step)")
    return str(policy)


def run_eval(checkpoint: str | None = None, profile: str = "tiny-cpu", overrides: dict[str, Any] | None = None,
             splits: list[str] | None = None, runs: int | None = None, limit: int | None = None,
             run_id: str | None = None) -> tuple[str, str]:
    """The body of ``arbor-eval``: evaluate, store, and return (run id, printed tables)."""
    from arbor.storage.lock import release
    from arbor.storage.runs import RunRefused, claim_run, run_row
    from arbor.tasks.reporting.evaluate import second_judge_config

    home = arbor_home()
    cfg = load_config(profile, overrides)
    workspace_inputs(cfg)  # relative input paths: the current directory's, else ARBOR_HOME's
    if cfg.eval.second_judge_model:  # refused up front, before the run id is claimed
        second_judge_config(cfg.judge, cfg.eval.second_judge_model)
    splits = splits or list(cfg.eval.splits)
    runs = runs or cfg.eval.runs
    checkpoint = resolve_checkpoint(checkpoint, home) if checkpoint else None
    model = checkpoint or cfg.run.start_checkpoint or cfg.policy.model
    print(f"evaluating {model}" + ("" if checkpoint else " (no checkpoint given: the profile's start; pass "
                                   "checkpoint=RUN_ID for a training run's final policy)"), flush=True)
    rid = run_id or f"eval-{cfg.run.profile}-{time.strftime('%Y%m%d-%H%M%S')}"
    cfg.run.run_id = rid
    if run_row(rid, home) is not None:  # the one door below says so too, but offers a resume eval does not have
        raise RunRefused(f"run '{rid}' already exists in {home}: an evaluation is stored as a new run (pass another "
                         "run_id, or none for a fresh one)")
    claim_run(rid, home, exists=False)  # the one door: a stored run (training or evaluation) is never overwritten
    try:
        return _evaluate(cfg, rid, checkpoint, splits, runs, limit, home)
    finally:
        release(rid, home)


def _evaluate(cfg: Any, rid: str, checkpoint: str | None, splits: list[str], runs: int, limit: int | None,
              home: Path) -> tuple[str, str]:
    """``run_eval`` once its run id is claimed."""
    from arbor.flows.run_life import recorded_run
    from arbor.llm import make_judge
    from arbor.llm.base import CallContext
    from arbor.storage.parquet import write_stage
    from arbor.tasks.env.datasets import load_questions, split_spec
    from arbor.tasks.env.policy import load_policy, policy_source
    from arbor.tasks.env.rollout import make_engine
    from arbor.tasks.env.search import make_search
    from arbor.tasks.methods import load_judges
    from arbor.tasks.methods.coreact.guidance import guidance_tag, make_guide
    from arbor.tasks.reporting.evaluate import (
        SECOND_JUDGE_STAGE,
        evaluate_questions,
        format_summary,
        judge_model_name,
        second_judge_config,
        store_eval_results,
        summarize,
    )

    second_model = cfg.eval.second_judge_model
    second_cfg = second_judge_config(cfg.judge, second_model) if second_model else None
    model = checkpoint or cfg.run.start_checkpoint or cfg.policy.model
    load_judges()  # judge.backend=world | random: registered by ARBOR's package
    judge = make_judge(cfg.judge, home=home, config=cfg)
    second_judge = make_judge(second_cfg, home=home) if second_cfg is not None else None
    write_stage("runs", [{"run_id": rid, "profile": cfg.run.profile, "method": "eval", "seed": cfg.run.seed,
                          "config_json": cfg.to_json(), "created_at": time.time(), "git_sha": None}],
                run_id=rid, step=0, stage="run", home=home)
    with recorded_run(cfg, rid, home):  # stopped / failed / completed, endpoints watched
        search = make_search(cfg.search, home=home, config=cfg)
        if cfg.rollout.engine == "transformers":
            src = checkpoint or cfg.run.start_checkpoint or policy_source(cfg.policy, home)  # tiny: its shape
            policy, tok = load_policy(src, cfg.policy.dtype, home=home, policy_cfg=cfg.policy)
            engine = make_engine(cfg, policy, tok, search=search, home=home)
        else:
            engine = make_engine(cfg, search=search, home=home)
        by_split = {s: load_questions(split_spec(s), config=cfg)[:limit] for s in splits}
        guide = make_guide(cfg, judge, home=home, ctx=CallContext(run_id=rid, step=0, stage="eval-guided"))
        tag = guidance_tag(cfg.guidance) if guide is not None else None
        rows = evaluate_questions(engine, judge, by_split, runs=runs, seed=cfg.run.seed, run_id=rid, step=0,
                                  checkpoint=str(model), second_judge=second_judge, temperature=cfg.eval.temperature,
                                  guide=guide, guidance=tag)
        main_model = judge_model_name(judge)
        second_name = judge_model_name(second_judge) if second_judge is not None else None
        guided = [r for r in rows if r["guidance"] is not None]
        rows = [r for r in rows if r["guidance"] is None]
        store_eval_results([r for r in rows if r["judge_model"] != second_name], run_id=rid, step=0, stage="eval",
                           home=home)
        if guide is not None:
            store_eval_results(guided, run_id=rid, step=0, stage="eval-guided", home=home)
            write_stage("guided_steps", guide.drain_records(), run_id=rid, step=0, stage="eval-guided", home=home)
        write_stage("judge_calls", judge.drain_calls(), run_id=rid, step=0, stage="eval", home=home)
        if second_judge is not None:
            store_eval_results([r for r in rows if r["judge_model"] == second_name], run_id=rid, step=0,
                               stage=SECOND_JUDGE_STAGE, home=home)
            write_stage("judge_calls", second_judge.drain_calls(), run_id=rid, step=0, stage=SECOND_JUDGE_STAGE,
                        home=home)
        summary = summarize(rows, splits=list(by_split), judge_model=main_model, second_judge_model=second_name)
        table = format_summary(summary, name=Path(str(model)).name)
        if guide is not None:
            table += "\n\n" + format_guided(rid, home)
        return rid, table


def paired_difference(pairs: list[tuple[float, float]]) -> tuple[float, float, int]:
    """(mean, standard error, n) of ``after - before`` over paired values (a question's unguided and guided F1):
    ``mean_se`` of the differences; the error is nan below two pairs."""
    from arbor.tasks.reporting.curves import mean_se

    m = mean_se([after - before for before, after in pairs])
    if m is None:
        return float("nan"), float("nan"), 0
    return m.mean, m.se if m.n > 1 else float("nan"), m.n


def format_guided(run_id: str, home: Path) -> str:
    """Co-ReAct's comparison on the same questions (sql/queries/guided_eval_of_run.sql): strict EM / F1 and valid
    rate per guidance and split, then the guided turns (view guided_step_summary) and the judge calls they cost."""
    from arbor.storage.sql import run_file

    lines = ["Co-ReAct guidance on the same questions (strict-gated):",
             f"{'guidance':<28}{'split':<14}{'answers':>8}{'valid':>8}{'EM':>8}{'F1':>8}"]
    for r in run_file("guided_eval_of_run", {"run_id": run_id}, home=home):
        lines.append(f"{r['guidance']:<28}{r['split']:<14}{r['n_answers']:>8}{100 * r['valid_rate']:>8.1f}"
                     f"{100 * r['strict_em']:>8.1f}{100 * r['strict_f1']:>8.1f}")
    pairs = run_file("guided_pairs_of_run", {"run_id": run_id}, home=home)
    for source in dict.fromkeys(r["guidance"] for r in pairs):
        mean, se, n = paired_difference([(r["f1_off"], r["f1_on"]) for r in pairs if r["guidance"] == source])
        lines.append(f"{source}: guided - unguided strict F1 {100 * mean:+.1f} ± {100 * se:.1f} (paired standard "
                     f"error over {n} questions)")
    for r in run_file("guided_turns_of_run", {"run_id": run_id}, home=home):
        fail = "-" if r["fail_rate"] is None else f"{100 * r['fail_rate']:.1f}%"
        per = "-" if r["judge_calls_per_answer"] is None else f"{r['judge_calls_per_answer']:.2f}"
        lines.append(f"guided turns ({r['source']}): {r['turns']}, with a rubric {r['guided_turns']}, failing "
                     f"verification {fail}, retried {r['retries']}, failed calls {r['errors']}; extra judge calls "
                     f"per guided answer {per}")
    return "\n".join(lines)


@flow(name="arbor-eval", log_prints=True)
def arbor_eval(checkpoint: str | None = None, profile: str = "tiny-cpu", overrides: dict[str, Any] | None = None,
               splits: list[str] | None = None, runs: int | None = None, limit: int | None = None,
               run_id: str | None = None) -> str:
    """Evaluate ``checkpoint`` (a path, a training run's id for its final policy, or default the profile's start) on
    ``splits`` (names or dataset specs/paths)."""
    from arbor.runtime.quiet import quiet

    quiet()  # a worker's flow run has no CLI to do it
    rid, table = run_eval(checkpoint, profile, overrides, splits, runs, limit, run_id)
    get_run_logger().info("evaluation %s\n%s", rid, table)
    print(table)
    return rid
