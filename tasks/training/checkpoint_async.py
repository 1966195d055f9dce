"""Asynchronous checkpoint saves: the step waits only for a copy of the checkpoint's tensors in
host memory; a background writer writes the files and commits (marker + rename + retention) once every file is on disk.

The copy goes through DeepSpeed's own ``save_checkpoint`` with :class:`SnapshotCheckpointEngine` in place of its
writer (:func:`snapshotting`), so the files are the ones a synchronous save writes (``tasks.training.checkpoint``'s
layout) and ``load_checkpoint`` reads them; :func:`snapshot_hf` copies the merged HF weights (and adapters) the same
way. :class:`PendingSave` is the writer thread. At most one save is in flight; the next save, the run's end, a stop and
a resume wait for it or abandon it (an abandoned save stays a ``.tmp`` that ``complete_steps`` ignores and the next
``begin`` removes). The trainer's side (which path, the wait, the commit of several ranks) is
``tasks.training.saver``.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from arbor.tasks.stage_store import fault_point
from arbor.tasks.training import lora
from arbor.tasks.training.checkpoint import (
    TOKENIZER_FILES,
    apply_retention,
    commit,
    merged,
    module_state_dict,
    save_adapter,
)

_writes_open = threading.Event()
_writes_open.set()
_in_flight: dict[str, PendingSave] = {}
_in_flight_lock = threading.Lock()


@contextlib.contextmanager
def hold_writes() -> Iterator[None]:
    """Writers started meanwhile wait before their first file until the block ends (tests and benchmarks observe a
    save in flight: the snapshot is taken, nothing is written yet)."""
    _writes_open.clear()
    try:
        yield
    finally:
        _writes_open.set()


def _view_key(t: torch.Tensor) -> tuple[Any, ...]:
    """Identity of a tensor's values: the same view of the same storage is copied once per snapshot."""
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


class HostPool:
    """Host buffers the background saves copy into, kept between saves and drawn by (shape, dtype): one save draws
    at a time (a save first waits for the one in flight), so the previous save's buffers are free again. ``pin``:
    page-locked buffers (CUDA: the device copies run asynchronously, and allocating page-locked memory of a model's
    and optimizer's size is what held the first save's step)."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self.buffers: dict[tuple[tuple[int, ...], torch.dtype], list[torch.Tensor]] = {}
        self.allocated_bytes = 0

    def drawer(self) -> Callable[[tuple[int, ...], torch.dtype], torch.Tensor]:
        """A draw of one save: the i-th request of a (shape, dtype) gets that key's i-th buffer, allocated once."""
        taken: dict[tuple[tuple[int, ...], torch.dtype], int] = {}

        def draw(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            key = (tuple(shape), dtype)
            i = taken.get(key, 0)
            taken[key] = i + 1
            bufs = self.buffers.setdefault(key, [])
            if i == len(bufs):
                bufs.append(torch.empty(key[0], dtype=dtype, device="cpu", pin_memory=self.pin))
                self.allocated_bytes += bufs[-1].numel() * bufs[-1].element_size()
            return bufs[i]

        return draw


class HostSnapshot:
    """A checkpoint's files as host-memory copies, taken at once and written later.

    Every tensor reached from a saved object is copied (``copy_``) into host memory; containers are rebuilt, other
    leaves deep-copied, so nothing written later aliases state the next step changes. A view copied already (the
    module's weights in both ``ds/`` and ``hf/``) is shared, not copied twice. With a ``pool`` (CUDA: pinned) the
    copies go into its buffers and ``finish`` waits for the device; without one each save gets fresh buffers (a
    CPU run: a pool would hold a second copy of the model between saves)."""

    def __init__(self, root: Path, pool: HostPool | None = None) -> None:
        self.root = Path(root)
        self.draw = pool.drawer() if pool is not None else None  # this save's draw from the pool
        self.files: list[tuple[Path, Any]] = []  # (path, object for torch.save)
        self.jobs: list[Callable[[], None]] = []  # other writes (hf/, adapter/), in order after the files
        self.bytes = 0
        self._seen: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        self._cuda = False

    def copy(self, obj: Any) -> Any:
        """``obj`` with every tensor replaced by a host copy."""
        if isinstance(obj, torch.Tensor):
            t = obj.detach()
            vk = _view_key(t)
            hit = self._seen.get(vk)
            if hit is not None:
                return hit[1]
            self._cuda |= t.device.type == "cuda"
            if self.draw is not None:
                buf = self.draw(tuple(t.shape), t.dtype)
            else:
                buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=t.device.type == "cuda")
            buf.copy_(t, non_blocking=buf.is_pinned())
            self._seen[vk] = (t, buf)  # the source stays alive: no later tensor can take its address
            self.bytes += buf.numel() * buf.element_size()
            return buf
        if isinstance(obj, dict):
            out = copy.copy(obj)  # keeps the mapping's type (OrderedDict, defaultdict's factory)
            out.clear()
            for k, v in obj.items():
                out[k] = self.copy(v)
            return out
        if isinstance(obj, list):
            return [self.copy(v) for v in obj]
        if isinstance(obj, tuple):
            items = [self.copy(v) for v in obj]
            return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
        if obj is None or isinstance(obj, (str, bytes, int, float, bool, torch.dtype, torch.device)):
            return obj
        return copy.deepcopy(obj)  # small objects of DeepSpeed's state (loss scaler, slice mappings, sets)

    def add(self, path: Path, obj: Any) -> None:
        """A ``torch.save`` file of ``obj`` (copied now, written by the writer)."""
        self.files.append((Path(path), self.copy(obj)))

    def finish(self) -> None:
        """Wait for the device's copies (the next step may change the sources as soon as this returns)."""
        if self._cuda:
            torch.cuda.synchronize()
        self._seen.clear()

    def write(self, abandoned: Callable[[], bool] = lambda: False, serialization: bool = True) -> None:
        """Write every file, then the other jobs; stops early once ``abandoned()``."""
        for path, obj in self.files:
            if abandoned():
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(obj, path, _use_new_zipfile_serialization=serialization)
        for job in self.jobs:
            if abandoned():
                return
            job()


