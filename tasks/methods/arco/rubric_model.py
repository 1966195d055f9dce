"""ARCO's rubric model mu on DeepSpeed: one backbone, a generation head and a score head.

mu is a copy of the policy's start checkpoint with LoRA on the attention projections (q_proj, v_proj; r = 8,
alpha = 32) and a score head: Linear(H, 512) - GELU - Linear(512, 128) - GELU - Linear(128, K) - tanh on the
masked mean of the last hidden state over [step prompt + criteria]. The generation head is the frozen LM head
reading the same LoRA-adapted trunk, so the score loss moves what mu writes too; a KL to mu_ref on the criteria
tokens anchors it. mu_ref is mu as the teacher warm-up left it: the LoRA weights copied into buffers
(``snapshot_reference``), so no second model is loaded.

    score / write      no grad, LoRA dropout off: greedy criteria per step, then K scores per step
    update_warmup      CE(criteria tokens) + mse_coef * MSE(K scores, projected teacher labels)       (mu's SFT)
    update_decompose   (1/N) sum_traj [w(R) (sum_t mean_k s_tk - R)^2 + beta sum_t KL_t(mu_ref || mu)]

Checkpoints mirror the policy's (``tasks.training.checkpoint``: atomic, retained, ``{root}/step_NNNNNN``) under the run's
checkpoint folder ``mu/``; resume loads the latest and replays the stored updates after it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from arbor.config import ArborConfig
from arbor.seeding import derive_seed
from arbor.tasks.methods.arco import equations as arco
from arbor.tasks.training import checkpoint as ckpt
from arbor.tasks.training import lora
from arbor.tasks.training.lora import LoRALinear

LORA_TARGETS = ("q_proj", "v_proj")
MU_SYSTEM = "You write the criteria that decide whether one step of a search agent helps answer the question."


# ---------------------------------------------------------------------------------------------- prompts
def step_messages(question: str, history: str, searches_left: int, action: str, k: int) -> list[dict[str, str]]:
    """mu's prompt for one step: the question, what came before the step (earlier turns and their results: the
    step's own result is not shown), the searches left before it, and the step itself."""
    user = (f"Question: {question.strip()}\nSo far:\n{history.strip() or '(nothing)'}\n"
            f"Searches left: {searches_left}\nStep:\n{action.strip()}\nWrite {k} criteria as JSON.")
    return [{"role": "system", "content": MU_SYSTEM}, {"role": "user", "content": user}]


def criteria_text(criteria: Sequence[str]) -> str:
    """The text mu learns to write for a step (the teacher's criteria during the warm-up)."""
    return json.dumps({"criteria": list(criteria)})


ELIDED = "\n[... middle of the step cut ...]\n"


def prompt_window(context: int, max_criteria_tokens: int) -> int:
    """mu's prompt budget when ``arco.max_prompt_tokens`` is unset: the model's context less the criteria it
    writes after the prompt (a Qwen3 trajectory of ~8k tokens then fits whole)."""
    return context - max_criteria_tokens


