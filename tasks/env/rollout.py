"""Rollout engines: a batch of questions x K samples -> scored trajectories (paper §3.1, App. B.2).

One interface, ``engine.generate_groups(questions, k, seed, step, run_id=..., first_group=0) -> list[Trajectory]``
(group-major: trajectory ``g * k + i`` is sample ``i`` of question ``g``, numbered from ``first_group``), every trajectory carrying prompt/response token ids, the
loss mask (0 on ``<result>`` tokens), the rollout log-probs of the sampled tokens, finish reason, timings and the
policy version, and scored by ``arbor.reward.score_trajectory``.

- ``transformers``: our own batched decoding loop over a Hugging Face causal LM with a KV cache (CPU or one GPU).
  Rows that finish their turn leave the batch (their cache rows are dropped), every row samples from its own seeded
  generator, so a trajectory does not depend on which other rows share its batch. Greedy when temperature == 0.
- ``openai``: any OpenAI-compatible *completions* server (``vllm serve``, SGLang); prompts go as token ids, the
  sampled token ids and their log-probs come back; many agent loops run concurrently (asyncio, bounded).

Rollout log-probs are those of the sampling distribution actually used: ``log_softmax(logits / T)`` restricted to the
top-p nucleus (renormalised); with greedy decoding (T == 0), ``log_softmax(logits)``. For vLLM this corresponds to
``vllm serve --logprobs-mode processed_logprobs`` (its default returns the raw model log-probs; see docs/decisions/agent-loop-rollout-engines-tiny-policy-and-sft-data.md).

The engines share ``rollout_driver.py`` (seeds, scoring, streamed groups, the guide); the transformers engine decodes
with ``decoding.py``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from arbor.config import ArborConfig
from arbor.runtime.liveness import DependencyStalled, transport_timeout
from arbor.runtime.retry_after import backoff_s, requested_wait_s
from arbor.tasks.env.agent import AgentState, Generation, GenRequest
from arbor.tasks.env.decoding import eos_token_ids, generate_turns, run_agent_batch
from arbor.tasks.env.rollout_driver import EngineBase, GroupWatch, OnGroup, report_all
from arbor.types import Trajectory

log = logging.getLogger("arbor.rollout")


class RolloutError(RuntimeError):
    """A rollout engine failed (server error, bad response); the message says which request and why."""


class RolloutServerPaused(DependencyStalled):
    """The completions server answered 503 to every try of one request, and the next try would come after
    ``rollout.stall_s`` from the first: vLLM 0.33 answers so to every generation request while paused in
    abort or wait mode, until ``/resume``. A stall like a silent server's: stage retries are not spent on it, the run
    ends resumable."""

    def __init__(self, url: str, stall_s: float, tries: int, reason: str) -> None:
        super().__init__("the rollout server", url, stall_s)
        self.args = (f"the rollout server at {self.url} answered HTTP 503 ({reason}) to {tries} tries of a request, "
                     f"and the next would come after rollout.stall_s={stall_s:g} s from the first: vLLM 0.33 refuses "
                     "requests so while paused (POST /pause, mode abort or wait) until POST /resume: resume the "
                     "server, then the run (arbor train --resume RUN_ID)",)


# --------------------------------------------------------------------------------------------- transformers


class TransformersEngine(EngineBase):
    """Batched multi-turn rollouts in-process with a Hugging Face model (the embedded default)."""

    def __init__(self, cfg: ArborConfig, model: Any, tokenizer: Any, search: Any) -> None:
        super().__init__(cfg, tokenizer, search)
        self.model = model
        self.eos_ids = eos_token_ids(model, tokenizer) | self.loop.eos_ids
        self.loop.eos_ids = set(self.eos_ids)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else next(iter(self.eos_ids))

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        """One turn for each request (the server in tests/completions_server.py calls this, too)."""
        return self.complete(requests, temperature=self.cfg.rollout.temperature, stop_strings=self.loop.stop_strings)

    def run_states(self, states: list[AgentState], reuse_cache: bool = True,
                   on_done: Callable[[AgentState], None] | None = None) -> None:
        """Drive the agent loops to the end, ``max_batch_rows`` trajectories at a time.

        ``reuse_cache``: keep each row's KV cache across turns (``run_agent_batch``); False re-prefills the whole
        context every turn (``generate_turns``; what a server without prefix caching does).
        """
        r = self.cfg.rollout
        for i in range(0, len(states), r.max_batch_rows):
            chunk = states[i:i + r.max_batch_rows]
            if reuse_cache:
                run_agent_batch(self.model, self.loop, chunk, temperature=r.temperature, top_p=r.top_p,
                                eos_ids=self.eos_ids, pad_id=self.pad_id, on_done=on_done)
            else:
                while active := [s for s in chunk if not s.done]:
                    self.loop.advance(active, self.generate([self.loop.next_request(s) for s in active]))
                    for s in active:
                        if s.done and on_done is not None:
                            on_done(s)

    def generate_groups(self, questions: Sequence[Any], k: int, seed: int, step: int,
                        run_id: str = "", first_group: int = 0, on_group: OnGroup | None = None) -> list[Trajectory]:
        """K trajectories per question; ``on_group`` gets each group's as soon as its last one ends."""
        if self.guide is not None:
            return report_all(self._guided_groups(questions, k, seed, step, run_id, first_group), k, on_group)
        states = self._start_states(questions, k, seed, step, first_group)
        watch = GroupWatch(self, states, k, step, run_id, first_group, on_group)
        self.run_states(states, on_done=watch.done)
        watch.flush()
        return self._finish(states, k, step, run_id, first_group)

    def complete(self, requests: Sequence[GenRequest], *, temperature: float,
                 stop_strings: Sequence[str]) -> list[Generation]:
        """Single-turn completions at ``temperature`` that stop at ``stop_strings`` or EOS (RubricEM's reflection
        candidates); the policy's log-probs come back with the tokens, as for rollouts."""
        r = self.cfg.rollout
        out: list[Generation] = []
        for i in range(0, len(requests), r.max_batch_rows):
            out += generate_turns(self.model, requests[i:i + r.max_batch_rows], temperature=temperature,
                                  top_p=r.top_p, decode=self._decode, stop_strings=list(stop_strings),
                                  eos_ids=self.eos_ids, pad_id=self.pad_id)
        return out

    def load_state_dict(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """In-process weight sync after a training step; tags later rollouts with ``version``."""
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        missing = [m for m in missing if not (m == "lm_head.weight" and self.model.config.tie_word_embeddings)]
        if missing or unexpected:
            raise RolloutError(f"weight sync: missing {missing[:5]}, unexpected {unexpected[:5]}")
        self.model.eval()
        self.policy_version = version


# --------------------------------------------------------------------------------------------- openai / vLLM


class OpenAIEngine(EngineBase):
    """Agent loops against an OpenAI-compatible completions server (``vllm serve``), token ids in and out.

    Request and response fields are those of vLLM's OpenAI-compatible server, documented at
    https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html (Completions API and its "extra parameters")
    and defined in ``vllm/entrypoints/openai/completion/protocol.py`` (``CompletionRequest``,
    ``CompletionResponseChoice``, ``CompletionLogProbs``):

    - ``prompt``: a list of token ids (no re-tokenisation server-side);
    - ``stop`` + ``include_stop_str_in_output: true``: string stops kept in the output;
    - ``logprobs: 1`` with ``return_tokens_as_token_ids: true``: ``logprobs.tokens`` are ``"token_id:{id}"``,
      ``logprobs.token_logprobs`` the sampled tokens' log-probs;
    - ``return_token_ids: true``: ``choices[i].token_ids`` are the sampled ids;
    - ``skip_special_tokens: false`` (``<think>`` is special in Qwen3), ``seed``, ``n: 1``, ``max_tokens``,
      ``temperature`` (0 = greedy), ``top_p``, ``top_k: -1`` (off: ``vllm serve`` otherwise applies the model's
      ``generation_config.json``, top_k=20 for Qwen3); response ``finish_reason`` is "stop" or "length".

    Start vLLM with ``--logprobs-mode processed_logprobs`` so the returned log-probs are those of the sampling
    distribution (after temperature / top-p), like the transformers engine's (see docs/decisions/agent-loop-rollout-engines-tiny-policy-and-sft-data.md).
    """

    # a 503 (vLLM 0.33 while paused) is retried after this wait, doubled each time up to the max (or the
    # server's Retry-After), for at most pause_max_tries tries and never past rollout.stall_s from the first
    pause_backoff_s = 0.5
    pause_backoff_max_s = 8.0
    pause_max_tries = 200

    def __init__(self, cfg: ArborConfig, tokenizer: Any, search: Any, base_url: str | None = None,
                 served_model: str | None = None) -> None:
        super().__init__(cfg, tokenizer, search)
        url = base_url or cfg.rollout.base_url
        if not url:
            raise RolloutError("rollout.base_url: the openai engine needs the server URL (e.g. http://host:8000/v1)")
        self.url = url.rstrip("/") + "/completions"
        from arbor.tasks.env.serving import served_model_name

        # the name arbor's launch serves it under
        self.served_model = served_model or served_model_name(cfg.rollout, cfg.policy)
        self.headers = {}
        if cfg.rollout.api_key_env:
            key = os.environ.get(cfg.rollout.api_key_env)
            if not key:
                raise RolloutError(f"rollout.api_key_env: environment variable {cfg.rollout.api_key_env} is not set")
            self.headers["Authorization"] = f"Bearer {key}"

    def set_policy_version(self, version: int) -> None:
        """Called after the trainer pushed new weights to the server (vLLM weight transfer or restart)."""
        self.policy_version = version

    def request_body(self, req: GenRequest) -> dict[str, Any]:
        r = self.cfg.rollout
        return {
            "model": self.served_model,
            "prompt": list(req.context_ids),
            "max_tokens": req.max_new_tokens,
            "temperature": r.temperature,
            "top_p": r.top_p,
            "top_k": -1,  # disabled; else vLLM applies the model's generation_config (Qwen3: top_k=20)
            "n": 1,
            "seed": req.seed & 0x7FFF_FFFF_FFFF_FFFF,
            "stop": list(self.loop.stop_strings),
            "include_stop_str_in_output": True,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }

    @staticmethod
    def parse_choice(data: dict[str, Any], where: str) -> Generation:
        try:
            choice = data["choices"][0]
            lp = choice["logprobs"]
            tokens = [int(t.split(":", 1)[1]) for t in lp["tokens"]]
            token_logprobs = [float(x) for x in lp["token_logprobs"]]
            finish = choice["finish_reason"]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise RolloutError(f"{where}: malformed completions response ({type(e).__name__}: {e})") from e
        ids = choice.get("token_ids")
        if ids is not None and list(ids) != tokens:
            raise RolloutError(f"{where}: token_ids and logprobs.tokens disagree")
        if finish not in ("stop", "length"):
            raise RolloutError(f"{where}: unexpected finish_reason {finish!r}")
        return Generation(tokens, token_logprobs, finish)

    def transport_timeout(self) -> Any:
        """httpx's timeouts: ``rollout.request_timeout_s``, and ``rollout.stall_s`` (default: the same) without a
        byte received (``arbor.runtime.liveness.DependencyStalled``)."""
        r = self.cfg.rollout
        return transport_timeout(r.request_timeout_s, r.stall_s or r.request_timeout_s)

    async def _complete(self, client: Any, sem: asyncio.Semaphore, req: GenRequest,
                        **body: Any) -> Generation:
        """One completion; ``body`` overrides fields of ``request_body`` (``complete``'s temperature and stops)."""
        import httpx

        r = self.cfg.rollout
        stall_s = r.stall_s or r.request_timeout_s
        deadline = time.monotonic() + stall_s
        for tries in range(1, self.pause_max_tries + 1):
            async with sem:
                try:
                    resp = await client.post(self.url, json={**self.request_body(req), **body}, headers=self.headers)
                except httpx.ReadTimeout as e:  # accepted, then silent: the run ends naming the server
                    raise DependencyStalled("the rollout server", self.url, client.timeout.read) from e
            if resp.status_code != 503:
                break
            reason = error_message(resp)
            wait = requested_wait_s(resp.headers)
            if wait is None:
                wait = backoff_s(self.pause_backoff_s, self.pause_backoff_max_s, tries - 1)
            if tries == self.pause_max_tries or time.monotonic() + wait > deadline:
                raise RolloutServerPaused(self.url, stall_s, tries, reason)
            log.warning("POST %s answered HTTP 503 (%s): retrying in %.2f s (try %d; vLLM 0.33 refuses requests "
                        "while paused, until /resume; given up once rollout.stall_s=%g s has passed)",
                        self.url, reason, wait, tries + 1, stall_s)
            await asyncio.sleep(wait)  # outside the semaphore: other requests go on meanwhile
        if resp.status_code == 404 and "does not exist" in resp.text:  # vLLM 0.33 serving.py::_check_model
            raise RolloutError(f"POST {self.url}: the server does not serve model {self.served_model!r} "
                               f"({resp.text[:300]}): start it with --served-model-name {self.served_model} "
                               "(arbor's launch does), or set rollout.served_model to a name it serves")
        if resp.status_code != 200:
            raise RolloutError(f"POST {self.url}: HTTP {resp.status_code}: {resp.text[:500]}")
        return self.parse_choice(resp.json(), f"POST {self.url}")

    async def _run_one(self, client: Any, sem: asyncio.Semaphore, s: AgentState,
                       on_done: Callable[[AgentState], None] | None = None) -> None:
        while not s.done:
            gen = await self._complete(client, sem, self.loop.next_request(s))
            query = self.loop.observe(s, gen)
            if query is not None:
                hits = await asyncio.to_thread(self.search.search, [query], self.loop.budgets.top_k)
                self.loop.deliver(s, hits[0])
        if on_done is not None:
            on_done(s)

    async def agenerate_groups(self, questions: Sequence[Any], k: int, seed: int, step: int,
                               run_id: str = "", first_group: int = 0,
                               on_group: OnGroup | None = None) -> list[Trajectory]:
        import httpx

        states = self._start_states(questions, k, seed, step, first_group)
        watch = GroupWatch(self, states, k, step, run_id, first_group, on_group)
        sem = asyncio.Semaphore(self.cfg.rollout.concurrency)
        limits = httpx.Limits(max_connections=self.cfg.rollout.concurrency)
        async with httpx.AsyncClient(timeout=self.transport_timeout(), limits=limits) as client:
            await asyncio.gather(*(self._run_one(client, sem, s, watch.done) for s in states))
        watch.flush()
        return self._finish(states, k, step, run_id, first_group)

    def generate_groups(self, questions: Sequence[Any], k: int, seed: int, step: int,
                        run_id: str = "", first_group: int = 0, on_group: OnGroup | None = None) -> list[Trajectory]:
        """K trajectories per question; ``on_group`` gets each group's as soon as its last one ends."""
        if self.guide is not None:
            return report_all(self._guided_groups(questions, k, seed, step, run_id, first_group), k, on_group)
        return asyncio.run(self.agenerate_groups(questions, k, seed, step, run_id, first_group, on_group))

    def complete(self, requests: Sequence[GenRequest], *, temperature: float,
                 stop_strings: Sequence[str]) -> list[Generation]:
        """Single-turn completions at ``temperature`` stopping at ``stop_strings`` (see TransformersEngine)."""
        import httpx

        async def run() -> list[Generation]:
            sem = asyncio.Semaphore(self.cfg.rollout.concurrency)
            async with httpx.AsyncClient(timeout=self.transport_timeout()) as client:
                return await asyncio.gather(*(self._complete(client, sem, r, temperature=temperature,
                                                             stop=list(stop_strings)) for r in requests))

        return asyncio.run(run())


def error_message(resp: Any) -> str:
    """The message of an OpenAI-style error body (``{"error": {"message": ...}}``, vLLM's), else the text."""
    try:
        return str(resp.json()["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return resp.text[:300]


# --------------------------------------------------------------------------------------------- factory


def make_engine(cfg: ArborConfig, policy: Any = None, tokenizer: Any = None, *, search: Any = None,
                home: Any = None) -> TransformersEngine | OpenAIEngine:
    """The engine named by ``rollout.engine``. ``policy``/``tokenizer`` default to ``load_policy(policy.model)``;
    ``search`` defaults to ``make_search(cfg.search, home=home)``. vLLM in-process is never imported here."""
    from arbor.paths import arbor_home

    if search is None:
        from arbor.tasks.env.search import make_search

        search = make_search(cfg.search, home=home or arbor_home(), config=cfg)
    if cfg.rollout.engine == "transformers":
        if policy is None or tokenizer is None:
            from arbor.tasks.env.policy import load_policy, policy_source

            src = policy_source(cfg.policy, home)
            device = "cuda" if torch.cuda.is_available() else "cpu"
            policy, tokenizer = load_policy(src, cfg.policy.dtype, device=device, home=home,
                                            policy_cfg=cfg.policy)
        return TransformersEngine(cfg, policy, tokenizer, search)
    if cfg.rollout.engine == "openai":
        if tokenizer is None:
            from arbor.tasks.env.policy import load_tokenizer, policy_source

            tokenizer = load_tokenizer(policy_source(cfg.policy, home), cfg.policy)
        return OpenAIEngine(cfg, tokenizer, search)
    raise RolloutError(f"rollout.engine: unknown engine {cfg.rollout.engine!r}")


@contextmanager
def sampling_temperature(engine: Any, temperature: float | None) -> Iterator[None]:
    """Run ``engine`` at ``temperature`` inside the block (``eval.temperature``; None keeps the rollout's), then
    restore its config. Training rollouts never pass through here, so their log-probs stay those of TIS's T."""
    if temperature is None or temperature == engine.cfg.rollout.temperature:
        yield
        return
    saved = engine.cfg
    engine.cfg = saved.model_copy(update={"rollout": saved.rollout.model_copy(update={"temperature": temperature})})
    try:
        yield
    finally:
        engine.cfg = saved


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0
