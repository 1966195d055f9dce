"""The README's runbook, from a fresh 8-GPU node to Table 1, walked step by step on this machine.

Every command of every step is either run here as written (``/data/arbor`` becomes a temporary workspace,
``.venv/bin`` this interpreter's folder) or, where it needs a GPU, the network or a running Prefect server, checked
as far as it can go (``make -n``, ``--help``) and named with the test that runs it end to end. A command added to
the runbook without a check here fails ``test_every_runbook_command_is_walked``."""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from arbor.paths import PROJECT_ROOT

README = PROJECT_ROOT / "README.md"
BIN = Path(sys.executable).parent  # the runbook's .venv/bin
DATA = "/data/arbor"  # the runbook's ARBOR_HOME


def runbook_steps() -> dict[int, list[str]]:
    """Step number -> the commands (code spans) the step gives, in order."""
    text = README.read_text(encoding="utf-8")
    body = text.split("## From a fresh 8-GPU node to the paper's Table 1 (the runbook)", 1)[1].split("\n## ", 1)[0]
    steps: dict[int, list[str]] = {}
    for m in re.finditer(r"^(\d+)\. (.*?)(?=^\d+\. |\Z)", body, re.S | re.M):
        spans = re.findall(r"`([^`]+)`", m.group(2).replace("\n", " "))
        steps[int(m.group(1))] = [re.sub(r"\s+", " ", s) for s in spans if _is_command(s)]
    return steps


def _is_command(span: str) -> bool:
    return span.startswith(("make ", ".venv/bin/", "ARBOR_HOME=", "export ", "arbor "))


def _words(command: str, home: Path) -> list[str]:
    """The command as this machine runs it: the workspace for /data/arbor, this venv for .venv/bin."""
    words = shlex.split(command.replace(DATA, str(home)))
    while words and re.match(r"^[A-Z_]+=", words[0]):  # ARBOR_HOME=... prefix: the environment below sets it
        words.pop(0)
    if words[0].startswith(".venv/bin/") or words[0] == "arbor":
        words[0] = str(BIN / words[0].removeprefix(".venv/bin/"))
    return words


