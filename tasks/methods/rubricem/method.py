"""RubricEM (§3.2-3.4, Alg. 1, App. D): SS-GRPO plus the reflection meta-policy and the agent rubric bank.

Everything of ``ss-grpo`` (stage scores, Lambda returns, per-stage advantages, the stagewise evolving judge), and:

    batch     the windowed curriculum (D.3): K fresh batches with cross-episode retrieval, then the same K replayed
              with within-episode retrieval; each prompt shows its retrieved bank items before the question (D.6.3)
    reflect   per group, one trajectory drawn uniformly (D.4) is reflected on by the policy itself: m candidates at
              T = 0.7, graded by the judge with the trajectory's stage grades as privileged context (D.6.2),
              u = 0.4 diagnosis + 0.3 specificity + 0.3 scope (``reflection_utility=within-cross``: Alg. 1's
              mean of within- and cross-episode usefulness); the best valid candidate enters the bank (D.4, D.5)
    train     Phase A: the previous step's candidates (one-step lag, D.2), each reflected query's m candidates one
              GRPO group on the reflection tokens, rewarded by u; then Phase B: the task batch (SS-GRPO), Alg. 1

Choices where arbor's setting leaves the paper open (docs/decisions/rubricem-arco-and-arbor-at-paper-scale.md): only the new-query
steps reflect (D.4; ``rubricem.reflect_in=every-step`` also reflects in the replay phase); last step's candidates
are their own update before the task update (Phase A / B, D.1; ``reflection_update=joint`` folds them in); a
candidate group whose utilities do not vary is stored but not trained (all advantages are 0); candidates sampled at
T = 0.7 are scored at 0.7 in their phase, so TIS (pi_old / pi_behaviour, capped) weighs only the one-step staleness
(``joint``: at the rollout temperature, where TIS also covers the temperature, truncated at C).

The bank changes only through ``rubric_bank`` events, the stage buffer through ``stage_rubrics`` events: a resumed
run replays both (``restore``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar

from torch import Tensor

from arbor.config.train import TrainConfig
from arbor.format import reflection_blocks
from arbor.llm.base import CallContext, JudgeOutcome
from arbor.seeding import derive_seed
from arbor.tasks.env.agent import GenRequest, build_prompt_ids
from arbor.tasks.env.datasets import Question, batch_for_step
from arbor.tasks.methods.base import ROLLOUT, SHAPE, TRAIN, Rows, Stage, StageHook, StepResources
from arbor.tasks.methods.rubricem.roles import REFLECTION_GRADES
from arbor.tasks.methods.rubricem.tables import TABLES
from arbor.tasks.methods.ss_grpo.method import SSGRPO
from arbor.tasks.reflection import (
    REFLECTION_GROUP,
    REFLECTION_STOP,
    REFLECTION_SYSTEM_PROMPT,
    BankItem,
    Mode,
    RubricBank,
    best_candidate,
    normalise,
    reference_block,
    reflection_message,
    reflection_utility,
    windowed_batch,
    within_cross_utility,
)
from arbor.tasks.stage_store import fault_point
from arbor.tasks.training.losses import group_advantages
from arbor.types import ReflectionGrade, RubricGrade, StageRubric, Trajectory


class RubricEM(SSGRPO):
    name = "rubricem"
    tables = TABLES
    stages: ClassVar[tuple[Stage, ...]] = (
        replace(ROLLOUT, tables=("rollouts", "bank_retrievals")), SSGRPO.stage("score"),
        Stage("reflect", ("judge_calls", "reflections", "rubric_bank")), SHAPE, TRAIN)

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.bank = RubricBank()

    # ------------------------------------------------------------------------------------------ resume
    def stage_hooks(self) -> dict[str, StageHook]:
        """SS-GRPO's stages plus reflection (§3.3): the judge grades each trajectory's reflection, and the bank
        keeps the lessons the next step's rollouts retrieve."""
        return {"score": self.score, "reflect": self.reflect, "shape": self.shape}

    def restore(self, run: StepResources) -> None:
        """The stage buffer (SS-GRPO) and the bank from the ``rubric_bank`` events of every completed reflect stage."""
        super().restore(run)
        events: Rows = []
        step = 1
        while run.store.done(step, "reflect"):
            events += run.store.load(step, "reflect", ("rubric_bank",))["rubric_bank"]
            step += 1
        self.bank = RubricBank.from_events(events)

    # ------------------------------------------------------------------------------------------ rollout
    def batch(self, run: StepResources, step: int) -> tuple[list[Question], dict[str, Rows]]:
        """The curriculum's batch (D.3) with each question's retrieved bank items in its prompt (D.5, D.6.3)."""
        rc = self.cfg.rubricem
        if rc.curriculum == "windowed":
            fresh, mode = windowed_batch(step, rc.window)
        else:
            fresh, mode = step, "cross"
        batch = batch_for_step(run.questions, run.seed, fresh, self.cfg.rollout.batch_size)
        out, rows = [], []
        hits = self.retrieve(run, batch, mode)
        for g, (q, items) in enumerate(zip(batch, hits, strict=True)):
            out.append(replace(q, reference=reference_block(mode, [it for it, _ in items])))
            rows += [{"group": g, "question_id": q.question_id, "item_id": it.item_id, "mode": mode, "rank": r,
                      "similarity": s, "item_step": it.step} for r, (it, s) in enumerate(items, 1)]
        return out, {"bank_retrievals": rows}

    def retrieve(self, run: StepResources, batch: Sequence[Question],
                 mode: Mode) -> list[list[tuple[BankItem, float | None]]]:
        """Per question, the bank items its prompt shows: its own (within), or the top-k of other questions
        (cross; similarity = inner product of normalised question embeddings)."""
        if mode == "within":
            return [[(it, None)] if (it := self.bank.within(q.question_id)) else [] for q in batch]
        k = self.cfg.rubricem.retrieval_top_k
        if not self.bank.items or k == 0:
            return [[] for _ in batch]
        items = list(self.bank.items.values())
        vecs = [normalise([float(x) for x in v]) for v in run.embed([*(q.question for q in batch),
                                                                      *(it.question for it in items)])]
        bank_vecs = {it.question_id: vecs[len(batch) + i] for i, it in enumerate(items)}
        return [list(self.bank.cross(q.question_id, vecs[g], bank_vecs, k)) for g, q in enumerate(batch)]

    # ------------------------------------------------------------------------------------------ reflect
    def reflect(self, run: StepResources, step: int, trajs: list[Trajectory]) -> dict[str, Rows]:
        """PREPAREREFLECTIONBATCH of Alg. 1 for every group: sample, reflect (m candidates), judge, bank the best.
        Only at the steps ``reflects_at`` names (D.4: the new-query phase); elsewhere the stage stores nothing."""
        rc = self.cfg.rubricem
        if not reflects_at(step, rc.reflect_in, rc.curriculum, rc.window):
            return {"judge_calls": [], "reflections": [], "rubric_bank": []}
        groups = run.groups(trajs)
        grades = _grades_by_traj(run.store.load(step, "score", ("stage_grades",))["stage_grades"])
        chosen = [g[random.Random(derive_seed(run.seed, step, "reflect", g[0].group)).randrange(len(g))]
                  for g in groups]
        tok = run.engine.tokenizer
        prompts = [build_prompt_ids(tok, reflection_message(t.question, t.text), REFLECTION_SYSTEM_PROMPT)
                   for t in chosen]
        room = [min(rc.reflection_max_tokens, self.cfg.rollout.max_context_tokens - len(p)) for p in prompts]
        requests = [GenRequest(p, max(0, r), derive_seed(run.seed, step, "reflection", t.group, i))
                    for p, r, t in zip(prompts, room, chosen, strict=True) for i in range(rc.reflection_samples)]
        gens = run.engine.complete(requests, temperature=rc.reflection_temperature, stop_strings=[REFLECTION_STOP])
        m = rc.reflection_samples
        texts = [[tok.decode(x.token_ids, skip_special_tokens=True) for x in gens[j * m:(j + 1) * m]]
                 for j in range(len(chosen))]
        capped = run.judge_capped()

        async def judge_all() -> list[JudgeOutcome[list[ReflectionGrade]]]:
            return await asyncio.gather(*[
                run.judge.ask(REFLECTION_GRADES, question=t.question, golds=t.golds, trajectory=t,
                              graded=grades.get(t.traj_id, []), candidates=cands,
                              ctx=CallContext(run.run_id, step, "reflect", t.group, None, t.sample))
                for t, cands in zip(chosen, texts, strict=True)])

        judged = [JudgeOutcome(None, "judge cost cap reached", 0, False) for _ in chosen] if capped \
            else run.run_async(judge_all())
        fault_point(step, "reflect", "mid")
        version = run.engine.policy_version
        rows: Rows = []
        bank_rows: Rows = []
        for j, (t, cands, out) in enumerate(zip(chosen, texts, judged, strict=True)):
            ok = out.value is not None and len(out.value) == len(cands)
            err = None if ok else (out.error or f"{len(out.value or [])} grades for {len(cands)} candidates")
            valid = [reflection_blocks(c) is not None for c in cands]
            got = out.value if ok and out.value is not None else [ReflectionGrade(0.0, 0.0, 0.0)] * len(cands)
            utils = [candidate_utility(gr, v, rc.reflection_utility, rc.reflection_weights, rc.format_gate)
                     for gr, v in zip(got, valid, strict=True)]
            best = best_candidate(utils, valid) if ok else None
            if best is not None:
                rubrics, takeaways = reflection_blocks(cands[best]) or ("", "")
                item = BankItem(f"{run.run_id}/bank/{step}/{t.group}", t.question_id, t.question, rubrics.strip(),
                                takeaways.strip(), step, t.traj_id, utils[best])
                bank_rows.append(self.bank.write(item, t.group))
            for i, (c, gen) in enumerate(zip(cands, gens[j * m:(j + 1) * m], strict=True)):
                cand = Trajectory(
                    run_id=run.run_id, step=step, group=REFLECTION_GROUP + t.group, sample=i,
                    question_id=t.question_id, question=t.question, golds=list(t.golds), prompt_ids=prompts[j],
                    response_ids=list(gen.token_ids), loss_mask=[1] * len(gen.token_ids),
                    rollout_logprobs=list(gen.logprobs), text=c, turns=1, finish_reason=gen.finish_reason,
                    format_valid=valid[i], format_reason="" if valid[i] else "missing a reflection block",
                    base_reward=utils[i], shaped_reward=utils[i], policy_version=version)
                rows.append({**cand.to_row(), "source_traj_id": t.traj_id, "diagnosis": got[i].diagnosis,
                             "specificity": got[i].specificity, "scope": got[i].scope, "utility": utils[i],
                             "chosen": i == best, "judge_error": err})
        return {"judge_calls": run.judge_rows(), "reflections": rows,
                "rubric_bank": bank_rows}

    # ------------------------------------------------------------------------------------------ train
    def train_batch(self, run: StepResources, step: int, trajs: list[Trajectory]) -> list[Trajectory]:
        """The task batch plus the previous step's reflection groups whose utilities vary (D.2's one-step lag)."""
        if step <= 1 or not run.store.done(step - 1, "reflect"):
            return trajs
        cands = [Trajectory.from_row(r) for r in run.store.load(step - 1, "reflect", ("reflections",))["reflections"]]
        by_group: dict[int, list[Trajectory]] = {}
        for c in cands:
            by_group.setdefault(c.group, []).append(c)
        kept = [c for g in by_group.values() if len({c.base_reward for c in g}) > 1 for c in g if c.response_ids]
        return [*trajs, *kept]

    def policy_lag(self, t: Trajectory) -> int:
        return 1 if t.group >= REFLECTION_GROUP else 0

    def update_phase(self, t: Trajectory) -> int:
        """Phase A (0): last step's reflection candidates; phase B (1): the task batch (Alg. 1 lines 10 and 29).
        ``reflection_update=joint``: one phase."""
        if self.cfg.rubricem.reflection_update == "joint":
            return 0
        return 0 if t.group >= REFLECTION_GROUP else 1

    def scoring_temperature(self, t: Trajectory) -> float | None:
        """Two-phase: Phase A scores the candidates at the temperature they were sampled at (D.4's 0.7), so TIS
        weighs only the one-step staleness; at the paper's rollout T = 1.0 scoring them at T would make most
        weights differ from 1 and cap many at C (bench/tis.py). Joint: the rollout temperature."""
        if t.group >= REFLECTION_GROUP and self.cfg.rubricem.reflection_update == "two-phase":
            return self.cfg.rubricem.reflection_temperature
        return None

    def token_advantages(self, batch: Sequence[Trajectory], rewards: Sequence[float], groups: Sequence[int],
                         train: TrainConfig) -> list[Tensor]:
        """SS-GRPO's A_{i,k} on task tokens; GRPO's group advantage of u on each reflection candidate's tokens."""
        task = [i for i, t in enumerate(batch) if t.group < REFLECTION_GROUP]
        refl = [i for i, t in enumerate(batch) if t.group >= REFLECTION_GROUP]
        out: list[Tensor | None] = [None] * len(batch)
        if task:
            adv = super().token_advantages([batch[i] for i in task], [rewards[i] for i in task],
                                           [groups[i] for i in task], train)
            for i, a in zip(task, adv, strict=True):
                out[i] = a
        if refl:
            adv_r = group_advantages([rewards[i] for i in refl], [groups[i] for i in refl], norm=train.adv_norm,
                                     eps=train.adv_eps)
            for j, i in enumerate(refl):
                out[i] = adv_r[j].expand(len(batch[i].response_ids))
        return [a for a in out if a is not None]


