"""GRPO / TIS losses and DAPO's equations (``tasks/methods/dapo/equations.py``) against values computed by hand
(paper App. B.2)."""

from __future__ import annotations

import math

import pytest
import torch

from arbor.tasks.methods.dapo.equations import (
    dynamic_sampling_filter,
    dynamic_sampling_refill,
    overlong_penalty,
)
from arbor.tasks.training.losses import (
    aggregate_token_losses,
    group_advantages,
    k3_kl,
    policy_loss,
    token_entropy,
    token_logprobs,
    zero_variance_groups,
)


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------- advantages
def test_group_advantages_std_by_hand() -> None:
    # group 0: R = [1, 0, 0, 1]: mean 0.5, sample std = sqrt((4 * 0.25) / 3) = sqrt(1/3) = 0.577350
    #   A = +-0.5 / (0.577350 + 1e-6) = +-0.866024
    # group 1: R = [2, 2]: std 0 -> A = 0 / (0 + eps) = 0
    # group 2: a single trajectory -> A = 0
    adv = group_advantages([1, 0, 0, 1, 2, 2, 5], [0, 0, 0, 0, 1, 1, 2], norm="std", eps=1e-6)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert torch.allclose(adv, torch.tensor([a, -a, -a, a, 0.0, 0.0, 0.0]), atol=1e-6)


def test_group_advantages_mean_only_by_hand() -> None:
    # group 0: R = [1, 0, 0.5]: mean 0.5 -> A = [0.5, -0.5, 0]; group 1: R = [3, 1]: mean 2 -> [1, -1]
    adv = group_advantages([1, 0, 0.5, 3, 1], [0, 0, 0, 1, 1], norm="mean")
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, 0.0, 1.0, -1.0]))
    # std-normalised version differs: group 1 sample std = sqrt(((1)^2 + (1)^2) / 1) = 1.41421 -> +-0.707106
    adv_std = group_advantages([3, 1], [1, 1], norm="std", eps=0.0)
    assert torch.allclose(adv_std, torch.tensor([1 / math.sqrt(2), -1 / math.sqrt(2)]))


def test_group_advantages_rejects_unknown_norm() -> None:
    with pytest.raises(ValueError, match="adv_norm"):
        group_advantages([1.0], [0], norm="rank")


# ---------------------------------------------------------------------------------------------- clipped surrogate
def test_clipping_on_both_sides_by_hand() -> None:
    # tokens: (ratio, A) = (1.5, +1) (0.5, +1) (0.5, -1) (1.5, -1), eps = 0.2, no TIS
    #   l = -min(r A, clip(r, 0.8, 1.2) A):
    #   (1.5, +1): -min(1.5, 1.2) = -1.2   (clipped high: no gradient)
    #   (0.5, +1): -min(0.5, 0.8) = -0.5   (unclipped)
    #   (0.5, -1): -min(-0.5, -0.8) = 0.8  (clipped low: no gradient)
    #   (1.5, -1): -min(-1.5, -1.2) = 1.5  (pessimistic branch, unclipped)
    #   mean = (-1.2 - 0.5 + 0.8 + 1.5) / 4 = 0.15; clip fraction 2/4
    ratio = t([[1.5, 0.5, 0.5, 1.5]])
    logp = torch.log(ratio).requires_grad_(True)
    old = torch.zeros_like(logp)
    adv = t([[1.0, 1.0, -1.0, -1.0]])
    out = policy_loss(logp, old, old, adv, torch.ones_like(adv), eps_low=0.2, eps_high=0.2, tis_cap=None)
    assert out.loss.item() == pytest.approx(0.15)
    assert out.clip_sum / out.tokens == pytest.approx(0.5)
    out.loss.backward()
    # d l / d logp = -A r / 4 where unclipped: token 1: -0.5/4 = -0.125; token 3: +1.5/4 = 0.375; clipped: 0
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -0.125, 0.0, 0.375])
    # approx KL (k3 of pi_old vs pi_theta): mean of (r - 1) - log r
    k3 = [(r - 1) - math.log(r) for r in (1.5, 0.5, 0.5, 1.5)]
    assert out.approx_kl_sum / out.tokens == pytest.approx(sum(k3) / 4)


def test_dapo_clip_higher_by_hand() -> None:
    # ratio 1.25, A = +1: symmetric eps 0.2 clips to 1.2 (loss -1.2); DAPO eps_high 0.28 leaves 1.25 (loss -1.25)
    logp = torch.log(t([[1.25]]))
    zero = torch.zeros_like(logp)
    one = torch.ones_like(logp)
    sym = policy_loss(logp, zero, zero, one, one, eps_low=0.2, eps_high=0.2, tis_cap=None)
    dapo = policy_loss(logp, zero, zero, one, one, eps_low=0.2, eps_high=0.28, tis_cap=None)
    assert sym.loss.item() == pytest.approx(-1.2)
    assert dapo.loss.item() == pytest.approx(-1.25)
    # the low side still clips at 0.8 for a negative advantage: ratio 0.7, A = -1 -> -min(-0.7, -0.8) = 0.8
    low = policy_loss(torch.log(t([[0.7]])), zero, zero, -one, one, eps_low=0.2, eps_high=0.28, tis_cap=None)
    assert low.loss.item() == pytest.approx(0.8)


