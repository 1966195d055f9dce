"""LoRA: low-rank adapters on frozen linear layers (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
Models", arXiv:2106.09685), arbor's own (docs/decisions/lora-for-the-policy.md).

A wrapped layer computes (§4.1)

    h = W0 x + (alpha / r) B A dropout(x),   W0 frozen, A in R^{r x k} (random), B in R^{d x r} (zeros at start),

so an adapted model starts as exactly the base model. For serving, the update is folded into the weight
(§4.1 "No additional inference latency"): W = W0 + (alpha / r) B A (:func:`merged_weight`); the merged model has
the base model's plain parameter names, which transformers, vLLM and the rollout engine load as they are.

Names: a wrapped layer ``...q_proj`` holds ``...q_proj.base.weight`` (W0, frozen), ``...q_proj.lora_A`` and
``...q_proj.lora_B``. :func:`adapter_state_dict` renames the adapters to PEFT's saved layout
(``base_model.model.<name>.lora_A.weight``), :func:`peft_adapter_config` writes the matching
``adapter_config.json``, so ``peft.PeftModel.from_pretrained(base, adapter_dir)`` loads what arbor trained.

Pure: torch only; the trainers' model load (``tasks.training.engine.load_model``, ``tasks.rubric_model``) and
``tasks.training.checkpoint`` call it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

PEFT_PREFIX = "base_model.model."
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
_LORA_KEYS = ("lora_A", "lora_B")
_DROPPED_BUFFERS = ("ref_A", "ref_B")  # ARCO's mu keeps a reference copy of its adapters (tasks.rubric_model)


def lora_scaling(r: int, alpha: float) -> float:
    """The factor alpha / r of the low-rank update (Hu et al. 2021, §4.1: "scale DeltaW x by alpha / r")."""
    if r < 1:
        raise ValueError(f"LoRA rank r must be >= 1, got {r}")
    return float(alpha) / float(r)


def merged_weight(weight: Tensor, lora_a: Tensor, lora_b: Tensor, scaling: float) -> Tensor:
    """W = W0 + (alpha / r) B A (Hu et al. 2021, §4.1): the weight of the plain linear layer that computes what the
    adapted one does. Computed in float32 at least, returned in W0's dtype (a new tensor; W0 is not modified)."""
    if lora_a.shape[1] != weight.shape[1] or lora_b.shape[0] != weight.shape[0] or lora_a.shape[0] != lora_b.shape[1]:
        raise ValueError(f"LoRA shapes do not fit W {tuple(weight.shape)}: A {tuple(lora_a.shape)}, "
                         f"B {tuple(lora_b.shape)}")
    acc = torch.promote_types(weight.dtype, torch.float32)
    delta = lora_b.to(acc) @ lora_a.to(acc)
    return (weight.to(acc) + scaling * delta).to(weight.dtype)


