"""arbor against vLLM 0.33.0's real interface, without a GPU and without vLLM installed.

Two layers: (1) the facts in ``tests/data/vllm_0_33_contract.json``, each citing the sdist file and lines it came
from (re-read from the source when ``ARBOR_VLLM_SRC`` names an unpacked 0.33.0 sdist), checked against every request
arbor sends; (2) ``tests/vllm_server.py``, which reproduces 0.33's gating, phase order, validation and answers,
driven by arbor's own launch spec, rollout engine and weight-sync client over a real gloo group.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import re
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from arbor.config import load_config
from arbor.preflight import check
from arbor.runtime.liveness import DependencyStalled
from arbor.tasks.env.agent import GenRequest
from arbor.tasks.env.policy import build_tiny_policy, train_tokenizer
from arbor.tasks.env.rollout import OpenAIEngine, RolloutError
from arbor.tasks.env.serving import Supervised, vllm_serve_spec
from arbor.tasks.training.train import Trainer
from arbor.tasks.training.update import policy_update
from arbor.tasks.training.weight_sync import sync_policy
from arbor.types import Trajectory
from tests.vllm_server import CONTRACT, ScriptedVllm

ROOT = Path(__file__).resolve().parents[1]
# The names of the vLLM 0.33 contract are imported where they are used, so that against the code before it each test fails
# at its own first assertion rather than all at collection.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def qwen_cfg(**over: object):
    return load_config("qwen3-8b", {"cluster.vllm_port": free_port(), **over})


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(vocab_size=64, texts=iter(["search then answer"] * 4))


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory) -> Trainer:
    """arbor's real trainer (DeepSpeed on the CPU) on the tiny policy, one step trained (policy version 1)."""
    home = tmp_path_factory.mktemp("home")
    tiny = build_tiny_policy(home=home)
    cfg = load_config("tiny-cpu", {"run.run_id": "sync", "train.lr": 1e-3})
    tr = Trainer(cfg, tiny, home / "run")
    train_once(tr, cfg)
    return tr


def train_once(tr: Trainer, cfg) -> None:
    g = torch.Generator().manual_seed(tr.policy_version)
    trajs = [Trajectory(run_id="sync", step=tr.policy_version + 1, group=0, sample=s, question_id="q", question="?",
                        golds=["a"], prompt_ids=torch.randint(10, 200, (6,), generator=g).tolist(),
                        response_ids=torch.randint(10, 200, (8,), generator=g).tolist(), loss_mask=[1] * 8,
                        rollout_logprobs=[-9.0] * 8, base_reward=float(s % 2), policy_version=tr.policy_version)
             for s in range(4)]
    tr.train_step(policy_update(trajs, tr.policy_version + 1, cfg.train, cfg.run.overlap), tr.policy_version + 1)


def scripted(cfg, *, weights: dict[str, torch.Tensor], env: dict[str, str] | None = None, **kw) -> ScriptedVllm:
    spec = vllm_serve_spec(cfg, "/ckpt/step_000010/hf")
    server = ScriptedVllm(spec.argv, spec.env if env is None else env, weights=weights, **kw)
    return server


def zeros_like(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(v) for k, v in sd.items()}


def client(server: ScriptedVllm, **kw):
    from arbor.tasks.training.vllm_sync import GlooCommunicator, VllmWeightSync

    kw.setdefault("reset_backoff_s", 0.0)
    timeout = kw.pop("gloo_timeout_s", 30.0)
    return VllmWeightSync(server.base_url, GlooCommunicator("127.0.0.1", free_port(), timeout_s=timeout), **kw)


# ------------------------------------------------------------------------------------------- rollouts
def test_the_launch_serves_the_name_rollout_requests_name(tokenizer) -> None:
    """Problem 1 (404 on every rollout): vLLM serves the path unless --served-model-name is given."""
    cfg = qwen_cfg()
    spec = vllm_serve_spec(cfg, "/ckpt/step_000010/hf")
    with ScriptedVllm.from_spec(spec, weights={}) as server:
        assert server.served == [cfg.policy.model] == ["Qwen/Qwen3-8B"]
        engine = OpenAIEngine(cfg, tokenizer, search=None, base_url=spec.base_url)
        gens = engine.complete([GenRequest([1, 2, 3], 4, 0)], temperature=1.0, stop_strings=[])
        assert gens[0].token_ids == [7, 8, 9, 10]
        body = server.requests[-1][2]
        assert body["model"] == "Qwen/Qwen3-8B"
        assert set(body) <= set(CONTRACT["completion_request_fields"]["fields"])  # a renamed field fails here
        wrong = OpenAIEngine(cfg, tokenizer, search=None, base_url=spec.base_url, served_model="Qwen3-8B")
        with pytest.raises(RolloutError, match=r"does not serve model 'Qwen3-8B'.*--served-model-name Qwen3-8B"):
            wrong.complete([GenRequest([1], 2, 0)], temperature=1.0, stop_strings=[])


