"""ARCO: a co-evolving rubric model mu turns the outcome into per-step rewards, with no judge in the loop
after its warm-up. Facts from the ARCO paper's review and its authors' code; choices in docs/decisions/arco-a-co-evolving-rubric-model.md.

    score        split each trajectory into steps (its policy turns, ``arbor.format.turn_spans``); mu writes K
                 criteria per step (greedy; ``arco.criteria``: generate | static | none) and scores them,
                 s̄_t = mean_k s_tk. During the teacher warm-up the judge also labels every step (``step_labels``),
                 projected so that sum_t mean_k x_tk = R.
    shape        R_total = R (the base reward). Sparse phase: A = R - group mean on every step. Dense phase
                 (``arco.dense_start``): A_t = c (G_t - b_bucket), G_t the reward-to-go of the step scores.
    mu_update    mu's update on the step's rollouts (the scores it gave them before updating): warm-up steps learn
                 the teacher (CE + 10 MSE), later ones the decomposition loss w(R)(sum_t s̄_t - R)^2 + beta KL.
                 Neither update reads the other's result, so running mu's before the policy's changes no number.
    train        per-turn advantages on the policy's tokens; KL to the frozen start in the dense phase only.

mu has its own checkpoints beside the policy's (``{checkpoint dir}/mu``, same period and retention); on resume
it loads the latest and replays the stored updates after it (``restore``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from torch import Tensor

from arbor.config import ArborConfig
from arbor.config.train import TrainConfig
from arbor.format import turn_spans
from arbor.llm.base import CallContext, JudgeOutcome
from arbor.tasks.methods.arco import equations as arco
from arbor.tasks.methods.arco.roles import STEP_LABELS
from arbor.tasks.methods.arco.tables import TABLES
from arbor.tasks.methods.base import ROLLOUT, TRAIN, Method, Rows, Stage, StageHook, StepResources
from arbor.tasks.stage_store import fault_point
from arbor.tasks.training.checkpoint import checkpoint_due, run_checkpoint_root
from arbor.types import LossSettings, StepLabel, Trajectory


@dataclass
class Step:
    """One step of a trajectory as mu sees it."""

    start: int
    end: int
    kind: str  # search | finish | other
    action: str
    result: str  # the tool result that followed (empty after the last step)
    history: str  # everything the response showed before the step
    searches_left: int


def trajectory_steps(t: Trajectory, decode: Any, max_searches: int) -> list[Step]:
    """The policy turns of ``t`` with their text, the result after each and the searches left before each."""
    spans = turn_spans(t.loss_mask)
    out = []
    used = 0
    for i, (a, b) in enumerate(spans):
        nxt = spans[i + 1][0] if i + 1 < len(spans) else len(t.response_ids)
        action = decode(t.response_ids[a:b])
        kind = arco.step_kind(action)
        out.append(Step(a, b, kind, action, decode(t.response_ids[b:nxt]), decode(t.response_ids[:a]),
                        max(0, max_searches - used)))
        used += kind == "search"
    return out


class ARCO(Method):
    name = "arco"
    tables = TABLES
    stages: ClassVar[tuple[Stage, ...]] = (
        ROLLOUT, Stage("score", ("judge_calls", "mu_scores")), Stage("shape", ("trajectories", "turn_advantages"),
                                                                     retries=1),
        Stage("mu_update", ("mu_updates",)), TRAIN)

    def __init__(self, cfg: ArborConfig) -> None:
        super().__init__(cfg)
        self.mu: Any = None  # tasks.rubric_model.RubricModelTrainer, built by restore (the trainer's copy has none)
        self.dense_start_step = cfg.arco.dense_start(cfg.run.steps)
        self.warmup_steps = cfg.arco.warmup(cfg.run.steps)

    # ------------------------------------------------------------------------------------------ resume
    def stage_hooks(self) -> dict[str, StageHook]:
        """ARCO's step: mu scores each turn against its criteria (the teacher labels the warm-up steps), the turn
        credit shapes the advantages, and mu is updated on the step's labels."""
        return {"score": self.score, "shape": self.shape, "mu_update": self.mu_update}

    def restore(self, run: StepResources) -> None:
        """mu from its latest checkpoint, then every stored update after it replayed in order."""
        from arbor.tasks.methods.arco.rubric_model import RubricModelTrainer

        home = Path(run.home)
        self.mu = RubricModelTrainer(self.cfg, Path(run.trainer.model_path),
                                     run_checkpoint_root(self.cfg.checkpoint, self.cfg.run.run_id, home) / "mu")
        step = self.mu.load_latest() + 1
        while run.store.done(step, "mu_update"):
            self._update(run, step)
            step += 1

    def after_train(self, run: StepResources, step: int, metrics: dict[str, float]) -> None:
        if checkpoint_due(step, self.cfg.checkpoint.every, self.cfg.run.steps):
            self.mu.save(step, self.cfg.checkpoint.keep_last, metrics)

    # ------------------------------------------------------------------------------------------ score
    def _examples(self, run: StepResources, trajs: Sequence[Trajectory]) -> tuple[list[list[Step]], list[list[int]]]:
        from arbor.tasks.methods.arco.rubric_model import encode_prompt

        tok = self.mu.tokenizer

        def decode(ids: list[int]) -> str:
            return tok.decode(ids, skip_special_tokens=False)

        steps = [trajectory_steps(t, decode, self.cfg.rollout.max_searches) for t in trajs]
        prompts = [[encode_prompt(tok, t.question, s.history, s.searches_left, s.action, self.cfg.arco.k,
                                  self.mu.prompt_tokens) for s in ss] for t, ss in zip(trajs, steps,
                                                                                               strict=True)]
        return steps, prompts

    def score(self, run: StepResources, step: int, trajs: list[Trajectory]) -> dict[str, Rows]:
        """mu's criteria and scores for every step (and, during the warm-up, the teacher's labels)."""
        from arbor.tasks.methods.arco.rubric_model import MuExample

        ac = self.cfg.arco
        steps, prompts = self._examples(run, trajs)
        flat = [p for ps in prompts for p in ps]
        if ac.criteria == "generate":
            crit = self.mu.write_criteria(flat)
        elif ac.criteria == "static":
            static = list(self.mu.tokenizer.encode(ac.static_criteria, add_special_tokens=False))
            crit = [static for _ in flat]
        else:
            crit = [[] for _ in flat]
        scores = self.mu.score([MuExample(p, c) for p, c in zip(flat, crit, strict=True)])
        labels: list[JudgeOutcome[list[StepLabel]] | None] = [None] * len(trajs)
        if step <= self.warmup_steps and not run.judge_capped():
            async def teach() -> list[JudgeOutcome[list[StepLabel]]]:
                return await asyncio.gather(*[
                    run.judge.ask(STEP_LABELS, question=t.question, golds=t.golds, trajectory=t,
                                  steps=[(s.action, s.result) for s in ss], k=ac.k,
                                  ctx=CallContext(run.run_id, step, "score", t.group, None, t.sample))
                    for t, ss in zip(trajs, steps, strict=True)])
            labels = list(run.run_async(teach()))
        fault_point(step, "score", "mid")
        rows: Rows = []
        i = 0
        for t, ss, got in zip(trajs, steps, labels, strict=True):
            buckets = arco.step_buckets([s.kind for s in ss])
            taught = got is not None and got.value is not None and len(got.value) == len(ss)
            projected, lam = (arco.project_labels([list(x.scores) for x in got.value], t.base_reward)  # type: ignore[union-attr]
                              if taught and ss else ([], None))
            for j, s in enumerate(ss):
                sc = scores[i]
                rows.append({
                    "traj_id": t.traj_id, "group": t.group, "sample": t.sample, "question_id": t.question_id,
                    "turn": j, "kind": s.kind, "bucket": buckets[j], "token_start": s.start, "token_end": s.end,
                    "searches_left": s.searches_left, "criteria": self.mu.tokenizer.decode(crit[i]),
                    "criteria_ids": crit[i], "scores": sc, "step_score": sum(sc) / len(sc),
                    "outcome": t.base_reward, "mu_version": self.mu.version,
                    "teacher_criteria": list(got.value[j].criteria) if taught else None,  # type: ignore[union-attr]
                    "teacher_scores": list(got.value[j].scores) if taught else None,  # type: ignore[union-attr]
                    "teacher_projected": projected[j] if taught else None, "teacher_lambda": lam,
                    "judge_error": (got.error or f"{len(got.value or [])} labels for {len(ss)} steps")
                    if got is not None and not taught else None})
                i += 1
        return {"judge_calls": run.judge_rows(), "mu_scores": rows}

    # ------------------------------------------------------------------------------------------ shape
    def shape(self, run: StepResources, step: int, trajs: list[Trajectory]) -> dict[str, Rows]:
        """R_total = R; each trajectory carries its turn starts and per-turn advantages to the trainer."""
        ac = self.cfg.arco
        by_traj: dict[str, list[dict[str, Any]]] = {}
        for r in run.store.load(step, "score", ("mu_scores",))["mu_scores"]:
            by_traj.setdefault(r["traj_id"], []).append(r)
        mine = [sorted(by_traj.get(t.traj_id, []), key=lambda r: r["turn"]) for t in trajs]
        means = [[float(r["step_score"]) for r in rs] for rs in mine]
        buckets = [[str(r["bucket"]) for r in rs] for rs in mine]
        returns = [arco.reward_to_go(m, ac.signal, ac.gamma) for m in means]
        dense = step >= self.dense_start_step
        if dense:
            base = arco.bucket_baselines(returns, buckets, ac.baseline)
            advs = arco.dense_advantages(returns, base, ac.c)
        else:
            sparse = arco.sparse_advantages([t.base_reward for t in trajs], [t.group for t in trajs])
            base = [[None] * len(m) for m in means]  # type: ignore[list-item]
            advs = [[a] * len(m) for a, m in zip(sparse, means, strict=True)]
        out: Rows = []
        turn_rows: Rows = []
        for t, rs, G, b, A in zip(trajs, mine, returns, base, advs, strict=True):
            t.shaped_reward = t.base_reward
            t.stage_starts = [int(r["token_start"]) for r in rs]
            t.stage_rewards = [float(a) for a in A]
            out.append(t.to_row())
            for r, g, bb, a in zip(rs, G, b, A, strict=True):
                turn_rows.append({"traj_id": t.traj_id, "group": t.group, "sample": t.sample, "turn": r["turn"],
                                  "kind": r["kind"], "bucket": r["bucket"], "step_score": r["step_score"],
                                  "reward_to_go": g, "baseline": bb, "advantage": a,
                                  "phase": "dense" if dense else "sparse", "outcome": t.base_reward})
        return {"trajectories": out, "turn_advantages": turn_rows}

    # ------------------------------------------------------------------------------------------ mu's update
    def mu_update(self, run: StepResources, step: int, trajs: list[Trajectory]) -> dict[str, Rows]:
        return {"mu_updates": [self._update(run, step)]}

    def _update(self, run: StepResources, step: int) -> dict[str, Any]:
        """mu's update of ``step`` from what the score stage stored (the same on a replay)."""
        from arbor.tasks.methods.arco.rubric_model import MuExample, criteria_text

        ac = self.cfg.arco
        trajs = sorted(run.trajectories(step, "rollout", "rollouts"), key=lambda t: (t.group, t.sample))
        index = {t.traj_id: i for i, t in enumerate(trajs)}
        rows = sorted(run.store.load(step, "score", ("mu_scores",))["mu_scores"],
                      key=lambda r: (index[r["traj_id"]], r["turn"]))
        _, prompts = self._examples(run, trajs)
        outcomes = [t.base_reward for t in trajs]
        warm = step <= self.warmup_steps
        examples = []
        for r in rows:
            ti = index[r["traj_id"]]
            prompt = prompts[ti][int(r["turn"])]
            if warm:
                if r["teacher_projected"] is None:
                    continue
                if ac.criteria == "generate":
                    ids = list(self.mu.tokenizer.encode(criteria_text(r["teacher_criteria"]),
                                                        add_special_tokens=False))
                    eos = self.mu.tokenizer.eos_token_id
                    crit = ids + ([eos] if eos is not None else [])
                else:
                    crit = list(r["criteria_ids"])
                examples.append(MuExample(prompt, crit, ti, [float(x) for x in r["teacher_projected"]]))
            else:
                examples.append(MuExample(prompt, list(r["criteria_ids"]), ti))
        calib = _calibration(rows, index, outcomes, ac.positive_threshold)
        row: dict[str, Any] = {"phase": "warmup" if warm else "decomposition", "n_trajectories": len(trajs),
                               "n_steps": len(examples), "mu_version_before": self.mu.version, **calib}
        if not examples:
            self.mu.version += 1
            return {**row, "loss": None}
        if warm:
            got = self.mu.update_warmup(examples, step)
            if step == self.warmup_steps:
                self.mu.snapshot_reference()
        else:
            if not self.mu.reference_taken:
                self.mu.snapshot_reference()
            got = self.mu.update_decompose(examples, outcomes, step)
        return {**row, **got}

    def step_metrics(self, run: StepResources, step: int, train_metrics: dict[str, float]) -> dict[str, float | None]:
        rows = run.store.load(step, "mu_update", ("mu_updates",))["mu_updates"]
        return {"mu_loss": rows[0].get("loss") if rows else None}

    # ------------------------------------------------------------------------------------------ train
    def loss_settings(self, train: TrainConfig) -> LossSettings:
        return replace(super().loss_settings(train), kl_coef=self.cfg.arco.kl_coef_dense, kl_reference="frozen")

    def kl_coef_at(self, step: int, train: TrainConfig) -> float:
        return self.cfg.arco.kl_coef_dense if step >= self.dense_start_step else 0.0

    def token_advantages(self, batch: Sequence[Trajectory], rewards: Sequence[float], groups: Sequence[int],
                         train: TrainConfig) -> list[Tensor]:
        """Sparse phase: A = R - group mean on every token (R: ``update_rewards``' R_i); dense
        phase: A_t on every token of turn t (stored by the shape stage)."""
        if batch and batch[0].step < self.dense_start_step:
            sparse = arco.sparse_advantages(rewards, groups)
            return [arco.turn_token_advantages(len(t.response_ids), [(0, len(t.response_ids))], [a])
                    for t, a in zip(batch, sparse, strict=True)]
        out = []
        for t in batch:
            if t.stage_starts is None or t.stage_rewards is None:
                raise ValueError(f"{t.traj_id}: no turn advantages (run.method=arco needs its score and shape stages)")
            ends = [*t.stage_starts[1:], len(t.response_ids)]
            out.append(arco.turn_token_advantages(len(t.response_ids), list(zip(t.stage_starts, ends, strict=True)),
                                                  t.stage_rewards))
        return out


def _calibration(rows: Rows, index: dict[str, int], outcomes: Sequence[float], threshold: float) -> dict[str, Any]:
    """Before the update: mean sum_t s̄_t and mean |sum_t s̄_t - R| over positive and negative trajectories."""
    totals = [0.0] * len(outcomes)
    for r in rows:
        totals[index[r["traj_id"]]] += float(r["step_score"])
    out: dict[str, Any] = {}
    for name, keep in (("pos", lambda R: R > threshold), ("neg", lambda R: R <= threshold)):
        idx = [i for i, R in enumerate(outcomes) if keep(R)]
        out[f"n_{name}"] = len(idx)
        out[f"mean_sum_{name}"] = sum(totals[i] for i in idx) / len(idx) if idx else None
        out[f"abs_error_{name}"] = sum(abs(totals[i] - outcomes[i]) for i in idx) / len(idx) if idx else None
    return out
