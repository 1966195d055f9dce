"""``make gpu-check``: the packer's plan and manifest (no network) and the GPU check's CPU dry run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


pack = _load("gpu_pack")
check = _load("gpu_check")


def fake_wheel(dest: Path, name: str, version: str, module: str | None = None, size: int = 0) -> Path:
    """A real (zip) wheel holding ``module`` (an importable package) and ``size`` bytes of padding."""
    w = dest / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(w, "w") as z:
        if module:
            z.writestr(f"{module}/__init__.py", "VALUE = 42\n")
        z.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", f"Name: {name}\nVersion: {version}\n")
        if size:
            z.writestr("pad.bin", b"\0" * size, compress_type=zipfile.ZIP_STORED)
    return w


def test_plan_pins_every_wheel_to_the_constraints_ci_runs() -> None:
    pins = pack.read_constraints(ROOT / "constraints.txt")
    items = pack.plan(pins)
    kinds = {i.name: i.kind for i in items}
    assert kinds["arbor-rl"] == "project" and kinds["deepspeed"] == "sdist"
    for n in ("pydantic", "pydantic_core", "annotated-types", "typing-inspection", "hjson", "duckdb"):
        assert kinds[n] == "binary"
    pinned = [i for i in items if i.kind != "project"]
    assert pinned and [i for i in pinned if i.version != pins[pack.norm(i.name)]] == []
    assert next(i for i in items if i.name == "deepspeed").version == "0.19.8"
    del pins["hjson"]  # the device has no resolver: an unpinned name is refused, not fetched at its latest
    with pytest.raises(ValueError, match="hjson"):
        pack.plan(pins)


def test_commands_fetch_cp312_manylinux_wheels_and_build_deepspeed_without_ops(tmp_path: Path) -> None:
    binary = pack.Item("binary", "pydantic_core", "2.50.4")
    cmd, env = pack.commands(binary, tmp_path, python="py")
    assert cmd[:3] == ["py", "-m", "pip"] and "download" in cmd and env == {}
    for flag in ("--no-deps", "--only-binary=:all:", "pydantic_core==2.50.4"):
        assert flag in cmd
    assert cmd[cmd.index("--python-version") + 1] == "3.12" and cmd[cmd.index("--implementation") + 1] == "cp"
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--platform"] == ["manylinux_2_17_x86_64",
                                                                          "manylinux2014_x86_64",
                                                                          "manylinux_2_28_x86_64"]
    cmd, env = pack.commands(pack.Item("sdist", "deepspeed", "0.19.8"), tmp_path)
    assert env == {"DS_BUILD_OPS": "0"} and "wheel" in cmd and "--no-build-isolation" in cmd
    assert "deepspeed==0.19.8" in cmd and cmd[cmd.index("--no-binary") + 1] == "deepspeed"
    cmd, _ = pack.commands(pack.Item("project", "arbor-rl"), tmp_path)
    assert cmd[-1] == str(ROOT) and "--no-deps" in cmd
    with pytest.raises(ValueError):
        pack.commands(pack.Item("other", "x"), tmp_path)


def test_manifest_checks_completeness_staleness_and_size(tmp_path: Path) -> None:
    items = [pack.Item("project", "arbor-rl"), pack.Item("binary", "hjson", "3.1.0")]
    fake_wheel(tmp_path, "arbor-rl", "0.1.0")
    with pytest.raises(ValueError, match="hjson==3.1.0: no wheel"):
        pack.manifest(tmp_path, items)
    fake_wheel(tmp_path, "hjson", "3.0.0")  # the wrong version is not the pinned one
    with pytest.raises(ValueError, match="not in the plan"):
        pack.manifest(tmp_path, items)
    (tmp_path / "hjson-3.0.0-py3-none-any.whl").unlink()
    fake_wheel(tmp_path, "hjson", "3.1.0", size=4096)
    m = pack.manifest(tmp_path, items)
    assert sorted(r["item"] for r in m["files"]) == ["arbor-rl", "hjson==3.1.0"]
    assert m["total_bytes"] == sum(p.stat().st_size for p in tmp_path.glob("*.whl")) > 4096
    assert all(len(r["sha256"]) == 64 for r in m["files"])
    with pytest.raises(ValueError, match="over the"):
        pack.manifest(tmp_path, items, limit=4096)


def test_unpacked_wheels_import_without_pip(tmp_path: Path) -> None:
    src, site = tmp_path / "pack", tmp_path / "site"
    src.mkdir()
    fake_wheel(src, "probe-pkg", "1.0", module="gpu_check_probe")
    assert pack.unpack(src, site) == ["probe_pkg-1.0-py3-none-any.whl"]
    out = subprocess.run([sys.executable, "-c", "import gpu_check_probe, importlib.metadata as m; "
                          "print(gpu_check_probe.VALUE, m.version('probe-pkg'))"],
                         env={"PYTHONPATH": str(site)}, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["42", "1.0"]


def test_device_command_fits_the_tool_and_carries_an_ignored_folder() -> None:
    cmd = pack.device_command()
    assert len(cmd) <= 2000 and '--out "$OUT"' in cmd and "bench/gpu_check.py" in cmd
    rel = str(pack.DEST.relative_to(ROOT))
    assert f"unpack {rel} " in cmd
    # only ignored paths need (and can be named in) `carry`: the folder must be one
    assert subprocess.run(["git", "check-ignore", "-q", rel], cwd=ROOT).returncode == 0


def test_mfu_counts_the_pi_old_pass_and_attention() -> None:
    shape = dict(num_hidden_layers=2, num_attention_heads=3, head_dim=4)
    # causal attention: sequence of 3 -> 1 + 2 + 3 (query, key) pairs, 4 * layers * heads * head_dim FLOPs each
    assert check.attention_flops(shape, [3]) == 4 * 2 * 3 * 4 * 6
    rows = [dict(row="matmul peak", status="ok", tflops=100.0),
            dict(row="train x", status="ok", model_flops=8 * 1e9 * 1e4, attn_flops=2e13, step_s=2.0)]
    check.finish(rows)
    assert rows[1]["mfu"] == pytest.approx(8e13 / 2 / 1e14)
    assert rows[1]["mfu_attn"] == pytest.approx(1e14 / 2 / 1e14)
    rows = [dict(row="matmul peak", status="timeout"), dict(row="train x", status="ok", model_flops=1.0,
                                                            attn_flops=0.0, step_s=1.0)]
    check.finish(rows)  # no peak, no MFU
    assert "mfu" not in rows[1]


def test_rollout_summary_is_parsed() -> None:
    out = ("agent loop : best    150.5 tok/s, median    140.0 tok/s (turns/trajectory mean 2.0, max 3)\n"
           "generate() : best    250.0 tok/s, median    245.0 tok/s\n"
           "ratio agent/generate: best 0.60, median 0.57  ->  does NOT reach 0.8\n")
    r = check.parse_rollout(out)
    assert r["ratio"] == 0.60 and r["tokens_s"] == 150.5 and "250 tok/s" in r["detail"]
    assert check.parse_rollout("Traceback ...\nRuntimeError: CUDA error") is None


def test_the_default_parts_fit_five_minutes_of_the_device() -> None:
    """Every default part's limit together within the default budget (300 s), so that `make gpu-check`, a change and
    a second `make gpu-check` fit the device's fifteen minutes; the parts not run by default are named."""
    assert sum(p.limit_s for p in check.PARTS) <= 300
    assert {p.name for p in check.PARTS} >= {"matmul", "train-1.7b-zero2", "train-0.6b-zero2", "rollout-b16",
                                             "rollout-b64", "arbor-step"}
    assert not {p.name for p in check.PARTS} & {p.name for p in check.MORE_PARTS}


