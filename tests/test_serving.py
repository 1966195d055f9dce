"""GPU layout without GPUs: the `vllm serve` command a profile builds, and server supervision with a real process."""

from __future__ import annotations

import socket
import sys

import pytest

from arbor.config import load_config
from arbor.tasks.env.serving import LaunchSpec, ServerDied, Supervised, vllm_serve_spec


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_vllm_serve_command_for_profile() -> None:
    cfg = load_config("qwen3-8b", {"cluster.rollout_gpus": [0, 1], "cluster.train_gpus": [2, 3, 4, 5, 6, 7],
                                   "cluster.vllm_tensor_parallel": 1})
    spec = vllm_serve_spec(cfg, "/ckpt/step_000010/hf")
    a = spec.argv
    assert a[:3] == ["vllm", "serve", "/ckpt/step_000010/hf"]
    assert a[a.index("--data-parallel-size") + 1] == "2" and a[a.index("--tensor-parallel-size") + 1] == "1"
    assert a[a.index("--max-model-len") + 1] == "36864"
    assert "--weight-transfer-config" in a
    assert a[a.index("--served-model-name") + 1] == "Qwen/Qwen3-8B"  # the name rollouts request (issue 47)
    assert spec.env == {"CUDA_VISIBLE_DEVICES": "0,1", "VLLM_SERVER_DEV_MODE": "1"}
    assert spec.base_url.endswith(":8000/v1")
    own_env = load_config("qwen3-8b", {"cluster.vllm_executable": "/opt/vllm-env/bin/vllm"})
    assert vllm_serve_spec(own_env, "/m").argv[:2] == ["/opt/vllm-env/bin/vllm", "serve"]


def test_tensor_parallel_must_divide_rollout_gpus() -> None:
    cfg = load_config("qwen3-8b", {"cluster.rollout_gpus": [0, 1, 2], "cluster.vllm_tensor_parallel": 2})
    with pytest.raises(ValueError, match="vllm_tensor_parallel"):
        vllm_serve_spec(cfg, "m")


def test_supervised_server_restarts_after_death(tmp_path) -> None:
    port = _free_port()
    spec = LaunchSpec(argv=[sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                            "--directory", str(tmp_path)], health_url=f"http://127.0.0.1:{port}/")
    restarts: list[int] = []
    with Supervised(spec, startup_timeout_s=30, max_restarts=1, on_restart=restarts.append) as sup:
        assert sup.healthy() and not sup.ensure()  # healthy: nothing to do
        sup.proc.kill()
        sup.proc.wait()
        assert sup.ensure() and restarts == [1] and sup.healthy()
        sup.proc.kill()
        sup.proc.wait()
        with pytest.raises(ServerDied, match="giving up"):
            sup.ensure()


def test_server_that_exits_during_startup_is_reported(tmp_path) -> None:
    spec = LaunchSpec(argv=[sys.executable, "-c", "raise SystemExit(3)"], health_url="http://127.0.0.1:9/")
    with pytest.raises(ServerDied, match="exited with 3"):
        Supervised(spec, startup_timeout_s=30).start()
