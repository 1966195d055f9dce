"""Weight sync from the trainer to the rollout engine after each step, with policy-version tagging.

- In-process (``rollout.engine=transformers``): :func:`sync_weights` copies the trainer's full weights into the
  rollout model and sets its policy version; rollouts produced afterwards carry that version and
  ``Trainer.train_step`` refuses a batch from any other version.
- ``vllm serve`` (``rollout.engine=openai``), chosen by ``cluster.weight_sync``: ``nccl`` pushes over vLLM 0.33's
  weight transfer without importing vLLM (``tasks.training.vllm_sync``; start -> update -> finish with the policy
  version as weight_version, confirmed, then the prefix cache reset); ``reload`` is :class:`ReloadSync` (export hf/,
  the server reloads it in place; a failure restores the last good weights); ``restart`` is :func:`save_and_restart`
  (export hf/, restart the server on it). CI runs nccl and restart against ``tests/vllm_server.py`` (0.33's
  contract, gloo), reload and restart against a real `vllm serve` (vLLM's CPU build, ``tests/test_vllm_real.py``).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from arbor.tasks.training.vllm_sync import SyncReport, VllmControl, VllmSyncError, VllmWeightSync, reload_sync


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


def sync_policy(trainer: Any, engine: Any, export_dir: Path, base_url: str | None = None, *,
                weight_sync: str = "nccl", restart: Callable[[Path], None] | None = None,
                reloader: ReloadSync | None = None) -> int:
    """After each step, the one path from the trainer's weights to the rollout engine:

    - trainer in this process: :func:`sync_weights` (full state dict, no copy on disk);
    - trainer in its own process group (``tasks.training.trainer_service``): an HF export under ``export_dir``, loaded here;
    - ``vllm serve`` with ``weight_sync="nccl"``: the trainer pushes over vLLM 0.33's weight transfer
      (``tasks.training.vllm_sync``) and returns the version the server confirmed;
    - ``vllm serve`` with ``weight_sync="reload"``: ``reloader`` (:class:`ReloadSync`) reloads the export in place;
    - ``vllm serve`` with ``weight_sync="restart"``: :func:`save_and_restart` through ``restart(path)``.
    The engine takes the version only after the server confirmed it. Returns the policy version now served."""
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
    if weight_sync == "reload":
        if reloader is None:
            raise VllmSyncError("cluster.weight_sync=reload needs the server's URL (rollout.base_url)")
        return reloader.sync(trainer, export_dir, engine)
    if weight_sync == "restart":
        if restart is None:
            raise VllmSyncError("cluster.weight_sync=restart needs the server arbor launched (cluster.manage_vllm=true)")
        return save_and_restart(trainer, export_dir, restart, engine, base_url)
    if not hasattr(trainer, "sync_vllm"):
        raise VllmSyncError("the in-process CPU trainer cannot join vLLM's NCCL group: run the trainer on GPUs "
                            "(train.num_gpus) or set cluster.weight_sync=restart")
    confirmed = int(trainer.sync_vllm(base_url))
    if confirmed != version:
        raise VllmSyncError(f"the server confirmed weight version {confirmed}, the trainer is at {version}")
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
def push_state_dict(sync: VllmWeightSync, trainer: Any) -> SyncReport | None:
    """One NCCL sync (every trainer rank calls: gathering is collective under ZeRO-3; rank 0 sends). Returns rank 0's
    report (the version it confirmed on the server), None on other ranks."""
    sd = trainer.state_dict_for_sync()
    if getattr(trainer, "rank", 0) != 0:
        return None
    return sync.push(lambda: iter(sd.items()), int(trainer.policy_version))


def save_and_restart(trainer: Any, out_dir: str | Path, restart: Callable[[Path], None], engine: Any,
                     base_url: str | None = None) -> int:
    """The fallback that needs nothing but `vllm serve`: export the policy's ``hf/`` (safetensors), restart the
    server on it through ``restart(path)`` (which waits until healthy), tag the served weights with the policy
    version (``/update_weight_version``, a dev-mode route) and read it back before the rollout engine takes the
    version. A fresh server starts with an empty prefix cache. Returns the version now served."""
    version = int(trainer.policy_version)
    path = trainer.export_hf(Path(out_dir) / f"policy_v{version:06d}")
    if getattr(trainer, "rank", 0) == 0:
        restart(Path(path))
        if base_url:
            http = VllmControl(base_url)
            http.set_weight_version(str(version))
            http.confirm_version(str(version))
        engine.set_policy_version(version)
    return version


@dataclass
class ReloadSync:
    """``cluster.weight_sync=reload``: export the policy's ``hf/`` and have `vllm serve` reload it in place
    (``tasks.training.vllm_sync.reload_sync``: 0.6 s for SmolLM2-135M on two CPU cores, against a full server start
    for ``restart``). Works wherever the server can read the trainer's files: the CPU, or one GPU that trainer and
    server share (where NCCL cannot run two ranks on one device).

    A failed reload leaves the server's layers half-loaded, and its next generation would kill the engine, so before
    any generation the last folder the server loaded well is reloaded; if that fails too, the server is restarted on
    it (``restart``, the managed server only). The sync then fails, saying which restoration happened; the run is
    resumable (``arbor train --resume``). Each export replaces the previous one under ``export_dir`` (one ``hf/``
    of the model on disk besides the one served)."""

    base_url: str
    restart: Callable[[Path], None] | None = None
    reset_tries: int = 5
    reset_backoff_s: float = 1.0
    last_good: Path | None = None  # the folder the server last loaded and confirmed
    last_version: int | None = None

    @property
    def http(self) -> VllmControl:
        return VllmControl(self.base_url)

    def sync(self, trainer: Any, export_dir: Path, engine: Any) -> int:
        """Export, reload, confirm; the engine takes the version only after the server confirmed it."""
        version = int(trainer.policy_version)
        path = Path(trainer.export_hf(Path(export_dir) / f"policy_v{version:06d}"))
        if getattr(trainer, "rank", 0) != 0:
            return version
        self.load(path, version)
        engine.set_policy_version(version)
        return version

    def load(self, path: Path, version: int) -> SyncReport:
        """Reload ``path`` as ``version``; on failure restore the last good weights, then raise saying how."""
        try:
            report = reload_sync(self.http, path, version, reset_tries=self.reset_tries,
                                 reset_backoff_s=self.reset_backoff_s)
        except VllmSyncError as e:
            raise VllmSyncError(f"reloading {path} as policy version {version} failed: {e}; "
                                f"{self.restore()}") from e
        self.last_good, self.last_version = path, version
        if path.name.startswith("policy_v"):  # the other exports of this sync folder are no longer served, those of
            for old in path.parent.glob("policy_v*"):  # a process killed mid-sync included
                if old != path and old.is_dir():
                    shutil.rmtree(old, ignore_errors=True)
        return report

    def restore(self) -> str:
        """Put the last good weights back before anything generates; returns what happened, in words."""
        if self.last_good is None or self.last_version is None:
            return ("no weights were loaded well before, so none could be restored: the server's weights are "
                    "undefined until it is restarted (arbor's managed server restarts on resume)")
        good = f"the last good weights (policy version {self.last_version}, {self.last_good})"
        try:
            reload_sync(self.http, self.last_good, self.last_version, reset_tries=self.reset_tries,
                        reset_backoff_s=self.reset_backoff_s)
            return f"restored {good} by reloading them"
        except VllmSyncError as again:
            if self.restart is None:
                return (f"reloading {good} failed too ({again}); the server is not arbor's to restart "
                        "(cluster.manage_vllm=false): restart it before resuming")
            self.restart(self.last_good)
            http = self.http
            http.set_weight_version(str(self.last_version))
            http.confirm_version(str(self.last_version))
            return f"restored {good} by restarting the server on them (reloading them failed: {again})"
