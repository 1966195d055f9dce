"""Co-ReAct's rubric generator training, one function per stage (Kang et al., 2026, §3.1-3.2, App. A).

1. ``collect_branch_points``: the policy answers each training question once; the context before each of its
   tool-calling turns (``guidance.branch_steps``, §3.1; not the answering turn) is a branching point (q, h_t), h_t
   the whole prefix (``guidance.max_history_chars``). Candidate next actions are sampled there at several
   temperatures; exact duplicates go and ``slate_k`` diverse ones stay (``coreact.select_diverse``: MMR over
   BM25); a point with fewer distinct candidates is dropped. The paper extends a spine by the top-ranked action at each depth; we branch
   along the policy's own sampled trajectory (docs/decisions/coreacts-whole-prefix-and-generator-data.md).
2. ``rank_points``: every judge of ``guidance.rank_judges`` (the paper's council of three) ranks each slate
   list-wise under a seeded shuffle of neutral labels (no gold answer unless ``guidance.rank_golds``), reasoning
   first and answering with the ranking; the Borda count of the valid rankings is the consensus sigma*; a point
   needs ``min_rankings`` (2) valid ones.
3. ``warm_rows``: the generator's warm start: the judge's own step rubric at each point as an SFT target (a tiny
   model cannot write the rubric format unprompted; the paper starts from Qwen3-14B, which can).
4. ``sample_update`` and ``update_batch``: one GRPO update: G rubrics per point from the current generator, each
   scored by the evaluator (the judge's ``step_verify``) on every candidate of the slate, rewarded by eq. 1-3 (a
   rubric whose slate could not be scored takes its group's mean r_rank: ``neutral_rank``), and trained with the
   policy trainer (``tasks.training.train.Trainer``: clipped surrogate, group-normalised advantages (eq. 4-5), k3 KL to the
   frozen start).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from arbor.config import ArborConfig, GuidanceConfig
from arbor.format import turn_spans
from arbor.seeding import derive_seed
from arbor.tasks.env.agent import GenRequest
from arbor.tasks.methods.coreact.equations import (
    consensus_ranks,
    generator_reward,
    parse_rubric,
    rubric_reward,
    select_diverse,
    verification_score,
)
from arbor.tasks.methods.coreact.guidance import (
    GENERATOR_SYSTEM,
    BranchPoint,
    GeneratorRubrics,
    generator_user,
    prefix_history,
    run_judge,
)
from arbor.tasks.methods.coreact.roles import STEP_RUBRIC, STEP_VERIFY, ask_ranking
from arbor.types import Trajectory


def generator_config(cfg: ArborConfig, run_id: str, total_updates: int) -> ArborConfig:
    """The trainer's config for the generator: GRPO with guidance.* hyperparameters (App. A: lr 2e-6, clip 0.2,
    KL 5e-3 to a frozen reference, grad clip 1.0) and the generator's sampling temperature."""
    g = cfg.guidance
    return cfg.model_copy(deep=True, update={
        "run": cfg.run.model_copy(update={"run_id": run_id, "method": "grpo", "steps": total_updates}),
        "train": cfg.train.model_copy(update={"lr": g.lr, "kl_coef": g.kl_coef, "kl_reference": "frozen",
                                              "eps_clip_low": g.clip_eps, "eps_clip_high": g.clip_eps,
                                              "grad_clip": g.grad_clip, "adv_norm": "std", "lr_schedule": "constant",
                                              "warmup_ratio": 0.0, "updates_per_batch": 1}),
        "rollout": cfg.rollout.model_copy(update={"temperature": g.generator_temperature, "top_p": 1.0}),
    })


# ---- 1. branching points ---------------------------------------------------------------------------------------

def tool_calling_step(loop: Any, turn_text: str, searches_before: int) -> bool:
    """Whether the trajectory's turn is a tool-calling step (§3.1): its own action is a search that runs (a search
    budget left), not the answer, nor a malformed turn, nor a search the loop turns into the forced answer."""
    return loop.is_search(turn_text) and searches_before < loop.budgets.max_searches


