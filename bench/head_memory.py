"""Peak memory of the policy head's forward + backward, full logits vs chunked.

    python bench/head_memory.py [--positions 16384] [--hidden 64] [--vocab 151936]

The head scores N loss positions against Qwen3's 151,936-token vocabulary at temperature 0.7, with the entropy
diagnostic (detached) on, as the trainer does by default; the loss is a weighted sum of the log-probs (what
``policy_loss`` backpropagates through). On the CPU in float32 with a small hidden size, so the head's own memory
dominates. Each measurement runs in a fresh process: the peak resident set (``ru_maxrss``) minus the resident set
just before the head runs (inputs and weights allocated).

- ``full``: the path before the chunked head (``linear`` -> ``.float() / T`` -> ``token_logprobs`` + ``token_entropy``),
  measured at smaller N (one [N x V] float32 tensor at N = 16k is 9.3 GiB; several are live at once) and
  extrapolated linearly to N, which is exact in form: every large tensor is [N x V];
- ``chunked``: ``tasks.training.head.chunked_logprobs`` (256 MiB of float32 logits per chunk), measured at N.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def rss_gib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def measure(path: str, n: int, d: int, v: int, temperature: float) -> dict[str, float]:
    """One forward + backward of the head in this process: extra peak memory (GiB) and seconds."""
    import torch

    from arbor.tasks.training.head import chunked_logprobs
    from arbor.tasks.training.losses import token_entropy, token_logprobs

    torch.manual_seed(0)
    h = torch.randn(n, d).requires_grad_()
    w = (torch.randn(v, d) / d**0.5).requires_grad_()
    y = torch.randint(0, v, (n,))
    wa = torch.randn(n)
    base = rss_gib()
    t0 = time.perf_counter()
    if path == "full":
        logits = torch.nn.functional.linear(h, w).float() / temperature
        logp, ent = token_logprobs(logits, y), token_entropy(logits.detach())
    else:
        logp, ent = chunked_logprobs(h, w, None, y, temperature, "detached")
    (wa * logp).sum().backward()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return dict(path=path, positions=n, peak_gib=peak - base, seconds=seconds, entropy_mean=float(ent.mean()))


def run(path: str, n: int, d: int, v: int, temperature: float) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--one", path, "--positions", str(n), "--hidden", str(d),
                          "--vocab", str(v), "--temperature", str(temperature)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--positions", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--full-at", type=int, nargs="+", default=[512, 1024, 2048],
                    help="positions at which the full-logits path is measured")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.positions, args.hidden, args.vocab, args.temperature)))
        return 0
    d, v, n, t = args.hidden, args.vocab, args.positions, args.temperature
    print(f"head forward + backward, float32 on the CPU: hidden {d}, vocabulary {v}, temperature {t}, "
          "entropy diagnostic (detached); extra peak RSS over the inputs")
    full = [run("full", m, d, v, t) for m in args.full_at]
    for r in full:
        print(f"  full logits  N={r['positions']:>6}: {r['peak_gib']:6.2f} GiB  {r['seconds']:6.1f} s")
    per_pos = (full[-1]["peak_gib"] - full[0]["peak_gib"]) / (full[-1]["positions"] - full[0]["positions"])
    extrapolated = full[-1]["peak_gib"] + per_pos * (n - full[-1]["positions"])
    print(f"  full logits  N={n:>6}: {extrapolated:6.2f} GiB  (extrapolated: {per_pos * 2**30 / v:.1f} bytes "
          f"per position and vocabulary entry, i.e. {per_pos * 2**30 / v / 4:.1f} float32 [N x V] tensors)")
    for m in sorted({args.full_at[-1], n}):
        r = run("chunked", m, d, v, t)
        print(f"  chunked      N={r['positions']:>6}: {r['peak_gib']:6.2f} GiB  {r['seconds']:6.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