class LoRALinear(nn.Module):
    """h = W0 x + (alpha / r) B A dropout(x) with W0 (``base``) frozen (Hu et al. 2021, §4.1).

    A starts Kaiming-uniform (PEFT's default; the paper draws it Gaussian), B at zero, so the layer starts equal
    to ``base``. ``generator`` seeds A's draw (None: torch's global generator)."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.base = base
        self.r = int(r)
        self.alpha = float(alpha)
        self.scaling = lora_scaling(r, alpha)
        dev, dt = base.weight.device, base.weight.dtype
        a = torch.empty(r, base.in_features, dtype=torch.float32)  # drawn on the CPU: the same A on any device
        nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
        self.lora_A = nn.Parameter(a.to(device=dev, dtype=dt))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r, dtype=dt, device=dev))
        # dropout 0 is no module at all: no random draw, so pi_old and pi_theta are the same function
        self.dropout: nn.Module = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def factors(self) -> tuple[Tensor, Tensor]:
        """(A, B) used by ``forward`` (a subclass may swap in another pair: ARCO's reference copy)."""
        return self.lora_A, self.lora_B

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.factors()
        return self.base(x) + (self.dropout(x) @ a.T @ b.T) * self.scaling

    def merged_weight(self) -> Tensor:
        """W0 + (alpha / r) B A of this layer (:func:`merged_weight`)."""
        return merged_weight(self.base.weight, self.lora_A, self.lora_B, self.scaling)


def add_lora(model: nn.Module, r: int, alpha: float, dropout: float, targets: Sequence[str], *,
             generator: torch.Generator | None = None, layer: type[LoRALinear] = LoRALinear) -> int:
    """Freeze every parameter of ``model`` and wrap each ``nn.Linear`` whose last name component is in ``targets``
    (PEFT's ``target_modules`` rule) in ``layer``; only the adapters train. Returns the number of layers wrapped.

    Wrapping is in module order, so a seeded ``generator`` gives the same adapters on every run."""
    for p in model.parameters():
        p.requires_grad_(False)
    wanted = set(targets)
    found = [(name, m) for name, m in model.named_modules()
             if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in wanted]
    if not found:
        raise ValueError(f"no linear layer named {'/'.join(targets)} to put LoRA on")
    for name, m in found:
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr,
                layer(m, r, alpha, dropout, generator=generator))
    return len(found)


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """The wrapped layers of ``model`` by module name (empty: no LoRA)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def has_lora(model: nn.Module) -> bool:
    return any(isinstance(m, LoRALinear) for m in model.modules())


def merge_state_dict(state_dict: Mapping[str, Tensor], scaling: float | Mapping[str, float]) -> dict[str, Tensor]:
    """A LoRA model's state dict as the plain model's: for each adapted layer ``p`` (keys ``p.base.weight``,
    ``p.lora_A``, ``p.lora_B``) the key ``p.weight`` holds W0 + (alpha / r) B A (:func:`merged_weight`) and
    ``p.bias`` the base bias; ARCO's reference buffers are dropped; every other key passes through unchanged.

    ``scaling``: alpha / r for every layer, or per layer name ``p``. Works on any full state dict (a module's, or
    ZeRO-3's gathered one)."""
    prefixes = [k[: -len(".lora_A")] for k in state_dict if k.endswith(".lora_A")]
    out: dict[str, Tensor] = {}
    skip: set[str] = set()
    for p in prefixes:
        s = scaling[p] if isinstance(scaling, Mapping) else scaling
        out[f"{p}.weight"] = merged_weight(state_dict[f"{p}.base.weight"], state_dict[f"{p}.lora_A"],
                                           state_dict[f"{p}.lora_B"], s)
        if f"{p}.base.bias" in state_dict:
            out[f"{p}.bias"] = state_dict[f"{p}.base.bias"]
        skip |= {f"{p}.base.weight", f"{p}.base.bias", f"{p}.lora_A", f"{p}.lora_B",
                 *(f"{p}.{b}" for b in _DROPPED_BUFFERS)}
    for k, v in state_dict.items():
        if k not in skip:
            out[k] = v
    return out


def merged_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """``model``'s weights with every adapter folded in, under the plain HF names (no copy of the weights that
    carry no adapter). Full-parameter models come back as their own state dict."""
    layers = lora_layers(model)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    if not layers:
        return sd
    with torch.no_grad():
        return merge_state_dict(sd, {name: m.scaling for name, m in layers.items()})


def adapter_state_dict(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The adapters of a LoRA state dict under PEFT's saved names: ``p.lora_A`` -> ``base_model.model.p.lora_A.weight``
    (shape r x in, as PEFT's ``lora_A`` Linear) and ``p.lora_B`` -> ``...lora_B.weight`` (out x r)."""
    out: dict[str, Tensor] = {}
    for k, v in state_dict.items():
        head, _, leaf = k.rpartition(".")
        if leaf in _LORA_KEYS:
            out[f"{PEFT_PREFIX}{head}.{leaf}.weight"] = v.detach().contiguous()
    return out


def peft_adapter_config(r: int, alpha: float, dropout: float, targets: Sequence[str],
                        base_model_name_or_path: str | None) -> dict[str, Any]:
    """``adapter_config.json`` in PEFT's format for the adapters of :func:`add_lora` (``PeftModel.from_pretrained``
    reads it: same rank, alpha, dropout and target rule; Kaiming-uniform A, no bias adapters, no rsLoRA / DoRA)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": int(r),
        "lora_alpha": float(alpha),
        "lora_dropout": float(dropout),
        "target_modules": sorted(set(targets)),
        "base_model_name_or_path": base_model_name_or_path,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "revision": None,
    }
