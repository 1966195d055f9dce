"""Training-step benchmark: DeepSpeed trainer vs a plain torch loop on the same model and batch.

Prints the step time split (pi_old pass / forward / backward / optimizer / checkpoint) and tokens/s of both, and
their ratio (DeepSpeed overhead). ``--gpu``: a ~0.6B-parameter Qwen3-architecture model in bf16 on one GPU, with
MFU against the bf16 matmul peak measured in the same run.

    python bench/train.py            # CPU, tiny model (~5M parameters)
    python bench/train.py --gpu      # one GPU, ~0.6B parameters
    python bench/train.py --model smollm2 [--lora both|off|on] [--steps 2] [--threads N]
                          [--micro-batch-tokens N] [--sequential full|lora|both] [--profile]

``--model`` (``smollm2``, a GGUF file or an HF directory; loaded through ``tasks.env.policy.resolve_model``, converted
once into ``bench/out/models-home``): ``Trainer.train_step`` with the smol-world profile (ZeRO-2, float32, its LoRA
settings, scoring temperature, entropy diagnostic) on a smol-world-sized batch -- 4 prompts x K 4 = 16
trajectories, ~250 prompt tokens, 100-150 response tokens each of which a ~50-token search-result block has loss
mask 0 -- against the bare-PyTorch step on the same batch: pi_old pass (no grad), forward, backward, clip,
``torch.optim.AdamW`` over the trainable parameters, with the same loss-position head at the same temperature and
the same token-packed micro-batches. Full fine-tuning, and LoRA when ``tasks/training/lora.py`` exists (reference: the same
LoRA-wrapped model, AdamW over the adapters). Tokens/s counts the real (unpadded) tokens of the batch over the wall
time of the whole ``train_step`` call; one warm-up step (one group) per side, then steps in turn (the first side
alternating), each after gc + ``malloc_trim`` so both start from the same heap, fastest kept; CPU and system time
and the peak RSS of each step are printed too.

Memory: the profile packs the 16 trajectories into one micro-batch (``train.micro_batch_tokens`` 16384), whose
activations take ~14 GiB on CPU (peak RSS ~16 GiB); ``--micro-batch-tokens 800`` (two sequences a micro-batch) runs
both sides in ~6 GiB, and ``--sequential full`` keeps only one full-fine-tuning model (and its AdamW state) resident.
On a shared two-core machine pass ``--threads 1``: two processes with two OpenMP threads each on two cores slow each
other down by an order of magnitude.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from arbor.config import load_config  # noqa: E402
from arbor.tasks.training.engine import synchronize  # noqa: E402
from arbor.tasks.training.head import PolicyHead  # noqa: E402
from arbor.tasks.training.losses import group_advantages, policy_loss  # noqa: E402
from arbor.tasks.training.packing import make_micro, pack_micro_batches, packing_mode  # noqa: E402
from arbor.tasks.training.train import Trainer  # noqa: E402
from arbor.tasks.training.update import policy_update  # noqa: E402
from arbor.types import Trajectory  # noqa: E402

TINY = dict(vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, tie_word_embeddings=True)
QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True)


def make_batch(vocab: int, groups: int, k: int, prompt: int, response: int, version: int) -> list[Trajectory]:
    g = torch.Generator().manual_seed(version)
    out = []
    for grp in range(groups):
        p = torch.randint(10, vocab, (prompt,), generator=g).tolist()
        for s in range(k):
            mask = [1] * response
            mask[response // 3 : response // 3 + response // 6] = [0] * (response // 6)  # a result block
            out.append(Trajectory(
                run_id="bench", step=version + 1, group=grp, sample=s, question_id=str(grp), question="?", golds=[],
                prompt_ids=p, response_ids=torch.randint(10, vocab, (response,), generator=g).tolist(),
                loss_mask=mask, rollout_logprobs=[-9.0 if m else 0.0 for m in mask], base_reward=float(s % 2),
                policy_version=version))
    return out


class TorchLoop:
    """The same step (pi_old pass, the trainer's token-packed micro-batches, policy loss, clip, AdamW) in plain
    torch."""

    def __init__(self, model_dir: Path, batch: list[Trajectory], device: str, bf16: bool,
                 micro_batch_tokens: int) -> None:
        dtype = torch.bfloat16 if bf16 else torch.float32
        lm = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
        lm.config.use_cache = False
        if device == "cuda":
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model = PolicyHead(lm)  # the same loss-position head the trainer uses, without DeepSpeed
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-6, weight_decay=0.01)
        adv = group_advantages([t.base_reward for t in batch], [t.group for t in batch])
        # the trainer's token-packed micro-batches (one [B, L] batch of 65k tokens does not fit a GPU),
        # packed rows where the attention allows
        packing = packing_mode(lm)
        self.micros = []
        for rows in pack_micro_batches([len(t.prompt_ids) + len(t.response_ids) for t in batch], micro_batch_tokens,
                                       packing):
            mb = [i for row in rows for i in row]
            ts = [batch[i] for i in mb]
            m = make_micro([t.prompt_ids for t in ts], [t.response_ids for t in ts], [t.loss_mask for t in ts],
                           [t.rollout_logprobs for t in ts],
                           layout=None if packing == "padded" else [len(r) for r in rows]).to(device)
            a = torch.cat([adv[i].expand(e - s) for i, (s, e) in zip(mb, m.spans, strict=True)]).to(device)
            self.micros.append((m, a))
        self.n_loss = float(sum(float(m.mask.sum()) for m, _ in self.micros))
        self.tokens = sum(m.tokens for m, _ in self.micros)

    def step(self) -> float:
        """One step; its wall time in seconds."""
        synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            olds = [self.model(m.ids, m.att, m.rows, m.cols, m.targets, position_ids=m.pos)[0]
                    for m, _ in self.micros]
        for (m, a), old in zip(self.micros, olds, strict=True):
            logp, _ = self.model(m.ids, m.att, m.rows, m.cols, m.targets, position_ids=m.pos)
            out = policy_loss(logp, old, m.rollout_lp, a, m.mask, n_tokens=self.n_loss)
            out.loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        synchronize()
        return time.perf_counter() - t0


def make_world_batch(vocab: int, groups: int, k: int, version: int, prompt: int = 250,
                     response: tuple[int, int] = (100, 150), result: int = 50) -> list[Trajectory]:
    """A smol-world-sized batch: per group a prompt of ``prompt`` +- 10 tokens, per trajectory a response of
    ``response`` tokens (uniform) holding one ``result``-token search-result block (loss mask 0) after the first
    turn, as in a one-search rollout of the profile (top_k 1, 200 characters of passage). The lengths are the same
    for every ``version``; the token ids are drawn per version."""
    shape = torch.Generator().manual_seed(1000)  # the same lengths every step (and for both sides)
    g = torch.Generator().manual_seed(1000 + version)
    out = []
    for grp in range(groups):
        n_p = prompt + int(torch.randint(-10, 11, (1,), generator=shape))
        p = torch.randint(10, vocab, (n_p,), generator=g).tolist()
        for s in range(k):
            n_r = int(torch.randint(response[0], response[1] + 1, (1,), generator=shape))
            first = int(torch.randint(20, 40, (1,), generator=shape))  # the first turn, ending in </search>
            mask = [1] * n_r
            mask[first:first + result] = [0] * result
            out.append(Trajectory(
                run_id="bench", step=version + 1, group=grp, sample=s, question_id=str(grp), question="?", golds=[],
                prompt_ids=p, response_ids=torch.randint(10, vocab, (n_r,), generator=g).tolist(),
                loss_mask=mask, rollout_logprobs=[-2.0 if m else 0.0 for m in mask], base_reward=float(s % 2),
                policy_version=version))
    return out


class BareLoop:
    """The bare-PyTorch reference of one arbor step on the real model: the same HF model (LoRA-wrapped like the
    trainer's when ``lora`` is enabled), the same loss-position head at the same temperature, the same token-packed
    micro-batches (``pack_micro_batches``); pi_old pass (no grad), forward + policy loss, backward (accumulated over
    the micro-batches), clip + AdamW (the optimizer and settings the trainer hands DeepSpeed) over the trainable
    parameters. Times each phase like ``Trainer.last_timing``."""

    def __init__(self, model_dir: Path, cfg) -> None:
        from transformers import AutoModelForCausalLM

        from arbor.tasks.training.head import scoring_temperature

        lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        lm.config.use_cache = False
        if cfg.policy.lora.enabled:
            from arbor.tasks.training.lora import add_lora

            lo = cfg.policy.lora
            add_lora(lm, lo.r, lo.alpha, lo.dropout, lo.targets, generator=torch.Generator().manual_seed(0))
        self.model = PolicyHead(lm, scoring_temperature(cfg.rollout.temperature)).train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        tc = cfg.train
        self.opt = torch.optim.AdamW(self.params, lr=tc.lr, weight_decay=tc.weight_decay, betas=tc.betas)
        self.clip = tc.grad_clip
        self.micro_batch_tokens = tc.micro_batch_tokens
        self.last_timing: dict[str, float] = {}

    def step(self, batch: list[Trajectory]) -> float:
        """One step on ``batch``; its wall time in seconds (phases in ``last_timing``, ``tokens`` the real ones)."""
        t0 = time.perf_counter()
        adv = group_advantages([t.base_reward for t in batch], [t.group for t in batch])
        micros = []
        packing = packing_mode(self.model.lm)
        for rows in pack_micro_batches([len(t.prompt_ids) + len(t.response_ids) for t in batch],
                                       self.micro_batch_tokens, packing):
            mb = [i for row in rows for i in row]
            trajs = [batch[i] for i in mb]
            m = make_micro([t.prompt_ids for t in trajs], [t.response_ids for t in trajs],
                           [t.loss_mask for t in trajs], [t.rollout_logprobs for t in trajs],
                           layout=None if packing == "padded" else [len(r) for r in rows])
            micros.append((m, torch.cat([adv[i].expand(b - a) for i, (a, b) in zip(mb, m.spans, strict=True)])))
        n_loss = float(sum(float(m.mask.sum()) for m, _ in micros))
        with torch.no_grad():
            olds = [self.model(m.ids, m.att, m.rows, m.cols, m.targets, position_ids=m.pos)[0] for m, _ in micros]
        t1 = time.perf_counter()
        t_fwd = t_bwd = 0.0
        for (m, a), old in zip(micros, olds, strict=True):
            ta = time.perf_counter()
            logp, _ = self.model(m.ids, m.att, m.rows, m.cols, m.targets, position_ids=m.pos)
            out = policy_loss(logp, old, m.rollout_lp, a, m.mask, n_tokens=n_loss)
            tb = time.perf_counter()
            out.loss.backward()
            tc = time.perf_counter()
            t_fwd, t_bwd = t_fwd + tb - ta, t_bwd + tc - tb
        t3 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        self.last_timing = dict(old_logprobs=t1 - t0, forward=t_fwd, backward=t_bwd, optimizer=t4 - t3,
                                tokens=float(sum(m.tokens for m, _ in micros)), micro_batches=float(len(micros)))
        return t4 - t0


PHASES = ("old_logprobs", "forward", "backward", "optimizer")


class PeakRSS:
    """The process's peak resident memory while a block runs (sampled every 20 ms by a thread), in GiB."""

    def __enter__(self) -> PeakRSS:
        import threading

        self.peak, self._stop = rss_gib(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_gib())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_gib())


def rss_gib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def release_memory() -> None:
    """Collect garbage and hand the allocator's free memory back to the OS (glibc ``malloc_trim``), so that each
    side starts its step from the same heap state and the two sides' peaks do not stack."""
    import ctypes

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def timed_cpu(fn, *args) -> tuple[float, float, float, float]:
    """(wall seconds, process CPU seconds, of which system, peak RSS GiB) of ``fn(*args)``, after
    ``release_memory``. CPU time is what the step cost our threads (less sensitive than wall time to other
    processes on a shared machine); system time is mostly page faults of fresh activation memory."""
    release_memory()
    r0, t0 = os.times(), time.perf_counter()
    with PeakRSS() as mem:
        fn(*args)
    r1 = os.times()
    sys_s = r1.system - r0.system
    return time.perf_counter() - t0, r1.user - r0.user + sys_s, sys_s, mem.peak


def bench_model_mode(model_dir: Path, lora: bool, steps: int, home: Path, micro_batch_tokens: int | None,
                     profile_dir: Path | None, sequential: bool = False) -> dict:
    """Arbor / bare steps on the real model (a warm-up step of one group each, then ``steps`` on the full batch);
    the fastest of each side by wall time. Interleaved, the side that goes first alternating; ``sequential``: all
    of arbor's steps, then (its trainer freed) all of the bare loop's, so only one model is resident (memory)."""
    import json

    from arbor.tasks.env.policy import n_parameters

    mode = "LoRA" if lora else "full"
    overrides = {"run.run_id": f"bench-{mode}", "policy.lora.enabled": lora,
                 "checkpoint.dir": str(home / "checkpoints")}
    if micro_batch_tokens:
        overrides["train.micro_batch_tokens"] = micro_batch_tokens
    cfg = load_config("smol-world", overrides)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    info: dict = {}

    def build(name: str):
        t0 = time.perf_counter()
        if name == "arbor":
            obj = Trainer(cfg, model_dir, home)
            info["init"] = time.perf_counter() - t0
            return obj, lambda batch, step: obj.train_step(policy_update(batch, step, cfg.train, cfg.run.overlap), step)
        obj = BareLoop(model_dir, cfg)
        info["params"], info["trainable"] = n_parameters(obj.model), sum(p.numel() for p in obj.params)
        return obj, lambda batch, step: obj.step(batch)

    def batch_of(step: int) -> list[Trajectory]:  # the trainer is at policy version step - 1
        return make_world_batch(vocab, 1 if step == 1 else cfg.rollout.batch_size, cfg.rollout.k, step - 1)

    def report(step: int, res: dict, first: str) -> None:
        print(f"  {mode} step {step}{' (warm-up, 1 group)' if step == 1 else ''}"
              f"{', ' + first + ' first' if first else ''}: "
              + " | ".join(f"{n} {w:5.1f} s wall {c:5.1f} s cpu ({sy:4.1f} sys), peak {pk:4.1f} GiB: "
                           + ", ".join(f"{k} {t[k]:.2f}" for k in PHASES)
                           for n, (w, c, sy, pk, t) in res.items())
              + f"; load {os.getloadavg()[0]:.1f}, {torch.get_num_threads()} threads", flush=True)

    best: dict[str, tuple] = {}

    def keep(step: int, name: str, r: tuple) -> None:
        if step > 1 and (name not in best or r[0] < best[name][0]):
            best[name] = r

    names = ("arbor", "bare")
    if sequential:
        for name in names:
            obj, fn = build(name)
            for step in range(1, steps + 2):
                wall, cpu, sys_s, peak = timed_cpu(fn, batch_of(step), step)
                res = {name: (wall, cpu, sys_s, peak, dict(obj.last_timing))}
                report(step, res, "")
                keep(step, name, res[name])
            if profile_dir is not None:
                profile_side(name, fn, batch_of(steps + 2), steps + 2, profile_dir / f"train-{mode.lower()}-{name}")
            del obj, fn
            release_memory()
    else:
        sides = {name: build(name) for name in names}
        for step in range(1, steps + 2):
            batch = batch_of(step)
            res = {}
            for name in (names if step % 2 == 0 else names[::-1]):
                obj, fn = sides[name]
                wall, cpu, sys_s, peak = timed_cpu(fn, batch, step)
                res[name] = (wall, cpu, sys_s, peak, dict(obj.last_timing))
            report(step, res, "arbor" if step % 2 == 0 else "bare")
            for name, r in res.items():
                keep(step, name, r)
        if profile_dir is not None:
            for name in names:
                profile_side(name, sides[name][1], batch_of(steps + 2), steps + 2,
                             profile_dir / f"train-{mode.lower()}-{name}")
        del sides
        release_memory()
    assert best["arbor"][4]["tokens"] == best["bare"][4]["tokens"], "the two sides trained different tokens"
    batch = batch_of(2)
    lengths = [len(t.prompt_ids) + len(t.response_ids) for t in batch]
    return dict(lora=lora, best=best, tokens=best["arbor"][4]["tokens"], init=info["init"], params=info["params"],
                trainable=info["trainable"], seqs=len(batch), max_len=max(lengths),
                micro=int(best["bare"][4]["micro_batches"]), micro_batch_tokens=cfg.train.micro_batch_tokens,
                loss_tokens=sum(sum(t.loss_mask) for t in batch),
                masked=sum(len(t.loss_mask) - sum(t.loss_mask) for t in batch), sequential=sequential)


def profile_side(name: str, fn, batch: list[Trajectory], step: int, out: Path) -> None:
    """One more step of one side under ``torch.profiler`` (CPU): the top operators by self time, to ``out``.txt.
    (For Python-level attribution, e.g. DeepSpeed's gradient hooks, run the bench under ``py-spy record``.)"""
    from torch.profiler import ProfilerActivity, profile

    out.parent.mkdir(parents=True, exist_ok=True)
    release_memory()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(batch, step)
    Path(f"{out}.txt").write_text(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
    print(f"  profile of one {name} step: {out}.txt")


def model_main(args: argparse.Namespace) -> int:
    """``--model``: arbor's Trainer.train_step vs the bare-PyTorch step on the real model (module docstring)."""
    from arbor.tasks.env.policy import resolve_model

    t_all = time.perf_counter()
    home = Path(args.home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    model_dir = Path(resolve_model(args.model, home))
    have_lora = (ROOT / "tasks" / "training" / "lora.py").exists() or (ROOT / "tasks" / "lora.py").exists()
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.lora]
    if not have_lora:
        modes = [m for m in modes if not m]
    cfg = load_config("smol-world", {})
    print(f"model {args.model} -> {model_dir}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, CPU; profile smol-world: "
          f"ZeRO-{cfg.train.zero_stage}, AdamW lr {cfg.train.lr:g}, clip {cfg.train.grad_clip:g}, scoring "
          f"temperature {cfg.rollout.temperature:g}, entropy diagnostic {cfg.train.entropy_diagnostic} (arbor "
          f"only), micro_batch_tokens {args.micro_batch_tokens or cfg.train.micro_batch_tokens}"
          f"{' (--micro-batch-tokens; the profile has ' + str(cfg.train.micro_batch_tokens) + ')' if args.micro_batch_tokens else ''}"
          f"; load average {os.getloadavg()[0]:.1f}")
    print(f"{args.steps} timed steps per side after a warm-up step, each after gc + malloc_trim, fastest wall kept; "
          "arbor and bare in turn, the first side alternating"
          + (f" (except {', '.join('LoRA' if m else 'full' for m in args.sequential)}: all arbor steps, then all "
             "bare steps, one model resident at a time)" if args.sequential else ""))
    results = []
    work = Path(tempfile.mkdtemp(prefix="arbor-bench-train-"))
    for lora in modes:
        results.append(bench_model_mode(model_dir, lora, args.steps, work / ("lora" if lora else "full"),
                                        args.micro_batch_tokens, Path(args.profile_dir) if args.profile else None,
                                        sequential=lora in args.sequential))
    r0 = results[0]
    print(f"\nbatch: {r0['seqs']} trajectories (4 prompts x K 4), {int(r0['tokens'])} real tokens "
          f"(longest {r0['max_len']}), {r0['micro']} micro-batch(es) of <= {r0['micro_batch_tokens']} padded "
          f"tokens, {r0['loss_tokens']} loss tokens, {r0['masked']} search-result tokens with loss mask 0")
    widths = (7, 8, 9, 7)
    head = (f"{'mode':<5} {'path':<25} {'trained':>12} {'pi_old':>7} {'forward':>8} {'backward':>9} {'optim':>7} "
            f"{'phases':>7} {'wall':>7} {'cpu':>6} {'sys':>5} {'peak GiB':>8} {'tok/s':>6} {'ratio':>6} "
            f"{'cpu ratio':>9}")
    print(head)
    print("-" * len(head))
    for r in results:
        mode = "LoRA" if r["lora"] else "full"
        (a_wall, a_cpu, a_sys, a_pk, a_t), (b_wall, b_cpu, b_sys, b_pk, b_t) = r["best"]["arbor"], r["best"]["bare"]
        a_tps, b_tps = r["tokens"] / a_wall, r["tokens"] / b_wall
        trained = f"{r['trainable'] / 1e6:.1f}M/{r['params'] / 1e6:.0f}M"
        for name, wall, cpu, sys_s, pk, t, tps, ratio, cratio in (
                ("arbor Trainer.train_step", a_wall, a_cpu, a_sys, a_pk, a_t, a_tps, f"{a_tps / b_tps:.2f}",
                 f"{b_cpu / a_cpu:.2f}"),
                ("bare torch fwd+bwd+AdamW", b_wall, b_cpu, b_sys, b_pk, b_t, b_tps, "", "")):
            print(f"{mode:<5} {name:<25} {trained:>12} "
                  + " ".join(f"{t[k]:>{w}.2f}" for k, w in zip(PHASES, widths, strict=True))
                  + f" {sum(t[k] for k in PHASES):>7.2f} {wall:>7.2f} {cpu:>6.1f} {sys_s:>5.1f} {pk:>8.1f} "
                  f"{tps:>6.0f} {ratio:>6} {cratio:>9}")
        print(f"{'':<5} {'arbor / bare time':<25} {'':>12} "
              + " ".join(f"{a_t[k] / max(b_t[k], 1e-9):>{w - 1}.2f}x" for k, w in zip(PHASES, widths, strict=True))
              + f" {sum(a_t[k] for k in PHASES) / sum(b_t[k] for k in PHASES):>6.2f}x {a_wall / b_wall:>6.2f}x"
              + f" {a_cpu / b_cpu:>5.2f}x")
        print(f"{'':<5} (Trainer construction incl. deepspeed.initialize: {r['init']:.1f} s, not in the step"
              f"{'; sides run one after the other' if r['sequential'] else ''})")
    if not have_lora:
        print("LoRA: not available (tasks/training/lora.py does not exist yet): full fine-tuning only")
    print("seconds per step (fastest by wall); phases = pi_old + forward + backward + optim; wall = the whole call "
          "(arbor: Trainer.train_step incl. checks, advantages, micro-batch building, metrics; bare: incl. "
          "building the micro-batches); cpu = process CPU seconds of the step (sys: of which kernel, mostly page "
          "faults); peak = the process's peak RSS during the step (both models resident); tok/s = real tokens / "
          "wall; ratio = arbor tok/s / bare tok/s; cpu ratio = the same by CPU seconds")
    print(f"load average {os.getloadavg()[0]:.1f}; bench wall time {time.perf_counter() - t_all:.0f} s")
    return 0


def matmul_peak_tflops() -> float:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    reps = 20
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per side (default 3; 2 with --model)")
    ap.add_argument("--model", default=None, help="the real model: 'smollm2', a GGUF file or an HF directory")
    ap.add_argument("--lora", choices=("both", "off", "on"), default="both", help="--model: which modes to bench")
    ap.add_argument("--home", default=str(ROOT / "bench" / "out" / "models-home"),
                    help="--model: where the converted model is kept")
    ap.add_argument("--threads", type=int, default=0, help="--model: torch CPU threads (0: leave as is)")
    ap.add_argument("--sequential", choices=("full", "lora", "both"), default=None,
                    help="--model: run that mode's two sides one after the other (one model in memory at a time)")
    ap.add_argument("--micro-batch-tokens", type=int, default=None,
                    help="--model: train.micro_batch_tokens for both sides (default: the profile's)")
    ap.add_argument("--profile", action="store_true", help="--model: one more step of each side under torch.profiler")
    ap.add_argument("--profile-dir", default=str(ROOT / "bench" / "out" / "profile"))
    ap.add_argument("--pi-old-pass", action="store_true",
                    help="default bench: a no-grad pi_old pass over every trajectory, as earlier "
                         "(default: the first mini-batch's pi_old from its own forward)")
    args = ap.parse_args()
    if args.model:
        if args.threads:
            torch.set_num_threads(args.threads)
        args.steps = args.steps or 2
        args.sequential = {None: [], "full": [False], "lora": [True], "both": [False, True]}[args.sequential]
        return model_main(args)
    args.steps = args.steps or 3
    gpu = args.gpu and torch.cuda.is_available()
    shape = QWEN3_06B if gpu else TINY
    groups, k, prompt, response = (4, 8, 256, 1792) if gpu else (2, 8, 64, 192)
    device = "cuda" if gpu else "cpu"
    tmp = Path(tempfile.mkdtemp(prefix="arbor-bench-train-"))
    torch.manual_seed(0)
    model_dir = tmp / "model"
    Qwen3ForCausalLM(Qwen3Config(max_position_embeddings=4096, **shape)).save_pretrained(model_dir)
    n_params = sum(p.numel() for p in Qwen3ForCausalLM(Qwen3Config(**shape)).parameters())

    micro_batch_tokens = 16384 if gpu else 10**9  # GPU: 4 x 2k-token sequences a micro-batch
    overrides = {"run.run_id": "bench", "train.micro_batch_tokens": micro_batch_tokens, "train.zero_stage": 2,
                 "train.bf16": gpu, "train.gradient_checkpointing": gpu, "train.entropy_diagnostic": False}
    bench_cfg = load_config("tiny-cpu", overrides)
    tr = Trainer(bench_cfg, model_dir, tmp / "home")
    tr.reuse_pi_old = not args.pi_old_pass
    ref = TorchLoop(model_dir, make_batch(shape["vocab_size"], groups, k, prompt, response, 0), device, gpu,
                    micro_batch_tokens)
    # interleave DeepSpeed and plain steps (after one warm-up step each) and keep the fastest of each: on a shared
    # machine the minimum is the least noisy estimate
    best: dict[str, float] | None = None
    ref_best = float("inf")
    tokens = old_pass_tokens = 0.0
    for step in range(1, args.steps + 2):
        batch = make_batch(shape["vocab_size"], groups, k, prompt, response, tr.policy_version)
        tr.train_step(policy_update(batch, step, bench_cfg.train, bench_cfg.run.overlap), step)
        t_ref = ref.step()
        if step == 1:
            continue
        timing = {key: tr.last_timing[key] for key in ("old_logprobs", "forward", "backward", "optimizer")}
        if best is None or sum(timing.values()) < sum(best.values()):
            best = timing
        ref_best = min(ref_best, t_ref)
        tokens, old_pass_tokens = tr.last_timing["tokens"], tr.last_timing["old_pass_tokens"]
    assert best is not None
    t0 = time.perf_counter()
    tr.save_checkpoint()
    t_ckpt = time.perf_counter() - t0
    split = best
    ds_step = sum(split.values())
    ds_tps = tokens / ds_step
    ref_tps = ref.tokens / ref_best

    print(f"device={device} params={n_params / 1e6:.1f}M batch={groups * k} seqs x {prompt + response} tokens "
          f"= {int(tokens)} tokens/step; pi_old pass over {int(old_pass_tokens)} tokens"
          f"{' (--pi-old-pass)' if args.pi_old_pass else ''}")
    print("DeepSpeed step split (s): " + ", ".join(f"{k}={v:.3f}" for k, v in split.items())
          + f", total={ds_step:.3f}; checkpoint save={t_ckpt:.3f}")
    print(f"tokens/s: deepspeed={ds_tps:,.0f} plain torch={ref_tps:,.0f} ratio={ds_tps / ref_tps:.2f} "
          "(DeepSpeed / plain; < 1 is DeepSpeed overhead)")
    if gpu:
        peak = matmul_peak_tflops()
        # training FLOPs ~ 6 N per token, + 2 N per token the trainer put through a pi_old pass
        achieved = (6 * tokens + 2 * old_pass_tokens) * n_params / ds_step / 1e12
        print(f"bf16 matmul peak={peak:.0f} TFLOP/s; model FLOPs={achieved:.1f} TFLOP/s; MFU={achieved / peak:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
