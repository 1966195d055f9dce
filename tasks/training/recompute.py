"""Activation recompute chosen by a memory budget.

``train.gradient_checkpointing``: ``none``, ``every_other`` (decoder layers 0, 2, 4, ... recompute their forward in
the backward, the odd ones keep their activations), ``all``, or ``auto``: the least recompute whose estimated peak
(``peak_memory_estimate``) fits the budget (``memory_budget``), so a step that fits without recompute does not pay
for it (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost", trade recompute for memory; Korthikanti
et al. 2022 count a layer's activations per token). The old booleans mean ``all`` and ``none``.

transformers 5.x decoder layers are ``GradientCheckpointingLayer``s: each checkpoints its own ``forward`` when its
``gradient_checkpointing`` flag is set and the module is training; ``activation_checkpointing_enable`` (older:
``gradient_checkpointing_enable``) sets every layer's flag, and ``apply_recompute`` then sets them per layer.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch

MODES = ("none", "every_other", "all")  # least recompute first


@dataclass(frozen=True)
class DecoderShape:
    """What the estimate needs of a decoder-only model: its config's sizes and its parameter counts."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    params: int  # every parameter (the tied embedding once)
    trainable: int  # the ones the optimizer steps (with LoRA: the adapters)


@dataclass(frozen=True)
class MemoryBudget:
    """The settings ``auto`` decides by: the micro-batch's padded tokens, a configured budget (GiB, any device) or,
    when None, the device's free memory times ``fraction`` on CUDA and no limit on CPU; whether a frozen
    reference copy of the weights is loaded beside the policy (a KL to the start checkpoint)."""

    tokens: int
    budget_gib: float | None = None
    fraction: float = 0.8
    reference_copy: bool = False


