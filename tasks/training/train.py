"""The policy update on a real DeepSpeed engine: GRPO with TIS, DAPO's clip-higher (paper App. B.2).

The trainer is a pure update worker: ``Trainer.train_step(update, step)`` takes an
``UpdateBatch`` the controller built (``tasks.training.update.policy_update``: kept trajectories, per-token advantages, the
KL coefficient, each trajectory's version lag) and returns metrics. It knows no method. One step:
  1. every trajectory must come from the policy version it claims (weight sync), then
  2. pi_old: log-probs of the response tokens under the current weights at the rollout temperature: for the first
     mini-batch its own forward's, detached (the weights are still pi_old's; ``tasks.training.pi_old``); a no-grad
     pass for the others;
  3. ``updates_per_batch`` optimizer updates: each mini-batch is packed by token count into micro-batches
     (``tasks.training.packing``), gradients accumulate over them, DeepSpeed clips and steps once per mini-batch;
  4. policy_version += 1 (the flow then syncs weights to the rollout engine and tags new rollouts with it).

The engine (DeepSpeed config, model load, LR schedule) is built by ``tasks.training.engine`` over the policy head
(``tasks.training.head``); checkpoints are saved and loaded by ``tasks.training.saver``.

CPU (CI): one process, DeepSpeed's CPU accelerator, ZeRO-2 (ZeRO-3 in tests), fp32. GPUs: ``deepspeed`` launcher,
ZeRO-3, bf16 (see ``tasks/training/trainer_service.py``, ``docs/gpu.md``).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from arbor.config import ArborConfig
from arbor.paths import arbor_home
from arbor.seeding import derive_seed
from arbor.tasks.training import checkpoint as ckpt
from arbor.tasks.training.engine import (
    barrier,
    build_engine,
    deepspeed_config,
    init_single_process_env,
    load_model,
    merge,
    read_deepspeed_json,
    register_head_weight,
    synchronize,
)
from arbor.tasks.training.head import PolicyHead, scoring_temperature
from arbor.tasks.training.losses import LossOut, policy_loss
from arbor.tasks.training.packing import Micro, make_micro, pack_micro_batches, packing_mode, row_layout
from arbor.tasks.training.pi_old import old_pass_members, pi_old_at
from arbor.tasks.training.recompute import MemoryBudget
from arbor.tasks.training.saver import CheckpointSaver
from arbor.tasks.training.update import check_token_advantages, grpo_loss_settings
from arbor.types import LossSettings, Trajectory, UpdateBatch


def check_trajectory(t: Trajectory) -> None:
    n = len(t.response_ids)
    if not t.prompt_ids:
        raise ValueError(f"trajectory {t.traj_id}: empty prompt_ids")
    if len(t.loss_mask) != n or len(t.rollout_logprobs) != n:
        raise ValueError(
            f"trajectory {t.traj_id}: response_ids ({n}), loss_mask ({len(t.loss_mask)}) and rollout_logprobs "
            f"({len(t.rollout_logprobs)}) must have equal lengths"
        )


# ---------------------------------------------------------------------------------------------- trainer
class Trainer:
    """A DeepSpeed engine over the policy with GRPO/DAPO steps, checkpoints and a policy version.

    ``Trainer(cfg, model_path, home, loss)``: ``model_path`` is an HF directory (the start checkpoint: SFT output or
    the tiny policy); ``loss`` the run's clip and KL reference as the controller decided them (default: the
    configured ones, plain GRPO). Checkpoints go to ``cfg.checkpoint.dir`` or ``{home}/checkpoints/{run_id}``.
    """

    def __init__(self, cfg: ArborConfig, model_path: str | Path, home: str | Path | None = None,
                 loss: LossSettings | None = None) -> None:
        init_single_process_env()
        self.cfg = cfg
        self.tc = cfg.train
        self.model_path = Path(model_path)
        self.home = Path(home) if home is not None else arbor_home()
        self.run_id = cfg.run.run_id or "default"
        self.ckpt_root = ckpt.run_checkpoint_root(cfg.checkpoint, cfg.run.run_id, self.home)
        self.loss = loss or grpo_loss_settings(self.tc)
        self.eps_low = self.tc.eps_clip_low
        self.eps_high = self.loss.eps_clip_high
        self.ds_config = deepspeed_config(
            zero_stage=self.tc.zero_stage, bf16=self.tc.bf16, grad_clip=self.tc.grad_clip,
            extra=merge(read_deepspeed_json(self.tc.deepspeed_config), self.tc.deepspeed),
        )
        model = load_model(
            self.model_path, bf16=self.tc.bf16, ds_config=self.ds_config,
            gradient_checkpointing=self.tc.gradient_checkpointing, lora=cfg.policy.lora, seed=cfg.run.seed,
            memory=MemoryBudget(self.tc.micro_batch_tokens, self.tc.memory_budget_gib, self.tc.memory_fraction,
                                reference_copy=self.loss.kl_coef > 0 and self.loss.kl_reference == "frozen"),
        )
        total_updates = max(1, cfg.run.steps) * self.tc.updates_per_batch
        self.engine = build_engine(
            model, ds_config=self.ds_config, lr=self.tc.lr, weight_decay=self.tc.weight_decay, betas=self.tc.betas,
            schedule=self.tc.lr_schedule, warmup_steps=int(self.tc.warmup_ratio * total_updates),
            total_steps=total_updates, temperature=scoring_temperature(cfg.rollout.temperature),
        )
        self.device = self.engine.device
        self.kl_coef, self.kl_reference = self.loss.kl_coef, self.loss.kl_reference
        self.ref_engine = self._reference_engine() if self.kl_coef > 0 and self.kl_reference == "frozen" else None
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.saver = CheckpointSaver(self.ckpt_root, cfg.checkpoint, rank=self.rank, world=self.world,
                                     zero_stage=self.tc.zero_stage, model_path=self.model_path)
        # the background save's pinned host buffers, allocated now rather than inside the first step's save
        # (seconds, bytes; CUDA under checkpoint.async_save: a CPU save keeps no pool)
        on_cuda = torch.device(self.device).type == "cuda"
        self.reserved = self.saver.reserve(self.engine) if cfg.checkpoint.async_save and on_cuda else (0.0, 0)
        self.packing = packing_mode(self.engine.module.lm)  # the reference is the same model
        if self.rank == 0:
            print(f"trainer: micro-batches {self.packing} ({self.engine.module.lm.config._attn_implementation} "
                  f"attention)", flush=True)
        self.policy_version = 0
        self.step = 0  # last trained step (0 = the start checkpoint)
        self.data_position: dict[str, Any] = {}
        self.last_timing: dict[str, float] = {}
        self.scored_tokens = 0  # real tokens this rank has put through ``logprobs`` (no-grad passes)
        # pi_old of a phase's first mini-batch from its own forward; False: the separate no-grad
        # pass over every trajectory, as before (kept for the bitwise test and bench/train.py's before/after)
        self.reuse_pi_old = True

    def _reference_engine(self) -> Any:
        """The frozen reference policy pi_ref of a KL term (RubricEM eq. 1): the start checkpoint, loaded once
        more (with ``policy.lora``: without adapters), never stepped. A DeepSpeed inference engine (no optimizer):
        ZeRO-3 partitions it like the policy, other stages keep a full copy per rank."""
        import deepspeed

        stage = 3 if self.tc.zero_stage == 3 else 0
        ds = deepspeed_config(zero_stage=stage, bf16=self.tc.bf16, grad_clip=0.0)
        model = load_model(self.model_path, bf16=self.tc.bf16, ds_config=ds, gradient_checkpointing=False)
        head = PolicyHead(model, scoring_temperature(self.cfg.rollout.temperature))
        register_head_weight(head, ds)
        for p in head.parameters():
            p.requires_grad_(False)
        engine, _, _, _ = deepspeed.initialize(model=head, config=ds)
        engine.eval()
        return engine

    # ------------------------------------------------------------------ the step
    def train_step(self, update: UpdateBatch, step: int) -> dict[str, float]:
        """One RL step on the controller's ``update`` (``tasks.training.update.policy_update``); returns the step's metrics
        (the controller's ``update.metrics`` first)."""
        if step <= self.step:
            raise ValueError(f"step {step}: already trained up to step {self.step}")
        batch = update.trajectories
        if len(update.versions_behind) != len(batch):
            raise ValueError(f"step {step}: {len(update.versions_behind)} version lags for {len(batch)} trajectories")
        for t, behind in zip(batch, update.versions_behind, strict=True):
            check_trajectory(t)
            if t.policy_version != self.policy_version - behind:
                raise AssertionError(
                    f"step {step}: trajectory {t.traj_id} was generated by policy version {t.policy_version}, "
                    f"the trainer is at version {self.policy_version} (weight sync missed?)"
                )
        tc = self.tc
        self.kl_coef = update.kl_coef  # a method may switch its KL term by phase (ARCO)
        metrics: dict[str, float] = dict(update.metrics)
        lengths = [len(t.response_ids) for t in batch]
        metrics["n_trajectories"] = float(len(batch))
        metrics["mean_response_tokens"] = float(sum(lengths) / max(1, len(lengths)))
        metrics["max_response_tokens"] = float(max(lengths, default=0))
        if not batch:  # the controller kept no group (DAPO): no update, but the version still advances with the step
            self.step = step
            self.policy_version += 1
            metrics.update(policy_version=float(self.policy_version), loss=0.0, grad_norm=0.0, updates=0.0)
            return metrics

        adv = update.advantages
        check_token_advantages(batch, adv, "the update batch")
        self.engine.train()  # Qwen3 has no dropout; train mode keeps gradient checkpointing active
        keys = ("loss", "tokens", "clip", "kl", "tis", "tis_clip", "ent", "ref_kl")
        sums = dict.fromkeys(keys, 0.0)
        grad_norms = []
        t_old = t_fwd = t_bwd = t_opt = 0.0
        n_tokens_total = old_pass_tokens = 0
        n_minis = 0
        phases = update.phase_indices()
        default_temperature = self.engine.module.temperature
        try:  # a failed update must not leave the head at a phase's temperature (the trainer service lives on)
            for p, members in enumerate(phases):
                # each phase is its own update: pi_old from the weights at its start, its own token-mean and steps,
                # and its own scoring temperature (the one its trajectories were sampled at)
                self._set_temperature(update.phase_temperature(members) or default_temperature)
                # mini-batches: a seeded permutation cut into updates_per_batch parts
                tag = "minibatch" if len(phases) == 1 else f"minibatch-phase{p}"
                g = torch.Generator().manual_seed(derive_seed(self.cfg.run.seed, step, tag) % (2**63))
                perm = [members[j] for j in torch.randperm(len(members), generator=g).tolist()]
                n_mb = min(tc.updates_per_batch, len(members))
                minis = [perm[k::n_mb] for k in range(n_mb)]
                n_minis += len(minis)

                # pi_old: the first mini-batch is trained from the weights pi_old names, so its forward's detached
                # log-probs are pi_old; a no-grad pass scores the later mini-batches' trajectories
                # before the first optimizer step. The separate pass for every trajectory: reuse_pi_old False.
                t0 = time.perf_counter()
                logp_old = [torch.zeros(0)] * len(batch)
                logp_ref: list[torch.Tensor] | None = None  # None: the KL term measures against pi_old
                scored = self.scored_tokens
                later = old_pass_members(members, minis[0], self.reuse_pi_old)
                if later:
                    for i, v in zip(later, self.logprobs([batch[i] for i in later]), strict=True):
                        logp_old[i] = v
                old_pass_tokens += self.scored_tokens - scored
                if self.ref_engine is not None:
                    logp_ref = [torch.zeros(0)] * len(batch)
                    sub = [batch[i] for i in members]
                    for i, v in zip(members, self.logprobs(sub, self.ref_engine), strict=True):
                        logp_ref[i] = v
                synchronize()
                t_old += time.perf_counter() - t0

                phase_tokens = 0.0
                for n_mini, mini in enumerate(minis):
                    n_loss_tokens = float(sum(sum(batch[i].loss_mask) for i in mini))
                    # the mini-batch's counts: every micro-batch on every rank divides by them, so the shares
                    # add up to its token-mean or its mean over samples (loss_agg; slime's reduction)
                    lens = [len(batch[i].prompt_ids) + len(batch[i].response_ids) for i in mini]
                    micro = self._rank_shards([[[mini[j] for j in row] for row in mb] for mb in self._pack(lens)])
                    for k, mb in enumerate(micro):
                        self.engine.set_gradient_accumulation_boundary(k == len(micro) - 1)
                        t0 = time.perf_counter()
                        out, n_tok = self._micro_loss(batch, mb, logp_old, adv, n_loss_tokens, logp_ref,
                                                      old_from_forward=n_mini == 0 and self.reuse_pi_old,
                                                      n_samples=float(len(mini)))
                        synchronize()
                        t1 = time.perf_counter()
                        self.engine.backward(out.loss, scale_wrt_gas=False)
                        synchronize()
                        t2 = time.perf_counter()
                        self.engine.step()
                        synchronize()
                        t3 = time.perf_counter()
                        t_fwd, t_bwd, t_opt = t_fwd + t1 - t0, t_bwd + t2 - t1, t_opt + t3 - t2
                        n_tokens_total += n_tok
                        phase_tokens += out.tokens
                        for key, v in zip(keys, (float(out.loss.detach()) / self.world, out.tokens, out.clip_sum,
                                                 out.approx_kl_sum, out.tis_sum, out.tis_clip_sum, out.entropy_sum,
                                                 out.ref_kl_sum),
                                          strict=True):
                            sums[key] += v
                    gn = self.engine.get_global_grad_norm()
                    grad_norms.append(float(gn) if gn is not None else float("nan"))
                if len(phases) > 1:
                    metrics[f"phase{p}_loss_tokens"] = phase_tokens
        finally:
            self._set_temperature(default_temperature)
        if self.world > 1:
            import deepspeed.comm as dist

            vec = torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=self.device)
            dist.all_reduce(vec)
            sums = dict(zip(keys, vec.tolist(), strict=True))
        n = max(1.0, sums["tokens"])
        metrics.update(
            loss=sums["loss"] / n_minis,
            clip_frac=sums["clip"] / n,
            approx_kl=sums["kl"] / n,
            ref_kl=sums["ref_kl"] / n if self.kl_coef else float("nan"),
            tis_mean=sums["tis"] / n,
            tis_clip_frac=sums["tis_clip"] / n,
            entropy=sums["ent"] / n if (tc.entropy_diagnostic or tc.entropy_coef) else float("nan"),
            grad_norm=sum(grad_norms) / len(grad_norms),
            lr=float(self.engine.get_lr()[0]),
            updates=float(n_minis),
            loss_tokens=sums["tokens"],
        )
        self.last_timing = dict(old_logprobs=t_old, forward=t_fwd, backward=t_bwd, optimizer=t_opt,
                                tokens=float(n_tokens_total), old_pass_tokens=float(old_pass_tokens))
        self.step = step
        self.policy_version += 1
        metrics["policy_version"] = float(self.policy_version)
        return metrics

    def _micro_loss(
        self, batch: list[Trajectory], rows: list[list[int]], logp_old: list[torch.Tensor], adv: list[torch.Tensor],
        n_loss_tokens: float, logp_ref: list[torch.Tensor] | None = None, old_from_forward: bool = False,
        n_samples: float | None = None,
    ) -> tuple[LossOut, int]:
        """One micro-batch's forward and loss. ``logp_ref`` None: the KL term measures against pi_old.
        ``old_from_forward``: the weights are still pi_old's, so pi_old is this forward's detached log-probs and ``logp_old`` is not read. ``n_loss_tokens`` / ``n_samples``: the mini-batch's loss
        tokens and samples, the denominators of ``loss_agg``'s token-mean / seq-mean-token-mean."""
        tc = self.tc
        mb = [i for row in rows for i in row]  # the loss positions follow this order whatever the layout
        m = self._micro([batch[i] for i in mb] if mb else [batch[0]], dummy=not mb,
                        advantages=[adv[i] for i in mb] if mb else None, rows=rows)
        n_pos = m.rows.shape[0]
        mode = "grad" if tc.entropy_coef != 0.0 else ("detached" if tc.entropy_diagnostic else "none")
        logp, ent = self.engine(m.ids, m.att, m.rows, m.cols, m.targets, entropy=mode, position_ids=m.pos)
        if mb and m.spans[-1][1] == n_pos and n_pos > 0 and float(m.mask.sum()) > 0:
            old = pi_old_at(logp, logp_old, mb, old_from_forward, self.device)
            ref = old if logp_ref is None else torch.cat([logp_ref[i] for i in mb]).to(self.device)
            a = m.adv
            seq_lengths = [b - s for s, b in m.spans]  # the loss positions of each sample, in order
        else:  # a padding micro-batch, or one without any loss token: forward/backward for the collectives only
            old = torch.zeros(n_pos, device=self.device)
            ref = old
            a = torch.zeros(n_pos, device=self.device)
            seq_lengths = [n_pos]  # all masked: a share of 0
        out = policy_loss(
            logp, old, m.rollout_lp, a, m.mask, eps_low=self.eps_low, eps_high=self.eps_high, tis_cap=tc.tis_cap,
            n_tokens=n_loss_tokens, agg=self.loss.loss_agg, seq_lengths=seq_lengths, n_seqs=n_samples,
            kl_coef=self.kl_coef, logp_ref=ref if self.kl_coef != 0.0 else None,
            entropy_coef=tc.entropy_coef, entropy=ent,
        )
        # DeepSpeed averages gradients over data-parallel ranks; the loss is a sum over the whole mini-batch.
        out.loss = out.loss * self.world
        return out, (m.tokens if mb else 0)

    # ------------------------------------------------------------------ the step's helpers
    @torch.no_grad()
    def logprobs(self, trajs: list[Trajectory], engine: Any = None) -> list[torch.Tensor]:
        """log pi(loss tokens) under the current weights (or ``engine``'s: the frozen reference), one float32 CPU
        tensor per trajectory (pi_old), in the order of the trajectory's loss-mask positions."""
        engine = self.engine if engine is None else engine
        out: list[torch.Tensor | None] = [None] * len(trajs)
        lengths = [len(t.prompt_ids) + len(t.response_ids) for t in trajs]
        for rows in self._rank_shards(self._pack(lengths)):
            mb = [i for row in rows for i in row]
            m = self._micro([trajs[i] for i in mb] if mb else [trajs[0]], dummy=not mb, rows=rows)
            lp, _ = engine(m.ids, m.att, m.rows, m.cols, m.targets, position_ids=m.pos)
            lp = lp.float().cpu()
            self.scored_tokens += m.tokens if mb else 0
            for i, (a, b) in zip(mb, m.spans, strict=False):
                out[i] = lp[a:b].clone()
        if self.world > 1:  # every rank needs every pi_old: gather the shards
            import deepspeed.comm as dist

            gathered: list[Any] = [None] * self.world
            dist.all_gather_object(gathered, [(i, v) for i, v in enumerate(out) if v is not None])
            for part in gathered:
                for i, v in part:
                    out[i] = v
        return [v if v is not None else torch.zeros(0) for v in out]

    def _micro(self, trajs: list[Trajectory], dummy: bool = False,
               advantages: list[torch.Tensor] | None = None, rows: list[list[int]] | None = None) -> Micro:
        """``rows``: the micro-batch's rows (``pack_micro_batches``), laid out as packed rows unless padded."""
        return make_micro([t.prompt_ids for t in trajs], [t.response_ids for t in trajs],
                          [t.loss_mask for t in trajs], [t.rollout_logprobs for t in trajs], dummy,
                          advantages, row_layout(rows, self.packing)).to(self.device)

    def _pack(self, lengths: list[int]) -> list[list[list[int]]]:
        """Micro-batches (rows of indices into ``lengths``) for this model's ``packing``."""
        return pack_micro_batches(lengths, self.tc.micro_batch_tokens, self.packing)

    def _rank_shards(self, micro: list[Any]) -> list[Any]:
        """This rank's micro-batches (round robin); ranks with fewer get empty ones, so collectives line up."""
        mine = micro[self.rank :: self.world]
        n = math.ceil(len(micro) / self.world)
        return mine + [[] for _ in range(n - len(mine))]

    def _set_temperature(self, temperature: float) -> None:
        """The temperature the policy (and the frozen reference) score tokens at, for one update phase."""
        for engine in (self.engine, self.ref_engine):
            if engine is not None:
                engine.module.temperature = float(temperature)

    @torch.no_grad()
    def full_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[B, L, V] logits of the current policy (tests, evaluation; gathers all parameters under ZeRO-3)."""
        import contextlib

        import deepspeed

        ctx = (deepspeed.zero.GatheredParameters(list(self.engine.module.parameters()))
               if self.tc.zero_stage == 3 else contextlib.nullcontext())
        with ctx:
            return self.engine.module.lm(input_ids=input_ids.to(self.device)).logits

    # ------------------------------------------------------------------ weights
    def state_dict_for_sync(self) -> dict[str, torch.Tensor]:
        """Full weights for the rollout engine under the plain HF names (with LoRA: the adapters merged in,
        ``ckpt.full_state_dict``; ZeRO-3: gathered, collective; complete on rank 0)."""
        return ckpt.full_state_dict(self.engine, self.tc.zero_stage)

    def export_hf(self, path: str | Path) -> Path:
        """HF safetensors checkpoint of the current weights, LoRA merged in (collective under ZeRO-3)."""
        out = ckpt.save_hf(self.engine, Path(path), self.tc.zero_stage, self.model_path, self.rank)
        barrier(self.world)
        return out

    # ------------------------------------------------------------------ checkpoints
    @property
    def save_timing(self) -> dict[str, float] | None:
        """The last save: wait_s (for the one in flight), save_s (the step's share), write_s (``CheckpointSaver``)."""
        return self.saver.timing

    def save_checkpoint(self, step: int | None = None, metrics: dict[str, float] | None = None, *,
                        wait: bool = True) -> Path:
        """Atomic checkpoint of ``step`` (default: the last trained step) then retention (every rank calls):
        ``ds/`` (exact resume), ``hf/`` (merged export), with LoRA ``adapter/`` (PEFT's format); ``tasks.training.saver``.

        ``wait=False`` (the step's save under ``checkpoint.async_save``): the state is copied to host
        memory and a background writer writes and commits it while the next step runs; the returned path exists once
        it committed. A save first waits for the one in flight (at most one); ``save_timing`` records that wait, the
        copy's time and the previous write's."""
        step = self.step if step is None else step
        state = dict(step=step, policy_version=self.policy_version, data_position=dict(self.data_position),
                     metrics=dict(metrics or {}), run_id=self.run_id, world_size=self.world)
        return self.saver.save(self.engine, step, state, wait=wait)

    def finish_save(self, abandon: bool = False) -> float:
        """Wait for the save in flight, or with ``abandon`` stop it uncommitted; returns the
        seconds waited. Several ranks: every rank's writer finished, a barrier, then rank 0 commits (the commit of
        a save of several ranks happens here: at the next save, a resume or the run's end)."""
        return self.saver.finish(abandon)

    def close(self) -> None:
        """The run's end: wait for the save in flight; under a stop (``arbor.runtime.stop``) abandon it instead, so the
        stop is not held up by a write (the previous checkpoint stays the latest; the resume replays the steps)."""
        from arbor.runtime import stop

        self.finish_save(abandon=stop.current() is not None)

    def maybe_save(self, step: int, metrics: dict[str, float] | None = None) -> Path | None:
        """Save when ``step`` is a multiple of ``checkpoint.every`` or the run's last step; in the background under
        ``checkpoint.async_save``."""
        due = ckpt.checkpoint_due(step, self.cfg.checkpoint.every, self.cfg.run.steps)
        return self.save_checkpoint(step, metrics, wait=not self.cfg.checkpoint.async_save) if due else None

    def load_latest(self) -> int | None:
        """Load the latest complete checkpoint (weights, optimizer, scheduler, RNG, version); its step or None.
        A save in flight is waited for first (it may become the latest).

        The caller then replays the training stage of each later step from that step's stored batch."""
        state = self.saver.load_latest(self.engine)
        if state is None:
            return None
        self.step = int(state["step"])
        self.policy_version = int(state["policy_version"])
        self.data_position = dict(state.get("data_position") or {})
        return self.step
