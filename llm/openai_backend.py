"""``openai`` judge backend: any OpenAI-compatible chat endpoint (vLLM, SGLang, DashScope compatible mode, OpenAI).

Bounded concurrency (one semaphore per event loop), per-call timeouts, our own retries (the client's are
disabled so every attempt is counted) with exponential backoff and deterministic jitter on 429 / 5xx / timeouts /
connection errors / invalid output, honouring ``Retry-After``; a content-hash cache so no answer is paid twice.
The API key is read from the environment variable named by ``judge.api_key_env`` when a client is built; it is
never stored on the judge, logged, or written to the ledger.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import openai
from openai.types.chat import ChatCompletion

from arbor.config.judge import JudgeConfig, JudgeRoles
from arbor.llm import prompts
from arbor.llm.answers import check_reply
from arbor.llm.base import CallContext, Judge, JudgeOutcome, Q, Role, T, role_of
from arbor.llm.cache import (
    ResponseCache,
    cache_key,
    payment_carried,
    process_attempt,
    prompt_hash,
    served_identity,
)
from arbor.llm.health import REFUSED_ERRORS, public_url, short_reason
from arbor.llm.parse import InvalidAnswer, InvalidOutput
from arbor.llm.text import WHOLE, shared_budget
from arbor.runtime.liveness import DependencyStalled, is_stall
from arbor.runtime.retry_after import backoff_s, requested_wait_s
from arbor.seeding import derive_seed

log = logging.getLogger("arbor.judge")
CACHE_HEADER = "X-Arbor-Cache-Key"
_RETRYABLE = (openai.RateLimitError, openai.InternalServerError, openai.APITimeoutError, openai.APIConnectionError)
DIALECTS = ("json_schema", "json_object", "off")  # judge.structured_outputs=auto tries them in this order
_FORMAT_WORDS = ("response_format", "json_schema", "json_object", "schema", "grammar")
REPLY_EXCERPT_CHARS = 200  # how much of a refused reply the ledger keeps (judge_calls.attempt_replies)
# (workspace, run, key) whose earlier payment a hit of this process carried: a run id names a run within one
# workspace only, and one process may hold runs of two workspaces with the same id (a notebook, a test worker)
_CARRIED: set[tuple[str, str, str]] = set()
UNREAD = {"unread": True}  # the served identity of a call whose endpoint could not say (``OpenAIJudge._served``)


@cache
def _role_schema(role: str) -> dict[str, Any] | None:
    """A role's reply schema, built once per process (pydantic regenerates it on every ``model_json_schema``)."""
    model = role_of(role).schema
    return None if model is None else model.model_json_schema()


def request_schema(role: Role[Q, Any], request: Q) -> dict[str, Any] | None:
    """The reply schema of one request: the role's, narrowed to the request's counts (``Role.narrow``)."""
    schema = _role_schema(role.name)
    return schema if schema is None or role.narrow is None else role.narrow(request, schema)


def response_format(role: str, dialect: str, schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``response_format`` of a request of ``role`` with reply ``schema`` in one dialect: OpenAI's and vLLM's
    ``json_schema``, or llama-cpp-python's ``json_object`` with a ``schema`` (its server refuses the former with a
    422); None for ``off`` and for a reply without a schema (accuracy)."""
    if schema is None or dialect == "off":
        return None
    if dialect == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": role, "schema": schema}}
    return {"type": "json_object", "schema": schema}


def refuses_format(err: openai.APIStatusError) -> bool:
    """Whether an error status says the server does not take this ``response_format``, rather than anything else
    about the request: a 422 (a validation error of the request body); a 400 naming the field; or a 500 whose
    message is that validation error, which is what llama-cpp-python 0.3.36's real server answers (its error
    handler turns fastapi's ``literal_error`` on ``response_format.type`` into ``internal_server_error``)."""
    if err.status_code == 422:
        return True
    text = str(err).lower()
    if err.status_code == 500:
        return "response_format" in text and "validation error" in text
    return err.status_code == 400 and any(w in text for w in _FORMAT_WORDS)


class FormatRefused(Exception):
    """The endpoint refused the ``response_format`` that ``judge.structured_outputs`` fixes: not retried (the same
    request would be refused again), recorded as ``FormatRefused:<status>``."""

    def __init__(self, err: openai.APIStatusError) -> None:
        super().__init__(str(err))
        self.status_code = err.status_code


