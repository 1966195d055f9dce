"""The policy head: log-probs (and entropy) of the loss tokens only, without [positions x vocabulary] logits in memory.

:class:`PolicyHead` is the policy as DeepSpeed sees it (the HF causal LM scored at the loss positions, at the
temperature the rollout sampled with: :func:`scoring_temperature`); a plain linear LM head is scored chunk by chunk.

The policy head scores N loss positions against a V-token vocabulary at the scoring temperature T: per position
``z = (h W^T + b) / T`` (float32), ``log pi(y) = z_y - logsumexp(z)``, ``H = logsumexp(z) - sum softmax(z) z``.
Materialising z for N = 44.5k positions and V = 152k takes 13.5 GiB in bf16 and twice that in float32.
:class:`ChunkedLogprobs` walks the positions in chunks (the fused-linear-cross-entropy pattern): the forward keeps
only its inputs and the [N] outputs, the backward recomputes one chunk's logits at a time and turns them into the
gradients of h, W and b (when all N positions fit one chunk, the forward's logits are kept for the backward
instead: the same values, one matmul fewer):

    d log pi(y) / dz = onehot(y) - p,        dH / dz = -p (z - E_p[z]),

then divides by T and casts to the logits' dtype, as autograd does through ``.float()`` and ``/ T``. In float32 the
values and gradients equal those of full logits (``token_logprobs`` / ``token_entropy``) to rounding.

Peak memory: a few [chunk x V] float32 tensors plus a float32 accumulator of dW ([V x d]) in the backward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from arbor.tasks.training.losses import token_entropy, token_logprobs

CHUNK_BYTES = 2**28  # one chunk's float32 logits: 256 MiB (441 positions at V = 152k)


def chunk_positions(vocab: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Positions per chunk so that one chunk's float32 logits take at most ``chunk_bytes`` (at least 1)."""
    return max(1, chunk_bytes // (4 * vocab))


def _chunk_logits(h: Tensor, weight: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    """float32 logits at temperature T of one chunk, computed as the unchunked head does (linear, then
    ``.float() / T``)."""
    z = torch.nn.functional.linear(h, weight, bias).float()
    return z / temperature if temperature != 1.0 else z


class ChunkedLogprobs(torch.autograd.Function):
    """``(log pi(targets), entropy)`` of ``linear(hidden, weight, bias) / T`` chunk by chunk (module docstring).

    ``with_entropy`` False: the entropy output is zeros and carries no gradient."""

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                temperature: float, chunk: int, with_entropy: bool, keep_logits: bool) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        ent = torch.zeros(n, dtype=torch.float32, device=hidden.device)
        keep = keep_logits and n <= chunk and any(ctx.needs_input_grad[:3])  # one chunk, and a backward to come
        ctx.logits = None  # that chunk's logits, kept for the backward instead of recomputed
        for s in range(0, n, chunk):
            z = _chunk_logits(hidden[s:s + chunk], weight, bias, temperature)
            logp[s:s + chunk] = token_logprobs(z, targets[s:s + chunk])
            if with_entropy:
                ent[s:s + chunk] = token_entropy(z)
            if keep:
                ctx.logits = z
            del z
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.temperature, ctx.chunk, ctx.with_entropy = temperature, chunk, with_entropy
        ctx.set_materialize_grads(False)  # an unused output (entropy) gets None, not a zeros tensor
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx: Any, g_logp: Tensor | None, g_ent: Tensor | None):
        hidden, weight, bias, targets = ctx.saved_tensors
        T = ctx.temperature
        if not ctx.with_entropy:
            g_ent = None
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = (torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
                  if need_b and bias is not None else None)
        if g_logp is None and g_ent is None:
            return grad_h, grad_w, grad_b, None, None, None, None, None
        for s in range(0, hidden.shape[0], ctx.chunk):
            e = min(s + ctx.chunk, hidden.shape[0])
            h = hidden[s:e]
            z = ctx.logits if ctx.logits is not None else _chunk_logits(h, weight, bias, T)  # the same values
            # the same operations autograd runs through token_logprobs / token_entropy on full logits (so the
            # float32 rounding is the same): d lse = exp(z - lse), d gather = onehot, softmax's backward
            lse = torch.logsumexp(z, dim=-1, keepdim=True)
            if g_logp is not None:  # -g exp(z - lse), in place (negation is exact: the same rounding)
                g = g_logp[s:e].float()[:, None]
                gz = (z - lse).exp_().mul_(-g)
                gz.scatter_add_(-1, targets[s:e, None], g)
            else:
                gz = torch.zeros_like(z)
            if g_ent is not None:  # H = lse - sum(softmax(z) z)
                g = g_ent[s:e].float()[:, None]
                sm = torch.softmax(z, dim=-1)
                go = -g * z  # d H / d softmax
                # softmax's own backward kernel (what autograd calls), for the same rounding
                gz += g * torch.exp(z - lse) - g * sm + torch._softmax_backward_data(go, sm, -1, sm.dtype)
                del sm, go
            del z, lse
            if T != 1.0:
                gz = gz / T
            gz = gz.to(hidden.dtype)  # the gradient reaching linear()'s output, in its dtype
            if grad_h is not None:
                grad_h[s:e] = gz @ weight
            if grad_w is not None:
                grad_w += gz.t() @ h  # accumulated in float32 (today: one matmul over every position)
            if grad_b is not None:
                grad_b += gz.float().sum(0)
        return (grad_h, grad_w.to(weight.dtype) if grad_w is not None else None,
                grad_b.to(bias.dtype) if grad_b is not None else None, None, None, None, None, None)


