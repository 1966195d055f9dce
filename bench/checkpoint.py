"""How long a training step waits for its checkpoint, before and after the background writer.

    python bench/checkpoint.py [--hidden 512 --layers 8 --vocab 32000] [--steps 2] [--threads 1]

A Qwen3-architecture model with random weights, ``Trainer`` under the tiny-cpu profile (ZeRO-2, fp32, AdamW), small
batches. Per mode, after a warm-up step:
- ``sync`` (``checkpoint.async_save: false``, today's path): the step waits for the whole save (ds/ + hf/ written,
  committed);
- ``async``: the step waits for the host copy only; the next step then runs while the writer writes (its time
  against a step alone), and a save right after that step waits for the first save's write (at most one in flight:
  ``checkpoint.every: 1`` with a step shorter than the write), and one more save back to back (the worst case).
Prints one line per figure; every save is checked to be committed.
"""

from __future__ import annotations

import argparse
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
from arbor.tasks.training import checkpoint as ckpt  # noqa: E402
from arbor.tasks.training.checkpoint_async import in_flight  # noqa: E402
from arbor.tasks.training.train import Trainer  # noqa: E402
from arbor.tasks.training.update import policy_update  # noqa: E402
from arbor.types import Trajectory  # noqa: E402


def make_batch(vocab: int, version: int, seed: int, n: int = 8, prompt: int = 32, response: int = 32) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        resp = torch.randint(1, vocab, (response,), generator=g).tolist()
        out.append(Trajectory(
            run_id="b", step=seed, group=i // 4, sample=i % 4, question_id=f"q{i // 4}", question="?", golds=["a"],
            prompt_ids=torch.randint(1, vocab, (prompt,), generator=g).tolist(), response_ids=resp,
            loss_mask=[1] * response, rollout_logprobs=[-1.0] * response, base_reward=float(i % 2),
            shaped_reward=float(i % 2), policy_version=version))
    return out


def timed(fn, *args, **kw) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    return time.perf_counter() - t0, out


def run(mode: str, model_dir: Path, home: Path, vocab: int) -> dict[str, float]:
    cfg = load_config("tiny-cpu", {"run.run_id": f"bench-{mode}", "run.steps": 100, "train.lr": 1e-4,
                                   "checkpoint.async_save": mode == "async", "checkpoint.keep_last": 2})
    tr = Trainer(cfg, model_dir, home)

    def step(s: int) -> float:
        batch = make_batch(vocab, tr.policy_version, s)
        return timed(tr.train_step, policy_update(batch, s, cfg.train, cfg.run.overlap), s)[0]

    step(1)  # warm-up
    alone = step(2)
    out = dict(step_alone_s=alone)
    if mode == "sync":
        out["save_wait_s"] = timed(tr.maybe_save, 2)[0]
    else:
        out["save_wait_s"] = timed(tr.maybe_save, 2)[0]
        out["host_copy_gib"] = (tr.save_timing or {}).get("snapshot_bytes", 0.0) / 2**30
        pending = in_flight(tr.ckpt_root)
        out["step_with_writer_s"] = step(3)
        out["writer_busy_after_step"] = float(pending is not None and not pending.done.is_set())
        out["second_save_wait_s"] = timed(tr.maybe_save, 3)[0]  # waits for step 2's write, then copies
        out["second_save_for_first_s"] = (tr.save_timing or {}).get("wait_s", 0.0)
        out["write_s"] = (tr.save_timing or {}).get("write_s", 0.0)
        tr.save_checkpoint(3, wait=False)  # back to back, no step between: waits for nearly the whole write
        out["back_to_back_wait_s"] = (tr.save_timing or {}).get("wait_s", 0.0)
        out["finish_s"] = tr.finish_save()
    steps = ckpt.complete_steps(tr.ckpt_root)
    assert steps[-1] == (2 if mode == "sync" else 3), steps
    out["size_gib"] = sum(p.stat().st_size for p in ckpt.step_dir(tr.ckpt_root, steps[-1]).rglob("*")
                          if p.is_file()) / 2**30
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="arbor-bench-ckpt-") as d:
        root = Path(d)
        torch.manual_seed(0)
        cfg = Qwen3Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                          num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=4,
                          head_dim=args.hidden // 8, max_position_embeddings=512, tie_word_embeddings=True)
        model = Qwen3ForCausalLM(cfg)
        n = sum(p.numel() for p in model.parameters())
        model.save_pretrained(root / "model")
        del model
        print(f"model: {n / 1e6:.1f}M parameters (fp32), ZeRO-2, AdamW; {args.threads} thread(s)")
        for mode in ("sync", "async"):
            r = run(mode, root / "model", root / mode, args.vocab)
            print(f"{mode}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
