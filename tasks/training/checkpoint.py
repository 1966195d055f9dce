"""Checkpoints of the policy (issue 6 §3): HF weights, DeepSpeed state, RNG states, data position; atomic; retained.

Layout of one checkpoint (``{root}/step_{step:06d}/``)::

    hf/            Hugging Face weights (safetensors) + config + tokenizer files: loadable by transformers and vLLM
                   (with ``policy.lora``: the adapters merged in, W0 + (alpha / r) B A, under the plain names)
    adapter/       with ``policy.lora`` only: adapter_model.safetensors + adapter_config.json in PEFT's format
                   (``peft.PeftModel.from_pretrained(start checkpoint, adapter/)``)
    ds/            DeepSpeed state: module, optimizer (ZeRO partitions), LR scheduler (engine.save_checkpoint)
    rng_rank{r}.pt python / numpy / torch (/ cuda) RNG states of rank r
    state.json     step, policy_version, data position, metrics
    COMPLETE       marker, written last

A checkpoint is built in ``step_{step:06d}.tmp`` and ``os.rename``d into place after the marker is written, so a
crash while saving leaves only a ``.tmp`` directory that :func:`complete_steps` ignores (and the next save removes).

Under ``checkpoint.async_save`` (issue 48 item 5) the step only copies the state to host memory (:class:`HostSnapshot`,
through DeepSpeed's own ``save_checkpoint`` with :class:`SnapshotCheckpointEngine` in place of its writer); a
background thread (:class:`PendingSave`) writes the same files and commits once they are all written.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import json
import os
import random
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from arbor.tasks.training import lora

if TYPE_CHECKING:
    from arbor.config import CheckpointConfig

MARKER = "COMPLETE"
_STEP_RE = re.compile(r"^step_(\d{6})$")
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "added_tokens.json", "chat_template.jinja", "chat_template.json", "tokenizer.model",
)


def run_checkpoint_root(checkpoint: CheckpointConfig, run_id: str | None, home: Path) -> Path:
    """Where a run's checkpoints live: ``checkpoint.dir`` or ``{home}/checkpoints/{run_id}`` (``run.run_id``)."""
    return Path(checkpoint.dir) if checkpoint.dir else Path(home) / "checkpoints" / (run_id or "default")


def checkpoint_due(step: int, every: int, last_step: int) -> bool:
    """Whether ``step`` is checkpointed: every ``checkpoint.every`` steps and always the run's last step, so the
    trained policy of a finished run is a checkpoint, not only replayable data."""
    return step % every == 0 or step == last_step


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def is_complete(path: Path) -> bool:
    return path.is_dir() and _STEP_RE.match(path.name) is not None and (path / MARKER).exists()


def complete_steps(root: Path) -> list[int]:
    """Steps with a complete checkpoint under ``root``, ascending (``.tmp`` leftovers of crashed saves ignored)."""
    root = Path(root)
    if not root.exists():
        return []
    out = []
    for p in root.iterdir():
        m = _STEP_RE.match(p.name)
        if m and is_complete(p):
            out.append(int(m.group(1)))
    return sorted(out)


def discard_from(root: Path, step: int) -> list[int]:
    """Remove every checkpoint of ``step`` and later under ``root`` (complete or a crashed save's leftover): what
    ``arbor train --resume R --redo STEP:STAGE`` drops so the policy restarts from before the redone stage."""
    gone: set[int] = set()
    for p in Path(root).glob("step_*"):
        m = re.match(r"^step_(\d{6})(\.tmp|\.trash)?$", p.name)
        if m and int(m.group(1)) >= step:
            shutil.rmtree(p)
            gone.add(int(m.group(1)))
    return sorted(gone)


def latest_complete(root: Path) -> Path | None:
    steps = complete_steps(root)
    return step_dir(root, steps[-1]) if steps else None


def run_root_from_config(config_json: str | None, run_id: str, home: Path) -> Path:
    """A stored run's checkpoint root from its resolved config (the ``runs.config_json`` it recorded)."""
    try:
        explicit = (json.loads(config_json or "{}").get("checkpoint") or {}).get("dir")
    except (ValueError, AttributeError):
        explicit = None
    return Path(explicit) if explicit else Path(home) / "checkpoints" / run_id


