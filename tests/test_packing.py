"""Micro-batches with little padding: the packers by hand, packed rows scored like sequences
alone, and the micro-batch loss and gradients of packed rows equal to padded ones."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from arbor.tasks.training.head import PolicyHead
from arbor.tasks.training.losses import policy_loss
from arbor.tasks.training.packing import (
    Micro,
    make_micro,
    pack_by_lengths,
    pack_micro_batches,
    pack_rows,
    packing_mode,
)

VOCAB = 64


def tiny_lm(arch: str = "qwen3", attn: str = "sdpa") -> torch.nn.Module:
    """A 2-layer random decoder (the architecture of tests/test_train.py's tiny policy) in fp32."""
    torch.manual_seed(0)
    cls, conf = (Qwen3ForCausalLM, Qwen3Config) if arch == "qwen3" else (LlamaForCausalLM, LlamaConfig)
    cfg = conf(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8, max_position_embeddings=128, tie_word_embeddings=True,
               attn_implementation=attn)
    return cls(cfg).float()


def sequences(lengths: list[tuple[int, int]], seed: int = 1) -> tuple[list[list[int]], ...]:
    """Prompts, responses, loss masks (a 2-token result block where there is room) and rollout log-probs."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, VOCAB, (p,), generator=g).tolist() for p, _ in lengths]
    responses = [torch.randint(1, VOCAB, (r,), generator=g).tolist() for _, r in lengths]
    masks = [[0 if 2 <= j < 4 and r > 5 else 1 for j in range(r)] for _, r in lengths]
    lps = [(-torch.rand(r, generator=g) * 3 - 1).tolist() for _, r in lengths]
    return prompts, responses, masks, lps


def pack_by_tokens(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """The plain greedy padded packer (SFT's before the length packer), kept as the reference ``pack_by_lengths`` is held to:
    longest first, a new micro-batch when count x longest would pass ``max_tokens``."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        if cur and max(cur_max, lengths[i]) * (len(cur) + 1) > max_tokens:
            bins.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, lengths[i])
    if cur:
        bins.append(cur)
    return bins


def score(head: PolicyHead, m: Micro, entropy: str = "none") -> tuple[torch.Tensor, torch.Tensor]:
    return head(m.ids, m.att, m.rows, m.cols, m.targets, entropy=entropy, position_ids=m.pos)


def test_pack_by_tokens_by_hand() -> None:
    # lengths [5, 3, 8, 2], budget 10, longest first: [8] | 5 -> 8*2 = 16 > 10: new bin [5]; 3 -> 5*2 = 10 fits;
    # 2 -> 5*3 = 15 > 10: new bin [2]
    assert pack_by_tokens([5, 3, 8, 2], 10) == [[2], [0, 1], [3]]
    assert pack_by_tokens([50], 10) == [[0]]  # too long for the budget: alone


def test_pack_by_lengths_by_hand() -> None:
    # [10, 3, 3, 2], budget 20: greedy (pack_by_tokens) takes [10, 3] (2 x 10 = 20) then [3, 2]: 7 + 1 padded
    # tokens; [10] then [3, 3, 2] is also two micro-batches with 0 + 1
    assert pack_by_tokens([10, 3, 3, 2], 20) == [[0, 1], [2, 3]]
    assert pack_by_lengths([10, 3, 3, 2], 20) == [[0], [1, 2, 3]]
    # fewer micro-batches first: [6, 1] in one (5 padded) rather than two (none)
    assert pack_by_lengths([1, 6], 12) == [[1, 0]]
    # [5, 5, 4, 4, 1] budget 10: runs of two at most; three runs are needed: {5,5}{4,4}{1} pads 0
    assert pack_by_lengths([4, 5, 1, 5, 4], 10) == [[1, 3], [0, 4], [2]]
    assert pack_by_lengths([50, 3], 10) == [[0], [1]]  # too long for the budget: alone
    assert pack_by_lengths([], 10) == []


def test_pack_rows_by_hand() -> None:
    # lengths [8, 3, 5, 2, 4, 6], budget 16, longest first:
    # 8 opens A (width 8, 16 // 8 = 2 rows); 6 -> A's second row; 5 fits no row of A and A has 2 rows: opens B
    # (width 5, 3 rows); 4 -> B row 2; 3 -> B row 3; 2 -> A's second row (6 + 2 = 8)
    assert pack_rows([8, 3, 5, 2, 4, 6], 16) == [[[0], [5, 3]], [[2], [4], [1]]]
    # one row of up to 16: 8 + 6 + 2 | 5 + 4 + 3
    assert pack_rows([8, 3, 5, 2, 4, 6], 16, one_row=True) == [[[0, 5, 3]], [[2, 4, 1]]]
    # a sequence longer than the budget is alone, either way
    assert pack_rows([20, 3], 16) == [[[0]], [[1]]]
    assert pack_rows([20, 3], 16, one_row=True) == [[[0]], [[1]]]
    # the padded path of pack_micro_batches: one sequence a row
    assert pack_micro_batches([10, 3, 3, 2], 20, "padded") == [[[0]], [[1], [2], [3]]]


def test_pack_rows_keeps_the_budget() -> None:
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(1, 40, (60,), generator=g).tolist() + [70]
    for one_row in (False, True):
        micro = pack_rows(lengths, 64, one_row)
        assert sorted(i for mb in micro for row in mb for i in row) == list(range(len(lengths)))
        for mb in micro:
            width = max(sum(lengths[i] for i in row) for row in mb)
            assert len(mb) * width <= 64 or mb == [[len(lengths) - 1]]
            assert len(mb) == 1 or not one_row


def test_make_micro_layout_by_hand() -> None:
    prompts, responses, masks = [[1, 2], [3]], [[4, 5, 6], [7, 8]], [[1, 0, 1], [0, 1]]
    m = make_micro(prompts, responses, masks, layout=[2])
    assert m.ids.tolist() == [[1, 2, 4, 5, 6, 3, 7, 8]]
    assert m.pos.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]] and m.att is None
    # sequence 0's tokens 4 and 6 are predicted at columns 1 and 3, sequence 1's token 8 at 5 + 1
    assert (m.rows.tolist(), m.cols.tolist(), m.targets.tolist()) == ([0, 0, 0], [1, 3, 6], [4, 6, 8])
    assert m.spans == [(0, 2), (2, 3)] and m.tokens == 8
    m = make_micro(prompts, responses, masks, layout=[1, 1])
    assert m.ids.tolist() == [[1, 2, 4, 5, 6], [3, 7, 8, 0, 0]]
    assert m.pos.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]  # the padded tail: a sequence of its own
    assert (m.rows.tolist(), m.cols.tolist()) == ([0, 0, 1], [1, 3, 1])
    padded = make_micro(prompts, responses, masks)
    assert padded.pos is None and padded.att.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    with pytest.raises(ValueError, match="layout"):
        make_micro(prompts, responses, masks, layout=[3])


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_rows_score_like_each_sequence_alone(arch: str, attn: str) -> None:
    head = PolicyHead(tiny_lm(arch, attn), temperature=0.7).eval()
    assert packing_mode(head.lm) == "packed"
    prompts, responses, masks, _ = sequences([(5, 7), (3, 9), (4, 2), (6, 6)])
    with torch.no_grad():
        alone = [score(head, make_micro([p], [r], [k]), "detached") for p, r, k in zip(prompts, responses, masks, strict=True)]
        lp_alone = torch.cat([a[0] for a in alone])
        ent_alone = torch.cat([a[1] for a in alone])
        # rows [0, 1] [2] [3]: two sequences end to end, one with a padded tail, one alone
        packed = make_micro(prompts, responses, masks, layout=[2, 1, 1])
        assert packed.ids.shape == (3, 24)
        lp, ent = score(head, packed, "detached")
        torch.testing.assert_close(lp, lp_alone, atol=1e-5, rtol=0)
        torch.testing.assert_close(ent, ent_alone, atol=1e-5, rtol=0)
        # the check can fail: the same rows with plain positions let each sequence see the one before it
        leaky = head(packed.ids, None, packed.rows, packed.cols, packed.targets)[0]
        assert (leaky - lp_alone).abs().max() > 1e-3


