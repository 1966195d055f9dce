"""A GPU profile started where something it needs is missing fails at once, naming what is missing."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from arbor.config import ConfigError, load_config
from arbor.preflight import PreflightError, check, require


def test_qwen3_8b_on_a_cpu_box_lists_everything_missing() -> None:
    """``require`` raises with every item ``check`` lists (one check: each unreachable endpoint costs a timeout)."""
    cfg = load_config("qwen3-8b")
    with pytest.raises(PreflightError, match="cannot start here") as e:
        require(cfg, gpu_count=0, env={})
    missing = str(e.value)
    assert "policy.model: 'Qwen/Qwen3-8B'" in missing  # not a local path, not in the local HF cache
    assert "cluster:" in missing and "this machine has 0" in missing
    assert cfg.judge.api_key_env in missing
    assert cfg.search.api_key_env in missing


def test_vllm_executable_is_looked_up_where_the_flow_will_start_it(tmp_path) -> None:
    """vLLM may live in an environment of its own (make vllm-env): preflight checks the configured command."""
    gone = str(tmp_path / "no-venv" / "bin" / "vllm")
    missing = "\n".join(check(load_config("qwen3-8b", {"cluster.vllm_executable": gone}), gpu_count=8, env={}))
    assert f"cluster.vllm_executable: the flow manages `vllm serve` but {gone!r}" in missing
    present = tmp_path / "vllm"
    present.write_text("#!/bin/sh\necho 0.33.0\n")  # `vllm --version` of the release arbor speaks
    present.chmod(0o755)
    ok = "\n".join(check(load_config("qwen3-8b", {"cluster.vllm_executable": str(present)}), gpu_count=8, env={}))
    assert "cluster.vllm_executable" not in ok


def _fake_vllm(folder: Path, version: str) -> Path:
    """A `vllm` whose --version answers ``version`` (make vllm-env's CPU launcher answers 0.32.0+cpu)."""
    exe = folder / "bin" / "vllm"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(f"#!/bin/sh\necho {version}\n")
    exe.chmod(0o755)
    return exe


def test_bare_vllm_is_the_checkouts_vllm_env_as_an_absolute_path(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """cluster.vllm_executable=vllm (the qwen3 profiles') with none on PATH is what make vllm-env built, absolute,
    so a Prefect worker in another directory starts the same file; a path on PATH or a configured path wins."""
    import arbor.paths
    from arbor.paths import vllm_command
    from arbor.tasks.env.serving import vllm_serve_spec

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    env = tmp_path / "checkout" / ".venv-vllm"
    assert vllm_command("vllm", env) == "vllm"  # not built: left as configured, for preflight to name
    exe = _fake_vllm(env, "0.33.0")
    monkeypatch.chdir(tmp_path)
    assert vllm_command("vllm", env) == str(exe) and exe.is_absolute()
    assert vllm_command("/opt/vllm/bin/vllm", env) == "/opt/vllm/bin/vllm"
    monkeypatch.setattr(arbor.paths, "VLLM_ENV", env)  # this checkout's .venv-vllm, as `make vllm-env` leaves it
    assert vllm_serve_spec(load_config("qwen3-8b"), "/ckpt").argv[:2] == [str(exe), "serve"]
    assert "cluster.vllm_executable" not in "\n".join(check(load_config("qwen3-8b"), gpu_count=8, env={}))
    _fake_vllm(tmp_path / "on-path", "0.33.0")
    monkeypatch.setenv("PATH", str(tmp_path / "on-path" / "bin"))
    assert vllm_command("vllm", env) == "vllm"  # PATH's vllm, as before


def test_without_vllm_preflight_names_the_one_setting_or_make_vllm_env(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import arbor.paths

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(arbor.paths, "VLLM_ENV", tmp_path / ".venv-vllm", raising=False)
    [line] = [m for m in check(load_config("qwen3-8b"), gpu_count=8, env={}) if "vllm_executable" in m]
    assert line == (f"cluster.vllm_executable: no `vllm` on PATH and no {tmp_path / '.venv-vllm/bin/vllm'}: run "
                    f"`make vllm-env` in {arbor.paths.PROJECT_ROOT} (nothing to set afterwards), or set "
                    "cluster.vllm_executable=/absolute/path/to/bin/vllm (vLLM's own environment; docs/gpu.md)"), line


def test_qwen3_on_a_cpu_box_after_make_vllm_env_names_only_what_a_gpu_node_supplies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`arbor train -p qwen3-8b` here, once make vllm-env has built vLLM's CPU build into .venv-vllm: the refusal
    names the GPUs, keys, endpoints, data and the GPU torch, never vLLM's executable or its version."""
    import arbor.paths

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    _fake_vllm(tmp_path / ".venv-vllm", "0.32.0+cpu")
    monkeypatch.setattr(arbor.paths, "VLLM_ENV", tmp_path / ".venv-vllm", raising=False)
    missing = check(load_config("qwen3-8b"), gpu_count=0, env={})
    keys = {m.split(":", 1)[0] for m in missing}
    assert "cluster" in keys and "judge.api_key_env" in keys, missing
    gpu_node = {"cluster", "judge.api_key_env", "search.api_key_env", "judge.base_url", "policy.model",
                "memory.embedder", "sft.data",  # models offline here (HF_HUB_OFFLINE), data not downloaded
                "cluster.weight_sync=nccl"}  # the GPU torch (make setup TORCH_SPEC=torch==2.14.0)
    assert keys <= gpu_node, missing
    assert not any("vllm_executable" in m or "vllm-env" in m or "vLLM 0.32" in m for m in missing), missing


def test_tiny_cpu_needs_nothing() -> None:
    assert check(load_config("tiny-cpu"), gpu_count=0, env={}) == []


def test_openai_judge_without_key_or_url() -> None:
    cfg = load_config("tiny-cpu", {"judge.backend": "openai", "judge.api_key_env": "ARBOR_TEST_KEY"})
    with socket.socket() as closed:  # a port nothing listens on: OPENAI_BASE_URL, no network needed
        closed.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
    missing = check(cfg, gpu_count=0, env={"OPENAI_BASE_URL": nowhere})
    assert any(m.startswith(f"judge.base_url: nothing answers at {nowhere}") and "judge.base_url is unset" in m
               for m in missing), missing
    assert any("ARBOR_TEST_KEY" in m for m in missing)
    with socket.socket() as listening:  # something answers at the URL: nothing is missing
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        url = f"http://127.0.0.1:{listening.getsockname()[1]}/v1"
        ok = load_config("tiny-cpu", {"judge.backend": "openai", "judge.api_key_env": "ARBOR_TEST_KEY",
                                      "judge.base_url": url})
        assert check(ok, gpu_count=0, env={"ARBOR_TEST_KEY": "x"}) == []
    # the same port closed is a dead endpoint, named before anything starts
    [dead] = check(ok, gpu_count=0, env={"ARBOR_TEST_KEY": "x"})
    assert dead.startswith(f"judge.base_url: nothing answers at {url} (Connection refused)"), dead
    bad = load_config("tiny-cpu", {"judge.backend": "openai", "judge.base_url": "127.0.0.1:8000/v1"})
    assert any("is not an http(s) URL" in m for m in check(bad, gpu_count=0, env={}))


def test_unset_judge_url_is_the_openai_clients_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/usage.md: left unset, judge.base_url is the OpenAI client's default endpoint (or OPENAI_BASE_URL). The openai
    backend then builds its client with base_url=None; preflight checks the endpoint that client will call."""
    import openai

    from arbor.preflight.judges import OPENAI_DEFAULT_BASE_URL, judge_endpoint

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert str(openai.OpenAI(api_key="x").base_url).rstrip("/") == OPENAI_DEFAULT_BASE_URL  # the client's own
    assert judge_endpoint(None, {}) == OPENAI_DEFAULT_BASE_URL
    assert judge_endpoint(None, {"OPENAI_BASE_URL": "http://h:1/v1"}) == "http://h:1/v1"
    assert judge_endpoint("http://set:2/v1", {"OPENAI_BASE_URL": "http://h:1/v1"}) == "http://set:2/v1"
    cfg = load_config("tiny-cpu", {"judge.backend": "openai"})
    assert cfg.judge.base_url is None and cfg.judge.api_key_env == "OPENAI_API_KEY"  # docs/usage.md's defaults
    with socket.socket() as listening:  # OPENAI_BASE_URL answers, the key is set: nothing is missing
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        url = f"http://127.0.0.1:{listening.getsockname()[1]}/v1"
        monkeypatch.setenv("OPENAI_BASE_URL", url)
        assert str(openai.OpenAI(api_key="x").base_url).rstrip("/") == url  # what the judge's client will call
        assert check(cfg, gpu_count=0, env={"OPENAI_API_KEY": "sk-x", "OPENAI_BASE_URL": url}) == []


def test_missing_or_broken_input_files_are_named(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.json").write_text("{not json")
    cfg = load_config("tiny-cpu", {"train.deepspeed_config": str(tmp_path / "broken.json"),
                                   "memory.init_from": str(tmp_path / "pool.json"),
                                   "data.train": "my_questions.jsonl", "search.corpus": "my_corpus.jsonl",
                                   "train.hostfile": "hosts"})
    missing = check(cfg, gpu_count=0, env={})
    assert [m.split(":")[0] for m in missing] == ["train.deepspeed_config", "memory.init_from", "train.hostfile",
                                                  "data.train", "search.corpus"]
    assert f"{tmp_path / 'broken.json'}:1: not valid JSON" in missing[0]
    assert str(tmp_path / "pool.json") in missing[1]
    with pytest.raises(PreflightError) as err:
        require(cfg, gpu_count=0, env={})
    assert "\n" not in str(err.value) and str(err.value).count("; ") == 4  # one line for the CLI


def test_profile_relative_deepspeed_config_is_read_from_the_project_root(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the profile's configs/deepspeed/qwen3-8b.json is not under the cwd
    cfg = load_config("tiny-cpu", {"train.deepspeed_config": "configs/deepspeed/qwen3-8b.json"})
    assert check(cfg, gpu_count=0, env={}) == []
    assert "train.deepspeed_config" in check(load_config("tiny-cpu", {"train.deepspeed_config": "nope.json"}),
                                             gpu_count=0, env={})[0]


def test_hostfile_lifts_the_local_gpu_requirement(tmp_path) -> None:
    hosts = tmp_path / "hostfile"
    hosts.write_text("node1 slots=8\n")
    missing = check(load_config("qwen3-8b", {"train.hostfile": str(hosts)}), gpu_count=0, env={})
    assert not any(m.startswith("cluster:") for m in missing)
    with pytest.raises(ConfigError, match=r"cluster\.hostfile"):  # the duplicate key that did nothing is gone
        load_config("qwen3-8b", {"cluster.hostfile": str(hosts)})


def test_cpu_profile_check_does_not_import_torch() -> None:
    """Preflight counts GPUs only when the profile places work on GPUs, and from the NVIDIA driver rather than by
    importing torch (seconds): the CLI refuses a GPU profile on a CPU box at once."""
    code = ("import sys; from arbor.config import load_config; from arbor.preflight import check; "
            "assert check(load_config('tiny-cpu'), env={}) == []; "
            "assert any(m.startswith('cluster:') for m in check(load_config('qwen3-8b'), env={})) or "
            "__import__('pathlib').Path('/proc/driver/nvidia/gpus').is_dir(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


# ---- the per-paper profiles, and a start checkpoint of another protocol -----------------------------

@pytest.mark.parametrize(("profile", "own"), [
    ("qwen3-8b-rubricem", ["memory.embedder: 'Qwen/Qwen3-Embedding-0.6B'", "GEMINI_API_KEY"]),
    ("qwen3-4b-arco", ["policy.model: 'Qwen/Qwen3-4B-Instruct-2507'",
                       "judge.roles.step_labels.api_key_env: environment variable OPENAI_API_KEY"]),
    ("qwen3-8b-coreact", ["guidance.generator:", "judge.roles.step_verify.api_key_env: environment variable "
                          "VLLM_API_KEY", "judge.roles.step_verify.base_url: nothing answers at"]),
])
def test_paper_profiles_on_a_cpu_box_list_what_is_missing(profile: str, own: list[str]) -> None:
    """Each preflights like the qwen3 profiles: GPUs, the model and its own needs reported as missing, not raised."""
    cfg = load_config(profile)
    with pytest.raises(PreflightError, match=f"profile '{profile}' cannot start here") as e:
        require(cfg, gpu_count=0, env={})  # one check (``require`` raises what ``check`` lists)
    text = str(e.value)
    assert f"policy.model: '{cfg.policy.model}'" in text  # not a local path, not in the local HF cache
    assert "cluster:" in text and "this machine has 0" in text
    assert cfg.search.api_key_env in text
    for item in own:
        assert item in text, text


def _checkpoint(path, protocol: str | None) -> str:
    """A directory that looks like a model (config.json), with arbor-sft's record of its protocol if given."""
    import json

    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    if protocol is not None:
        (path / "arbor_sft.json").write_text(json.dumps({"key": "0123456789ab", "protocol": protocol}))
    return str(path)


STAGED = {"rollout.protocol": "rubricem", "run.method": "ss-grpo"}


def test_a_start_checkpoint_of_another_protocol_is_refused(arbor_home) -> None:
    flat = _checkpoint(arbor_home / "sft" / "flat", "arbor")
    [problem] = [m for m in check(load_config("tiny-cpu", {**STAGED, "run.start_checkpoint": "sft/flat"}),
                                  gpu_count=0, env={}) if "protocol" in m]
    assert problem.startswith(f"run.start_checkpoint: {flat} is an SFT start trained in protocol 'arbor'")
    assert "rollout.protocol=rubricem" in problem and "sft.output" in problem
    # the same start for its own protocol, and a staged start for a staged run, are fine
    assert not any("protocol" in m for m in check(load_config("tiny-cpu", {"run.start_checkpoint": flat}),
                                                   gpu_count=0, env={}))
    staged = _checkpoint(arbor_home / "sft" / "staged", "rubricem")
    assert not any("protocol" in m for m in check(load_config("tiny-cpu", {**STAGED, "run.start_checkpoint": staged}),
                                                   gpu_count=0, env={}))
    # before arbor_sft.json had the field, every start was the arbor protocol's
    old = _checkpoint(arbor_home / "sft" / "old", None)
    (arbor_home / "sft" / "old" / "arbor_sft.json").write_text('{"key": "0123456789ab"}')
    assert any(m.startswith("run.start_checkpoint:") for m in check(
        load_config("tiny-cpu", {**STAGED, "run.start_checkpoint": old}), gpu_count=0, env={}))


def test_a_checkpoint_without_arbor_sft_json_is_taken_as_it_is(arbor_home) -> None:
    """A Hub model or a user's own checkpoint says nothing of its protocol: accepted, by preflight and train."""
    from arbor.flows.run_setup import start_checkpoint

    mine = _checkpoint(arbor_home / "mine", None)
    cfg = load_config("tiny-cpu", {**STAGED, "run.start_checkpoint": mine})
    assert not any("protocol" in m for m in check(cfg, gpu_count=0, env={}))
    assert str(start_checkpoint(cfg, arbor_home)) == mine


def test_train_start_up_refuses_a_start_of_another_protocol(arbor_home) -> None:
    """flows.run_setup.start_checkpoint (arbor-train, arbor-guidance-train) checks the same, naming both keys."""
    from arbor.flows.run_setup import start_checkpoint

    _checkpoint(arbor_home / "sft" / "flat", "arbor")
    cfg = load_config("tiny-cpu", {**STAGED, "run.start_checkpoint": "sft/flat"})
    with pytest.raises(PreflightError, match=r"run\.start_checkpoint: .* protocol 'arbor'.*rollout\.protocol=rubricem"):
        start_checkpoint(cfg, arbor_home)
    staged = _checkpoint(arbor_home / "sft" / "staged", "rubricem")
    assert str(start_checkpoint(load_config("tiny-cpu", {**STAGED, "run.start_checkpoint": "sft/staged"}),
                                arbor_home)) == staged


def test_an_existing_sft_output_of_another_protocol_is_named(arbor_home) -> None:
    """With run.sft_warm_start and no start checkpoint yet, an existing sft.output is what arbor-sft would reuse:
    preflight names a flat one under a staged run instead of treating it as done."""
    _checkpoint(arbor_home / "sft" / "qwen3-8b", "arbor")
    over = {**STAGED, "run.sft_warm_start": True, "sft.output": "sft/qwen3-8b", "run.start_checkpoint": None}
    problems = [m for m in check(load_config("tiny-cpu", over), gpu_count=0, env={}) if "protocol" in m]
    assert len(problems) == 1 and problems[0].startswith("sft.output: ")
    assert not any("protocol" in m for m in check(load_config("tiny-cpu", {**over, "rollout.protocol": "arbor",
                                                                           "run.method": "grpo"}),
                                                   gpu_count=0, env={}))
    # the rubricem profile's own start is its own directory, so the flat qwen3-8b start never stands in for it
    cfg = load_config("qwen3-8b-rubricem")
    assert not any("protocol" in m for m in check(cfg, gpu_count=0, env={}))


def _version_exe(tmp_path, version: str) -> str:
    exe = tmp_path / "vllm"
    exe.write_text(f"#!/bin/sh\necho {version}\n")
    exe.chmod(0o755)
    return str(exe)


def test_preflight_speaks_the_cpu_build_without_gpus_and_refuses_nccl_with_it(tmp_path) -> None:
    """vLLM's CPU build answers 0.32.0+cpu through make vllm-env's launcher: taken for a CPU server with reload or
    restart sync, refused with nccl (it has no NCCL) and on GPUs (arbor speaks 0.33 there)."""
    from arbor.preflight.serving import vllm_version_problems

    exe = _version_exe(tmp_path, "0.32.0+cpu")
    assert vllm_version_problems(exe, cpu=True, weight_sync="reload") == []
    assert vllm_version_problems(exe, cpu=True, weight_sync="restart") == []
    [nccl] = vllm_version_problems(exe, cpu=True, weight_sync="nccl")
    assert "cluster.weight_sync=nccl" in nccl and "no NCCL" in nccl and "cluster.weight_sync=reload" in nccl
    [gpu] = vllm_version_problems(exe, cpu=False, weight_sync="reload")
    assert "is vLLM 0.32.0+cpu; arbor speaks vLLM 0.33.x" in gpu
    plain = _version_exe(tmp_path, "0.32.0")  # a 0.32 that is not the CPU build
    assert vllm_version_problems(plain, cpu=True, weight_sync="reload")


def test_the_reload_plan_says_how_a_failure_is_restored() -> None:
    from arbor.preflight.serving import weight_sync_plan

    cfg = load_config("smol-vllm")
    line = weight_sync_plan(cfg.cluster, cfg.rollout)
    assert "reload it in place" in line and "restores the last good weights, else restarts the server" in line


@pytest.mark.parametrize("profile", ["qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-8b-rubricem", "qwen3-4b-arco",
                                     "qwen3-8b-coreact", "smol-vllm"])
def test_no_profile_endpoint_sits_on_the_nccl_transfer_store_port(profile: str) -> None:
    """The trainer's transfer TCPStore listens on cluster.vllm_port + 1: no endpoint of a profile may use it."""
    from arbor.preflight.serving import store_port_problems

    assert store_port_problems(load_config(profile)) == []


def test_an_endpoint_on_the_store_port_is_refused_naming_both() -> None:
    from arbor.preflight.serving import store_port_problems

    cfg = load_config("qwen3-8b", {"cluster.vllm_port": 9000, "judge.base_url": "http://127.0.0.1:9001/v1"})
    [problem] = store_port_problems(cfg)
    assert problem.startswith("cluster.vllm_port=9000: the NCCL transfer's TCPStore takes port 9001")
    assert "judge.base_url=http://127.0.0.1:9001/v1" in problem


def test_a_checks_endpoints_are_probed_together_each_answered_as_alone() -> None:
    """``endpoint_problems`` probes a check's endpoints side by side (one timeout, not one per endpoint) and answers
    each URL exactly as ``endpoint_problem`` alone does: a listening server, a refused port, a URL without a host."""
    from arbor.preflight.judges import endpoint_problem, endpoint_problems

    with socket.socket() as live, socket.socket() as closed:
        live.bind(("127.0.0.1", 0))
        live.listen()
        closed.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        urls = [f"http://127.0.0.1:{live.getsockname()[1]}/v1", f"http://127.0.0.1:{closed.getsockname()[1]}/v1",
                "ftp://judge/v1", f"http://127.0.0.1:{live.getsockname()[1]}/v1"]
        probes = endpoint_problems(urls)
        assert list(probes) == urls[:3]  # each URL once, in order
        assert probes == {u: endpoint_problem(u) for u in urls[:3]}
        assert probes[urls[0]] is None
        assert "nothing answers" in str(probes[urls[1]]) and "not an http(s) URL" in str(probes[urls[2]])
