"""One GPU check of the trainer and the rollout engine in one table, within a fixed budget.

    python3 bench/gpu_check.py --out DIR [--budget 480]       # on the device (``make gpu-check`` prints the call)
    python bench/gpu_check.py --dry-run --out DIR              # the same code path on the CPU, tiny sizes

Parts, most important first; each runs in a process of its own with its own time limit (``PARTS``), so an OOM, a
crash or a timeout in one is a row of the table and the others still run; a part that no longer fits the remaining
budget is reported as skipped. Each part appends its rows to a JSON-lines file as soon as it has them, so a part
killed half-way still reports what it measured.

- ``matmul``: the bf16 matmul peak (8192^3, TFLOP/s): the denominator of every MFU.
- ``head``: the policy head's forward + backward at 16k loss positions (hidden 2048, vocabulary 152k, bf16):
  full logits vs the chunked head, memory above the inputs.
- ``train-<size>-<mode>``: ``Trainer.train_step`` on a Qwen3-architecture model built from its config with random
  weights (no download), 0.6B with 32 x 2k-token sequences and 1.7B with 8 x 8k, under ZeRO-2, ZeRO-3 and LoRA
  (bf16, gradient checkpointing, 16k-token micro-batches): one warm-up step, then one timed step. tokens/s counts
  every real token; MFU counts 6N model FLOPs per token plus 2N per token the trainer put through a pi_old pass
  (``Trainer.last_timing['old_pass_tokens']``; none with one mini-batch) (N every parameter, the tied
  embedding once; the issue's goal) over the measured peak; ``MFU+attn`` adds causal attention's
  4 * layers * heads * head_dim * L(L+1)/2 FLOPs per sequence and forward pass (x3 for forward + backward, + the
  pi_old pass's share). Peak
  memory is ``torch.cuda.max_memory_allocated`` over both steps.
- in the 1.7B ZeRO-2 part, after its steps: ``state_dict_for_sync`` and the packing of that 1.7B state dict on
  CUDA as the NCCL weight sync packs it (``vllm_sync.packed_chunks``; the broadcast needs a second GPU), then
  ``save_checkpoint(wait=False)`` (ds/ + hf/): the step's wait for it (the host copy), a step run
  while the background writer writes, the time until the commit, and the reload of hf/ with ``from_pretrained``.
- ``rollout-b16``, ``rollout-b64``: ``bench/rollout.py`` (the agent loop of ``TransformersEngine`` against
  ``generate()``), its ratio parsed from its output.
- ``arbor-step``: one ARBOR step end to end (``part_arbor_step``), its seconds by stage.

Writes ``gpu_check.txt`` (the table), ``gpu_check.json`` (every row) and ``gpu_check.log`` (each part's output
tail) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

QWEN3 = {  # Qwen3-0.6B and Qwen3-1.7B (their config.json), random weights
    "0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "1.7b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
}
DRY_SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)


@dataclass(frozen=True)
class Workload:
    """A training batch: ``seqs`` sequences of ``prompt`` + ``response`` tokens, a sixth of each response a
    search-result block (loss mask 0), packed into micro-batches of ``micro_tokens`` padded tokens."""

    seqs: int
    prompt: int
    response: int
    micro_tokens: int


WORKLOADS = {"0.6b": Workload(32, 256, 1792, 16384), "1.7b": Workload(8, 512, 7680, 16384)}
DRY_WORKLOAD = Workload(4, 16, 48, 128)


@dataclass(frozen=True)
class Part:
    """One isolated measurement: ``limit_s`` caps its process; ``rows`` names the rows it should produce (a row it
    never wrote gets the part's outcome: failed, OOM, timeout, skipped)."""

    name: str
    limit_s: float
    rows: tuple[str, ...]
    kind: str = "python"  # python: this script's --part; rollout: bench/rollout.py parsed


def train_rows(size: str, mode: str) -> tuple[str, ...]:
    base = (f"train {size} {mode}",)
    return base + ((f"profile {size}", f"weight sync {size}", f"checkpoint reserve {size}", f"checkpoint save {size}",
                    f"checkpoint wait 1 {size}", f"checkpoint wait 2 {size}", f"checkpoint reload {size}")
                   if (size, mode) == ("1.7b", "zero2") else ())


STEP_STAGES = ("rollout", "score", "retire", "induce", "shape", "consolidate", "train", "checkpoint", "sync")

# the default parts fit ``--budget`` (300 s: five minutes of the device, so that a change and a second run fit in
# its fifteen); the others run when named (``--parts``)
PARTS = (
    Part("matmul", 20, ("matmul peak",)),
    Part("head", 25, ("head full 16k", "head chunked 16k")),
    Part("train-1.7b-zero2", 95, train_rows("1.7b", "zero2")),
    Part("train-0.6b-zero2", 35, train_rows("0.6b", "zero2")),
    Part("rollout-b16", 35, ("rollout b16",), kind="rollout"),
    Part("rollout-b64", 35, ("rollout b64",), kind="rollout"),
    Part("arbor-step", 55, ("arbor step 0.6b",)),
)
MORE_PARTS = (
    Part("train-1.7b-lora", 80, train_rows("1.7b", "lora")),
    Part("train-1.7b-zero3", 90, train_rows("1.7b", "zero3")),
    Part("train-0.6b-zero3", 60, train_rows("0.6b", "zero3")),
    Part("train-0.6b-lora", 60, train_rows("0.6b", "lora")),
)
MIN_START_S = 15.0  # a part is not started with less budget than this left


# ---------------------------------------------------------------------------------------------- inside a part
@dataclass
class Ctx:
    """What a part's process knows: where to write its rows, its device, whether this is the dry run."""

    result: Path
    work: Path
    dry: bool
    out: Path  # the orchestrator's --out: files beside the table (the profile)
    device: str = field(init=False)

    def __post_init__(self) -> None:
        import torch

        self.device = "cpu" if self.dry or not torch.cuda.is_available() else "cuda"

    def emit(self, row: str, **values: Any) -> None:
        with self.result.open("a") as f:
            f.write(json.dumps({"row": row, "status": "ok", **values}) + "\n")


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def peak_gib(device: str) -> float:
    """Peak memory since the last reset: CUDA's allocator, or the process's peak RSS on the CPU."""
    import resource

    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def part_matmul(ctx: Ctx) -> None:
    """bf16 (CPU: float32) n^3 matmul, best of three timed batches."""
    import torch

    n, dtype = (512, torch.float32) if ctx.device == "cpu" else (8192, torch.bfloat16)
    a = torch.randn(n, n, device=ctx.device, dtype=dtype)
    b = torch.randn(n, n, device=ctx.device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(ctx.device)
    best, reps = 0.0, 20
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        sync(ctx.device)
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12)
    ctx.emit("matmul peak", tflops=best, detail=f"{str(dtype).removeprefix('torch.')} {n}^3, best of 3 x {reps}")


def part_head(ctx: Ctx) -> None:
    """The policy head's forward + backward at 16k loss positions, hidden 2048 (1.7B), vocabulary 152k, bf16, T 0.7,
    entropy diagnostic on: full logits (the path before the chunked head) vs ``chunked_logprobs``; the memory above
    the inputs (CUDA allocator peak) and the seconds."""
    import torch

    from arbor.tasks.training.head import chunked_logprobs
    from arbor.tasks.training.losses import token_entropy, token_logprobs

    n, d, v = (256, 16, 512) if ctx.dry else (16384, 2048, 151936)
    dtype = torch.float32 if ctx.device == "cpu" else torch.bfloat16
    for path in ("chunked", "full"):  # the full path last: an OOM there loses nothing else
        torch.manual_seed(0)
        h = torch.randn(n, d, device=ctx.device, dtype=dtype).requires_grad_()
        w = (torch.randn(v, d, device=ctx.device) / d**0.5).to(dtype).requires_grad_()
        y = torch.randint(0, v, (n,), device=ctx.device)
        wa = torch.randn(n, device=ctx.device)
        sync(ctx.device)
        if ctx.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**30 if ctx.device == "cuda" else 0.0
        t0 = time.perf_counter()
        if path == "full":
            logits = torch.nn.functional.linear(h, w).float() / 0.7
            logp, _ = token_logprobs(logits, y), token_entropy(logits.detach())
            del logits
        else:
            logp, _ = chunked_logprobs(h, w, None, y, 0.7, "detached")
        (wa * logp).sum().backward()
        sync(ctx.device)
        ctx.emit(f"head {path} 16k", step_s=time.perf_counter() - t0,
                 peak_gib=(peak_gib(ctx.device) - base) if ctx.device == "cuda" else None,
                 detail=f"{n} positions x {v} vocabulary, hidden {d}, {str(dtype).removeprefix('torch.')}; "
                        "memory above the inputs")
        del h, w, logp


def model_shape(ctx: Ctx, size: str) -> dict[str, Any]:
    return dict(DRY_SHAPE) if ctx.dry else dict(QWEN3[size])


def ensure_model(ctx: Ctx, size: str) -> Path:
    """A random-weight Qwen3 of ``size`` saved once under the work folder (built on the device: no CPU init)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = ctx.work / "models" / size
    if (out / "config.json").exists():
        return out
    shape = model_shape(ctx, size)
    cfg = Qwen3Config(max_position_embeddings=16384, **shape)
    torch.manual_seed(0)
    with torch.device(ctx.device):
        model = Qwen3ForCausalLM(cfg)
    if ctx.device == "cuda":
        model = model.to(torch.bfloat16)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{size}-"))
    model.save_pretrained(tmp)
    del model
    tmp.rename(out)
    return out


def count_params(shape: dict[str, Any]) -> int:
    """Parameters of the model (the tied embedding once), built on the meta device."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with torch.device("meta"):
        m = Qwen3ForCausalLM(Qwen3Config(**shape))
    return sum(p.numel() for p in m.parameters())


def make_batch(vocab: int, wl: Workload, version: int) -> list:
    """``wl.seqs`` trajectories, four per group (random ids; half the rewards 1), tagged with ``version``."""
    import torch

    from arbor.types import Trajectory

    g = torch.Generator().manual_seed(version)
    out = []
    k = min(4, wl.seqs)
    for i in range(wl.seqs):
        grp, s = divmod(i, k)
        mask = [1] * wl.response
        mask[wl.response // 3: wl.response // 3 + wl.response // 6] = [0] * (wl.response // 6)
        out.append(Trajectory(
            run_id="gpu-check", step=version + 1, group=grp, sample=s, question_id=str(grp), question="?", golds=[],
            prompt_ids=torch.randint(10, vocab, (wl.prompt,), generator=g).tolist(),
            response_ids=torch.randint(10, vocab, (wl.response,), generator=g).tolist(), loss_mask=mask,
            rollout_logprobs=[-9.0 if m else 0.0 for m in mask], base_reward=float(s % 2), policy_version=version))
    return out


def attention_flops(shape: dict[str, Any], lengths: list[int]) -> float:
    """Causal attention FLOPs of one forward pass (QK^T and AV: 2 x 2 x heads x head_dim per (query, key) pair)."""
    per_pair = 4 * shape["num_hidden_layers"] * shape["num_attention_heads"] * shape["head_dim"]
    return float(sum(per_pair * n * (n + 1) / 2 for n in lengths))


def part_train(ctx: Ctx, size: str, mode: str) -> None:
    """Two ``Trainer.train_step`` calls (warm-up, timed) of ``mode`` (zero2, zero3, lora) at ``size``."""
    import torch

    from arbor.config import load_config
    from arbor.tasks.training.train import Trainer
    from arbor.tasks.training.update import policy_update

    wl = DRY_WORKLOAD if ctx.dry else WORKLOADS[size]
    shape = model_shape(ctx, size)
    model_dir = ensure_model(ctx, size)
    gpu = ctx.device == "cuda"
    cfg = load_config("tiny-cpu", {
        "run.run_id": f"gpu-check-{size}-{mode}", "run.steps": 10, "train.micro_batch_tokens": wl.micro_tokens,
        "train.zero_stage": 3 if mode == "zero3" else 2, "train.bf16": gpu, "train.gradient_checkpointing": gpu,
        "train.entropy_diagnostic": False, "policy.lora.enabled": mode == "lora", "rollout.temperature": 0.7,
    })
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    tr = Trainer(cfg, model_dir, ctx.work / "home")
    t_init = time.perf_counter() - t0
    walls = []
    for step in (1, 2):
        batch = make_batch(shape["vocab_size"], wl, tr.policy_version)
        sync(ctx.device)
        t0 = time.perf_counter()
        tr.train_step(policy_update(batch, step, cfg.train, cfg.run.overlap), step)
        sync(ctx.device)
        walls.append(time.perf_counter() - t0)
    timing = dict(tr.last_timing)
    lengths = [wl.prompt + wl.response] * wl.seqs
    n = count_params(shape)
    # forward + backward (2x) for every token, + the pi_old forward for the tokens the trainer says it put through
    # a no-grad pi_old pass (none when the update is one mini-batch)
    old_share = timing["old_pass_tokens"] / max(1.0, timing["tokens"])
    old_pass = timing["old_pass_tokens"] > 0
    passes = 3 + old_share
    model_flops = 2 * n * (3 * timing["tokens"] + timing["old_pass_tokens"])
    ctx.emit(f"train {size} {mode}", tokens_s=timing["tokens"] / walls[-1], step_s=walls[-1],
             model_flops=model_flops, attn_flops=attention_flops(shape, lengths) * passes, peak_gib=peak_gib(ctx.device),
             params=n, old_pass=old_pass,
             detail=(f"{wl.seqs}x{wl.prompt + wl.response} tok, old {timing.get('old_logprobs', 0):.2f} fwd "
                     f"{timing['forward']:.2f} bwd {timing['backward']:.2f} opt {timing['optimizer']:.2f} s; "
                     f"warm-up {walls[0]:.1f} s, init {t_init:.1f} s"))
    if (size, mode) != ("1.7b", "zero2"):
        return
    # weight sync: the full state dict, then packed into 1 GiB buckets (what a packed broadcast sends)
    sync(ctx.device)
    t0 = time.perf_counter()
    sd = tr.state_dict_for_sync()
    sync(ctx.device)
    t_sd = time.perf_counter() - t0
    t_pack, n_buckets, nbytes, how = pack_buckets(sd, ctx.device)
    ctx.emit(f"weight sync {size}", step_s=t_sd + t_pack,
             detail=f"state_dict_for_sync {t_sd:.2f} s + pack {t_pack:.3f} s: {nbytes / 2**30:.2f} GiB in "
                    f"{n_buckets} chunks ({nbytes / 2**30 / max(t_pack, 1e-9):.0f} GiB/s; {how})")
    del sd
    # checkpoint: the trainer filled the save's host pool at its start (CheckpointSaver.reserve); each step's save
    # copies the state into it and returns; the next step runs while the background writer writes ds/ + hf/
    reserve_s, reserve_bytes = tr.reserved
    ctx.emit(f"checkpoint reserve {size}", step_s=reserve_s,
             detail=f"the trainer's start: {reserve_bytes / 2**30:.1f} GiB of host buffers"
                    + (", pinned" if gpu else " (a CPU trainer keeps no pool: 0)"))
    waits, nexts, path = [], [], None
    t_first = time.perf_counter()
    for k, step in enumerate((3, 4)):
        sync(ctx.device)
        t0 = time.perf_counter()
        path = tr.save_checkpoint(wait=False)
        waits.append(time.perf_counter() - t0)
        host_gib = (tr.save_timing or {}).get("snapshot_bytes", 0.0) / 2**30
        batch = make_batch(shape["vocab_size"], wl, tr.policy_version)
        t1 = time.perf_counter()
        tr.train_step(policy_update(batch, step, cfg.train, cfg.run.overlap), step)
        sync(ctx.device)
        nexts.append(time.perf_counter() - t1)
        ctx.emit(f"checkpoint wait {k + 1} {size}", step_s=waits[-1],
                 detail=f"the step's wait for save {k + 1}: host copy of {host_gib:.1f} GiB; the next step "
                        f"{nexts[-1]:.2f} s with the writer running (alone {walls[-1]:.2f} s)")
    t_finish = tr.finish_save()
    assert path is not None
    size_gib = sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**30
    ctx.emit(f"checkpoint save {size}", step_s=time.perf_counter() - t_first,
             detail=f"two saves, ds/ + hf/, {size_gib:.1f} GiB on disk each, committed by the background writer "
                    f"({t_finish:.1f} s waited for the last at the end)")
    profile_step(ctx, tr, cfg, shape, wl, size, step=5)
    from transformers import AutoModelForCausalLM

    sync(ctx.device)
    t0 = time.perf_counter()
    lm = AutoModelForCausalLM.from_pretrained(path / "hf", dtype=torch.bfloat16 if gpu else torch.float32)
    lm = lm.to(ctx.device)
    sync(ctx.device)
    t_load = time.perf_counter() - t0
    with torch.no_grad():
        lm.generate(input_ids=torch.tensor([[11, 12, 13]], device=ctx.device), max_new_tokens=4, do_sample=False)
    ctx.emit(f"checkpoint reload {size}", step_s=t_load, detail="from_pretrained(hf/) + .to(device); generates")
    shutil.rmtree(path, ignore_errors=True)


def profile_step(ctx: Ctx, tr: Any, cfg: Any, shape: dict[str, Any], wl: Workload, size: str, step: int) -> None:
    """One more step under torch.profiler: where its time goes, by operator (self time on the device, on the CPU in
    the dry run). The top operators are the row's detail; the table of the top 40 is written beside the results
    (``profile-<size>.txt``)."""
    from torch.profiler import ProfilerActivity, profile

    from arbor.tasks.training.update import policy_update

    gpu = ctx.device == "cuda"
    batch = make_batch(shape["vocab_size"], wl, tr.policy_version)
    sync(ctx.device)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])) as prof:
        tr.train_step(policy_update(batch, step, cfg.train, cfg.run.overlap), step)
        sync(ctx.device)
    took = time.perf_counter() - t0
    attr = "self_device_time_total" if gpu else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, attr), reverse=True)
    total = sum(getattr(e, attr) for e in events) or 1.0
    top = [f"{e.key[:40]} {100 * getattr(e, attr) / total:.0f}%" for e in events[:6]]
    ctx.out.mkdir(parents=True, exist_ok=True)
    (ctx.out / f"profile-{size}.txt").write_text(prof.key_averages().table(sort_by=attr, row_limit=40))
    ctx.emit(f"profile {size}", step_s=took, detail="self time by operator: " + ", ".join(top))


