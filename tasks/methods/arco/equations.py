"""ARCO's equations as pure functions (the ARCO paper §3 as its authors' code implements it).

A trajectory's *steps* are its policy turns: the maximal runs of loss-mask-1 tokens between tool results
(``turn_spans``). The rubric model mu scores step t with K criteria, s_{t,k} in [-1, 1], and s̄_t = mean_k s_{t,k}.

    decomposition loss     L_mu = w(R) (sum_t s̄_t - R)^2                      (+ beta KL on the criteria tokens)
    class balance          w_pos = N / (2 n_pos), w_neg = N / (2 n_neg)        (positive: R > threshold)
    returns                G_t = sum_{t'>=t} s̄_t'  |  that sum / (T - t)  |  s̄_t + gamma G_{t+1}
    buckets                the k-th search step: search_k; an answer or any other step: terminal; the last step
                           is always terminal (an unfinished trajectory ends there too)
    dense advantage        A_t = c (G_t - b_bucket(t)), b the batch mean of G in the bucket (a singleton bucket,
                           or baseline=global: the mean over every step of the batch)
    sparse advantage       A = R - mean of the group's R, on every step (no std normalisation)
    teacher projection     x = clamp(v + lambda, -1, 1), lambda by bisection so that sum_t mean_k x_{t,k} = R
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

TERMINAL = "terminal"


# ---------------------------------------------------------------------------------------------- steps of a trajectory
def step_kind(turn_text: str, search_open: str = "<search>", answer_open: str = "<answer>") -> str:
    """``finish`` when the turn gives an answer, ``search`` when it searches, else ``other``."""
    if answer_open in turn_text:
        return "finish"
    if search_open in turn_text:
        return "search"
    return "other"


def step_buckets(kinds: Sequence[str]) -> list[str]:
    """Position buckets of a trajectory's steps: ``search_k`` for its k-th search, ``terminal`` for an answer or
    any other step, and ``terminal`` for the last step whatever it did."""
    out = []
    n_search = 0
    for t, kind in enumerate(kinds):
        if kind == "search" and t < len(kinds) - 1:
            n_search += 1
            out.append(f"search_{n_search}")
        else:
            out.append(TERMINAL)
    return out


# ---------------------------------------------------------------------------------------------- mu's losses
def step_means(step_scores: Tensor | Sequence[Sequence[float]]) -> Tensor:
    """s̄_t = mean_k s_{t,k} of a [T, K] score matrix."""
    s = step_scores if isinstance(step_scores, Tensor) else torch.tensor(step_scores, dtype=torch.float64)
    return s.mean(dim=-1)


def decomposition_loss(step_scores: Tensor | Sequence[Sequence[float]], R: float, weight: float = 1.0) -> Tensor:
    """w (sum_t s̄_t - R)^2 of one trajectory: its step scores must add up to its outcome."""
    return weight * (step_means(step_scores).sum() - R) ** 2


def class_balance_weights(outcomes: Sequence[float], threshold: float = 0.5) -> list[float]:
    """w_pos = N / (2 n_pos) for R > threshold, w_neg = N / (2 n_neg) otherwise (counts at least 1)."""
    n = len(outcomes)
    pos = [r > threshold for r in outcomes]
    n_pos, n_neg = max(sum(pos), 1), max(n - sum(pos), 1)
    return [n / (2 * n_pos) if p else n / (2 * n_neg) for p in pos]


# ---------------------------------------------------------------------------------------------- the policy's credit
def reward_to_go(step_scores: Sequence[float], signal: str = "sum", gamma: float = 0.9) -> list[float]:
    """G_t of one trajectory from its step scores s̄_t (``signal``: sum, avg or discounted)."""
    n = len(step_scores)
    out = [0.0] * n
    acc = 0.0
    for t in range(n - 1, -1, -1):
        if signal == "discounted":
            acc = step_scores[t] + gamma * acc
            out[t] = acc
        else:
            acc += step_scores[t]
            out[t] = acc / (n - t) if signal == "avg" else acc
    if signal not in ("sum", "avg", "discounted"):
        raise ValueError(f"signal must be sum, avg or discounted, got {signal!r}")
    return out


def bucket_baselines(returns: Sequence[Sequence[float]], buckets: Sequence[Sequence[str]],
                     mode: str = "position_bucket") -> list[list[float]]:
    """b for every step of a batch: the mean G of its bucket over the batch (a singleton bucket, or
    ``mode=global``: the mean G over every step of the batch)."""
    flat = [g for gs in returns for g in gs]
    glob = sum(flat) / len(flat) if flat else 0.0
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for gs, bs in zip(returns, buckets, strict=True):
        for g, b in zip(gs, bs, strict=True):
            sums[b] = sums.get(b, 0.0) + g
            counts[b] = counts.get(b, 0) + 1
    out = []
    for bs in buckets:
        if mode == "global":
            out.append([glob] * len(bs))
        else:
            out.append([sums[b] / counts[b] if counts[b] > 1 else glob for b in bs])
    return out


def dense_advantages(returns: Sequence[Sequence[float]], baselines: Sequence[Sequence[float]],
                     c: float = 0.5) -> list[list[float]]:
    """A_t = c (G_t - b_t) for every step of every trajectory of the batch."""
    return [[c * (g - b) for g, b in zip(gs, bs, strict=True)] for gs, bs in zip(returns, baselines, strict=True)]


def sparse_advantages(rewards: Sequence[float], groups: Sequence[int]) -> list[float]:
    """A_i = R_i - mean of R over i's group (group-baseline REINFORCE, no std normalisation)."""
    by: dict[int, list[float]] = {}
    for r, g in zip(rewards, groups, strict=True):
        by.setdefault(int(g), []).append(float(r))
    return [float(r) - sum(by[int(g)]) / len(by[int(g)]) for r, g in zip(rewards, groups, strict=True)]


