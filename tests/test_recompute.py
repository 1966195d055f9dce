"""Activation recompute chosen by a memory budget: the estimate by hand, the choice, every other
layer recomputing (observed in the backward), and the same loss and gradients in every mode."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from arbor.config import ConfigError, load_config
from arbor.tasks.training.engine import load_model
from arbor.tasks.training.recompute import (
    MODES,
    DecoderShape,
    MemoryBudget,
    apply_recompute,
    choose_recompute,
    decoder_shape,
    layer_activation_bytes,
    memory_budget,
    peak_memory_estimate,
)

SHAPE = DecoderShape(hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, layers=3, params=1000,
                     trainable=600)


def test_peak_memory_estimate_by_hand() -> None:
    # one layer at 10 tokens in bf16: q = 2 x 4 = 8, kv = 1 x 4 = 4; 10 x 2 x (4*8 + 4*8 + 4*4 + 4*16) = 20 x 144
    assert layer_activation_bytes(SHAPE, 10, 2) == 2880
    # ZeRO-2 on 2 ranks, bf16: params 1000 x 2 (whole) + grads 600 x 2 / 2 + (8 Adam + 8 master/fp32 grad) 600 x 16 / 2
    states = 2000 + 600 + 4800
    inp = 10 * 2 * 8  # a layer's input I = 160; 2 I outside the layers
    est = {m: peak_memory_estimate(SHAPE, m, tokens=10, dtype_bytes=2, zero_stage=2, world=2) for m in MODES}
    assert est["none"] == states + 3 * 2880 + 2 * inp == 16360
    # 3 layers: layers 0 and 2 recompute (2 I), layer 1 keeps A, and the top one (2) rebuilds A while the rest is held
    assert est["every_other"] == states + 2880 + 2 * inp + 2880 + 2 * inp == 13800
    assert est["all"] == states + 3 * inp + 2880 + 2 * inp == 11080
    # 4 layers: the top layer (3) keeps its activations, so no extra A
    four = peak_memory_estimate(replace(SHAPE, layers=4), "every_other", tokens=10, dtype_bytes=2, zero_stage=2,
                                world=2)
    assert four == states + 2 * 2880 + 2 * inp + 2 * inp == 13800
    # ZeRO-3, fp32, a frozen reference copy: params 4000 / 2, grads 2400 / 2, Adam 600 x 8 / 2; reference 4000 / 2
    fp32 = peak_memory_estimate(SHAPE, "none", tokens=10, dtype_bytes=4, zero_stage=3, world=2, reference_copy=True)
    assert fp32 == (2000 + 1200 + 2400) + 2000 + 3 * 5760 + 2 * 320 == 25520
    with pytest.raises(ValueError, match="recompute mode"):
        peak_memory_estimate(SHAPE, "half", tokens=10, dtype_bytes=2, zero_stage=2)


def test_the_least_recompute_that_fits_is_chosen() -> None:
    est = {"none": 30, "every_other": 20, "all": 10}
    assert choose_recompute(est, None) == "none"  # no limit (CPU without a configured budget)
    assert choose_recompute(est, 30) == "none"
    assert choose_recompute(est, 29.9) == "every_other"
    assert choose_recompute(est, 15) == "all"
    assert choose_recompute(est, 5) == "all"  # nothing fits: the least memory
    assert memory_budget(MemoryBudget(tokens=1, budget_gib=1.5)) == 1.5 * 2**30
    assert memory_budget(MemoryBudget(tokens=1), torch.device("cpu")) is None


def test_old_booleans_and_modes_in_the_config() -> None:
    assert load_config("tiny-cpu", {}).train.gradient_checkpointing == "auto"
    for given, want in ((True, "all"), (False, "none"), ("true", "all"), ("every_other", "every_other")):
        assert load_config("tiny-cpu", {"train.gradient_checkpointing": given}).train.gradient_checkpointing == want
    with pytest.raises(ConfigError, match="gradient_checkpointing"):
        load_config("tiny-cpu", {"train.gradient_checkpointing": "half"})


def tiny(layers: int = 4) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    model = Qwen3ForCausalLM(cfg)
    model.config.use_cache = False
    return model


def loss_and_backward_counts(model: Qwen3ForCausalLM) -> tuple[torch.Tensor, list[int], dict[str, torch.Tensor]]:
    """Loss, how often each layer's MLP started during the backward (a recomputing layer reruns its forward there;
    a pre-hook, since torch's non-reentrant recompute stops as soon as it has the saved tensors it needs, before
    the MLP returns), and the gradients."""
    model.train()
    calls = [0] * len(model.model.layers)
    in_backward = [False]

    def count(n: int):
        def hook(*_: object) -> None:
            calls[n] += in_backward[0]
        return hook

    hooks = [layer.mlp.register_forward_pre_hook(count(n)) for n, layer in enumerate(model.model.layers)]
    ids = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=ids, labels=ids).loss
    in_backward[0] = True
    loss.backward()
    for h in hooks:
        h.remove()
    return loss.detach(), calls, {k: p.grad.clone() for k, p in model.named_parameters()}


def test_every_other_layer_recomputes_the_even_layers_only() -> None:
    want = {"none": [0, 0, 0, 0], "every_other": [1, 0, 1, 0], "all": [1, 1, 1, 1]}
    base_loss, base_calls, base_grads = loss_and_backward_counts(tiny())
    assert base_calls == want["none"]
    for mode in ("every_other", "all"):
        model = tiny()
        apply_recompute(model, mode)
        loss, calls, grads = loss_and_backward_counts(model)
        assert calls == want[mode], mode
        assert torch.allclose(loss, base_loss, rtol=0, atol=1e-6)
        for k, g in base_grads.items():
            assert torch.allclose(grads[k], g, rtol=0, atol=1e-6), (mode, k)


def test_auto_picks_every_other_between_the_estimates_and_says_so(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny"
    tiny().save_pretrained(path)
    tokens = 4096
    est = {m: peak_memory_estimate(decoder_shape(tiny()), m, tokens=tokens, dtype_bytes=4, zero_stage=2)
           for m in MODES}
    assert est["none"] > est["every_other"] > est["all"]
    budget = (est["none"] + est["every_other"]) / 2 / 2**30  # every_other fits, none does not
    model = load_model(path, bf16=False, ds_config={"zero_optimization": {"stage": 2}}, gradient_checkpointing="auto",
                       memory=MemoryBudget(tokens, budget_gib=budget))
    assert loss_and_backward_counts(model)[1] == [1, 0, 1, 0]
    line = capsys.readouterr().out
    assert "auto -> every_other" in line and f"budget {budget:.3g} GiB" in line
    # without a budget on the CPU: no recompute; an explicit choice is kept
    model = load_model(path, bf16=False, ds_config={"zero_optimization": {"stage": 2}}, gradient_checkpointing="auto",
                       memory=MemoryBudget(tokens))
    assert loss_and_backward_counts(model)[1] == [0, 0, 0, 0]
    model = load_model(path, bf16=False, ds_config={"zero_optimization": {"stage": 2}}, gradient_checkpointing=True)
    assert loss_and_backward_counts(model)[1] == [1, 1, 1, 1]