def final_policy(root: Path) -> Path | None:
    """The trained policy of a run: ``hf/`` of its latest complete checkpoint (the last step's once it finished)."""
    latest = latest_complete(root)
    return latest / "hf" if latest is not None and (latest / "hf" / "config.json").exists() else None


def export_policy(root: Path, out: Path, step: int | None = None) -> Path:
    """Copy a run's policy (the latest complete checkpoint, or ``step``'s) to ``out`` as a plain HF directory.

    Built in ``out.tmp`` and renamed, so an interrupted export leaves no half-written model under ``out``; ``out``
    must not exist yet (nothing a user has is overwritten)."""
    root, out = Path(root), Path(out)
    if step is None:
        src = final_policy(root)
        if src is None:
            raise FileNotFoundError(f"no complete checkpoint under {root}")
    else:
        if step not in complete_steps(root):
            have = ", ".join(map(str, complete_steps(root))) or "none"
            raise FileNotFoundError(f"no complete checkpoint of step {step} under {root} (complete: {have})")
        src = step_dir(root, step) / "hf"
    if out.exists():
        raise FileExistsError(f"{out} already exists: choose a new folder")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    state = read_state(src.parent)
    (tmp / "arbor_export.json").write_text(json.dumps(
        {"source": str(src), "step": state.get("step"), "policy_version": state.get("policy_version"),
         "metrics": state.get("metrics")}, indent=1, default=str))
    os.rename(tmp, out)
    return out


def begin(root: Path, step: int) -> Path:
    """Fresh temporary directory for ``step`` (rank 0 only); removes leftovers of crashed saves."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for p in root.glob("step_*.tmp"):
        shutil.rmtree(p, ignore_errors=True)
    tmp = root / f"step_{step:06d}.tmp"
    tmp.mkdir()
    return tmp


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def commit(tmp: Path, step: int, state: dict[str, Any]) -> Path:
    """Write state.json and the marker into ``tmp``, then rename it to ``step_{step:06d}`` (rank 0 only).

    An existing checkpoint of the same step (a replayed step saved again) is moved aside first and removed after.
    """
    tmp = Path(tmp)
    (tmp / "state.json").write_text(json.dumps(state, sort_keys=True, indent=1))
    with open(tmp / MARKER, "w") as f:
        f.write(f"{step}\n")
        f.flush()
        os.fsync(f.fileno())
    final = step_dir(tmp.parent, step)
    trash = None
    if final.exists():
        trash = tmp.parent / f"step_{step:06d}.trash"
        shutil.rmtree(trash, ignore_errors=True)
        os.rename(final, trash)
    os.rename(tmp, final)
    _fsync_dir(tmp.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
    return final


def read_state(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / "state.json").read_text())


def apply_retention(root: Path, keep_last: int, keep_best: bool, best_metric: str) -> list[int]:
    """Delete complete checkpoints other than the last ``keep_last`` and (if ``keep_best``) the one with the
    highest ``metrics[best_metric]``. Returns the steps removed."""
    steps = complete_steps(root)
    keep = set(steps[-keep_last:])
    if keep_best:
        scored = []
        for s in steps:
            v = read_state(step_dir(root, s)).get("metrics", {}).get(best_metric)
            if v is not None:
                scored.append((float(v), s))
        if scored:
            keep.add(max(scored, key=lambda t: (t[0], t[1]))[1])
    removed = [s for s in steps if s not in keep]
    for s in removed:
        shutil.rmtree(step_dir(root, s), ignore_errors=True)
    return removed


# ---------------------------------------------------------------------------------------------- RNG states
def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------------------------- HF weights
def module_state_dict(engine: Any, zero_stage: int) -> dict[str, torch.Tensor]:
    """The full (unpartitioned) state dict of ``engine.module.lm`` as it is (LoRA layers keep their
    ``base.weight`` / ``lora_A`` / ``lora_B`` names), without the ``lm.`` prefix of the ``PolicyHead`` wrapper.
    ZeRO-3: the 16-bit gather (collective: call on every rank; rank 0 receives the tensors). ZeRO <= 2: the module's
    own tensors (no copy)."""
    sd = engine._zero3_consolidated_16bit_state_dict() if zero_stage == 3 else engine.module.state_dict()
    return {k.removeprefix("lm."): v.detach() for k, v in sd.items()}


def merged(engine: Any, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state_dict`` (:func:`module_state_dict`) with ``engine``'s LoRA adapters folded into the weights, under
    the plain HF names (``tasks.training.lora.merge_state_dict``); unchanged without LoRA."""
    layers = lora.lora_layers(engine.module.lm)
    if not layers:
        return state_dict
    with torch.no_grad():
        return lora.merge_state_dict(state_dict, {name: m.scaling for name, m in layers.items()})