@pytest.mark.timeout(600)
def test_dry_run_runs_every_code_path_and_reports_a_timed_out_part(tmp_path: Path) -> None:
    """The CPU dry run (``make gpu-check`` without CUDA, tiny sizes) of every code path of the default parts (the
    0.6B train part and the batch-64 rollout run the code of the 1.7B and batch-16 ones at other sizes): the matmul
    part is given no time (killed: a timeout row, and no MFU anywhere); every other row is measured: the trainer's
    steps, the profile, the weight-sync packing, both background saves' waits, the reload, the rollout ratio and one
    ARBOR step end to end with its seconds by stage."""
    out = tmp_path / "out"
    same_code = {"train-0.6b-zero2", "rollout-b64"}
    parts = [p for p in check.PARTS if p.name not in same_code]
    subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run", "--out", str(out),
                    "--limit", "matmul=0.05", "--parts", ",".join(p.name for p in parts)], check=True, cwd=ROOT,
                   capture_output=True, text=True)
    data = json.loads((out / "gpu_check.json").read_text())
    rows = {r["row"]: r for r in data["rows"]}
    assert set(rows) == {r for p in parts for r in p.rows}
    assert rows["matmul peak"]["status"].startswith("timeout")
    assert {n: r["status"] for n, r in rows.items() if r["status"] != "ok"} == {"matmul peak": rows["matmul peak"]["status"]}
    train = rows["train 1.7b zero2"]
    assert train["tokens_s"] > 0 and train["step_s"] > 0
    # one mini-batch (updates_per_batch 1): pi_old from the forward, no pi_old pass ran: 6N per token
    assert train["params"] == check.count_params(check.DRY_SHAPE) and train["old_pass"] is False
    wl = check.DRY_WORKLOAD
    assert train["model_flops"] == 6 * train["params"] * wl.seqs * (wl.prompt + wl.response)
    assert "mfu" not in train
    assert rows["checkpoint wait 1 1.7b"]["step_s"] > 0 and rows["checkpoint wait 2 1.7b"]["step_s"] > 0
    assert rows["checkpoint reserve 1.7b"]["step_s"] == 0.0  # a CPU trainer keeps no pool
    assert "self time by operator: " in rows["profile 1.7b"]["detail"]
    assert "Self CPU" in (out / "profile-1.7b.txt").read_text()
    assert rows["rollout b16"]["ratio"] > 0
    step = rows["arbor step 0.6b"]
    assert set(step["stages"]) == set(check.STEP_STAGES) and all(v >= 0 for v in step["stages"].values())
    assert step["step_s"] >= sum(step["stages"].values()) * 0.99
    text = (out / "gpu_check.txt").read_text()
    assert "CPU dry run" in text and "arbor step 0.6b" in text and "timeout" in text
    assert "===== arbor-step: rc 0" in (out / "gpu_check.log").read_text()
