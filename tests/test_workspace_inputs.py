"""Relative input paths under a Prefect worker (docs/usage.md, "SFT, then RL"): a process worker runs each flow in a
temporary directory, so `sft.data: data/sft/toolstar_still_search.jsonl` (the qwen3 profiles') and
`cluster.vllm_executable=.venv-vllm/bin/vllm` are read from ARBOR_HOME when the current directory lacks them, and
are otherwise refused before the run with the places looked and what to give instead. tests/test_deployment.py
runs arbor-sft and arbor-train deployments from a worker's temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbor.config import load_config
from arbor.config.inputs import resolve_workspace_inputs
from arbor.preflight import check

SFT_DATA = "data/sft/toolstar_still_search.jsonl"  # the qwen3 profiles' sft.data, as the README writes it


@pytest.fixture
def worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(worker's temporary directory, ARBOR_HOME): the flow runs in the first, empty."""
    tmp, home = tmp_path / "tmp-worker", tmp_path / "workspace"
    tmp.mkdir()
    home.mkdir()
    monkeypatch.chdir(tmp)
    monkeypatch.setenv("ARBOR_HOME", str(home))
    return tmp, home


def _problems(cfg, key: str) -> list[str]:
    return [m for m in check(cfg, gpu_count=8, env={}) if m.startswith(f"{key}:")]


def test_sft_data_is_read_from_arbor_home(worker: tuple[Path, Path]) -> None:
    tmp, home = worker
    cfg = load_config("qwen3-8b")
    assert cfg.sft.data == SFT_DATA
    [refused] = _problems(cfg, "sft.data")  # nowhere yet: both places named, and what to do
    assert f"looked in {tmp} and {home}" in refused and "absolute path" in refused and "ARBOR_HOME" in refused
    (home / SFT_DATA).parent.mkdir(parents=True)
    (home / SFT_DATA).write_text("{}\n")
    assert _problems(cfg, "sft.data") == []
    assert resolve_workspace_inputs(cfg) == {"sft.data": str(home / SFT_DATA)}
    assert cfg.sft.data == str(home / SFT_DATA)  # what flows.sft then opens, from any directory


def test_the_current_directory_still_wins(worker: tuple[Path, Path]) -> None:
    tmp, home = worker
    for place in (tmp, home):
        (place / SFT_DATA).parent.mkdir(parents=True)
        (place / SFT_DATA).write_text("{}\n")
    cfg = load_config("qwen3-8b")
    assert resolve_workspace_inputs(cfg) == {} and cfg.sft.data == SFT_DATA  # as before: the cwd's file
    tiny = load_config("tiny-world")  # named sets are not paths: nothing changes (same rows)
    assert resolve_workspace_inputs(tiny) == {}


def test_relative_vllm_executable(worker: tuple[Path, Path]) -> None:
    tmp, home = worker
    cfg = load_config("qwen3-8b", {"cluster.vllm_executable": ".venv-vllm/bin/vllm"})
    [refused] = _problems(cfg, "cluster.vllm_executable")
    assert f"no such file .venv-vllm/bin/vllm (looked in {tmp} and {home})" in refused
    assert "absolute path" in refused
    exe = home / ".venv-vllm/bin/vllm"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\necho 0.33.0\n")
    exe.chmod(0o755)
    assert _problems(cfg, "cluster.vllm_executable") == []
    assert resolve_workspace_inputs(cfg) == {"cluster.vllm_executable": str(exe)}
    assert load_config("qwen3-8b").cluster.vllm_executable == "vllm"  # a name on PATH is not a path


def test_rubric_pool_and_hostfile_from_arbor_home(worker: tuple[Path, Path]) -> None:
    _, home = worker
    (home / "pool.json").write_text('{"rubrics": []}')
    (home / "hosts").write_text("node1 slots=8\n")
    cfg = load_config("tiny-cpu", {"memory.init_from": "pool.json", "train.hostfile": "hosts"})
    assert not [m for m in check(cfg, gpu_count=0, env={}) if m.startswith(("memory.init_from", "train.hostfile"))]
    assert resolve_workspace_inputs(cfg) == {"memory.init_from": str(home / "pool.json"),
                                             "train.hostfile": str(home / "hosts")}


def test_each_set_of_an_eval_list_is_read_from_arbor_home(worker: tuple[Path, Path]) -> None:
    """data.eval may list several sets: a relative file among them resolves as a single one would, the
    named sets beside it untouched."""
    tmp, home = worker
    (home / "dev.jsonl").write_text('{"question": "q?", "answer": "a"}\n')
    cfg = load_config("qwen3-8b", {"data.eval": ["bench:hotpotqa", "dev.jsonl"]})
    assert resolve_workspace_inputs(cfg) == {"data.eval": f'["bench:hotpotqa", "{home / "dev.jsonl"}"]'}
    assert cfg.data.eval == ["bench:hotpotqa", str(home / "dev.jsonl")]