def full_state_dict(engine: Any, zero_stage: int) -> dict[str, torch.Tensor]:
    """The policy's full HF state dict as a plain model has it: what the rollout engine, vLLM and ``save_hf``
    receive (with LoRA: the adapters merged in). Collective under ZeRO-3 (:func:`module_state_dict`)."""
    return merged(engine, module_state_dict(engine, zero_stage))


def save_hf(engine: Any, path: Path, zero_stage: int, tokenizer_src: Path | str | None, rank: int = 0,
            adapter_dir: Path | None = None, base_model: Path | str | None = None) -> Path:
    """Write HF-format safetensors weights + config (+ tokenizer files copied from ``tokenizer_src``); with LoRA the
    adapters are merged in, and ``adapter_dir`` (if given) receives them in PEFT's format (:func:`save_adapter`,
    ``base_model`` recorded as ``base_model_name_or_path``).

    Collective under ZeRO-3 (every rank must call it; one gather serves both); only rank 0 writes."""
    raw = module_state_dict(engine, zero_stage)
    sd = merged(engine, raw)
    path = Path(path)
    if rank == 0:
        path.mkdir(parents=True, exist_ok=True)
        engine.module.lm.save_pretrained(path, state_dict=sd)
        if tokenizer_src is not None and Path(tokenizer_src).is_dir():
            for name in TOKENIZER_FILES:
                src = Path(tokenizer_src) / name
                if src.exists():
                    shutil.copy2(src, path / name)
        if adapter_dir is not None and lora.has_lora(engine.module.lm):
            save_adapter(engine.module.lm, raw, Path(adapter_dir), None if base_model is None else str(base_model))
    return path


