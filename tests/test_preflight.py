"""A GPU profile started where something it needs is missing fails at once, naming what is missing."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from arbor.config import ConfigError, load_config
from arbor.preflight import PreflightError, check, require


def test_qwen3_8b_on_a_cpu_box_lists_everything_missing() -> None:
    cfg = load_config("qwen3-8b")
    missing = "\n".join(check(cfg, gpu_count=0, env={}))
    assert "policy.model: 'Qwen/Qwen3-8B'" in missing  # not a local path, not in the local HF cache
    assert "cluster:" in missing and "this machine has 0" in missing
    assert cfg.judge.api_key_env in missing
    assert cfg.search.api_key_env in missing
    with pytest.raises(PreflightError, match="cannot start here"):
        require(cfg, gpu_count=0, env={})


def test_vllm_executable_is_looked_up_where_the_flow_will_start_it(tmp_path) -> None:
    """vLLM may live in an environment of its own (make vllm-env): preflight checks the configured command."""
    gone = str(tmp_path / "no-venv" / "bin" / "vllm")
    missing = "\n".join(check(load_config("qwen3-8b", {"cluster.vllm_executable": gone}), gpu_count=8, env={}))
    assert f"cluster.vllm_executable: the flow manages `vllm serve` but {gone!r}" in missing
    present = tmp_path / "vllm"
    present.write_text("#!/bin/sh\n")
    present.chmod(0o755)
    ok = "\n".join(check(load_config("qwen3-8b", {"cluster.vllm_executable": str(present)}), gpu_count=8, env={}))
    assert "cluster.vllm_executable" not in ok


def test_tiny_cpu_needs_nothing() -> None:
    assert check(load_config("tiny-cpu"), gpu_count=0, env={}) == []


def test_openai_judge_without_key_or_url() -> None:
    cfg = load_config("tiny-cpu", {"judge.backend": "openai", "judge.api_key_env": "ARBOR_TEST_KEY"})
    missing = check(cfg, gpu_count=0, env={})
    assert any("judge.base_url" in m for m in missing)
    assert any("ARBOR_TEST_KEY" in m for m in missing)
    with socket.socket() as listening:  # something answers at the URL: nothing is missing
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        url = f"http://127.0.0.1:{listening.getsockname()[1]}/v1"
        ok = load_config("tiny-cpu", {"judge.backend": "openai", "judge.api_key_env": "ARBOR_TEST_KEY",
                                      "judge.base_url": url})
        assert check(ok, gpu_count=0, env={"ARBOR_TEST_KEY": "x"}) == []
    # issue 35 item 5: the same port closed is a dead endpoint, named before anything starts
    [dead] = check(ok, gpu_count=0, env={"ARBOR_TEST_KEY": "x"})
    assert dead.startswith(f"judge.base_url: nothing answers at {url} (Connection refused)"), dead
    bad = load_config("tiny-cpu", {"judge.backend": "openai", "judge.base_url": "127.0.0.1:8000/v1"})
    assert any("is not an http(s) URL" in m for m in check(bad, gpu_count=0, env={}))


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
