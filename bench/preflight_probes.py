"""Preflight's endpoint probes side by side against one after another, for a profile whose endpoints do not answer.

    python bench/preflight_probes.py [--profile qwen3-8b-coreact] [--timeout 2]

A paper profile names up to five judge endpoints (the judge, a verifier, a teacher, the ranking council). Where none
answers (a CPU box without them; CI, whose network drops the packets), each probe waits its whole TCP timeout. The
profile's judge and role URLs are pointed at an unroutable address (TEST-NET-1, 192.0.2.0/24: the packets go
nowhere), then ``endpoint_problems`` (side by side, what ``preflight.check`` runs) and ``endpoint_problem`` on each
URL in turn are timed in this process; the ratio is the figure.
"""

from __future__ import annotations

import argparse
import time

NOWHERE = "http://192.0.2.{i}:8000/v1"  # RFC 5737 documentation range: never routed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="qwen3-8b-coreact")
    ap.add_argument("--timeout", type=float, default=2.0, help="TCP timeout per probe, s (preflight's: 5)")
    args = ap.parse_args()

    from arbor.config import load_config
    from arbor.preflight.judges import endpoint_problem, endpoint_problems, judge_urls

    cfg = load_config(args.profile)
    sets = {"judge.base_url": NOWHERE.format(i=101)}  # the judge and every role that has an endpoint of its own
    sets |= {f"judge.roles.{role}.base_url": NOWHERE.format(i=102 + i)
             for i, (role, over) in enumerate(cfg.judge.roles) if over.base_url}
    urls = judge_urls(load_config(args.profile, sets).judge, {})
    t0 = time.perf_counter()
    together = endpoint_problems(urls, args.timeout)
    t_together = time.perf_counter() - t0
    t0 = time.perf_counter()
    alone = {u: endpoint_problem(u, args.timeout) for u in urls}
    t_alone = time.perf_counter() - t0
    assert all(together.values()) and all(alone.values()), (together, alone)  # every probe failed, both ways
    print(f"{args.profile}: {len(urls)} endpoints, timeout {args.timeout:g} s: one after another {t_alone:.1f} s, "
          f"side by side {t_together:.1f} s, ratio {t_together / t_alone:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