def pack_buckets(sd: dict[str, Any], device: str, bucket_bytes: int = 2**30) -> tuple[float, int, int, str]:
    """Pack every tensor of ``sd`` (on ``device``) as the NCCL weight sync does (``vllm_sync.packed_chunks``, vLLM
    0.33's cut, with its default buffer), or, where this tree has no such function, into contiguous per-dtype
    buckets of at most ``bucket_bytes``; returns (seconds, buckets, bytes, which packer)."""
    import torch

    tensors = {n: t.to(device, non_blocking=True) for n, t in sd.items()}
    sync(device)
    try:
        from arbor.tasks.training import vllm_sync

        size = getattr(vllm_sync, "DEFAULT_PACKED_BUFFER_BYTES", bucket_bytes)
        t0 = time.perf_counter()
        chunks = list(vllm_sync.packed_chunks(iter(tensors.items()), size))
        sync(device)
        took = time.perf_counter() - t0
        return took, len(chunks), sum(c.numel() for c in chunks), f"vllm_sync.packed_chunks, {size / 2**20:.0f} MiB"
    except ImportError:
        pass
    t0 = time.perf_counter()
    buckets: list[torch.Tensor] = []
    by_dtype: dict[Any, list[torch.Tensor]] = {}
    for t in tensors.values():
        by_dtype.setdefault(t.dtype, []).append(t)
    for group in by_dtype.values():
        cur: list[torch.Tensor] = []
        cur_bytes = 0
        for t in group:
            nb = t.numel() * t.element_size()
            if cur and cur_bytes + nb > bucket_bytes:
                buckets.append(torch.cat([x.reshape(-1) for x in cur]))
                cur, cur_bytes = [], 0
            cur.append(t)
            cur_bytes += nb
        if cur:
            buckets.append(torch.cat([x.reshape(-1) for x in cur]))
    sync(device)
    return (time.perf_counter() - t0, len(buckets), sum(b.numel() * b.element_size() for b in buckets),
            f"per-dtype buckets of {bucket_bytes / 2**20:.0f} MiB")