def candidate_utility(grade: ReflectionGrade, valid: bool, rule: str, weights: Sequence[float],
                      format_gate: bool) -> float:
    """A candidate's reward u: the judge's grade under D.6.2's weights (``weighted``) or Alg. 1's within / cross
    mean (``within-cross``). Behind arbor's ``format_gate`` a candidate without both D.6.1 blocks gets 0; without it
    (F.1.2: no format reward) it keeps the judge's score, and its format only keeps it out of the bank (D.4)."""
    if format_gate and not valid:
        return 0.0
    if rule == "within-cross":
        return within_cross_utility(grade)
    return reflection_utility(grade, weights)


def reflects_at(step: int, reflect_in: str, curriculum: str, window: int) -> bool:
    """Whether step ``step`` reflects: every step, or (``new-query``, D.4) only when its batch is fresh, i.e. the
    windowed curriculum's cross-episode steps (every step when the curriculum is off: each batch is fresh)."""
    if reflect_in == "every-step" or curriculum != "windowed":
        return True
    return windowed_batch(step, window)[1] == "cross"


def _grades_by_traj(rows: Rows) -> dict[str, list[tuple[StageRubric, RubricGrade]]]:
    """The stage judge's (rubric, grade) pairs per trajectory, from the score stage's ``stage_grades`` rows."""
    out: dict[str, list[tuple[StageRubric, RubricGrade]]] = {}
    for r in rows:
        rubric = StageRubric(r["rubric_id"], int(r["stage"]), r["title"] or "", "", int(r["weight"]),
                             int(r["polarity"]), feature=r["feature"])
        out.setdefault(r["traj_id"], []).append((rubric, RubricGrade(int(r["grade"]), r["justification"] or "")))
    return out
