"""The transformers engine's decoding (paper App. B.2): per-row seeded sampling under temperature
and top-p with the sampling distribution's log-probs, one agent turn by batched KV-cache decoding
(``generate_turns``), and whole agent loops as one continuous batch that keeps every row's cache across turns
(``run_agent_batch``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from arbor.tasks.env.agent import AgentLoop, AgentState, Generation, GenRequest

_TAIL_TOKENS = 16  # stop strings are found in the decoded last tokens (every token decodes to >= 1 character)


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
    # a stable sort moves each row's padding columns to its left end and keeps its real ones in order: the last
    # ``width`` columns hold every real column (the padding kept in front of the shorter rows stays masked)
    idx = torch.sort(mask, dim=1, stable=True).indices[:, -width:]
    new_mask = mask.gather(1, idx)
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
