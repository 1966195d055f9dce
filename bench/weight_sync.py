"""Seconds to push a policy's weights to `vllm serve`, both ways arbor can, on the CPU over gloo.

- ``nccl`` path: ``tasks.training.vllm_sync.VllmWeightSync`` (start -> update + packed broadcast -> finish ->
  weight_info -> prefix-cache reset) into ``tests/vllm_server.py`` (vLLM 0.33's contract) with one worker, in this
  process over a gloo group: the figure includes the receiver's unpacking on the same two cores.
- ``restart`` path: ``save_pretrained`` of ``hf/`` (safetensors), then ``Supervised.restart_on`` of the scripted
  server on it (a fresh Python + torch + safetensors load, until ``/health``) and, separately, the
  ``from_pretrained`` of that folder that any server start pays. A real `vllm serve` start adds its own engine
  start-up (CUDA graphs, KV cache profiling: tens of seconds), which this cannot measure.

Models are built from their configs with random bf16 weights (the transfer cost depends on sizes only):
SmolLM2-135M (Llama, 576 x 30, vocab 49152) and a Qwen3-0.6B-shaped model (1024 x 28, vocab 151936).

    python bench/weight_sync.py [--reps 3] [--models smollm2-135m,qwen3-0.6b]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = {
    "smollm2-135m": ("llama", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                                   tie_word_embeddings=True, max_position_embeddings=2048)),
    "qwen3-0.6b": ("qwen3", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                                 tie_word_embeddings=True, max_position_embeddings=4096)),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build(name: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    kind, kw = SHAPES[name]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **kw), dtype=torch.bfloat16)
    return model.eval()


def bench_nccl_path(sd: dict[str, torch.Tensor], reps: int, buffer_mb: int) -> dict[str, float]:
    from arbor.tasks.training.vllm_sync import GlooCommunicator, VllmWeightSync
    from tests.vllm_server import ScriptedVllm

    argv = ["vllm", "serve", "/bench", "--port", str(free_port()), "--weight-transfer-config", '{"backend": "nccl"}']
    with ScriptedVllm(argv, {"VLLM_SERVER_DEV_MODE": "1"},
                      weights={k: torch.zeros_like(v) for k, v in sd.items()}) as server:
        sync = VllmWeightSync(server.base_url, GlooCommunicator("127.0.0.1", free_port()), packed=True,
                              buffer_bytes=buffer_mb << 20, reset_backoff_s=0.0)
        t0 = time.perf_counter()
        sync.init()
        init_s = time.perf_counter() - t0
        times = [sync.push(lambda: iter(sd.items()), v).seconds for v in range(1, reps + 1)]
        assert all(torch.equal(server.weights[0][k], sd[k]) for k in sd)
        sync.close()
    return {"init_s": init_s, "push_s": statistics.median(times)}


def bench_restart_path(model: torch.nn.Module, reps: int) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    from arbor.tasks.env.serving import LaunchSpec, Supervised

    save, restart, load = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()

        def spec(path: Path) -> LaunchSpec:
            argv = [sys.executable, "-m", "tests.vllm_server", "serve", str(path), "--port", str(port)]
            base = f"http://127.0.0.1:{port}"
            return LaunchSpec(argv=argv, env={"VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": str(ROOT)},
                              health_url=f"{base}/health", base_url=f"{base}/v1")

        first = Path(tmp) / "v0"
        model.save_pretrained(first)
        server = Supervised(spec(first), startup_timeout_s=300)
        server.start()
        try:
            for v in range(1, reps + 1):
                path = Path(tmp) / f"v{v}"
                t0 = time.perf_counter()
                model.save_pretrained(path)  # safetensors, what export_hf writes
                t1 = time.perf_counter()
                server.restart_on(spec(path))
                t2 = time.perf_counter()
                AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
                t3 = time.perf_counter()
                save.append(t1 - t0)
                restart.append(t2 - t1)
                load.append(t3 - t2)
        finally:
            server.stop()
    return {"save_s": statistics.median(save), "restart_s": statistics.median(restart),
            "from_pretrained_s": statistics.median(load)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--models", default="smollm2-135m,qwen3-0.6b")
    ap.add_argument("--buffer-mb", type=int, default=256, help="packed chunk size (vLLM's default is 1024)")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of {args.reps}")
    print("| model | params | bf16 MB | nccl path: init s | push s | restart path: save hf/ s | restart s | "
          "from_pretrained s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        model = build(name)
        sd = {k: v.detach() for k, v in model.state_dict().items()}
        n = sum(v.numel() for k, v in sd.items() if k != "lm_head.weight")
        mb = sum(v.numel() * v.element_size() for v in sd.values()) / 2**20
        a = bench_nccl_path(sd, args.reps, args.buffer_mb)
        b = bench_restart_path(model, args.reps)
        print(f"| {name} | {n / 1e6:.0f}M | {mb:.0f} | {a['init_s']:.2f} | {a['push_s']:.2f} | {b['save_s']:.2f} | "
              f"{b['restart_s']:.2f} | {b['from_pretrained_s']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
