"""Checkpoints of the policy: HF weights, DeepSpeed state, RNG states, data position; atomic; retained.

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

Under ``checkpoint.async_save`` the same files are written by a background thread from a copy in
host memory: ``tasks.training.checkpoint_async``.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
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
