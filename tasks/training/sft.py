"""Full-parameter SFT warm start on tag-format trajectories (paper App. B.2; issue 6 §5).

Paper settings (qwen3 profiles): 3 epochs, max length 15,000, effective batch 16, lr 7e-6 cosine with 10% linear
warm-up, bf16, DeepSpeed ZeRO-3. The data is any JSONL of ``{question_id?, question, golds?, response}`` rows in
our tag format (docs/sft.md); ``<result>`` blocks are loss-masked (``tasks.env.agent.tokenize_trajectory``). Rows
must be written in the run's protocol (a row with another protocol's tool-output tag is refused by line: its tool
output would be trained on); ``arbor-sft`` stages a flat file for ``rollout.protocol=rubricem`` itself.

Loss: token-level mean negative log-likelihood over the policy tokens of one effective batch,
    L = - sum_{i,t} m_it log pi(y_it | y_<it, x_i) / sum_{i,t} m_it.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from arbor.config import ArborConfig
from arbor.paths import arbor_home
from arbor.seeding import derive_seed
from arbor.tasks.training import checkpoint as ckpt
from arbor.tasks.training.train import (
    build_engine,
    deepspeed_config,
    init_single_process_env,
    load_model,
    make_micro,
    merge,
    pack_by_tokens,
    read_deepspeed_json,
)


@dataclass
class SFTExample:
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


def tokenize_rows(rows: list[dict[str, Any]], tokenizer: Any, max_length: int,
                  system_prompt: str | None = None, protocol: str = "arbor") -> tuple[list[SFTExample], int]:
    """Tokenise rows as the agent loop would (with the run's ``rollout.system_prompt``, so SFT and RL prompts are
    the same tokens); responses are cut so prompt + response <= ``max_length``.

    Returns (examples, number truncated). Rows whose prompt alone reaches ``max_length`` are dropped (counted)."""
    from arbor.tasks.env.agent import tokenize_trajectory
    from arbor.tasks.format import get_protocol

    tags = get_protocol(protocol)
    out, truncated = [], 0
    for row in rows:
        # a row may bring its own system prompt (RubricEM's reflection rows, ``tasks.reflection``)
        p, r, m = tokenize_trajectory(tokenizer, row["question"], row["response"], row.get("system") or system_prompt,
                                      tags)
        room = max_length - len(p)
        if room <= 0:
            truncated += 1
            continue
        if len(r) > room:
            truncated += 1
            r, m = r[:room], m[:room]
        if sum(m) == 0:
            continue
        out.append(SFTExample(p, r, m))
    return out, truncated


def sft_loss(logp: torch.Tensor, mask: torch.Tensor, n_tokens: float) -> torch.Tensor:
    """Masked NLL summed over this micro-batch, divided by the effective batch's loss-token count (any shape)."""
    return -(logp * mask).sum() / max(1.0, n_tokens)