def _render(tokenizer: Any, question: str, history: str, searches_left: int, action: str, k: int) -> list[int]:
    text = tokenizer.apply_chat_template(step_messages(question, history, searches_left, action, k),
                                         tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def _keep_tail(tokenizer: Any, text: str, n: int) -> str:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return tokenizer.decode(ids[max(0, len(ids) - n):]) if n > 0 else ""


def _keep_ends(tokenizer: Any, text: str, n: int) -> str:
    """The first and last n // 2 tokens of ``text`` around ELIDED (the step's opening and its action)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= n:
        return text
    head = max(0, n // 2)
    return tokenizer.decode(ids[:head]) + ELIDED + tokenizer.decode(ids[len(ids) - (n - head):])


def encode_prompt(tokenizer: Any, question: str, history: str, searches_left: int, action: str, k: int,
                  max_tokens: int) -> list[int]:
    """Token ids of mu's step prompt (chat template, assistant turn opened), at most ``max_tokens``.

    What is cut to fit, in order: the oldest history, then the middle of the step (its opening and its end stay).
    The instructions and the question are never cut; if they alone do not fit the error names the setting.
    """
    ids = _render(tokenizer, question, history, searches_left, action, k)
    if len(ids) <= max_tokens:
        return ids
    fixed = len(_render(tokenizer, question, "", searches_left, "", k))
    room = max_tokens - fixed
    if room < 16:
        raise ValueError(f"arco.max_prompt_tokens={max_tokens}: mu's instructions and the question alone take "
                         f"{fixed} tokens; raise it (or leave it unset: the model's context)")
    for _ in range(8):
        n_action = len(tokenizer.encode(action, add_special_tokens=False))
        if n_action >= room:
            step, past = _keep_ends(tokenizer, action, room - 16), ""
        else:
            step, past = action, _keep_tail(tokenizer, history, room - n_action)
        ids = _render(tokenizer, question, past, searches_left, step, k)
        if len(ids) <= max_tokens:
            return ids
        room -= len(ids) - max_tokens + 4  # pieces tokenise a little differently alone; shrink and retry
    raise ValueError(f"arco.max_prompt_tokens={max_tokens}: could not fit mu's step prompt (got {len(ids)} tokens)")


# ---------------------------------------------------------------------------------------------- the network
class RefLoRALinear(LoRALinear):
    """``tasks.training.lora.LoRALinear`` plus mu_ref's frozen copy of (A, B) in buffers; ``use_ref`` computes with it."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float,
                 generator: torch.Generator | None = None) -> None:
        super().__init__(base, r, alpha, dropout, generator=generator)
        self.register_buffer("ref_A", self.lora_A.detach().clone())
        self.register_buffer("ref_B", self.lora_B.detach().clone())
        self.use_ref = False

    def factors(self) -> tuple[Tensor, Tensor]:
        return (self.ref_A, self.ref_B) if self.use_ref else (self.lora_A, self.lora_B)


def add_lora(lm: nn.Module, r: int, alpha: float, dropout: float, targets: Sequence[str] = LORA_TARGETS) -> int:
    """mu's adapters (``tasks.training.lora.add_lora`` with reference buffers) on ``targets``; the number wrapped."""
    return lora.add_lora(lm, r, alpha, dropout, targets, layer=RefLoRALinear)


class ScoreHead(nn.Module):
    """H -> 512 -> 128 -> K with GELU, then tanh: K criterion scores in [-1, 1] (kept in float32)."""

    def __init__(self, hidden: int, k: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(hidden, 512), nn.GELU(), nn.Linear(512, 128), nn.GELU(),
                                 nn.Linear(128, k), nn.Tanh())

    def forward(self, pooled: Tensor) -> Tensor:
        return self.net(pooled.float())


class RubricModel(nn.Module):
    """mu as DeepSpeed sees it: forward gives the K scores of each row (masked mean pooling over the whole row)
    and the log-probabilities of the vocabulary at the selected (row, position) pairs (the criteria tokens)."""

    def __init__(self, lm: nn.Module, k: int, r: int, alpha: float, dropout: float) -> None:
        super().__init__()
        self.lm = lm
        add_lora(lm, r, alpha, dropout)
        self.head = ScoreHead(lm.config.hidden_size, k)

    def set_reference(self, on: bool) -> None:
        for m in self.modules():
            if isinstance(m, RefLoRALinear):
                m.use_ref = on

    def forward(self, input_ids: Tensor, attention_mask: Tensor, rows: Tensor, cols: Tensor,
                ref: bool = False) -> tuple[Tensor, Tensor]:
        self.set_reference(ref)
        try:
            hidden = self.lm.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        finally:
            self.set_reference(False)
        m = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)
        scores = self.head(pooled)
        logp = torch.log_softmax(self.lm.lm_head(hidden[rows, cols]).float(), dim=-1)
        return scores, logp


# ---------------------------------------------------------------------------------------------- examples
@dataclass
class MuExample:
    """One step as mu reads it: its prompt, the criteria after it (generated, static, or the teacher's), and
    for the warm-up the projected teacher labels of its K criteria."""

    prompt_ids: list[int]
    criteria_ids: list[int]
    traj: int = 0  # index of its trajectory in the update batch
    labels: list[float] | None = None

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.criteria_ids)


