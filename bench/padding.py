"""Padding of the trainer's micro-batches on a Search-R1-like length mix.

Draws seeded steps of ``--groups`` prompts x ``--k`` trajectories (prompt ~300 tokens per group, responses 500-8k
tokens from a clipped log-normal with a long tail; ~64k tokens a step), cuts each step into ``--updates``
mini-batches as ``Trainer.train_step`` does, packs each with ``train.micro_batch_tokens`` (``--budget``) and prints,
summed over the steps, for each packer:

- padded share: 1 - real tokens / token slots computed (rows x width of every micro-batch);
- micro-batches per step, and the largest micro-batch's slots;
- attention pairs (query x key) relative to today's packer: rows x width^2 where the kernel gets a mask (sdpa,
  eager: padded or packed rows pay for the masked pairs), half that where it gets none (one sequence a row, no
  padding: causal), half the sum of squared sequence lengths for ``varlen`` (flash attention's variable-length
  kernel skips other sequences and the upper triangle);
- estimated compute relative to today's at Qwen3-1.7B (8N FLOPs per token slot: pi_old pass, forward, backward;
  16 x 2048 x 28 per attention pair), GPU speed unmeasured.

Packers: ``before`` (``pack_by_tokens``: the trainer's packer before packed micro-batches, defined here), ``padded`` (``pack_by_lengths``: the fallback), ``packed``
(``pack_rows``: sdpa/eager, rows as wide as the micro-batch's longest sequence), ``varlen`` (``pack_rows`` one
row: flash attention).

``--time``: a CPU step (pi_old pass, forward + policy loss + backward; no optimizer) of a small Qwen3-architecture
model through ``PolicyHead`` for ``before``, ``padded`` and ``packed`` on one drawn step with every length and the
budget divided by ``--scale``; fastest of ``--repeats``.

    python bench/padding.py [--steps 5] [--updates 1] [--budget 16384] [--time --scale 16 --threads 1]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from arbor.tasks.training.packing import pack_micro_batches  # noqa: E402


def pack_by_tokens(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """The trainer's packer before packed micro-batches (the bench's reference, kept here since the trainer dropped
    it): sequences longest first, a micro-batch closed when its padded size (count x longest) would pass
    ``max_tokens``; one longer than the budget alone."""
    bins: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        new_max = max(cur_max, lengths[i])
        if cur and new_max * (len(cur) + 1) > max_tokens:
            bins.append(cur)
            cur, new_max = [], lengths[i]
        cur.append(i)
        cur_max = new_max
    if cur:
        bins.append(cur)
    return bins

PACKERS = ("before", "padded", "packed", "varlen")


def draw_lengths(seed: int, groups: int, k: int) -> list[tuple[int, int]]:
    """(prompt, response) token counts of one step: a prompt of ~N(300, 30) tokens per group, responses from a
    log-normal (median 1200, sigma 0.9) clipped to [500, 8000] -- multi-turn search rollouts, a few near 8k."""
    rng = random.Random(seed)
    out = []
    for _ in range(groups):
        p = max(100, int(rng.gauss(300, 30)))
        for _ in range(k):
            out.append((p, int(min(8000, max(500, rng.lognormvariate(math.log(1200), 0.9))))))
    return out


def minibatches(n: int, updates: int, seed: int) -> list[list[int]]:
    perm = list(range(n))
    random.Random(seed).shuffle(perm)
    n_mb = min(updates, n)
    return [perm[j::n_mb] for j in range(n_mb)]


def layout(packer: str, lengths: list[int], budget: int) -> list[list[list[int]]]:
    """Micro-batches as rows of indices into ``lengths``."""
    if packer == "before":
        return [[[i] for i in mb] for mb in pack_by_tokens(lengths, budget)]
    return pack_micro_batches(lengths, budget, packer)


N_PARAMS, ATTN_WIDTH, LAYERS = 1.7e9, 2048, 28  # Qwen3-1.7B


def measure(packer: str, steps: list[list[int]], updates: int, budget: int) -> dict[str, float]:
    real = slots = pairs = micro = 0
    largest = 0
    for s, lengths in enumerate(steps):
        for mini in minibatches(len(lengths), updates, s):
            lens = [lengths[i] for i in mini]
            for mb in layout(packer, lens, budget):
                width = max(sum(lens[i] for i in row) for row in mb)
                real += sum(lens[i] for row in mb for i in row)
                slots += len(mb) * width
                largest = max(largest, len(mb) * width)
                if packer == "varlen":
                    pairs += sum(lens[i] ** 2 for row in mb for i in row) / 2
                else:
                    plain = all(len(row) == 1 and lens[row[0]] == width for row in mb)
                    pairs += len(mb) * width**2 / (2 if plain else 1)
                micro += 1
    flops = slots * 8 * N_PARAMS + pairs * 16 * ATTN_WIDTH * LAYERS
    return dict(padded=1 - real / slots, micro=micro / len(steps), largest=largest, pairs=pairs, real=real,
                flops=flops)


def time_steps(packers: tuple[str, ...], lengths: list[tuple[int, int]], budget: int,
               repeats: int) -> dict[str, tuple[float, float, int]]:
    """Per packer: the fastest CPU step (pi_old pass, forward + loss + backward) of a small model on ``lengths`` in
    wall and process CPU seconds (the CPU time is less sensitive to other processes on a shared machine), and its
    micro-batch count. The packers take turns within each repeat."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from arbor.tasks.training.head import PolicyHead
    from arbor.tasks.training.losses import policy_loss
    from arbor.tasks.training.packing import make_micro

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True,
                      max_position_embeddings=4096, attn_implementation="sdpa")
    head = PolicyHead(Qwen3ForCausalLM(cfg).float(), temperature=1.0).train()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, 8192, (p,), generator=g).tolist() for p, _ in lengths]
    responses = [torch.randint(10, 8192, (r,), generator=g).tolist() for _, r in lengths]
    micros: dict[str, list] = {}
    for packer in packers:
        micros[packer] = []
        for mb in layout(packer, [p + r for p, r in lengths], budget):
            idx = [i for row in mb for i in row]
            micros[packer].append(make_micro(
                [prompts[i] for i in idx], [responses[i] for i in idx], [[1] * len(responses[i]) for i in idx],
                [[-2.0] * len(responses[i]) for i in idx],
                advantages=[torch.full((len(responses[i]),), 0.5) for i in idx],
                layout=None if packer in ("before", "padded") else [len(r) for r in mb]))
    best = {p: (float("inf"), float("inf")) for p in packers}
    for _ in range(repeats):
        for packer in packers:
            ms = micros[packer]
            n_tokens = float(sum(float(m.mask.sum()) for m in ms))
            t0, c0 = time.perf_counter(), time.process_time()
            with torch.no_grad():
                old = [head(m.ids, m.att, m.rows, m.cols, m.targets, position_ids=m.pos)[0] for m in ms]
            for m, o in zip(ms, old, strict=True):
                logp, _ = head(m.ids, m.att, m.rows, m.cols, m.targets, position_ids=m.pos)
                policy_loss(logp, o, m.rollout_lp, m.adv, m.mask, n_tokens=n_tokens).loss.backward()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            head.zero_grad(set_to_none=True)
            best[packer] = (min(best[packer][0], wall), min(best[packer][1], cpu))
    return {p: (*best[p], len(micros[p])) for p in packers}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=5, help="seeded steps drawn (seeds 0..steps-1)")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--updates", type=int, nargs="+", default=[1, 4], help="train.updates_per_batch values")
    ap.add_argument("--budget", type=int, default=16384, help="train.micro_batch_tokens")
    ap.add_argument("--time", action="store_true", help="also time a CPU step of a small model")
    ap.add_argument("--scale", type=int, default=16, help="--time: lengths and budget divided by this")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)

    draws = [draw_lengths(s, args.groups, args.k) for s in range(args.steps)]
    steps = [[p + r for p, r in d] for d in draws]
    tokens = [sum(s) for s in steps]
    print(f"{args.steps} steps of {args.groups} x {args.k} trajectories, {min(tokens)}-{max(tokens)} tokens a step "
          f"(mean {sum(tokens) / len(tokens):.0f}; longest {max(max(s) for s in steps)}); budget {args.budget}")
    for updates in args.updates:
        print(f"\nupdates_per_batch {updates}")
        print(f"{'packer':8} {'padded share':>12} {'micro/step':>10} {'largest':>8} {'attn pairs':>10} "
              f"{'compute':>8}")
        base: dict[str, float] = {}
        for packer in PACKERS:
            r = measure(packer, steps, updates, args.budget)
            base = base or r
            print(f"{packer:8} {r['padded']:12.4f} {r['micro']:10.1f} {r['largest']:8d} "
                  f"{r['pairs'] / base['pairs']:10.2f} {r['flops'] / base['flops']:8.3f}")
    if args.time:
        torch.set_num_threads(args.threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
        small = [(max(1, p // args.scale), max(1, r // args.scale)) for p, r in draws[0]]
        budget = args.budget // args.scale
        print(f"\nCPU step, small Qwen3 (4 x 256, sdpa), step 0 scaled 1/{args.scale}: {sum(map(sum, small))} tokens, "
              f"budget {budget}, {args.threads} thread(s), fastest of {args.repeats}")
        for packer, (wall, cpu, n) in time_steps(("before", "padded", "packed"), small, budget,
                                                 args.repeats).items():
            print(f"{packer:8} {wall:7.2f} s wall {cpu:7.2f} s CPU  {n} micro-batches")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
