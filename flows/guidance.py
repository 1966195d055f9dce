"""``arbor-guidance-train``: Co-ReAct's rubric generator, trained with list-wise GRPO (paper §3.1-3.2).

Stages, each stored before the next starts, so a re-run with the same run id resumes after the last finished one
without new rollouts or judge calls for work already stored:

- ``branch`` (step 0): branching points of the policy's trajectories on training questions, with their slates;
- ``rank`` (step 0): every judge's list-wise ranks and the Borda consensus;
- ``warm`` (step 0): the warm-start SFT rows (the judge's own rubric at each point) and the SFT'd generator;
- ``sample`` (step u) then ``train`` (step u) for GRPO update u = 1..U: the rubrics, their rewards and the
  update. The trainer checkpoints every ``checkpoint.every`` updates; a resume loads the latest checkpoint and
  replays the stored updates after it, then continues.

The trained generator is exported to ``{home}/guidance/{run_id}/generator`` (HF format): pass it as
``guidance.generator`` with ``guidance.source=generator``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from arbor.config import GuidanceConfig, JudgeConfig
from arbor.paths import arbor_home


def generator_dir(run_id: str, home: Path) -> Path:
    return home / "guidance" / run_id


def run_guidance_train(profile: str = "tiny-world", overrides: dict[str, Any] | None = None,
                       checkpoint: str | None = None, run_id: str | None = None) -> tuple[str, Path, dict[str, Any]]:
    """The body of ``arbor-guidance-train``: (run id, generator checkpoint, summary)."""
    from arbor.flows.run_life import recorded_run
    from arbor.flows.run_setup import prepare_run, start_checkpoint, stored_config
    from arbor.llm import make_judge
    from arbor.llm.base import CallContext
    from arbor.storage.catalog import declare_tables
    from arbor.storage.parquet import write_stage
    from arbor.storage.runs import run_row
    from arbor.tasks.env.datasets import fields_of, load_questions
    from arbor.tasks.env.policy import load_policy
    from arbor.tasks.env.rollout import make_engine
    from arbor.tasks.env.search import make_search
    from arbor.tasks.env.sft_data import write_jsonl
    from arbor.tasks.methods import load_judges
    from arbor.tasks.methods.coreact.generator import (
        collect_branch_points,
        generator_config,
        rank_points,
        sample_update,
        total_updates,
        update_batch,
        update_points,
        warm_rows,
    )
    from arbor.tasks.methods.coreact.guidance import GeneratorRubrics
    from arbor.tasks.methods.coreact.tables import TABLES
    from arbor.tasks.stage_store import StageStore

    home = arbor_home()
    new_run = run_id is None or stored_config(run_id, home) is None
    if new_run:  # refused before the run row is written: a missing key or a dead endpoint leaves no run behind
        from arbor.config import load_config
        from arbor.preflight import require_council

        require_council(load_config(profile, overrides))
    cfg = prepare_run(profile, overrides, run_id, False, home)
    rid = str(cfg.run.run_id)
    from arbor.runtime import stop

    stop.set_run(rid)  # a stopped run's last line names it
    g = cfg.guidance
    if new_run:  # prepare_run wrote the row with run.method; this run trains the generator, not a policy
        write_stage("runs", [{**(run_row(rid, home) or {}), "method": "co-react-generator"}], run_id=rid, step=0,
                    stage="run", home=home)
    with recorded_run(cfg, rid, home, council=True):  # stopped / failed / completed, endpoints watched
        declare_tables(TABLES, home)  # branch_points, generator_samples: Co-ReAct's, known to the workspace's readers
        load_judges()  # judge.backend=world | random: registered by ARBOR's package
        judge = make_judge(cfg.judge, home=home, config=cfg)
        out_dir = generator_dir(rid, home)
        store = StageStore(rid, home)
        # the ranking council (§3.1): built before any rollout, so a missing key stops the run at once, naming its key
        council = None if store.done(0, "rank") else rank_council(cfg.guidance, cfg.judge, home)

        def stage(step: int, name: str, table: str, compute: Any) -> list[dict[str, Any]]:
            """The stage's rows, computed and committed once; read back from storage either way, so a resumed run
            trains on exactly the values (float32 log-probs included) the first run stored."""
            store.run(step, name, (table,), compute)
            return store.load(step, name, (table,))[table]

        # ---- branch: one rollout per training question, slates at every turn
        def branch() -> dict[str, list[dict[str, Any]]]:
            policy_path = Path(checkpoint) if checkpoint else start_checkpoint(cfg, home)
            policy, tok = load_policy(policy_path, cfg.policy.dtype, home=home)
            engine = make_engine(cfg, policy, tok, search=make_search(cfg.search, home=home, config=cfg), home=home)
            questions = load_questions(cfg.data.train, size=g.branch_questions, seed=cfg.run.seed, config=cfg,
                                       fields=fields_of(cfg.data))
            return {"branch_points": collect_branch_points(engine, questions, g, run_id=rid,
                                                           seed=cfg.run.seed)}

        points = stage(0, "branch", "branch_points", branch)

        # ---- rank: the council's list-wise rankings (each reasoned, read from its final answer), Borda consensus
        def rank() -> dict[str, list[dict[str, Any]]]:
            assert council is not None
            judges = [(name, j) for name, j, _ in council]
            ranked = rank_points(points, judges, min_rankings=g.min_rankings, seed=cfg.run.seed,
                                 ctx=CallContext(run_id=rid, step=0, stage="rank"),
                                 rationale={name: reasoned for name, _, reasoned in council}, golds=g.rank_golds)
            return {"branch_points": ranked, "judge_calls": [c for _, j in judges for c in j.drain_calls()]}

        ranked = stage(0, "rank", "branch_points", rank)
        kept = [p for p in ranked if p["kept"]]
        if not kept:
            raise RuntimeError(f"run {rid}: no branching point has {g.min_rankings} valid rankings; nothing to train on")

        # ---- warm: SFT on the judge's rubrics (the generator's start), once
        base = Path(g.generator_init) if g.generator_init else (Path(checkpoint) if checkpoint
                                                                 else start_checkpoint(cfg, home))
        warm = out_dir / "warm" if g.warm_start else base
        if g.warm_start and not (warm / "arbor_sft.json").exists():
            from arbor.tasks.training.sft import run_sft

            rows = warm_rows(kept, judge, cfg.rollout.max_searches, CallContext(run_id=rid, step=0, stage="warm"))
            write_stage("judge_calls", judge.drain_calls(), run_id=rid, step=0, stage="warm", home=home)
            data = write_jsonl(rows, out_dir / "warm.jsonl")
            tmp = warm.with_name(f"warm.tmp-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            warm_cfg = cfg.model_copy(update={"sft": cfg.sft.model_copy(update={"epochs": g.warm_epochs})})
            summary = run_sft(warm_cfg, base, data, tmp, home=home)
            (tmp / "arbor_sft.json").write_text(json.dumps({k: v for k, v in summary.items()
                                                            if isinstance(v, int | float | str | bool)}, indent=1))
            os.replace(tmp, warm)

        # ---- GRPO: sample, score, train; replays stored updates after the latest checkpoint
        from arbor.tasks.training.train import Trainer
        from arbor.tasks.training.update import policy_update

        n_updates = total_updates(len(kept), g.batch_points, g.epochs)
        gcfg = generator_config(cfg, rid, n_updates)
        trainer = Trainer(gcfg, warm, home)
        done = trainer.load_latest() or 0
        model, tok = load_policy(warm, cfg.policy.dtype, home=home)
        sampler = GeneratorRubrics(model, tok, temperature=g.generator_temperature, top_p=1.0,
                                   max_tokens=g.max_rubric_tokens, max_batch_rows=cfg.rollout.max_batch_rows)
        if done:
            model.load_state_dict(trainer.state_dict_for_sync(), strict=False)
        question_of = {p["point_id"]: p["question"] for p in kept}
        rewards: list[float] = []
        for u in range(done + 1, n_updates + 1):
            def sample(u: int = u) -> dict[str, list[dict[str, Any]]]:
                rows = sample_update(sampler, judge, update_points(kept, u, g.batch_points, cfg.run.seed), update=u,
                                     group_size=g.group_size, seed=cfg.run.seed, run_id=rid,
                                     policy_version=trainer.policy_version,
                                     ctx=CallContext(run_id=rid, step=u, stage="sample"))
                return {"generator_samples": rows, "judge_calls": judge.drain_calls()}

            rows = stage(u, "sample", "generator_samples", sample)
            update = policy_update(update_batch(rows, question_of), u, gcfg.train, gcfg.run.overlap)  # plain GRPO
            metrics = trainer.train_step(update, u)
            mean_reward = sum(float(r["reward"]) for r in rows) / max(1, len(rows))
            rewards.append(mean_reward)
            store.commit(u, "train", {"steps": [{
                "mean_base_reward": mean_reward, "loss": metrics.get("loss"), "clip_frac": metrics.get("clip_frac"),
                "approx_kl": metrics.get("approx_kl"), "grad_norm": metrics.get("grad_norm"),
                "n_groups": int(metrics.get("n_groups", 0)), "policy_version": int(metrics["policy_version"]),
                "completed_at": time.time()}]})
            model.load_state_dict(trainer.state_dict_for_sync(), strict=False)
            trainer.maybe_save(u, {"mean_reward": mean_reward})
            print(f"generator update {u}/{n_updates}: mean reward {mean_reward:.4f}, loss {metrics.get('loss', 0):.4f}")
        final = out_dir / "generator"
        if not (final / "config.json").exists() or done < n_updates:
            tmp = final.with_name(f"generator.tmp-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            trainer.export_hf(tmp)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        return rid, final, {"points": len(ranked), "kept": len(kept), "updates": n_updates, "rewards": rewards}


def rank_council(guidance: GuidanceConfig, judge: JudgeConfig, home: Path) -> list[tuple[str, Any, bool]]:
    """(name, judge, rationale) of each judge of ``guidance.rank_judges``. A key variable that is not set is a
    ``JudgeSetupError`` naming the entry's key (``guidance.rank_judges.<i>.api_key_env``); the key itself is only
    ever read from the environment by the client."""
    from arbor.llm import make_judge
    from arbor.llm.openai_backend import JudgeSetupError
    from arbor.tasks.methods.coreact.council import council_key_problems, rank_judge_config, rank_judge_names

    names = rank_judge_names(guidance, judge)
    if problems := council_key_problems(guidance, judge, os.environ):
        raise JudgeSetupError(problems[0])
    return [(name, make_judge(rank_judge_config(judge, entry), home=home), entry.rationale)
            for name, entry in zip(names, guidance.rank_judges, strict=True)]


@flow(name="arbor-guidance-train", log_prints=True)
def arbor_guidance_train(profile: str = "tiny-world", overrides: dict[str, Any] | None = None,
                         checkpoint: str | None = None, run_id: str | None = None) -> str:
    """Train a Co-ReAct rubric generator from ``checkpoint``'s (default: the run's start policy) trajectories."""
    from arbor.runtime.quiet import quiet

    quiet()  # a worker's flow run has no CLI to do it
    rid, path, summary = run_guidance_train(profile, overrides, checkpoint, run_id)
    get_run_logger().info("generator %s: %s (%d of %d branching points kept, %d updates)", rid, path,
                          summary["kept"], summary["points"], summary["updates"])
    return str(path)
