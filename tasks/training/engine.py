"""The DeepSpeed side of the trainers (paper App. B.2): the process group's rendezvous, the DeepSpeed
config, the LR schedule, the model load (LoRA, activation recompute) and the engine over the policy head.

The RL trainer (``tasks.training.train``), the SFT warm start (``tasks.training.sft``) and ARCO's rubric model build
their engines here. CPU (CI): one process, DeepSpeed's CPU accelerator, ZeRO-2 (ZeRO-3 in tests), fp32. GPUs: the
``deepspeed`` launcher, ZeRO-3, bf16 (``docs/gpu.md``).
"""

from __future__ import annotations

import fcntl
import glob
import json
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from arbor.config.rollout import LoRAConfig
from arbor.paths import PROJECT_ROOT
from arbor.seeding import derive_seed
from arbor.tasks.training.head import PolicyHead
from arbor.tasks.training.lora import add_lora
from arbor.tasks.training.recompute import MemoryBudget, apply_recompute, resolve_recompute


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def init_single_process_env(port: int | None = None) -> None:
    """Rendezvous variables for a single-process DeepSpeed group (the CPU path); launcher values are kept.

    A single-process group whose inherited MASTER_PORT is taken (a child of a process that trained, e.g. a flow
    run by a worker or a test) moves to a free port instead of failing with EADDRINUSE."""
    import torch.distributed as dist

    from arbor.runtime.quiet import quiet

    quiet()  # before DeepSpeed picks its accelerator (no CUDA: CPU, without its warning)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port or 29500 + os.getpid() % 1000))
    single = os.environ.get("WORLD_SIZE", "1") == "1"
    if single and not (dist.is_available() and dist.is_initialized()) and not _port_free(int(os.environ["MASTER_PORT"])):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")


def prebuild_deepspeed_ops() -> list[str]:
    """Load the ops DeepSpeed's CPU accelerator builds on first use (the shm comm op), compiling them if needed.

    Run once at set-up (``python -m arbor.tasks.training.train --prebuild-ops``), and by ``build_engine`` before
    ``deepspeed.initialize``, which then finds the op loaded in this process. The build is cached in
    ``TORCH_EXTENSIONS_DIR``, which importing arbor points at a folder of this torch installation's own
    (``arbor.torch_extensions_dir``); loading holds ``extension_lock``. On a GPU machine nothing is needed (NCCL;
    torch AdamW).
    """
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    built = []
    if get_accelerator().device_name() == "cpu":
        builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
        if builder is not None and deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
            with extension_lock():
                path = os.environ.get("PATH", "")
                os.environ["PATH"] = ninja_first(path)
                try:
                    builder.load()
                finally:
                    os.environ["PATH"] = path
            built.append(builder.absolute_name())
    return built


def ninja_first(path: str) -> str:
    """``PATH`` with the ninja of the ``ninja`` package DeepSpeed depends on first, so every process builds with the
    same ninja. torch runs whichever ``ninja`` PATH finds, and two versions invalidate each other's ``.ninja_log``
    (a 1.11 from the system and the venv's 1.13 rebuilt the op in turn, 60-190 s each)."""
    first = ninja_bin_dir()
    if not first:
        return path
    return os.pathsep.join([first, *[p for p in path.split(os.pathsep) if p and p != first]])


def ninja_bin_dir() -> str:
    """The folder of the ``ninja`` package's own binary, found from its installed files ("" if not installed).

    ``ninja.BIN_DIR`` looks in the running interpreter's scripts folder, so an environment that reaches the package
    through a ``.pth`` line (a venv with the wheel installed beside this one's packages) gets "", and PATH then found
    the system's 1.11 (the installed-wheel test rebuilt the op, and the next run rebuilt it back)."""
    from importlib import metadata

    try:
        dist = metadata.distribution("ninja")
    except metadata.PackageNotFoundError:
        return ""
    for f in dist.files or []:
        if f.name == "ninja" and f.parent.name == "bin":
            found = Path(dist.locate_file(f))
            if found.is_file() and os.access(found, os.X_OK):
                return str(found.parent.resolve())
    return ""


