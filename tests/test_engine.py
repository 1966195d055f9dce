"""The DeepSpeed side of the trainers (``tasks.training.engine``) by hand: the LR schedule, the config the
trainer owns over the profile's JSON, the JSON's reading, and the rendezvous port of a single process."""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path

import pytest

from arbor.tasks.training.engine import (
    _port_free,
    deepspeed_config,
    init_single_process_env,
    lr_factor,
    merge,
    read_deepspeed_json,
)


def test_lr_factor_warm_up_then_constant_or_cosine() -> None:
    const = lr_factor("constant", warmup_steps=2, total_steps=10)
    assert [const(u) for u in (0, 1, 2, 9, 50)] == [0.5, 1.0, 1.0, 1.0, 1.0]
    cos = lr_factor("cosine", warmup_steps=2, total_steps=10)
    # after the warm-up: progress (u - 2) / 8, factor (1 + cos(pi progress)) / 2, 0 from the last step on
    assert [cos(u) for u in (0, 1, 2, 6, 10, 20)] == pytest.approx([0.5, 1.0, 1.0, 0.5, 0.0, 0.0])
    assert cos(4) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert lr_factor("cosine", warmup_steps=0, total_steps=4)(0) == 1.0  # no warm-up: the full rate at once


def test_merge_is_deep_and_leaves_its_inputs_alone() -> None:
    base = {"a": {"b": 1, "c": 2}, "d": 1}
    assert merge(base, {"a": {"b": 3}, "d": {"x": 1}}) == {"a": {"b": 3, "c": 2}, "d": {"x": 1}}
    assert base == {"a": {"b": 1, "c": 2}, "d": 1}


def test_the_trainer_owns_stage_precision_and_batching(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    extra = {"zero_optimization": {"stage": 1, "overlap_comm": True}, "bf16": {"enabled": False, "x": 1},
             "train_batch_size": 64, "gradient_clipping": 5.0, "gradient_accumulation_steps": 8,
             "optimizer": {"type": "Adam"}}
    cfg = deepspeed_config(zero_stage=3, bf16=True, grad_clip=1.0, extra=extra)
    assert cfg["zero_optimization"] == {"stage": 3, "overlap_comm": True, "stage3_gather_16bit_weights_on_model_save": True}
    assert cfg["bf16"] == {"enabled": True, "x": 1}
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"],
            cfg["gradient_clipping"]) == (2, 1, 1, 1.0)
    assert cfg["optimizer"] == {"type": "Adam"}  # other keys of the profile's JSON pass through
    assert "stage3_gather_16bit_weights_on_model_save" not in deepspeed_config(
        zero_stage=2, bf16=False, grad_clip=1.0)["zero_optimization"]


def test_read_deepspeed_json(tmp_path: Path) -> None:
    assert read_deepspeed_json(None) == {}
    assert read_deepspeed_json("configs/deepspeed/qwen3-8b.json")["zero_optimization"]  # relative: the project root
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_deepspeed_json(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text('{\n  "a": 1,\n}')
    with pytest.raises(ValueError, match=r"bad.json:3: not valid JSON"):
        read_deepspeed_json(str(tmp_path / "bad.json"))
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        read_deepspeed_json(str(tmp_path / "list.json"))


def test_a_single_process_moves_off_a_taken_port(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: False)  # as in a fresh process (other tests may start a group)
    for key in ("MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        monkeypatch.setenv("MASTER_PORT", str(port))
        assert not _port_free(port)
        init_single_process_env()
        assert os.environ["MASTER_PORT"] != str(port) and _port_free(int(os.environ["MASTER_PORT"]))
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("0", "1", "0")


@pytest.mark.slow
def test_a_zero3_engine_trains_without_compiling_deepspeeds_shm_op(tmp_path: Path) -> None:
    """A fresh process with an empty extension cache loads a model under ZeRO-3 (zero.Init starts the process group),
    builds the engine and takes an AdamW step: DeepSpeed compiles nothing (it compiled its shm all-reduce op here,
    ~60 CPU-s per environment, for an inference path training never calls), the step moves the weights, and neither
    mlflow was loaded on the way (engine.UNUSED_IMPORTS), though it imports afterwards."""
    import subprocess
    import sys

    from arbor.tasks.env.policy import build_tiny_policy

    cache = tmp_path / "extensions"
    cache.mkdir()
    policy = build_tiny_policy(home=tmp_path / "home")  # here: building it is not what the process measures
    code = """
import torch
from arbor.tasks.training.engine import build_engine, deepspeed_config, init_single_process_env, load_model
init_single_process_env()
ds = deepspeed_config(zero_stage=3, bf16=False, grad_clip=1.0)
model = load_model(POLICY, bf16=False, ds_config=ds, gradient_checkpointing="none")
engine = build_engine(model, ds_config=ds, lr=1e-2, weight_decay=0.0, betas=(0.9, 0.999), schedule="constant",
                      warmup_steps=0, total_steps=1)
import torch.distributed as dist
from deepspeed.comm import comm
ids = torch.tensor([[5, 6, 7, 8]])
lm = engine.module.lm
before = sum(float(p.ds_tensor.sum()) for p in lm.parameters())
loss = lm(input_ids=ids, labels=ids).loss
engine.backward(loss)
engine.step()
after = sum(float(p.ds_tensor.sum()) for p in lm.parameters())
print("backend", dist.get_backend(), "shm op", comm.cdb.shm_comm_op, "moved", before != after)
import sys
print("mlflow loaded", "mlflow" in sys.modules)
import mlflow
print("importable", mlflow.__name__)
""".replace("POLICY", repr(str(policy)))
    got = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TORCH_EXTENSIONS_DIR": str(cache)},
                         capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr[-3000:]
    assert "backend gloo shm op None moved True" in got.stdout, got.stdout[-2000:]
    assert "mlflow loaded False" in got.stdout and "importable mlflow" in got.stdout
    assert list(cache.iterdir()) == []  # no op built, no build folder made
