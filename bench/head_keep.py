"""The policy head when every loss position fits one chunk: logits kept for the backward against recomputed.

    python bench/head_keep.py [--positions 4096] [--repeats 7]

At the tiny policies' shapes (vocabulary 8,192; hidden 256 for tiny-cpu, 128 for tiny-world) a micro-batch's loss
positions fit one chunk (``tasks.training.head.chunk_positions``: 8,192 positions), so ``chunked_logprobs`` keeps
the forward's logits for the backward instead of recomputing them (``keep_logits``). Forward + backward with the
entropy diagnostic (detached) as the trainer runs them, both paths timed alternately in this process, median of the
repeats; the ratio is the figure (the gradients are equal bit for bit: tests/test_head.py).
"""

from __future__ import annotations

import argparse
import statistics
import time


def timed(keep: bool, n: int, d: int, v: int) -> float:
    import torch

    from arbor.tasks.training.head import chunked_logprobs

    g = torch.Generator().manual_seed(0)
    h = torch.randn(n, d, generator=g).requires_grad_()
    w = (torch.randn(v, d, generator=g) / d**0.5).requires_grad_()
    y = torch.randint(0, v, (n,), generator=g)
    t0 = time.perf_counter()
    logp, _ = chunked_logprobs(h, w, None, y, 0.7, "detached", keep_logits=keep)
    logp.sum().backward()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--positions", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    import torch

    print(f"head forward + backward, one chunk of {args.positions} positions, vocabulary 8192, "
          f"{torch.get_num_threads()} thread(s); median of {args.repeats}")
    for name, d in (("tiny-cpu", 256), ("tiny-world", 128)):
        timed(True, args.positions, d, 8192)  # warm-up
        runs: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeats):
            for keep in (False, True):
                runs[keep].append(timed(keep, args.positions, d, 8192))
        kept, recomputed = statistics.median(runs[True]), statistics.median(runs[False])
        print(f"  {name:<10} hidden {d}: recomputed {recomputed * 1e3:7.1f} ms  kept {kept * 1e3:7.1f} ms  "
              f"ratio {kept / recomputed:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
