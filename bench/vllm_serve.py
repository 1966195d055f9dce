"""A real `vllm serve` against arbor's transformers engine on the same prompts, and seconds per weight sync by
``reload`` against ``restart`` (the acceptance).

    python bench/vllm_serve.py [--batch 16] [--k 1] [--repeats 3] [--syncs 3]

Needs ``.venv-vllm`` (``make vllm-env``: vLLM's CPU build where no GPU answers, vLLM 0.33 on a GPU machine). Run on
a quiet machine: the two sides run one after the other, each with every core (the server's engine binds its OpenMP
threads to the cores; the transformers engine uses torch's threads).

1. The server: arbor's own launch of the smol-vllm profile (``vllm_serve_spec``, ``Supervised``: bf16,
   ``--enforce-eager`` and a KV cache of ``cluster.vllm_cpu_kvcache_gib`` on the CPU) on SmolLM2-135M-Instruct.
   Its start is timed: it is what every ``restart`` sync pays again.
2. Rollouts: the agent loop of ``OpenAIEngine`` (async requests to ``/v1/completions``, ``rollout.concurrency`` in
   flight) and of ``TransformersEngine`` (batched KV-cache decoding in this process), on the world's held-out
   questions with the profile's rollout settings, the same seeds, one warm-up pass each, then ``--repeats``
   passes. The zero-shot model never writes ``</search>``, so both use ``bench/rollout.py``'s ``CapSearchLoop``: a
   turn that reaches the per-turn cap is a search for the question and its real ``<result>`` block is appended.
   tokens/s counts the generated (loss-mask 1) tokens of each side's own trajectories: the samplers differ, so
   lengths differ, and the ratio is of rates.
3. Weight syncs, alternating between the start weights and a copy with the final norm halved (so each sync
   changes what is served, checked by greedy log-probs after each): ``reload`` is ``ReloadSync.load`` (``/pause``,
   ``/collective_rpc reload_weights``, version set and read back, prefix-cache reset, ``/resume``); ``restart`` is
   what ``save_and_restart`` asks of the managed server (``Supervised.restart_on`` until healthy, then the version
   set and confirmed). Both start from an exported ``hf/`` folder; the export (``save_pretrained``, the same for
   both) is timed apart.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rollout import CapSearchLoop  # noqa: E402  (bench/rollout.py, this script's folder)

from arbor.config import load_config  # noqa: E402
from arbor.tasks.env.datasets import load_questions  # noqa: E402
from arbor.tasks.env.policy import load_policy, resolve_model  # noqa: E402
from arbor.tasks.env.rollout import OpenAIEngine, TransformersEngine  # noqa: E402
from arbor.tasks.env.search import make_search  # noqa: E402
from arbor.tasks.env.serving import Supervised, vllm_serve_spec  # noqa: E402
from arbor.tasks.training.trainer_service import free_port  # noqa: E402
from arbor.tasks.training.vllm_sync import VllmControl  # noqa: E402
from arbor.tasks.training.weight_sync import ReloadSync  # noqa: E402

VLLM = ROOT / ".venv-vllm" / "bin" / "vllm"


def cap_search(engine) -> None:
    """Swap the engine's loop for the bench's ``CapSearchLoop`` (same budgets, system prompt and protocol)."""
    base = engine.loop
    engine.loop = CapSearchLoop(engine.tokenizer, engine.search, base.budgets, system_prompt=base.system_prompt,
                                protocol=base.protocol)
    engine.loop.eos_ids = set(base.eos_ids)  # the transformers engine's adds the model's generation EOS ids


def rollout_rates(engine, questions, k: int, repeats: int, name: str) -> list[tuple[int, float]]:
    """(generated tokens, seconds) of each repeat after one warm-up pass."""
    engine.generate_groups(questions, k=k, seed=99, step=0)
    out = []
    for rep in range(repeats):
        t0 = time.perf_counter()
        trajs = engine.generate_groups(questions, k=k, seed=rep, step=0)
        dt = time.perf_counter() - t0
        tokens = sum(sum(t.loss_mask) for t in trajs)
        searches = statistics.mean(t.search_calls for t in trajs)
        print(f"  {name} repeat {rep}: {tokens} tokens in {dt:.2f} s = {tokens / dt:.1f} tok/s "
              f"({tokens / len(trajs):.0f} a trajectory, {searches:.1f} searches); load {os.getloadavg()[0]:.1f}",
              flush=True)
        out.append((tokens, dt))
    return out


def greedy_logprobs(base_url: str, prompt: list[int], served: str) -> list[float]:
    r = httpx.post(f"{base_url}/completions", timeout=120, json={
        "model": served, "prompt": prompt, "max_tokens": 4, "temperature": 0.0, "logprobs": 1,
        "return_tokens_as_token_ids": True})
    r.raise_for_status()
    return [float(x) for x in r.json()["choices"][0]["logprobs"]["token_logprobs"]]


def halved_copy(src: Path, dst: Path) -> Path:
    """``src`` with its final norm halved (the other files linked): served, it moves every log-prob."""
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).symlink_to(f.resolve())
    sd = load_file(str(src / "model.safetensors"))
    sd["model.norm.weight"] = sd["model.norm.weight"] * 0.5
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def spread(xs: list[float]) -> str:
    return f"{statistics.mean(xs):7.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=16, help="questions per pass")
    ap.add_argument("--k", type=int, default=1, help="trajectories per question")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--syncs", type=int, default=3, help="syncs of each kind")
    ap.add_argument("--home", default=str(ROOT / "bench" / "out" / "models-home"))
    args = ap.parse_args()
    if not VLLM.exists():
        sys.exit(f"{VLLM} is absent: `make vllm-env` installs vLLM (its CPU build where no GPU answers)")
    t_all = time.perf_counter()
    home = Path(args.home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    src = Path(resolve_model("smollm2", home))
    cfg = load_config("smol-vllm", {"run.run_id": "bench", "cluster.vllm_executable": str(VLLM),
                                    "cluster.vllm_port": free_port()})
    r = cfg.rollout
    questions = load_questions("world:eval", config=cfg)[: args.batch]
    search = make_search(cfg.search, home=home, config=cfg)
    print(f"SmolLM2-135M-Instruct ({src}); profile smol-vllm: temperature {r.temperature:g}, top_p {r.top_p:g}, "
          f"{r.max_new_tokens_per_turn} new tokens a turn, {r.max_turns} turns, {args.batch} questions x K "
          f"{args.k}, {args.repeats} repeats; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="vllm-bench-"))
    spec = vllm_serve_spec(cfg, str(src))
    server = Supervised(spec, startup_timeout_s=900, max_restarts=0, log_path=str(tmp / "vllm.log"))
    t0 = time.perf_counter()
    server.start()
    start_s = time.perf_counter() - t0
    print(f"server healthy in {start_s:.1f} s ({' '.join(spec.argv[1:])})", flush=True)
    try:
        model, tokenizer = load_policy(str(src), cfg.policy.dtype, "cpu", home=home, policy_cfg=cfg.policy)
        prompt = tokenizer("The capital of France is")["input_ids"]
        vllm_engine = OpenAIEngine(cfg, tokenizer, search, base_url=spec.base_url)
        served_name = vllm_engine.served_model
        cap_search(vllm_engine)
        vllm_runs = rollout_rates(vllm_engine, questions, args.k, args.repeats, "vllm serve")

        t0 = time.perf_counter()
        export = tmp / "export"
        model.save_pretrained(export, safe_serialization=True)
        tokenizer.save_pretrained(export)
        export_s = time.perf_counter() - t0
        halved = halved_copy(export, tmp / "halved")
        folders = [(halved, "halved"), (export, "start")]
        http = VllmControl(spec.base_url)
        start_lp = greedy_logprobs(spec.base_url, prompt, served_name)
        sync = ReloadSync(spec.base_url.removesuffix("/v1"))
        reload_s, restart_s = [], []
        version = 0
        for kind, times in (("reload", reload_s), ("restart", restart_s)):
            for i in range(args.syncs):  # halved, start, halved, ...: every sync changes the served weights
                folder, label = folders[i % 2]
                version += 1
                t0 = time.perf_counter()
                if kind == "reload":
                    sync.load(folder, version)
                else:
                    server.restart_on(vllm_serve_spec(cfg, str(folder)))
                    http.set_weight_version(str(version))
                    http.confirm_version(str(version))
                dt = time.perf_counter() - t0
                lp = greedy_logprobs(spec.base_url, prompt, served_name)
                moved = max(abs(a - b) for a, b in zip(lp, start_lp, strict=True)) > 1e-3
                if moved != (label == "halved"):
                    raise SystemExit(f"{kind} sync {i} to {label}: the served log-probs say otherwise ({lp} vs the "
                                     f"start's {start_lp})")
                times.append(dt)
                print(f"  {kind} sync {i} -> {label}: {dt:.2f} s (served log-probs checked)", flush=True)
    finally:
        server.stop()
    hf_engine = TransformersEngine(cfg, model, tokenizer, search)
    cap_search(hf_engine)
    hf_runs = rollout_rates(hf_engine, questions, args.k, args.repeats, "transformers")

    def rate(runs: list[tuple[int, float]]) -> float:
        return sum(t for t, _ in runs) / sum(s for _, s in runs)

    vr, hr = rate(vllm_runs), rate(hf_runs)
    per_rep = [(tv / sv) / (th / sh) for (tv, sv), (th, sh) in zip(vllm_runs, hf_runs, strict=True)]
    print()
    print(f"{'rollout engine':<44} {'tokens':>7} {'wall s':>7} {'tok/s':>7}")
    print("-" * 68)
    for name, runs in ((f"vllm serve (bf16, {cfg.rollout.concurrency} requests in flight)", vllm_runs),
                       (f"transformers engine ({cfg.policy.dtype}, {torch.get_num_threads()} threads)", hf_runs)):
        print(f"{name:<44} {sum(t for t, _ in runs):>7} {sum(s for _, s in runs):>7.2f} {rate(runs):>7.1f}")
    print(f"vllm / transformers tok/s: {vr / hr:.2f} (per repeat {min(per_rep):.2f}-{max(per_rep):.2f})")
    print()
    print(f"{'weight sync (SmolLM2-135M)':<44} {'s mean (min-max)':>22}")
    print("-" * 68)
    print(f"{'export hf/ (save_pretrained; both paths)':<44} {export_s:>7.2f}")
    print(f"{'reload (pause, reload_weights, resume)':<44} {spread(reload_s)}")
    print(f"{'restart (server restarted until healthy)':<44} {spread(restart_s)}")
    print(f"{'first server start':<44} {start_s:>7.2f}")
    print(f"restart / reload: {statistics.mean(restart_s) / statistics.mean(reload_s):.0f}x; "
          f"load average {os.getloadavg()[0]:.1f}; bench wall time {time.perf_counter() - t_all:.0f} s")


if __name__ == "__main__":
    main()