def save_adapter(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], path: Path,
                 base_model: str | None) -> Path:
    """``adapter_model.safetensors`` + ``adapter_config.json`` in PEFT's format: the adapters of ``state_dict``
    (a full state dict of ``model``, LoRA names kept) and the rank, alpha, dropout and targets of ``model``'s
    LoRA layers."""
    from safetensors.torch import save_file

    layers = lora.lora_layers(model)
    if not layers:
        raise ValueError("save_adapter: the model has no LoRA layer")
    shapes = {(m.r, m.alpha) for m in layers.values()}
    if len(shapes) != 1:
        raise ValueError(f"save_adapter: one rank and alpha expected for every layer, got {sorted(shapes)}")
    (r, alpha), = shapes
    dropout = max(float(getattr(m.dropout, "p", 0.0)) for m in layers.values())
    targets = sorted({name.rsplit(".", 1)[-1] for name in layers})
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file(lora.adapter_state_dict(state_dict), str(path / lora.ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (path / lora.ADAPTER_CONFIG).write_text(
        json.dumps(lora.peft_adapter_config(r, alpha, dropout, targets, base_model), indent=1, sort_keys=True))
    return path


# ---------------------------------------------------------------------------------------------- asynchronous saves
# Issue 48 item 5: the step waits only for a copy of the checkpoint's tensors in host memory; a background writer
# writes the files and commits (marker + rename + retention) once every file is on disk. At most one save is in
# flight; the next save, the run's end, a stop and a resume wait for it or abandon it (an abandoned save stays a
# ``.tmp`` that ``complete_steps`` ignores and the next ``begin`` removes).

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


class HostSnapshot:
    """A checkpoint's files as host-memory copies, taken at once and written later (issue 48 item 5).

    Every tensor reached from a saved object is copied (``copy_``) into host memory; containers are rebuilt, other
    leaves deep-copied, so nothing written later aliases state the next step changes. A view copied already (the
    module's weights in both ``ds/`` and ``hf/``) is shared, not copied twice. On CUDA the copies go into pinned
    buffers of ``pool`` (kept by the caller between saves, keyed by file and position) and ``finish`` waits for the
    device; on CPU each save gets fresh buffers (a pool would hold a second copy of the model between saves)."""

    def __init__(self, root: Path, pool: dict[tuple[Any, ...], torch.Tensor] | None = None) -> None:
        self.root = Path(root)
        self.pool = pool
        self.files: list[tuple[Path, Any]] = []  # (path, object for torch.save)
        self.jobs: list[Callable[[], None]] = []  # other writes (hf/, adapter/), in order after the files
        self.bytes = 0
        self._seen: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        self._cuda = False

    def copy(self, obj: Any, key: tuple[Any, ...] = ()) -> Any:
        """``obj`` with every tensor replaced by a host copy (``key``: the pool's slot of a tensor)."""
        if isinstance(obj, torch.Tensor):
            t = obj.detach()
            vk = _view_key(t)
            hit = self._seen.get(vk)
            if hit is not None:
                return hit[1]
            pin = t.device.type == "cuda"
            self._cuda |= pin
            buf = self.pool.get(key) if (pin and self.pool is not None) else None
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
                if pin and self.pool is not None:
                    self.pool[key] = buf
            buf.copy_(t, non_blocking=pin)
            self._seen[vk] = (t, buf)  # the source stays alive: no later tensor can take its address
            self.bytes += buf.numel() * buf.element_size()
            return buf
        if isinstance(obj, dict):
            out = copy.copy(obj)  # keeps the mapping's type (OrderedDict, defaultdict's factory)
            out.clear()
            for k, v in obj.items():
                out[k] = self.copy(v, (*key, k))
            return out
        if isinstance(obj, list):
            return [self.copy(v, (*key, i)) for i, v in enumerate(obj)]
        if isinstance(obj, tuple):
            items = [self.copy(v, (*key, i)) for i, v in enumerate(obj)]
            return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
        if obj is None or isinstance(obj, (str, bytes, int, float, bool, torch.dtype, torch.device)):
            return obj
        return copy.deepcopy(obj)  # small objects of DeepSpeed's state (loss scaler, slice mappings, sets)

    def add(self, path: Path, obj: Any) -> None:
        """A ``torch.save`` file of ``obj`` (copied now, written by the writer)."""
        path = Path(path)
        try:
            slot: Any = str(path.relative_to(self.root))
        except ValueError:
            slot = str(path)
        self.files.append((path, self.copy(obj, (slot,))))

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
    """:func:`save_hf`'s weights copied into ``snapshot`` now and its files written by the writer (collective under
    ZeRO-3, like :func:`save_hf`). The writer calls the model's ``save_pretrained`` with the copied state dict: it
    reads only the model's config and tied-weight names, not its weights."""
    raw = module_state_dict(engine, zero_stage)
    if rank != 0:
        return
    sd = snapshot.copy(merged(engine, raw), ("hf",))
    lm = engine.module.lm
    adapters = None
    if adapter_dir is not None and lora.has_lora(lm):
        adapters = snapshot.copy({k: v for k, v in raw.items() if k.rpartition(".")[2] in lora._LORA_KEYS},
                                 ("adapter",))

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
    """One checkpoint being written by a background thread (issue 48 item 5).

    ``commit_state`` (rank 0 of a single-rank group): the writer commits and applies ``retention`` itself once its
    files are written. Several ranks: each writes its own files and the commit waits for :meth:`Trainer.finish_save`
    (every rank's writer finished, a barrier, then rank 0 commits)."""

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
            t0 = time.perf_counter()
            self.snapshot.write(self.abandon.is_set, self.serialization)
            if self.abandon.is_set():
                return
            self.snapshot = HostSnapshot(self.snapshot.root)  # the copies can go (pinned buffers stay in the pool)
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
