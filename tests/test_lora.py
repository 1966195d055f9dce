"""LoRA for the policy (Hu et al. 2021): the merge formula by hand, an adapted model that starts as
its base model, a DeepSpeed step that moves only the adapters, checkpoints that transformers and PEFT load, SFT's
merged output, and a resume that is bitwise equal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train import VOCAB, make_batch, make_trainer, tiny_model_dir
from torch import nn
from transformers import AutoModelForCausalLM

from arbor.tasks.training import checkpoint as ckpt
from arbor.tasks.training import lora
from arbor.tasks.training.weight_sync import load_into_module

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA = {"policy.lora.enabled": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("models"), tie=False, seed=1)


def ids(seed: int = 3) -> torch.Tensor:
    return torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(seed))


def logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=x).logits


def start_state(model_dir: Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(model_dir).state_dict()


# ---------------------------------------------------------------------------------------------- the formula
def test_merged_weight_is_w_plus_scaled_ba_by_hand() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj = nn.Linear(3, 2)
            self.other = nn.Linear(2, 2)

    m = Block()
    assert lora.add_lora(m, r=1, alpha=4.0, dropout=0.0, targets=["q_proj"]) == 1
    layer = m.q_proj
    assert isinstance(layer, lora.LoRALinear) and layer.scaling == 4.0 and lora.lora_scaling(16, 32) == 2.0
    with torch.no_grad():
        layer.base.weight.copy_(torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
        layer.base.bias.copy_(torch.tensor([0.5, -0.5]))
        layer.lora_A.copy_(torch.tensor([[1.0, 0.0, -1.0]]))
        layer.lora_B.copy_(torch.tensor([[2.0], [-1.0]]))
    # B A = [[2, 0, -2], [-1, 0, 1]]; times alpha / r = 4: [[8, 0, -8], [-4, 0, 4]]; plus W:
    want = torch.tensor([[9.0, 2.0, -5.0], [0.0, 5.0, 10.0]])
    assert torch.equal(layer.merged_weight(), want)
    sd = lora.merged_state_dict(m)
    assert set(sd) == {"q_proj.weight", "q_proj.bias", "other.weight", "other.bias"}  # the plain model's names
    assert torch.equal(sd["q_proj.weight"], want) and torch.equal(sd["q_proj.bias"], torch.tensor([0.5, -0.5]))
    assert torch.equal(sd["other.weight"], m.other.weight)
    x = torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, -1.0]])
    with torch.no_grad():  # the adapted layer computes what the merged plain layer does: W' x + b
        assert torch.allclose(layer(x), x @ want.T + torch.tensor([0.5, -0.5]))
    # only the adapters train
    assert sorted(n for n, p in m.named_parameters() if p.requires_grad) == ["q_proj.lora_A", "q_proj.lora_B"]
    assert lora.adapter_state_dict(m.state_dict()).keys() == {"base_model.model.q_proj.lora_A.weight",
                                                              "base_model.model.q_proj.lora_B.weight"}


def test_adapted_model_starts_as_its_base_model(model_dir: Path) -> None:
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    m = AutoModelForCausalLM.from_pretrained(model_dir)
    g = torch.Generator().manual_seed(7)
    assert lora.add_lora(m, 16, 32.0, 0.0, TARGETS, generator=g) == 7 * 2  # seven projections in each of 2 layers
    assert torch.equal(logits(m, ids()), logits(base, ids()))  # B = 0: exactly the base model
    trainable = [n for n, p in m.named_parameters() if p.requires_grad]
    assert len(trainable) == 2 * 14 and all(n.endswith((".lora_A", ".lora_B")) for n in trainable)
    merged = lora.merged_state_dict(m)
    assert merged.keys() == base.state_dict().keys()
    assert all(torch.equal(merged[k], v) for k, v in base.state_dict().items())
    # a seeded generator draws the same A on every run; another seed other ones
    again = AutoModelForCausalLM.from_pretrained(model_dir)
    lora.add_lora(again, 16, 32.0, 0.0, TARGETS, generator=torch.Generator().manual_seed(7))
    other = AutoModelForCausalLM.from_pretrained(model_dir)
    lora.add_lora(other, 16, 32.0, 0.0, TARGETS, generator=torch.Generator().manual_seed(8))
    a = "model.layers.0.self_attn.q_proj.lora_A"
    assert torch.equal(m.state_dict()[a], again.state_dict()[a])
    assert not torch.equal(m.state_dict()[a], other.state_dict()[a])
    with pytest.raises(ValueError, match="no linear layer named"):
        lora.add_lora(AutoModelForCausalLM.from_pretrained(model_dir), 4, 8.0, 0.0, ["qkv"])


def test_adapted_forward_equals_the_merged_plain_model(model_dir: Path) -> None:
    m = AutoModelForCausalLM.from_pretrained(model_dir)
    lora.add_lora(m, 4, 8.0, 0.0, TARGETS, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for layer in lora.lora_layers(m).values():
            layer.lora_B.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
    plain = AutoModelForCausalLM.from_pretrained(model_dir)
    start = logits(plain, ids())
    load_into_module(plain, lora.merged_state_dict(m))  # strict: the plain names, nothing missing or extra
    got, want = logits(plain, ids()), logits(m, ids())
    assert torch.allclose(got, want, atol=1e-5)
    assert (got - start).abs().max() > 1e-2  # the adapters moved the function, and the merge carries it


# ---------------------------------------------------------------------------------------------- the trainer
def test_lora_step_moves_only_the_adapters_and_exports_merged_weights(model_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel

    tr = make_trainer(model_dir, tmp_path / "home", **LORA)
    head = tr.engine.module
    adapters = sum(p.numel() for n, p in head.named_parameters() if n.endswith((".lora_A", ".lora_B")))
    assert adapters == sum(p.numel() for p in head.parameters() if p.requires_grad)
    # the optimizer holds the adapters only (ZeRO-2's fp32 partition): no Adam state for the frozen weights
    assert sum(p.numel() for p in tr.engine.optimizer.single_partition_of_fp32_groups) == adapters
    raw_before = {k: v.clone() for k, v in ckpt.module_state_dict(tr.engine, 2).items()}
    synced_before = {k: v.clone() for k, v in tr.state_dict_for_sync().items()}
    start = start_state(model_dir)
    assert synced_before.keys() == start.keys() and all(torch.equal(synced_before[k], start[k]) for k in start)

    m = tr.train_step(make_batch(1, 0), 1)
    assert m["grad_norm"] > 0 and tr.policy_version == 1
    raw = ckpt.module_state_dict(tr.engine, 2)
    # base weights bit-identical, every adapter B moved off zero
    adapter_b = [k for k in raw if k.endswith(".lora_B")]
    base = [k for k in raw if not k.endswith((".lora_A", ".lora_B"))]
    assert adapter_b and base
    assert [k for k in adapter_b if torch.equal(raw[k], raw_before[k])] == []
    assert [k for k in base if not torch.equal(raw[k], raw_before[k])] == []
    synced = tr.state_dict_for_sync()
    assert synced.keys() == start.keys()  # what the rollout engine and vLLM receive: plain names
    moved = {k for k in start if not torch.equal(synced[k], start[k])}
    assert moved == {f"{p}.weight" for p in lora.lora_layers(head.lm)}  # merged: exactly the adapted weights moved

    # the checkpoint: ds/ (exact resume), hf/ (merged, plain from_pretrained), adapter/ (PEFT)
    path = tr.save_checkpoint(1)
    assert {"ds", "hf", "adapter", "state.json", "COMPLETE"} <= {p.name for p in path.iterdir()}
    assert load_file(str(path / "hf" / "model.safetensors")).keys() == start.keys()
    x = ids()
    want = tr.full_logits(x)
    exported = logits(AutoModelForCausalLM.from_pretrained(path / "hf"), x)
    assert torch.allclose(exported, want, atol=1e-5)
    assert (exported - logits(AutoModelForCausalLM.from_pretrained(model_dir), x)).abs().max() > 1e-4
    config = json.loads((path / "adapter" / "adapter_config.json").read_text())
    assert (config["peft_type"], config["task_type"], config["r"], config["lora_alpha"]) == ("LORA", "CAUSAL_LM", 16, 32)
    assert sorted(config["target_modules"]) == sorted(TARGETS)
    assert Path(config["base_model_name_or_path"]) == model_dir.resolve()
    keys = load_file(str(path / "adapter" / "adapter_model.safetensors")).keys()
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys and len(keys) == 2 * 14
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), path / "adapter")
    assert torch.allclose(logits(peft_model, x), exported, atol=1e-5)
    # export_hf (the service's weight sync) writes the same merged weights
    out = tr.export_hf(tmp_path / "export")
    assert all(torch.equal(v, synced[k]) for k, v in load_file(str(out / "model.safetensors")).items())


def test_lora_off_changes_nothing(model_dir: Path, tmp_path: Path) -> None:
    """Full fine-tuning (the default): every weight trains and a checkpoint holds no adapter/ folder."""
    tr = make_trainer(model_dir, tmp_path / "home")
    assert not lora.has_lora(tr.engine.module)
    assert sum(p.numel() for p in tr.engine.optimizer.single_partition_of_fp32_groups) == sum(
        p.numel() for p in tr.engine.module.parameters())
    tr.train_step(make_batch(1, 0), 1)
    assert not (tr.save_checkpoint(1) / "adapter").exists()


def test_arco_trains_its_policy_with_lora(model_dir: Path, tmp_path: Path) -> None:
    """run.method=arco with policy.lora: the policy's step (ARCO's sparse-phase turn credit) moves the adapters."""
    tr = make_trainer(model_dir, tmp_path / "home", **{**LORA, "run.method": "arco"})
    before = {k: v.clone() for k, v in ckpt.module_state_dict(tr.engine, 2).items()}
    tr.train_step(make_batch(1, 0), 1)
    after = ckpt.module_state_dict(tr.engine, 2)
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert changed and all(k.endswith((".lora_A", ".lora_B")) for k in changed)


def test_lora_under_zero3_exports_the_merged_policy(model_dir: Path, tmp_path: Path) -> None:
    tr = make_trainer(model_dir, tmp_path / "home", **{**LORA, "train.zero_stage": 3})
    tr.train_step(make_batch(1, 0), 1)
    path = tr.save_checkpoint(1)
    x = ids()
    exported = logits(AutoModelForCausalLM.from_pretrained(path / "hf"), x)
    assert torch.allclose(exported, tr.full_logits(x), atol=1e-5)
    assert load_file(str(path / "hf" / "model.safetensors")).keys() == start_state(model_dir).keys()
    assert len(load_file(str(path / "adapter" / "adapter_model.safetensors"))) == 2 * 14


def test_lora_resume_replay_is_bitwise_equal(model_dir: Path, tmp_path: Path, deterministic: None) -> None:
    """Steps 1..3 uninterrupted vs. steps 1..2 (checkpoint at 2), a fresh trainer that loads it and replays 3:
    adapters, merged weights and the optimizer state (one more identical step) are bitwise equal."""
    o = {**LORA, "checkpoint.every": 2, "checkpoint.keep_last": 1, "train.updates_per_batch": 2}
    batches = {s: make_batch(s, s - 1) for s in range(1, 5)}
    a = make_trainer(model_dir, tmp_path / "a", **o)
    for s in (1, 2, 3):
        a.train_step(batches[s], s)
    b = make_trainer(model_dir, tmp_path / "b", **o)
    for s in (1, 2):
        b.train_step(batches[s], s)
        b.maybe_save(s)
    del b
    torch.manual_seed(999)  # a fresh process state: the adapters' seeded init does not depend on it
    c = make_trainer(model_dir, tmp_path / "b", **o)
    assert c.load_latest() == 2
    c.train_step(batches[3], 3)
    for tr in (a, c):
        tr.train_step(batches[4], 4)
    ra, rc = ckpt.module_state_dict(a.engine, 2), ckpt.module_state_dict(c.engine, 2)
    assert ra.keys() == rc.keys() and all(torch.equal(ra[k], rc[k]) for k in ra)
    sa, sc = a.state_dict_for_sync(), c.state_dict_for_sync()
    assert all(torch.equal(sa[k], sc[k]) for k in sa)


# ---------------------------------------------------------------------------------------------- SFT
def test_sft_with_lora_writes_a_merged_plain_checkpoint(tmp_path: Path) -> None:
    from test_sft import ROWS

    from arbor.config import load_config
    from arbor.tasks.env.policy import build_tiny_policy
    from arbor.tasks.training.sft import run_sft

    start = build_tiny_policy(home=tmp_path / "home")
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    cfg = load_config("tiny-cpu", {**LORA, "policy.lora.r": 4, "sft.epochs": 3, "sft.batch_size": 2,
                                   "sft.lr": 1e-2})
    summary = run_sft(cfg, start, data, tmp_path / "out", home=tmp_path)
    assert summary["updates"] == 3 and summary["last_loss"] < summary["first_loss"]
    out = Path(summary["out"])
    base = start_state(start)
    got = {}
    for f in out.glob("*.safetensors"):
        got.update(load_file(str(f)))
    assert got.keys() <= base.keys() and not any("lora" in k or ".base." in k for k in got)
    moved = {k for k in got if not torch.equal(got[k], base[k])}
    assert moved and all(k.rsplit(".", 2)[-2] in TARGETS for k in moved)  # only adapted weights, merged in
    model = AutoModelForCausalLM.from_pretrained(out)
    assert not lora.has_lora(model) and not (out / lora.ADAPTER_CONFIG).exists()