def test_tis_truncation_by_hand() -> None:
    # ratio 1 (logp = logp_old = 0), A = +1: per-token loss = -w.
    # token 0: logp_old - logp_rollout = log 3 -> w = min(3, C=2) = 2 (truncated)
    # token 1: logp_old - logp_rollout = log 0.5 -> w = 0.5
    # loss = -(2 + 0.5) / 2 = -1.25; mean TIS weight 1.25; TIS clip fraction 1/2
    logp = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 2, dtype=torch.float64)
    rollout = t([[-math.log(3.0), math.log(2.0)]])
    adv = torch.ones(1, 2, dtype=torch.float64)
    out = policy_loss(logp, old, rollout, adv, torch.ones_like(adv), tis_cap=2.0)
    assert out.loss.item() == pytest.approx(-1.25)
    assert out.tis_sum / out.tokens == pytest.approx(1.25)
    assert out.tis_clip_sum / out.tokens == pytest.approx(0.5)
    out.loss.backward()
    # the weight is detached: d l / d logp = -w * A * r / n = [-2/2, -0.5/2]
    assert logp.grad.tolist()[0] == pytest.approx([-1.0, -0.25])


def test_masked_tokens_contribute_nothing() -> None:
    # the masked token (a search-result token) carries absurd values; loss and gradients must ignore it
    logp = t([[math.log(1.1), 5.0, math.log(0.9)]]).requires_grad_(True)
    old = t([[0.0, -20.0, 0.0]])
    rollout = t([[0.0, 0.0, 0.0]])
    mask = t([[1.0, 0.0, 1.0]])
    adv = t([[1.0, 100.0, 1.0]])
    out = policy_loss(logp, old, rollout, adv, mask, tis_cap=2.0)
    # unmasked tokens: -1.1 and -0.9 (both inside the clip range), over 2 loss tokens: -1.0
    assert out.loss.item() == pytest.approx(-1.0)
    assert out.tokens == 2.0
    out.loss.backward()
    assert logp.grad[0, 1].item() == 0.0


def test_micro_batch_losses_add_up_to_token_mean() -> None:
    # token-level aggregation over the mini-batch: sequences of different lengths weigh by their tokens
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(4, 5, generator=g, dtype=torch.float64) * 0.1
    old = torch.zeros_like(logp)
    adv = torch.randn(4, 1, generator=g, dtype=torch.float64).expand(4, 5)
    mask = t([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [0, 1, 1, 1, 0]])
    full = policy_loss(logp, old, old, adv, mask).loss
    n = float(mask.sum())
    parts = policy_loss(logp[:2], old[:2], old[:2], adv[:2], mask[:2], n_tokens=n).loss + policy_loss(
        logp[2:], old[2:], old[2:], adv[2:], mask[2:], n_tokens=n
    ).loss
    assert parts.item() == pytest.approx(full.item())


def test_kl_and_entropy_terms() -> None:
    # k3: logp = log 0.5, logp_ref = log 0.25: d = log 0.5, exp(d) - d - 1 = 0.5 + 0.693147 - 1 = 0.193147
    assert k3_kl(torch.tensor(math.log(0.5)), torch.tensor(math.log(0.25))).item() == pytest.approx(0.193147, abs=1e-6)
    # uniform logits over 4 tokens: H = log 4, log pi(any) = -log 4
    z = torch.zeros(1, 4)
    assert token_entropy(z).item() == pytest.approx(math.log(4))
    assert token_logprobs(z, torch.tensor([2])).item() == pytest.approx(-math.log(4))
    # off by default: the coefficients are 0 so the loss equals the plain surrogate
    one = torch.ones(1, 1)
    base = policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), one, one).loss
    with_terms = policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), one, one,
                             kl_coef=0.5, logp_ref=torch.full((1, 1), math.log(0.5)),
                             entropy_coef=0.1, entropy=torch.full((1, 1), 2.0)).loss
    # -1 (surrogate) + 0.5 * k3(d = log 0.5 = -0.693147: 0.5 + 0.693147 - 1 = 0.193147) - 0.1 * 2 = -1.103426
    assert base.item() == pytest.approx(-1.0)
    assert with_terms.item() == pytest.approx(-1.0 + 0.5 * 0.193147 - 0.2, abs=1e-6)


# ---------------------------------------------------------------------------------------------- DAPO
def test_dapo_drops_exactly_the_zero_variance_groups() -> None:
    rewards = [1, 1, 1,  0, 1e-10, 0,  0, 0.5, 0,  0.3, 0.3 + 2e-9]
    groups = [0, 0, 0,  1, 1, 1,  2, 2, 2,  3, 3]
    # g0 all equal; g1 differs by 1e-10 <= 1e-9 (homogeneous); g2 differs; g3 differs by 2e-9 > 1e-9 (kept)
    assert zero_variance_groups(rewards, groups) == {0, 1}
    keep, dropped = dynamic_sampling_filter(rewards, groups)
    assert dropped == 2
    assert keep == [6, 7, 8, 9, 10]


