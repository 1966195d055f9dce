"""Rollout serving on GPUs: build the `vllm serve` command for a profile and supervise the server process.

Layout (paper §4.1, one node of 8 GPUs): ``cluster.rollout_gpus`` run `vllm serve` (tensor parallel across them),
``cluster.train_gpus`` run the DeepSpeed trainer (``tasks.training.trainer_service``). The flow starts the server, waits
for ``/health``, points the ``openai`` rollout engine at it, and restarts it if it dies (``Supervised``).
The same supervision code drives any server command; CI exercises it with the CPU completions server.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from arbor.config import ArborConfig, PolicyConfig, RolloutConfig
from arbor.paths import vllm_command
from arbor.runtime.liveness import Watch, watch_process


@dataclass(frozen=True)
class LaunchSpec:
    """A command, its environment additions, and the URL that answers 200 when it is ready."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    health_url: str = ""
    base_url: str = ""


def served_model_name(rollout: RolloutConfig, policy: PolicyConfig) -> str:
    """The one name the server is launched under and every rollout request names: ``rollout.served_model``, else
    ``policy.model``. vLLM 0.33 serves the model path unless ``--served-model-name`` is given
    (``vllm/entrypoints/launchers/api_server/app_state.py``) and answers 404 to any other name
    (``vllm/entrypoints/serve/engine/serving.py::_check_model``)."""
    return rollout.served_model or policy.model


def vllm_serve_spec(cfg: ArborConfig, model_path: str) -> LaunchSpec:
    """`vllm serve` for the rollout GPUs (vLLM 0.33), or for the CPU when ``cluster.rollout_gpus`` is empty (vLLM's
    CPU build 0.32, ``make vllm-env``), started as ``vllm_command`` finds it (``vllm`` not on PATH: the checkout's
    ``.venv-vllm``): served under ``served_model_name``, bound to 127.0.0.1, with the RL and dev
    routes on (``VLLM_SERVER_DEV_MODE=1``: they are registered only then,
    ``vllm/entrypoints/launchers/api_server/routers.py``; see docs/gpu.md for what that exposes).

    ``--generation-config vllm`` always: otherwise vLLM applies the checkpoint's ``generation_config.json``
    (``repetition_penalty``, ``min_p``, ``top_k``, ...) as sampling defaults, and with ``processed_logprobs`` the
    returned log-probs, and so the importance weights, would be those of a distribution arbor never asked for
    (``vllm/config/model.py::get_diff_sampling_param``). On the CPU: ``--enforce-eager`` (compiling costs 100-145 s
    of start on two cores, eager 33-41 s), bf16 weights, a KV cache of ``cluster.vllm_cpu_kvcache_gib``, and no
    chunked prefill (below)."""
    c = cfg.cluster
    tp = c.vllm_tensor_parallel
    if c.rollout_gpus and len(c.rollout_gpus) % tp:
        raise ValueError(f"cluster.vllm_tensor_parallel={tp} does not divide {len(c.rollout_gpus)} rollout GPUs")
    dp = max(1, len(c.rollout_gpus) // tp)
    cpu = not c.rollout_gpus
    dtype = "bfloat16" if cpu or cfg.policy.dtype == "bfloat16" else cfg.policy.dtype
    argv = [
        vllm_command(c.vllm_executable), "serve", model_path,
        "--served-model-name", served_model_name(cfg.rollout, cfg.policy),
        "--host", "127.0.0.1", "--port", str(c.vllm_port),
        "--tensor-parallel-size", str(tp),
        "--data-parallel-size", str(dp),
        "--max-model-len", str(cfg.rollout.max_context_tokens),
        "--dtype", dtype,
        "--seed", str(cfg.run.seed),
        "--enable-prefix-caching",
        "--logprobs-mode", "processed_logprobs",  # log-probs of the distribution actually sampled (TIS)
        "--generation-config", "vllm",  # the request's sampling settings, not the checkpoint's defaults
    ]
    if c.weight_sync == "nccl":
        argv += ["--weight-transfer-config", '{"backend": "nccl"}']
    if cpu:
        # no partial prefills on the CPU: for a seeded request whose prefill was cut this step, vLLM rewinds its
        # sampler's generator (`v1/worker/gpu_model_runner.py:3494-3502` of the 0.32.0 CPU wheel, `set_offset`),
        # which torch's CPU generator refuses ("CPU Generator does not use offset"), killing the engine: every
        # rollout request is seeded, and a batch's prefills pass the CPU's 2,048-token step budget at once. Without
        # chunking, a step must hold one whole prompt: the budget is at least the context.
        argv += ["--enforce-eager", "--no-enable-chunked-prefill",
                 "--max-num-batched-tokens", str(max(2048, cfg.rollout.max_context_tokens))]
    argv += c.vllm_extra_args
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    if c.rollout_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in c.rollout_gpus)
    else:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(c.vllm_cpu_kvcache_gib)
    base = f"http://127.0.0.1:{c.vllm_port}"
    return LaunchSpec(argv=argv, env=env, health_url=f"{base}/health", base_url=f"{base}/v1")