def _run(words: list[str], home: Path, env: dict[str, str] | None = None, cwd: Path | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    full |= {"ARBOR_HOME": str(home), "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(words, cwd=cwd or PROJECT_ROOT, env=full, capture_output=True, text=True, timeout=timeout)


def _test_exists(nodeid: str) -> bool:
    """``tests/file.py::test_name`` names a test function of that file."""
    path, name = nodeid.split("::")
    tree = ast.parse((PROJECT_ROOT / path).read_text(encoding="utf-8"))
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


# ---- the checks, one per command (matched by prefix) ------------------------------------------------------------
def _torch_setup(cmd: str, home: Path, ctx: dict) -> None:
    """Step 1 on this venv, as a dry run: the changed TORCH_SPEC reinstalls torch from the README's index."""
    words = _words(cmd, home)
    spec = next(w.split("=", 1)[1] for w in words if w.startswith("TORCH_SPEC="))
    index = next(w.split("=", 1)[1] for w in words if w.startswith("TORCH_INDEX="))
    out = _run([*words[:1], "-n", "--no-print-directory", *words[1:]], home)
    assert out.returncode == 0, out.stderr
    assert f'--index-url "{index}" "{spec}"' in out.stdout and "pip uninstall -q -y torch" in out.stdout, out.stdout


def _vllm_env(cmd: str, home: Path, ctx: dict) -> None:
    """Step 2: the target builds the environment the runs look in (arbor.paths.VLLM_ENV)."""
    from arbor.paths import VLLM_ENV

    out = _run(["make", "-n", "--no-print-directory", "vllm-env"], home)
    assert out.returncode == 0 and VLLM_ENV.relative_to(PROJECT_ROOT).as_posix() in out.stdout, out.stdout


def _hf(cmd: str, home: Path, ctx: dict) -> None:
    """Steps 3, 4 and 12: the Hub is not reachable here; the command and every option it uses exist."""
    words = _words(cmd, home)
    out = _run([*words[:2], "--help"], home)
    assert out.returncode == 0, out.stderr
    options = [w for w in words if w.startswith("--")]
    assert all(o in out.stdout for o in options), (options, out.stdout)


def _sft_convert(cmd: str, home: Path, ctx: dict) -> None:
    """Step 4: the shipped Tool-Star sample under the downloaded file's name, converted to where qwen3-8b reads it."""
    from arbor.config import load_config

    words = _words(cmd, home)
    shutil.copy(PROJECT_ROOT / "data" / "sft" / "sample_toolstar.json", ctx["cwd"] / words[3])
    out = _run(words, home, cwd=ctx["cwd"])
    assert out.returncode == 0, out.stderr
    written = Path(words[words.index("--out") + 1])
    assert written.read_text().count("\n") == 2  # the sample's two search-only rows
    assert written == home / load_config("qwen3-8b").sft.data


def _keys(cmd: str, home: Path, ctx: dict) -> None:
    """Steps 5 and 6: variables exported for the commands after them (a key's `...` becomes a made-up key)."""
    for word in shlex.split(cmd)[1:]:
        name, value = word.split("=", 1)
        ctx["env"][name] = "sk-runbook-not-a-real-key" if value == "..." else value


def _train_qwen3(cmd: str, home: Path, ctx: dict) -> None:
    """Step 5's check: refused in one line that names only what a GPU node supplies (its GPUs, the weights of step
    3 in its cache, the judge's endpoint on its network, the GPU torch of step 1), never the keys or the SFT data;
    vLLM only while .venv-vllm is not built."""
    from arbor.paths import VLLM_ENV

    out = _run(_words(cmd, home), home, env=ctx["env"])
    why = out.stderr.strip()
    assert out.returncode == 2 and why.startswith("error: profile 'qwen3-8b' cannot start here: "), out
    assert "\n" not in why and "Traceback" not in why, why
    named = set(re.findall(r"(?:cannot start here: |; )([a-z_]+(?:\.[a-z_]+)*(?:=\w+)?): ", why))
    gpu_node = {"cluster", "policy.model", "memory.embedder", "judge.base_url", "cluster.weight_sync=nccl",
                "cluster.vllm_executable"}
    assert "cluster" in named and named <= gpu_node, named
    assert ("cluster.vllm_executable" in named) != (VLLM_ENV / "bin" / "vllm").exists(), why
    assert not (home / "runs").exists()  # nothing of a run written


def _prefect_server(cmd: str, home: Path, ctx: dict) -> None:
    """Steps 6 and 7: the server, its pool and worker run in test_deployment; the pool is prefect.yaml's GPU pool."""
    words = _words(cmd, home)
    if "work-pool" in words or "worker" in words:
        pool = words[words.index("--pool") + 1] if "--pool" in words else words[words.index("create") + 1]
        spec = yaml.safe_load((PROJECT_ROOT / "prefect.yaml").read_text())
        assert pool == spec["definitions"]["work_pools"]["gpu"]["name"], pool
    out = _run([words[0], *[w for w in words[1:3] if not w.startswith("-")], "--help"], home)
    assert out.returncode == 0, out.stderr
    assert _test_exists("tests/test_deployment.py::test_deploy_and_run_from_anywhere")


def _deployment_run(cmd: str, home: Path, ctx: dict) -> None:
    """Step 8: the deployment is prefect.yaml's and each --param is a parameter of its flow (run in
    test_deployment: arbor-sft and arbor-train to completion, arbor-train/qwen3-8b to its preflight refusal)."""
    import importlib
    import inspect

    words = _words(cmd, home)
    flow_name, name = words[3].split("/")
    spec = yaml.safe_load((PROJECT_ROOT / "prefect.yaml").read_text())
    flows = {}
    for d in spec["deployments"]:
        module, func = d["entrypoint"].rsplit(".", 1)
        fn = getattr(importlib.import_module(module), func)
        flows[(fn.name, d["name"])] = fn
    assert (flow_name, name) in flows, sorted(flows)
    fn = flows[flow_name, name]
    params = inspect.signature(fn.fn).parameters
    for i, w in enumerate(words):
        if w == "--param":
            assert words[i + 1].split("=", 1)[0] in params, (words[i + 1], list(params))
    assert _test_exists("tests/test_deployment.py::test_deploy_and_run_from_anywhere")


def _cli(cmd: str, home: Path, ctx: dict) -> None:
    """Steps 9-12's arbor commands: `arbor runs` runs as written on the workspace; the others need a trained run
    and are run in the named tests; here each answers --help with every option the line uses."""
    words = _words(cmd, home)
    if words[1] == "runs":
        out = _run(words, home)
        assert out.returncode == 0 and out.stdout.startswith("run_id ") and "(0 rows)" in out.stdout, out
        return
    out = _run([*words[:2], "--help"], home)
    assert out.returncode == 0, out.stderr
    assert all(o in out.stdout for o in words if o.startswith("--")), (words, out.stdout)
    assert _test_exists(CLI_TESTS[words[1]]), CLI_TESTS[words[1]]


CLI_TESTS = {"train": "tests/test_flow_train.py::test_resume_after_failure_in_each_stage",
             "report": "tests/test_table1.py::test_arbor_report_compares_existing_runs",
             "export": "tests/test_read_commands.py::test_each_read_command_on_a_run_of_each_method"}


def _tensorboard(cmd: str, home: Path, ctx: dict) -> None:
    """Step 9: tensorboard is installed and reads the folder runs write (tracking.loggers' tb/<run>)."""
    from arbor.config import ArborConfig

    words = _words(cmd, home)
    assert Path(words[0]).is_file() and words[words.index("--logdir") + 1] == str(home / "tb")
    assert "tensorboard" in ArborConfig().tracking.loggers


CHECKS: dict[str, Callable[[str, Path, dict], None]] = {
    "make setup TORCH_SPEC=": _torch_setup, "make vllm-env": _vllm_env, ".venv/bin/hf ": _hf,
    ".venv/bin/arbor sft convert": _sft_convert, "export ": _keys, ".venv/bin/arbor train -p qwen3-8b": _train_qwen3,
    ".venv/bin/prefect deployment run": _deployment_run, ".venv/bin/prefect ": _prefect_server,
    "ARBOR_HOME=/data/arbor .venv/bin/prefect ": _prefect_server, ".venv/bin/tensorboard": _tensorboard,
    "ARBOR_HOME=/data/arbor .venv/bin/arbor ": _cli, ".venv/bin/arbor ": _cli, "arbor ": _cli,
}


def check_of(command: str) -> Callable[[str, Path, dict], None] | None:
    """The first check whose prefix the command starts with (CHECKS lists the narrower prefixes first)."""
    return next((f for prefix, f in CHECKS.items() if command.startswith(prefix)), None)


def test_the_runbook_has_its_twelve_steps() -> None:
    steps = runbook_steps()
    assert list(steps) == list(range(1, 13)), list(steps)
    assert all(steps[n] for n in range(1, 13) if n != 9) and sum(map(len, steps.values())) >= 20, steps


def test_every_runbook_command_is_walked() -> None:
    unchecked = [c for cmds in runbook_steps().values() for c in cmds if check_of(c) is None]
    assert not unchecked, f"runbook commands without a check in tests/test_runbook.py: {unchecked}"


def test_the_runbook_walked_in_order(tmp_path: Path) -> None:
    """Every step in order, in one workspace: the keys exported in step 5 reach the commands after it."""
    home, cwd = tmp_path / "data-arbor", tmp_path / "checkout"
    home.mkdir()
    cwd.mkdir()
    ctx: dict = {"env": {}, "cwd": cwd}
    walked = []
    for n, commands in runbook_steps().items():
        for command in commands:
            check = check_of(command)
            assert check is not None, command
            check(command, home, ctx)
            walked.append((n, check.__name__))
    assert {"_torch_setup", "_sft_convert", "_train_qwen3", "_cli"} <= {name for _, name in walked}, walked


@pytest.mark.parametrize("prefix", list(CHECKS))
def test_each_check_is_used(prefix: str) -> None:
    """No check is left for a command the runbook no longer gives."""
    commands = [c for cmds in runbook_steps().values() for c in cmds]
    assert any(c.startswith(prefix) and check_of(c) is CHECKS[prefix] for c in commands), prefix