def collect_branch_points(engine: Any, questions: Sequence[Any], guidance: GuidanceConfig, *, run_id: str,
                          seed: int) -> list[dict[str, Any]]:
    """``branch_points`` rows (not yet ranked) from one rollout per question and sampled slates at its turns."""
    g = guidance
    loop, tok = engine.loop, engine.tokenizer
    trajs = engine.generate_groups(list(questions), 1, derive_seed(seed, "branch"), 0, run_id=run_id)
    rows: list[dict[str, Any]] = []
    for q, t in zip(questions, trajs, strict=True):
        for turn, (start, end) in enumerate(turn_spans(t.loss_mask)):
            ctx = t.prompt_ids + t.response_ids[:start]
            history = tok.decode(t.response_ids[:start], skip_special_tokens=False)
            tool_calls = history.count("</search>")
            if g.branch_steps == "tool" and not tool_calling_step(
                    loop, tok.decode(t.response_ids[start:end], skip_special_tokens=False), tool_calls):
                continue
            room = loop.turn_budget(len(ctx), start)  # the agent's own budget at this turn
            if room <= 0:
                continue
            actions: list[str] = []
            for temp in g.branch_temperatures:
                reqs = [GenRequest(ctx, room, derive_seed(seed, "candidate", q.question_id, turn, temp, j))
                        for j in range(g.branch_samples)]
                for gen in engine.complete(reqs, temperature=temp, stop_strings=loop.stop_strings):
                    ids = [x for x in gen.token_ids if x not in loop.eos_ids]
                    actions.append(tok.decode(ids, skip_special_tokens=False).strip())
            distinct = [a for a in actions if a]
            slate = [distinct[i] for i in select_diverse(distinct, g.slate_k)]
            if len(slate) < g.slate_k:
                continue
            rows.append({"run_id": run_id, "step": 0, "point_id": f"{q.question_id}/t{turn}",
                         "question_id": q.question_id, "question": q.question, "golds": list(q.golds), "turn": turn,
                         "history": prefix_history(history, g.max_history_chars), "tool_calls": tool_calls,
                         "candidates": slate, "judge_ranks": None, "n_rankings": 0, "consensus": None,
                         "kept": None})
    return rows


# ---- 2. list-wise consensus ------------------------------------------------------------------------------------

def shuffled_order(seed: int, point_id: str, judge_name: str, n: int) -> list[int]:
    """The shown order of a slate for one judge: a seeded permutation (neutral labels X, Y, Z, W ...)."""
    gen = torch.Generator().manual_seed(derive_seed(seed, "rank-order", point_id, judge_name) % (2**63))
    return torch.randperm(n, generator=gen).tolist()


def rank_points(rows: Sequence[dict[str, Any]], judges: Sequence[tuple[str, Any]], *, min_rankings: int,
                seed: int, ctx: Any = None, rationale: Mapping[str, bool] | None = None,
                golds: bool = False) -> list[dict[str, Any]]:
    """Each judge's ranks of each slate (caller order, 1 = best), their Borda consensus, and whether the point is
    kept (at least min(min_rankings, judges) valid rankings). ``rationale`` (by judge name; default True, App. A):
    the judge reasons first and its ranking is read from its final answer; a reply without a parseable final
    ranking (after the client's retries) is that judge's invalid ranking, stored as null. ``golds``
    (``guidance.rank_golds``): show the judges the question's gold answers; False (§3.1): no answer key."""
    need = min(min_rankings, len(judges))
    reasoned = rationale or {}
    by_judge = {name: run_judge(judge, [ask_ranking(judge, r["question"], r["golds"] if golds else None,
                                                    r["history"], r["candidates"],
                                                    order=shuffled_order(seed, r["point_id"], name,
                                                                         len(r["candidates"])),
                                                    rationale=reasoned.get(name, True), ctx=ctx)
                                        for r in rows])
                for name, judge in judges}
    out = []
    for i, r in enumerate(rows):
        ranks = {name: by_judge[name][i].value for name, _ in judges}  # None: the judge's call failed
        valid = [v for v in ranks.values() if v is not None]
        kept = len(valid) >= need
        out.append({**r, "judge_ranks": json.dumps(ranks, sort_keys=True), "n_rankings": len(valid),
                    "consensus": consensus_ranks(valid) if kept else None, "kept": kept})
    return out


# ---- 3. warm start ---------------------------------------------------------------------------------------------

def warm_rows(points: Sequence[dict[str, Any]], judge: Any, max_tool_calls: int, ctx: Any = None) -> list[dict[str, Any]]:
    """SFT rows (system, user, response) with the judge's step rubric at each kept point as the target."""
    from arbor.tasks.methods.coreact.equations import render_rubric

    bps = [BranchPoint(p["question"], p["history"], int(p["tool_calls"])) for p in points]
    outs = run_judge(judge, [judge.ask(STEP_RUBRIC, question=b.question, history=b.history, tool_calls=b.tool_calls,
                                       max_tool_calls=max_tool_calls, ctx=ctx) for b in bps])
    return [{"system": GENERATOR_SYSTEM, "question": generator_user(b), "response": render_rubric(o.value)}
            for b, o in zip(bps, outs, strict=True) if o.value is not None]


# ---- 4. GRPO updates -------------------------------------------------------------------------------------------