def turn_token_advantages(n_tokens: int, spans: Sequence[tuple[int, int]], values: Sequence[float]) -> Tensor:
    """Per-token advantages: every token of turn t carries A_t; tokens outside the turns (tool results) get 0."""
    out = torch.zeros(n_tokens, dtype=torch.float32)
    if len(spans) != len(values):
        raise ValueError(f"{len(spans)} turns but {len(values)} advantages")
    for (start, end), a in zip(spans, values, strict=True):
        if not 0 <= start <= end <= n_tokens:
            raise ValueError(f"turn [{start}, {end}) is outside the response's {n_tokens} tokens")
        out[start:end] = a
    return out


# ---------------------------------------------------------------------------------------------- the teacher warm-up
def project_labels(labels: Sequence[Sequence[float]], R: float, iters: int = 80, lo: float = -2.0,
                   hi: float = 2.0) -> tuple[list[list[float]], float]:
    """The teacher's step labels v_{t,k} in [-1, 1] moved by one shift so that sum_t mean_k x_{t,k} = R:
    x = clamp(v + lambda, -1, 1), lambda by bisection on [lo, hi]. R outside what clamping allows ([-T, T]) gets
    the nearest bound. Returns (x, lambda)."""
    if not labels:
        return [], 0.0
    T = len(labels)
    target = min(max(R, -T), T)

    def total(lam: float) -> float:
        return sum(sum(min(1.0, max(-1.0, v + lam)) for v in row) / len(row) for row in labels)

    lam = 0.0
    if abs(total(0.0) - target) > 1e-9:
        a, b = lo, hi
        for _ in range(iters):  # total() is non-decreasing in lambda
            mid = (a + b) / 2
            if total(mid) < target:
                a = mid
            else:
                b = mid
        lam = (a + b) / 2
    return [[min(1.0, max(-1.0, v + lam)) for v in row] for row in labels], lam
