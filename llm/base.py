"""The judge interface shared by both backends (paper §3.2-3.4, App. E): typed roles, outcomes, call ledger."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from arbor.config.judge import JudgeConfig
from arbor.tasks.types import (
    ReflectionGrade,
    Rubric,
    RubricDraft,
    RubricGrade,
    StageRubric,
    StageRubricDraft,
    StepLabel,
    Trajectory,
)

T = TypeVar("T")
Winner = Literal["A", "B", "TIE"]
ROLES = ("induction", "consolidation", "pairwise", "accuracy", "rar_rubrics", "rar_rate", "stage_rubrics",
         "stage_grades", "reflection_grades", "step_labels")
JUDGE_CALL_COLUMNS = (
    "run_id", "step", "stage", "role", "backend", "model", "prompt_version", "cache_key", "prompt_hash", "group",
    "rubric_id", "edge", "latency_s", "prompt_tokens", "completion_tokens", "cost_usd", "cache_hit", "attempts",
    "error",
)


@dataclass(frozen=True)
class JudgeOutcome(Generic[T]):
    """A judge answer: ``value`` is None when the call failed (then ``error`` names the error class).

    A failed pairwise call is *not* a tie: callers leave failed edges out (rubric memory issue).
    """

    value: T | None
    error: str | None = None
    attempts: int = 0
    cache_hit: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class CallContext:
    """Where a call comes from; copied onto its ``judge_calls`` row."""

    run_id: str | None = None
    step: int | None = None
    stage: str | None = None
    group: int | None = None
    rubric_id: str | None = None
    edge: int | str | None = None  # index of the edge in tasks.judge.sparse_edges order (stored as a string)


def unswap(winner: Winner | None, swap: bool) -> Winner | None:
    """Map a verdict about the *shown* order back to the caller's order (undo the position swap of §3.4)."""
    if winner is None or not swap or winner == "TIE":
        return winner
    return "B" if winner == "A" else "A"