def batches(n: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Seeded shuffle of the example indices for one epoch, cut into effective batches."""
    g = torch.Generator().manual_seed(derive_seed(seed, epoch, "sft") % (2**63))
    perm = torch.randperm(n, generator=g).tolist()
    return [perm[i : i + batch_size] for i in range(0, n, batch_size)]


def run_sft(
    cfg: ArborConfig,
    model_path: str | Path,
    data_path: str | Path,
    out_dir: str | Path | None = None,
    *,
    home: str | Path | None = None,
    tokenizer: Any = None,
    log: Callable[[dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    """Train on the JSONL at ``data_path`` and write an HF checkpoint (weights + tokenizer) to ``out_dir``.

    ``out_dir`` defaults to ``sft.output`` (relative paths: under ARBOR_HOME). Stops after ``sft.epochs`` or when ``sft.max_minutes`` has elapsed (checked before each optimizer update).
    Returns a summary: examples, truncated, updates, epochs_done, first/last loss, seconds, out, stopped_early.
    """
    from arbor.tasks.env.policy import load_tokenizer
    from arbor.tasks.env.sft_data import read_sft_data

    init_single_process_env()
    sc, tc = cfg.sft, cfg.train
    t_start = time.monotonic()
    home = Path(home) if home is not None else arbor_home()
    out = Path(out_dir) if out_dir else home / (sc.output or f"sft/{cfg.run.run_id or 'default'}")
    tokenizer = tokenizer or load_tokenizer(model_path, cfg.policy)
    examples, truncated = tokenize_rows(read_sft_data(data_path, cfg.rollout.protocol), tokenizer, sc.max_length,
                                        cfg.rollout.system_prompt, cfg.rollout.protocol)
    if not examples:
        raise ValueError(f"{data_path}: no usable SFT examples (sft.max_length={sc.max_length})")
    steps_per_epoch = math.ceil(len(examples) / sc.batch_size)
    total = sc.epochs * steps_per_epoch
    ds_config = deepspeed_config(zero_stage=sc.zero_stage, bf16=sc.bf16, grad_clip=sc.grad_clip,
                                 extra=merge(read_deepspeed_json(tc.deepspeed_config), tc.deepspeed))
    model = load_model(model_path, bf16=sc.bf16, ds_config=ds_config, gradient_checkpointing=tc.gradient_checkpointing,
                       lora=cfg.policy.lora, seed=cfg.run.seed)  # policy.lora: adapters; save_hf merges them
    engine = build_engine(model, ds_config=ds_config, lr=sc.lr, weight_decay=sc.weight_decay, betas=tc.betas,
                          schedule=sc.lr_schedule, warmup_steps=int(sc.warmup_ratio * total), total_steps=total)
    engine.train()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    budget_s = sc.max_minutes * 60.0 if sc.max_minutes is not None else math.inf
    losses: list[float] = []
    updates, epochs_done, stopped = 0, 0, False
    for epoch in range(sc.epochs):
        for idx in batches(len(examples), sc.batch_size, cfg.run.seed, epoch):
            if time.monotonic() - t_start > budget_s:
                stopped = True
                break
            n_tok = float(sum(sum(examples[i].loss_mask) for i in idx))
            micro = [[idx[j] for j in mb] for mb in pack_by_tokens([examples[i].length for i in idx],
                                                                    tc.micro_batch_tokens)]
            mine = micro[rank::world]
            mine += [[] for _ in range(math.ceil(len(micro) / world) - len(mine))]
            step_loss = 0.0
            for k, mb in enumerate(mine):
                engine.set_gradient_accumulation_boundary(k == len(mine) - 1)
                sub = [examples[i] for i in mb] if mb else [examples[idx[0]]]
                m = make_micro([e.prompt_ids for e in sub], [e.response_ids for e in sub],
                               [e.loss_mask for e in sub], dummy=not mb).to(engine.device)
                logp, _ = engine(m.ids, m.att, m.rows, m.cols, m.targets)
                loss = sft_loss(logp, m.mask, n_tok) * world
                engine.backward(loss, scale_wrt_gas=False)
                engine.step()
                step_loss += float(loss.detach()) / world
            updates += 1
            losses.append(step_loss)
            if log is not None:
                log({"update": float(updates), "epoch": float(epoch), "loss": step_loss,
                     "lr": float(engine.get_lr()[0]), "total": float(total)})
        if stopped:
            break
        epochs_done += 1
    # HF checkpoint, written beside the target and renamed into place
    tmp = out.with_name(out.name + ".tmp")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    ckpt.save_hf(engine, tmp, sc.zero_stage, None, rank)
    if rank == 0:
        tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    return dict(
        examples=len(examples), truncated=truncated, updates=updates, epochs_done=epochs_done,
        first_loss=losses[0] if losses else float("nan"), last_loss=losses[-1] if losses else float("nan"),
        seconds=time.monotonic() - t_start, out=str(out), stopped_early=stopped,
    )
