"""Micro-batches with little padding: which sequences share a micro-batch, and its tensors.

A mini-batch is cut into micro-batches of at most ``train.micro_batch_tokens`` padded tokens. Where the attention can
keep sequences apart by their position ids (``packing_mode``: sdpa and eager ``packed``, flash attention ``varlen``),
several sequences are laid end to end in a row (``pack_rows``), their position ids restarting at 0; elsewhere each
sequence gets a right-padded row of its own, similar lengths together (``pack_by_lengths``). ``make_micro`` builds a
micro-batch's tensors either way, with the flat list of loss positions the policy head scores. The RL update and
the SFT warm start both cut their batches with ``pack_micro_batches`` (one packer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


def pack_by_lengths(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Padded micro-batches of sequences of similar lengths (the fallback where the attention
    cannot keep packed sequences apart): as few micro-batches as greedy longest-first filling makes, cut where they
    waste the fewest padded tokens.

    Sequences are sorted longest first and cut into runs; a run of n costs n x its first (longest) length, which
    must stay within ``max_tokens`` (a sequence longer than the budget gets a micro-batch of its own). Among the
    cuts with the fewest runs (greedy's count is the least), dynamic programming keeps the one with the least
    padding, the earliest cut on ties. Returns indices, each micro-batch longest first."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    s = [lengths[i] for i in order]
    n = len(s)
    prefix = [0]
    for x in s:
        prefix.append(prefix[-1] + x)
    # best[i]: (micro-batches, padded tokens) of the cheapest cut of s[i:]; nxt[i]: where its first run ends
    best: list[tuple[int, int]] = [(0, 0)] * (n + 1)
    nxt = [n] * (n + 1)
    for i in range(n - 1, -1, -1):
        best[i] = (n + 1, 0)
        for j in range(i + 1, n + 1):
            if j - i > 1 and (j - i) * s[i] > max_tokens:
                break
            count, pad = best[j]
            cand = (count + 1, pad + (j - i) * s[i] - (prefix[j] - prefix[i]))
            if cand < best[i]:
                best[i], nxt[i] = cand, j
    out: list[list[int]] = []
    i = 0
    while i < n:
        out.append(order[i : nxt[i]])
        i = nxt[i]
    return out


def pack_rows(lengths: list[int], max_tokens: int, one_row: bool = False) -> list[list[list[int]]]:
    """Padding-free micro-batches: each a list of rows, each row the indices of sequences laid
    end to end, their position ids restarting at 0 (``make_micro(layout=...)``), so that attention keeps them apart.

    First fit, longest first: the micro-batches are tried in order, in each the first row with room for the
    sequence, else a new row while rows x width stays within ``max_tokens``; a sequence that fits none opens a
    micro-batch. A micro-batch's width is the length of the sequence that opened it (its longest): the attention
    of a masked kernel (sdpa, eager) costs rows x width^2, no more than padding each of its sequences to that
    width would. ``one_row`` (flash attention's variable-length kernel, which needs one row and skips the masked
    pairs): one row of up to ``max_tokens`` per micro-batch. A sequence longer than the budget is alone."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    micro: list[list[list[int]]] = []
    shape: list[tuple[int, int]] = []  # per micro-batch: (width, most rows)
    fill: list[list[int]] = []  # per micro-batch: tokens in each row
    for i in order:
        n = lengths[i]
        for m, (width, most) in enumerate(shape):
            room = [r for r, used in enumerate(fill[m]) if used + n <= width]
            if room:
                micro[m][room[0]].append(i)
                fill[m][room[0]] += n
                break
            if len(fill[m]) < most and n <= width:
                micro[m].append([i])
                fill[m].append(n)
                break
        else:
            width = max(n, max_tokens) if one_row else n
            shape.append((width, 1 if one_row else max(1, max_tokens // n)))
            micro.append([[i]])
            fill.append([n])
    return micro


PACKING_ATTENTION = {"sdpa": "packed", "eager": "packed", "flash_attention_2": "varlen", "flash_attention_3": "varlen"}
PACKING_MODELS = ("llama", "qwen2", "qwen3")  # decoders whose transformers source was read (docs/decisions/packed-micro-batches.md)


def packing_mode(lm: torch.nn.Module) -> str:
    """How micro-batches are laid out for ``lm``: ``"packed"`` (several sequences a row, position
    ids restarting at 0; transformers then builds a block-diagonal causal mask from the position ids when no
    attention mask is given: sdpa, eager), ``"varlen"`` (one such row per micro-batch: flash attention's
    variable-length kernel, which reads the sequence starts from the position ids only when the batch has one row),
    or ``"padded"`` (one sequence a row, right-padded, ``pack_by_lengths``) for any other attention implementation
    or model type, or a model that does not build its mask with transformers' ``create_causal_mask``."""
    import sys

    from transformers import masking_utils

    config = getattr(lm, "config", None)
    mode = PACKING_ATTENTION.get(getattr(config, "_attn_implementation", None) or "", "padded")
    base = getattr(lm, "base_model", lm)
    module = sys.modules.get(type(base).__module__)
    if getattr(config, "model_type", None) not in PACKING_MODELS or (
            getattr(module, "create_causal_mask", None) is not masking_utils.create_causal_mask):
        return "padded"
    return mode


def pack_micro_batches(lengths: list[int], max_tokens: int, packing: str) -> list[list[list[int]]]:
    """Micro-batches as rows of sequence indices for a ``packing_mode``: padded ones hold one sequence a row."""
    if packing == "padded":
        return [[[i] for i in mb] for mb in pack_by_lengths(lengths, max_tokens)]
    return pack_rows(lengths, max_tokens, one_row=packing == "varlen")


def row_layout(rows: list[list[int]] | None, packing: str) -> list[int] | None:
    """``make_micro``'s ``layout`` for a micro-batch's rows (``pack_micro_batches``): how many sequences each row
    holds, or None where rows are padded one sequence each (and for no or an empty micro-batch)."""
    return [len(r) for r in rows] if rows and packing != "padded" else None


@dataclass
class Micro:
    """One micro-batch: padded sequences (or packed rows: ``pos`` set, ``att`` None) plus the
    flat list of loss positions (row, col, target)."""

    ids: torch.Tensor
    att: torch.Tensor | None
    rows: torch.Tensor
    cols: torch.Tensor
    targets: torch.Tensor
    rollout_lp: torch.Tensor
    mask: torch.Tensor  # 1 per loss position; all 0 for a padding micro-batch
    spans: list[tuple[int, int]]  # per sequence: its slice of the flat positions
    tokens: int  # real (unpadded) tokens
    adv: torch.Tensor  # the per-token advantage at each loss position (zeros when none was given)
    pos: torch.Tensor | None = None  # packed rows: position ids restarting at 0 for each sequence

    def to(self, device: Any) -> Micro:
        return Micro(self.ids.to(device), None if self.att is None else self.att.to(device), self.rows.to(device),
                     self.cols.to(device), self.targets.to(device), self.rollout_lp.to(device), self.mask.to(device),
                     self.spans, self.tokens, self.adv.to(device), None if self.pos is None else self.pos.to(device))


def make_micro(prompts: list[list[int]], responses: list[list[int]], masks: list[list[int]],
               rollout_lps: list[list[float]] | None = None, dummy: bool = False,
               advantages: list[torch.Tensor] | None = None, layout: list[int] | None = None) -> Micro:
    """Right-padded sequences and the loss positions: response token j of row b is predicted at P_b - 1 + j.
    ``advantages`` (one value per response token, ``Method.token_advantages``) are read at the same positions.

    ``layout``: how many of the sequences, in order, each row holds end to end (``pack_rows``);
    position ids restart at 0 with each sequence and a row's padded tail counts as a sequence of its own, so no
    attention mask is needed (``att`` None). The loss positions keep the sequences' order either way."""
    seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
    per_row = layout if layout is not None else [1] * len(seqs)
    if sum(per_row) != len(seqs) or min(per_row) < 1:
        raise ValueError(f"make_micro: layout {per_row} does not place {len(seqs)} sequences")
    starts: list[tuple[int, int]] = []  # per sequence: (row, first column)
    row_len: list[int] = []
    for r, count in enumerate(per_row):
        row_len.append(0)
        for _ in range(count):
            starts.append((r, row_len[r]))
            row_len[r] += len(seqs[len(starts) - 1])
    L = max(row_len)
    ids = torch.zeros((len(row_len), L), dtype=torch.long)
    att = torch.zeros((len(row_len), L), dtype=torch.long)
    pos = torch.zeros((len(row_len), L), dtype=torch.long)
    rows: list[int] = []
    cols: list[int] = []
    tgts: list[int] = []
    rlp: list[float] = []
    spans = []
    adv: list[torch.Tensor] = []
    for b, (p, r, m) in enumerate(zip(prompts, responses, masks, strict=True)):
        row, c0 = starts[b]
        ids[row, c0 : c0 + len(p) + len(r)] = torch.tensor(p + r)
        att[row, c0 : c0 + len(p) + len(r)] = 1
        pos[row, c0 : c0 + len(p) + len(r)] = torch.arange(len(p) + len(r))
        start = len(rows)
        keep = [j for j, k in enumerate(m) if k]
        for j in keep:
            rows.append(row)
            cols.append(c0 + len(p) - 1 + j)
            tgts.append(r[j])
            rlp.append(rollout_lps[b][j] if rollout_lps is not None else 0.0)
        if advantages is not None:
            adv.append(advantages[b][torch.tensor(keep, dtype=torch.long)])
        spans.append((start, len(rows)))
    if not rows:  # no loss token at all: one placeholder position, masked out
        rows, cols, tgts, rlp, dummy, adv = [0], [0], [0], [0.0], True, []
    mask = torch.zeros(len(rows)) if dummy else torch.ones(len(rows))
    if layout is not None:  # a row's padded tail: positions from 0 again, a sequence of its own
        for row, n in enumerate(row_len):
            pos[row, n:] = torch.arange(L - n)
    return Micro(ids, None if layout is not None else att, torch.tensor(rows), torch.tensor(cols),
                 torch.tensor(tgts), torch.tensor(rlp, dtype=torch.float32), mask, spans, sum(len(s) for s in seqs),
                 torch.cat(adv) if adv else torch.zeros(len(rows)), pos if layout is not None else None)