def part_arbor_step(ctx: Ctx) -> None:
    """One ARBOR step end to end on one device, as a run takes it (``RunState.run_stage`` for each stage of the
    method, then the checkpoint and the weight sync): Qwen3-0.6B's body (28 layers, hidden 1024) with the tiny
    policy's tokenizer (8k vocabulary instead of 152k: no Qwen3 tokenizer without the Hub) and random weights, the
    transformers engine, the rules judge, local BM25, DeepSpeed ZeRO-2 and the in-process weight sync; 16 questions
    x K 8. Step 1 warms up; step 2 is the row, its seconds by stage. No Prefect: the stages are committed to the
    stage store as the flow's tasks commit them."""
    from arbor.flows.run_setup import open_run, prepare_run
    from arbor.storage.catalog import ensure_catalog
    from arbor.tasks.env.policy import TINY_SHAPES, TinyPolicyConfig, build_tiny_policy

    gpu = ctx.device == "cuda"
    home = ctx.work / "arbor-home"
    body = TinyPolicyConfig(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                            num_key_value_heads=8, head_dim=128) if gpu else TINY_SHAPES["1.5m"]
    t0 = time.perf_counter()
    policy = build_tiny_policy(body, path=ctx.work / "models" / "arbor-step")
    t_build = time.perf_counter() - t0
    o = {"run.method": "arbor", "run.steps": 2, "run.sft_warm_start": False, "run.eval_every": None,
         "run.eval_final": False, "policy.model": "tiny", "policy.tiny_path": str(policy),
         "rollout.batch_size": 16 if gpu else 2, "rollout.k": 8 if gpu else 4,
         "rollout.max_new_tokens_per_turn": 128 if gpu else 16, "rollout.max_response_tokens": 512 if gpu else 48,
         "train.bf16": gpu, "train.gradient_checkpointing": gpu, "checkpoint.every": 1, "checkpoint.async_save": True,
         "judge.backend": "rules", "tracking.loggers": []}
    ensure_catalog(home)
    cfg = prepare_run("tiny-cpu", o, "gpu-check-arbor", False, home)
    t0 = time.perf_counter()
    with open_run(cfg, home) as run:
        t_open = time.perf_counter() - t0
        walls = []
        for step in (1, 2):
            t0 = time.perf_counter()
            *before, train = run.method.stages
            for stage in before:
                run.run_stage(step, stage)
            run.end_judging(step)
            run.run_stage(step, train)
            run.after_train(step)
            walls.append(time.perf_counter() - t0)
        seconds = dict(run.stage_seconds[2])
        inside = dict(getattr(run.trainer, "last_timing", {}))
    order = [st for st in STEP_STAGES if st in seconds] + sorted(set(seconds) - set(STEP_STAGES))
    cells = ", ".join(f"{st} {seconds[st]:.2f}" for st in order)
    update = ", ".join(f"{k} {inside[k]:.2f}" for k in ("old_logprobs", "forward", "backward", "optimizer")
                       if k in inside)
    ctx.emit("arbor step 0.6b", step_s=walls[-1], stages=seconds,
             detail=f"{cells} s (train: {update}); warm-up step {walls[0]:.1f} s, trainer and engines "
                    f"{t_open:.1f} s, policy built {t_build:.1f} s")


