"""`arbor judge serve`: llama.cpp's server on the shipped SmolLM2, refused clearly without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from arbor.tasks.env.policy import shipped_gguf
from arbor.tasks.env.serving import llama_judge_spec


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "arbor.cli", "judge", "serve", *args], capture_output=True,
                          text=True, timeout=120)


def test_the_launch_command_serves_the_gguf_on_loopback() -> None:
    gguf = shipped_gguf("smollm2")
    spec = llama_judge_spec("/py", gguf, port=8123, alias="smollm2", n_ctx=4096, threads=2)
    assert spec.argv == ["/py", "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port",
                         "8123", "--n_ctx", "4096", "--model_alias", "smollm2", "--n_threads", "2"]
    assert spec.base_url == "http://127.0.0.1:8123/v1" and spec.health_url == "http://127.0.0.1:8123/v1/models"
    assert spec.env == {"OMP_WAIT_POLICY": "PASSIVE"}  # idle judge threads sleep: the cores are the policy's too


def test_a_missing_server_environment_is_refused_before_anything_starts(tmp_path: Path) -> None:
    out = _serve("--python", str(tmp_path / "nope" / "python"))
    assert out.returncode != 0 and "not found" in out.stderr and "make judge-env" in out.stderr
    out = _serve("--python", sys.executable)  # a Python without llama-cpp-python
    assert out.returncode != 0 and "cannot import llama_cpp.server" in out.stderr
    assert "No module named 'llama_cpp'" in out.stderr


def test_an_unknown_model_is_named(tmp_path: Path) -> None:
    fake = tmp_path / "python"  # a Python that imports anything: the model check comes next
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    out = _serve("--python", str(fake), "--model", str(tmp_path / "missing.gguf"))
    assert out.returncode != 0 and "--model" in out.stderr and "no such file" in out.stderr
    out = _serve("--python", str(fake), "--model", "gpt-nano")
    assert out.returncode != 0 and "--model gpt-nano: neither a shipped model (smollm2)" in out.stderr