class SnapshotCheckpointEngine:
    """A DeepSpeed checkpoint engine that copies instead of writing: ``engine.save_checkpoint`` builds its state
    dicts and file names as always (so ``load_checkpoint`` reads the result) and hands each to ``save``, which puts
    a host copy into ``snapshot``. Installed only for one ``save_checkpoint`` call (:func:`snapshotting`)."""

    def __init__(self, inner: Any, snapshot: HostSnapshot) -> None:
        self.inner, self.snapshot, self.name = inner, snapshot, "ArborSnapshotCheckpointEngine"

    def create(self, info: Any) -> None:
        pass

    def save(self, state_dict: Any, path: str) -> None:
        self.snapshot.add(Path(path), state_dict)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        os.makedirs(path, exist_ok=exist_ok)

    def load(self, path: str, map_location: Any = None) -> Any:
        return self.inner.load(path, map_location=map_location)

    def commit(self, info: Any) -> bool:
        return True

    def is_data_parallel_writer(self, dp_rank: int) -> bool:
        return self.inner.is_data_parallel_writer(dp_rank)

    def is_decoupled(self) -> bool:
        return False

    def set_commit_info(self, info: Any) -> None:
        pass

    def get_commit_info(self) -> None:
        return None

    def cleanup(self) -> None:
        pass

    def preserves_storage_sharing(self) -> bool:
        return False  # DeepSpeed need not clone first: every tensor is copied here


def snapshot_supported(engine: Any) -> bool:
    """Whether ``engine`` writes with DeepSpeed's plain torch engine (a configured ``checkpoint.writer``, the
    decoupled or fast writer, keeps the synchronous path: its files are not ``torch.save``'s)."""
    from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine

    return type(getattr(engine, "checkpoint_engine", None)) is TorchCheckpointEngine


@contextlib.contextmanager
def snapshotting(engine: Any, snapshot: HostSnapshot) -> Iterator[None]:
    """``engine.save_checkpoint`` inside the block copies into ``snapshot`` instead of writing."""
    inner = engine.checkpoint_engine
    engine.checkpoint_engine = SnapshotCheckpointEngine(inner, snapshot)
    try:
        yield
    finally:
        engine.checkpoint_engine = inner


def snapshot_hf(snapshot: HostSnapshot, engine: Any, path: Path, zero_stage: int, tokenizer_src: Path | str | None,
                rank: int = 0, adapter_dir: Path | None = None, base_model: Path | str | None = None) -> None:
    """``checkpoint.save_hf``'s weights copied into ``snapshot`` now and its files written by the writer (collective
    under ZeRO-3, like ``save_hf``). The writer calls the model's ``save_pretrained`` with the copied state dict: it
    reads only the model's config and tied-weight names, not its weights."""
    raw = module_state_dict(engine, zero_stage)
    if rank != 0:
        return
    sd = snapshot.copy(merged(engine, raw))
    lm = engine.module.lm
    adapters = None
    if adapter_dir is not None and lora.has_lora(lm):
        adapters = snapshot.copy({k: v for k, v in raw.items() if k.rpartition(".")[2] in lora._LORA_KEYS})

    def write() -> None:
        _write_hf(lm, dict(sd), Path(path), tokenizer_src)
        if adapters is not None and adapter_dir is not None:
            save_adapter(lm, adapters, Path(adapter_dir), None if base_model is None else str(base_model))

    snapshot.jobs.append(write)