def run_part_inline(name: str, ctx: Ctx) -> None:
    if name == "matmul":
        part_matmul(ctx)
        return
    if name == "head":
        part_head(ctx)
        return
    if name == "arbor-step":
        part_arbor_step(ctx)
        return
    _, size, mode = name.split("-")
    part_train(ctx, size, mode)


# ---------------------------------------------------------------------------------------------- the orchestrator
def tail(text: str, n: int = 40) -> str:
    return "\n".join(text.splitlines()[-n:])


def failure_status(output: str, rc: int | None) -> str:
    """A short status for a part that ended badly, from its output."""
    if rc is None:
        return "timeout"
    if "OutOfMemoryError" in output or "out of memory" in output.lower():
        return "OOM"
    last = [ln for ln in output.splitlines() if ln.strip()]
    err = next((ln for ln in reversed(last) if re.match(r"^\w*(Error|Exception)\b", ln)), last[-1] if last else "")
    return f"failed (rc {rc}): {err.strip()[:120]}"


def run_process(cmd: list[str], timeout: float, env: dict[str, str]) -> tuple[int | None, str]:
    """Run ``cmd`` in its own session; kill the whole group at ``timeout``. (returncode or None on timeout, output)."""
    with tempfile.TemporaryFile("w+") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
        try:
            rc: int | None = p.wait(timeout=max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            started = time.time() - timeout
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            rc = None
            drop_stale_locks(started)
        out.seek(0)
        return rc, out.read()


def drop_stale_locks(since: float) -> None:
    """Remove the torch-extensions build locks created since ``since`` by a part killed while JIT-building an op
    (DeepSpeed's CPU comm op): a lock left behind makes every later build wait forever."""
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    for lock in root.glob("**/lock") if root.is_dir() else []:
        try:
            if lock.stat().st_mtime >= since:
                lock.unlink()
        except OSError:
            pass


def rollout_command(part: Part, dry: bool) -> list[str]:
    """bench/rollout.py under ``python -P``, arbor imported first: the bench puts the repository root on sys.path,
    whose ``arbor/`` folder would otherwise shadow the installed package (arbor.tasks lives in ``tasks/``)."""
    batch = part.name.removeprefix("rollout-b")
    if dry:
        args = ["--device", "cpu", "--size", "5m", "--batch", "2", "--repeats", "1", "--max-response", "24",
                "--turn-tokens", "8", "--threads", "1"]
    else:
        args = ["--device", "cuda", "--size", "50m", "--batch", batch, "--repeats", "2" if batch == "16" else "1"]
    code = ("import sys, runpy, arbor.tasks.env.rollout; sys.argv = ['bench/rollout.py'] + sys.argv[1:]; "
            "runpy.run_path('bench/rollout.py', run_name='__main__')")
    return [sys.executable, "-P", "-c", code, *args]


def parse_rollout(output: str) -> dict[str, Any] | None:
    """bench/rollout.py's summary lines: agent and generate() tokens/s, their ratio."""
    agent = re.search(r"agent loop : best\s+([\d.]+) tok/s", output)
    ref = re.search(r"generate\(\) : best\s+([\d.]+) tok/s", output)
    ratio = re.search(r"ratio agent/generate: best ([\d.]+), median ([\d.]+)", output)
    if not (agent and ref and ratio):
        return None
    return dict(ratio=float(ratio.group(1)), tokens_s=float(agent.group(1)),
                detail=f"agent {float(agent.group(1)):.0f} tok/s vs generate() {float(ref.group(1)):.0f} tok/s; "
                       f"median ratio {ratio.group(2)}")


def run_all(out: Path, budget_s: float, dry: bool, only: list[str] | None = None,
            limits: dict[str, float] | None = None, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Every part in order, each in its own process within its limit and the remaining budget; the rows."""
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="arbor-gpu-check-"))
    parts = list(PARTS) if only is None else [p for p in (*PARTS, *MORE_PARTS) if p.name in only]
    t_start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    logf = (out / "gpu_check.log").open("w")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    try:
        for part in parts:
            left = budget_s - (time.perf_counter() - t_start)
            limit = min(part.limit_s, (limits or {}).get(part.name, part.limit_s), left)
            if left < min(MIN_START_S, part.limit_s):
                rows += [dict(row=r, status="skipped (budget)") for r in part.rows]
                continue
            result = work / f"{part.name}.jsonl"
            if part.kind == "rollout":
                cmd = rollout_command(part, dry)
            else:
                cmd = [sys.executable, "-P", str(Path(__file__).resolve()), "--part", part.name, "--result", str(result),
                       "--work", str(work), "--out", str(out)] + (["--dry-run"] if dry else [])
            t0 = time.perf_counter()
            rc, output = run_process(cmd, limit, env)
            took = time.perf_counter() - t0
            logf.write(f"===== {part.name}: rc {rc}, {took:.1f} s (limit {limit:.0f} s)\n{tail(output)}\n")
            logf.flush()
            got: list[dict[str, Any]] = []
            if part.kind == "rollout":
                parsed = parse_rollout(output) if rc == 0 else None
                if parsed:
                    got.append(dict(row=part.rows[0], status="ok", **parsed))
            elif result.exists():
                got = [json.loads(ln) for ln in result.read_text().splitlines() if ln.strip()]
            done = {g["row"] for g in got}
            status = "ok" if rc == 0 else failure_status(output, rc)
            if rc is None:
                status = f"timeout ({limit:.0f} s)"
            rows += got + [dict(row=r, status=status if status != "ok" else "missing") for r in part.rows
                           if r not in done]
            log(f"{part.name}: {status} in {took:.1f} s")
    finally:
        logf.close()
        shutil.rmtree(work, ignore_errors=True)
    finish(rows)
    return rows


def finish(rows: list[dict[str, Any]]) -> None:
    """MFU of each training row against the measured peak (none without a peak)."""
    peak = next((r.get("tflops") for r in rows if r["row"] == "matmul peak" and r["status"] == "ok"), None)
    for r in rows:
        if "model_flops" in r and peak:
            r["mfu"] = r["model_flops"] / r["step_s"] / (peak * 1e12)
            r["mfu_attn"] = (r["model_flops"] + r["attn_flops"]) / r["step_s"] / (peak * 1e12)


def fmt(v: Any, spec: str) -> str:
    return "" if v is None else format(v, spec)


def table(rows: list[dict[str, Any]], header: str) -> str:
    """The one table: part, status, value columns, detail."""
    cols = f"{'part':<22} {'status':<16} {'tok/s':>9} {'MFU':>6} {'MFU+at':>6} {'peak GiB':>8} {'s':>7} {'ratio':>5}  detail"
    lines = [header, cols, "-" * len(cols)]
    for r in rows:
        value_s = r.get("step_s")
        tflops = r.get("tflops")
        lines.append(
            f"{r['row']:<22} {r['status'][:16]:<16} {fmt(r.get('tokens_s'), '9.0f'):>9} {fmt(r.get('mfu'), '6.3f'):>6} "
            f"{fmt(r.get('mfu_attn'), '6.3f'):>6} {fmt(r.get('peak_gib'), '8.1f'):>8} {fmt(value_s, '7.2f'):>7} "
            f"{fmt(r.get('ratio'), '5.2f'):>5}  "
            + (f"{tflops:.4g} TFLOP/s; " if tflops else "") + (r.get("detail") or "")
            + (f" [{r['status'][:110]}]" if len(r["status"]) > 16 else ""))
    lines.append("MFU: (6N + 2N if a pi_old pass ran) x tokens/s over the matmul peak, N every parameter; MFU+at adds "
                 "causal attention FLOPs; s: the timed step (train), or the operation's seconds")
    return "\n".join(lines)


def environment(dry: bool) -> str:
    import platform

    import torch

    bits = [f"python {platform.python_version()}", f"torch {torch.__version__}"]
    for mod in ("transformers", "deepspeed"):
        try:
            bits.append(f"{mod} {__import__(mod).__version__}")
        except Exception as e:  # noqa: BLE001 - reported, the parts will fail and say why
            bits.append(f"{mod} missing ({type(e).__name__})")
    manifest = ROOT / "bench" / "out" / "gpu-pack" / "manifest.json"
    if manifest.exists():  # the carried wheel must come from this tree (make gpu-check after the last edit)
        sys.path.insert(0, str(ROOT / "bench"))
        from gpu_pack import source_hash

        built, now = json.loads(manifest.read_text()).get("source_hash"), source_hash()
        bits.append(f"wheel of tree {built}" + ("" if built == now else f" STALE: the tree is now {now}"))
    dev = "CPU dry run" if dry else (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA")
    return f"gpu-check on {dev}: " + ", ".join(bits)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "gpu-check")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds for all parts together")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, the same code path")
    ap.add_argument("--parts", default=None, help="comma-separated part names (default: PARTS; MORE_PARTS "
                    "by name)")
    ap.add_argument("--limit", action="append", default=[], metavar="PART=SECONDS", help="override a part's limit")
    ap.add_argument("--part", default=None, help=argparse.SUPPRESS)  # one part, in its own process
    ap.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)  # arbor comes from the installed package (the device: the carried wheel)
    if args.part:
        try:
            run_part_inline(args.part, Ctx(args.result, args.work, args.dry_run, args.out))
        except BaseException:
            traceback.print_exc()
            return 1
        return 0
    t0 = time.perf_counter()
    header = environment(args.dry_run)
    print(header, flush=True)
    limits = {k: float(v) for k, v in (s.split("=", 1) for s in args.limit)}
    only = args.parts.split(",") if args.parts else None
    rows = run_all(args.out, args.budget, args.dry_run, only, limits)
    text = table(rows, header + f"; {time.perf_counter() - t0:.0f} s")
    print(text)
    (args.out / "gpu_check.txt").write_text(text + "\n")
    (args.out / "gpu_check.json").write_text(json.dumps(dict(header=header, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
