"""Full-parameter SFT warm start on tag-format trajectories (paper App. B.2).

Paper settings (qwen3 profiles): 3 epochs, max length 15,000, effective batch 16, lr 7e-6 cosine with 10% linear
warm-up, bf16, DeepSpeed ZeRO-3. The data is any JSONL of ``{question_id?, question, golds?, response}`` rows in
our tag format (docs/sft.md); ``<result>`` blocks are loss-masked (``tasks.env.agent.tokenize_trajectory``). Rows
must be written in the run's protocol (a row with another protocol's tool-output tag is refused by line: its tool
output would be trained on); ``arbor-sft`` stages a flat file for ``rollout.protocol=rubricem`` itself.

Loss: token-level mean negative log-likelihood over the policy tokens of one effective batch,
    L = - sum_{i,t} m_it log pi(y_it | y_<it, x_i) / sum_{i,t} m_it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
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
from arbor.tasks.training.engine import (
    build_engine,
    deepspeed_config,
    deepspeed_module,
    init_single_process_env,
    load_model,
    merge,
    read_deepspeed_json,
)
from arbor.tasks.training.packing import make_micro, pack_micro_batches, packing_mode, row_layout
from arbor.tasks.training.recompute import MemoryBudget
from arbor.timefmt import duration


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
    from arbor.format import get_protocol
    from arbor.tasks.env.agent import tokenize_trajectory

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
    state_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Train on the JSONL at ``data_path`` and write an HF checkpoint (weights + tokenizer) to ``out_dir``.

    ``out_dir`` defaults to ``sft.output`` (relative paths: under ARBOR_HOME). Stops after ``sft.epochs`` or when ``sft.max_minutes`` has elapsed (checked before each optimizer update).
    Every rank of a launched group runs this (``main``); each trains its share of every effective batch's
    micro-batches. With ``state_dir`` the DeepSpeed state (weights, optimizer, LR schedule) is kept there every
    ``sft.save_every`` updates, and a later call with the same ``state_dir`` resumes after the latest kept update
    (the data order is a function of seed and epoch, so the resumed run sees the batches it had not trained on).
    Returns a summary: examples, truncated, updates, epochs_done, first/last loss, seconds, out, stopped_early,
    resumed_from, world_size.
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
    # a micro-batch holds at most micro_batch_tokens padded tokens, or one sequence of up to max_length
    memory = MemoryBudget(max(tc.micro_batch_tokens, sc.max_length), tc.memory_budget_gib, tc.memory_fraction)
    model = load_model(model_path, bf16=sc.bf16, ds_config=ds_config, gradient_checkpointing=tc.gradient_checkpointing,
                       lora=cfg.policy.lora, seed=cfg.run.seed, memory=memory)  # policy.lora: adapters; save_hf merges them
    packing = packing_mode(model)
    init_group(cfg)
    engine = build_engine(model, ds_config=ds_config, lr=sc.lr, weight_decay=sc.weight_decay, betas=tc.betas,
                          schedule=sc.lr_schedule, warmup_steps=int(sc.warmup_ratio * total), total_steps=total)
    engine.train()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    budget_s = sc.max_minutes * 60.0 if sc.max_minutes is not None else math.inf
    save_every = sc.save_every or max(1, total // 10)
    state = Path(state_dir) if state_dir is not None else None
    resumed = load_sft_state(engine, state, world, total) if state is not None else 0
    if resumed and rank == 0:
        print(f"SFT: resuming after update {resumed}/{total} from {state}", flush=True)
    losses: list[float] = []
    updates, epochs_done, stopped = 0, 0, False
    for epoch in range(sc.epochs):
        for idx in batches(len(examples), sc.batch_size, cfg.run.seed, epoch):
            if updates < resumed:  # trained before the interruption: its weights and optimizer state are loaded
                updates += 1
                continue
            if time.monotonic() - t_start > budget_s:
                stopped = True
                break
            n_tok = float(sum(sum(examples[i].loss_mask) for i in idx))
            # the RL trainer's packer: rows of sequences laid end to end where the attention keeps them
            # apart, else one padded sequence a row
            micro = [[[idx[j] for j in row] for row in mb]
                     for mb in pack_micro_batches([examples[i].length for i in idx], tc.micro_batch_tokens, packing)]
            mine = micro[rank::world]
            mine += [[] for _ in range(math.ceil(len(micro) / world) - len(mine))]
            step_loss = 0.0
            for k, mb in enumerate(mine):
                engine.set_gradient_accumulation_boundary(k == len(mine) - 1)
                flat = [i for row in mb for i in row]
                sub = [examples[i] for i in flat] if flat else [examples[idx[0]]]
                m = make_micro([e.prompt_ids for e in sub], [e.response_ids for e in sub],
                               [e.loss_mask for e in sub], dummy=not mb, layout=row_layout(mb, packing)).to(engine.device)
                logp, _ = engine(m.ids, m.att, m.rows, m.cols, m.targets, position_ids=m.pos)
                loss = sft_loss(logp, m.mask, n_tok) * world
                engine.backward(loss, scale_wrt_gas=False)
                engine.step()
                step_loss += float(loss.detach()) / world
            updates += 1
            losses.append(step_loss)
            if log is not None and rank == 0:
                log({"update": float(updates), "epoch": float(epoch), "loss": step_loss,
                     "lr": float(engine.get_lr()[0]), "total": float(total)})
            if state is not None and updates % save_every == 0 and updates < total:
                save_sft_state(engine, state, updates, world, total, rank)
            sft_fault_point(updates)
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
        seconds=time.monotonic() - t_start, out=str(out), stopped_early=stopped, resumed_from=resumed,
        world_size=world,
    )


# ------------------------------------------------------------------------------------------- resumable state
STATE_FILE = "sft_state.json"


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def save_sft_state(engine: Any, state_dir: Path, update: int, world: int, total: int, rank: int) -> None:
    """Keep the DeepSpeed state after ``update`` (collective: every rank calls). The record naming it is written
    last and atomically, so a crash while saving leaves the previous state in force; older states are removed."""
    tag = f"update_{update:07d}"
    engine.save_checkpoint(str(state_dir), tag=tag, save_latest=False)
    _barrier()
    if rank == 0:
        tmp = state_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps({"update": update, "tag": tag, "world_size": world, "total": total}))
        os.replace(tmp, state_dir / STATE_FILE)
        for old in state_dir.glob("update_*"):
            if old.name != tag:
                shutil.rmtree(old, ignore_errors=True)
    _barrier()


def load_sft_state(engine: Any, state_dir: Path, world: int, total: int) -> int:
    """Load the kept state under ``state_dir`` into ``engine``; the update it was kept after (0: none to load).

    A state kept by a process group of another size, or for another number of updates, is not loaded (ZeRO
    partitions are per rank; another schedule is another run): the SFT starts over, and says so."""
    record = state_dir / STATE_FILE
    if not record.exists():
        return 0
    kept = json.loads(record.read_text())
    if kept.get("world_size") != world or kept.get("total") != total:
        print(f"SFT: not resuming from {state_dir}: kept by {kept.get('world_size')} ranks for {kept.get('total')} "
              f"updates, this run has {world} ranks and {total} updates; starting over", flush=True)
        return 0
    path, _ = engine.load_checkpoint(str(state_dir), tag=kept["tag"], load_optimizer_states=True,
                                     load_lr_scheduler_states=True)
    if path is None:
        raise RuntimeError(f"{state_dir}/{kept['tag']}: DeepSpeed could not load the kept SFT state")
    return int(kept["update"])


CPU_DIST_TIMEOUT_S = 120.0  # gloo ranks on one machine: a peer silent this long is stuck, not slow


def dist_timeout_s(cfg: ArborConfig) -> float | None:
    """The launched group's collective timeout (``sft.dist_timeout_s``): unset, ``CPU_DIST_TIMEOUT_S`` for
    CPU ranks and None (DeepSpeed's own, 10 min) on GPUs, where a ZeRO-3 gather of a large model can take minutes."""
    if cfg.sft.dist_timeout_s is not None:
        return cfg.sft.dist_timeout_s
    tc = cfg.train
    gpus = tc.hostfile or cfg.cluster.rollout_gpus or cfg.cluster.train_gpus or tc.num_gpus > 0
    return None if gpus else CPU_DIST_TIMEOUT_S


def init_group(cfg: ArborConfig) -> None:
    """Join a launched group (``WORLD_SIZE`` > 1) with ``dist_timeout_s``'s collective timeout, before DeepSpeed
    would join it with its default: a rank whose peer hangs fails after that long instead of ten minutes."""
    import torch.distributed as dist

    seconds = dist_timeout_s(cfg)
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or seconds is None or (dist.is_available() and dist.is_initialized()):
        return
    from datetime import timedelta

    deepspeed_module().init_distributed(timeout=timedelta(seconds=seconds))


def sft_fault_point(update: int) -> None:
    """Failure drills and tests: ``ARBOR_SFT_FAULT=N`` ends every rank right after update N (and its kept state)
    as a killed process would (exit status 137, nothing cleaned up)."""
    if os.environ.get("ARBOR_SFT_FAULT") == str(update):
        print(f"SFT: injected fault after update {update}", flush=True)
        os._exit(137)


class SFTProgress:
    """SFT's progress: a live bar on a terminal; off one (a log, a launched rank's pipe) a line at each tenth of
    the updates and at least every ``ARBOR_PROGRESS_SECONDS`` (default 10), so minutes of SFT are never silent."""

    def __init__(self, epochs: int, *, live: bool | None = None, every_s: float | None = None) -> None:
        self.epochs = epochs
        self.live = sys.stderr.isatty() if live is None else live
        self.every_s = every_s if every_s is not None else float(os.environ.get("ARBOR_PROGRESS_SECONDS", 10))
        self.t0 = self.last = time.monotonic()
        self.t_first = self.t0  # when this process's first update ended
        self.bar: Any = None
        self.calls = 0

    def __call__(self, m: dict[str, float]) -> None:
        update, total = int(m["update"]), int(m["total"])
        now = time.monotonic()
        self.calls += 1
        if self.calls == 1:
            self.t_first = now
        if self.live:
            self._draw(update, total, m["loss"])
            return
        if update % max(1, total // 10) == 0 or update == total or now - self.last >= self.every_s:
            self.last = now
            print(self.line(m, now), flush=True)

    def line(self, m: dict[str, float], now: float) -> str:
        """The line at clock ``now``. The ETA is the rate since this process's first update ended (the model load
        and engine set-up before it are no measure of an update) times the updates left; none before a second."""
        update, total = int(m["update"]), int(m["total"])
        text = (f"SFT update {update}/{total} (epoch {m['epoch'] + 1:.0f} of {self.epochs}): loss {m['loss']:.3f}, "
                f"{duration(now - self.t0)}")
        if self.calls >= 2:
            text += f", ETA {duration((now - self.t_first) / (self.calls - 1) * (total - update))}"
        return text

    def _draw(self, update: int, total: int, loss: float) -> None:
        if self.bar is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("[bold]SFT"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("loss {task.fields[loss]:.3f}"), TimeRemainingColumn())
            self.task = self.bar.add_task("sft", total=total, loss=loss)
            self.bar.start()
        self.bar.update(self.task, completed=update, loss=loss)
        if update == total:
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


# ------------------------------------------------------------------------------------------- launched ranks
def launches_process_group(cfg: ArborConfig) -> bool:
    """Whether the SFT runs as a launched process group (``launch_command``) rather than in this process: any GPU
    in the layout, a hostfile, or more than one CPU rank."""
    tc, n = cfg.train, cfg.sft.processes
    return bool(tc.hostfile or cfg.cluster.rollout_gpus or cfg.cluster.train_gpus or tc.num_gpus > 0
                or (n and n > 1))


def launch_command(cfg: ArborConfig, args: list[str], *, python: str = sys.executable,
                   master_port: int | None = None) -> list[str] | None:
    """The command that starts the SFT process group, or None to train in this process.

    GPUs (``cluster.rollout_gpus`` + ``cluster.train_gpus``, or ``train.num_gpus`` / ``train.hostfile``): the
    ``deepspeed`` launcher over them, as the RL trainer is launched; SFT runs alone on the node, so the rollout
    GPUs train too (``sft.processes`` N: the first N). CPU: ``sft.processes`` N > 1 ranks under torchrun (gloo)."""
    from arbor.tasks.training.trainer_service import free_port

    if not launches_process_group(cfg):
        return None
    port = master_port or free_port()
    tc, n = cfg.train, cfg.sft.processes
    gpus = sorted(set(cfg.cluster.rollout_gpus) | set(cfg.cluster.train_gpus))
    module = ["--module", "arbor.tasks.training.sft", *args]
    if tc.hostfile:
        return ["deepspeed", "--hostfile", tc.hostfile, "--master_port", str(port), "--no_local_rank", *module]
    if gpus:
        chosen = gpus[:n] if n else gpus
        return ["deepspeed", "--include", "localhost:" + ",".join(map(str, chosen)), "--master_port", str(port),
                "--no_local_rank", *module]
    if tc.num_gpus > 0:
        return ["deepspeed", "--num_gpus", str(n or tc.num_gpus), "--master_port", str(port), "--no_local_rank",
                *module]
    if n and n > 1:
        return [python, "-m", "torch.distributed.run", "--nproc_per_node", str(n), "--master_addr", "127.0.0.1",
                "--master_port", str(port), "-m", "arbor.tasks.training.sft", *args]
    return None


def main(argv: list[str] | None = None) -> int:
    """One rank of a launched SFT group: ``python -m arbor.tasks.training.sft --config C --model M --data D
    --out O --state S --summary J`` (``launch_command``); rank 0 writes the summary JSON."""
    import argparse

    ap = argparse.ArgumentParser(description="one rank of arbor's SFT process group")
    for flag in ("--config", "--model", "--data", "--out", "--state", "--summary", "--home"):
        ap.add_argument(flag, required=flag != "--home")
    a = ap.parse_args(argv)
    from arbor.runtime.quiet import quiet

    quiet()
    cfg = ArborConfig.model_validate_json(Path(a.config).read_text())
    summary = run_sft(cfg, a.model, a.data, a.out, home=a.home, state_dir=a.state,
                      log=SFTProgress(cfg.sft.epochs, live=False))
    if int(os.environ.get("RANK", "0")) == 0:
        Path(a.summary).write_text(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