def decoder_shape(model: torch.nn.Module) -> DecoderShape:
    """The ``DecoderShape`` of an HF causal LM (ZeRO-3 partitioned parameters counted by their full size)."""
    c = model.config
    heads = int(c.num_attention_heads)
    numel = [(getattr(p, "ds_numel", None) or p.numel(), p.requires_grad) for p in model.parameters()]
    return DecoderShape(
        hidden=int(c.hidden_size), intermediate=int(c.intermediate_size), heads=heads,
        kv_heads=int(getattr(c, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(c, "head_dim", None) or c.hidden_size // heads), layers=int(c.num_hidden_layers),
        params=sum(n for n, _ in numel), trainable=sum(n for n, g in numel if g))


def layer_activation_bytes(shape: DecoderShape, tokens: int, dtype_bytes: int) -> int:
    """Bytes one decoder layer (pre-norm attention + SwiGLU MLP) keeps for its backward at ``tokens`` tokens:

        tokens x dtype_bytes x (4 h + 4 q + 4 kv + 4 f),   q = heads x head_dim, kv = kv_heads x head_dim,

    h the hidden size, f the intermediate size: the two norms' inputs and outputs (4 h); the query projection, its
    normed and rotated copy, the attention output and o_proj's input (4 q); key and value projections, the normed
    and rotated key, the value as attention holds it (4 kv); gate, up, SiLU(gate) and their product (4 f). A fused
    attention kernel keeps no [heads x L x L] scores (Korthikanti et al. 2022's 5 a s / h term is gone)."""
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    return tokens * dtype_bytes * (4 * shape.hidden + 4 * q + 4 * kv + 4 * shape.intermediate)


def peak_memory_estimate(shape: DecoderShape, mode: str, *, tokens: int, dtype_bytes: int, zero_stage: int,
                         world: int = 1, reference_copy: bool = False) -> int:
    """Estimated peak bytes per rank of a training step with recompute ``mode`` (``MODES``):

        states      = P b / w3 + T b / w2 + T k / w1      (w_s = world if zero_stage >= s else 1)
                      k = 8 (AdamW's two fp32 moments) + 8 in mixed precision (b = 2: the fp32 master weights and
                      the fp32 gradient partition); so 16 bytes per trained parameter in fp32, 20 in bf16
        reference   = P b / w3 if a frozen reference copy is loaded, else 0
        activations = A x L                          (none)
                      A x floor(L/2) + I x ceil(L/2) [+ A if L is odd]   (every_other)
                      I x L + A                      (all)
                      + 2 I (the embedding output and the final norm)
        A = layer_activation_bytes(shape, tokens, b),  I = tokens x b x h

    P every parameter, T the trained ones, b the bytes of the training dtype, L the decoder layers, ``tokens`` the
    padded tokens of one micro-batch (``train.micro_batch_tokens``). A recomputing layer keeps only its input I and
    rebuilds its A in the backward, one layer at a time; that adds A to the peak only when the top layer recomputes
    (its A is rebuilt while every layer below still holds its own), which is why every_other recomputes the even
    layers 0, 2, ...: with L even the top layer keeps its activations and frees them before the first recompute.
    Not counted: the chunked head's logits chunk, DeepSpeed's communication buckets, the allocator's fragmentation
    (the budget's fraction is their headroom)."""
    if mode not in MODES:
        raise ValueError(f"recompute mode {mode!r}: expected one of {', '.join(MODES)}")
    b, L = dtype_bytes, shape.layers

    def share(n: int, stage: int) -> int:
        return math.ceil(n / world) if zero_stage >= stage else n

    k = 8 + (8 if b < 4 else 0)
    states = share(shape.params * b, 3) + share(shape.trainable * b, 2) + share(shape.trainable * k, 1)
    reference = share(shape.params * b, 3) if reference_copy else 0
    a, i = layer_activation_bytes(shape, tokens, b), tokens * b * shape.hidden
    acts = {"none": a * L, "every_other": a * (L // 2) + i * math.ceil(L / 2) + (a if L % 2 else 0),
            "all": i * L + a}[mode]
    return states + reference + acts + 2 * i


def choose_recompute(estimates: dict[str, int], budget: float | None) -> str:
    """The least recompute (``MODES`` order) whose estimate fits ``budget`` bytes; ``none`` without a budget;
    ``all`` when nothing fits (the least memory this can do)."""
    if budget is None:
        return "none"
    return next((m for m in MODES if estimates[m] <= budget), "all")


def memory_budget(memory: MemoryBudget, device: torch.device | None = None) -> float | None:
    """Bytes the step may use: the configured budget, else on CUDA the device's free memory (``mem_get_info``,
    before the model is moved there) times ``fraction``, else None (CPU: no limit)."""
    if memory.budget_gib is not None:
        return memory.budget_gib * 2**30
    if device is None and torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if device is not None and device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free * memory.fraction
    return None


def recompute_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers that can checkpoint themselves (transformers' ``GradientCheckpointingLayer``), in order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def apply_recompute(model: Any, mode: str) -> None:
    """Turn recompute on for ``mode``: ``all`` every decoder layer, ``every_other`` the even ones (0, 2, ...: the
    top layer of an even count keeps its activations, ``peak_memory_estimate``), ``none`` nothing. Non-reentrant ``torch.utils.checkpoint`` (works with frozen inputs, e.g. LoRA)."""
    if mode not in MODES:
        raise ValueError(f"recompute mode {mode!r}: expected one of {', '.join(MODES)}")
    if mode == "none":
        return
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the old name warns there
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if mode == "every_other":
        layers = recompute_layers(model)
        if not layers:
            raise ValueError(f"{type(model).__name__}: no GradientCheckpointingLayer, every_other is not possible")
        for n, layer in enumerate(layers):
            layer.gradient_checkpointing = n % 2 == 0


def resolve_recompute(model: torch.nn.Module, setting: str, memory: MemoryBudget | None, *, dtype_bytes: int,
                      zero_stage: int, world: int) -> tuple[str, str]:
    """The mode for ``setting`` (``auto`` decided by the budget) and a one-line account of the choice."""
    if setting != "auto":
        return setting, f"gradient checkpointing: {setting} (configured)"
    memory = memory or MemoryBudget(tokens=0)
    shape = decoder_shape(model)
    est = {m: peak_memory_estimate(shape, m, tokens=memory.tokens, dtype_bytes=dtype_bytes, zero_stage=zero_stage,
                                   world=world, reference_copy=memory.reference_copy) for m in MODES}
    budget = memory_budget(memory)
    mode = choose_recompute(est, budget)
    gib = {m: f"{v / 2**30:.3g}" for m, v in est.items()}
    room = "no limit" if budget is None else f"{budget / 2**30:.3g} GiB"
    fits = "" if budget is None or est[mode] <= budget else " (nothing fits: the least memory)"
    return mode, (f"gradient checkpointing: auto -> {mode}{fits}; estimated peak GiB none {gib['none']}, "
                  f"every_other {gib['every_other']}, all {gib['all']} at {memory.tokens} tokens a micro-batch; "
                  f"budget {room}")
