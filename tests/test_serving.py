"""GPU layout without GPUs: the `vllm serve` command a profile builds, and server supervision with a real process."""

from __future__ import annotations

import socket
import sys

import pytest

from arbor.config import load_config
from arbor.paths import vllm_command
from arbor.tasks.env.serving import LaunchSpec, ServerDied, Supervised, vllm_serve_spec


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_vllm_serve_command_for_profile() -> None:
    cfg = load_config("qwen3-8b", {"cluster.rollout_gpus": [0, 1], "cluster.train_gpus": [2, 3, 4, 5, 6, 7],
                                   "cluster.vllm_tensor_parallel": 1})
    spec = vllm_serve_spec(cfg, "/ckpt/step_000010/hf")
    a = spec.argv
    assert a[:3] == [vllm_command("vllm"), "serve", "/ckpt/step_000010/hf"]  # after make vllm-env: .venv-vllm's
    assert a[a.index("--data-parallel-size") + 1] == "2" and a[a.index("--tensor-parallel-size") + 1] == "1"
    assert a[a.index("--max-model-len") + 1] == "36864"
    assert "--weight-transfer-config" in a
    assert a[a.index("--served-model-name") + 1] == "Qwen/Qwen3-8B"  # the name rollouts request
    assert spec.env == {"CUDA_VISIBLE_DEVICES": "0,1", "VLLM_SERVER_DEV_MODE": "1"}
    assert spec.base_url.endswith(":8000/v1")
    own_env = load_config("qwen3-8b", {"cluster.vllm_executable": "/opt/vllm-env/bin/vllm"})
    assert vllm_serve_spec(own_env, "/m").argv[:2] == ["/opt/vllm-env/bin/vllm", "serve"]


def test_tensor_parallel_must_divide_rollout_gpus() -> None:
    cfg = load_config("qwen3-8b", {"cluster.rollout_gpus": [0, 1, 2], "cluster.vllm_tensor_parallel": 2})
    with pytest.raises(ValueError, match="vllm_tensor_parallel"):
        vllm_serve_spec(cfg, "m")


def test_supervised_server_restarts_after_death(tmp_path) -> None:
    port = _free_port()
    spec = LaunchSpec(argv=[sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                            "--directory", str(tmp_path)], health_url=f"http://127.0.0.1:{port}/")
    restarts: list[int] = []
    with Supervised(spec, startup_timeout_s=30, max_restarts=1, on_restart=restarts.append) as sup:
        assert sup.healthy() and not sup.ensure()  # healthy: nothing to do
        sup.proc.kill()
        sup.proc.wait()
        assert sup.ensure() and restarts == [1] and sup.healthy()
        sup.proc.kill()
        sup.proc.wait()
        with pytest.raises(ServerDied, match="giving up"):
            sup.ensure()


def test_server_that_exits_during_startup_is_reported(tmp_path) -> None:
    spec = LaunchSpec(argv=[sys.executable, "-c", "raise SystemExit(3)"], health_url="http://127.0.0.1:9/")
    with pytest.raises(ServerDied, match="exited with 3"):
        Supervised(spec, startup_timeout_s=30).start()


def _http_server(tmp_path) -> LaunchSpec:
    port = _free_port()
    return LaunchSpec(argv=[sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                            "--directory", str(tmp_path)], health_url=f"http://127.0.0.1:{port}/",
                      base_url=f"http://user:secret@127.0.0.1:{port}/v1")


def _first(deaths: list[str], within_s: float) -> str | None:
    """The first death reported within ``within_s`` (polled: the watch reports from its own thread)."""
    import time

    deadline = time.monotonic() + within_s
    while not deaths and time.monotonic() < deadline:
        time.sleep(0.05)
    return deaths[0] if deaths else None


def test_a_watched_server_that_dies_is_named_and_a_planned_restart_is_not(tmp_path) -> None:
    """``Supervised.watch`` reports a server's exit (pid and status) once; ``restart_on`` and ``stop`` are
    no death."""
    spec = _http_server(tmp_path)
    deaths: list[str] = []
    with Supervised(spec, startup_timeout_s=30) as sup:
        sup.watch("vLLM's server", deaths.append, every_s=0.05)
        sup.restart_on(spec)  # the save-and-restart weight sync: the old process exits, planned
        assert _first(deaths, 0.5) is None
        assert sup.proc is not None
        pid = sup.proc.pid
        sup.proc.kill()
        assert _first(deaths, 5.0) == f"vLLM's server (pid {pid}) exited with status -9"
    spec2 = _http_server(tmp_path)
    quiet: list[str] = []
    with Supervised(spec2, startup_timeout_s=30) as sup:
        sup.watch("x", quiet.append, every_s=0.05)
    assert _first(quiet, 0.5) is None  # stopped by its owner


