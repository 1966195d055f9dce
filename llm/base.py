"""The judge interface shared by both backends (paper §3.2-3.4, App. E): typed roles, outcomes, call ledger."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel

from arbor.config.judge import JudgeConfig
from arbor.types import (
    ReflectionGrade,
    Rubric,
    RubricDraft,
    RubricGrade,
    StageRubric,
    StageRubricDraft,
    StepLabel,
    StepRubric,
    StepVerdict,
    Trajectory,
)

T = TypeVar("T")
Q = TypeVar("Q")
Messages = list[dict[str, str]]
Winner = Literal["A", "B", "TIE"]
ROLES = ("induction", "consolidation", "pairwise", "accuracy", "rar_rubrics", "rar_rate", "stage_rubrics",
         "stage_grades", "reflection_grades", "step_labels", "step_rubric", "step_verify", "rank_actions")
RANK_LABELS = ("X", "Y", "Z", "W", "V", "U", "T", "S")  # Co-ReAct §3.1: neutral names of the shown candidates
JUDGE_CALL_COLUMNS = (
    "run_id", "step", "stage", "role", "backend", "model", "prompt_version", "cache_key", "prompt_hash", "group",
    "rubric_id", "edge", "latency_s", "prompt_tokens", "completion_tokens", "cost_usd", "cache_hit", "attempts",
    "error", "attempt_errors",
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
    edge: int | str | None = None  # index of the edge in tasks.methods.arbor.judge.sparse_edges order (stored as a string)


def unswap(winner: Winner | None, swap: bool) -> Winner | None:
    """Map a verdict about the *shown* order back to the caller's order (undo the position swap of §3.4)."""
    if winner is None or not swap or winner == "TIE":
        return winner
    return "B" if winner == "A" else "A"


def unshuffle_ranking(best_first_labels: Sequence[str], order: Sequence[int]) -> list[int]:
    """Map a ranking of the *shown* candidates back to the caller's order (Co-ReAct §3.1's random relabelling).

    Candidate ``order[j]`` was shown at position j under ``RANK_LABELS[j]``; ``best_first_labels`` is the judge's
    full ranking of those labels, best first. Returns ``ranks`` with ``ranks[i]`` the rank (1 = best) of the
    caller's candidate i. ValueError unless ``order`` is a permutation of range(n) and the ranking holds each of
    the n shown labels exactly once."""
    n = len(order)
    if sorted(order) != list(range(n)) or n > len(RANK_LABELS):
        raise ValueError(f"order {list(order)} is not a permutation of range({n}) (at most {len(RANK_LABELS)})")
    labels = RANK_LABELS[:n]
    if sorted(best_first_labels) != sorted(labels):
        raise ValueError(f"ranking {list(best_first_labels)} is not a permutation of {list(labels)}")
    ranks = [0] * n
    for position, label in enumerate(best_first_labels, start=1):
        ranks[order[labels.index(label)]] = position
    return ranks


CAPTURE: ContextVar[list[dict[str, Any]] | None] = ContextVar("arbor_judge_capture", default=None)
"""When set (in one asyncio task's context), ledger rows go to this list instead of the judge's own: the streamed
judge (``llm.stream``) hands a prefetched call's rows to the stage that claims its answer."""


class Refusal(Exception):
    """An offline heuristic cannot answer this request (e.g. a rubric it cannot read): a recorded failed call."""


def _no_texts(_q: Any) -> int:
    return 0


def _no_items(_q: Any) -> int | None:
    return None


def _never(_q: Any) -> Any:
    return None


