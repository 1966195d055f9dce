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
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import openai
from openai.types.chat import ChatCompletion

from arbor.config.judge import JudgeConfig
from arbor.llm import prompts
from arbor.llm.base import RANK_LABELS, ROLES, CallContext, Judge, JudgeOutcome, Winner
from arbor.llm.cache import ResponseCache, cache_key, prompt_hash
from arbor.llm.parse import (
    ROLE_SCHEMAS,
    ConsolidationOut,
    InductionOut,
    InvalidOutput,
    PairwiseOut,
    RarRateOut,
    RarRubricsOut,
    parse_accuracy,
    parse_json,
    parse_ranking,
    parse_reflection_grades,
    parse_stage_grades,
    parse_stage_rubrics,
    parse_step_labels,
    parse_step_rubric,
    parse_step_verdict,
)
from arbor.seeding import derive_seed
from arbor.tasks.types import (
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

log = logging.getLogger("arbor.judge")
CACHE_HEADER = "X-Arbor-Cache-Key"
_RETRYABLE = (openai.RateLimitError, openai.InternalServerError, openai.APITimeoutError, openai.APIConnectionError)
DIALECTS = ("json_schema", "json_object", "off")  # judge.structured_outputs=auto tries them in this order
_FORMAT_WORDS = ("response_format", "json_schema", "json_object", "schema", "grammar")


@cache
def _role_schema(role: str) -> dict[str, Any] | None:
    """A role's reply schema, built once per process (pydantic regenerates it on every ``model_json_schema``)."""
    model = ROLE_SCHEMAS.get(role)
    return None if model is None else model.model_json_schema()


def response_format(role: str, dialect: str) -> dict[str, Any] | None:
    """The ``response_format`` of a role's request in one dialect: OpenAI's and vLLM's ``json_schema``, or
    llama-cpp-python's ``json_object`` with a ``schema`` (its server refuses the former with a 422); None for
    ``off`` and for a role without a schema (accuracy)."""
    schema = _role_schema(role)
    if schema is None or dialect == "off":
        return None
    if dialect == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": role, "schema": schema}}
    return {"type": "json_object", "schema": schema}


def refuses_format(err: openai.APIStatusError) -> bool:
    """Whether a 4xx says the server does not take this ``response_format`` (422: a schema validation error of the
    request, as llama-cpp-python answers; 400 naming the field), rather than anything else about the request."""
    if err.status_code == 422:
        return True
    return err.status_code == 400 and any(w in str(err).lower() for w in _FORMAT_WORDS)


class JudgeSetupError(ValueError):
    """Bad judge configuration (names the config key)."""


def _retry_after(err: Exception) -> float | None:
    response = getattr(err, "response", None)
    if response is None:
        return None
    headers = response.headers
    try:
        if "retry-after-ms" in headers:
            return float(headers["retry-after-ms"]) / 1000.0
        if "retry-after" in headers:
            return float(headers["retry-after"])
    except ValueError:
        return None  # an HTTP date: fall back to our backoff
    return None


class OpenAIJudge(Judge):
    backend = "openai"

    def __init__(self, cfg: JudgeConfig, *, home: Path):
        super().__init__(cfg, home=home)
        for role in ROLES:
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

    # ---- transport ---------------------------------------------------------------------------------------
    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # clients and semaphores belong to one event loop
            self._loop, self._clients, self._inflight = loop, {}, {}
            self._sem = asyncio.Semaphore(self.cfg.concurrency)

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
        raised to what ``items`` entries need (``prompts.reply_budget``)."""
        rc = self.cfg.for_role(role)
        if items is None or getattr(self.cfg.roles, role).max_tokens is not None:
            return int(rc["max_tokens"])  # type: ignore[call-overload]
        return max(int(rc["max_tokens"]), prompts.reply_budget(role, items))  # type: ignore[call-overload]

    def _fit(self, role: str, texts: int, items: int | None,
             render: Callable[[int], tuple[str, list[dict[str, str]]]]) -> tuple[str, list[dict[str, str]]]:
        """A role's prompt with each of its ``texts`` compacted texts (trajectories, histories, candidates) at
        ``judge.max_judge_tokens``; when ``judge.context_tokens`` is set and that prompt and the reply would not
        fit, at the budget that makes them fit (issue 31 item 3). The prompt's own words are measured by rendering
        it with every text at ``prompts.MIN_TEXT_TOKENS``."""
        version, messages = render(self.cfg.max_judge_tokens)
        window = self.cfg.context_tokens
        reply = self._reply_tokens(role, items)
        if window is None or prompts.message_tokens(messages) + reply <= window:
            return version, messages
        own = prompts.message_tokens(render(prompts.MIN_TEXT_TOKENS)[1]) - texts * prompts.MIN_TEXT_TOKENS
        return render(max(prompts.MIN_TEXT_TOKENS, (window - reply - max(own, 0)) // max(1, texts)))

    def _dialect(self, base_url: str | None) -> str:
        mode = self.cfg.structured_outputs
        return self.dialects.get(base_url, DIALECTS[0]) if mode == "auto" else mode

    def _refused(self, base_url: str | None, sent: str, err: openai.APIStatusError) -> bool:
        """auto: step down from the dialect the endpoint refused (once, whichever concurrent call saw it first);
        True when there is another dialect to send."""
        if self.cfg.structured_outputs != "auto" or sent == "off" or not refuses_format(err):
            return False
        if self._dialect(base_url) == sent:
            nxt = DIALECTS[DIALECTS.index(sent) + 1]
            self.dialects[base_url] = nxt
            log.warning("judge endpoint %s refused response_format %s (%s); sending %s from now on",
                        base_url or "(default)", sent, err.status_code, nxt)
        return True

    def _backoff(self, key: str, attempt: int) -> float:
        """Exponential backoff with "equal jitter": b = min(max, base * 2^attempt), sleep in [b/2, b]."""
        b = min(self.cfg.backoff_max_s, self.cfg.backoff_base_s * 2**attempt)
        u = derive_seed(key, attempt, "jitter") / float(1 << 63)
        return b * (0.5 + 0.5 * u)

    async def _call(self, role: str, version: str, messages: list[dict[str, str]], parse: Callable[[str], Any],
                    ctx: CallContext | None, items: int | None = None) -> JudgeOutcome[Any]:
        """One role call; ``items``: how many entries the reply must hold, which sets its token budget
        (``prompts.reply_budget``) unless ``judge.roles.<role>.max_tokens`` fixes it."""
        rc = self.cfg.for_role(role)
        rc["max_tokens"] = self._reply_tokens(role, items)
        model = str(rc["model"])
        params = {"temperature": rc["temperature"], "max_tokens": rc["max_tokens"]}
        key = cache_key(role, model, version, messages, params)
        row = {"role": role, "model": model, "prompt_version": version, "cache_key": key,
               "prompt_hash": prompt_hash(messages)}
        t0 = time.perf_counter()
        if self.cache is not None and (entry := self.cache.get(key)) is not None:
            try:
                value = parse(entry["content"])
            except InvalidOutput:
                value = None  # a stale entry no longer validates: treat as a miss
            if value is not None:
                self._record(ctx, **row, latency_s=time.perf_counter() - t0, prompt_tokens=entry.get("prompt_tokens"),
                             completion_tokens=entry.get("completion_tokens"), cost_usd=0.0, cache_hit=True,
                             attempts=0, error=None)
                return JudgeOutcome(value, None, 0, True)
        if self.cfg.cost_cap_usd is not None and self.total_cost_usd >= self.cfg.cost_cap_usd:
            self._record(ctx, **row, latency_s=0.0, prompt_tokens=0, completion_tokens=0, cost_usd=0.0,
                         cache_hit=False, attempts=0, error="CostCapExceeded")
            return JudgeOutcome(None, "CostCapExceeded", 0, False)

        # the same key already on its way (identical prompts in one batch): wait for it instead of resending
        self._bind_loop()
        pending = self._inflight.get(key)
        if pending is not None:
            value, error = await asyncio.shield(pending)
            entry = (self.cache.get(key) if self.cache is not None else None) or {}
            self._record(ctx, **row, latency_s=time.perf_counter() - t0, prompt_tokens=entry.get("prompt_tokens"),
                         completion_tokens=entry.get("completion_tokens"), cost_usd=0.0, cache_hit=error is None,
                         attempts=0, error=error)
            return JudgeOutcome(value, error, 0, error is None)
        fut: asyncio.Future[tuple[Any, str | None]] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            out = await self._fetch(role, rc, model, key, messages, parse, row, ctx, t0)
            fut.set_result((out.value, out.error))
            return out
        finally:
            self._inflight.pop(key, None)
            if not fut.done():
                fut.set_result((None, "Cancelled"))

    async def _fetch(self, role: str, rc: dict[str, object], model: str, key: str, messages: list[dict[str, str]],
                     parse: Callable[[str], Any], row: dict[str, Any], ctx: CallContext | None,
                     t0: float) -> JudgeOutcome[Any]:
        """The network part of a call: bounded concurrency, retries with backoff, cache write, ledger row."""
        client = self._client(rc["base_url"], str(rc["api_key_env"]))  # type: ignore[arg-type]
        assert self._sem is not None
        p_tok = c_tok = 0
        error: str | None = None
        attempts = 0
        sent = messages  # after an unusable reply: the reply and what was wrong with it (prompts.retry_messages)
        for attempt in range(self.cfg.max_retries + 1):
            attempts += 1
            delay: float | None = None
            content, truncated = "", False
            try:
                resp = await self._post(client, role, rc, model, sent, key)
                if resp.usage is not None:
                    p_tok += resp.usage.prompt_tokens
                    c_tok += resp.usage.completion_tokens or 0
                content = (resp.choices[0].message.content or "") if resp.choices else ""
                truncated = bool(resp.choices) and resp.choices[0].finish_reason == "length"
                value = parse(content)
            except InvalidOutput as e:  # a cut-off reply that still parses is used; one that does not is "Truncated"
                error = "Truncated" if truncated else "InvalidOutput"
                sent = prompts.retry_messages(messages, content, str(e), truncated)
            except _RETRYABLE as e:
                error = type(e).__name__
                delay = _retry_after(e)
            except openai.APIStatusError as e:  # 4xx other than 429: retrying will not help
                error = f"{type(e).__name__}:{e.status_code}"
                log.warning("judge %s call %s failed: %s (not retried)", role, key[:12], error)
                break
            else:
                cost = (p_tok * float(rc["price_in_per_mtok"]) + c_tok * float(rc["price_out_per_mtok"])) / 1e6  # type: ignore[arg-type]
                self.total_cost_usd += cost
                if self.cache is not None:  # disk I/O (fsync) off the event loop
                    entry = {"role": role, "model": model, "prompt_version": row["prompt_version"], "content": content,
                             "prompt_tokens": p_tok, "completion_tokens": c_tok}
                    await asyncio.to_thread(self.cache.put, key, entry)
                self._record(ctx, **row, latency_s=time.perf_counter() - t0, prompt_tokens=p_tok,
                             completion_tokens=c_tok, cost_usd=cost, cache_hit=False, attempts=attempts, error=None)
                return JudgeOutcome(value, None, attempts, False)
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
                     cost_usd=cost, cache_hit=False, attempts=attempts, error=error)
        return JudgeOutcome(None, error, attempts, False)

    async def _post(self, client: openai.AsyncOpenAI, role: str, rc: Mapping[str, object], model: str,
                    messages: list[dict[str, str]], key: str) -> ChatCompletion:
        """One request, with the role's schema in the endpoint's dialect; a refused dialect is not an attempt:
        the request goes again at once in the next one (``_refused``)."""
        base_url = rc["base_url"]  # type: ignore[assignment]
        timeout = prompts.request_timeout(self.cfg.timeout_s, messages, int(rc["max_tokens"]))  # type: ignore[call-overload]
        while True:
            dialect = self._dialect(base_url)  # type: ignore[arg-type]
            body: dict[str, Any] = {"model": model, "messages": messages, "temperature": rc["temperature"],
                                    "max_tokens": rc["max_tokens"]}
            if (fmt := response_format(role, dialect)) is not None:
                body["response_format"] = fmt
            try:
                async with self._sem:
                    # client.post(...) is what chat.completions.create does after transforming its typed params;
                    # our messages are already plain JSON, so we skip that transform (~1 ms CPU a call, bench/judge.py)
                    return await client.post("/chat/completions", cast_to=ChatCompletion, body=body,
                                             options={"headers": {CACHE_HEADER: key}, "timeout": timeout})
            except openai.APIStatusError as e:
                if fmt is None or not self._refused(base_url, dialect, e):  # type: ignore[arg-type]
                    raise

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients = {}

    # ---- roles -------------------------------------------------------------------------------------------
    async def induce(self, question: str, golds: Sequence[str] | None, trajectories: Sequence[Trajectory],
                     anchors: Mapping[str, Any], existing: Sequence[Rubric | RubricDraft], *,
                     ctx: CallContext | None = None) -> JudgeOutcome[list[RubricDraft]]:
        if anchors.get("mode") in (None, "skip"):
            return JudgeOutcome([], None, 0, False)
        version, messages = self._fit("induction", len(trajectories) if anchors.get("mode") == "unlabeled" else 4, None,
                                       lambda b: prompts.induction_messages(question, golds, trajectories, anchors, existing, b))

        def parse(text: str) -> list[RubricDraft]:
            return [d.to_draft() for d in parse_json(text, InductionOut).rubrics]  # type: ignore[attr-defined]

        return await self._call("induction", version, messages, parse, ctx)

    async def consolidate(self, candidates_by_query: Mapping[str, Sequence[Rubric | RubricDraft]],
                          existing: Sequence[Rubric | RubricDraft], *,
                          ctx: CallContext | None = None) -> JudgeOutcome[list[RubricDraft]]:
        version, messages = prompts.consolidation_messages(candidates_by_query, existing)

        def parse(text: str) -> list[RubricDraft]:
            return [d.to_draft() for d in parse_json(text, ConsolidationOut).new_common_rubrics]  # type: ignore[attr-defined]

        return await self._call("consolidation", version, messages, parse, ctx)

    async def _pairwise_shown(self, question: str, shown_a: Trajectory, shown_b: Trajectory,
                              rubric: Rubric | RubricDraft, *, ctx: CallContext | None) -> JudgeOutcome[Winner]:
        version, messages = self._fit("pairwise", 2, None,
                                       lambda b: prompts.pairwise_messages(question, shown_a, shown_b, rubric, b))
        return await self._call("pairwise", version, messages,
                                lambda t: parse_json(t, PairwiseOut).winner, ctx)  # type: ignore[attr-defined]

    async def accuracy(self, question: str, golds: Sequence[str], prediction: str | None, *,
                       ctx: CallContext | None = None) -> JudgeOutcome[bool]:
        version, messages = prompts.accuracy_messages(question, golds, prediction)
        return await self._call("accuracy", version, messages, parse_accuracy, ctx)

    async def rar_rubrics(self, question: str, golds: Sequence[str], *,
                          ctx: CallContext | None = None) -> JudgeOutcome[list[str]]:
        version, messages = prompts.rar_rubrics_messages(question, golds)
        return await self._call("rar_rubrics", version, messages,
                                lambda t: parse_json(t, RarRubricsOut).items, ctx)  # type: ignore[attr-defined]

    async def rar_rate(self, question: str, trajectory: Trajectory, items: Sequence[str], *,
                       ctx: CallContext | None = None) -> JudgeOutcome[int]:
        version, messages = self._fit("rar_rate", 1, None,
                                       lambda b: prompts.rar_rate_messages(question, trajectory, items, b))
        return await self._call("rar_rate", version, messages,
                                lambda t: parse_json(t, RarRateOut).rating, ctx)  # type: ignore[attr-defined]

    # ---- RubricEM roles (App. C.2, C.3, D.6.2) ----------------------------------------------------------------
    async def stage_rubrics(self, question: str, golds: Sequence[str] | None, trajectories: Sequence[Trajectory],
                            existing: Sequence[StageRubric], *,
                            ctx: CallContext | None = None) -> JudgeOutcome[list[StageRubricDraft]]:
        """C.2 (``stage_rubrics.v1``): positive and negative rubrics by stage, weight 1-3, at most 4 per stage for
        stages 1-3 and 5 for stage 4 (more is invalid output). Fewer than two trajectories: ``[]`` without a call
        (nothing to contrast)."""
        if len(trajectories) < 2:
            return JudgeOutcome([], None, 0, False)
        version, messages = self._fit("stage_rubrics", len(trajectories), None,
                                       lambda b: prompts.stage_rubrics_messages(question, golds, trajectories, existing, b))
        return await self._call("stage_rubrics", version, messages, parse_stage_rubrics, ctx)

    async def stage_grades(self, question: str, golds: Sequence[str] | None, trajectory: Trajectory,
                           rubrics: Sequence[StageRubric], *,
                           ctx: CallContext | None = None) -> JudgeOutcome[list[RubricGrade]]:
        """C.3 (``stage_grades.v1``): the reply must score every rubric index exactly once, 0/1/2 (else invalid
        output, retried); grades come back in ``rubrics`` order. No rubrics: ``[]`` without a call."""
        if not rubrics:
            return JudgeOutcome([], None, 0, False)
        version, messages = self._fit("stage_grades", 1, len(rubrics),
                                       lambda b: prompts.stage_grades_messages(question, golds, trajectory, rubrics, b))
        n = len(rubrics)
        return await self._call("stage_grades", version, messages, lambda t: parse_stage_grades(t, n), ctx, n)

    async def reflection_grades(self, question: str, golds: Sequence[str] | None, trajectory: Trajectory,
                                graded: Sequence[tuple[StageRubric, RubricGrade]], candidates: Sequence[str], *,
                                ctx: CallContext | None = None) -> JudgeOutcome[list[ReflectionGrade]]:
        """D.6.2 (``reflection_grades.v1``): diagnosis, specificity and scope in [0, 1] for every candidate index
        exactly once (else invalid output, retried), in candidate order; the caller weights them (0.4 / 0.3 /
        0.3). No candidates: ``[]`` without a call."""
        if not candidates:
            return JudgeOutcome([], None, 0, False)
        version, messages = self._fit("reflection_grades", 1 + len(candidates), len(candidates),
                                       lambda b: prompts.reflection_grades_messages(question, golds, trajectory, graded, candidates, b))
        n = len(candidates)
        return await self._call("reflection_grades", version, messages, lambda t: parse_reflection_grades(t, n),
                                ctx, n)

    # ---- ARCO's warm-up teacher ---------------------------------------------------------------------------------
    async def step_labels(self, question: str, golds: Sequence[str] | None, trajectory: Trajectory,
                          steps: Sequence[tuple[str, str]], k: int, *,
                          ctx: CallContext | None = None) -> JudgeOutcome[list[StepLabel]]:
        """``step_labels.v1``: one entry per step with k criteria and scores (a reply with another number of steps
        is invalid output, retried). No steps: ``[]`` without a call."""
        if not steps:
            return JudgeOutcome([], None, 0, False)
        version, messages = self._fit("step_labels", len(steps), len(steps) * k,
                                       lambda b: prompts.step_labels_messages(question, golds, trajectory, steps, k, b))
        n = len(steps)
        return await self._call("step_labels", version, messages, lambda t: parse_step_labels(t, n, k), ctx,
                                n * k)

    # ---- Co-ReAct roles (its §3.1-3.3, App. A) ----------------------------------------------------------------
    async def step_rubric(self, question: str, history: str, *, tool_calls: int, max_tool_calls: int,
                          ctx: CallContext | None = None) -> JudgeOutcome[StepRubric]:
        """``step_rubric.v1``: 1-8 weighted items (weights clamped to [-1, 1]) and a recommended action; a reply
        without items, or with a non-numeric weight or an empty condition, is invalid output (retried)."""
        version, messages = self._fit("step_rubric", 1, None,
                                       lambda b: prompts.step_rubric_messages(question, history, tool_calls, max_tool_calls, b))
        return await self._call("step_rubric", version, messages, parse_step_rubric, ctx)

    async def step_verify(self, question: str, history: str, action: str, rubric: StepRubric, *,
                          ctx: CallContext | None = None) -> JudgeOutcome[StepVerdict]:
        """``step_verify.v1``: exactly one boolean per rubric item (else invalid output, retried) and feedback.
        A rubric without items: an empty verdict without a call."""
        if not rubric.items:
            return JudgeOutcome(StepVerdict((), ""), None, 0, False)
        version, messages = self._fit("step_verify", 2, len(rubric.items),
                                       lambda b: prompts.step_verify_messages(question, history, action, rubric, b))
        n = len(rubric.items)
        return await self._call("step_verify", version, messages, lambda t: parse_step_verdict(t, n), ctx, n)

    async def _rank_shown(self, question: str, golds: Sequence[str] | None, history: str, shown: Sequence[str],
                          *, ctx: CallContext | None) -> JudgeOutcome[list[str]]:
        """``rank_actions.v1``: every shown label exactly once, best first (else invalid output, retried)."""
        labels = RANK_LABELS[: len(shown)]
        version, messages = self._fit("rank_actions", 1 + len(shown), None,
                                       lambda b: prompts.rank_actions_messages(question, golds, history, shown, b))
        return await self._call("rank_actions", version, messages, lambda t: parse_ranking(t, labels), ctx)
