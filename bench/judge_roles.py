"""Every judge role against a real judge: does it answer, how often, how fast, cut off or not.

    python bench/judge_roles.py --run RUN --home HOME --base-url http://127.0.0.1:PORT/v1 --model smollm2 \
        [--calls 10] [--modes auto off] [--roles pairwise accuracy ...]

The inputs are a stored run's own trajectories (``--run`` under ``--home``, e.g. a ``bench/learning.py`` run of
``smol-world``): the questions, groups and responses a real judge sees in training. What a role needs besides them
comes from the offline ``rules`` judge on the same trajectories (the rubrics a pairwise call judges under, the
items RaR rates against, the stage rubrics to grade, the step rubric to verify), so no role depends on another
role of the judge under test. Reflection candidates are written from the trajectory's stage grades (the policy's
own reflections need a RubricEM run). Staged-protocol roles read the standard protocol's trajectories unless
``--staged-run`` names a run of ``rollout.protocol=rubricem``.

Per role and ``judge.structured_outputs`` mode: calls, valid answers (the role's parser accepted the reply within
the judge's retries), mean attempts, mean latency, prompt and completion tokens per call, calls whose last reply
was cut off at max_tokens, and the invalid answers: attempts whose reply validated but was the
prompt's template echoed, a loop or an empty field (``llm.answers``), and the calls that ended so (fell back). Nothing is cached (each mode is asked afresh) and the judge's key is read from
``--api-key-env`` (any value for a local server).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from arbor.tasks.methods.arbor.roles import CONSOLIDATION, INDUCTION, ask_pairwise
from arbor.tasks.methods.arco.roles import STEP_LABELS
from arbor.tasks.methods.coreact.roles import STEP_RUBRIC, STEP_VERIFY, ask_ranking
from arbor.tasks.methods.rar.roles import RAR_RATE, RAR_RUBRICS
from arbor.tasks.methods.rubricem.roles import REFLECTION_GRADES
from arbor.tasks.methods.ss_grpo.roles import STAGE_GRADES, STAGE_RUBRICS
from arbor.tasks.reporting.accuracy import ACCURACY

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ROLES = ("induction", "consolidation", "pairwise", "accuracy", "rar_rubrics", "rar_rate", "stage_rubrics",
         "stage_grades", "reflection_grades", "step_labels", "step_rubric", "step_verify", "rank_actions")
Call = Callable[[Any], Awaitable[Any]]  # judge -> JudgeOutcome


def load_run(run_id: str, home: Path) -> tuple[Any, list[list[Any]], Callable[[list[int]], str]]:
    """(config, groups of trajectories with at least two members, a decoder of the run's token ids)."""
    from arbor.config import ArborConfig
    from arbor.storage.parquet import read_table
    from arbor.storage.runs import run_row
    from arbor.tasks.env.policy import load_tokenizer, policy_source
    from arbor.types import Trajectory

    row = run_row(run_id, home)
    if row is None:
        raise SystemExit(f"--run {run_id}: no such run in {home}")
    cfg = ArborConfig.model_validate_json(row["config_json"])
    trajs = [Trajectory.from_row(r) for r in read_table("trajectories", run_id=run_id, home=home).to_pylist()]
    groups: dict[tuple[int, int], list[Trajectory]] = {}
    for t in sorted(trajs, key=lambda t: (t.step, t.group, t.sample)):
        groups.setdefault((t.step, t.group), []).append(t)
    src = Path(cfg.run.start_checkpoint) if cfg.run.start_checkpoint else policy_source(cfg.policy, home)
    tok = load_tokenizer(src, cfg.policy)
    return cfg, [g for g in groups.values() if len(g) > 1], lambda ids: tok.decode(ids, skip_special_tokens=False)


def build_calls(groups: list[list[Any]], staged: list[list[Any]], cfg: Any, decode: Callable[[list[int]], str],
                rules: Any, n: int) -> dict[str, list[Call]]:
    """Up to ``n`` calls per role, each a function of the judge under test, with inputs drawn from the run."""
    from arbor.format import check_format
    from arbor.tasks.methods.arbor.induction import select_anchors
    from arbor.tasks.methods.arco.method import trajectory_steps
    from arbor.types import StageRubric

    def ask(coro: Awaitable[Any]) -> Any:
        return asyncio.run(coro).value

    calls: dict[str, list[Call]] = {r: [] for r in ROLES}
    drafts: dict[str, list[Any]] = {}
    for g in groups:
        q, golds = g[0].question, g[0].golds
        anchors = select_anchors([t.f1 for t in g], [len(t.response_ids) for t in g], [t.format_valid for t in g])
        if anchors["mode"] not in (None, "skip"):
            calls["induction"].append(lambda j, g=g, a=anchors: j.ask(INDUCTION, question=g[0].question,
                                                                      golds=g[0].golds, trajectories=g,
                                                                      anchors=a, existing=[]))
            drafts[g[0].question_id] = ask(rules.ask(INDUCTION, question=q, golds=golds, trajectories=g,
                                                     anchors=anchors, existing=[])) or []
        rubric = next((d for ds in drafts.values() for d in ds), None)
        if rubric is not None:
            calls["pairwise"].append(lambda j, g=g, r=rubric: ask_pairwise(j, g[0].question, g[0], g[1], r))
        answer = check_format(g[0].text).answer
        calls["accuracy"].append(lambda j, q=q, golds=golds, a=answer: j.ask(ACCURACY, question=q,
                                                                             golds=golds, prediction=a))
        calls["rar_rubrics"].append(lambda j, q=q, golds=golds: j.ask(RAR_RUBRICS, question=q, golds=golds))
        items = ask(rules.ask(RAR_RUBRICS, question=q, golds=golds)) or ["The answer names the gold entity."]
        calls["rar_rate"].append(lambda j, t=g[0], items=items: j.ask(RAR_RATE, question=t.question,
                                                                      trajectory=t, items=items))
        steps = trajectory_steps(g[0], decode, cfg.rollout.max_searches)
        if steps:
            pairs = [(s.action, s.result) for s in steps]
            calls["step_labels"].append(lambda j, t=g[0], p=pairs: j.ask(STEP_LABELS, question=t.question,
                                                                         golds=t.golds, trajectory=t, steps=p,
                                                                         k=3))
            s = steps[-1]
            used = cfg.rollout.max_searches - s.searches_left
            calls["step_rubric"].append(lambda j, q=q, h=s.history, u=used: j.ask(STEP_RUBRIC, question=q,
                                                                                  history=h, tool_calls=u,
                                                                                  max_tool_calls=cfg.rollout.max_searches))
            rub = ask(rules.ask(STEP_RUBRIC, question=q, history=s.history, tool_calls=used,
                                      max_tool_calls=cfg.rollout.max_searches))
            if rub is not None and rub.items:
                calls["step_verify"].append(lambda j, q=q, h=s.history, a=s.action, r=rub: j.ask(STEP_VERIFY,
                                                                                                 question=q,
                                                                                                 history=h,
                                                                                                 action=a,
                                                                                                 rubric=r))
            turn = len(steps) - 1  # the other trajectories' actions at the same turn are the candidates
            others = [ts[turn].action for t in g[1:4]
                      if len(ts := trajectory_steps(t, decode, cfg.rollout.max_searches)) > turn]
            cands = [s.action, *others]
            if len(cands) > 1:
                # no golds: what the council is sent by default (guidance.rank_golds false)
                calls["rank_actions"].append(lambda j, q=q, h=s.history, c=cands: ask_ranking(
                    j, q, None, h, c, order=list(range(len(c)))[::-1]))
    by_query = dict(list(drafts.items())[:4])
    if sum(len(v) for v in by_query.values()) >= 2:
        calls["consolidation"] = [lambda j, b=by_query: j.ask(CONSOLIDATION, candidates_by_query=b,
                                                              existing=[])]
    for g in staged:
        q, golds = g[0].question, g[0].golds
        calls["stage_rubrics"].append(lambda j, g=g: j.ask(STAGE_RUBRICS, question=g[0].question,
                                                           golds=g[0].golds, trajectories=g, existing=[]))
        made = ask(rules.ask(STAGE_RUBRICS, question=q, golds=golds, trajectories=g, existing=[])) or []
        rubrics = [StageRubric(f"r{i}", d.stage, d.title, d.description, d.weight, d.polarity)
                   for i, d in enumerate(made)]
        if not rubrics:
            continue
        calls["stage_grades"].append(lambda j, t=g[0], r=rubrics: j.ask(STAGE_GRADES, question=t.question,
                                                                        golds=t.golds, trajectory=t,
                                                                        rubrics=r))
        grades = ask(rules.ask(STAGE_GRADES, question=q, golds=golds, trajectory=g[0], rubrics=rubrics)) or []
        graded = list(zip(rubrics, grades, strict=False))
        cands = [f"<reflection_rubrics>{r.title}: {r.description}</reflection_rubrics>\n<reflection_takeaways>"
                 f"{'Keep' if gr.score == 2 else 'Fix'} this in the {('plan', 'research', 'review', 'answer')[r.stage - 1]}"
                 "</reflection_takeaways>" for r, gr in graded[:3]]
        if cands:
            calls["reflection_grades"].append(lambda j, t=g[0], gr=graded, c=cands: j.ask(REFLECTION_GRADES,
                                                                                          question=t.question,
                                                                                          golds=t.golds,
                                                                                          trajectory=t,
                                                                                          graded=gr,
                                                                                          candidates=c))
    return {r: c[:n] for r, c in calls.items()}


def measure(judge: Any, calls: list[Call]) -> dict[str, Any]:
    """Run the calls one at a time (latency is the judge's, not a queue's) and summarise the ledger."""
    async def all_calls() -> list[Any]:
        try:
            return [await c(judge) for c in calls]
        finally:
            await judge.aclose()

    t0 = time.perf_counter()
    outs = asyncio.run(all_calls())
    rows = judge.drain_calls()
    valid = sum(o.value is not None for o in outs)
    return {"calls": len(outs), "valid": valid, "valid_rate": valid / len(outs) if outs else float("nan"),
            "attempts": statistics.fmean(o.attempts for o in outs) if outs else float("nan"),
            "latency_s": statistics.fmean(r["latency_s"] or 0.0 for r in rows) if rows else float("nan"),
            "prompt_tokens": statistics.fmean(r["prompt_tokens"] or 0 for r in rows) if rows else float("nan"),
            "completion_tokens": statistics.fmean(r["completion_tokens"] or 0 for r in rows) if rows else float("nan"),
            "truncated": sum(r["error"] == "Truncated" for r in rows),
            "invalid_answers": sum((e or "").split(":")[0] == "InvalidAnswer" for r in rows for e in r["attempt_errors"] or []),
            "ended_invalid": sum(r["error"] == "InvalidAnswer" for r in rows), "seconds": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="a stored run whose trajectories the judge reads")
    p.add_argument("--staged-run", help="a run of rollout.protocol=rubricem for the stage roles (default --run)")
    p.add_argument("--home", default=os.environ.get("ARBOR_HOME", str(ROOT / "bench" / "out" / "learning-smol-world")))
    p.add_argument("--base-url", required=True, help="the judge's OpenAI-compatible /v1 endpoint")
    p.add_argument("--model", required=True, help="the served model's name")
    p.add_argument("--api-key-env", default="ARBOR_JUDGE_KEY", help="variable holding the key (set to any value "
                   "for a local server without one)")
    p.add_argument("--calls", type=int, default=10, help="calls per role")
    p.add_argument("--modes", nargs="+", default=["auto", "off"], choices=["auto", "json_schema", "json_object", "off"])
    p.add_argument("--roles", nargs="+", default=list(ROLES), choices=ROLES)
    p.add_argument("--max-retries", type=int, default=2)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--context-tokens", type=int, default=None, help="the judge's context (a llama.cpp n_ctx)")
    args = p.parse_args(argv)
    os.environ.setdefault(args.api_key_env, "local")

    from arbor.config.judge import JudgeConfig
    from arbor.llm import make_judge

    home = Path(args.home).resolve()
    cfg, groups, decode = load_run(args.run, home)
    staged = load_run(args.staged_run, home)[1] if args.staged_run else groups
    rules = make_judge(JudgeConfig(backend="rules"), home=Path(tempfile.mkdtemp()))
    calls = build_calls(groups, staged, cfg, decode, rules, args.calls)
    print(f"{len(groups)} groups of run {args.run}; judge {args.model} at {args.base_url}", flush=True)
    print("| role | mode | calls | valid | attempts | latency s | prompt tok | completion tok | truncated | "
          "invalid answers (calls ended so) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for role in args.roles:
        for mode in args.modes:
            if not calls[role]:
                print(f"| {role} | {mode} | 0 | (no inputs in this run) | | | | | | |", flush=True)
                continue
            jc = JudgeConfig(backend="openai", base_url=args.base_url, model=args.model,
                             api_key_env=args.api_key_env, structured_outputs=mode, cache=False,
                             max_retries=args.max_retries, timeout_s=args.timeout, concurrency=1,
                             context_tokens=args.context_tokens)
            m = measure(make_judge(jc, home=Path(tempfile.mkdtemp())), calls[role])
            print(f"| {role} | {mode} | {m['calls']} | {m['valid_rate']:.0%} | {m['attempts']:.2f} | "
                  f"{m['latency_s']:.1f} | {m['prompt_tokens']:.0f} | {m['completion_tokens']:.0f} | "
                  f"{m['truncated']} | {m['invalid_answers']} ({m['ended_invalid']}) |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
