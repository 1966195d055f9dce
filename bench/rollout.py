"""Agent-loop throughput against plain ``generate`` on the same prompts and lengths (the acceptance).

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

``--model smollm2`` (or a GGUF file / HF directory): the real SmolLM2-135M-Instruct, loaded through
``tasks.env.policy.resolve_model`` / ``load_policy`` (converted once into ``bench/out/models-home``), on the world's
held-out questions rendered with its own chat template (``build_prompt_ids`` with the loop's system prompt), with the
smol-world profile's rollout settings (temperature 0.7, 48 new tokens per turn, 4 turns / 3 searches, 256 response
and 640 context tokens, the world's BM25 corpus, top-1 passage of 200 characters), at batch sizes 8 and 16:

    python bench/rollout.py --model smollm2 [--batch 8 16] [--repeats 3] [--threads 1]

The zero-shot model answers in prose and never writes ``</search>``, so a search is induced the other way round: a
turn that reaches the per-turn cap (48 tokens) is a search for the question, whose real ``<result>`` block (the
world's top passage) is appended and prefilled before the next turn; a turn that ends with EOS ends the trajectory,
as in a real rollout.
``generate()`` runs the same prompts with the same sampling (temperature 0.7, top-p 1, top-k off), the same model,
dtype and threads, in the same process, as one uninterrupted turn of as many steps as the longest agent trajectory
generated (min = max new tokens), and is credited with the agent loop's own token counts (as above); its raw
throughput (every row x every step) is printed too. The time of each side is split (forward hooks and wrappers):
model forward for single-token decoding steps and for prefills (prompts, result blocks), sampling, search,
detokenising (stop-string checks), and the rest (Python: cache merging, masks, bookkeeping). On a shared two-core
machine pass ``--threads 1`` (two processes with two OpenMP threads each on two cores slow each other down by an
order of magnitude).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from arbor.config import load_config  # noqa: E402
from arbor.paths import arbor_home  # noqa: E402
from arbor.tasks.env.agent import AgentLoop, build_prompt_ids  # noqa: E402
from arbor.tasks.env.datasets import load_questions  # noqa: E402
from arbor.tasks.env.policy import (  # noqa: E402
    BENCH_50M,
    TinyPolicyConfig,
    build_tiny_model,
    build_tiny_policy,
    n_parameters,
)
from arbor.tasks.env.rollout import TransformersEngine  # noqa: E402
from arbor.tasks.env.search import make_search  # noqa: E402

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


class CapSearchLoop(AgentLoop):
    """The agent loop, except that a turn that reaches the per-turn token cap is a search for the question itself
    (``--model``: a zero-shot instruction model answers in prose and never writes ``</search>``; the question, as an
    agent's first search would be, gets the world's top passage, so the ``<result>`` block is the profile's real
    size). Turns that end with EOS or ``</answer>`` end the trajectory as usual; every budget still applies."""

    _induced = False

    def _classify(self, turn_text: str, ids: list[int], finish_reason: str) -> tuple[str, str | None]:
        ended_by, query = super()._classify(turn_text, ids, finish_reason)
        self._induced = ended_by == "length"
        return ("search", "(the question)") if self._induced else (ended_by, query)

    def observe(self, s, gen):
        query = super().observe(s, gen)
        if query is not None and self._induced:
            s._pending = query = s.question
        return query


class Split:
    """Where one side's time goes: model forward (decode steps / prefills, by forward hooks), and wrapped calls."""

    def __init__(self, model) -> None:
        self.t: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._t0 = 0.0
        self._key = ""
        model.register_forward_pre_hook(self._pre, with_kwargs=True)
        model.register_forward_hook(self._post, with_kwargs=True)

    def _pre(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self._key = "decode fwd" if ids is not None and ids.shape[1] == 1 else "prefill fwd"
        self._t0 = time.perf_counter()

    def _post(self, module, args, kwargs, output) -> None:
        self.t[self._key] += time.perf_counter() - self._t0
        self.calls[self._key] += 1

    def wrap(self, owner, name: str, key: str) -> None:
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.t[key] += time.perf_counter() - t0
                self.calls[key] += 1

        setattr(owner, name, timed)

    def take(self) -> tuple[dict[str, float], dict[str, int]]:
        out = dict(self.t), dict(self.calls)
        self.t.clear()
        self.calls.clear()
        return out


SPLIT_KEYS = ("decode fwd", "prefill fwd", "sampling", "search", "detokenise")


def model_main(args: argparse.Namespace) -> None:
    """``--model``: the real model on the world's held-out questions (module docstring)."""
    import arbor.tasks.env.decoding as decoding_mod
    from arbor.tasks.env.policy import load_policy, resolve_model

    t_all = time.perf_counter()
    home = Path(args.home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    src = resolve_model(args.model, home)
    cfg = load_config("smol-world", {"run.run_id": "bench"})
    r = cfg.rollout
    model, tokenizer = load_policy(src, args.dtype, args.device, home=home, policy_cfg=cfg.policy)
    batches = args.batch or [8, 16]
    questions = load_questions("world:eval", config=cfg)[: max(batches)]
    search = make_search(cfg.search, home=home, config=cfg)
    engine = TransformersEngine(cfg, model, tokenizer, search)
    base = engine.loop
    engine.loop = CapSearchLoop(tokenizer, search, base.budgets, system_prompt=base.system_prompt,
                                protocol=base.protocol)
    engine.loop.eos_ids = set(engine.eos_ids)
    split = Split(model)
    split.wrap(search, "search", "search")
    split.wrap(tokenizer, "decode", "detokenise")
    split.wrap(decoding_mod, "sample_next", "sampling")  # run_agent_batch looks it up there
    print(f"model {args.model} -> {src}: {n_parameters(model) / 1e6:.1f}M parameters on {args.device} ({args.dtype}), "
          f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    print(f"profile smol-world: temperature {r.temperature:g}, top_p {r.top_p:g}, {r.max_new_tokens_per_turn} new "
          f"tokens per turn, {r.max_turns} turns / {r.max_searches} searches, {r.max_response_tokens} response and "
          f"{r.max_context_tokens} context tokens, search {cfg.search.backend} on {cfg.search.corpus} top "
          f"{cfg.search.top_k}, {cfg.search.max_result_chars} characters; {args.repeats} interleaved repeats")
    print("fair: same model, dtype, threads and process; the same prompts (the world's held-out questions, "
          "SmolLM2's chat template, the loop's system prompt); the same sampling (temperature, top-p 1, no top-k); "
          "generate() runs max(agent tokens per row) steps with min_new_tokens = max_new_tokens and is credited "
          "with the agent rows' own token counts (it keeps finished rows in the batch, as a batch of generations "
          "of those lengths would)")
    rows = []
    for b in batches:
        qs = questions[:b]
        prompts = [build_prompt_ids(tokenizer, q.question, engine.loop.system_prompt) for q in qs]
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
        att = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            att[i, width - len(p):] = 1
        ids, att = ids.to(args.device), att.to(args.device)

        def gen(n: int, seed: int):
            torch.manual_seed(seed)
            with torch.no_grad():
                return model.generate(input_ids=ids, attention_mask=att, max_new_tokens=n, min_new_tokens=n,  # noqa: B023
                                      do_sample=True, temperature=r.temperature, top_p=1.0, top_k=0,
                                      pad_token_id=tokenizer.pad_token_id)

        engine.generate_groups(qs, k=1, seed=99, step=0)  # warm-up (allocator, kernels, BM25 index)
        gen(8, 99)
        split.take()
        reps = []
        for rep in range(args.repeats):
            t0 = time.perf_counter()
            trajs = engine.generate_groups(qs, k=1, seed=rep, step=0)
            agent_s = time.perf_counter() - t0
            a_split, a_calls = split.take()
            gen_tokens = [sum(t.loss_mask) for t in trajs]
            n_new = max(gen_tokens)
            t0 = time.perf_counter()
            out = gen(n_new, rep)
            ref_s = time.perf_counter() - t0
            g_split, g_calls = split.take()
            assert out.shape[1] - width == n_new
            rep_row = dict(agent_s=agent_s, ref_s=ref_s, tokens=sum(gen_tokens), n_new=n_new, a=a_split, g=g_split,
                           a_calls=a_calls, g_calls=g_calls,
                           turns=statistics.mean(t.turns for t in trajs),
                           searches=statistics.mean(t.search_calls for t in trajs),
                           result=statistics.mean(len(t.loss_mask) - sum(t.loss_mask) for t in trajs),
                           prompt=statistics.mean(len(t.prompt_ids) for t in trajs),
                           finish=sorted({t.finish_reason for t in trajs}))
            reps.append(rep_row)
            print(f"  batch {b} repeat {rep}: agent loop {rep_row['tokens'] / agent_s:6.1f} tok/s ({rep_row['tokens']} "
                  f"tokens in {agent_s:.1f} s; {rep_row['turns']:.1f} turns, {rep_row['searches']:.1f} searches, "
                  f"{rep_row['result']:.0f} result tokens per trajectory) | generate() "
                  f"{rep_row['tokens'] / ref_s:6.1f} tok/s ({n_new} steps x {b} rows in {ref_s:.1f} s); "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
        rows.append((b, reps))

    print()
    head = (f"{'batch':>5} {'path':<19} {'tokens':>6} {'wall s':>7} {'tok/s':>6} {'ratio':>5} {'repeats':>9} | "
            + " ".join(f"{k:>11}" for k in SPLIT_KEYS) + f" {'other':>10} | {'ms/decode step':>14}")
    print(head)
    print("-" * len(head))
    for b, reps in rows:
        tokens = sum(x["tokens"] for x in reps)
        per_rep = [x["ref_s"] / x["agent_s"] for x in reps]  # same tokens: the ratio of tok/s is that of times
        for name, wall_key, sp_key, calls_key, extra in (
                ("agent loop (arbor)", "agent_s", "a", "a_calls",
                 f"{sum(x['ref_s'] for x in reps) / sum(x['agent_s'] for x in reps):5.2f} "
                 f"{min(per_rep):4.2f}-{max(per_rep):4.2f}"),
                ("generate() (HF)", "ref_s", "g", "g_calls", f"{'':>5} {'':>9}")):
            wall = sum(x[wall_key] for x in reps)
            parts = [sum(x[sp_key].get(k, 0.0) for x in reps) for k in SPLIT_KEYS]
            steps = sum(x[calls_key].get("decode fwd", 0) for x in reps)
            print(f"{b:>5} {name:<19} {tokens:>6} {wall:>7.2f} {tokens / wall:>6.1f} {extra} | "
                  + " ".join(f"{v:>6.2f} {v / wall:>4.0%}" for v in parts)
                  + f" {wall - sum(parts):>5.2f} {(wall - sum(parts)) / wall:>4.0%} | "
                  f"{1000 * parts[0] / max(steps, 1):>6.1f} x {steps / len(reps):>4.0f}")
        raw = sum(x["n_new"] * b for x in reps) / sum(x["ref_s"] for x in reps)
        print(f"{'':>5} {'':<19} agent: {statistics.mean(x['turns'] for x in reps):.1f} turns, "
              f"{statistics.mean(x['searches'] for x in reps):.1f} searches, "
              f"{statistics.mean(x['result'] for x in reps):.0f} result tokens, "
              f"{statistics.mean(x['prompt'] for x in reps):.0f} prompt tokens, "
              f"{tokens / len(reps) / b:.0f} generated tokens per trajectory (longest "
              f"{statistics.mean(x['n_new'] for x in reps):.0f}); finish {sorted({f for x in reps for f in x['finish']})}")
        print(f"{'':>5} {'':<19} generate() raw, every row x every step counted: {raw:.1f} tok/s; agent / raw "
              f"generate() = {tokens / sum(x['agent_s'] for x in reps) / raw:.2f} (per-token compute, no credit "
              "for rows that finish early)")
    print("over all repeats: tokens = generated (loss-mask 1) tokens of the agent rows, credited to both sides; "
          "wall = summed; ratio = agent tok/s / generate() tok/s (repeats: per-repeat range); split: seconds and "
          "share; other = wall minus the split (agent: Python bookkeeping, KV-cache merging, masks; generate(): "
          "its logits processors, sampling, stopping criteria, cache and input preparation); ms/decode step x "
          "decode steps per repeat")
    print(f"load average {os.getloadavg()[0]:.1f}; bench wall time {time.perf_counter() - t_all:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="50m")
    ap.add_argument("--batch", type=int, nargs="+", default=None, help="batch size (default 16; --model: 8 16)")
    ap.add_argument("--turn-tokens", type=int, default=64, help="mean tokens per turn to induce")
    ap.add_argument("--max-response", type=int, default=384)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave as is)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default=None, help="the real model: 'smollm2', a GGUF file or an HF directory")
    ap.add_argument("--home", default=str(ROOT / "bench" / "out" / "models-home"),
                    help="--model: where the converted model and the world's search index are kept")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model:
        model_main(args)
        return
    args.batch = args.batch[0] if args.batch else 16

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
