"""GPU layout of one node (paper §4.1: 8 x H100): which GPUs serve rollouts (vLLM) and which train (DeepSpeed)."""

from __future__ import annotations

from pydantic import Field

from arbor.config.base import Section


class ClusterConfig(Section):
    rollout_gpus: list[int] = Field(default_factory=list, description="CUDA devices for `vllm serve` (empty: CPU run)")
    train_gpus: list[int] = Field(default_factory=list, description="CUDA devices for the DeepSpeed trainer")
    vllm_port: int = Field(8000, ge=1, le=65535)
    vllm_tensor_parallel: int = Field(1, ge=1)
    vllm_extra_args: list[str] = Field(default_factory=list)
    manage_vllm: bool = Field(True, description="the flow starts and supervises `vllm serve` itself")
    vllm_executable: str = Field("vllm", description="the `vllm` command the flow starts: a name on PATH or a path, "
                                 "e.g. .venv-vllm/bin/vllm from `make vllm-env` (vLLM's pins and prefect's differ)")
    startup_timeout_s: float = Field(900.0, gt=0)
