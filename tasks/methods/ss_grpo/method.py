"""SS-GRPO (RubricEM §3.3, eq. 1; App. C): stage-structured GRPO with a stagewise evolving rubric judge.

Needs the staged protocol (``rollout.protocol=rubricem``: Plan / Research / Review / Answer, ``arbor.format``).

    score   per group: the judge proposes discriminative stage rubrics by contrasting the K trajectories (C.2),
            they join the question's stage buffer, every format-valid trajectory is graded 0/1/2 against the
            buffer (C.3), R_{i,k} per stage, then each stage is pruned to its cap by grade variance (C.4)
    shape   G_{i,k} = sum_j lambda_kj R_{i,j}; the trajectory's R_total is G_{i,1} (what it earns overall)
    train   A_{i,k} per stage across the group; every token of stage k carries A_{i,k}; KL to the frozen
            reference policy with beta = rubricem.kl_coef (eq. 1)

Choices where the paper leaves arbor's setting open (docs/decisions/ss-grpo-stage-structured-grpo.md):
- the persistent Answer rubric is the outcome: token F1 against the gold answers, weight ``rubricem.outcome_weight``;
- no format reward (F.1.2): every trajectory is graded, scaffold-valid or not, and its Answer rubric reads the
  answer it states (``outcome_f1``); ``rubricem.format_gate=true`` is arbor's variant, eq. 4's gate: a
  format-invalid trajectory scores 0 in every stage and is not graded;
- a failed grading call falls back to the terminal answer score only (App. E's "fall back to terminal answer score
  only"), read as: only its answer's F1 tells it apart from its group. It takes the group's mean grade under each
  rubric (``neutral_grades``), so its process counts as the group's average and its stage advantages carry no
  judge signal (with (0, 0, 0, F1) a failed call read as a bad process). A group without one graded
  trajectory has no mean: there every failed one scores (0, 0, 0, F1), which is equal across them.

The stage buffer changes only through its events (``stage_rubrics`` rows), so a resumed run replays them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar

from torch import Tensor

from arbor.config import ArborConfig
from arbor.config.train import TrainConfig
from arbor.format import STAGE_NAMES
from arbor.llm.base import CallContext, JudgeOutcome
from arbor.reward import token_f1
from arbor.tasks.methods.base import ROLLOUT, SHAPE, TRAIN, Method, Rows, Stage, StageHook, StepResources
from arbor.tasks.methods.ss_grpo.roles import STAGE_GRADES, STAGE_RUBRICS
from arbor.tasks.methods.ss_grpo.stagewise import (
    StageBuffer,
    grade_variance,
    stage_advantages,
    stage_returns,
    stage_score,
    stage_segments,
    stage_token_bounds,
)
from arbor.tasks.methods.ss_grpo.tables import TABLES
from arbor.tasks.stage_store import fault_point
from arbor.tasks.training.losses import segment_advantages
from arbor.types import LossSettings, RubricGrade, StageRubric, StageRubricDraft, Trajectory


def neutral_grades(per_traj: Sequence[Sequence[RubricGrade] | None], n_rubrics: int) -> list[float] | None:
    """Per rubric, the mean grade over the group's graded trajectories: what a trajectory whose grading failed is
    given, so that its process reads as the group's average (module docstring). None when nothing was graded."""
    graded = [g for g in per_traj if g is not None and len(g) == n_rubrics]
    if not graded or n_rubrics == 0:
        return None
    return [sum(g[j].score for g in graded) / len(graded) for j in range(n_rubrics)]


def outcome_f1(t: Trajectory, format_gate: bool) -> float:
    """The persistent Answer rubric's value: token F1 of the trajectory's answer. Behind the gate, the rollout's F1
    (0 when format-invalid); without it (F.1.2), the F1 of the answer an invalid trajectory states all the same."""
    if format_gate or t.format_valid:
        return t.f1
    return token_f1(t.answer, list(t.golds))


def trajectory_stage_scores(rubrics: Sequence[StageRubric], grades: Sequence[float] | None, f1: float,
                            passes_gate: bool, outcome_weight: float) -> list[float]:
    """R_{i,1..4} of one trajectory (C.3) from its grade per rubric (0/1/2, or the group's mean for a failed call)
    under this method's fallback (module docstring); ``passes_gate`` False (format-invalid behind
    ``rubricem.format_gate``): 0 in every stage."""
    if not passes_gate:
        return [0.0] * len(STAGE_NAMES)
    outcome = (f1, outcome_weight) if outcome_weight > 0 else None
    if grades is None:  # no grade and no group mean: the terminal answer score only
        return [0.0, 0.0, 0.0, stage_score([], [], [], outcome)]
    out = []
    for stage in range(1, len(STAGE_NAMES) + 1):
        idx = [j for j, r in enumerate(rubrics) if r.stage == stage]
        out.append(stage_score([grades[j] for j in idx], [rubrics[j].weight for j in idx],
                               [rubrics[j].polarity for j in idx], outcome if stage == len(STAGE_NAMES) else None))
    return out


