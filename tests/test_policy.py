"""The tiny CPU policy: Qwen3 architecture, locally trained byte-level BPE, HF format, same loader as a hub id."""

from __future__ import annotations

import json

import pytest
import torch

from arbor.tasks.env.agent import build_prompt_ids
from arbor.tasks.env.policy import (
    BENCH_50M,
    TINY_SHAPES,
    PolicyLoadError,
    TinyPolicyConfig,
    build_tiny_model,
    build_tiny_policy,
    load_policy,
    n_parameters,
    train_tokenizer,
)

SMALL = TinyPolicyConfig(vocab_size=700, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32)
TEXTS = ["Scott Derrickson is an American director.", "<search> Ed Wood </search>", "<answer>\\boxed{x}</answer>"]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(vocab_size=SMALL.vocab_size, texts=iter(TEXTS * 50))


def test_tokenizer_treats_tags_like_qwen3(tok):
    # <think> / </think> and the chat delimiters are single special tokens ...
    for special in ("<think>", "</think>", "<|im_start|>", "<|im_end|>"):
        ids = tok.encode(special, add_special_tokens=False)
        assert len(ids) == 1 and ids[0] in tok.all_special_ids, special
    # ... while the tool tags are plain text, several ordinary tokens each (string stops in generation)
    for plain in ("<search>", "</search>", "<result>", "<answer>", "</answer>"):
        ids = tok.encode(plain, add_special_tokens=False)
        assert len(ids) > 1 and not set(ids) & set(tok.all_special_ids), plain
        assert tok.decode(ids) == plain
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    text = tok.decode(build_prompt_ids(tok, "Who?"), skip_special_tokens=False)
    assert text.endswith("<|im_start|>user\nWho?<|im_end|>\n<|im_start|>assistant\n")


def test_tokenizer_training_is_deterministic(tok):
    again = train_tokenizer(vocab_size=SMALL.vocab_size, texts=iter(TEXTS * 50))
    assert again.get_vocab() == tok.get_vocab()


def test_tiny_model_shapes_and_parameter_count(tok):
    m = build_tiny_model(SMALL, tok)
    assert type(m).__name__ == "Qwen3ForCausalLM" and m.config.tie_word_embeddings
    assert m.config.vocab_size == len(tok)
    # hand count: embed len(tok)*64 (tied; the small training text gives 314 tokens) + 2 layers * [q 64*64 + k 64*32 + v 64*32 + o 64*64 + q/k norms 32+32
    #   + mlp 3*64*128 + 2 layer norms 2*64] + final norm 64
    per_layer = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 32 + 32 + 3 * 64 * 128 + 2 * 64
    assert len(tok) == 314 and n_parameters(m) == 314 * 64 + 2 * per_layer + 64  # = 94,272
    assert 4_000_000 < n_parameters(build_tiny_model(TinyPolicyConfig(), None)) < 6_000_000  # the ~5M default
    assert 40_000_000 < n_parameters(build_tiny_model(BENCH_50M, None)) < 60_000_000
    # policy.tiny_shape 1.5m: embed 8192*128 (tied) + 2 layers * [q 128*128 + k, v 128*64 + o 128*128 + norms 64+64
    #   + mlp 3*128*384 + 2*128] + 128
    small = 2 * (128 * 128 + 2 * 128 * 64 + 128 * 128 + 64 + 64 + 3 * 128 * 384 + 2 * 128)
    assert n_parameters(build_tiny_model(TINY_SHAPES["1.5m"], None)) == 8192 * 128 + small + 128  # = 1,443,200
    assert TINY_SHAPES["5m"] == TinyPolicyConfig()
    same = build_tiny_model(SMALL, tok)  # seeded init: same config -> same weights
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), same.state_dict().values(), strict=True))


def test_save_and_reload_gives_identical_logits(tok, tmp_path):
    m = build_tiny_model(SMALL, tok)
    m.save_pretrained(tmp_path / "p")
    tok.save_pretrained(tmp_path / "p")
    m2, tok2 = load_policy(tmp_path / "p")
    ids = torch.tensor([build_prompt_ids(tok, "Who directed Doctor Strange?")])
    assert build_prompt_ids(tok2, "Who directed Doctor Strange?") == ids[0].tolist()
    with torch.no_grad():
        assert torch.equal(m(input_ids=ids).logits, m2(input_ids=ids).logits)
    assert tok2.padding_side == "left"


def test_build_tiny_policy_is_cached_and_loadable(tmp_path, monkeypatch):
    import arbor.tasks.env.policy as policy

    # a small corpus stands in for the shipped files only to keep this test fast; the code path is the same
    monkeypatch.setattr(policy, "tokenizer_training_text", lambda *a, **k: iter(TEXTS * 50))
    cfg = TinyPolicyConfig(vocab_size=600, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=1, num_key_value_heads=1, head_dim=32)
    path = build_tiny_policy(cfg, home=tmp_path)
    assert (path / "config.json").exists() and (path / "tokenizer.json").exists()
    assert json.loads((path / "arbor_tiny.json").read_text())["hidden_size"] == 32
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_policy(cfg, home=tmp_path) == path  # built once
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert not list(path.parent.glob("*.tmp-*"))
    model, tok = load_policy(path)
    assert model.config.hidden_size == 32 and tok.eos_token == "<|im_end|>"


def test_hub_id_offline_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(PolicyLoadError, match="could not load 'Qwen/Qwen3-8B'.*offline"):
        load_policy("Qwen/Qwen3-8B")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PolicyLoadError, match="without config.json"):
        load_policy(tmp_path / "empty")
    with pytest.raises(PolicyLoadError, match="policy.dtype"):
        load_policy(tmp_path / "empty", dtype="int3")


def test_policy_source_follows_the_config(tmp_path, monkeypatch):
    import arbor.tasks.env.policy as policy
    from arbor.config import load_config

    monkeypatch.setattr(policy, "tokenizer_training_text", lambda *a, **k: iter(TEXTS * 50))  # data only, fast
    path = policy.policy_source(load_config("tiny-world").policy, tmp_path)
    assert json.loads((path / "config.json").read_text())["hidden_size"] == 128  # policy.tiny_shape: 1.5m
    assert json.loads((path / "config.json").read_text())["num_hidden_layers"] == 2
    mine = tmp_path / "mine"
    cfg = load_config("tiny-cpu", {"policy.tiny_path": str(mine)}).policy
    assert policy.policy_source(cfg, tmp_path) == mine and not mine.exists()  # a given path is used, not built
    hub = load_config("tiny-cpu", {"policy.model": "Qwen/Qwen3-8B"}).policy
    assert policy.policy_source(hub, tmp_path) == "Qwen/Qwen3-8B"  # not tiny: the model itself
