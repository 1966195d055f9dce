"""Rollout engines: a batch of questions x K samples -> scored trajectories (paper §3.1, App. B.2; issue 5 item 4).

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
``vllm serve --logprobs-mode processed_logprobs`` (its default returns the raw model log-probs; see decisions.md).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import torch

from arbor.config import ArborConfig
from arbor.format import ARBOR, TagProtocol, get_protocol
from arbor.liveness import DependencyStalled, transport_timeout
from arbor.reward import RewardFn, load_reward_fn, score_trajectory
from arbor.seeding import derive_seed
from arbor.tasks.env.agent import AgentLoop, AgentState, Budgets, Generation, GenRequest
from arbor.types import Trajectory

_TAIL_TOKENS = 16  # stop strings are found in the decoded last tokens (every token decodes to >= 1 character)


class RolloutError(RuntimeError):
    """A rollout engine failed (server error, bad response); the message says which request and why."""


# --------------------------------------------------------------------------------------------- sampling


def sample_next(logits: torch.Tensor, generators: Sequence[torch.Generator], temperature: float,
                top_p: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (token ids [b], their log-probs under the sampling distribution [b]).

    Row i draws u_i ~ U(0, 1) from its own generator and inverts the CDF of softmax(logits_i / T) (nucleus-filtered),
    so a row's draw depends only on its seed and its own logits.
    """
    logits = logits.float()
    if temperature == 0.0:
        logp = torch.log_softmax(logits, dim=-1)
        tok = logits.argmax(dim=-1)
        return tok, logp.gather(-1, tok[:, None])[:, 0]
    scaled = logits / temperature
    if top_p < 1.0:
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        outside = probs.cumsum(dim=-1) - probs > top_p  # keep the smallest prefix with mass >= top_p
        sorted_logits = sorted_logits.masked_fill(outside, float("-inf"))
        scaled = torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits)
    logp = torch.log_softmax(scaled, dim=-1)
    cdf = logp.exp().cumsum(dim=-1)
    u = torch.cat([torch.rand(1, generator=g) for g in generators]).to(cdf.device)[:, None]
    tok = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp(max=cdf.shape[-1] - 1)[:, 0]
    return tok, logp.gather(-1, tok[:, None])[:, 0]


@torch.no_grad()
def generate_turns(model: Any, requests: Sequence[GenRequest], *, temperature: float, top_p: float,
                   decode: Callable[[list[int]], str], stop_strings: Sequence[str], eos_ids: set[int],
                   pad_id: int) -> list[Generation]:
    """One agent turn for each request: batched KV-cache decoding until a stop string, EOS or ``max_new_tokens``.

    The stop string is kept in the output (like vLLM's ``include_stop_str_in_output``); EOS is kept too.
    """
    from transformers import DynamicCache

    device = next(model.parameters()).device
    n = len(requests)
    out_ids: list[list[int]] = [[] for _ in range(n)]
    out_lp: list[list[float]] = [[] for _ in range(n)]
    finish: list[str] = ["length"] * n
    active = [i for i, r in enumerate(requests) if r.max_new_tokens > 0]
    if not active:
        return [Generation([], [], "length") for _ in requests]
    gens = {i: torch.Generator().manual_seed(requests[i].seed & 0xFFFF_FFFF_FFFF) for i in active}

    width = max(len(requests[i].context_ids) for i in active)
    input_ids = torch.full((len(active), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(active), width), dtype=torch.long)
    for row, i in enumerate(active):  # left padding
        ctx = requests[i].context_ids
        input_ids[row, width - len(ctx):] = torch.tensor(ctx, dtype=torch.long)
        mask[row, width - len(ctx):] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
                logits_to_keep=1)
    logits = out.logits[:, -1, :]
    next_pos = pos[:, -1] + 1

    for _ in range(max(requests[i].max_new_tokens for i in active)):
        tok, lp = sample_next(logits, [gens[i] for i in active], temperature, top_p)
        tok_list, lp_list = tok.tolist(), lp.tolist()
        keep: list[int] = []
        for row, i in enumerate(active):
            t = tok_list[row]
            out_ids[i].append(t)
            out_lp[i].append(lp_list[row])
            if t in eos_ids:
                finish[i] = "stop"
            elif any(s in decode(out_ids[i][-_TAIL_TOKENS:]) for s in stop_strings):
                finish[i] = "stop"
            elif len(out_ids[i]) >= requests[i].max_new_tokens:
                finish[i] = "length"
            else:
                keep.append(row)
        if not keep:
            break
        if len(keep) < len(active):  # finished rows leave the batch and the cache
            idx = torch.tensor(keep, device=device)
            cache.batch_select_indices(idx)
            mask, next_pos, tok = mask[idx], next_pos[idx], tok[idx]
            active = [active[row] for row in keep]
        mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                    past_key_values=cache, use_cache=True)
        logits = out.logits[:, -1, :]
        next_pos = next_pos + 1
    return [Generation(out_ids[i], out_lp[i], finish[i]) for i in range(n)]  # type: ignore[arg-type]


