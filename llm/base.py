"""The judge interface shared by both backends (paper §3.2-3.4, App. E): typed roles, outcomes, call ledger."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from arbor.config.judge import JudgeConfig

T = TypeVar("T")
Q = TypeVar("Q")
Messages = list[dict[str, str]]
JUDGE_CALL_COLUMNS = (
    "run_id", "step", "stage", "role", "backend", "model", "prompt_version", "cache_key", "prompt_hash", "group",
    "rubric_id", "edge", "latency_s", "prompt_tokens", "completion_tokens", "cost_usd", "cache_hit", "attempts",
    "error", "attempt_errors", "refusal", "attempt_replies",
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
    """One judge role, declared once: what it is asked, how the question is written, what a reply
    must look like, and how the offline rules judge answers it. Backends are generic over roles: the
    OpenAI-compatible transport renders, sends (with ``schema`` as ``response_format``) and parses; the rules
    backend calls ``heuristic``. A method adds a role by declaring one and ``register``-ing it (``tasks/methods/<m>/roles.py``)."""

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


BACKENDS: dict[str, type[Judge]] = {}
"""Judge backends known by a short name (``judge.backend``) beside ``openai`` and ``rules``, registered by the package
that defines them (``register_backend``); e.g. ARBOR's ``world`` and ``random`` judges, which a flow loads with
``arbor.tasks.methods.load_judges()``. The machinery knows none of them by name."""


def register_backend(cls: type[Judge]) -> type[Judge]:
    """Class decorator: make ``cls`` the judge backend named ``cls.backend`` (built as ``cls(cfg, home=, config=)``)."""
    if not cls.backend or cls.backend in ("openai", "rules"):
        raise ValueError(f"{cls.__qualname__}: a registered judge backend needs a new, non-empty `backend` name")
    if BACKENDS.get(cls.backend, cls) is not cls:
        raise ValueError(f"judge backend {cls.backend!r} is already registered")
    BACKENDS[cls.backend] = cls
    return cls


class Judge(ABC):
    """One object per run; roles are coroutines, safe to gather concurrently.

    Every role goes through ``ask(role, **request)``; a backend implements ``_answer`` once for all roles. The
    roles are declared by the methods that ask them (``tasks/methods/<m>/roles.py``): the judge knows none."""

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

    @classmethod
    def takes(cls, role: str) -> bool:
        """Whether this backend answers role ``role`` (``answers``; preflight asks it of a plug-in judge)."""
        return cls.answers is None or role in cls.answers

    # ---- every role -----------------------------------------------------------------------------------------
    async def ask(self, role: Role[Any, T] | str, /, *, ctx: CallContext | None = None,
                  **fields: Any) -> JudgeOutcome[T]:
        """``role`` (a declared ``Role``, or a registered role's name) on the request built from ``fields``: its
        ``skip`` answer without a call, else the backend's answer."""
        if isinstance(role, str):
            role = role_of(role)
        name = role.name
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

    def settle_payments(self, keys: Iterable[str]) -> None:  # noqa: B027 - optional hook
        """Calls of ``keys`` were paid for ahead and wasted, their cost committed in ``steps``: a backend whose
        cache records payment (openai) stops a later hit from carrying it."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release network clients (openai backend)."""
