"""Agent-loop throughput against plain ``generate`` on the same prompts and lengths (issue 5 acceptance).

    python bench/rollout.py [--size 50m|5m|500m] [--batch 16] [--turn-tokens 64] [--device cpu|cuda]

Both sides use the same random-init Qwen3-architecture model, the same B prompts (offline eval questions rendered
with the chat template), temperature 1.0, and generate the same number of tokens on average:

- agent loop: ``TransformersEngine`` (our batched KV-cache decoding, per-row seeded sampling, string stops, rows
  leaving the batch as they finish, observations tokenised and appended, every turn re-prefilled).
  A random model never writes ``</search>``, so turn ends are induced with a stop *character* chosen so that about
  1 / turn_tokens of the vocabulary contains it; such a turn is a search for its last five words on the real BM25
  backend (top-k / truncation of the tiny-cpu profile), whose ``<result>`` block is appended and prefilled, and the
  next turn starts. Search time is included.
- reference: Hugging Face ``model.generate`` on the same prompts, one uninterrupted turn (KV cache, sampling), run
  for as many steps as the longest agent trajectory generated (``min_new_tokens = max_new_tokens``); it is credited
  with the same per-row token counts as the agent loop (the same lengths), as a batch of plain generations of those
  lengths would be: ``generate`` keeps finished rows in the batch until the longest is done.

Prints generated tokens/s of both, the ratio (target >= 0.8 when compute dominates, ~50M parameters on CPU) and the
turns per trajectory.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arbor.config import load_config  # noqa: E402
from arbor.paths import arbor_home  # noqa: E402
from arbor.tasks.agent import AgentLoop, build_prompt_ids  # noqa: E402
from arbor.tasks.datasets import load_questions  # noqa: E402
from arbor.tasks.policy import BENCH_50M, TinyPolicyConfig, build_tiny_model, build_tiny_policy, n_parameters  # noqa: E402
from arbor.tasks.rollout import TransformersEngine  # noqa: E402
from arbor.tasks.search import make_search  # noqa: E402

SIZES = {
    "5m": TinyPolicyConfig(),
    "50m": BENCH_50M,
    "500m": TinyPolicyConfig(hidden_size=1024, intermediate_size=3072, num_hidden_layers=24, num_attention_heads=16,
                             num_key_value_heads=8, head_dim=64),
}


class InducedSearchLoop(AgentLoop):
    """The agent loop, except that a turn ending at the induced stop is a search for its last five words.

    So every turn gets a real BM25 ``<result>`` block (top-k, truncated as in the profile) appended and prefilled,
    as in a real rollout.
    """

    def _classify(self, turn_text: str, ids: list[int], finish_reason: str) -> tuple[str, str | None]:
        ended_by, query = super()._classify(turn_text, ids, finish_reason)
        if ended_by == "search" and not query:
            query = " ".join(turn_text.split()[-5:]) or "search"
        return ended_by, query


def pick_stop_char(tokenizer, turn_tokens: int) -> str:
    """A character contained in about 1 / turn_tokens of the vocabulary's decoded tokens."""
    texts = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    target = 1.0 / turn_tokens
    best, best_err = "z", float("inf")
    for ch in "abcdefghijklmnopqrstuvwxyz0123456789":
        frac = sum(ch in t for t in texts) / len(texts)
        if frac > 0 and abs(frac - target) < best_err:
            best, best_err = ch, abs(frac - target)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="50m")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--turn-tokens", type=int, default=64, help="mean tokens per turn to induce")
    ap.add_argument("--max-response", type=int, default=384)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave as is)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(build_tiny_policy()))
    model = build_tiny_model(SIZES[args.size], tokenizer).to(args.device, getattr(torch, args.dtype)).eval()
    questions = load_questions("offline:eval")[: args.batch]
    cfg = load_config("tiny-cpu", {"rollout.temperature": 1.0, "rollout.max_turns": 64, "rollout.max_searches": 64,
                                   "rollout.max_new_tokens_per_turn": args.max_response,
                                   "rollout.max_response_tokens": args.max_response,
                                   "rollout.max_context_tokens": 8192})
    search = make_search(cfg.search, home=arbor_home())
    engine = TransformersEngine(cfg, model, tokenizer, search)
    stop = pick_stop_char(tokenizer, args.turn_tokens)
    engine.loop = InducedSearchLoop(tokenizer, search, engine.loop.budgets, search_stop=stop)
    engine.loop.eos_ids = set(engine.eos_ids)
    print(f"model {args.size}: {n_parameters(model) / 1e6:.1f}M parameters on {args.device} ({args.dtype}), "
          f"torch threads {torch.get_num_threads()}, batch {len(questions)}, induced stop {stop!r}")

    # warm-up (allocator, kernels, BM25 index)
    engine.generate_groups(questions, k=1, seed=99, step=0)
    prompts = [build_prompt_ids(tokenizer, q.question) for q in questions]
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    att = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        att[i, width - len(p):] = 1
    ids, att = ids.to(args.device), att.to(args.device)

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    # Interleaved repeats (the machine may be shared): best and median of each side.
    agent_tps, ref_tps, turns, gen_tokens, n_new = [], [], [], [], 0
    for rep in range(args.repeats):
        t0 = time.perf_counter()
        trajs = engine.generate_groups(questions, k=1, seed=rep, step=0)
        sync()
        agent_s = time.perf_counter() - t0
        gen_tokens = [sum(t.loss_mask) for t in trajs]
        turns += [t.turns for t in trajs]
        agent_tps.append(sum(gen_tokens) / agent_s)

        n_new = max(gen_tokens)  # generate() runs every row to the longest; rows count their own lengths
        torch.manual_seed(rep)
        with torch.no_grad():
            t0 = time.perf_counter()
            out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=n_new, min_new_tokens=n_new,
                                 do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                 pad_token_id=tokenizer.pad_token_id)
            sync()
            ref_s = time.perf_counter() - t0
        assert out.shape[1] - width == n_new
        ref_tps.append(sum(gen_tokens) / ref_s)
        print(f"  repeat {rep}: agent loop {agent_tps[-1]:8.1f} tok/s ({sum(gen_tokens)} tokens, "
              f"{statistics.mean(t.turns for t in trajs):.1f} turns and "
              f"{statistics.mean(len(t.loss_mask) - sum(t.loss_mask) for t in trajs):.0f} result tokens per "
              f"trajectory) | generate() {ref_tps[-1]:8.1f} tok/s "
              f"({n_new} steps, the same {sum(gen_tokens)} tokens counted)")

    best = max(agent_tps) / max(ref_tps)
    med = statistics.median(agent_tps) / statistics.median(ref_tps)
    print(f"agent loop : best {max(agent_tps):8.1f} tok/s, median {statistics.median(agent_tps):8.1f} tok/s "
          f"(turns/trajectory mean {statistics.mean(turns):.1f}, max {max(turns)})")
    print(f"generate() : best {max(ref_tps):8.1f} tok/s, median {statistics.median(ref_tps):8.1f} tok/s")
    print(f"ratio agent/generate: best {best:.2f}, median {med:.2f}  ->  "
          f"{'reaches' if best >= 0.8 else 'does NOT reach'} 0.8")


if __name__ == "__main__":
    main()