@dataclass(frozen=True)
class Role(Generic[Q, T]):
    """One judge role, declared once (issue 31 item 1): what it is asked, how the question is written, what a reply
    must look like, and how the offline rules judge answers it. Backends are generic over roles: the
    OpenAI-compatible transport renders, sends (with ``schema`` as ``response_format``) and parses; the rules
    backend calls ``heuristic``. A method adds a role by declaring one and ``register``-ing it (``llm/roles/``)."""

    name: str
    request: type[Q]  # the call's inputs, a frozen dataclass: Judge.ask(name, **fields) builds it
    render: Callable[[Q, int], tuple[str, Messages]]  # (prompt version, messages) with each text at a token budget
    parse: Callable[[str, Q], T]  # the value of a reply, or parse.InvalidOutput
    heuristic: Callable[[Q, Any], T]  # the offline rules judge's answer from (request, JudgeConfig); may Refuse
    identity: Callable[[Q], tuple[Any, ...]]  # what the heuristic's answer depends on (the rules ledger's key)
    schema: type[BaseModel] | None = None  # the reply's JSON schema (None: a free-text reply, e.g. accuracy)
    texts: Callable[[Q], int] = _no_texts  # compactable texts in the prompt (judge.context_tokens splits by them)
    items: Callable[[Q], int | None] = _no_items  # entries the reply must hold (with ``reply``: its max_tokens)
    reply: tuple[int, int] | None = None  # (fixed, per item) reply tokens; None: judge.max_tokens
    skip: Callable[[Q], T | None] = _never  # the answer when there is nothing to judge (no call is made)
    # the reply schema narrowed to one request (how many items, which indices or labels): llm.parse.exactly;
    # None for a request whose reply is free text (no response_format is sent)
    narrow: Callable[[Q, dict[str, Any]], dict[str, Any] | None] | None = None

    def reply_budget(self, items: int) -> int:
        """max_tokens a reply of ``items`` entries needs (``reply``)."""
        fixed, per = self.reply or (0, 0)
        return fixed + per * items


REGISTRY: dict[str, Role[Any, Any]] = {}


def register(role: Role[Q, T]) -> Role[Q, T]:
    """Add a role to the registry (by name; a second declaration of a name is a ValueError)."""
    if role.name in REGISTRY and REGISTRY[role.name] is not role:
        raise ValueError(f"judge role {role.name!r} is already registered")
    REGISTRY[role.name] = role
    return role