def _right_aligned(chunks: Sequence[list[int]], pad_id: int, start_pos: torch.Tensor,
                   device: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, mask, position_ids) [b, W] with each row's tokens at the right end (so logits[:, -1] is valid)."""
    width = max(len(c) for c in chunks)
    ids = torch.full((len(chunks), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(chunks), width), dtype=torch.long)
    pos = torch.zeros((len(chunks), width), dtype=torch.long)
    for r, c in enumerate(chunks):
        ids[r, width - len(c):] = torch.tensor(c, dtype=torch.long)
        mask[r, width - len(c):] = 1
        pos[r, width - len(c):] = int(start_pos[r]) + torch.arange(len(c))
    return ids.to(device), mask.to(device), pos.to(device)


def _repack(cache: Any, mask: torch.Tensor) -> torch.Tensor:
    """Drop padding columns: move each row's cached keys/values to the right end of a max(real length) window.

    Keys carry their rotary position already, and every cached column precedes any new query, so the order of
    columns within a row is all attention needs. Returns the new mask.
    """
    lens = mask.sum(1)
    width = int(lens.max())
    if width == mask.shape[1]:
        return mask
    idx = torch.zeros((mask.shape[0], width), dtype=torch.long, device=mask.device)
    new_mask = torch.zeros_like(idx)
    for r in range(mask.shape[0]):
        cols = mask[r].nonzero()[:, 0]
        idx[r, width - len(cols):] = cols
        new_mask[r, width - len(cols):] = 1
    for layer in cache.layers:
        shape = layer.keys.shape
        gather = idx[:, None, :, None].expand(shape[0], shape[1], width, shape[3])
        layer.keys, layer.values = layer.keys.gather(2, gather), layer.values.gather(2, gather)
    return new_mask