def llama_judge_spec(python: str, gguf: Path, *, port: int, alias: str, n_ctx: int = 8192,
                     threads: int = 1) -> LaunchSpec:
    """llama.cpp's OpenAI-compatible server (llama-cpp-python, in an environment of its own: ``make judge-env``)
    on a GGUF file, for a local, offline, real judge; ready when ``/v1/models`` answers.

    ``threads`` bounds both phases: decoding (``--n_threads``) and prompt prefill (``--n_threads_batch``, which
    llama-cpp-python otherwise sets to every core, so a one-thread judge took both cores from the policy for each
    prompt). Flash attention on: one 2,062-token prompt took 10 % less CPU with it (docs/decisions/a-faster-local-judge.md)."""
    argv = [python, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", str(n_ctx), "--model_alias", alias, "--n_threads", str(threads),
            "--n_threads_batch", str(threads), "--flash_attn", "true"]
    base = f"http://127.0.0.1:{port}/v1"
    # its OpenMP threads sleep when idle instead of spinning, leaving the cores to the policy between calls (on two
    # cores shared with a training process the judge decoded 0.7 tokens/s, against 14 alone)
    return LaunchSpec(argv=argv, health_url=f"{base}/models", base_url=base, env={"OMP_WAIT_POLICY": "PASSIVE"})


# llama.cpp's fast CPU matrix kernels (llamafile's sgemm, the AVX2 repacks) take Q8_0 and Q4_0 weights, not the
# shipped file's Q4_1, which prefill then multiplies through the generic dot products. Q8_0 holds each Q4_1 weight
# (a 4-bit level times a block scale, plus a block minimum) to within 0.56 of an 8-bit step (half a step of
# rounding, plus the fp16 block scale's error): the same model.
SERVED_FTYPE, SERVED_SUFFIX = 7, "Q8_0"  # LLAMA_FTYPE_MOSTLY_Q8_0 (llama.h)
_REQUANTIZE = ("import sys, llama_cpp; p = llama_cpp.llama_model_quantize_default_params(); p.ftype = int(sys.argv[3]);"
               " p.allow_requantize = True; p.nthread = 1;"
               " sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))")