def role_of(name: str) -> Role[Any, Any]:
    """The registered role ``name`` (KeyError naming the known roles)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"no judge role {name!r}; registered: {', '.join(sorted(REGISTRY))}") from None


class Judge(ABC):
    """One object per run; roles are coroutines, safe to gather concurrently.

    Every role goes through ``ask(name, **request)``; a backend implements ``_answer`` once for all roles. The
    typed methods below (``induce``, ``pairwise``, ...) are the built-in roles' calls, written once here."""

    backend: str = ""
    answers: frozenset[str] | None = None  # the roles this backend answers (None: every registered role)

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
        sink = CAPTURE.get()
        (self._calls if sink is None else sink).append({c: full.get(c) for c in JUDGE_CALL_COLUMNS})

    # ---- every role -----------------------------------------------------------------------------------------
    async def ask(self, name: str, /, *, ctx: CallContext | None = None, **fields: Any) -> JudgeOutcome[Any]:
        """Role ``name`` on the request built from ``fields``: its ``skip`` answer without a call, else the
        backend's answer."""
        role = role_of(name)
        if self.answers is not None and name not in self.answers:
            raise NotImplementedError(f"judge backend {self.backend!r} has no {name} role")
        request = role.request(**fields)
        empty = role.skip(request)
        if empty is not None:
            return JudgeOutcome(empty, None, 0, False)
        return await self._answer(role, request, ctx)

    @abstractmethod
    async def _answer(self, role: Role[Q, T], request: Q, ctx: CallContext | None) -> JudgeOutcome[T]:
        """The backend's answer to one request of one role, recorded in the ledger."""

    # ---- ARBOR's roles (App. E) -----------------------------------------------------------------------------
    async def induce(self, question: str, golds: Sequence[str] | None, trajectories: Sequence[Trajectory],
                     anchors: Mapping[str, Any], existing: Sequence[Rubric | RubricDraft], *,
                     ctx: CallContext | None = None) -> JudgeOutcome[list[RubricDraft]]:
        """E.1 contrastive induction from ``tasks.induction.select_anchors`` output; mode ``unlabeled`` uses the
        App. A.1 variant, mode ``skip`` returns ``[]`` without a call. 0-3 drafts; ``[]`` is a valid answer."""
        return await self.ask("induction", question=question, golds=golds, trajectories=trajectories,
                              anchors=anchors, existing=existing, ctx=ctx)

    async def consolidate(self, candidates_by_query: Mapping[str, Sequence[Rubric | RubricDraft]],
                          existing: Sequence[Rubric | RubricDraft], *,
                          ctx: CallContext | None = None) -> JudgeOutcome[list[RubricDraft]]:
        """E.2: 0-2 new common rubrics abstracted from drafts grouped by query, not duplicating ``existing``."""
        return await self.ask("consolidation", candidates_by_query=candidates_by_query, existing=existing, ctx=ctx)

    async def pairwise(self, question: str, traj_a: Trajectory, traj_b: Trajectory, rubric: Rubric | RubricDraft,
                       *, swap: bool = False, ctx: CallContext | None = None) -> JudgeOutcome[Winner]:
        """E.3 under one criterion. ``swap=True`` shows ``traj_b`` as Response A (the call site draws it with
        ``arbor.seeding.coin(seed, step, group, rubric_id, edge)``); the returned winner always refers to the
        caller's (traj_a, traj_b) order, so the swap is undone here. value None = failed, never a tie."""
        shown_a, shown_b = (traj_b, traj_a) if swap else (traj_a, traj_b)
        out = await self.ask("pairwise", question=question, shown_a=shown_a, shown_b=shown_b, rubric=rubric, ctx=ctx)
        return JudgeOutcome(unswap(out.value, swap), out.error, out.attempts, out.cache_hit)

    async def accuracy(self, question: str, golds: Sequence[str], prediction: str | None, *,
                       ctx: CallContext | None = None) -> JudgeOutcome[bool]:
        """E.4: True iff the prediction matches any golden alias (the literal verdict Correct)."""
        return await self.ask("accuracy", question=question, golds=golds, prediction=prediction, ctx=ctx)

    # ---- the RaR baseline (C.3) -----------------------------------------------------------------------------
    async def rar_rubrics(self, question: str, golds: Sequence[str], *,
                          ctx: CallContext | None = None) -> JudgeOutcome[list[str]]:
        """RaR baseline (C.3): 5-10 reference-conditioned rubric items from question and reference answer only."""
        return await self.ask("rar_rubrics", question=question, golds=golds, ctx=ctx)

    async def rar_rate(self, question: str, trajectory: Trajectory, items: Sequence[str], *,
                       ctx: CallContext | None = None) -> JudgeOutcome[int]:
        """RaR baseline (C.3): holistic 1-10 rating; callers normalise with (rating - 1) / 9."""
        return await self.ask("rar_rate", question=question, trajectory=trajectory, items=items, ctx=ctx)

    # ---- RubricEM's roles (issue 15; App. C, D.6.2) -------------------------------------------------------------
    async def stage_rubrics(self, question: str, golds: Sequence[str] | None, trajectories: Sequence[Trajectory],
                            existing: Sequence[StageRubric], *,
                            ctx: CallContext | None = None) -> JudgeOutcome[list[StageRubricDraft]]:
        """C.2: new discriminative stage rubrics from contrasting one question's group (targets: 1-4 for stages
        1-3, 2-5 for stage 4; weight 1-3; positive or negative), none repeating ``existing``; ``[]`` is valid.
        Fewer than two trajectories: ``[]`` without a call (nothing to contrast)."""
        return await self.ask("stage_rubrics", question=question, golds=golds, trajectories=trajectories,
                              existing=existing, ctx=ctx)

    async def stage_grades(self, question: str, golds: Sequence[str] | None, trajectory: Trajectory,
                           rubrics: Sequence[StageRubric], *,
                           ctx: CallContext | None = None) -> JudgeOutcome[list[RubricGrade]]:
        """C.3: one 0/1/2 grade per rubric, in ``rubrics`` order (a negative rubric's grade is how fully the flaw
        is present; the caller inverts it). No rubrics: ``[]`` without a call."""
        return await self.ask("stage_grades", question=question, golds=golds, trajectory=trajectory,
                              rubrics=rubrics, ctx=ctx)

    async def reflection_grades(self, question: str, golds: Sequence[str] | None, trajectory: Trajectory,
                                graded: Sequence[tuple[StageRubric, RubricGrade]], candidates: Sequence[str], *,
                                ctx: CallContext | None = None) -> JudgeOutcome[list[ReflectionGrade]]:
        """D.6.2: one grade per reflection candidate (diagnosis, specificity, scope in [0, 1]), judged with the
        trajectory's stage grades and their justifications as privileged context. No candidates: ``[]``."""
        return await self.ask("reflection_grades", question=question, golds=golds, trajectory=trajectory,
                              graded=graded, candidates=candidates, ctx=ctx)

    # ---- ARCO's teacher -------------------------------------------------------------------------------------------
    async def step_labels(self, question: str, golds: Sequence[str] | None, trajectory: Trajectory,
                          steps: Sequence[tuple[str, str]], k: int, *,
                          ctx: CallContext | None = None) -> JudgeOutcome[list[StepLabel]]:
        """ARCO's teacher: for each step (its action, the result that followed) k criteria and a score in [-1, 1]
        for each, in step order, knowing the whole trajectory and its outcome. No steps: ``[]``."""
        return await self.ask("step_labels", question=question, golds=golds, trajectory=trajectory, steps=steps,
                              k=k, ctx=ctx)

    # ---- Co-ReAct's roles (its §3.1-3.3, App. A) -------------------------------------------------------------------
    async def step_rubric(self, question: str, history: str, *, tool_calls: int, max_tool_calls: int,
                          ctx: CallContext | None = None) -> JudgeOutcome[StepRubric]:
        """§3.2 (prompt-only): 3-5 weighted conditions "[weight] condition" the NEXT action should meet (positive
        weights summing to about 1, negative ones for flaws to avoid) and one recommended action, from the question
        and the agent's history so far; ``tool_calls`` of ``max_tool_calls`` searches made set the phase (none yet:
        broaden the search, never answer; at most one left: answer if the evidence suffices)."""
        return await self.ask("step_rubric", question=question, history=history, tool_calls=tool_calls,
                              max_tool_calls=max_tool_calls, ctx=ctx)

    async def step_verify(self, question: str, history: str, action: str, rubric: StepRubric, *,
                          ctx: CallContext | None = None) -> JudgeOutcome[StepVerdict]:
        """§3.3's verifier: one verdict per rubric item in order (for a negative item: whether the flaw is
        present) and one short feedback sentence naming the unmet items ("" when all are met). A rubric without
        items: an empty verdict without a call."""
        return await self.ask("step_verify", question=question, history=history, action=action, rubric=rubric,
                              ctx=ctx)

    async def rank_actions(self, question: str, golds: Sequence[str] | None, history: str,
                           candidates: Sequence[str], *, order: Sequence[int], rationale: bool = True,
                           ctx: CallContext | None = None) -> JudgeOutcome[list[int]]:
        """§3.1's list-wise expert ranking of candidate next actions. ``order`` is a permutation of
        range(len(candidates)) drawn by the caller: candidate ``order[j]`` is shown at position j as
        ``RANK_LABELS[j]``. Returns ``ranks`` in the caller's order (``ranks[i]``: rank of ``candidates[i]``,
        1 = best); the relabelling is undone here. ``rationale`` (App. A): the judge writes its reasoning first and
        the ranking is read from its final answer (``parse.parse_final_ranking``); False: a bare JSON ranking. No
        candidates: ``[]`` without a call. ValueError on more candidates than labels or an ``order`` that is no
        permutation."""
        if len(candidates) > len(RANK_LABELS):
            raise ValueError(f"rank_actions: {len(candidates)} candidates, at most {len(RANK_LABELS)} labels")
        if sorted(order) != list(range(len(candidates))):
            raise ValueError(f"rank_actions: order {list(order)} is not a permutation of range({len(candidates)})")
        if not candidates:
            return JudgeOutcome([], None, 0, False)
        shown = [candidates[i] for i in order]
        out = await self.ask("rank_actions", question=question, golds=golds, history=history, shown=shown,
                             rationale=rationale, ctx=ctx)
        ranks = None if out.value is None else unshuffle_ranking(out.value, order)
        return JudgeOutcome(ranks, out.error, out.attempts, out.cache_hit)

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release network clients (openai backend)."""