@torch.no_grad()
def run_agent_batch(model: Any, loop: AgentLoop, states: Sequence[AgentState], *, temperature: float, top_p: float,
                    eos_ids: set[int], pad_id: int, on_done: Callable[[AgentState], None] | None = None) -> None:
    """Run agent loops to the end as one continuous batch, keeping every row's KV cache across turns.

    Each decoding step feeds one token per row. When a row ends a turn (stop string, EOS, token budget), the loop
    observes it, runs the searches of all rows that ended together as one batch, and the row's new tokens (its last
    sampled token + the ``<result>`` block) are prefilled into *its* cache rows only (a sub-batch forward whose keys
    and values are merged back; other rows get masked padding columns). Finished rows leave the batch. Nothing is
    ever re-tokenised or re-prefilled, so the cost over plain ``generate`` is the result tokens themselves.
    Sampling per turn uses the seed of ``loop.next_request`` (identical draws to ``generate_turns``). ``on_done`` is
    called with each trajectory as it ends (streamed judging starts on a group once all of its rows have).
    """
    from transformers import DynamicCache

    device = next(model.parameters()).device
    rows = [s for s in states if not s.done]
    if not rows:
        return
    reqs = [loop.next_request(s) for s in rows]
    gens = [torch.Generator().manual_seed(r.seed & 0xFFFF_FFFF_FFFF) for r in reqs]
    pending: list[list[int]] = [list(s.context_ids) for s in rows]  # tokens not yet in the cache
    n_fed = [0] * len(rows)
    turn_ids: list[list[int]] = [[] for _ in rows]
    turn_lp: list[list[float]] = [[] for _ in rows]
    cache = DynamicCache()
    mask = torch.zeros((len(rows), 0), dtype=torch.long, device=device)
    next_pos = torch.zeros(len(rows), dtype=torch.long)

    def decode(ids: list[int]) -> str:
        return loop.tokenizer.decode(ids, skip_special_tokens=False)

    while rows:
        b = len(rows)
        logits = torch.empty(0)
        multi = [r for r in range(b) if len(pending[r]) > 1]
        single = [r for r in range(b) if len(pending[r]) == 1]
        multi_logits = None
        if multi:  # prefill new tokens of the rows that start a turn, into their own cache rows
            ids, m, pos = _right_aligned([pending[r] for r in multi], pad_id, next_pos[multi], device)
            sel = torch.tensor(multi, device=device)
            sub = DynamicCache()
            past = cache.get_seq_length()
            if past:
                for li, layer in enumerate(cache.layers):
                    sub.update(layer.keys.index_select(0, sel), layer.values.index_select(0, sel), li)
            out = model(input_ids=ids, attention_mask=torch.cat([mask[sel], m], 1), position_ids=pos,
                        past_key_values=sub, use_cache=True, logits_to_keep=1)
            multi_logits = out.logits[:, -1, :]
            width = ids.shape[1]
            if past == 0 and len(multi) == b:
                cache = sub
            else:
                for li, layer in enumerate(sub.layers):
                    if past:
                        big = cache.layers[li]
                        k = big.keys.new_zeros(big.keys.shape[:2] + (past + width,) + big.keys.shape[3:])
                        v = big.values.new_zeros(k.shape)
                        k[:, :, :past], v[:, :, :past] = big.keys, big.values
                    else:  # first prefill of only some rows (cannot happen: all rows start together)
                        raise RuntimeError("inconsistent cache state")
                    k[sel, :, past:], v[sel, :, past:] = layer.keys[:, :, past:], layer.values[:, :, past:]
                    big.keys, big.values = k, v
            wide = mask.new_zeros((b, width))
            wide[sel] = m
            mask = _repack(cache, torch.cat([mask, wide], 1))
            for r in multi:
                next_pos[r] += len(pending[r])
                n_fed[r] += len(pending[r])
        if single:  # one decoding step for everyone; rows just prefilled feed a masked pad column
            step_ids = torch.full((b, 1), pad_id, dtype=torch.long)
            step_mask = torch.zeros((b, 1), dtype=torch.long)
            for r in single:
                step_ids[r, 0] = pending[r][0]
                step_mask[r, 0] = 1
            mask = torch.cat([mask, step_mask.to(device)], 1)
            out = model(input_ids=step_ids.to(device), attention_mask=mask, position_ids=next_pos[:, None].to(device),
                        past_key_values=cache, use_cache=True)
            logits = out.logits[:, -1, :]
            for r in single:
                next_pos[r] += 1
                n_fed[r] += 1
        if multi_logits is not None:
            logits = multi_logits if not single else logits.index_copy(0, torch.tensor(multi, device=device),
                                                                       multi_logits)
        tok, lp = sample_next(logits, gens, temperature, top_p)
        ended: list[int] = []
        finish: dict[int, str] = {}
        for r, (t, x) in enumerate(zip(tok.tolist(), lp.tolist(), strict=True)):
            turn_ids[r].append(t)
            turn_lp[r].append(x)
            pending[r] = [t]
            if t in eos_ids or any(stop in decode(turn_ids[r][-_TAIL_TOKENS:]) for stop in loop.stop_strings):
                finish[r] = "stop"
            elif len(turn_ids[r]) >= reqs[r].max_new_tokens:
                finish[r] = "length"
            else:
                continue
            ended.append(r)
        if not ended:
            continue
        loop.advance([rows[r] for r in ended],
                     [Generation(turn_ids[r], turn_lp[r], finish[r]) for r in ended])  # type: ignore[arg-type]
        for r in ended:
            s = rows[r]
            if s.done:
                if on_done is not None:
                    on_done(s)
                continue
            reqs[r] = loop.next_request(s)
            gens[r] = torch.Generator().manual_seed(reqs[r].seed & 0xFFFF_FFFF_FFFF)
            pending[r] = s.context_ids[n_fed[r]:]
            turn_ids[r], turn_lp[r] = [], []
        keep = [r for r in range(b) if not rows[r].done]
        if len(keep) < b:  # finished trajectories leave the batch and the cache
            idx = torch.tensor(keep, dtype=torch.long)
            if keep:
                cache.batch_select_indices(idx.to(device))
            mask, next_pos = mask[idx.to(device)], next_pos[idx]
            rows, reqs, gens = [rows[r] for r in keep], [reqs[r] for r in keep], [gens[r] for r in keep]
            pending, n_fed = [pending[r] for r in keep], [n_fed[r] for r in keep]
            turn_ids, turn_lp = [turn_ids[r] for r in keep], [turn_lp[r] for r in keep]


