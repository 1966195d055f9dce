"""Weight sync from the trainer to the rollout engine after each step, with policy-version tagging (issue 6 §4).

- In-process (``rollout.engine=transformers``): :func:`sync_weights` copies the trainer's full weights into the
  rollout model and sets its policy version; rollouts produced afterwards carry that version and
  ``Trainer.train_step`` refuses a batch from any other version.
- ``vllm serve`` (``rollout.engine=openai``): :class:`VllmWeightTransfer` drives vLLM's weight-transfer API for RL
  (NCCL between separate GPUs; see docs/gpu.md), then resets the prefix cache; :func:`save_and_restart` is the
  fallback (write an HF checkpoint, restart the server on it). Not exercised by CI (no GPU, no vLLM here).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch


def sync_weights(trainer: Any, target: Any) -> int:
    """Load the trainer's current weights into ``target`` and tag it with ``trainer.policy_version``.

    ``target`` is either a rollout engine with ``load_state_dict(state_dict, version)`` (``tasks.env.rollout``'s
    TransformersEngine) or a plain ``torch.nn.Module``. Collective under ZeRO-3 (call on every rank; the target
    lives on rank 0). Returns the version now served.
    """
    state_dict = trainer.state_dict_for_sync()
    version = int(trainer.policy_version)
    if getattr(trainer, "rank", 0) != 0:
        return version
    if isinstance(target, torch.nn.Module):
        load_into_module(target, state_dict)
        target.policy_version = version  # type: ignore[assignment]
    elif hasattr(target, "load_state_dict"):
        target.load_state_dict(state_dict, version)
    else:
        raise TypeError(f"cannot sync weights into {type(target).__name__}: no load_state_dict(state_dict, version)")
    return version


def sync_policy(trainer: Any, engine: Any, export_dir: Path, base_url: str | None = None) -> int:
    """After each step, the one path from the trainer's weights to the rollout engine (issue 6 item 4):

    - trainer in this process: :func:`sync_weights` (full state dict, no copy on disk);
    - trainer in its own process group (``tasks.training.trainer_service``): an HF export under ``export_dir``, loaded here;
    - ``vllm serve``: the trainer pushes over vLLM's weight-transfer API (docs/gpu.md); the engine takes the version.
    Returns the policy version now served."""
    version = int(trainer.policy_version)
    if hasattr(trainer, "state_dict_for_sync") and hasattr(engine, "load_state_dict"):
        return sync_weights(trainer, engine)
    if hasattr(engine, "load_state_dict"):
        from safetensors.torch import load_file

        path = trainer.export_hf(export_dir)
        sd: dict[str, torch.Tensor] = {}
        for f in sorted(Path(path).glob("*.safetensors")):
            sd.update(load_file(str(f)))
        engine.load_state_dict(sd, version)
        return version
    if hasattr(trainer, "sync_vllm"):
        trainer.sync_vllm(base_url)
    engine.set_policy_version(version)
    return version


def load_into_module(module: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Strict copy, tolerating only a tied ``lm_head.weight`` absent from one side."""
    tied = bool(getattr(getattr(module, "config", None), "tie_word_embeddings", False))
    with torch.no_grad():
        missing, unexpected = module.load_state_dict(state_dict, strict=False)
    missing = [m for m in missing if not (tied and m == "lm_head.weight")]
    unexpected = [u for u in unexpected if not (tied and u == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"weight sync: missing {missing[:5]}, unexpected {unexpected[:5]}")


# ---------------------------------------------------------------------------------------------- vLLM serve
class VllmWeightTransfer:
    """vLLM's weight-transfer API for RL, NCCL backend, driven over the server's HTTP routes.

    Written against the vLLM documentation (docs.vllm.ai, training/weight_transfer and its NCCL page); the routes
    are served by ``vllm serve MODEL --weight-transfer-config '{"backend": "nccl"}'`` (development routes: set
    ``VLLM_SERVER_DEV_MODE=1`` on the server). Protocol per the docs:

    1. once: POST ``/init_weight_transfer_engine`` ``{"init_info": {master_address, master_port, rank_offset: 1,
       world_size}}`` while the trainer (rank 0 of the transfer group) calls
       ``NCCLWeightTransferEngine.trainer_init`` with the same address, port and world size;
    2. each sync: POST ``/update_weights`` ``{"update_info": {names, dtype_names, shapes, packed}}`` while the
       trainer broadcasts the tensors with ``NCCLWeightTransferEngine.trainer_send_weights`` (both sides meet in
       the same NCCL calls, so the HTTP call runs on a thread);
    3. POST ``/reset_prefix_cache``: cached KV blocks were computed with the old weights.

    vLLM's API moved between releases (a four-phase start/update/finish protocol in newer ones): check the docs
    of the installed version; this class is the single place to adapt.
    """

    def __init__(self, base_url: str, master_address: str, master_port: int, world_size: int,
                 timeout_s: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.master_address = master_address
        self.master_port = master_port
        self.world_size = world_size  # 1 trainer rank + the server's inference workers
        self.timeout_s = timeout_s
        self.group: Any = None

    def _post(self, route: str, body: dict[str, Any] | None = None) -> Any:
        import httpx

        r = httpx.post(f"{self.base_url}{route}", json=body or {}, timeout=self.timeout_s)
        r.raise_for_status()
        return r.json() if r.content else None

    def _concurrently(self, route: str, body: dict[str, Any], trainer_side: Callable[[], Any]) -> Any:
        errors: list[BaseException] = []

        def call() -> None:
            try:
                self._post(route, body)
            except BaseException as e:  # noqa: BLE001 - re-raised below in the caller's thread
                errors.append(e)

        th = threading.Thread(target=call, daemon=True)
        th.start()
        out = trainer_side()
        th.join(self.timeout_s)
        if errors:
            raise RuntimeError(f"vLLM {route} failed: {errors[0]}") from errors[0]
        return out

    def init(self) -> None:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        info = dict(master_address=self.master_address, master_port=self.master_port, world_size=self.world_size)
        self.group = self._concurrently(
            "/init_weight_transfer_engine", {"init_info": {**info, "rank_offset": 1}},
            lambda: NCCLWeightTransferEngine.trainer_init(info),
        )

    def push(self, named_tensors: Callable[[], Iterator[tuple[str, torch.Tensor]]], packed: bool = True) -> float:
        """Broadcast every (name, tensor) to the server; returns seconds taken. ``named_tensors`` is called twice
        (metadata, then data) so it must be re-iterable (e.g. ``lambda: iter(state_dict.items())``)."""
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerSendWeightsArgs,
            NCCLWeightTransferEngine,
        )

        if self.group is None:
            self.init()
        meta = [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in named_tensors()]
        update_info = dict(names=[m[0] for m in meta], dtype_names=[m[1] for m in meta],
                           shapes=[m[2] for m in meta], packed=packed)
        t0 = time.perf_counter()
        self._concurrently(
            "/update_weights", {"update_info": update_info},
            lambda: NCCLWeightTransferEngine.trainer_send_weights(
                named_tensors(), NCCLTrainerSendWeightsArgs(group=self.group, packed=packed)),
        )
        self.reset_prefix_cache()
        return time.perf_counter() - t0

    def reset_prefix_cache(self) -> None:
        self._post("/reset_prefix_cache")


def save_and_restart(trainer: Any, out_dir: str | Path, restart: Callable[[Path], None], engine: Any) -> int:
    """Fallback for servers without weight transfer: export HF weights, restart (or reload) the server on them via
    ``restart(path)`` (which must wait until it is healthy), and tag the rollout engine. A restart starts with an
    empty prefix cache."""
    path = trainer.export_hf(Path(out_dir) / f"policy_v{trainer.policy_version:06d}")
    version = int(trainer.policy_version)
    if getattr(trainer, "rank", 0) == 0:
        restart(path)
        engine.set_policy_version(version)
    return version