def _write_hf(lm: Any, sd: dict[str, torch.Tensor], path: Path, tokenizer_src: Path | str | None) -> None:
    path.mkdir(parents=True, exist_ok=True)
    lm.save_pretrained(path, state_dict=sd)
    if tokenizer_src is not None and Path(tokenizer_src).is_dir():
        for name in TOKENIZER_FILES:
            src = Path(tokenizer_src) / name
            if src.exists():
                shutil.copy2(src, path / name)


@dataclass
class Retention:
    keep_last: int
    keep_best: bool
    best_metric: str


@dataclass
class PendingSave:
    """One checkpoint being written by a background thread.

    ``commit_state`` (rank 0 of a single-rank group): the writer commits and applies ``retention`` itself once its
    files are written. Several ranks: each writes its own files and the commit waits for
    ``tasks.training.saver.CheckpointSaver.finish`` (every rank's writer finished, a barrier, then rank 0 commits)."""

    root: Path
    step: int
    tmp: Path
    snapshot: HostSnapshot
    commit_state: dict[str, Any] | None = None
    retention: Retention | None = None
    serialization: bool = True
    written: threading.Event = field(default_factory=threading.Event)  # every file of this rank on disk
    committed: threading.Event = field(default_factory=threading.Event)  # renamed into place by this writer
    done: threading.Event = field(default_factory=threading.Event)  # the writer thread is over (any outcome)
    abandon: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    write_s: float = 0.0
    thread: threading.Thread | None = None

    def start(self) -> PendingSave:
        """Start the writer thread (a daemon: a stop need not wait for it; ``atexit`` waits at a normal exit)."""
        with _in_flight_lock:
            _in_flight[_root_key(self.root)] = self
        self.thread = threading.Thread(target=self._run, name=f"arbor-checkpoint-{self.step}", daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            _writes_open.wait()
            fault_point(self.step, "checkpoint", "mid")  # the stop drill holds the background save here too
            t0 = time.perf_counter()
            self.snapshot.write(self.abandon.is_set, self.serialization)
            if self.abandon.is_set():
                return
            self.snapshot = HostSnapshot(self.snapshot.root)  # the copies can go (a pool's buffers stay in it)
            self.written.set()
            if self.commit_state is not None:
                commit(self.tmp, self.step, self.commit_state)
                if self.retention is not None:
                    r = self.retention
                    apply_retention(self.root, r.keep_last, r.keep_best, r.best_metric)
                self.committed.set()
            self.write_s = time.perf_counter() - t0
        except BaseException as e:  # noqa: BLE001 - reported by wait()
            self.error = e
        finally:
            self.done.set()
            with _in_flight_lock:
                if _in_flight.get(_root_key(self.root)) is self:
                    del _in_flight[_root_key(self.root)]

    def wait(self) -> None:
        """Until the writer is over; raises what it raised."""
        self.done.wait()
        if self.error is not None:
            raise RuntimeError(f"checkpoint of step {self.step} under {self.root} was not written: "
                               f"{type(self.error).__name__}: {self.error}") from self.error

    def cancel(self) -> None:
        """Abandon the save: the writer stops before its next file and never commits (the ``.tmp`` stays until
        the next save's ``begin``)."""
        self.abandon.set()


def _root_key(root: Path) -> str:
    return str(Path(root).resolve())


def in_flight(root: Path) -> PendingSave | None:
    """The save being written under ``root`` in this process, if any."""
    with _in_flight_lock:
        return _in_flight.get(_root_key(root))


def wait_in_flight(root: Path) -> None:
    """Wait for this process's save in flight under ``root`` (a resume reads only committed checkpoints; a writer
    still writing could commit after the reader chose)."""
    p = in_flight(root)
    if p is not None:
        p.wait()


@atexit.register
def _wait_at_exit() -> None:
    """A normal interpreter exit lets saves in flight finish (the daemon writer would be cut off otherwise)."""
    with _in_flight_lock:
        pending = list(_in_flight.values())
    for p in pending:
        if not p.abandon.is_set():
            p.done.wait()
