"""The chunked policy head: values and gradients equal full logits' to 1e-6 in float32, and no
[positions x vocabulary] tensor is ever allocated."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from arbor.tasks.training.head import PolicyHead, chunk_positions, chunked_logprobs
from arbor.tasks.training.losses import token_entropy, token_logprobs

# float32 sums in two orders (chunked, full): on an AMD EPYC, with torch's default threads, elements differed by up
# to 5.7e-6 (a few ulps of values up to ~10); a wrong formula or a dropped chunk is off by O(0.1)
TOL = dict(rtol=1e-5, atol=1e-5)


def full_head(hidden, weight, bias, targets, temperature, entropy):
    """Today's path: full logits, ``.float() / T``, then token_logprobs / token_entropy."""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    if temperature != 1.0:
        logits = logits.float() / temperature
    logp = token_logprobs(logits, targets)
    if entropy == "grad":
        return logp, token_entropy(logits)
    if entropy == "detached":
        return logp, token_entropy(logits.detach())
    return logp, torch.zeros_like(logp)


def leaves(n: int, d: int, v: int, bias: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g).requires_grad_()
    w = (torch.randn(v, d, generator=g) * 3 / d**0.5).requires_grad_()  # logits of std ~3, as an LM's
    b = torch.randn(v, generator=g).requires_grad_() if bias else None
    return h, w, b, torch.randint(0, v, (n,), generator=g)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
@pytest.mark.parametrize("entropy", ["none", "detached", "grad"])
@pytest.mark.parametrize("chunk", [7, 64])  # 7 does not divide 50 positions; 64 is one chunk
def test_values_and_gradients_equal_full_logits(temperature: float, entropy: str, chunk: int) -> None:
    bias = chunk == 7
    wa = torch.randn(50, generator=torch.Generator().manual_seed(1))  # upstream gradients of both outputs
    wb = torch.randn(50, generator=torch.Generator().manual_seed(2))
    results = []
    for fn in (full_head, lambda *a: chunked_logprobs(*a, chunk=chunk)):
        h, w, b, y = leaves(50, 16, 97, bias, seed=0)
        logp, ent = fn(h, w, b, y, temperature, entropy)
        loss = (wa * logp).sum() + ((wb * ent).sum() if entropy == "grad" else 0.0)
        loss.backward()
        results.append((logp.detach(), ent.detach(), h.grad, w.grad, b.grad if bias else None))
    (lp0, e0, gh0, gw0, gb0), (lp1, e1, gh1, gw1, gb1) = results
    assert lp1.dtype == e1.dtype == torch.float32
    torch.testing.assert_close(lp1, lp0, **TOL)
    torch.testing.assert_close(e1, e0, **TOL)
    torch.testing.assert_close(gh1, gh0, **TOL)
    torch.testing.assert_close(gw1, gw0, **TOL)
    if bias:
        torch.testing.assert_close(gb1, gb0, **TOL)
    if entropy != "none":
        assert e1.abs().sum() > 0


@pytest.mark.parametrize("entropy", ["none", "grad"])
def test_one_chunk_keeps_its_logits_and_changes_nothing(entropy: str) -> None:
    """Every position in one chunk: the forward's logits serve the backward (no recompute), and values and
    gradients are those of the recomputing path bit for bit; a recompute that the kept path skipped is counted."""
    results, recomputed = [], []
    for keep in (False, True):
        h, w, b, y = leaves(40, 16, 97, True, seed=5)
        with LinearCalls() as calls:
            logp, ent = chunked_logprobs(h, w, b, y, 0.7, entropy, chunk=64, keep_logits=keep)
            ((torch.arange(40.0) * logp).sum() + ent.sum()).backward()
        recomputed.append(calls.count)
        results.append((logp.detach(), ent.detach(), h.grad, w.grad, b.grad))
    for got, want in zip(results[1], results[0], strict=True):
        assert torch.equal(got, want)
    assert recomputed == [2, 1]  # the forward's linear, and the backward's recompute only without keep_logits


class LinearCalls(TorchDispatchMode):
    """How many times the head's logits are computed (addmm: linear with a bias) while active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.addmm.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_entropy_gradient_alone() -> None:
    """A loss of the entropy only (entropy_coef with zero advantages): dH/dz = -p (z - E[z]), nothing from logp."""
    grads = []
    for fn in (full_head, lambda *a: chunked_logprobs(*a, chunk=5)):
        h, w, b, y = leaves(12, 8, 31, False, seed=3)
        _, ent = fn(h, w, b, y, 0.8, "grad")
        ent.sum().backward()
        grads.append((h.grad, w.grad))
    torch.testing.assert_close(grads[1][0], grads[0][0], **TOL)
    torch.testing.assert_close(grads[1][1], grads[0][1], **TOL)


class LargestTensor(TorchDispatchMode):
    """The largest number of elements of any tensor an operator returns while active."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_positions_by_vocabulary_tensor_forward_or_backward() -> None:
    n, d, v, chunk = 300, 8, 1000, 32
    h, w, _, y = leaves(n, d, v, False, seed=4)
    with LargestTensor() as mode:
        logp, ent = chunked_logprobs(h, w, None, y, 0.7, "grad", chunk=chunk)
        (logp.sum() + ent.sum()).backward()
    assert mode.largest <= chunk * v  # one chunk's logits, never n x v
    with LargestTensor() as full:  # the check itself sees today's full logits
        full_head(h, w, None, y, 0.7, "grad")
    assert full.largest >= n * v


def test_chunk_size_from_the_byte_budget() -> None:
    assert chunk_positions(151936) == 2**28 // (4 * 151936) == 441
    assert chunk_positions(10**12) == 1
    with pytest.raises(ValueError):
        chunked_logprobs(*leaves(2, 2, 3, False, 0)[:2], None, torch.tensor([0, 1]), entropy="all")


def tiny_lm():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)
    return Qwen3ForCausalLM(cfg).float()


def test_policy_head_scores_and_trains_like_full_logits() -> None:
    """The trainer's head (chunked) against today's path on the same model: log-probs, entropy and every
    parameter's gradient (the tied embedding included)."""
    lm = tiny_lm()
    head = PolicyHead(lm, temperature=0.7)
    assert head.chunked()
    ids = torch.randint(1, 101, (3, 20), generator=torch.Generator().manual_seed(5))
    att = torch.ones_like(ids)
    att[2, 15:] = 0
    rows = torch.tensor([0, 0, 1, 1, 1, 2, 2])
    cols = torch.tensor([3, 9, 0, 10, 18, 4, 13])
    tgts = torch.tensor([5, 7, 11, 100, 0, 42, 3])
    logp, ent = head(ids, att, rows, cols, tgts, entropy="grad")
    (logp.sum() * 0.3 + ent.sum() * 0.1).backward()
    got = {n: p.grad.clone() for n, p in lm.named_parameters()}
    lm.zero_grad()
    hidden = lm.base_model(input_ids=ids, attention_mask=att).last_hidden_state
    ref_lp, ref_ent = full_head(hidden[rows, cols], lm.lm_head.weight, None, tgts, 0.7, "grad")
    (ref_lp.sum() * 0.3 + ref_ent.sum() * 0.1).backward()
    torch.testing.assert_close(logp, ref_lp, **TOL)
    torch.testing.assert_close(ent, ref_ent, **TOL)
    for n, p in lm.named_parameters():
        torch.testing.assert_close(got[n], p.grad, **TOL, msg=n)
