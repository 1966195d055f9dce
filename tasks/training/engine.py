"""The DeepSpeed side of the trainers (paper App. B.2): the process group's rendezvous, the DeepSpeed
config, the LR schedule, the model load (LoRA, activation recompute) and the engine over the policy head.

The RL trainer (``tasks.training.train``), the SFT warm start (``tasks.training.sft``) and ARCO's rubric model build
their engines here. CPU (CI): one process, DeepSpeed's CPU accelerator, ZeRO-2 (ZeRO-3 in tests), fp32. GPUs: the
``deepspeed`` launcher, ZeRO-3, bf16 (``docs/gpu.md``).
"""

from __future__ import annotations

import json
import math
import os
import sys
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


# A module DeepSpeed imports that arbor never uses: `import deepspeed` loads mlflow (~1.5 CPU-s in every training
# process, measured) for its autotuner's logging; arbor runs no DeepSpeed autotuning, and its own tracking imports
# mlflow when a run asks for it. (DeepSpeed's Muon module, ~1.6 CPU-s, is imported by its ZeRO optimizers
# unguarded, so it stays.)
UNUSED_IMPORTS = ("mlflow",)


@contextmanager
def without_unused_imports() -> Iterator[None]:
    """Within the block, importing a module of ``UNUSED_IMPORTS`` that is not loaded yet raises ImportError (a
    ``None`` in ``sys.modules``), which DeepSpeed's autotuner catches; afterwards it imports as usual."""
    blocked = [name for name in UNUSED_IMPORTS if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def deepspeed_module() -> Any:
    """``deepspeed`` as arbor starts it; every path that starts DeepSpeed (``load_model``, ``build_engine``, the SFT
    group, ARCO's rubric model) asks here first. Imported without ``UNUSED_IMPORTS``, and with its shared-memory
    all-reduce op marked incompatible, so that no process group compiles it.

    On CPU, ``deepspeed.comm.torch.TorchBackend`` JIT-compiles ``deepspeed_shm_comm`` in every new environment
    (``build_shm_op``: ~60 CPU-s, a C++ build against torch's headers) and keeps it for ``inference_all_reduce``
    only, which training never calls: gradients go through ``torch.distributed`` (gloo) either way. DeepSpeed skips
    an op its ``__compatible_ops__`` marks incompatible and keeps edits to that dict
    (docs/decisions/deepspeeds-shm-op-not-built.md). On GPUs the op does not exist (NCCL)."""
    with without_unused_imports():
        import deepspeed
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    return deepspeed


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
    deepspeed_module()  # before transformers' loading code reaches it through accelerate, or zero.Init starts a group
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
    init_single_process_env()
    head = PolicyHead(model, temperature)
    register_head_weight(head, ds_config)
    trainable = [p for p in head.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("build_engine: the model has no trainable parameter")
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay, betas=betas)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(schedule, warmup_steps, total_steps))
    engine, _, _, _ = deepspeed_module().initialize(model=head, optimizer=optimizer, lr_scheduler=scheduler,
                                                    config=ds_config)
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