def micro_loss(head: PolicyHead, micros: list[Micro], old: list[torch.Tensor]) -> torch.Tensor:
    """The trainer's per-micro-batch loss (``Trainer._micro_loss``) summed over a mini-batch, backward done."""
    n_tokens = float(sum(float(m.mask.sum()) for m in micros))
    total = torch.zeros(())
    for m, o in zip(micros, old, strict=True):
        logp, ent = score(head, m, "grad")
        out = policy_loss(logp, o, m.rollout_lp, m.adv, m.mask, eps_low=0.2, eps_high=0.28,
                          tis_cap=2.0, n_tokens=n_tokens, kl_coef=0.1, logp_ref=o - 0.05, entropy_coef=0.01,
                          entropy=ent)
        out.loss.backward()
        total = total + out.loss.detach()
    return total


@pytest.mark.parametrize("packing", ["packed", "varlen"])
def test_packed_micro_batches_give_the_padded_loss_and_gradients(packing: str) -> None:
    """The same mini-batch through today's padded micro-batches and through packed rows: the summed loss and every
    gradient agree (fp32); pi_old of each layout is its own no-grad pass, as in ``Trainer.logprobs``."""
    head = PolicyHead(tiny_lm(), temperature=0.7)
    lengths = [(5, 11), (4, 7), (5, 9), (2, 2), (5, 13), (4, 8), (1, 1), (4, 3)]  # 16 11 14 4 18 12 2 7 tokens
    prompts, responses, masks, lps = sequences(lengths, seed=2)
    advs = [torch.full((len(r),), a) for r, a in zip(responses, (1.0, -0.5, 0.25, -1.0, 0.75, 0.5, 2.0, -0.25),
                                                        strict=True)]
    total = [p + r for p, r in lengths]

    def run(micro: list[list[list[int]]], layout: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ms = []
        for rows in micro:
            mb = [i for row in rows for i in row]
            ms.append(make_micro([prompts[i] for i in mb], [responses[i] for i in mb], [masks[i] for i in mb],
                                 [lps[i] for i in mb], advantages=[advs[i] for i in mb],
                                 layout=[len(r) for r in rows] if layout else None))
        with torch.no_grad():
            old = [score(head, m)[0] for m in ms]
        head.zero_grad()
        loss = micro_loss(head, ms, old)
        return loss, {n: p.grad.clone() for n, p in head.named_parameters()}

    # by hand, budget 40: padded 18 16 | 14 12 | 11 7 4 | 2; packed rows (width = the longest) 18, 16 2 | 14, 12 |
    # 11, 7 4; one row each (varlen) 18 16 4 2 | 14 12 11 | 7
    padded = [[[i] for i in mb] for mb in pack_by_tokens(total, 40)]
    rows = pack_micro_batches(total, 40, packing)
    assert padded == [[[4], [0]], [[2], [5]], [[1], [7], [3]], [[6]]]
    assert rows == ([[[4], [0, 6]], [[2], [5]], [[1], [7, 3]]] if packing == "packed"
                    else [[[4, 0, 3, 6]], [[2, 5, 1]], [[7]]])
    loss_p, grads_p = run(padded, False)
    loss_r, grads_r = run(rows, True)
    torch.testing.assert_close(loss_r, loss_p, atol=1e-6, rtol=1e-5)
    for n, g in grads_p.items():
        torch.testing.assert_close(grads_r[n], g, atol=1e-5, rtol=1e-5, msg=n)
    assert max(float(g.abs().max()) for g in grads_p.values()) > 1e-3  # the gradients are not all ~0


def test_packing_mode_by_attention_and_model() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    lm = tiny_lm("qwen3", "eager")
    assert packing_mode(lm) == "packed"
    lm.config._attn_implementation = "flash_attention_2"  # read from its config only; not run here
    assert packing_mode(lm) == "varlen"
    lm.config._attn_implementation = "flex_attention"  # not checked: padded
    assert packing_mode(lm) == "padded"
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    assert packing_mode(gpt2) == "padded"  # a model type whose source was not read
