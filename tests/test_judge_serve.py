"""`arbor judge serve`: llama.cpp's server on the shipped SmolLM2, refused clearly without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from arbor.tasks.env.policy import shipped_gguf
from arbor.tasks.env.serving import llama_judge_spec


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "arbor.cli", "judge", "serve", *args], capture_output=True,
                          text=True, timeout=120)


def test_the_launch_command_serves_the_gguf_on_loopback() -> None:
    gguf = shipped_gguf("smollm2")
    spec = llama_judge_spec("/py", gguf, port=8123, alias="smollm2", n_ctx=4096, threads=2)
    assert spec.argv == ["/py", "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port",
                         "8123", "--n_ctx", "4096", "--model_alias", "smollm2", "--n_threads", "2",
                         "--n_threads_batch", "2", "--flash_attn", "true"]  # prefill within the threads too
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


JUDGE_PYTHON = Path(__file__).resolve().parents[1] / ".venv-judge" / "bin" / "python"


def test_the_shipped_q4_1_is_served_as_q8_0_holding_the_same_weights(tmp_path: Path) -> None:
    """llama.cpp's own quantizer (the judge environment's) turns the shipped Q4_1 into Q8_0 once: every Q4_1 matrix
    becomes Q8_0, every weight stays within an 8-bit step's rounding of its Q4_1 value, and a second call reuses the file."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from arbor.tasks.env.serving import served_gguf

    if not JUDGE_PYTHON.is_file():
        pytest.fail(f"{JUDGE_PYTHON} not found: `make judge-env` builds llama.cpp's server (`make test` does)")
    shipped = shipped_gguf("smollm2")
    out = served_gguf(str(JUDGE_PYTHON), shipped, tmp_path)
    assert out.parent == tmp_path / "models" and out.name.startswith("SmolLM2-135M-Instruct.Q4_1-Q8_0-")
    before, after = ({t.name: t for t in GGUFReader(p).tensors} for p in (shipped, out))
    assert before.keys() == after.keys()
    q41 = [n for n, t in before.items() if t.tensor_type.name == "Q4_1"]
    assert len(q41) > 200 and {after[n].tensor_type.name for n in q41} == {"Q8_0"}
    for name in (q41[0], q41[len(q41) // 2], q41[-1]):
        old = dequantize(before[name].data, before[name].tensor_type).reshape(-1, 32)
        new = dequantize(after[name].data, after[name].tensor_type).reshape(-1, 32)
        step = np.abs(old).max(axis=1, keepdims=True) / 127  # a Q8_0 block's scale
        # half a step of rounding, plus up to 127 levels times the fp16 scale's relative error (2^-11): 0.562 steps
        assert (np.abs(new - old) <= step * (0.5 + 127 / 2048) + 1e-6).all(), name
        assert np.abs(new - old).max() > 0  # requantized, not copied
    stamp = out.stat().st_mtime_ns
    assert served_gguf(str(JUDGE_PYTHON), shipped, tmp_path) == out and out.stat().st_mtime_ns == stamp


def test_a_failed_requantization_is_named_and_leaves_nothing(tmp_path: Path) -> None:
    from arbor.tasks.env.serving import served_gguf

    with pytest.raises(RuntimeError, match=r"requantizing SmolLM2-135M-Instruct.Q4_1.gguf to Q8_0 with .* failed "
                                           r"\(1\): ModuleNotFoundError: No module named 'llama_cpp'"):
        served_gguf(sys.executable, shipped_gguf("smollm2"), tmp_path)
    assert not list((tmp_path / "models").iterdir())
