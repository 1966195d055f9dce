"""The GPUs and the vLLM server a profile places its work on: how many GPUs are here, vLLM's version, what the
weight sync needs, and the line that says which sync a run uses."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from arbor.config import ArborConfig, ClusterConfig, RolloutConfig


def _gpu_count() -> int:
    """CUDA devices this process may use. Read from the NVIDIA driver (``/proc/driver/nvidia/gpus``) and
    ``CUDA_VISIBLE_DEVICES`` without importing torch (seconds); torch only where the driver's tools exist but that
    folder is hidden; none where there is no NVIDIA driver at all."""
    gpus = Path("/proc/driver/nvidia/gpus")
    if gpus.is_dir():
        n = sum(1 for _ in gpus.iterdir())
    elif shutil.which("nvidia-smi") is None:
        return 0
    else:
        try:
            import torch

            return torch.cuda.device_count()  # applies CUDA_VISIBLE_DEVICES itself
        except Exception:  # noqa: BLE001
            return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # CUDA stops at the first invalid entry ("" or "-1": no device)
        ids = []
        for d in visible.split(","):
            if not d.strip() or d.strip().startswith("-"):
                break
            ids.append(d)
        n = min(n, len(ids))
    return n


def vllm_version(executable: str, timeout_s: float = 300.0) -> str:
    """What ``EXECUTABLE --version`` prints (vLLM 0.33: its installed distribution's version, argparse's version
    action in ``vllm/entrypoints/cli/main.py``); a failure is reported in the string."""
    import subprocess

    try:
        out = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"<`{executable} --version` failed: {type(e).__name__}>"
    text = (out.stdout.strip() or out.stderr.strip()).splitlines()
    if out.returncode != 0:
        return f"<`{executable} --version` exited {out.returncode}>"
    return text[-1].strip() if text else f"<`{executable} --version` printed nothing>"


def vllm_missing_message() -> str:
    """One line for a profile whose ``cluster.vllm_executable`` is ``vllm`` where neither PATH nor the checkout's
    ``.venv-vllm`` has one: the command that builds it (then nothing is set), else the one setting to add."""
    from arbor.paths import PROJECT_ROOT, VLLM_ENV

    if (PROJECT_ROOT / "Makefile").is_file():  # a checkout: make vllm-env builds .venv-vllm, found from then on
        return (f"cluster.vllm_executable: no `vllm` on PATH and no {VLLM_ENV / 'bin' / 'vllm'}: run `make vllm-env` "
                f"in {PROJECT_ROOT} (nothing to set afterwards), or set cluster.vllm_executable=/absolute/path/to/"
                "bin/vllm (vLLM's own environment; docs/gpu.md)")
    return ("cluster.vllm_executable: no `vllm` on PATH: install vLLM in an environment of its own and set "
            "cluster.vllm_executable=/absolute/path/to/bin/vllm (docs/gpu.md)")


def vllm_version_problems(executable: str, *, cpu: bool = False, weight_sync: str = "nccl",
                          gpus_missing: bool = False) -> list[str]:
    """A vLLM arbor does not speak is refused before anything starts, naming both versions. On GPUs that is vLLM
    0.33.x; without rollout GPUs (``cpu``) also vLLM's CPU build 0.32.x (version ``0.32.0+cpu`` through
    ``make vllm-env``'s launcher), which has no NCCL: it takes ``reload`` or ``restart`` sync. Where this machine
    lacks the profile's GPUs (``gpus_missing``, refused apart) the CPU build is what ``make vllm-env`` installs
    here, and 0.33 what it installs on the GPU node: not refused a second time."""
    from arbor.config.cluster import VLLM_CPU_PINNED, VLLM_CPU_SERIES, VLLM_PINNED, VLLM_SERIES

    got = vllm_version(executable)
    release, _, local = got.partition("+")
    if release.startswith(VLLM_SERIES + "."):
        return []
    if gpus_missing and release.startswith(VLLM_CPU_SERIES + ".") and local.startswith("cpu"):
        return []
    if cpu and release.startswith(VLLM_CPU_SERIES + ".") and local.startswith("cpu"):
        if weight_sync == "nccl":
            return [f"cluster.weight_sync=nccl: {executable!r} is vLLM's CPU build {got}, which has no NCCL (its "
                    "transfer init answers 500 \"Cannot access accelerator device\"): set cluster.weight_sync=reload "
                    "(or restart)"]
        return []
    cpu_too = f" or, without rollout GPUs, vLLM's CPU build {VLLM_CPU_PINNED}+cpu" if cpu else ""
    return [f"cluster.vllm_executable: {executable!r} is vLLM {got}; arbor speaks vLLM {VLLM_SERIES}.x (pinned "
            f"{VLLM_PINNED}: served model name, RL routes, weight transfer){cpu_too}, so install vllm=={VLLM_PINNED} "
            "(make vllm-env) or point cluster.vllm_executable at it"]


def weight_sync_problems(cluster: ClusterConfig, torch_version: str | None = None) -> list[str]:
    """What the chosen ``cluster.weight_sync`` needs that is missing here."""
    from arbor.config.cluster import VLLM_PINNED, VLLM_TORCH

    c = cluster
    if c.weight_sync == "reload":
        return []  # dev-mode routes only: arbor's launch sets VLLM_SERVER_DEV_MODE, an external server needs it too
    if c.weight_sync == "restart":
        if not c.manage_vllm:
            return ["cluster.weight_sync=restart restarts the `vllm serve` arbor launches: set cluster.manage_vllm=true "
                    "(or cluster.weight_sync=nccl for an external server started with VLLM_SERVER_DEV_MODE=1)"]
        return []
    if torch_version is None:
        import importlib.metadata  # not `import torch`: preflight stays fast on a box without GPUs

        torch_version = importlib.metadata.version("torch")
    if torch_version.split("+")[0] != VLLM_TORCH:
        return [f"cluster.weight_sync=nccl: the trainer's torch is {torch_version} but vLLM {VLLM_PINNED} pins torch=="
                f"{VLLM_TORCH}; one NCCL group needs one NCCL build on both sides: install torch {VLLM_TORCH} for "
                "the trainer (make setup TORCH_SPEC=..., docs/gpu.md) or set cluster.weight_sync=restart"]
    return []


def store_port_problems(cfg: ArborConfig) -> list[str]:
    """``cluster.weight_sync=nccl``: the trainer's transfer TCPStore listens on ``cluster.vllm_port + 1``
    (``tasks/training/trainer_service.py``); an endpoint of this profile on that port of this machine would refuse
    to start, or be answered by the store."""
    from urllib.parse import urlparse

    c = cfg.cluster
    if cfg.rollout.engine != "openai" or c.weight_sync != "nccl":
        return []
    port = c.vllm_port + 1

    def urls(node: Any, where: str) -> list[tuple[str, str]]:
        if isinstance(node, dict):
            return [u for k, v in node.items() for u in urls(v, f"{where}.{k}" if where else str(k))]
        if isinstance(node, list):
            return [u for i, v in enumerate(node) for u in urls(v, f"{where}[{i}]")]
        if isinstance(node, str) and node.startswith(("http://", "https://")):
            return [(where, node)]
        return []

    clashes = []
    for where, url in urls(cfg.model_dump(), ""):
        u = urlparse(url)
        if u.port == port and u.hostname in ("127.0.0.1", "localhost", "0.0.0.0", "::1"):
            clashes.append(f"{where}={url}")
    if not clashes:
        return []
    return [f"cluster.vllm_port={c.vllm_port}: the NCCL transfer's TCPStore takes port {port} (vllm_port + 1), which "
            f"{', '.join(clashes)} also uses: move that server or cluster.vllm_port"]


def weight_sync_plan(cluster: ClusterConfig, rollout: RolloutConfig) -> str:
    """One line: how new weights reach the rollout engine in this run, and why."""
    c = cluster
    if rollout.engine != "openai":
        return "weight sync: in-process copy into the transformers rollout engine (rollout.engine=transformers)"
    if c.weight_sync == "reload":
        return ("weight sync: save hf/ and reload it in place each step (cluster.weight_sync=reload: /pause?mode=keep, "
                "/collective_rpc reload_weights, weight_version confirmed, prefix cache reset, /resume; a failed "
                "reload restores the last good weights" + (", else restarts the server" if c.manage_vllm else "")
                + ")")
    if c.weight_sync == "restart":
        return ("weight sync: save hf/ and restart `vllm serve` on it each step (cluster.weight_sync=restart: needs "
                "nothing but `vllm serve`; costs a model load per step)")
    return ("weight sync: NCCL push over vLLM 0.33's RL routes (cluster.weight_sync=nccl: the trainer's rank 0 joins "
            "the server's workers without importing vLLM; start -> update -> finish, weight_version confirmed, prefix "
            f"cache reset; packed={c.sync_packed}, {c.sync_buffer_mb} MiB chunks)")
