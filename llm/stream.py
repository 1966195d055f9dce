"""Streamed judging: a judge whose calls can be made *ahead* of the stage that needs them.

``StreamedJudge`` wraps a backend and runs every one of its calls on one background event loop (its own thread), so
the backend's clients and semaphore live on a single loop whatever thread or ``asyncio.run`` a stage uses.

While a step rolls out, each group whose K trajectories are complete is handed to ``stream``: the method's
``prefetch`` coroutine (``tasks.methods.base.Method.prefetch``) makes the judge calls the later stages will make for
that group, with the same arguments and call context. In that mode a call is *registered* under a key of its role
and arguments (``call_key``) and its ledger rows are captured, not recorded. When the stage later makes the same call,
it *claims* the registered answer and the captured rows enter the ledger then, as if the call had been made there:
the stage's stored rows are those of the serial order, and only the waiting is gone. A call nobody registered is
simply made (on the background loop).

A registered call nobody claims was a wrong guess (``Method.prefetch`` may speculate: ARBOR induces against the pool
of the step's start, which a retirement changes): ``take_stats`` counts it, with its cost, and drops its answer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import hashlib
import threading
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from arbor.llm.base import CAPTURE, Judge, Role
from arbor.types import Trajectory

PREFETCHING: ContextVar[bool] = ContextVar("arbor_judge_prefetching", default=False)

Answer = tuple[Any, list[dict[str, Any]]]  # (the role's JudgeOutcome, its captured judge_calls rows)


def _canon(x: Any) -> Any:
    """A hashable, content-only form of a call argument. A trajectory is named by its id and the text the judge
    reads (a trajectory rebuilt from Parquet and the engine's own object give the same form)."""
    if isinstance(x, Role):
        return ("role", x.name)
    if isinstance(x, Trajectory):
        return ("traj", x.traj_id, x.question, x.text, x.answer, x.f1, x.base_reward, x.format_valid)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__name__, tuple((f.name, _canon(getattr(x, f.name))) for f in dataclasses.fields(x)))
    if isinstance(x, dict):
        return ("dict", tuple(sorted((str(k), _canon(v)) for k, v in x.items())))
    if isinstance(x, list | tuple):
        return tuple(_canon(v) for v in x)
    if isinstance(x, float):
        return repr(x)
    return x if x is None or isinstance(x, str | int | bool) else repr(x)


def call_key(role: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The identity of one judge call: its role, its arguments and its call context (``ctx`` is a kwarg)."""
    return hashlib.sha256(repr((role, _canon(args), _canon(kwargs))).encode()).hexdigest()


@dataclass
class StreamStats:
    """One step's streaming: calls registered ahead, those never claimed, and what those cost."""

    prefetched: int = 0
    wasted: int = 0
    wasted_cost_usd: float = 0.0
    wasted_keys: list[str] = field(default_factory=list)  # the cache keys of the wasted calls that were paid for


class StreamedJudge:
    """A judge (same roles, same ledger) whose calls run on a background loop and can be prefetched (module doc)."""

    def __init__(self, inner: Judge) -> None:
        self.inner = inner
        self._calls: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._registered: dict[str, list[concurrent.futures.Future[Answer]]] = {}
        self._streams: list[concurrent.futures.Future[Any]] = []
        self._prefetched = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="arbor-judge", daemon=True)
        self._thread.start()

    def __getattr__(self, name: str) -> Any:  # cfg, home, backend, total_cost_usd, ... of the backend
        return getattr(self.inner, name)

    # ---- ledger --------------------------------------------------------------------------------------------
    def drain_calls(self) -> list[dict[str, Any]]:
        with self._lock:
            out, self._calls = self._calls, []
        return out

    # ---- calls ---------------------------------------------------------------------------------------------
    async def _run(self, role: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Answer:
        rows: list[dict[str, Any]] = []
        CAPTURE.set(rows)  # this task's context only
        out = await getattr(self.inner, role)(*args, **kwargs)
        return out, rows

    def _submit(self, role: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> concurrent.futures.Future[Answer]:
        return asyncio.run_coroutine_threadsafe(self._run(role, args, kwargs), self._loop)

    async def _call(self, role: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        key = call_key(role, args, kwargs)
        if PREFETCHING.get():  # ahead of its stage: register, wait for the answer, record nothing
            fut = self._submit(role, args, kwargs)
            with self._lock:
                self._registered.setdefault(key, []).append(fut)
                self._prefetched += 1
            return (await asyncio.wrap_future(fut))[0]
        with self._lock:
            waiting = self._registered.get(key)
            fut = waiting.pop(0) if waiting else None
        if fut is None:
            fut = self._submit(role, args, kwargs)
        out, rows = await asyncio.wrap_future(fut)
        with self._lock:
            self._calls.extend(rows)
        return out

    def __getattribute__(self, name: str) -> Any:
        if name == "ask":  # every role's call (Judge.ask)
            async def role(*args: Any, **kwargs: Any) -> Any:
                return await self._call(name, args, kwargs)

            return role
        return object.__getattribute__(self, name)

    # ---- streaming -----------------------------------------------------------------------------------------
    def stream(self, work: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """Run ``work()`` (a method's prefetch of one group) on the background loop, its calls registered."""
        async def prefetch() -> None:
            PREFETCHING.set(True)
            await work()

        with self._lock:
            self._streams.append(asyncio.run_coroutine_threadsafe(prefetch(), self._loop))

    def settle(self) -> None:
        """Wait until every streamed prefetch has registered all its calls (a stage claims after this, so it never
        sends a call that is about to be registered). A failed prefetch only loses its head start: the stage makes
        the calls itself."""
        with self._lock:
            streams, self._streams = self._streams, []
        for f in streams:
            try:
                f.result()
            except Exception:  # noqa: BLE001 - the claiming stage makes (and records) the call itself
                pass

    def take_stats(self) -> StreamStats:
        """The step's streaming figures; registered answers nobody claimed are dropped (a wrong guess)."""
        self.settle()
        with self._lock:
            left = [f for futs in self._registered.values() for f in futs]
            stats = StreamStats(prefetched=self._prefetched, wasted=len(left))
            self._registered, self._prefetched = {}, 0
        for f in left:
            if f.done() and not f.cancelled() and f.exception() is None:
                stats.wasted_cost_usd += sum(r.get("cost_usd") or 0.0 for r in f.result()[1])
                stats.wasted_keys += [r["cache_key"] for r in f.result()[1] if (r.get("cost_usd") or 0.0) > 0.0]
            else:
                f.cancel()
        return stats

    def settle_wasted(self, stats: StreamStats) -> None:
        """Once the step's ``steps`` row (with ``prefetch_wasted_cost_usd``) is committed: the wasted calls' payments
        are accounted, and a hit on them after a resume carries nothing (``Judge.settle_payments``)."""
        self.inner.settle_payments(stats.wasted_keys)

    async def aclose(self) -> None:
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.inner.aclose(), self._loop))

    def close(self) -> None:
        """Close the backend's clients and stop the background loop (idempotent)."""
        if self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self.inner.aclose(), self._loop).result(timeout=10)
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)


Judge.register(StreamedJudge)  # a Judge by its roles and ledger (isinstance holds for the stages' type checks)