def test_a_503_while_paused_is_retried_after_resume(tokenizer, caplog: pytest.LogCaptureFixture) -> None:
    """vLLM 0.33 answers a generation request sent during ``/pause`` (abort or wait mode) with 503 until
    ``/resume`` (0.32 queued it): the rollout client retries it, saying why, and gets the completion once resumed.
    Earlier the first 503 ended the rollout (RolloutError)."""
    from arbor.tasks.training.vllm_sync import VllmControl

    cfg = qwen_cfg()
    spec = vllm_serve_spec(cfg, "/ckpt/step_000010/hf")
    with ScriptedVllm.from_spec(spec, weights={}) as server:
        http = VllmControl(server.base_url)
        http.pause("abort")
        assert http.call("GET", "/is_paused") == {"is_paused": True}

        def resume_once_refused() -> None:  # the trainer's /resume, after the server refused a request
            if server.refused.wait(60):
                http.resume()

        threading.Thread(target=resume_once_refused, daemon=True).start()
        engine = OpenAIEngine(cfg, tokenizer, search=None, base_url=spec.base_url)
        engine.pause_backoff_s = 0.01
        with caplog.at_level(logging.WARNING, logger="arbor.rollout"):
            gens = engine.complete([GenRequest([1, 2, 3], 4, 0)], temperature=1.0, stop_strings=[])
        assert gens[0].token_ids == [7, 8, 9, 10]
        assert server.refusals >= 1 and not http.call("GET", "/is_paused")["is_paused"]
        assert "HTTP 503" in caplog.text and "Generation is paused. Please retry after it resumes." in caplog.text


def test_a_server_left_paused_ends_the_rollout_within_its_stall_deadline(tokenizer) -> None:
    """Retries stop before ``rollout.stall_s`` has passed since the request was first sent; the run ends naming the
    server and the pause (a stall: stage retries are not spent on it)."""
    from arbor.tasks.training.vllm_sync import VllmControl

    cfg = qwen_cfg(**{"rollout.stall_s": 0.5})
    spec = vllm_serve_spec(cfg, "/ckpt/step_000010/hf")
    with ScriptedVllm.from_spec(spec, weights={}) as server:
        VllmControl(server.base_url).pause("wait")
        engine = OpenAIEngine(cfg, tokenizer, search=None, base_url=spec.base_url)
        engine.pause_backoff_s = 0.05
        t0 = time.monotonic()
        paused = r"answered HTTP 503 \(Generation is paused.*rollout\.stall_s=0\.5 s.*POST /resume"
        with pytest.raises(DependencyStalled, match=paused):
            engine.complete([GenRequest([1, 2, 3], 4, 0)], temperature=1.0, stop_strings=[])
        assert time.monotonic() - t0 < 0.5 + 5.0  # bounded by the deadline (slack for a loaded machine)
        assert 2 <= server.refusals < 20


def test_a_request_sent_during_a_keep_pause_waits_and_is_answered_after_resume(tokenizer) -> None:
    """``/pause?mode=keep`` (what arbor's reload sync sends) queues new requests in 0.32 and 0.33: no 503."""
    from arbor.tasks.training.vllm_sync import VllmControl

    cfg = qwen_cfg()
    spec = vllm_serve_spec(cfg, "/ckpt/step_000010/hf")
    with ScriptedVllm.from_spec(spec, weights={}) as server:
        http = VllmControl(server.base_url)
        http.pause("keep")
        engine = OpenAIEngine(cfg, tokenizer, search=None, base_url=spec.base_url)
        out: list[Any] = []
        t = threading.Thread(target=lambda: out.append(engine.complete([GenRequest([1], 2, 0)], temperature=1.0,
                                                                       stop_strings=[])), daemon=True)
        t.start()
        assert server.held.wait(60) and out == []
        http.resume()
        t.join(60)
        assert out[0][0].token_ids == [7, 8] and server.refusals == 0


