"""What a paper profile needs before it starts: GPU memory per role, host RAM for the background checkpoint, disk per
checkpoint and in total, judge calls, tokens and spend per step (docs/resources.md prints this script's table).

    python bench/resources.py                      # the qwen3 ARBOR profiles
    python bench/resources.py -p qwen3-8b --response-tokens 3000

Computed from each profile's config and the policy's architecture (Qwen3's published shapes: parameters counted from
them, not downloaded). Memory and disk follow from the bytes each parameter costs (bf16 weights and gradients, fp32
master weights and Adam's two moments under ZeRO-3); activations and vLLM's KV cache depend on sequence lengths and are
bounded, not counted. Judge calls per step are the pairwise graph's (sparse_edges: 11 comparisons a group of 8, per
active rubric) plus induction and its drafts' scoring at the rate a tiny-world ARBOR run's judge ledger shows per
group (``--ledger-calls-per-group``, measured); tokens per call are an estimate from the response length.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GB = 1e9


@dataclass(frozen=True)
class Shape:
    """A decoder's shape (Qwen3 model cards): layers, hidden, MLP width, query / key-value heads, head dim, vocab."""

    layers: int
    hidden: int
    mlp: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool

    @property
    def params(self) -> int:
        attn = self.hidden * self.head_dim * (self.q_heads * 2 + self.kv_heads * 2) + 2 * self.head_dim  # q,k,v,o; qk-norm
        layer = attn + 3 * self.hidden * self.mlp + 2 * self.hidden  # gate, up, down; two RMSNorms
        emb = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * layer + emb + self.hidden

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16


SHAPES = {  # published: Qwen3-4B 4.0B, Qwen3-8B 8.2B, Qwen3-14B 14.8B
    "Qwen/Qwen3-4B": Shape(36, 2560, 9728, 32, 8, 128, 151936, True),
    "Qwen/Qwen3-8B": Shape(36, 4096, 12288, 32, 8, 128, 151936, False),
    "Qwen/Qwen3-14B": Shape(40, 5120, 17408, 40, 8, 128, 151936, False),
}
BYTES_STATE = 2 + 2 + 4 + 4 + 4  # bf16 weight + bf16 grad + fp32 master + Adam m + v (ZeRO-3 shards all of it)
BYTES_SAVED = 2 + 4 + 4 + 4  # a checkpoint: bf16 weights (hf/) + fp32 master, m, v (ds/)


def rows(profile: str, response_tokens: int, calls_per_group: float) -> list[tuple[str, str, str]]:
    from arbor.config import load_config

    cfg = load_config(profile)
    shape = SHAPES[cfg.policy.model]
    n = shape.params
    c = cfg.cluster
    g_train, g_roll = max(len(c.train_gpus), 1), max(len(c.rollout_gpus), 1)
    groups, k = cfg.rollout.batch_size, cfg.rollout.k
    edges = (k - 1) + k // 2  # sparse_edges: neighbours + diameters
    pairwise = groups * cfg.memory.n_active * edges
    other = groups * calls_per_group
    per_call_in = 2 * response_tokens + 1500  # two trajectories, the rubric, the question and the prompt's text
    per_call_out = 200
    price_in, price_out = cfg.judge.price_in_per_mtok, cfg.judge.price_out_per_mtok
    step_usd = (pairwise + other) * (per_call_in * price_in + per_call_out * price_out) / 1e6
    eval_calls = cfg.run.eval_runs * sum(min(cfg.run.eval_size, m) for m in (125, 200, 200, 200))
    keep = cfg.checkpoint.keep_last
    ckpt = BYTES_SAVED * n / GB
    return [
        ("parameters", f"{n / 1e9:.2f} B", f"counted from {cfg.policy.model}'s shape"),
        ("trainer GPU memory (each of the train GPUs)", f"{BYTES_STATE * n / g_train / GB:.1f} GB + activations",
         f"16 bytes a parameter (bf16 weight and grad, fp32 master, Adam m and v) over ZeRO-3's {g_train} GPUs; "
         f"activations of a micro-batch of {cfg.train.micro_batch_tokens} tokens with checkpointing "
         f"{'on' if cfg.train.gradient_checkpointing else 'off'} on top (measure: bench/gpu_check.py)"),
        ("vLLM GPU memory (each rollout GPU)", f"{2 * n / c.vllm_tensor_parallel / GB:.1f} GB weights + KV cache",
         f"bf16 weights over tensor parallel {c.vllm_tensor_parallel}, {g_roll} GPU(s); the KV cache takes what vLLM's "
         f"memory fraction leaves: {shape.kv_bytes_per_token() / 1e3:.0f} kB a token, "
         f"{shape.kv_bytes_per_token() * cfg.rollout.max_context_tokens / GB:.1f} GB for one full "
         f"{cfg.rollout.max_context_tokens}-token context"),
        ("host RAM for the background checkpoint", f"{ckpt:.0f} GB (pinned)",
         "the whole model and optimizer state copied to host memory before it is written (14 bytes a parameter)"),
        ("disk per checkpoint / kept", f"{ckpt:.0f} GB / {ckpt * keep:.0f} GB",
         f"hf/ in bf16 and ds/ (fp32 master, m, v); checkpoint.every {cfg.checkpoint.every}, keep_last {keep}; "
         f"the SFT start adds {2 * n / GB:.0f} GB"),
        ("judge calls per step", f"{pairwise + other:.0f}",
         f"{groups} groups x {cfg.memory.n_active} active rubrics x {edges} comparisons = {pairwise} pairwise, plus "
         f"induction and draft scoring at {calls_per_group:.1f} calls a group (tiny-world ARBOR's ledger)"),
        ("judge tokens per step (estimate)", f"{(pairwise + other) * per_call_in / 1e6:.1f} M in, "
         f"{(pairwise + other) * per_call_out / 1e6:.2f} M out",
         f"{per_call_in} prompt tokens a call: two trajectories of {response_tokens} tokens and ~1,500 of prompt; "
         f"{per_call_out} out"),
        ("judge spend per step (estimate)", f"${step_usd:.2f}", f"at {cfg.judge.model}'s configured ${price_in}/M in, "
         f"${price_out}/M out; x {cfg.run.steps} steps = ${step_usd * cfg.run.steps:.0f} a run"),
        ("final evaluation", f"{eval_calls} answers", f"{cfg.run.eval_runs} runs of every test question, each "
         "judged once (App. E.4)"),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-p", "--profile", nargs="+", default=["qwen3-4b", "qwen3-8b", "qwen3-14b"])
    ap.add_argument("--response-tokens", type=int, default=2000, help="mean trajectory length the judge reads")
    ap.add_argument("--ledger-calls-per-group", type=float, default=10.3,
                    help="induction + draft-scoring calls a group beyond the pairwise graph: 10.3 in the judge ledger "
                    "of a tiny-world ARBOR run with the world judge (4,966 induce and consolidate calls in 30 steps "
                    "of 16 groups; bench/premise.py's arbor-world, seed 0)")
    args = ap.parse_args(argv)
    for p in args.profile:
        print(f"\n### {p}\n\n| what | figure | how |\n|---|---|---|")
        for what, fig, how in rows(p, args.response_tokens, args.ledger_calls_per_group):
            print(f"| {what} | {fig} | {how} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
