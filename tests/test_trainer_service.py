"""Launch command builder and the JSON control channel, with a real CPU trainer process."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from arbor.config import load_config
from arbor.tasks.training.trainer_service import (
    TrainerService,
    build_launch_command,
    read_update,
    write_update,
)
from arbor.tasks.training.update import policy_update
from arbor.types import Trajectory


def test_launch_command_cpu_and_gpu() -> None:
    cpu = load_config("tiny-cpu")
    argv, env = build_launch_command(cpu.train, cpu.cluster, "/c", "/m", "/h", python="/py", master_port=29600)
    assert argv == ["/py", "-m", "arbor.tasks.training.trainer_service", "--channel", "/c", "--model-path", "/m", "--home", "/h"]
    assert env == dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="29600", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")

    gpu = load_config("tiny-cpu", {"train.num_gpus": 8})
    argv, env = build_launch_command(gpu.train, gpu.cluster, "/c", "/m", "/h", master_port=29601)
    assert argv[:8] == ["deepspeed", "--num_gpus", "8", "--master_port", "29601", "--no_local_rank", "--module",
                        "arbor.tasks.training.trainer_service"]
    assert env == {}
    nodes = load_config("tiny-cpu", {"train.hostfile": "/etc/hosts.ds"})
    argv, _ = build_launch_command(nodes.train, nodes.cluster, "/c", "/m", "/h", master_port=29602)
    assert argv[:3] == ["deepspeed", "--hostfile", "/etc/hosts.ds"] and "--num_gpus" not in argv


def _trajectories(step: int, version: int) -> list[Trajectory]:
    g = torch.Generator().manual_seed(step)
    rows = []
    for s in range(4):
        t = Trajectory(run_id="svc", step=step, group=0, sample=s, question_id="q", question="?", golds=["a"],
                       prompt_ids=torch.randint(1, 64, (5,), generator=g).tolist(),
                       response_ids=torch.randint(1, 64, (6,), generator=g).tolist(), loss_mask=[1, 1, 0, 0, 1, 1],
                       rollout_logprobs=[-4.0, -4.0, 0.0, 0.0, -4.0, -4.0], base_reward=float(s % 2),
                       policy_version=version)
        rows.append(t)
    return rows


def write_batch(path: Path, step: int, version: int) -> Path:
    """A plain GRPO update of four trajectories of ``version``, as the controller sends it (``write_update``)."""
    tiny = load_config("tiny-cpu")
    return write_update(policy_update(_trajectories(step, version), step, tiny.train, tiny.run.overlap), path)


def test_service_trains_saves_dies_and_resumes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = tmp_path / "model"
    Qwen3ForCausalLM(Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=128)).save_pretrained(model)
    cfg = load_config("tiny-cpu", {"run.run_id": "svc", "train.lr": 1e-3})
    b1, b2 = write_batch(tmp_path / "b1.parquet", 1, 0), write_batch(tmp_path / "b2.parquet", 2, 1)
    svc = TrainerService(cfg, model, tmp_path / "home", tmp_path / "channel", python=sys.executable)
    svc.start()
    try:
        assert svc.call("ping", timeout_s=300) == {"ok": True, "step": 0, "policy_version": 0}
        r = svc.call("train", step=1, update=str(b1))
        assert r["ok"], r
        assert r["policy_version"] == 1 and r["metrics"]["loss_tokens"] == 16
        # a bad command answers ok=false and the service keeps serving
        bad = svc.call("train", step=2, update=str(b1))  # batch of version 0, trainer at version 1
        assert not bad["ok"] and "policy version 0" in bad["error"]
        saved = svc.call("save", step=1, wait=False)  # written in the background
        assert saved["ok"] and saved["committed"] in (None, 1) and saved["path"].endswith("step_000001")
        r2 = svc.call("train", step=2, update=str(b2))
        assert r2["ok"]
        assert svc.call("finish_save") == {"ok": True, "committed": 1}
        assert svc.call("export_hf", path=str(tmp_path / "uninterrupted"))["ok"]

        # the process group dies (killed mid-run): restart, load step 1, replay step 2 from its stored batch
        svc.kill()
        assert not svc.alive()
        replayed: list[int | None] = []

        def batches_after(step: int | None) -> list[tuple[int, str]]:
            replayed.append(step)
            return [(2, str(b2))]

        assert svc.restart_and_replay(batches_after) == 2
        assert replayed == [1]
        assert svc.call("ping") == {"ok": True, "step": 2, "policy_version": 2}
        out = svc.call("export_hf", path=str(tmp_path / "export"))
        assert out["ok"] and (Path(out["path"]) / "model.safetensors").exists()
        assert svc.stop() == 0
    finally:
        svc.kill()
    # the replayed run reaches bitwise the weights of the uninterrupted one
    want = load_file(tmp_path / "uninterrupted" / "model.safetensors")
    got = load_file(Path(out["path"]) / "model.safetensors")
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_update_file_round_trips_exactly(tmp_path: Path) -> None:
    """What the service applies is bit for bit what the controller computed: float32 GRPO advantages and float64
    ones of another estimator keep their values and dtypes; the KL coefficient, lags and metrics come back."""
    update = policy_update(_trajectories(3, 2), 3, (tiny := load_config("tiny-cpu")).train, tiny.run.overlap)
    update.advantages[1] = update.advantages[1].double() / 3.0  # a float64 vector with a non-terminating value
    update.kl_coef, update.versions_behind[0] = 0.1 + 0.2, 1
    update.phases, update.temperatures = [1, 0, 1, 1], [None, 0.7, None, None]  # a RubricEM-style two-phase update
    got = read_update(write_update(update, tmp_path / "u" / "step_000003.parquet"))
    assert got.phases == [1, 0, 1, 1] and got.temperatures == [None, 0.7, None, None]
    assert got.phase_indices() == [[1], [0, 2, 3]] and got.phase_temperature([1]) == 0.7
    assert [t.to_row() for t in got.trajectories] == [t.to_row() for t in update.trajectories]
    assert [a.dtype for a in got.advantages] == [torch.float32, torch.float64, torch.float32, torch.float32]
    assert all(torch.equal(a, b) for a, b in zip(got.advantages, update.advantages, strict=True))
    assert got.kl_coef == 0.1 + 0.2 and got.versions_behind == [1, 0, 0, 0]
    assert got.metrics == update.metrics == {"n_groups": 1.0, "zero_var_groups": 0.0, "dropped_groups": 0.0}
    assert not list((tmp_path / "u").glob(".*.tmp"))  # written atomically