def eos_token_ids(model: Any, tokenizer: Any) -> set[int]:
    ids = {t for t in (tokenizer.eos_token_id,) if t is not None}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif isinstance(gen_eos, list):
        ids.update(gen_eos)
    return ids


# --------------------------------------------------------------------------------------------- shared driver


def trajectory_seed(seed: int, step: int, group: int, sample: int) -> int:
    """The seed of one trajectory: derived from (run seed, step, group, sample); turn t uses (this, "turn", t)."""
    return derive_seed(seed, step, group, sample, "rollout")


def to_trajectory(s: AgentState, *, run_id: str, step: int, group: int, sample: int, policy_version: int,
                  reward_fn: RewardFn | None = None, format_gate: bool = True,
                  protocol: TagProtocol = ARBOR) -> Trajectory:
    """A scored ``Trajectory`` from a finished agent state (``reward_fn``: the ``reward.fn`` plug-in)."""
    traj = Trajectory(
        run_id=run_id, step=step, group=group, sample=sample, question_id=s.question_id, question=s.question,
        golds=list(s.golds), prompt_ids=list(s.prompt_ids), response_ids=list(s.response_ids),
        loss_mask=list(s.loss_mask), rollout_logprobs=list(s.logprobs), text=s.text, turns=len(s.turns),
        search_calls=s.search_calls, search_queries=list(s.search_queries), finish_reason=s.finish_reason or "",
        policy_version=policy_version, gen_seconds=s.gen_seconds,
    )
    return score_trajectory(traj, truncated=s.truncated, reward_fn=reward_fn, format_gate=format_gate,
                            protocol=protocol)