def test_dapo_oversampling_hook_refills() -> None:
    calls: list[int] = []
    fresh = iter([[[1.0, 1.0]], [[0.0, 1.0], [2.0, 2.0]]])

    def resample(n: int) -> list[list[float]]:
        calls.append(n)
        return next(fresh)

    # 3 groups, one informative; target 2: round 1 asks 1 (gets a homogeneous one), round 2 asks 1 again
    kept, dropped, rounds = dynamic_sampling_refill([[0, 0], [0, 1], [1, 1]], 2, resample, max_rounds=3)
    assert kept == [1, 4]
    assert calls == [1, 1]
    assert rounds == 2
    assert dropped == 4  # seen 6 groups, kept 2


def test_overlong_penalty_by_hand() -> None:
    # L_max 100, L_cache 20: <= 80 -> 0; 90 -> (80 - 90) / 20 = -0.5; 100 -> -1; beyond -> -1
    assert [overlong_penalty(n, 100, 20) for n in (50, 80, 90, 100, 130)] == [0.0, 0.0, -0.5, -1.0, -1.0]


# ---------------------------------------------------------------------------------------------- aggregation
def test_token_mean_and_seq_mean_token_mean_by_hand() -> None:
    # sample A: 1 loss token, l = 4; sample B: 3 loss tokens, l = 1, 2, 3 (and a masked position, l = 100)
    #   token-mean          = (4 + 1 + 2 + 3) / 4 = 2.5
    #   seq-mean-token-mean = (4/1 + 6/3) / 2 = (4 + 2) / 2 = 3.0   (slime's default: each sample weighs 1/N)
    per_token = t([[4.0, 0.0, 0.0, 0.0], [1.0, 2.0, 100.0, 3.0]])
    mask = t([[1, 0, 0, 0], [1, 1, 0, 1]])
    assert float(aggregate_token_losses(per_token, mask, "token-mean")) == pytest.approx(2.5, abs=1e-12)
    assert float(aggregate_token_losses(per_token, mask, "seq-mean-token-mean")) == pytest.approx(3.0, abs=1e-12)
    # the flat layout of the trainer's loss positions (samples as runs of seq_lengths) gives the same
    flat, fmask = t([[4.0, 1.0, 2.0, 100.0, 3.0]])[0], t([[1, 1, 1, 0, 1]])[0]
    got = aggregate_token_losses(flat, fmask, "seq-mean-token-mean", seq_lengths=[1, 4])
    assert float(got) == pytest.approx(3.0, abs=1e-12)
    # split over two micro-batches with the mini-batch's counts, the shares add up to the mini-batch's value:
    #   token-mean 4/4 + 6/4 = 2.5; seq-mean 4/2 + 2/2 = 3.0; an extra sample without loss tokens counts in N: 6/3
    one, two = (flat[:1], fmask[:1]), (flat[1:], fmask[1:])
    tok = sum(float(aggregate_token_losses(x, m, "token-mean", n_tokens=4)) for x, m in (one, two))
    seq = sum(float(aggregate_token_losses(x, m, "seq-mean-token-mean", seq_lengths=[len(x)], n_seqs=2))
              for x, m in (one, two))
    assert (tok, seq) == (pytest.approx(2.5, abs=1e-12), pytest.approx(3.0, abs=1e-12))
    empty = aggregate_token_losses(per_token, mask, "seq-mean-token-mean", n_seqs=3)
    assert float(empty) == pytest.approx(2.0, abs=1e-12)
    with pytest.raises(ValueError, match="loss_agg"):
        aggregate_token_losses(per_token, mask, "sum")  # type: ignore[arg-type]


def test_policy_loss_seq_mean_token_mean_gradient_by_hand() -> None:
    # ratio 1 (logp = logp_old), no TIS, no clipping at r = 1: l_t = -A_t, dl_t/dlogp_t = -A_t.
    # A = [-4 | -1, -2, -3] over samples of 1 and 3 tokens: loss = (4 + (1 + 2 + 3)/3) / 2 = 3.0 and
    # dL/dlogp = [4 * 1/2 | 1 * 1/6, 2 * 1/6, 3 * 1/6]; token-mean: 2.5 and [4, 1, 2, 3] / 4
    for agg, loss, grad in (("seq-mean-token-mean", 3.0, [2.0, 1 / 6, 2 / 6, 3 / 6]),
                            ("token-mean", 2.5, [1.0, 0.25, 0.5, 0.75])):
        logp = torch.zeros(4, dtype=torch.float64, requires_grad=True)
        out = policy_loss(logp, torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64),
                          t([[-4.0, -1.0, -2.0, -3.0]])[0], torch.ones(4, dtype=torch.float64), tis_cap=None,
                          agg=agg, seq_lengths=[1, 3])  # type: ignore[arg-type]
        out.loss.backward()
        assert out.loss.item() == pytest.approx(loss, abs=1e-12)
        assert torch.allclose(logp.grad, t([grad])[0], atol=1e-12)
        assert out.tokens == 4.0 and out.clip_sum == 0.0  # diagnostics stay token sums