class SSGRPO(Method):
    name = "ss-grpo"
    tables = TABLES
    stages: ClassVar[tuple[Stage, ...]] = (
        ROLLOUT, Stage("score", ("judge_calls", "stage_rubrics", "stage_scores", "stage_grades")), SHAPE, TRAIN)
    requires: ClassVar[dict[str, object]] = {"rollout.protocol": "rubricem"}  # the stages must exist

    def __init__(self, cfg: ArborConfig) -> None:
        super().__init__(cfg)
        self.buffer = StageBuffer(tuple(cfg.rubricem.stage_caps))

    # ------------------------------------------------------------------------------------------ resume
    def stage_hooks(self) -> dict[str, StageHook]:
        """RubricEM's stage-wise step (§3.2): generate each query's stage rubrics and grade every trajectory's
        stages against them, then shape the stage returns."""
        return {"score": self.score, "shape": self.shape}

    def restore(self, run: StepResources) -> None:
        """The stage buffer from the ``stage_rubrics`` events of every completed score stage."""
        events: Rows = []
        step = 1
        while run.store.done(step, "score"):
            events += run.store.load(step, "score", ("stage_rubrics",))["stage_rubrics"]
            step += 1
        self.buffer = StageBuffer.from_events(tuple(self.cfg.rubricem.stage_caps), events)

    # ------------------------------------------------------------------------------------------ score
    def score(self, run: StepResources, step: int, trajs: list[Trajectory]) -> dict[str, Rows]:
        """C.2 generation per group, C.3 grading per trajectory, C.4 pruning; the stage score rows."""
        rc = self.cfg.rubricem
        groups = run.groups(trajs)
        capped = run.judge_capped()

        async def generate() -> list[JudgeOutcome[list[StageRubricDraft]]]:
            return await asyncio.gather(*[
                run.judge.ask(STAGE_RUBRICS, question=g[0].question, golds=g[0].golds, trajectories=g,
                              existing=self.buffer.rubrics(g[0].question_id),
                              ctx=CallContext(run.run_id, step, "score", g[0].group))
                for g in groups])

        drafts = [JudgeOutcome([]) for _ in groups] if capped else run.run_async(generate())
        events: Rows = []
        for g, out in zip(groups, drafts, strict=True):  # applied in group order: independent of call timing
            events += self.buffer.add(step, g[0].group, g[0].question_id, out.value or [])
        buffers = [self.buffer.rubrics(g[0].question_id) for g in groups]
        passes = {t.traj_id: t.format_valid or not rc.format_gate for t in trajs}
        graded = [(gi, t) for gi, g in enumerate(groups) for t in g if passes[t.traj_id] and buffers[gi] and not capped]
        tick = run.scoring_progress("score", len(graded))

        async def grade() -> list[JudgeOutcome[list[RubricGrade]]]:
            async def one(gi: int, t: Trajectory) -> JudgeOutcome[list[RubricGrade]]:
                out = await run.judge.ask(STAGE_GRADES, question=t.question, golds=t.golds, trajectory=t,
                                          rubrics=buffers[gi],
                                          ctx=CallContext(run.run_id, step, "score", t.group, None, t.sample))
                tick()
                return out
            return await asyncio.gather(*[one(gi, t) for gi, t in graded])

        results = run.run_async(grade()) if graded else []
        fault_point(step, "score", "mid")
        got: dict[str, JudgeOutcome[list[RubricGrade]]] = {t.traj_id: r for (_, t), r in zip(graded, results,
                                                                                            strict=True)}
        decode = _decoder(run)
        rows: Rows = []
        grade_rows: Rows = []
        for gi, g in enumerate(groups):
            rubrics = buffers[gi]
            per_traj: list[list[RubricGrade] | None] = []  # None: not graded (invalid, or the call failed)
            errors: list[str | None] = []
            for t in g:
                grades: list[RubricGrade] | None = [] if passes[t.traj_id] and not rubrics else None
                err = None
                out = got.get(t.traj_id)
                if out is not None:
                    if out.value is not None and len(out.value) == len(rubrics):
                        grades = out.value
                    else:
                        err = out.error or f"{len(out.value or [])} grades for {len(rubrics)} rubrics"
                per_traj.append(grades)
                for r, gr in zip(rubrics, grades or [], strict=False):
                    grade_rows.append({"traj_id": t.traj_id, "group": t.group, "sample": t.sample,
                                       "rubric_id": r.rubric_id, "stage": r.stage, "title": r.title,
                                       "weight": r.weight, "polarity": r.polarity, "feature": r.feature,
                                       "grade": gr.score, "justification": gr.justification})
                errors.append(err)
            neutral = neutral_grades(per_traj, len(rubrics))
            scores = [trajectory_stage_scores(rubrics, [x.score for x in gr] if gr is not None else neutral,
                                              outcome_f1(t, rc.format_gate), passes[t.traj_id], rc.outcome_weight)
                      for t, gr in zip(g, per_traj, strict=True)]
            returns = [stage_returns(r, rc.lambda_matrix) for r in scores]
            advs = stage_advantages(returns, eps=self.cfg.train.adv_eps, norm=self.cfg.train.adv_norm)
            variances = {r.rubric_id: grade_variance([gr[j].score if gr else None for gr in per_traj])
                         for j, r in enumerate(rubrics)}
            events += self.buffer.prune(step, g[0].group, g[0].question_id, variances)
            for t, r, G, A, err in zip(g, scores, returns, advs, errors, strict=True):
                starts = stage_token_bounds(decode, t.response_ids, t.text)
                ends = [*starts[1:], len(t.response_ids)]
                for k in range(len(STAGE_NAMES)):
                    rows.append({
                        "traj_id": t.traj_id, "group": t.group, "sample": t.sample, "question_id": t.question_id,
                        "stage": k + 1, "stage_name": STAGE_NAMES[k], "token_start": starts[k], "token_end": ends[k],
                        "score": r[k], "stage_return": G[k], "advantage": A[k], "format_valid": t.format_valid,
                        "f1": t.f1, "n_rubrics": sum(x.stage == k + 1 for x in rubrics), "judge_error": err})
        return {"judge_calls": run.judge_rows(), "stage_rubrics": events, "stage_scores": rows,
                "stage_grades": grade_rows}

    # ------------------------------------------------------------------------------------------ shape
    def shape(self, run: StepResources, step: int, trajs: list[Trajectory]) -> dict[str, Rows]:
        """Each trajectory carries its stage starts and scores to the trainer; R_total = G_{i,1}."""
        rows = run.store.load(step, "score", ("stage_scores",))["stage_scores"]
        by_traj: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            by_traj.setdefault(r["traj_id"], []).append(r)
        out = []
        for t in trajs:
            mine = sorted(by_traj[t.traj_id], key=lambda r: r["stage"])
            t.stage_starts = [int(r["token_start"]) for r in mine]
            t.stage_rewards = [float(r["score"]) for r in mine]
            t.shaped_reward = float(mine[0]["stage_return"])
            out.append(t.to_row())
        return {"trajectories": out, "judge_calls": [], "draft_scores": []}

    # ------------------------------------------------------------------------------------------ train
    def loss_settings(self, train: TrainConfig) -> LossSettings:
        return replace(super().loss_settings(train), kl_coef=self.cfg.rubricem.kl_coef, kl_reference="frozen")

    def token_advantages(self, batch: Sequence[Trajectory], rewards: Sequence[float], groups: Sequence[int],
                         train: TrainConfig) -> list[Tensor]:
        """A_{i,k} on every token of stage k (§3.3), from the stage scores the shape stage stored."""
        lam = self.cfg.rubricem.lambda_matrix
        by_group: dict[int, list[int]] = {}
        for i, gid in enumerate(groups):
            by_group.setdefault(int(gid), []).append(i)
        out: list[Tensor | None] = [None] * len(batch)
        for idx in by_group.values():
            for i in idx:
                if batch[i].stage_rewards is None or batch[i].stage_starts is None:
                    raise ValueError(f"{batch[i].traj_id}: no stage scores (run.method=ss-grpo needs its score "
                                     "and shape stages)")
            returns = [stage_returns(batch[i].stage_rewards or [], lam) for i in idx]
            advs = stage_advantages(returns, eps=train.adv_eps, norm=train.adv_norm)
            for i, a in zip(idx, advs, strict=True):
                n = len(batch[i].response_ids)
                out[i] = segment_advantages(n, stage_segments(batch[i].stage_starts or [], n, a))
        return [a for a in out if a is not None]


def _decoder(run: StepResources) -> Any:
    tok = run.engine.tokenizer

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=False)

    return decode