def batch_tensors(examples: Sequence[MuExample], pad_id: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Right-padded [prompt + criteria] rows and the positions predicting each criteria token: (ids, mask, rows,
    cols, targets)."""
    L = max(e.length for e in examples)
    ids = torch.full((len(examples), L), pad_id, dtype=torch.long)
    att = torch.zeros((len(examples), L), dtype=torch.long)
    rows: list[int] = []
    cols: list[int] = []
    tgts: list[int] = []
    for b, e in enumerate(examples):
        seq = e.prompt_ids + e.criteria_ids
        ids[b, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        att[b, :len(seq)] = 1
        for j, t in enumerate(e.criteria_ids):
            rows.append(b)
            cols.append(len(e.prompt_ids) - 1 + j)
            tgts.append(t)
    if not rows:  # no criteria tokens (criteria=none): one masked placeholder position
        rows, cols, tgts = [0], [0], [int(ids[0, 0])]
    return ids, att, torch.tensor(rows), torch.tensor(cols), torch.tensor(tgts)


def pack(examples: Sequence[MuExample], max_tokens: int) -> list[list[int]]:
    """Micro-batches of example indices whose padded size stays within ``max_tokens`` (in order)."""
    out: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i, e in enumerate(examples):
        longest_new = max(longest, e.length)
        if cur and longest_new * (len(cur) + 1) > max_tokens:
            out.append(cur)
            cur, longest_new = [], e.length
        cur.append(i)
        longest = longest_new
    if cur:
        out.append(cur)
    return out


# ---------------------------------------------------------------------------------------------- the trainer
class RubricModelTrainer:
    """mu on a DeepSpeed engine: scoring, greedy criteria, its two losses, reference snapshot, checkpoints."""

    def __init__(self, cfg: ArborConfig, start: Path, ckpt_root: Path) -> None:
        from transformers import AutoModelForCausalLM

        from arbor.tasks.env.policy import load_tokenizer
        from arbor.tasks.training.engine import (
            deepspeed_config,
            deepspeed_module,
            init_single_process_env,
        )

        init_single_process_env()
        self.cfg = cfg
        self.ac = cfg.arco
        self.start = Path(start)
        self.ckpt_root = Path(ckpt_root)
        self.tokenizer = load_tokenizer(self.start, cfg.policy)  # the policy's chat template settings
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.eos_ids = {t for t in (self.tokenizer.eos_token_id, self.tokenizer.pad_token_id) if t is not None}
        lm = AutoModelForCausalLM.from_pretrained(self.start, dtype=torch.float32)
        lm.config.use_cache = True
        context = int(getattr(lm.config, "max_position_embeddings", 0) or self.tokenizer.model_max_length)
        self.prompt_tokens = self.ac.max_prompt_tokens or prompt_window(context, self.ac.max_criteria_tokens)
        self.k_out = 1 if self.ac.criteria == "none" else self.ac.k
        torch.manual_seed(derive_seed(cfg.run.seed, "mu-init") % (2**63))
        model = RubricModel(lm, self.k_out, self.ac.lora_rank, self.ac.lora_alpha, self.ac.lora_dropout)
        adapters = [p for n, p in model.named_parameters() if p.requires_grad and "lora_" in n]
        head = list(model.head.parameters())
        opt = torch.optim.AdamW([{"params": adapters, "lr": self.ac.lr}, {"params": head, "lr": self.ac.head_lr}],
                                weight_decay=self.ac.weight_decay)
        ds = deepspeed_config(zero_stage=0, bf16=False, grad_clip=self.ac.grad_clip)
        self.engine, self.optimizer, _, _ = deepspeed_module().initialize(model=model, optimizer=opt, config=ds)
        self.version = 0  # mu updates applied (one per RL step)
        self.reference_taken = False

    @property
    def model(self) -> RubricModel:
        return self.engine.module

    def _tensors(self, examples: Sequence[MuExample]) -> tuple[Tensor, ...]:
        return tuple(x.to(self.engine.device) for x in batch_tensors(examples, self.pad_id))

    # ------------------------------------------------------------------ reading
    @torch.no_grad()
    def write_criteria(self, prompts: Sequence[list[int]]) -> list[list[int]]:
        """Greedy criteria for each step prompt (criteria=generate); EOS ends one (and is kept)."""
        from arbor.tasks.env.agent import GenRequest
        from arbor.tasks.env.decoding import generate_turns

        self.model.eval()
        out: list[list[int]] = []
        rows = self.cfg.rollout.max_batch_rows
        for i in range(0, len(prompts), rows):
            reqs = [GenRequest(list(p), self.ac.max_criteria_tokens, 0) for p in prompts[i:i + rows]]
            gens = generate_turns(self.model.lm, reqs, temperature=0.0, top_p=1.0, decode=lambda ids: "",
                                  stop_strings=[], eos_ids=self.eos_ids, pad_id=self.pad_id)
            out += [list(g.token_ids) for g in gens]
        return out

    @torch.no_grad()
    def score(self, examples: Sequence[MuExample]) -> list[list[float]]:
        """K scores per step (eval mode: no LoRA dropout)."""
        self.model.eval()
        out: list[list[float]] = [[] for _ in examples]
        for mb in pack(examples, self.cfg.train.micro_batch_tokens):
            ids, att, r, c, _ = self._tensors([examples[i] for i in mb])
            scores, _ = self.model(ids, att, r, c)
            for i, s in zip(mb, scores.tolist(), strict=True):
                out[i] = [float(v) for v in s]
        return out

    # ------------------------------------------------------------------ learning
    def _set_lr(self, lr: float, head_lr: float) -> None:
        groups = self.optimizer.param_groups
        groups[0]["lr"], groups[1]["lr"] = lr, head_lr

    def update_warmup(self, examples: Sequence[MuExample], step: int) -> dict[str, float]:
        """mu's SFT on the teacher: CE on the criteria tokens (mean) + mse_coef * MSE on the K labels, one
        optimizer update per pass over ``examples`` (``warmup_updates`` passes)."""
        ac = self.ac
        self._set_lr(ac.warmup_lr, ac.warmup_head_lr)
        n_tok = max(1, sum(len(e.criteria_ids) for e in examples))
        sums = {"loss": 0.0, "lm": 0.0, "mse": 0.0}
        for u in range(ac.warmup_updates):
            torch.manual_seed(derive_seed(self.cfg.run.seed, step, "mu-warmup", u) % (2**63))
            self.model.train()
            micro = pack(examples, self.cfg.train.micro_batch_tokens)
            for j, mb in enumerate(micro):
                self.engine.set_gradient_accumulation_boundary(j == len(micro) - 1)
                exs = [examples[i] for i in mb]
                ids, att, r, c, tgt = self._tensors(exs)
                scores, logp = self.engine(ids, att, r, c)
                has_tokens = any(e.criteria_ids for e in exs)
                lm = -logp.gather(-1, tgt[:, None]).sum() / n_tok if has_tokens else scores.sum() * 0.0
                labels = torch.tensor([e.labels if self.k_out > 1 else [sum(e.labels or [0.0]) /
                                                                         max(1, len(e.labels or []))]
                                       for e in exs], dtype=torch.float32, device=scores.device)
                mse = ((scores - labels) ** 2).mean(-1).sum() / len(examples)
                loss = lm + ac.warmup_mse_coef * mse
                self.engine.backward(loss, scale_wrt_gas=False)
                self.engine.step()
                if u == ac.warmup_updates - 1:
                    sums["loss"] += float(loss.detach())
                    sums["lm"] += float(lm.detach())
                    sums["mse"] += float(mse.detach())
        self.version += 1
        return sums

    def update_decompose(self, examples: Sequence[MuExample], outcomes: Sequence[float],
                         step: int) -> dict[str, float]:
        """The decomposition loss with class-balance weights and the KL to mu_ref on the criteria tokens
        (``updates`` optimizer updates on the step's trajectories; a micro-batch holds whole trajectories)."""
        ac = self.ac
        self._set_lr(ac.lr, ac.head_lr)
        weights = arco.class_balance_weights(outcomes, ac.positive_threshold)
        N = len(outcomes)
        by_traj: dict[int, list[int]] = {}
        for i, e in enumerate(examples):
            by_traj.setdefault(e.traj, []).append(i)
        trajs = sorted(by_traj)
        lengths = [max(examples[i].length for i in by_traj[t]) * len(by_traj[t]) for t in trajs]
        micro = [[i for g in mb for i in by_traj[trajs[g]]] for mb in pack_sizes(lengths, self.cfg.train.micro_batch_tokens)]
        sums = {"loss": 0.0, "decomposition": 0.0, "kl": 0.0}
        for u in range(ac.updates):
            torch.manual_seed(derive_seed(self.cfg.run.seed, step, "mu-update", u) % (2**63))
            self.model.train()
            for j, mb in enumerate(micro):
                self.engine.set_gradient_accumulation_boundary(j == len(micro) - 1)
                exs = [examples[i] for i in mb]
                ids, att, r, c, _ = self._tensors(exs)
                scores, logp = self.engine(ids, att, r, c)
                kl = scores.sum() * 0.0
                has = torch.tensor([bool(e.criteria_ids) for e in exs])
                if ac.kl_coef > 0 and bool(has.any()):
                    with torch.no_grad():
                        _, logp_ref = self.model(ids, att, r, c, ref=True)
                    per_tok = (logp_ref.exp() * (logp_ref - logp)).sum(-1)  # KL(mu_ref || mu) per criteria token
                    per_row = torch.zeros(len(exs), device=per_tok.device).index_add(0, r, per_tok)
                    counts = torch.bincount(r, minlength=len(exs)).clamp(min=1)
                    kl = (per_row / counts)[has.to(per_row.device)].sum()  # mean over a step's tokens, summed over steps
                local = sorted({e.traj for e in exs})
                dev = scores.device
                pos = torch.tensor([local.index(e.traj) for e in exs], device=dev)
                totals = torch.zeros(len(local), device=dev).index_add(0, pos, scores.mean(-1))  # sum_t s̄_t
                R = torch.tensor([outcomes[t] for t in local], dtype=torch.float32, device=dev)
                w = torch.tensor([weights[t] for t in local], dtype=torch.float32, device=dev)
                dec = (w * (totals - R) ** 2).sum()
                loss = (dec + ac.kl_coef * kl) / N
                self.engine.backward(loss, scale_wrt_gas=False)
                self.engine.step()
                if u == ac.updates - 1:
                    sums["loss"] += float(loss.detach())
                    sums["decomposition"] += float(dec.detach()) / N
                    sums["kl"] += float(kl.detach()) / N
        self.version += 1
        return sums

    def snapshot_reference(self) -> None:
        """mu_ref := mu now (the end of the warm-up): the LoRA weights are copied into the reference buffers."""
        with torch.no_grad():
            for m in self.model.modules():
                if isinstance(m, RefLoRALinear):
                    m.ref_A.copy_(m.lora_A)
                    m.ref_B.copy_(m.lora_B)
        self.reference_taken = True

    # ------------------------------------------------------------------ checkpoints
    def save(self, step: int, keep_last: int, metrics: dict[str, float] | None = None) -> Path:
        """Atomic checkpoint of mu after ``step``'s update (DeepSpeed state: LoRA, head, reference buffers,
        optimizer), then retention."""
        tmp = ckpt.begin(self.ckpt_root, step)
        self.engine.save_checkpoint(str(tmp), tag="ds", save_latest=False)
        state = {"step": step, "version": self.version, "reference_taken": self.reference_taken,
                 "metrics": metrics or {}}
        final = ckpt.commit(tmp, step, state)
        ckpt.apply_retention(self.ckpt_root, keep_last, False, "")
        return final

    def load_latest(self, upto: int | None = None) -> int:
        """Load the latest complete checkpoint (at most ``upto``); its step, 0 when there is none."""
        steps = [s for s in ckpt.complete_steps(self.ckpt_root) if upto is None or s <= upto]
        if not steps:
            return 0
        path = ckpt.step_dir(self.ckpt_root, steps[-1])
        load_path, _ = self.engine.load_checkpoint(str(path), tag="ds", load_optimizer_states=True,
                                                   load_lr_scheduler_states=False)
        if load_path is None:
            raise RuntimeError(f"{path}/ds: DeepSpeed could not load mu's checkpoint")
        state = ckpt.read_state(path)
        self.version = int(state["version"])
        self.reference_taken = bool(state["reference_taken"])
        return int(state["step"])


def pack_sizes(sizes: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Consecutive runs of items (whole trajectories) whose summed padded sizes stay within ``max_tokens``."""
    out: list[list[int]] = []
    cur: list[int] = []
    total = 0
    for i, n in enumerate(sizes):
        if cur and total + n > max_tokens:
            out.append(cur)
            cur, total = [], 0
        cur.append(i)
        total += n
    if cur:
        out.append(cur)
    return out
