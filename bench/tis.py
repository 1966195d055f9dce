"""TIS weights of RubricEM's reflection candidates at the paper's rollout temperature.

    python bench/tis.py [--model smollm2] [--prompts 8] [--samples 8] [--new-tokens 96] [--threads 2]

RubricEM samples its reflection candidates at T_c = 0.7 (D.4) while its task rollouts use T = 1.0 (F.1.2). Trained
in the same update as the task batch and scored at the rollout temperature, each candidate token gets the
truncated importance weight w = min(pi_T(a) / pi_Tc(a), C) with C = ``train.tis_cap`` = 2. This bench samples
candidates from the real SmolLM2-135M-Instruct (the PyPI wheel, converted once into ``bench/out/models-home``) on
reflection requests about the world's training questions, and prints the distribution of w (untruncated) over the
sampled tokens when they are scored at T = 1.0, against the reference of scoring them at T_c in the same run (the
two-phase update's choice: w = 1 up to the one-step staleness, which this bench does not add). Figures printed:
mean, quantiles, the share of tokens whose weight C truncates, the share below 1 / C, and E[min(w, C)]: under the
sampler E[w] = 1, so the truncated mean below 1 is the bias truncation adds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from arbor.config import load_config  # noqa: E402


def token_weights(logits: torch.Tensor, tokens: torch.Tensor, t_sample: float, t_score: float) -> torch.Tensor:
    """w = pi_{t_score}(a) / pi_{t_sample}(a) for each sampled token (logits: [N, V] raw; tokens: [N])."""
    lp_score = torch.log_softmax(logits.float() / t_score, dim=-1).gather(-1, tokens[:, None])[:, 0]
    lp_sample = torch.log_softmax(logits.float() / t_sample, dim=-1).gather(-1, tokens[:, None])[:, 0]
    return torch.exp(lp_score - lp_sample)


def summary(w: torch.Tensor, cap: float) -> dict[str, float]:
    q = torch.quantile(w, torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95]))
    return {"tokens": float(w.numel()), "mean": float(w.mean()), "p05": float(q[0]), "p25": float(q[1]),
            "median": float(q[2]), "p75": float(q[3]), "p95": float(q[4]),
            "truncated": float((w > cap).float().mean()), "below_1/C": float((w < 1 / cap).float().mean()),
            "E[min(w,C)]": float(w.clamp(max=cap).mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8, help="m: candidates per reflection request")
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rollout-temperature", type=float, default=1.0, help="the paper's T (F.1.2)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from arbor.tasks.env.agent import build_prompt_ids
    from arbor.tasks.env.policy import load_policy, resolve_model
    from arbor.tasks.env.world.questions import world_questions
    from arbor.tasks.reflection import REFLECTION_SYSTEM_PROMPT, reflection_message

    cfg = load_config("smol-world")
    rc, cap = cfg.rubricem, cfg.train.tis_cap or 2.0
    home = ROOT / "bench" / "out" / "models-home"
    model, tok = load_policy(resolve_model(args.model, home), home=home, policy_cfg=cfg.policy)
    model.eval()
    questions = world_questions(cfg.world, "train")[: args.prompts]
    weights_t, weights_c = [], []
    for i, q in enumerate(questions):
        attempt = (f"<think>I should find who is named in the question.</think>\n<search>{q.question}</search>\n"
                   f"<result>\n(no useful passage)\n</result>\n<answer>\\boxed{{unknown}}</answer>")
        ids = torch.tensor([build_prompt_ids(tok, reflection_message(q.question, attempt), REFLECTION_SYSTEM_PROMPT)])
        torch.manual_seed(1000 + i)
        with torch.no_grad():
            out = model.generate(ids.repeat(args.samples, 1), do_sample=True, temperature=rc.reflection_temperature,
                                 top_p=1.0, top_k=0, max_new_tokens=args.new_tokens, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=tok.pad_token_id or tok.eos_token_id)
        new = out.sequences[:, ids.shape[1]:]
        logits = torch.stack(out.logits, dim=1)  # [m, steps, V], raw (before the sampler's temperature)
        eos = {tok.eos_token_id, tok.pad_token_id} - {None}
        for r in range(new.shape[0]):
            n = next((j + 1 for j, t in enumerate(new[r].tolist()) if t in eos), new.shape[1])
            weights_t.append(token_weights(logits[r, :n], new[r, :n], rc.reflection_temperature,
                                           args.rollout_temperature))
            weights_c.append(token_weights(logits[r, :n], new[r, :n], rc.reflection_temperature,
                                           rc.reflection_temperature))
    wt, wc = torch.cat(weights_t), torch.cat(weights_c)
    print(f"# {args.model}: {len(questions)} reflection requests x m = {args.samples} candidates sampled at "
          f"T_c = {rc.reflection_temperature}, C = {cap}")
    for name, w in ((f"scored at the rollout T = {args.rollout_temperature} (joint update)", wt),
                    (f"scored at T_c = {rc.reflection_temperature} (two-phase, the reference)", wc)):
        s = summary(w, cap)
        print(f"{name}:")
        print("  " + "  ".join(f"{k} {v:.4g}" for k, v in s.items()))
    print(f"ratio E[min(w,C)] joint / reference: {summary(wt, cap)['E[min(w,C)]'] / summary(wc, cap)['E[min(w,C)]']:.3f}"
          f"; median |log w| joint {statistics.median(wt.log().abs().tolist()):.3f}")


if __name__ == "__main__":
    main()