def served_gguf(python: str, gguf: Path, home: Path) -> Path:
    """The shipped Q4_1 ``gguf`` requantized once to Q8_0 by llama.cpp's own quantizer (run in the judge's
    environment, ``python``), kept as ``home/models/<stem>-Q8_0-<sha12>.gguf``; about a second. A file already in
    Q8_0 or another layout is served as it is: this is for the shipped model only (``arbor judge serve``)."""
    from arbor.tasks.env.search import file_sha256

    out = home / "models" / f"{gguf.stem}-{SERVED_SUFFIX}-{file_sha256(gguf)[:12]}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    done = subprocess.run([python, "-c", _REQUANTIZE, str(gguf), str(tmp), str(SERVED_FTYPE)], capture_output=True,
                          text=True)
    if done.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"requantizing {gguf.name} to {SERVED_SUFFIX} with {python} failed ({done.returncode}): "
                           f"{last}")
    os.replace(tmp, out)  # a concurrent writer that finished first is replaced by identical bytes
    return out


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM the process group led by ``proc`` (started with ``start_new_session``), wait up to ``grace_s`` for
    the whole group to exit, then SIGKILL what is left; reaps ``proc``."""
    import signal

    pgid = proc.pid
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader, else it stays a zombie member of its group
            if not _group_alive(pgid):
                break
            time.sleep(0.05)
        else:
            continue
        break
    proc.wait()


class ServerDied(RuntimeError):
    pass


class Supervised:
    """Start a server process, wait until healthy, restart it (up to ``max_restarts``) when it dies."""

    def __init__(self, spec: LaunchSpec, *, startup_timeout_s: float = 900.0, max_restarts: int = 3,
                 log_path: str | None = None, on_restart: Callable[[int], None] | None = None) -> None:
        self.spec = spec
        self.startup_timeout_s = startup_timeout_s
        self.max_restarts = max_restarts
        self.log_path = log_path
        self.on_restart = on_restart
        self.restarts = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._retired: subprocess.Popen[bytes] | None = None  # the process ``stop()`` ended (not a death)
        self._watches: list[Watch] = []

    def watch(self, name: str, on_death: Callable[[str], None], every_s: float = 0.25) -> None:
        """Call ``on_death(phrase)`` once, from a daemon thread, if the server exits without ``stop()`` (a
        dead server ends the run naming it, ``arbor.runtime.stop.request``); a planned restart (``restart_on``) is no
        death. Replaces restarting (``ensure``) for a run that must not wait on a server that is gone."""
        self._watches.append(watch_process(name, lambda: self.proc, on_death,
                                           planned=lambda proc: proc is self._retired, every_s=every_s))

    def start(self) -> None:
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.spec.argv, env={**os.environ, **self.spec.env}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.wait_healthy()

    def healthy(self) -> bool:
        try:
            return httpx.get(self.spec.health_url, timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerDied(f"{self.spec.argv[0]} exited with {self.proc.returncode} during start-up")
            if self.healthy():
                return
            time.sleep(0.2)
        raise TimeoutError(f"{self.spec.health_url} not healthy after {self.startup_timeout_s:.0f} s")

    def ensure(self) -> bool:
        """Before each use: restart the server if it died. Returns True when a restart happened."""
        if self.proc is not None and self.proc.poll() is None and self.healthy():
            return False
        if self.restarts >= self.max_restarts:
            raise ServerDied(f"server died {self.restarts + 1} times; giving up")
        self.stop()
        self.restarts += 1
        if self.on_restart is not None:
            self.on_restart(self.restarts)
        self.start()
        return True

    def restart_on(self, spec: LaunchSpec) -> None:
        """Stop the server and start ``spec`` in its place (the save-and-restart weight sync); waits until healthy.
        Not counted against ``max_restarts`` (a planned restart, not a crash)."""
        self.stop()
        self.spec = spec
        self.start()

    def stop(self) -> None:
        """End the server and every process it started: the process group ``start`` made (``start_new_session``).
        `vllm serve` runs its engine cores, workers and, with data parallelism, further API servers as children
        that can outlive a parent killed alone and keep GPU memory; the group gets SIGTERM, then SIGKILL for any
        member still there after 10 s."""
        self._retired = self.proc
        if self.proc is not None:
            stop_group(self.proc)
        self.proc = None

    def __enter__(self) -> Supervised:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for w in self._watches:
            w.stop()
        self.stop()