def test_the_launch_turns_on_the_rl_routes_on_localhost_only() -> None:
    spec = vllm_serve_spec(qwen_cfg(), "/m")
    assert spec.env["VLLM_SERVER_DEV_MODE"] == "1"
    argv = spec.argv
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert json.loads(argv[argv.index("--weight-transfer-config") + 1]) == {"backend": "nccl"}


# ------------------------------------------------------------------------------------------- NCCL path (gloo)
@pytest.mark.parametrize(("packed", "workers"), [(True, 2), (False, 1)])
def test_sync_lands_bit_identical_weights_and_confirms_the_version(trainer: Trainer, packed: bool,
                                                                   workers: int) -> None:
    """start -> update (+ broadcast) -> finish(weight_version) -> weight_info -> reset, to every worker (DP 2)."""
    from arbor.tasks.training.weight_sync import push_state_dict

    sd = trainer.state_dict_for_sync()
    with scripted(qwen_cfg(), weights=zeros_like(sd), workers=workers) as server:
        sync = client(server, packed=packed, buffer_bytes=64 << 10)  # small chunks: several of them
        report = push_state_dict(sync, trainer)
        v = trainer.policy_version
        assert report is not None and report.version == str(v)
        for w in server.weights:
            assert all(torch.equal(w[k], sd[k]) for k in sd)
        routes = [(m, p) for m, p, _ in server.requests]
        assert routes == [("GET", "/get_world_size"), ("POST", "/init_weight_transfer_engine"),
                          ("POST", "/start_weight_update"), ("POST", "/update_weights"),
                          ("POST", "/finish_weight_update"), ("GET", "/weight_info"), ("POST", "/reset_prefix_cache")]
        body = {p: b for _, p, b in server.requests}
        init = body["/init_weight_transfer_engine"]["init_info"]
        assert set(init) <= set(CONTRACT["init_info"]["fields"]) and init["packed"] is packed
        assert init["world_size"] == 1 + workers and init["rank_offset"] == 1
        assert set(body["/update_weights"]["update_info"]) == set(CONTRACT["update_info"]["fields"])
        assert body["/finish_weight_update"] == {"weight_version": str(v)}
        assert server.weight_version == str(v)
        # the next step: no second init, the new weights land again
        train_once(trainer, trainer.cfg)
        sd2 = trainer.state_dict_for_sync()
        assert push_state_dict(sync, trainer).version == str(v + 1)  # type: ignore[union-attr]
        assert all(torch.equal(server.weights[0][k], sd2[k]) for k in sd2)
        assert [p for _, p, _ in server.requests].count("/init_weight_transfer_engine") == 1
        sync.close()


def test_a_sync_after_a_failed_one_reinitialises_the_transfer_on_the_same_store() -> None:
    """The error of a refused update promises a re-init on the next sync: it happens, on the one TCPStore this
    process holds on the transfer port. Earlier the re-init opened a second store on the port while the
    first was still held by the previous group: EADDRINUSE."""
    from arbor.tasks.training.vllm_sync import VllmSyncError

    sd = {"w": torch.arange(6.0).view(2, 3), "b": torch.ones(4)}
    # gloo_timeout_s: the first group's broadcast, which the server never received, is given up after it
    with scripted(qwen_cfg(), weights=zeros_like(sd), lose_session_after_start=True, gloo_timeout_s=3) as server:
        sync = client(server, packed=False, gloo_timeout_s=3)
        with pytest.raises(VllmSyncError, match=r"start_weight_update must be called.*re-init"):
            sync.push(lambda: iter(sd.items()), 1)
        assert not sync.ready
        server.lose_session_after_start = False  # the server is well again
        report = sync.push(lambda: iter(sd.items()), 2)
        assert report.version == "2" == server.weight_version
        assert all(torch.equal(server.weights[0][k], sd[k]) for k in sd)
        assert [p for _, p, _ in server.requests].count("/init_weight_transfer_engine") == 2
        sync.close()


class StandInNccl:
    """What ``NcclCommunicator`` uses of torch's ``ProcessGroupNCCL`` (the CPU build has none): like the real one it
    holds the store it is given, and rank 0's eager connect publishes a fresh 128-byte unique id under key "0"."""

    class Options:
        _timeout: Any = None

    def __init__(self, store: Any, rank: int, size: int, opts: Any) -> None:
        self.store = store

    def eager_connect_single_device(self, device: torch.device) -> None:
        self.store.set("0", os.urandom(128))

    def shutdown(self) -> None:
        self.store = None