def chunked_logprobs(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float = 1.0,
                     entropy: str = "none", chunk: int | None = None, keep_logits: bool = True) -> tuple[Tensor, Tensor]:
    """float32 ``(log pi_T(targets), entropy)`` at ``hidden`` [N, d] for the head ``(weight [V, d], bias)``.

    ``entropy``: ``none`` (zeros), ``detached`` (values, no gradient) or ``grad``; ``chunk`` positions per chunk
    (default: :func:`chunk_positions`). ``keep_logits``: when every position fits one chunk (a small vocabulary or
    a short micro-batch; at most ``CHUNK_BYTES`` of logits), the forward's logits are kept for the backward rather
    than recomputed there: the same tensor, so the same values and gradients bit for bit, one matmul fewer."""
    if entropy not in ("none", "detached", "grad"):
        raise ValueError(f"entropy must be none, detached or grad, got {entropy!r}")
    chunk = chunk or chunk_positions(weight.shape[0])
    logp, ent = ChunkedLogprobs.apply(hidden, weight, bias, targets, float(temperature), int(chunk),
                                      entropy != "none", keep_logits)
    return logp, (ent.detach() if entropy == "detached" else ent)


def scoring_temperature(rollout_temperature: float) -> float:
    """The temperature the trainer scores tokens at: the one the rollout sampled with, so that pi_old, pi_theta and
    the rollout log-probs are the same distribution (TIS compares like with like; slime and verl divide the logits
    by the rollout temperature too). Greedy rollouts (T = 0) record log-probs at T = 1, so they are scored at 1."""
    return rollout_temperature if rollout_temperature > 0.0 else 1.0


class PolicyHead(torch.nn.Module):
    """The policy as DeepSpeed sees it: an HF causal LM whose forward returns log pi_T(target) (and the entropy)
    only at the selected (row, position) pairs -- the loss tokens -- instead of [B, L, V] logits for every position.

    ``temperature`` T divides the logits before the softmax: the policy being optimised is the sampling policy
    softmax(z / T) the rollout engine drew from (``scoring_temperature``). Search-result tokens, prompts and padding
    never reach the LM head (a large saving in memory and time with a 150k-token vocabulary). A plain linear head
    is scored chunk by chunk (``tasks.training.head``: no [loss positions x vocabulary] logits in memory, the
    chunks' logits recomputed in the backward); the same values and gradients as full logits."""

    def __init__(self, lm: torch.nn.Module, temperature: float = 1.0) -> None:
        super().__init__()
        if temperature <= 0.0:
            raise ValueError(f"PolicyHead temperature must be > 0, got {temperature}")
        self.lm = lm
        self.temperature = float(temperature)

    def chunked(self) -> bool:
        """Whether the LM head is a plain linear layer, scored chunk by chunk (``tasks.training.head``
        item 1: no [loss positions x vocabulary] logits in memory); any other head takes the full-logits path."""
        return type(self.lm.lm_head) is torch.nn.Linear

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, rows: torch.Tensor,
                cols: torch.Tensor, targets: torch.Tensor, entropy: str = "none",
                position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed rows come with ``position_ids`` and no ``attention_mask``; no KV cache either
        way (with one, transformers would not read the packing from the position ids)."""
        hidden = self.lm.base_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                    use_cache=False).last_hidden_state
        if self.chunked():
            head = self.lm.lm_head
            logp, ent = chunked_logprobs(hidden[rows, cols], head.weight, head.bias, targets, self.temperature,
                                         entropy)
            return logp, ent
        logits = self.lm.lm_head(hidden[rows, cols])
        if self.temperature != 1.0:
            logits = logits.float() / self.temperature
        logp = token_logprobs(logits, targets)
        if entropy == "grad":
            ent = token_entropy(logits)
        elif entropy == "detached":
            ent = token_entropy(logits.detach())
        else:
            ent = torch.zeros_like(logp)
        return logp, ent