class Judge(ABC):
    """One object per run; methods are coroutines, safe to gather concurrently."""

    backend: str = ""

    def __init__(self, cfg: JudgeConfig, *, home: Path):
        self.cfg = cfg
        self.home = Path(home)
        self._calls: list[dict[str, Any]] = []
        self.total_cost_usd = 0.0

    # ---- ledger -------------------------------------------------------------------------------------------
    def drain_calls(self) -> list[dict[str, Any]]:
        """Every call since the last drain (hits and misses), as ``judge_calls`` rows (docs/interfaces.md)."""
        out, self._calls = self._calls, []
        return out

    def _record(self, ctx: CallContext | None, **row: Any) -> None:
        ctx = ctx or CallContext()
        full = {
            "run_id": ctx.run_id, "step": ctx.step, "stage": ctx.stage, "group": ctx.group,
            "rubric_id": ctx.rubric_id, "edge": None if ctx.edge is None else str(ctx.edge),
            "backend": self.backend,
        }
        full.update(row)
        self._calls.append({c: full.get(c) for c in JUDGE_CALL_COLUMNS})

    # ---- roles --------------------------------------------------------------------------------------------
    @abstractmethod
    async def induce(self, question: str, golds: Sequence[str] | None, trajectories: Sequence[Trajectory],
                     anchors: Mapping[str, Any], existing: Sequence[Rubric | RubricDraft], *,
                     ctx: CallContext | None = None) -> JudgeOutcome[list[RubricDraft]]:
        """E.1 contrastive induction from ``tasks.induction.select_anchors`` output; mode ``unlabeled`` uses the
        App. A.1 variant, mode ``skip`` returns ``[]`` without a call. 0-3 drafts; ``[]`` is a valid answer."""

    @abstractmethod
    async def consolidate(self, candidates_by_query: Mapping[str, Sequence[Rubric | RubricDraft]],
                          existing: Sequence[Rubric | RubricDraft], *,
                          ctx: CallContext | None = None) -> JudgeOutcome[list[RubricDraft]]:
        """E.2: 0-2 new common rubrics abstracted from drafts grouped by query, not duplicating ``existing``."""

    async def pairwise(self, question: str, traj_a: Trajectory, traj_b: Trajectory, rubric: Rubric | RubricDraft,
                       *, swap: bool = False, ctx: CallContext | None = None) -> JudgeOutcome[Winner]:
        """E.3 under one criterion. ``swap=True`` shows ``traj_b`` as Response A (the call site draws it with
        ``arbor.seeding.coin(seed, step, group, rubric_id, edge)``); the returned winner always refers to the
        caller's (traj_a, traj_b) order, so the swap is undone here. value None = failed, never a tie."""
        shown_a, shown_b = (traj_b, traj_a) if swap else (traj_a, traj_b)
        out = await self._pairwise_shown(question, shown_a, shown_b, rubric, ctx=ctx)
        return JudgeOutcome(unswap(out.value, swap), out.error, out.attempts, out.cache_hit)

    @abstractmethod
    async def _pairwise_shown(self, question: str, shown_a: Trajectory, shown_b: Trajectory,
                              rubric: Rubric | RubricDraft, *, ctx: CallContext | None) -> JudgeOutcome[Winner]: ...

    @abstractmethod
    async def accuracy(self, question: str, golds: Sequence[str], prediction: str | None, *,
                       ctx: CallContext | None = None) -> JudgeOutcome[bool]:
        """E.4: True iff the prediction matches any golden alias (the literal verdict Correct)."""

    @abstractmethod
    async def rar_rubrics(self, question: str, golds: Sequence[str], *,
                          ctx: CallContext | None = None) -> JudgeOutcome[list[str]]:
        """RaR baseline (C.3): 5-10 reference-conditioned rubric items from question and reference answer only."""

    @abstractmethod
    async def rar_rate(self, question: str, trajectory: Trajectory, items: Sequence[str], *,
                       ctx: CallContext | None = None) -> JudgeOutcome[int]:
        """RaR baseline (C.3): holistic 1-10 rating; callers normalise with (rating - 1) / 9."""

    # ---- RubricEM roles (issue 15; App. C, D.6.2): not abstract, so a plug-in judge without them still loads
    async def stage_rubrics(self, question: str, golds: Sequence[str] | None, trajectories: Sequence[Trajectory],
                            existing: Sequence[StageRubric], *,
                            ctx: CallContext | None = None) -> JudgeOutcome[list[StageRubricDraft]]:
        """C.2: new discriminative stage rubrics from contrasting one question's group (targets: 1-4 for stages
        1-3, 2-5 for stage 4; weight 1-3; positive or negative), none repeating ``existing``; ``[]`` is valid."""
        raise NotImplementedError(f"judge backend {self.backend!r} has no stage_rubrics role (RubricEM)")

    async def stage_grades(self, question: str, golds: Sequence[str] | None, trajectory: Trajectory,
                           rubrics: Sequence[StageRubric], *,
                           ctx: CallContext | None = None) -> JudgeOutcome[list[RubricGrade]]:
        """C.3: one 0/1/2 grade per rubric, in ``rubrics`` order (a negative rubric's grade is how fully the flaw
        is present; the caller inverts it)."""
        raise NotImplementedError(f"judge backend {self.backend!r} has no stage_grades role (RubricEM)")

    async def reflection_grades(self, question: str, golds: Sequence[str] | None, trajectory: Trajectory,
                                graded: Sequence[tuple[StageRubric, RubricGrade]], candidates: Sequence[str], *,
                                ctx: CallContext | None = None) -> JudgeOutcome[list[ReflectionGrade]]:
        """D.6.2: one grade per reflection candidate (diagnosis, specificity, scope in [0, 1]), judged with the
        trajectory's stage grades and their justifications as privileged context."""
        raise NotImplementedError(f"judge backend {self.backend!r} has no reflection_grades role (RubricEM)")

    async def step_labels(self, question: str, golds: Sequence[str] | None, trajectory: Trajectory,
                          steps: Sequence[tuple[str, str]], k: int, *,
                          ctx: CallContext | None = None) -> JudgeOutcome[list[StepLabel]]:
        """ARCO's teacher: for each step (its action, the result that followed) k criteria and a score in [-1, 1]
        for each, in step order, knowing the whole trajectory and its outcome."""
        raise NotImplementedError(f"judge backend {self.backend!r} has no step_labels role (ARCO)")

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release network clients (openai backend)."""
