"""How far the rollout engine's log-probs sit from the trainer's: TIS weights of a run's first step.

    python bench/rollout_logprobs.py --home HOME --run-id RUN [--step 1] [--cap 2]

Reads the step's stored trajectories (``rollout_logprobs``: what the engine returned, e.g. vLLM's bf16 processed
log-probs), scores the same tokens with the run's start policy as the trainer does at that step (float32 on the CPU,
logits divided by the scoring temperature, ``tasks.training.head.scoring_temperature``; at step 1 the trainer's
pi_old is the start policy, LoRA adapters being zero then), and prints over the policy's tokens (loss mask 1): the
mean and the largest |log pi_old - log pi_rollout|, its quantiles, and the TIS weights w = exp(log pi_old - log
pi_rollout) (mean of min(w, C), the share above C, the share below 1 / C). The reference in the same run: the
trainer's own ``tis_mean`` and ``tis_clip_frac`` of that step (``steps``), which this bench must reproduce.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def gaps(model: torch.nn.Module, trajs: list[dict], temperature: float) -> torch.Tensor:
    """log pi_old - log pi_rollout over the policy tokens of ``trajs``, in order."""
    from arbor.tasks.training.losses import token_logprobs

    out = []
    for t in trajs:
        ids = torch.tensor(t["prompt_ids"] + t["response_ids"])[None]
        with torch.no_grad():
            logits = model(ids).logits[0, len(t["prompt_ids"]) - 1: -1] / temperature
        lp = token_logprobs(logits, torch.tensor(t["response_ids"]))
        mask = torch.tensor(t["loss_mask"], dtype=torch.bool)
        out.append(lp[mask] - torch.tensor(t["rollout_logprobs"])[mask])
    return torch.cat(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--step", type=int, default=1)
    ap.add_argument("--cap", type=float, default=None, help="C (default: the run's train.tis_cap)")
    args = ap.parse_args(argv)
    home = Path(args.home).resolve()

    from arbor.flows.run_setup import start_checkpoint, stored_config
    from arbor.storage.parquet import read_table
    from arbor.storage.sql import query
    from arbor.tasks.env.policy import load_policy
    from arbor.tasks.training.head import scoring_temperature

    cfg = stored_config(args.run_id, home)
    if cfg is None:
        raise SystemExit(f"no run {args.run_id!r} in {home}")
    cap = args.cap if args.cap is not None else (cfg.train.tis_cap or 2.0)
    trajs = [t for t in read_table("trajectories", run_id=args.run_id, home=home).to_pylist()
             if t["step"] == args.step]
    start = start_checkpoint(cfg, home)
    model, _ = load_policy(start, "float32", home=home, policy_cfg=cfg.policy)
    model.eval()
    temperature = scoring_temperature(cfg.rollout.temperature)
    d = gaps(model, trajs, temperature)
    w = torch.exp(d)
    q = torch.quantile(d.abs(), torch.tensor([0.5, 0.9, 0.99]))
    print(f"run {args.run_id} step {args.step}: {len(trajs)} trajectories, {d.numel()} policy tokens, scored by "
          f"{start.name} at T = {temperature:g} (float32) against the engine's ({cfg.rollout.engine})")
    print(f"|log pi_old - log pi_rollout|: mean {d.abs().mean():.4f}, median {q[0]:.4f}, p90 {q[1]:.4f}, "
          f"p99 {q[2]:.4f}, max {d.abs().max():.4f}; signed mean {d.mean():+.4f}")
    print(f"TIS w = exp(log pi_old - log pi_rollout), C = {cap:g}: mean min(w, C) {torch.clamp(w, max=cap).mean():.4f}, "
          f"share w > C {(w > cap).float().mean():.4f}, share w < 1/C {(w < 1 / cap).float().mean():.4f}")
    row = query("select tis_mean, tis_clip_frac from steps where run_id = $run_id and step = $step",
                {"run_id": args.run_id, "step": args.step}, home=home).to_pylist()
    if row:
        print(f"the trainer's own at step {args.step}: tis_mean {row[0]['tis_mean']:.4f}, tis_clip_frac "
              f"{row[0]['tis_clip_frac']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