class JudgeSetupError(ValueError):
    """Bad judge configuration (names the config key)."""


def _retry_after(err: Exception) -> float | None:
    """The wait a rate-limited or failed response asks for (``arbor.runtime.retry_after``); None: our own backoff."""
    response = getattr(err, "response", None)
    return None if response is None else requested_wait_s(response.headers)


class OpenAIJudge(Judge):
    backend = "openai"

    def __init__(self, cfg: JudgeConfig, *, home: Path):
        super().__init__(cfg, home=home)
        for role in JudgeRoles.model_fields:  # every role with a section under judge.roles
            env = str(cfg.for_role(role)["api_key_env"])
            if not os.environ.get(env):
                where = f"judge.roles.{role}.api_key_env" if getattr(cfg.roles, role).api_key_env \
                    else "judge.api_key_env"
                raise JudgeSetupError(f"{where}: environment variable {env!r} is not set (the judge API key)")
        self.cache = ResponseCache(self.home / "cache" / "judge") if cfg.cache else None
        self.retry_sleeps: list[float] = []  # diagnostics: every backoff / Retry-After sleep taken
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sem: asyncio.Semaphore | None = None
        self._clients: dict[tuple[str | None, str], openai.AsyncOpenAI] = {}
        self._inflight: dict[str, asyncio.Future[tuple[Any, str | None]]] = {}
        # judge.structured_outputs=auto: the dialect each endpoint takes, learnt from its first refusal
        self.dialects: dict[str | None, str] = {}
        self._paid_keys: dict[str, set[str]] = {}  # run -> cache keys its committed ledger paid for (``_carry``)
        # (base_url, key variable, model) -> the served model's identity (``_served``), read once per judge
        self._served_ids: dict[tuple[str | None, str, str], dict[str, Any] | None] = {}
        self._served_reads: dict[tuple[str | None, str, str], asyncio.Future[dict[str, Any] | None]] = {}

    # ---- transport ---------------------------------------------------------------------------------------
    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # clients and semaphores belong to one event loop
            self._loop, self._clients, self._inflight = loop, {}, {}
            self._sem = asyncio.Semaphore(self.cfg.concurrency)
            self._served_reads = {}

    def _client(self, base_url: str | None, key_env: str) -> openai.AsyncOpenAI:
        self._bind_loop()
        client = self._clients.get((base_url, key_env))
        if client is None:
            client = openai.AsyncOpenAI(
                base_url=base_url, api_key=os.environ[key_env], max_retries=0, timeout=self.cfg.timeout_s
            )
            self._clients[(base_url, key_env)] = client
        return client

    def _reply_tokens(self, role: str, items: int | None = None) -> int:
        """max_tokens of a role's reply: ``judge.roles.<role>.max_tokens`` when set, else ``judge.max_tokens``
        raised to what ``items`` entries need (``Role.reply_budget``)."""
        rc = self.cfg.for_role(role)
        over = getattr(self.cfg.roles, role, None)
        declared = role_of(role)
        if items is None or declared.reply is None or (over is not None and over.max_tokens is not None):
            return int(rc["max_tokens"])  # type: ignore[call-overload]
        return max(int(rc["max_tokens"]), declared.reply_budget(items))  # type: ignore[call-overload]

    def _fit(self, role: Role[Any, Any], texts: int, items: int | None,
             render: Callable[[int], tuple[str, list[dict[str, str]]]]) -> tuple[str, list[dict[str, str]]]:
        """A role's prompt with each of its ``texts`` compacted texts (trajectories, histories, candidates) at
        ``judge.max_judge_tokens`` (null: whole, App. E.1 / E.3). When ``judge.context_tokens`` is set and that
        prompt and the reply would not fit, at the largest budget under which they do (50 item
        3): from each text's equal share of the window (``text.shared_budget``; the prompt's own words measured
        with every text at ``prompts.MIN_TEXT_TOKENS``) up, by bisection, so a short text stays whole and
        leaves its room to the long ones, and nothing is cut that fits."""
        cap = self.cfg.max_judge_tokens
        version, messages = render(WHOLE if cap is None else cap)
        window = self.cfg.context_tokens
        reply = self._reply_tokens(role.name, items)
        size = prompts.message_tokens(messages)
        if window is None or size + reply <= window or texts == 0:
            return version, messages

        def fits(m: list[dict[str, str]]) -> bool:
            return prompts.message_tokens(m) + reply <= window

        own = prompts.message_tokens(render(prompts.MIN_TEXT_TOKENS)[1]) - texts * prompts.MIN_TEXT_TOKENS
        lo = max(prompts.MIN_TEXT_TOKENS, shared_budget(window, reply, own, texts))
        best = render(lo)
        if not fits(best[1]):
            return best  # even the equal share does not fit (every text at its skeleton): the smallest prompt
        hi = max(lo, min(size, cap if cap is not None else size))  # no text is longer than the whole prompt
        while lo < hi:
            mid = (lo + hi + 1) // 2
            cand = render(mid)
            if fits(cand[1]):
                lo, best = mid, cand
            else:
                hi = mid - 1
        return best

    async def _served(self, role: str, rc: Mapping[str, object]) -> dict[str, Any] | None:
        """The identity of the model the role's endpoint serves (``cache.served_identity`` of its ``GET /models``),
        read once per judge, endpoint and model; calls that start together share the read."""
        where: tuple[str | None, str, str] = (rc["base_url"], str(rc["api_key_env"]), str(rc["model"]))  # type: ignore[assignment]
        if where in self._served_ids:
            return self._served_ids[where]
        self._bind_loop()
        read = self._served_reads.get(where)
        if read is None:
            read = self._served_reads[where] = asyncio.ensure_future(self._read_served(role, rc, where))
            read.add_done_callback(lambda _: self._served_reads.pop(where, None))
        return await asyncio.shield(read)

    async def _read_served(self, role: str, rc: Mapping[str, object],
                           where: tuple[str | None, str, str]) -> dict[str, Any] | None:
        """None (the key of the name alone) where the endpoint has no ``/models`` route or does not list the model.
        A read that fails otherwise (no connection, 5xx) or a model still loading (llama.cpp lists it with ``meta:
        null``) is read again by the next call; this call's key holds ``UNREAD``, so it never meets an entry of a
        known model. No byte for the role's stall deadline is a stall, as for any request (``DependencyStalled``)."""
        client = self._client(rc["base_url"], str(rc["api_key_env"]))  # type: ignore[arg-type]
        stall = float(rc["stall_s"]) if rc.get("stall_s") is not None else self.cfg.timeout_s  # type: ignore[arg-type]
        try:
            listing = await client.get("/models", cast_to=object,
                                       options={"timeout": openai.Timeout(self.cfg.timeout_s, read=stall)})
        except openai.APITimeoutError as e:
            if is_stall(e):
                raise DependencyStalled(f"the judge of role {role!r}", public_url(rc["base_url"]),  # type: ignore[arg-type]
                                        stall) from e
            return UNREAD
        except openai.APIStatusError as e:
            if e.status_code in (429, 500, 502, 503, 504):
                return UNREAD
            listing = None  # no such route or method here (404, 405, 501, ...): the endpoint reports nothing
        except openai.APIError:
            return UNREAD
        served = served_identity(listing, where[2])
        if served is not None and "meta" in served and served["meta"] is None:
            return UNREAD
        self._served_ids[where] = served
        return served

    def _dialect(self, base_url: str | None) -> str:
        mode = self.cfg.structured_outputs
        return self.dialects.get(base_url, DIALECTS[0]) if mode == "auto" else mode

    def _refused(self, base_url: str | None, sent: str, err: openai.APIStatusError) -> bool:
        """auto: step down from the dialect the endpoint refused (``refuses_format``, checked by the caller; once,
        whichever concurrent call saw it first); True when there is another dialect to send."""
        if self.cfg.structured_outputs != "auto" or sent == "off":
            return False
        if self._dialect(base_url) == sent:
            nxt = DIALECTS[DIALECTS.index(sent) + 1]
            self.dialects[base_url] = nxt
            log.warning("judge endpoint %s refused response_format %s (%s); sending %s from now on",
                        base_url or "(default)", sent, err.status_code, nxt)
        return True

    def _carry(self, key: str, entry: Mapping[str, Any], ctx: CallContext | None) -> float:
        """The cost a cache hit carries into this run's ledger (``cache.payment_carried``): once per process and
        run, and only when the run's committed ``judge_calls`` hold no payment of ``key`` (read once per run)."""
        run_id = ctx.run_id if ctx is not None else None
        paid = entry.get("paid_by")
        if run_id is None or not isinstance(paid, Mapping) or paid.get("run_id") != run_id:
            return 0.0  # the common case: no ledger read
        if run_id not in self._paid_keys:
            from arbor.storage.parquet import read_table

            t = read_table("judge_calls", run_id=run_id, home=self.home)
            self._paid_keys[run_id] = {r["cache_key"] for r in t.select(["cache_key", "cost_usd"]).to_pylist()
                                       if (r["cost_usd"] or 0.0) > 0.0} if t.num_rows else set()
        cost = payment_carried(entry, run_id, process_attempt(), key in self._paid_keys[run_id],
                               (str(self.home), run_id, key) in _CARRIED)
        if cost:
            _CARRIED.add((str(self.home), run_id, key))
            self.total_cost_usd += cost
        return cost

    def settle_payments(self, keys: Iterable[str]) -> None:
        """Wasted prefetches whose cost a committed ``steps`` row holds: no later hit carries them (``_carry``)."""
        if self.cache is not None:
            for key in keys:
                self.cache.settle(key)

    def _stall_s(self, rc: Mapping[str, object], messages: list[dict[str, str]]) -> float:
        """Seconds without a byte after which a request of this role is a stall (``arbor.runtime.liveness``):
        ``judge.stall_s`` (or the role's), else the request's timeout, sized to its prompt and reply budget
        (``prompts.request_timeout``: a non-streaming reply sends nothing before its last token)."""
        if rc.get("stall_s") is not None:
            return float(rc["stall_s"])  # type: ignore[arg-type]
        return prompts.request_timeout(self.cfg.timeout_s, messages, int(rc["max_tokens"]))  # type: ignore[call-overload]

    def _backoff(self, key: str, attempt: int) -> float:
        """``retry_after.backoff_s`` with its jitter drawn from the request's key, so a rerun sleeps the same."""
        u = derive_seed(key, attempt, "jitter") / float(1 << 63)
        return backoff_s(self.cfg.backoff_base_s, self.cfg.backoff_max_s, attempt, u)

    async def _call(self, role: str, version: str, messages: list[dict[str, str]], parse: Callable[[str], Any],
                    ctx: CallContext | None, items: int | None = None,
                    schema: dict[str, Any] | None = None) -> JudgeOutcome[Any]:
        """One role call; ``items``: how many entries the reply must hold, which sets its token budget
        (``Role.reply_budget``) unless ``judge.roles.<role>.max_tokens`` fixes it."""
        rc = self.cfg.for_role(role)
        rc["max_tokens"] = self._reply_tokens(role, items)
        model = str(rc["model"])
        params = {"temperature": rc["temperature"], "max_tokens": rc["max_tokens"]}
        key = cache_key(role, model, version, messages, params, await self._served(role, rc))
        row = {"role": role, "model": model, "prompt_version": version, "cache_key": key,
               "prompt_hash": prompt_hash(messages)}
        t0 = time.perf_counter()
        if self.cache is not None and (entry := self.cache.get(key)) is not None:
            try:
                value = parse(entry["content"])
            except InvalidOutput:
                value = None  # a stale entry no longer validates: treat as a miss
            if value is not None:
                cost = self._carry(key, entry, ctx)
                self._record(ctx, **row, latency_s=time.perf_counter() - t0, prompt_tokens=entry.get("prompt_tokens"),
                             completion_tokens=entry.get("completion_tokens"), cost_usd=cost, cache_hit=True,
                             attempts=0, error=None, attempt_errors=[])
                return JudgeOutcome(value, None, 0, True)
        if self.cfg.cost_cap_usd is not None and self.total_cost_usd >= self.cfg.cost_cap_usd:
            self._record(ctx, **row, latency_s=0.0, prompt_tokens=0, completion_tokens=0, cost_usd=0.0,
                         cache_hit=False, attempts=0, error="CostCapExceeded", attempt_errors=[])
            return JudgeOutcome(None, "CostCapExceeded", 0, False)

        # the same key already on its way (identical prompts in one batch): wait for it instead of resending
        self._bind_loop()
        pending = self._inflight.get(key)
        if pending is not None:
            value, error = await asyncio.shield(pending)
            entry = (self.cache.get(key) if self.cache is not None else None) or {}
            self._record(ctx, **row, latency_s=time.perf_counter() - t0, prompt_tokens=entry.get("prompt_tokens"),
                         completion_tokens=entry.get("completion_tokens"), cost_usd=0.0, cache_hit=error is None,
                         attempts=0, error=error, attempt_errors=[])
            return JudgeOutcome(value, error, 0, error is None)
        fut: asyncio.Future[tuple[Any, str | None]] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            out = await self._fetch(role, rc, model, key, messages, parse, row, ctx, t0, schema)
            fut.set_result((out.value, out.error))
            return out
        finally:
            self._inflight.pop(key, None)
            if not fut.done():
                fut.set_result((None, "Cancelled"))

    async def _fetch(self, role: str, rc: dict[str, object], model: str, key: str, messages: list[dict[str, str]],
                     parse: Callable[[str], Any], row: dict[str, Any], ctx: CallContext | None,
                     t0: float, schema: dict[str, Any] | None) -> JudgeOutcome[Any]:
        """The network part of a call: bounded concurrency, retries with backoff, cache write, ledger row."""
        client = self._client(rc["base_url"], str(rc["api_key_env"]))  # type: ignore[arg-type]
        assert self._sem is not None
        p_tok = c_tok = 0
        error: str | None = None
        refusal: str | None = None  # the last attempt's refusal reason (a reply that was no answer)
        attempts = 0
        errors: list[str | None] = []  # the ledger's attempt_errors
        replies: list[str | None] = []  # the ledger's attempt_replies: the start of each refused reply
        sent = messages  # after an unusable reply: the reply and what was wrong with it (prompts.retry_messages)
        for attempt in range(self.cfg.max_retries + 1):
            attempts += 1
            delay: float | None = None
            content, truncated = "", False
            kind: str | None = None  # this attempt's entry in attempt_errors, when it differs from ``error``
            excerpt: str | None = None  # the start of a refused reply
            try:
                resp = await self._post(client, role, rc, model, sent, key, schema)
                if resp.usage is not None:
                    p_tok += resp.usage.prompt_tokens
                    c_tok += resp.usage.completion_tokens or 0
                content = (resp.choices[0].message.content or "") if resp.choices else ""
                truncated = bool(resp.choices) and resp.choices[0].finish_reason == "length"
                value = parse(content)
            except InvalidAnswer as e:  # parsed, but no answer: retried with the reason
                error = "InvalidAnswer"
                refusal = getattr(e, "reason", None) or short_reason(str(e))  # kept in the ledger
                kind, excerpt = f"{error}:{refusal}", content[:REPLY_EXCERPT_CHARS]  # each attempt's why
                sent = prompts.retry_messages(messages, content, str(e), False)
            except InvalidOutput as e:  # a cut-off reply that still parses is used; one that does not is "Truncated"
                error = "Truncated" if truncated else "InvalidOutput"
                refusal = REFUSED_ERRORS[error]
                excerpt = content[:REPLY_EXCERPT_CHARS]
                sent = prompts.retry_messages(messages, content, str(e), truncated)
            except openai.APITimeoutError as e:
                if is_stall(e):  # accepted, then silent: not retried, the run ends naming the server
                    raise DependencyStalled(f"the judge of role {role!r}", public_url(rc["base_url"]),  # type: ignore[arg-type]
                                            self._stall_s(rc, sent)) from e
                error, refusal = type(e).__name__, None
                delay = _retry_after(e)
            except _RETRYABLE as e:
                error, refusal = type(e).__name__, None
                delay = _retry_after(e)
            except (openai.APIStatusError, FormatRefused) as e:  # 4xx other than 429: retrying will not help
                error, refusal = f"{type(e).__name__}:{e.status_code}", None
                errors.append(error)
                replies.append(None)
                log.warning("judge %s call %s failed: %s (not retried)", role, key[:12], error)
                break
            else:
                errors.append(None)
                replies.append(None)
                cost = (p_tok * float(rc["price_in_per_mtok"]) + c_tok * float(rc["price_out_per_mtok"])) / 1e6  # type: ignore[arg-type]
                self.total_cost_usd += cost
                if self.cache is not None:  # disk I/O (fsync) off the event loop
                    entry = {"role": role, "model": model, "prompt_version": row["prompt_version"], "content": content,
                             "prompt_tokens": p_tok, "completion_tokens": c_tok, "cost_usd": cost,
                             "paid_by": {"run_id": ctx.run_id if ctx else None, "attempt": process_attempt()}}
                    await asyncio.to_thread(self.cache.put, key, entry)
                self._record(ctx, **row, latency_s=time.perf_counter() - t0, prompt_tokens=p_tok,
                             completion_tokens=c_tok, cost_usd=cost, cache_hit=False, attempts=attempts, error=None,
                             attempt_errors=errors, attempt_replies=replies)
                return JudgeOutcome(value, None, attempts, False)
            errors.append(kind or error)
            replies.append(excerpt)
            if attempt == self.cfg.max_retries:
                break
            backoff = self._backoff(key, attempt)
            sleep = backoff if delay is None else min(max(delay, 0.0), self.cfg.backoff_max_s)
            log.info("judge %s call %s attempt %d: %s; retrying in %.2fs", role, key[:12], attempts, error, sleep)
            self.retry_sleeps.append(sleep)
            await asyncio.sleep(sleep)
        cost = (p_tok * float(rc["price_in_per_mtok"]) + c_tok * float(rc["price_out_per_mtok"])) / 1e6  # type: ignore[arg-type]
        self.total_cost_usd += cost
        log.warning("judge %s call %s failed after %d attempts: %s", role, key[:12], attempts, error)
        self._record(ctx, **row, latency_s=time.perf_counter() - t0, prompt_tokens=p_tok, completion_tokens=c_tok,
                     cost_usd=cost, cache_hit=False, attempts=attempts, error=error, attempt_errors=errors,
                     refusal=refusal, attempt_replies=replies)
        return JudgeOutcome(None, error, attempts, False)

    async def _post(self, client: openai.AsyncOpenAI, role: str, rc: Mapping[str, object], model: str,
                    messages: list[dict[str, str]], key: str, schema: dict[str, Any] | None) -> ChatCompletion:
        """One request, with the role's schema in the endpoint's dialect; a refused dialect is not an attempt:
        the request goes again at once in the next one (``_refused``)."""
        base_url = rc["base_url"]  # type: ignore[assignment]
        # the openai client's own Timeout (httpx2's): connect, write, pool at timeout_s; no byte for stall_s: a stall
        timeout = openai.Timeout(self.cfg.timeout_s, read=self._stall_s(rc, messages))
        while True:
            dialect = self._dialect(base_url)  # type: ignore[arg-type]
            body: dict[str, Any] = {"model": model, "messages": messages, "temperature": rc["temperature"],
                                    str(rc["reply_limit_field"]): rc["max_tokens"]}
            if (fmt := response_format(role, dialect, schema)) is not None:
                body["response_format"] = fmt
            try:
                async with self._sem:
                    # client.post(...) is what chat.completions.create does after transforming its typed params;
                    # our messages are already plain JSON, so we skip that transform (~1 ms CPU a call, bench/judge.py)
                    return await client.post("/chat/completions", cast_to=ChatCompletion, body=body,
                                             options={"headers": {CACHE_HEADER: key}, "timeout": timeout})
            except openai.APIStatusError as e:
                if fmt is None or not refuses_format(e):
                    raise
                if not self._refused(base_url, dialect, e):  # type: ignore[arg-type]
                    raise FormatRefused(e) from e

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients = {}

    # ---- every role ------------------------------------------------------------------------------------------
    async def _answer(self, role: Role[Q, T], request: Q, ctx: CallContext | None) -> JudgeOutcome[T]:
        """The role's prompt (fitted to ``judge.context_tokens``), sent with its schema, its reply parsed and then
        checked to be an answer, not the prompt's template echoed or a loop (``llm.answers``)."""
        items = role.items(request)
        version, messages = self._fit(role, role.texts(request), items, lambda b: role.render(request, b))

        def parse(text: str) -> T:
            value = role.parse(text, request)
            check_reply(text, version, _role_schema(role.name), messages)
            return value

        return await self._call(role.name, version, messages, parse, ctx, items, request_schema(role, request))