def test_a_server_someone_else_started_is_watched_through_its_port(tmp_path) -> None:
    """``arbor.runtime.liveness`` calls a server gone once it refused connections for ``dead_after_s``, naming
    its URL without the credentials in it; a live one is left alone."""
    from arbor.runtime.liveness import shown, watch_endpoint

    spec = _http_server(tmp_path)
    deaths: list[str] = []
    with Supervised(spec, startup_timeout_s=30) as sup:
        watch = watch_endpoint("the judge server", spec.base_url, deaths.append, every_s=0.05, dead_after_s=0.5)
        assert _first(deaths, 1.0) is None
        assert sup.proc is not None
        sup.proc.kill()
        got = _first(deaths, 5.0)
        watch.stop()
    url = shown(spec.base_url)
    assert "secret" not in url and url == spec.base_url.replace("user:secret@", "")
    assert got == f"the judge server at {url} stopped accepting connections (connection refused for 0 s)" or \
        got == f"the judge server at {url} stopped accepting connections (connection refused for 1 s)", got


def test_the_cpu_launch_is_eager_bf16_with_its_kv_cache_and_ignores_the_checkpoints_sampling_defaults() -> None:
    """Without rollout GPUs (vLLM's CPU build): --enforce-eager, bf16, VLLM_CPU_KVCACHE_SPACE; always
    --generation-config vllm (vllm/config/model.py::get_diff_sampling_param, 0.32.0 lines 1847-1892: otherwise the
    checkpoint's generation_config.json sets min_p / repetition_penalty under arbor's processed log-probs); the NCCL
    transfer config only for nccl sync."""
    cpu = vllm_serve_spec(load_config("smol-vllm"), "/ckpt")
    a = cpu.argv
    assert a[a.index("--generation-config") + 1] == "vllm" and "--enforce-eager" in a
    assert a[a.index("--dtype") + 1] == "bfloat16" and "--weight-transfer-config" not in a
    assert cpu.env == {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "2"}
    # no partial prefills on the CPU (a seeded one kills the engine: test_vllm_real), a step budget that holds a
    # whole context
    assert "--no-enable-chunked-prefill" in a and a[a.index("--max-num-batched-tokens") + 1] == "2048"
    long = vllm_serve_spec(load_config("smol-vllm", {"rollout.max_context_tokens": 4096}), "/ckpt").argv
    assert long[long.index("--max-num-batched-tokens") + 1] == "4096"
    gpu = vllm_serve_spec(load_config("qwen3-8b"), "/ckpt").argv
    assert gpu[gpu.index("--generation-config") + 1] == "vllm" and "--enforce-eager" not in gpu
    assert "--no-enable-chunked-prefill" not in gpu and "--max-num-batched-tokens" not in gpu
    assert "--weight-transfer-config" in gpu


def test_stopping_a_server_ends_its_whole_process_group(tmp_path) -> None:
    """`vllm serve` runs engine cores and workers (and, with data parallelism, more API servers) as children: a
    restart or a stop that ends only the parent leaves them holding memory. Here the child ignores SIGTERM."""
    import os
    import subprocess

    port = _free_port()
    child = tmp_path / "child.pid"
    script = (f"import subprocess, sys, http.server, socketserver\n"
              f"c = subprocess.Popen(['sh', '-c', 'trap \"\" TERM; while :; do sleep 0.1; done'])\n"
              f"open({str(child)!r}, 'w').write(str(c.pid))\n"
              f"http.server.test(HandlerClass=http.server.SimpleHTTPRequestHandler, port={port}, bind='127.0.0.1')\n")
    spec = LaunchSpec(argv=[sys.executable, "-c", script], health_url=f"http://127.0.0.1:{port}/")
    sup = Supervised(spec, startup_timeout_s=30)
    sup.start()
    pgid = sup.proc.pid
    sup.stop()
    try:
        os.killpg(pgid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    if alive:  # leave nothing behind on the old code either
        subprocess.run(["kill", "-9", "--", f"-{pgid}"], check=False)
    assert not alive, f"process {child.read_text()} of the server's group survived stop()"