@contextmanager
def extension_lock(root: str | None = None) -> Iterator[list[str]]:
    """Hold an OS lock on arbor's torch extension cache while an op is loaded; yields the stale markers removed.

    torch serialises extension builds with a marker file (``<op>/lock``, ``torch.utils.file_baton``) that each load
    creates, even of an op already built, and removes when done. A process killed meanwhile leaves it behind, and
    every later load then waits for it forever: a run killed during DeepSpeed's start-up made each later run hang
    without a word. An ``flock`` is released by the kernel when its holder dies. Every arbor
    process loads ops in arbor's own cache (``arbor-py3XY-*``) under this lock, so a marker found there while it is
    held is stale and is removed. A cache the user named (TORCH_EXTENSIONS_DIR set) may be shared with other
    programs: there nothing is removed."""
    root = root if root is not None else os.environ.get("TORCH_EXTENSIONS_DIR", "")
    if not root or not os.path.basename(os.path.normpath(root)).startswith("arbor-"):
        yield []
        return
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "arbor.lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            stale = sorted(glob.glob(os.path.join(root, "*", "lock")))
            for marker in stale:
                os.remove(marker)
            yield stale
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def read_deepspeed_json(path: str | None) -> dict[str, Any]:
    """The profile's DeepSpeed JSON (``train.deepspeed_config``), relative paths from the project root."""
    if not path:
        return {}
    p = Path(path)
    p = p if p.is_absolute() else PROJECT_ROOT / p
    if not p.exists():
        raise FileNotFoundError(f"train.deepspeed_config: {p} does not exist")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"train.deepspeed_config: {p}:{e.lineno}: not valid JSON ({e.msg})") from e
    if not isinstance(data, dict):
        raise ValueError(f"train.deepspeed_config: {p}: expected a JSON object")
    return data


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def deepspeed_config(
    *, zero_stage: int, bf16: bool, grad_clip: float, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The DeepSpeed config the trainer uses; ``extra`` (the profile's JSON, then ``train.deepspeed``) is merged
    over it. Gradient accumulation is driven by the trainer (token-packed micro-batches,
    ``set_gradient_accumulation_boundary``), so DeepSpeed sees micro-batch 1 and gas 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world,
        "gradient_clipping": grad_clip,
        "bf16": {"enabled": bf16},
        "zero_optimization": {"stage": zero_stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if zero_stage == 3:
        cfg["zero_optimization"].update({"stage3_gather_16bit_weights_on_model_save": True})
    cfg = merge(cfg, extra or {})
    # the trainer owns these: the stage and precision come from the profile's keys, batching from the trainer
    cfg["zero_optimization"]["stage"] = zero_stage
    cfg["bf16"] = {**cfg.get("bf16", {}), "enabled": bf16}
    cfg.update(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1, train_batch_size=world,
               gradient_clipping=grad_clip)
    return cfg


def lr_factor(schedule: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """LR multiplier per optimizer update u: linear warm-up to 1 over ``warmup_steps``, then constant (RL) or
    cosine to 0 at ``total_steps`` (SFT: lr 7e-6, 10% warm-up, App. B.2)."""

    def f(u: int) -> float:
        if warmup_steps > 0 and u < warmup_steps:
            return (u + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = (u - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return f


def load_model(model_path: str | Path, *, bf16: bool, ds_config: dict[str, Any], gradient_checkpointing: bool | str,
               lora: LoRAConfig | None = None, seed: int = 0, memory: MemoryBudget | None = None):
    """HF causal LM from a local directory.

    Under ZeRO-3, when ``accelerate`` is installed, transformers partitions the weights while loading (zero.Init via
    ``HfDeepSpeedConfig``); otherwise each rank loads the full model into CPU memory and ``deepspeed.initialize``
    partitions it (14B in bf16: 28 GB of host memory per rank).

    ``lora`` enabled (``policy.lora``): the weights are frozen and ``lora.targets`` get adapters (Hu et al. 2021;
    ``tasks.training.lora.add_lora``), their A drawn from ``seed`` so every run (and a resume without a checkpoint) starts
    from the same adapters; only they train. Apply before ``deepspeed.initialize``: a checkpoint holds this module
    structure.

    ``gradient_checkpointing``: a recompute mode (``tasks.training.recompute``: none, every_other, all; a bool is all
    or none) or ``auto``, chosen by ``memory`` and logged once."""
    import importlib.util

    from transformers import AutoModelForCausalLM

    p = Path(model_path)
    if not (p / "config.json").exists():
        raise FileNotFoundError(f"{p}: not an HF model directory (no config.json)")
    keep_alive = None
    if ds_config["zero_optimization"]["stage"] == 3 and importlib.util.find_spec("accelerate") is not None:
        from transformers.integrations import HfDeepSpeedConfig

        keep_alive = HfDeepSpeedConfig(ds_config)
    model = AutoModelForCausalLM.from_pretrained(p, dtype=torch.bfloat16 if bf16 else torch.float32)
    del keep_alive
    model.config.use_cache = False
    if lora is not None and lora.enabled:
        g = torch.Generator().manual_seed(derive_seed(seed, "policy-lora-init") % (2**63))
        add_lora(model, lora.r, lora.alpha, lora.dropout, lora.targets, generator=g)
    setting = gradient_checkpointing if isinstance(gradient_checkpointing, str) else (
        "all" if gradient_checkpointing else "none")
    mode, account = resolve_recompute(model, setting, memory, dtype_bytes=2 if bf16 else 4,
                                      zero_stage=ds_config["zero_optimization"]["stage"],
                                      world=int(os.environ.get("WORLD_SIZE", "1")))
    apply_recompute(model, mode)
    if setting == "auto" and os.environ.get("RANK", "0") == "0":
        print(account, flush=True)  # once per model, rank 0: which mode, the estimates and the budget
    return model


def build_engine(
    model: torch.nn.Module,
    *,
    ds_config: dict[str, Any],
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    schedule: str,
    warmup_steps: int,
    total_steps: int,
    temperature: float = 1.0,
):
    """``deepspeed.initialize`` over ``PolicyHead(model, temperature)`` with AdamW and a LambdaLR schedule (the
    engine steps it at each update). ``engine.module.lm`` is the HF model. RL passes the rollout temperature; SFT
    (maximum likelihood) keeps 1. The optimizer gets the trainable parameters only (with LoRA: the adapters; the
    frozen weights get no Adam state and no weight decay)."""
    import deepspeed

    init_single_process_env()
    prebuild_deepspeed_ops()  # loaded under extension_lock: deepspeed.initialize then finds it loaded
    head = PolicyHead(model, temperature)
    register_head_weight(head, ds_config)
    trainable = [p for p in head.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("build_engine: the model has no trainable parameter")
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay, betas=betas)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(schedule, warmup_steps, total_steps))
    engine, _, _, _ = deepspeed.initialize(model=head, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config)
    return engine


def register_head_weight(head: PolicyHead, ds_config: dict[str, Any]) -> None:
    """Under ZeRO-3, tell DeepSpeed that ``head`` reads the LM head's weight (and bias) itself: the chunked head
    (``tasks.training.head``) uses them outside ``lm_head.forward``, so they must be gathered for ``head``'s
    forward and backward (``deepspeed.zero.register_external_parameter``)."""
    if ds_config["zero_optimization"]["stage"] != 3 or not head.chunked():
        return
    import deepspeed

    for p in (head.lm.lm_head.weight, head.lm.lm_head.bias):
        if p is not None:
            deepspeed.zero.register_external_parameter(head, p)


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def barrier(world: int) -> None:
    """Wait for every rank of a group of ``world`` ranks (nothing to wait for with one)."""
    import deepspeed.comm as dist

    if world > 1:
        dist.barrier()