def test_a_second_nccl_rendezvous_in_the_same_process_reuses_its_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real TCPStore on a free loopback port: a re-init (same communicator) and a second communicator of the same
    process rendezvous again on it, each reading its own group's unique id, never the previous one left in the
    store. Earlier the second rendezvous failed: the port was held by the first group's store."""
    import torch.distributed as dist

    from arbor.tasks.training.vllm_sync import NcclCommunicator

    monkeypatch.setattr(dist, "ProcessGroupNCCL", StandInNccl, raising=False)
    port = free_port()
    comm = NcclCommunicator("127.0.0.1", port, torch.device("cpu"), timeout_s=5)
    ids = [comm.rendezvous(2)["nccl_unique_id_b64"]]
    first_group = comm.pg
    ids.append(comm.rendezvous(2)["nccl_unique_id_b64"])  # the re-init after a failed sync
    other = NcclCommunicator("127.0.0.1", port, torch.device("cpu"), timeout_s=5)
    ids.append(other.rendezvous(2)["nccl_unique_id_b64"])
    assert len(set(ids)) == 3
    assert first_group.store is comm.pg.store is other.pg.store  # one store per process and port
    comm.close()
    other.close()


def test_without_dev_mode_the_sync_says_to_set_it(trainer: Trainer) -> None:
    from arbor.tasks.training.vllm_sync import VllmSyncError
    from arbor.tasks.training.weight_sync import push_state_dict

    sd = trainer.state_dict_for_sync()
    with scripted(qwen_cfg(), weights=zeros_like(sd), env={}) as server:  # launched without VLLM_SERVER_DEV_MODE
        with pytest.raises(VllmSyncError, match=r"GET /get_world_size with HTTP 404.*VLLM_SERVER_DEV_MODE=1"):
            push_state_dict(client(server), trainer)


def test_an_update_the_server_refuses_ends_the_sync_with_what_to_fix(trainer: Trainer) -> None:
    """Update without start (a server that lost the session, e.g. restarted): vLLM answers 500 while the trainer is
    already broadcasting; arbor stops waiting, says why, and does not advance the version."""
    from arbor.tasks.training.vllm_sync import VllmControl, VllmSyncError
    from arbor.tasks.training.weight_sync import push_state_dict

    sd = trainer.state_dict_for_sync()
    with scripted(qwen_cfg(), weights=zeros_like(sd), lose_session_after_start=True, gloo_timeout_s=5) as server:
        sync = client(server, packed=False, gloo_timeout_s=5)
        with pytest.raises(VllmSyncError, match=r"start_weight_update must be called before update_weights.*re-init") as e:
            push_state_dict(sync, trainer)
        assert str(e.value).endswith("its resume pushes the whole policy again before its first rollout")
        assert server.weight_version == "default" and not sync.ready
        http = VllmControl(server.base_url)
        with pytest.raises(VllmSyncError, match=r"finish_weight_update called without a matching start"):
            http.call("POST", "/finish_weight_update", {"weight_version": "1"})


def test_bad_update_info_is_refused_before_the_wire_and_explained_after_it() -> None:
    from arbor.tasks.training.vllm_sync import VllmControl, VllmSyncError, check_update_info, update_info

    info = update_info([("w", torch.zeros(2, 3, dtype=torch.bfloat16))])
    assert info == {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[2, 3]]}
    check_update_info(info)
    with pytest.raises(VllmSyncError, match="packing belongs in init_info"):
        check_update_info({**info, "packed": True})  # what arbor sent earlier
    with pytest.raises(VllmSyncError, match="differ in length"):
        check_update_info({**info, "shapes": []})
    with scripted(qwen_cfg(), weights={}) as server:
        http = VllmControl(server.base_url)
        http.call("POST", "/start_weight_update")
        with pytest.raises(VllmSyncError, match=r"HTTP 500.*Invalid update_info.*packing is agreed in init_info"):
            http.call("POST", "/update_weights", {"update_info": {**info, "packed": True}})
        assert not server.active  # 0.33 ends the session on a failed update (gpu_worker.py)