def update_points(points: Sequence[dict[str, Any]], update: int, batch_points: int, seed: int) -> list[dict[str, Any]]:
    """The kept points of GRPO update ``update`` (1-based): a seeded shuffle per epoch, cut into batches."""
    per_epoch = max(1, -(-len(points) // batch_points))
    epoch, k = divmod(update - 1, per_epoch)
    gen = torch.Generator().manual_seed(derive_seed(seed, "generator-epoch", epoch) % (2**63))
    perm = torch.randperm(len(points), generator=gen).tolist()
    return [points[i] for i in perm[k * batch_points:(k + 1) * batch_points]]


def total_updates(n_points: int, batch_points: int, epochs: int) -> int:
    return epochs * max(1, -(-n_points // batch_points))


def sample_update(sampler: GeneratorRubrics, judge: Any, points: Sequence[dict[str, Any]], *, update: int,
                  group_size: int, seed: int, run_id: str, policy_version: int,
                  ctx: Any = None) -> list[dict[str, Any]]:
    """``generator_samples`` rows of one update: G rubrics per point, each slate candidate verified under each
    rubric, and the rubric's reward (eq. 1-3)."""
    bps = [BranchPoint(p["question"], p["history"], int(p["tool_calls"])) for p in points]
    flat = [(gi, i) for gi in range(len(points)) for i in range(group_size)]
    reqs = sampler.requests([bps[gi] for gi, _ in flat],
                            [derive_seed(seed, "generator", update, points[gi]["point_id"], i) for gi, i in flat])
    gens = sampler.sample(reqs)
    texts = [sampler.decode(g.token_ids) for g in gens]
    rubrics = [parse_rubric(t) for t in texts]
    jobs, where = [], []
    for j, ((gi, _), rubric) in enumerate(zip(flat, rubrics, strict=True)):
        if not rubric.items:
            continue
        for c, cand in enumerate(points[gi]["candidates"]):
            jobs.append(judge.ask(STEP_VERIFY, question=bps[gi].question, history=bps[gi].history, action=cand,
                                  rubric=rubric, ctx=ctx))
            where.append((j, c))
    verdicts = run_judge(judge, jobs)
    scores: dict[int, list[float | None]] = {}
    for (j, c), out in zip(where, verdicts, strict=True):
        s = scores.setdefault(j, [None] * len(points[flat[j][0]]["candidates"]))
        if out.value is not None:
            s[c] = verification_score([it.weight for it in rubrics[j].items], out.value.satisfied)
    rows = []
    for j, ((gi, i), rubric, text, gen) in enumerate(zip(flat, rubrics, texts, gens, strict=True)):
        raw = scores.get(j)
        errors = sum(v is None for v in raw) if raw is not None else 0
        cand = [float(v) for v in raw] if raw is not None and errors == 0 else None  # type: ignore[arg-type]
        parts = rubric_reward(rubric, text, cand, points[gi]["consensus"])
        rows.append({"run_id": run_id, "step": update, "point_id": points[gi]["point_id"], "group": gi, "sample": i,
                     "rubric": text, "n_items": len(rubric.items), "candidate_scores": cand, **parts,
                     "prompt_ids": reqs[j].context_ids, "response_ids": list(gen.token_ids),
                     "rollout_logprobs": list(gen.logprobs), "finish_reason": gen.finish_reason,
                     "policy_version": policy_version, "eval_errors": errors})
    return neutral_rank(rows)


def neutral_rank(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A rubric whose slate the evaluator could not score (a ``step_verify`` call failed for good,
    ``eval_errors`` > 0) takes the mean r_rank of its group's verified rubrics, not chance (0.5), so its ranking
    counts as the group's average; its own atomicity, format and repetition still count. A group without a verified
    rubric keeps 0.5 for every one (equal across them: no signal)."""
    out = [dict(r) for r in rows]
    by_group: dict[int, list[dict[str, Any]]] = {}
    for r in out:
        by_group.setdefault(int(r["group"]), []).append(r)
    for group in by_group.values():
        verified = [float(r["r_rank"]) for r in group if r["candidate_scores"] is not None]
        if not verified:
            continue
        mean = sum(verified) / len(verified)
        for r in group:
            if r["eval_errors"]:
                r["r_rank"] = mean
                r["reward"] = generator_reward(mean, r["r_atom"], r["r_fmt"], repetition=r["repetition"])
    return out


def update_batch(rows: Sequence[dict[str, Any]], question_of: dict[str, str]) -> list[Trajectory]:
    """The trainer's batch for stored ``generator_samples`` rows: one single-turn trajectory per rubric, every
    token in the loss, its reward the rubric's reward."""
    return [Trajectory(run_id=r["run_id"], step=int(r["step"]), group=int(r["group"]), sample=int(r["sample"]),
                       question_id=r["point_id"], question=question_of.get(r["point_id"], ""), golds=[],
                       prompt_ids=list(r["prompt_ids"]), response_ids=list(r["response_ids"]),
                       loss_mask=[1] * len(r["response_ids"]), rollout_logprobs=[float(x) for x in r["rollout_logprobs"]],
                       text=r["rubric"], turns=1, finish_reason=r["finish_reason"], format_valid=True,
                       base_reward=float(r["reward"]), policy_version=int(r["policy_version"]))
            for r in rows]
