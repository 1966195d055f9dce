"""The trainer's checkpoints: save a step, wait for the save in flight, load the latest.

A save is synchronous (the step waits until DeepSpeed's state, the merged HF weights, the adapters and the RNG states
are on disk and committed: ``tasks.training.checkpoint``) or, under ``checkpoint.async_save`` with DeepSpeed's plain
torch writer, a copy in host memory that a background writer writes and commits while the next step runs
(``tasks.training.checkpoint_async``). At most one save is in flight: the next save, a resume and the run's end wait
for it (a stop abandons it). In a group of several ranks each rank writes its own files, and rank 0 commits once
every rank's writer finished (at the next save, a resume or the run's end).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from arbor.tasks.stage_store import fault_point
from arbor.tasks.training import checkpoint as ckpt
from arbor.tasks.training.checkpoint_async import (
    HostPool,
    HostSnapshot,
    PendingSave,
    Retention,
    snapshot_hf,
    snapshot_supported,
    snapshotting,
    wait_in_flight,
)
from arbor.tasks.training.engine import barrier

if TYPE_CHECKING:
    from arbor.config import CheckpointConfig


class CheckpointSaver:
    """Checkpoints of one rank's DeepSpeed engine under ``root`` (``checkpoint.dir`` or the run's folder).

    ``checkpoint``: retention (``keep_last``, ``keep_best``, ``best_metric``); ``model_path``: the start checkpoint,
    whose tokenizer files go with every ``hf/`` export and which the adapters name as their base model. ``timing``:
    the last save's wait for the one in flight (``wait_s``), the step's share (``save_s``), the previous background
    write's (``write_s``) and, for a save in the background, the host copy's size (``snapshot_bytes``)."""

    def __init__(self, root: Path, checkpoint: CheckpointConfig, *, rank: int, world: int, zero_stage: int,
                 model_path: Path) -> None:
        self.root = Path(root)
        self.checkpoint = checkpoint
        self.rank, self.world, self.zero_stage, self.model_path = rank, world, zero_stage, Path(model_path)
        self.timing: dict[str, float] | None = None
        self._pending: PendingSave | None = None  # the save in flight
        self._pending_state: dict[str, Any] | None = None
        self._last_write_s = 0.0  # the last finished background write (and commit), seconds
        self.pool: HostPool | None = None  # the background saves' host buffers (CUDA: pinned; made at the first)

    def reserve(self, engine: Any) -> tuple[float, int]:
        """Fill the pool before the first step: every buffer a save of ``engine`` draws, the optimizer's moments
        included, which Adam creates only at its first step (two per parameter of the optimizer, of its shape and
        dtype). The first step's save then waits only for the copy, like every later one: allocating page-locked
        memory of a model's and optimizer's size held the first save's step for tens of seconds on a 1.7B model.
        Copies into a scratch folder that is deleted; nothing is written under ``root``. Returns (seconds, bytes
        the pool holds)."""
        if not snapshot_supported(engine):
            return 0.0, 0
        self.pool = self.pool or HostPool(pin=_on_cuda(engine))
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="arbor-reserve-") as scratch:
            tmp = Path(scratch) / "step_000000.tmp"
            snap = HostSnapshot(tmp, self.pool)
            with snapshotting(engine, snap):
                engine.save_checkpoint(str(tmp), tag="ds", save_latest=False)
            snapshot_hf(snap, engine, tmp / "hf", self.zero_stage, None, self.rank, adapter_dir=tmp / "adapter",
                        base_model=None)
            snap.add(tmp / f"rng_rank{self.rank}.pt", ckpt.rng_state())
            assert snap.draw is not None
            for p in _moments_to_come(engine):  # drawn after the state's own: a save draws them in that order too
                snap.draw(tuple(p.shape), p.dtype)
                snap.draw(tuple(p.shape), p.dtype)
            snap.finish()
        return time.perf_counter() - t0, self.pool.allocated_bytes

    def save(self, engine: Any, step: int, state: dict[str, Any], *, wait: bool = True) -> Path:
        """Atomic checkpoint of ``step`` whose ``state.json`` is ``state``, then retention (every rank calls):
        ``ds/`` (exact resume), ``hf/`` (merged export), with LoRA ``adapter/`` (PEFT's format).

        ``wait=False``: the state is copied to host memory (``HostSnapshot``) and a background writer writes and
        commits it while the next step runs; the returned path exists once it committed. A save first waits for the
        one in flight (at most one)."""
        t0 = time.perf_counter()
        self.finish()
        waited = time.perf_counter() - t0
        tmp = self.root / f"step_{step:06d}.tmp"
        if self.rank == 0:
            wait_in_flight(self.root)  # another trainer of this process writing here (tests, benches)
            ckpt.begin(self.root, step)
        barrier(self.world)
        if wait or not snapshot_supported(engine):
            engine.save_checkpoint(str(tmp), tag="ds", save_latest=False)
            fault_point(step, "checkpoint", "mid")  # the stop drill holds here (ARBOR_FAULT=S:checkpoint:hold-mid)
            ckpt.save_hf(engine, tmp / "hf", self.zero_stage, self.model_path, self.rank,
                         adapter_dir=tmp / "adapter", base_model=self.model_path.resolve())
            torch.save(ckpt.rng_state(), tmp / f"rng_rank{self.rank}.pt")
            barrier(self.world)
            final = ckpt.step_dir(self.root, step)
            if self.rank == 0:
                final = ckpt.commit(tmp, step, state)
                self._retain()
            barrier(self.world)
            self.timing = dict(wait_s=waited, save_s=time.perf_counter() - t0 - waited, write_s=0.0)
            return final
        t1 = time.perf_counter()
        if self.pool is None and _on_cuda(engine):
            self.pool = HostPool(pin=True)
        snap = HostSnapshot(tmp, self.pool)
        with snapshotting(engine, snap):
            engine.save_checkpoint(str(tmp), tag="ds", save_latest=False)
        snapshot_hf(snap, engine, tmp / "hf", self.zero_stage, self.model_path, self.rank,
                    adapter_dir=tmp / "adapter", base_model=self.model_path.resolve())
        snap.add(tmp / f"rng_rank{self.rank}.pt", ckpt.rng_state())
        snap.finish()
        single = self.world == 1
        cfg = self.checkpoint
        self._pending = PendingSave(
            self.root, step, tmp, snap, commit_state=state if single else None,
            retention=Retention(cfg.keep_last, cfg.keep_best, cfg.best_metric) if single else None,
            serialization=bool(getattr(engine.checkpoint_engine, "zipfile_serialization", True)))
        self._pending_state = state
        self._pending.start()
        self.timing = dict(wait_s=waited, save_s=time.perf_counter() - t1, write_s=self._last_write_s,
                           snapshot_bytes=float(snap.bytes))
        return ckpt.step_dir(self.root, step)

    def _retain(self) -> None:
        c = self.checkpoint
        ckpt.apply_retention(self.root, c.keep_last, c.keep_best, c.best_metric)

    def finish(self, abandon: bool = False) -> float:
        """Wait for the save in flight, or with ``abandon`` stop it uncommitted; returns the seconds waited. Several
        ranks: every rank's writer finished, a barrier, then rank 0 commits."""
        p = self._pending
        if p is None:
            return 0.0
        t0 = time.perf_counter()
        if abandon:
            p.cancel()
            self._pending = None
            return 0.0
        try:
            p.wait()
        except BaseException:  # a stop raised out of the wait, or the writer failed: the save never commits
            p.cancel()
            raise
        finally:
            self._pending = None
        self._last_write_s = p.write_s
        if self.world > 1:
            barrier(self.world)
            if self.rank == 0:
                ckpt.commit(p.tmp, p.step, self._pending_state or {})
                self._retain()
            barrier(self.world)
        return time.perf_counter() - t0

    def load_latest(self, engine: Any) -> dict[str, Any] | None:
        """Load the latest complete checkpoint into ``engine`` (weights, optimizer, scheduler) and this rank's RNG
        states; its ``state.json``, or None without one. A save in flight is waited for first (it may become the
        latest)."""
        self.finish()
        wait_in_flight(self.root)
        path = ckpt.latest_complete(self.root)
        if path is None:
            return None
        load_path, _ = engine.load_checkpoint(
            str(path), tag="ds", load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if load_path is None:
            raise RuntimeError(f"{path}/ds: DeepSpeed could not load the checkpoint")
        state = ckpt.read_state(path)
        rng_file = path / f"rng_rank{self.rank}.pt"
        if rng_file.exists():
            ckpt.set_rng_state(torch.load(rng_file, weights_only=False))
        return state


def _on_cuda(engine: Any) -> bool:
    return torch.device(getattr(engine, "device", "cpu")).type == "cuda"


def _moments_to_come(engine: Any) -> list[torch.Tensor]:
    """The parameters of the engine's base optimizer (DeepSpeed's flat fp32 ZeRO partitions) whose Adam moments do
    not exist yet: each gets exp_avg and exp_avg_sq of its shape and dtype at the first step."""
    base = getattr(engine.optimizer, "optimizer", engine.optimizer)
    if "adam" not in type(base).__name__.lower():
        return []
    # ZeRO-3 puts its flat fp32 partitions into the base optimizer's groups only around its step
    params = getattr(engine.optimizer, "fp32_partitioned_groups_flat", None) or [
        p for group in base.param_groups for p in group["params"]]
    return [p for p in params if not base.state.get(p)]