class GroupWatch:
    """Calls ``on_group`` with a group's K trajectories as soon as its last row ends (streamed judging, issue 19);
    ``flush`` reports the groups not reported yet (rows that never ran, a path without per-row reports)."""

    def __init__(self, engine: _EngineBase, states: Sequence[AgentState], k: int, step: int, run_id: str,
                 first_group: int, on_group: Callable[[list[Trajectory]], None] | None) -> None:
        self.engine, self.states, self.k, self.step, self.run_id = engine, states, k, step, run_id
        self.first_group, self.on_group = first_group, on_group
        self.index = {id(s): j for j, s in enumerate(states)}
        self.left = [k] * (len(states) // k)

    def done(self, s: AgentState) -> None:
        g = self.index[id(s)] // self.k
        self.left[g] -= 1
        if self.left[g] == 0:
            self._report(g)

    def _report(self, g: int) -> None:
        self.left[g] = -1
        if self.on_group is not None:
            self.on_group(self.engine._finish(list(self.states[g * self.k:(g + 1) * self.k]), self.k, self.step,
                                              self.run_id, self.first_group + g))

    def flush(self) -> None:
        for g, n in enumerate(self.left):
            if n >= 0:
                self._report(g)


OnGroup = Callable[[list[Trajectory]], None]


class RolloutGuide(Protocol):
    """What an engine's rollouts can run under instead of plain turns (Co-ReAct's guided turns:
    ``tasks.methods.coreact.guidance.CoReAct``). The engine hands it its states (``run``); whoever owns the run
    sets the judge-ledger context of the calls to come (``set_context``) and takes one record per guided turn
    (``drain_records``)."""

    def run(self, engine: Any, states: Sequence[AgentState], keys: Sequence[tuple[int, int]]) -> None: ...

    def set_context(self, ctx: Any, **columns: Any) -> None: ...

    def drain_records(self) -> list[dict[str, Any]]: ...


class _EngineBase:
    policy_version: int = 0
    guide: RolloutGuide | None = None  # guided turns (Co-ReAct: inject, verify, retry) instead of plain ones

    def _guided_groups(self, questions: Sequence[Any], k: int, seed: int, step: int, run_id: str,
                       first_group: int) -> list[Trajectory]:
        """``generate_groups`` under ``guide``: turn by turn, each round waiting for the rubric writer and verifier."""
        states = self._start_states(questions, k, seed, step, first_group)
        self.guide.run(self, states, [(first_group + j // k, j % k) for j in range(len(states))])
        return self._finish(states, k, step, run_id, first_group)

    def __init__(self, cfg: ArborConfig, tokenizer: Any, search: Any) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.search = search
        self.reward_fn = load_reward_fn(cfg.reward)
        self.loop = AgentLoop(tokenizer, search, Budgets.from_config(cfg.rollout, cfg.search),
                              system_prompt=cfg.rollout.system_prompt,
                              protocol=get_protocol(cfg.rollout.protocol))

    def _start_states(self, questions: Sequence[Any], k: int, seed: int, step: int,
                      first_group: int = 0) -> list[AgentState]:
        return [self.loop.start(q.question_id, q.question, q.golds, trajectory_seed(seed, step, first_group + g, i),
                                getattr(q, "reference", ""))
                for g, q in enumerate(questions) for i in range(k)]

    def _finish(self, states: list[AgentState], k: int, step: int, run_id: str,
                first_group: int = 0) -> list[Trajectory]:
        return [to_trajectory(s, run_id=run_id, step=step, group=first_group + j // k, sample=j % k,
                              policy_version=self.policy_version, reward_fn=self.reward_fn,
                              format_gate=self.cfg.reward.format_gate, protocol=self.loop.protocol)
                for j, s in enumerate(states)]


# --------------------------------------------------------------------------------------------- transformers


class TransformersEngine(_EngineBase):
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
            return _report_all(self._guided_groups(questions, k, seed, step, run_id, first_group), k, on_group)
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
        """In-process weight sync after a training step (issue 6 item 4); tags later rollouts with ``version``."""
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        missing = [m for m in missing if not (m == "lm_head.weight" and self.model.config.tie_word_embeddings)]
        if missing or unexpected:
            raise RolloutError(f"weight sync: missing {missing[:5]}, unexpected {unexpected[:5]}")
        self.model.eval()
        self.policy_version = version


# --------------------------------------------------------------------------------------------- openai / vLLM


class OpenAIEngine(_EngineBase):
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
    distribution (after temperature / top-p), like the transformers engine's (see docs/decisions.md).
    """

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
        byte received (``arbor.liveness.DependencyStalled``)."""
        r = self.cfg.rollout
        return transport_timeout(r.request_timeout_s, r.stall_s or r.request_timeout_s)

    async def _complete(self, client: Any, sem: asyncio.Semaphore, req: GenRequest,
                        **body: Any) -> Generation:
        """One completion; ``body`` overrides fields of ``request_body`` (``complete``'s temperature and stops)."""
        import httpx

        async with sem:
            try:
                resp = await client.post(self.url, json={**self.request_body(req), **body}, headers=self.headers)
            except httpx.ReadTimeout as e:  # accepted, then silent (issue 60): the run ends naming the server
                raise DependencyStalled("the rollout server", self.url, client.timeout.read) from e
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
            return _report_all(self._guided_groups(questions, k, seed, step, run_id, first_group), k, on_group)
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


def _report_all(trajs: list[Trajectory], k: int, on_group: OnGroup | None) -> list[Trajectory]:
    """Guided rollouts advance turn by turn for the whole batch: every group is reported at the end."""
    if on_group is not None:
        for i in range(0, len(trajs), k):
            on_group(trajs[i:i + k])
    return trajs


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