def test_a_prefix_cache_reset_that_answers_success_false_is_retried_then_fails(trainer: Trainer) -> None:
    from arbor.tasks.training.vllm_sync import VllmSyncError
    from arbor.tasks.training.weight_sync import push_state_dict

    sd = trainer.state_dict_for_sync()
    with scripted(qwen_cfg(), weights=zeros_like(sd), held_resets=2) as server:
        assert push_state_dict(client(server, reset_tries=3), trainer).reset_tries == 3  # type: ignore[union-attr]
    with scripted(qwen_cfg(), weights=zeros_like(sd), held_resets=9) as server:
        with pytest.raises(VllmSyncError, match=r"success=false 3 times.*still held"):
            push_state_dict(client(server, reset_tries=3), trainer)


# ------------------------------------------------------------------------------------------- restart path
def launcher(tmp_path: Path, version: str | None = None) -> str:
    """An executable that runs tests/vllm_server.py (or, with ``version``, only prints a version)."""
    exe = tmp_path / "vllm"
    body = f'echo {version}' if version else f'cd {ROOT} && exec {sys.executable} -m tests.vllm_server "$@"'
    if version is None:
        body = f'[ "$1" = "--version" ] && echo 0.33.0 && exit 0\n{body}'
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    return str(exe)


def test_restart_fallback_serves_the_exported_weights_at_the_confirmed_version(trainer: Trainer, tokenizer,
                                                                              tmp_path: Path) -> None:
    from arbor.tasks.training.vllm_sync import VllmControl

    cfg = qwen_cfg(**{"cluster.vllm_executable": launcher(tmp_path), "cluster.weight_sync": "restart"})
    first = tmp_path / "start"
    trainer.export_hf(first)
    spec = vllm_serve_spec(cfg, str(first))
    engine = OpenAIEngine(cfg, tokenizer, search=None, base_url=spec.base_url)
    with Supervised(spec, startup_timeout_s=120) as server:
        train_once(trainer, trainer.cfg)
        version = sync_policy(trainer, engine, tmp_path / "sync", spec.base_url, weight_sync="restart",
                              restart=lambda p: server.restart_on(vllm_serve_spec(cfg, str(p))))
        assert version == engine.policy_version == trainer.policy_version
        http = VllmControl(spec.base_url)
        assert http.weight_version() == str(version)
        sums = http.call("POST", "/weight_checker", {"action": "checksum"})["checksums"]
        sd = trainer.state_dict_for_sync()
        want = {f"0:{k}": hashlib.sha256(v.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
                for k, v in sd.items()}
        assert [k for k in want if k not in sums] in ([], ["0:lm_head.weight"])  # tied to the embeddings in hf/
        assert {k: sums[k] for k in want if k in sums} == {k: h for k, h in want.items() if k in sums}
        assert str(tmp_path / "sync") in " ".join(server.spec.argv)


def test_restart_needs_the_server_arbor_launched(trainer: Trainer, tokenizer, tmp_path: Path) -> None:
    from arbor.tasks.training.vllm_sync import VllmSyncError

    cfg = qwen_cfg()
    engine = OpenAIEngine(cfg, tokenizer, search=None, base_url="http://127.0.0.1:1/v1")
    with pytest.raises(VllmSyncError, match="cluster.manage_vllm=true"):
        sync_policy(trainer, engine, tmp_path, None, weight_sync="restart", restart=None)


# ------------------------------------------------------------------------------------------- preflight
def test_preflight_refuses_a_vllm_arbor_does_not_speak_naming_both_versions(tmp_path: Path) -> None:
    old = launcher(tmp_path, version="0.32.1")
    missing = "\n".join(check(qwen_cfg(**{"cluster.vllm_executable": old}), gpu_count=8, env={}))
    assert f"cluster.vllm_executable: '{old}' is vLLM 0.32.1; arbor speaks vLLM 0.33.x (pinned 0.33.0" in missing
    good = tmp_path / "ok"
    good.mkdir()
    ok = "\n".join(check(qwen_cfg(**{"cluster.vllm_executable": launcher(good)}), gpu_count=8, env={}))
    assert "cluster.vllm_executable" not in ok


def test_preflight_says_which_sync_a_run_uses_and_what_it_needs() -> None:
    from arbor.preflight.serving import weight_sync_plan, weight_sync_problems

    nccl, restart, tiny = qwen_cfg(), qwen_cfg(**{"cluster.weight_sync": "restart"}), load_config("tiny-cpu")
    assert weight_sync_plan(nccl.cluster, nccl.rollout).startswith("weight sync: NCCL push over vLLM 0.33's RL routes")
    assert "restart `vllm serve`" in weight_sync_plan(restart.cluster, restart.rollout)
    assert "in-process" in weight_sync_plan(tiny.cluster, tiny.rollout)
    torch_gap = weight_sync_problems(nccl.cluster, torch_version="2.13.0+cu128")
    assert len(torch_gap) == 1 and "torch is 2.13.0+cu128 but vLLM 0.33.0 pins torch==2.14.0" in torch_gap[0]
    assert weight_sync_problems(nccl.cluster, torch_version="2.14.0+cu128") == []
    assert weight_sync_problems(qwen_cfg(**{"cluster.weight_sync": "restart", "cluster.manage_vllm": False}).cluster)


# ------------------------------------------------------------------------------------------- the fixture itself
def test_every_fixture_entry_cites_its_source() -> None:
    def entries(obj: object) -> list[dict]:
        if isinstance(obj, dict):
            return ([obj] if "cite" in obj else []) + [e for v in obj.values() for e in entries(v)]
        if isinstance(obj, list):
            return [e for v in obj for e in entries(v)]
        return []

    sections = {k: v for k, v in CONTRACT.items() if not k.startswith("_")}
    assert sections and [k for k, v in sections.items() if not entries(v)] == []
    assert all(re.search(r"\.(py|txt|md)|PKG-INFO", e["cite"]) for e in entries(CONTRACT))


SRC = os.environ.get("ARBOR_VLLM_SRC")


@pytest.mark.skipif(not SRC, reason="set ARBOR_VLLM_SRC to an unpacked vllm-0.33.0 sdist to re-read the facts")
def test_fixture_matches_the_sdist() -> None:
    root = Path(SRC or "")
    assert f"Version: {CONTRACT['sdist']['version']}" in (root / "PKG-INFO").read_text()
    v = root / "vllm"
    routes = {}
    for f in ["entrypoints/rl/online/api_router.py", "entrypoints/serve/dev/cache/api_router.py",
              "entrypoints/openai/models/api_router.py", "entrypoints/serve/instrumentator/health.py"]:
        for m, p in re.findall(r'@router\.(get|post)\(\s*"([^"]+)"', (v / f).read_text()):
            routes[(m.upper(), p)] = f
    for m, p in re.findall(r'@router\.(post)\(\s*\n?\s*"(/v1/completions)"',
                           (v / "entrypoints/openai/completion/api_router.py").read_text()):
        routes[(m.upper(), p)] = "completion"
    for r in CONTRACT["routes"]:
        assert (r["method"], r["path"]) in routes, r
    gate = (v / "entrypoints/launchers/api_server/routers.py").read_text()
    assert "if envs.VLLM_SERVER_DEV_MODE:" in gate and "register_rl_api_routers(app)" in gate

    def fields(path: str, cls: str) -> list[str]:
        tree = ast.parse((v / path).read_text())
        node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
        return [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]

    assert fields("distributed/weight_transfer/nccl_common.py", "NCCLWeightTransferInitInfo") == \
        CONTRACT["init_info"]["fields"]
    assert fields("distributed/weight_transfer/nccl_engine.py", "NCCLWeightTransferUpdateInfo") == \
        CONTRACT["update_info"]["fields"]
    completion = fields("entrypoints/openai/completion/protocol.py", "CompletionRequest")
    assert set(CONTRACT["completion_request_fields"]["fields"]) <= set(completion)
    assert "torch==2.14.0" in (root / "requirements/cuda.txt").read_text().splitlines()
    worker = (v / "v1/worker/gpu_worker.py").read_text()
    for msg in ("start_weight_update must be called before update_weights.",
                "finish_weight_update called without a matching start_weight_update.",
                "start_weight_update called while a weight update is already "):
        assert msg in worker
    assert '"--served-model-name"' in (v / "engine/arg_utils.py").read_text()
    core = (v / "v1/engine/core.py").read_text()
    assert CONTRACT["paused"]["message"] in core and 'self.reject_new_requests = mode != "keep"' in core
    assert "status_code = HTTPStatus.SERVICE_UNAVAILABLE" in (v / "exceptions.py").read_text()
    assert f'"{CONTRACT["paused"]["type"]}"' in (v / "entrypoints/serve/exception_handling/error_response.py").read_text()
