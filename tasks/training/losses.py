"""Policy-gradient losses: GRPO with truncated importance sampling (paper App. B.2); DAPO's equations are its own
(``tasks.methods.dapo.equations``).

Pure torch, no DeepSpeed: every function here is tested against values computed by hand.

Notation (per response token t of trajectory i):
    r_t      = pi_theta / pi_old = exp(logp - logp_old)       (pi_old recomputed by the trainer at step start)
    A_i      = (R_i - mean_group(R)) / (std_group(R) + eps)   (GRPO, DeepSeekMath; sample std, as slime does)
    A_{i,t}  = A_i on every token (GRPO), or per token / segment (a method's ``token_advantages``)
    w_t      = min(exp(logp_old - logp_rollout), C)           (TIS weight, detached; slime --use-tis, C = 2)
    l_t      = -w_t * min(r_t A_{i,t}, clip(r_t, 1 - eps_low, 1 + eps_high) A_{i,t})
    L        = agg(l_t + kl_coef * k3(pi_ref || pi_theta) - entropy_coef * H_t)   (both extra terms 0 in the paper)
    agg      = token-mean:          sum_i sum_t m_t l_t / sum_i sum_t m_t            (over the mini-batch)
               seq-mean-token-mean: (1/N) sum_i (sum_t m_t l_t / sum_t m_t)          (N samples in the mini-batch;
                                    slime's default, the framework of ARBOR §4.1: ``aggregate_token_losses``)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from arbor.group_stats import EPS, all_equal

ZERO_VAR_TOL = EPS  # a group whose rewards differ by at most this is outcome-homogeneous (Table 2; DAPO drops it)
LossAgg = Literal["token-mean", "seq-mean-token-mean"]
LOSS_AGGS: tuple[LossAgg, ...] = ("token-mean", "seq-mean-token-mean")


# ---------------------------------------------------------------------------------------------- advantages
def group_advantages(
    rewards: Sequence[float] | Tensor,
    groups: Sequence[int] | Tensor,
    norm: str = "std",
    eps: float = 1e-6,
) -> Tensor:
    """GRPO advantages, one per trajectory (DeepSeekMath §4.1.2; paper App. B.2).

    ``norm="std"``: ``A_i = (R_i - mean_g) / (std_g + eps)`` with the *sample* standard deviation (ddof = 1, the
    ``torch.std`` default slime uses); a group of one has std 0 and advantage 0. ``norm="mean"``: ``A_i = R_i - mean_g``.
    """
    if norm not in ("std", "mean"):
        raise ValueError(f"train.adv_norm must be 'std' or 'mean', got {norm!r}")
    r = torch.as_tensor(rewards, dtype=torch.float64)
    g = torch.as_tensor(groups)
    if r.shape != g.shape or r.ndim != 1:
        raise ValueError(f"rewards {tuple(r.shape)} and groups {tuple(g.shape)} must be equal-length vectors")
    adv = torch.zeros_like(r)
    for gid in torch.unique(g):
        idx = g == gid
        rg = r[idx]
        centred = rg - rg.mean()
        if norm == "mean":
            adv[idx] = centred
        else:
            std = rg.std(correction=1) if rg.numel() > 1 else torch.zeros((), dtype=r.dtype)
            adv[idx] = centred / (std + eps)
    return adv.float()


def segment_advantages(n_tokens: int, segments: Sequence[tuple[int, int, float]]) -> Tensor:
    """Per-token advantages of one trajectory from per-segment ones (stage- or turn-level credit).

    Each segment ``(start, end, A)`` gives A to the response tokens ``start <= j < end``; a token in no segment
    gets 0. Segments must lie inside ``[0, n_tokens)`` and not overlap. One segment ``(0, n, A_i)`` is GRPO's
    broadcast. Returns a float32 vector of length ``n_tokens``.
    """
    out = torch.zeros(n_tokens, dtype=torch.float32)
    covered = torch.zeros(n_tokens, dtype=torch.bool)
    for start, end, a in segments:
        if not 0 <= start <= end <= n_tokens:
            raise ValueError(f"segment [{start}, {end}) is outside the response's {n_tokens} tokens")
        if covered[start:end].any():
            raise ValueError(f"segment [{start}, {end}) overlaps an earlier segment")
        covered[start:end] = True
        out[start:end] = a
    return out


# ---------------------------------------------------------------------------------------------- zero-variance groups
def zero_variance_groups(rewards: Sequence[float], groups: Sequence[int], tol: float = ZERO_VAR_TOL) -> set[int]:
    """Groups whose rewards are all equal within ``tol`` (max - min <= tol): no GRPO signal (paper §1, Table 2)."""
    by_group: dict[int, list[float]] = {}
    for r, g in zip(rewards, groups, strict=True):
        by_group.setdefault(int(g), []).append(float(r))
    return {g for g, rs in by_group.items() if all_equal(rs, tol)}


# ---------------------------------------------------------------------------------------------- per-token loss
@dataclass
class LossOut:
    """Loss of one micro-batch and token-summed diagnostics (divide by ``tokens`` over the mini-batch)."""

    loss: Tensor
    tokens: float
    clip_sum: float
    approx_kl_sum: float
    tis_sum: float
    tis_clip_sum: float
    entropy_sum: float
    ref_kl_sum: float = 0.0  # sum of k3(pi_ref || pi_theta) over loss tokens (0 without a KL term)


def aggregate_token_losses(
    per_token: Tensor,
    mask: Tensor,
    agg: LossAgg = "token-mean",
    *,
    seq_lengths: Sequence[int] | None = None,
    n_tokens: float | None = None,
    n_seqs: float | None = None,
) -> Tensor:
    """One micro-batch's share of the mini-batch loss from per-token losses (ARBOR §4.1 / App. B.2: "GRPO with TIS
    in slime").

    ``token-mean``: sum_i sum_t m_it l_it / n_tokens, n_tokens = the mini-batch's loss tokens (default: this
    micro-batch's), so the micro-batches' shares add up to one mean over every token of the mini-batch.
    ``seq-mean-token-mean``: sum_i (sum_t m_it l_it / max(1, sum_t m_it)) / n_seqs, n_seqs = the mini-batch's
    samples (default: this micro-batch's), so the shares add up to the mean over samples of each sample's token
    mean: slime's reduction with ``calculate_per_token_loss`` off (its default), where every sample weighs the same
    whatever its length and a sample without loss tokens counts in N with 0.

    Samples: the rows of a 2-D ``per_token`` [N, T], or consecutive runs of ``seq_lengths`` positions of a flat
    one (the trainer's loss positions). ``mask`` has ``per_token``'s shape.
    """
    if agg not in LOSS_AGGS:
        raise ValueError(f"train.loss_agg must be one of {LOSS_AGGS}, got {agg!r}")
    m = mask.to(per_token.dtype)
    if agg == "token-mean":
        n = float(m.sum()) if n_tokens is None else float(n_tokens)
        return (per_token * m).sum() / max(n, 1.0)
    if seq_lengths is None:
        if per_token.ndim != 2:
            raise ValueError("seq-mean-token-mean: a flat per_token needs seq_lengths")
        sums, counts = (per_token * m).sum(-1), m.sum(-1)
    else:
        flat, fm = per_token.reshape(-1), m.reshape(-1)
        if sum(seq_lengths) != flat.numel():
            raise ValueError(f"seq_lengths add up to {sum(seq_lengths)}, per_token has {flat.numel()} positions")
        seg = torch.repeat_interleave(torch.arange(len(seq_lengths), device=flat.device),
                                      torch.as_tensor(list(seq_lengths), device=flat.device))
        sums = torch.zeros(len(seq_lengths), dtype=flat.dtype, device=flat.device).index_add(0, seg, flat * fm)
        counts = torch.zeros(len(seq_lengths), dtype=flat.dtype, device=flat.device).index_add(0, seg, fm)
    n = float(sums.numel()) if n_seqs is None else float(n_seqs)
    return (sums / counts.clamp(min=1.0)).sum() / max(n, 1.0)


def k3_kl(logp: Tensor, logp_ref: Tensor) -> Tensor:
    """Schulman's k3 estimator of KL(pi_theta || pi_ref) from samples of pi_theta: exp(d) - d - 1, d = ref - logp."""
    d = logp_ref - logp
    return torch.exp(d) - d - 1.0


def policy_loss(
    logp: Tensor,
    logp_old: Tensor,
    logp_rollout: Tensor,
    adv_tokens: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    tis_cap: float | None = 2.0,
    n_tokens: float | None = None,
    agg: LossAgg = "token-mean",
    seq_lengths: Sequence[int] | None = None,
    n_seqs: float | None = None,
    kl_coef: float = 0.0,
    logp_ref: Tensor | None = None,
    entropy_coef: float = 0.0,
    entropy: Tensor | None = None,
) -> LossOut:
    """Clipped surrogate with TIS (see the module docstring). All tensors [N, T] (or flat, with ``seq_lengths``).

    ``agg``, ``n_tokens``, ``seq_lengths``, ``n_seqs``: how the per-token losses are reduced
    (``aggregate_token_losses``); ``n_tokens`` / ``n_seqs`` count the whole mini-batch, so micro-batch losses add up
    to the mini-batch's. The diagnostics are token sums whatever ``agg``.
    """
    m = mask.to(logp.dtype)
    log_ratio = logp - logp_old
    ratio = torch.exp(log_ratio)
    surr1 = ratio * adv_tokens
    surr2 = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv_tokens
    pg = -torch.minimum(surr1, surr2)
    if tis_cap is not None:
        raw_w = torch.exp(logp_old - logp_rollout).detach()
        w = torch.clamp(raw_w, max=tis_cap)
        tis_clipped = (raw_w > tis_cap).to(logp.dtype)
    else:
        w = torch.ones_like(logp)
        tis_clipped = torch.zeros_like(logp)
    per_token = w * pg
    kl_ref = torch.zeros_like(logp)
    if kl_coef != 0.0:
        if logp_ref is None:
            raise ValueError("train.kl_coef != 0 needs reference log-probs")
        kl_ref = k3_kl(logp, logp_ref)
        per_token = per_token + kl_coef * kl_ref
    if entropy_coef != 0.0:
        if entropy is None:
            raise ValueError("train.entropy_coef != 0 needs token entropies")
        per_token = per_token - entropy_coef * entropy
    loss = aggregate_token_losses(per_token, mask, agg, seq_lengths=seq_lengths, n_tokens=n_tokens, n_seqs=n_seqs)
    with torch.no_grad():
        clipped = ((ratio < 1.0 - eps_low) & (adv_tokens < 0)) | ((ratio > 1.0 + eps_high) & (adv_tokens > 0))
        approx_kl = (ratio - 1.0) - log_ratio  # k3 estimate of KL(pi_old || pi_theta)
        ent = entropy.detach() if entropy is not None else torch.zeros_like(logp)
        return LossOut(
            loss=loss,
            tokens=float(m.sum()),
            clip_sum=float((clipped.to(m.dtype) * m).sum()),
            approx_kl_sum=float((approx_kl * m).sum()),
            tis_sum=float((w * m).sum()),
            tis_clip_sum=float((tis_clipped * m).sum()),
            entropy_sum=float((ent * m).sum()),
            ref_kl_sum=float((kl_ref.detach() * m).sum()),
        )


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """log pi(target) from logits [..., V] (computed in float32): logit[target] - logsumexp(logits)."""
    logits = logits.float()
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: Tensor) -> Tensor:
    """H = logsumexp(z) - sum softmax(z) z, per position."""
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1)
    return lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
