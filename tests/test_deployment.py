"""The deployment path a user follows: a Prefect server on loopback, the work pools `arbor` (CPU) and
`arbor-gpu` (the GPU node), `prefect deploy --all` from a directory that holds nothing but prefect.yaml (module-path
entrypoints: what a pip install deploys), a worker in another directory, an SFT start from the workspace's own data,
and an RL run from it that is also Retry as the Prefect UI does it: the deployment run, without
`run_id`, fails at step 2 (`ARBOR_FAULT`), is set back to AwaitingRetry through the API, and resumes the same
arbor run, its finished stages Cached. Then the GPU pool's limit, exactly as prefect.yaml sets it: two runs of test-only deployments on the GPU
pool run one after the other (the second Scheduled, then Late, while the first runs) where two on the CPU pool run
at once, and a key kept in a Secret block reaches GPU runs through the pool's env, in no deployment. The fast tests
read prefect.yaml: each paper's profile is deployed; tests/test_prefect_yaml.py checks the rest."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from test_prefect_yaml import deployments, gpu_limit, spec

from arbor.paths import PROJECT_ROOT, VLLM_ENV
from arbor.storage.parquet import read_table

PREFECT = str(Path(sys.executable).parent / "prefect")
TESTS = Path(__file__).resolve().parent
SECRET_ENV, SECRET_BLOCK, SECRET = "ARBOR_TEST_POOL_KEY", "arbor-test-pool-key", "sk-pool-secret-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prefect(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 300, ok: bool = True
            ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([PREFECT, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 or not ok, f"prefect {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _until(what: str, check: Callable[[], Any], timeout: float = 300) -> Any:
    """Poll ``check`` until it returns something truthy (and return that); fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (got := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)
    return got


def _deployments() -> dict[tuple[str, str], dict]:
    """prefect.yaml's deployments by (flow, name)."""
    return deployments()


@pytest.mark.parametrize(("flow", "profile"), [
    ("arbor-sft", "qwen3-8b-rubricem"), ("arbor-train", "qwen3-8b-rubricem"), ("arbor-eval", "qwen3-8b-rubricem"),
    ("arbor-sft", "qwen3-4b-arco"), ("arbor-train", "qwen3-4b-arco"),
    ("arbor-guidance-train", "qwen3-8b-coreact"), ("arbor-eval", "qwen3-8b-coreact"),
])
def test_paper_profiles_are_deployed(flow: str, profile: str) -> None:
    """Each paper's profile is deployed (RubricEM and ARCO: their SFT start, then RL; Co-ReAct, which
    trains no policy: its generator, then guided evaluation), on the GPU pool (one run at a time), and its parameters
    load."""
    from arbor.config import load_config

    dep = _deployments()[(flow, profile)]
    assert dep["parameters"]["profile"] == profile and dep["work_pool"]["name"] == gpu_limit()[0]  # one at a time
    cfg = load_config(profile, dep["parameters"].get("overrides"))
    assert cfg.run.profile == profile


def test_coreact_generator_is_trained_against_the_papers_evaluator() -> None:
    """App. A: Gemini 2.5 Pro scores the slates while the generator trains; the profile keeps the inference verifier."""
    from arbor.config import load_config

    dep = _deployments()[("arbor-guidance-train", "qwen3-8b-coreact")]
    train = load_config("qwen3-8b-coreact", dep["parameters"]["overrides"]).judge.for_role("step_verify")
    assert (train["model"], train["api_key_env"]) == ("gemini-2.5-pro", "GEMINI_API_KEY")
    assert load_config("qwen3-8b-coreact").judge.for_role("step_verify")["model"] == "Qwen/Qwen3-14B"


def _get(api: str, path: str, **params: Any) -> Any:
    got = httpx.get(f"{api}{path}", params=params, timeout=60)
    got.raise_for_status()
    return got.json()


def _post(api: str, path: str, body: dict | None = None) -> Any:
    got = httpx.post(f"{api}{path}", json=body or {}, timeout=60)
    got.raise_for_status()
    return got.json()


def _run(api: str, deployment: str, parameters: dict[str, Any]) -> str:
    """A flow run of ``deployment`` (flow/name), scheduled now, as `prefect deployment run` makes it; its id."""
    dep = _get(api, f"/deployments/name/{deployment}")
    return _post(api, f"/deployments/{dep['id']}/create_flow_run", {"parameters": parameters})["id"]


def _history(api: str, run_id: str) -> list[tuple[datetime, str, str]]:
    """A flow run's states in order: (timestamp, type, name)."""
    states = _get(api, "/flow_run_states/", flow_run_id=run_id)
    return sorted((datetime.fromisoformat(s["timestamp"]), s["type"], s["name"]) for s in states)


SFT_ROWS = [{"question": f"Who founded company {i}?", "golds": [f"Person {i}"],
             "response": f"<think>I should search.</think>\n<search>company {i} founder</search>\n<result>\nCompany {i}"
                         f" was founded by Person {i}.\n</result>\n<think>Found it.</think>\n"
                         f"<answer>\\boxed{{Person {i}}}</answer>"} for i in range(8)]


@pytest.mark.slow
def test_deploy_and_run_from_anywhere(tmp_path: Path) -> None:
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    home, deploy_dir, work_dir = tmp_path / "home", tmp_path / "deploy", tmp_path / "worker"
    for d in (deploy_dir, work_dir):
        d.mkdir()
    shutil.copy(PROJECT_ROOT / "prefect.yaml", deploy_dir / "prefect.yaml")  # and nothing else of the checkout
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_API_URL": api, "ARBOR_HOME": str(home),
           "PATH": os.pathsep.join([str(Path(PREFECT).parent), os.environ.get("PATH", "")]),  # the build step's
           "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),  # the probe
           "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_SERVER_SERVICES_LATE_RUNS_AFTER_SECONDS": "1",
           "PREFECT_SERVER_SERVICES_LATE_RUNS_LOOP_SECONDS": "1",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}
    for var in ("ARBOR_PROJECT_DIR", SECRET_ENV):
        env.pop(var, None)
    cpu_pool = spec()["definitions"]["work_pools"]["cpu"]["name"]
    gpu_pool, limit = gpu_limit()
    server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[subprocess.Popen] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            pytest.fail("prefect server did not become healthy")
        # the set-up docs/gpu.md gives: two process pools; the GPU pool's env names a key kept in a Secret block
        _prefect(["work-pool", "create", cpu_pool, "--type", "process"], env, work_dir)
        _prefect(["work-pool", "create", gpu_pool, "--type", "process"], env, work_dir)
        subprocess.run([sys.executable, "-c", "import sys; from prefect.blocks.system import Secret; "
                        f"Secret(value=sys.stdin.read()).save({SECRET_BLOCK!r})"], input=SECRET, text=True, env=env,
                       cwd=work_dir, check=True, capture_output=True, timeout=120)
        template = json.loads(_prefect(["work-pool", "get-default-base-job-template", "--type", "process"], env,
                                       work_dir).stdout)
        template["variables"]["properties"]["env"]["default"] = {
            SECRET_ENV: "{{ prefect.blocks.secret." + SECRET_BLOCK + " }}"}
        (tmp_path / "gpu-pool.json").write_text(json.dumps(template))
        _prefect(["work-pool", "update", gpu_pool, "--base-job-template", str(tmp_path / "gpu-pool.json")], env,
                 work_dir)
        assert _get(api, f"/work_pools/{gpu_pool}")["concurrency_limit"] is None  # not set by hand: deploy sets it

        _prefect(["--no-prompt", "deploy", "--all"], env, deploy_dir, timeout=900)
        assert _get(api, f"/work_pools/{gpu_pool}")["concurrency_limit"] == limit == 1
        flows = {f["id"]: f["name"] for f in _post(api, "/flows/filter")}
        served = {(flows[d["flow_id"]], d["name"]): d for d in _post(api, "/deployments/filter")}
        assert set(served) == set(deployments()), sorted(set(served) ^ set(deployments()))
        for key, dep in deployments().items():
            got = served[key]
            assert (got["entrypoint"], got["work_pool_name"]) == (dep["entrypoint"], dep["work_pool"]["name"]), key
            assert got["global_concurrency_limit"] is None and got["pull_steps"] == spec()["pull"], key
        assert SECRET not in json.dumps(list(served.values()))

        # docs/usage.md "SFT, then RL, as Prefect deployments": SFT data written as data/sft/<file>.jsonl in the workspace, then arbor-sft and an
        # arbor-train run from its SFT start, by a worker started outside the checkout, which runs each flow in a
        # temporary directory of its own: `sft.data` given relative is read from ARBOR_HOME (it was resolved against
        # the worker's temporary directory and refused). The train run is also Retry in the UI: started without
        # run_id, it fails at step 2, is set back to AwaitingRetry and resumes the same arbor run
        (home / "data" / "sft").mkdir(parents=True)
        (home / "data" / "sft" / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in SFT_ROWS))
        sft = {"sft.data": "data/sft/mine.jsonl", "sft.epochs": 1, "sft.batch_size": 4, "sft.max_length": 256}
        two = {"run.steps": 2, "run.sft_warm_start": True, "rollout.batch_size": 2, "rollout.k": 2,
               "rollout.max_new_tokens_per_turn": 16, "rollout.max_turns": 2, **sft}
        _prefect(["deployment", "run", "arbor-sft/tiny-cpu", "--param", f"overrides={json.dumps(sft)}"], env,
                 work_dir)
        _prefect(["worker", "start", "--pool", cpu_pool, "--run-once"], env, work_dir, timeout=600)
        [sft_run] = _post(api, "/flow_runs/filter")
        assert sft_run["state"]["type"] == "COMPLETED", sft_run  # the worker exits 0 even on failure
        _prefect(["deployment", "run", "arbor-train/tiny-cpu", "--param", f"overrides={json.dumps(two)}"], env,
                 work_dir)
        _prefect(["worker", "start", "--pool", cpu_pool, "--run-once"], {**env, "ARBOR_FAULT": "2:score"},
                 work_dir, timeout=600, ok=False)
        failed = [r for r in _post(api, "/flow_runs/filter") if r["id"] != sft_run["id"]]
        assert [r["state"]["type"] for r in failed] == ["FAILED"], failed
        fid, rid = failed[0]["id"], failed[0]["name"]  # the flow run is named after the arbor run
        assert rid.startswith("tiny-cpu-") and rid.endswith(fid.replace("-", "")[:8])
        got = _post(api, f"/flow_runs/{fid}/set_state",
                    {"state": {"type": "SCHEDULED", "name": "AwaitingRetry"}, "force": True})
        assert got["status"] == "ACCEPT", got
        _prefect(["worker", "start", "--pool", cpu_pool, "--run-once"], env, work_dir, timeout=600)
        after = _get(api, f"/flow_runs/{fid}")
        assert after["state"]["type"] == "COMPLETED" and after["name"] == rid, after
        tasks = _post(api, "/task_runs/filter", {"flow_runs": {"id": {"any_": [fid]}}})
        states: dict[str, list[str]] = {}
        for t in sorted(tasks, key=lambda t: t["expected_start_time"] or ""):
            states.setdefault(t["name"], []).append(t["state"]["name"])

        # The GPU pool's limit as prefect.yaml sets it: test-only deployments of a flow that holds its slot until
        # released, on the work pool (and build step) of arbor-train/qwen3-8b, and for contrast of arbor-train/tiny-cpu
        gpu_dep, cpu_dep = deployments()[("arbor-train", "qwen3-8b")], deployments()[("arbor-train", "tiny-cpu")]
        probes = {**{f"gpu-{x}": {"work_pool": gpu_dep["work_pool"], "build": gpu_dep["build"]} for x in "ab"},
                  **{f"cpu-{x}": {"work_pool": cpu_dep["work_pool"]} for x in "ab"}}
        probe_dir = tmp_path / "probe"
        probe_dir.mkdir()
        (probe_dir / "prefect.yaml").write_text(yaml.safe_dump({
            "name": "arbor-probe", "pull": spec()["pull"],
            "deployments": [{"name": n, "entrypoint": "flow_support.probe", **p} for n, p in probes.items()]}))
        _prefect(["--no-prompt", "deploy", "--all"], env, probe_dir)
        probe_runs = {n: _run(api, f"arbor-probe/{n}", {"gate": str(tmp_path / f"{n}.gate"), "key_env": SECRET_ENV,
                                                        "report": str(tmp_path / f"{n}.json")}) for n in probes}
        gpu, cpu = ["gpu-a", "gpu-b"], ["cpu-a", "cpu-b"]
        for pool in (gpu_pool, cpu_pool):
            with open(tmp_path / f"worker-{pool}.log", "w") as log:
                workers.append(subprocess.Popen([PREFECT, "worker", "start", "--pool", pool], env=env, cwd=work_dir,
                                                stdout=log, stderr=subprocess.STDOUT))

        def now() -> dict[str, dict[str, Any]]:
            seen = {n: _get(api, f"/flow_runs/{i}")["state"] for n, i in probe_runs.items()}
            assert sum(seen[n]["type"] in ("PENDING", "RUNNING") for n in gpu) <= limit, seen  # at no poll
            return seen

        def first_runs_second_waits() -> tuple[str, str] | None:
            seen = now()
            running = [n for n in gpu if seen[n]["type"] == "RUNNING"]
            late = [n for n in gpu if (seen[n]["type"], seen[n]["name"]) == ("SCHEDULED", "Late")]
            if all(seen[n]["type"] == "RUNNING" for n in cpu) and len(running) == len(late) == 1:
                return running[0], late[0]
            return None

        first, second = _until("a GPU run Running, the other Late, both CPU runs Running", first_runs_second_waits)
        for n in probes:
            (tmp_path / f"{n}.gate").touch()
        terminal = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")

        def ended() -> dict[str, dict[str, Any]] | None:
            seen = now()
            return seen if all(v["type"] in terminal for v in seen.values()) else None

        done = _until("the probe runs' end", ended)
        assert all(v["type"] == "COMPLETED" for v in done.values()), done
        history = {n: _history(api, i) for n, i in probe_runs.items()}
        flow_runs = {n: _get(api, f"/flow_runs/{i}") for n, i in probe_runs.items()}

        # a worker without ARBOR_HOME: the pull step refuses to start the run
        for w in workers:
            w.terminate()
            w.wait(timeout=180)
        workers.clear()
        unset = _run(api, "arbor-probe/cpu-a", {"gate": str(tmp_path / "cpu-a.gate"),
                                                "report": str(tmp_path / "unset.json")})
        unguarded = _prefect(["worker", "start", "--pool", cpu_pool, "--run-once"],
                             {k: v for k, v in env.items() if k != "ARBOR_HOME"}, work_dir, timeout=600, ok=False)
        refused = _get(api, f"/flow_runs/{unset}")
        stored = json.dumps([_post(api, "/deployments/filter"), _post(api, "/flow_runs/filter")])

        # the command users named, on this machine (no GPU, no vLLM, no keys): refused in one line, no run written
        qwen = _run(api, "arbor-train/qwen3-8b", {"profile": "qwen3-8b"})
        _prefect(["worker", "start", "--pool", gpu_pool, "--run-once"], env, work_dir, timeout=600, ok=False)
        qwen_state = _get(api, f"/flow_runs/{qwen}")["state"]
    finally:
        for w in workers:
            w.terminate()
            w.wait(timeout=180)
        server.terminate()
        server.wait(timeout=30)
    assert qwen_state["type"] == "FAILED", qwen_state
    why = qwen_state["message"]
    assert why.startswith("PreflightError: profile 'qwen3-8b' cannot start here: ") and "\n" not in why, why
    for missing in ("but this machine has 0", "DASHSCOPE_API_KEY is not set", "SERPER_API_KEY is not set",
                    "sft.data: no such file"):
        assert missing in why, (missing, why)
    # vLLM is named only until make vllm-env has built the checkout's .venv-vllm, found from the worker's directory
    assert ("cluster.vllm_executable: no `vllm` on PATH" in why) != (VLLM_ENV / "bin" / "vllm").exists(), why
    assert not any(r["run_id"].startswith("qwen3-8b") for r in read_table("runs", home=home).to_pylist())
    assert not [p for p in (home / "runs").iterdir() if p.name.startswith("qwen3-8b")]
    [made] = [p for p in (home / "sft").iterdir() if (p / "arbor_sft.json").exists()]
    assert json.loads((made / "arbor_sft.json").read_text())["data"] == str(home / "data/sft/mine.jsonl")
    stored_cfg = yaml.safe_load((home / "runs" / rid / "config.yaml").read_text())
    assert str(home / "data/sft/mine.jsonl") in json.dumps(stored_cfg)  # the run's config names the file it read
    # the retried flow run trained the run it started: step 1 from its first attempt (Cached), step 2 completed
    for stage in ("rollout", "score", "retire", "induce", "shape", "consolidate", "train"):
        assert states[f"{stage}-step1"] == ["Completed", "Cached"], (stage, states)
    assert states["rollout-step2"] == ["Completed", "Cached"] and states["score-step2"] == ["Failed", "Completed"]
    assert [s["step"] for s in read_table("steps", run_id=rid, home=home).to_pylist()] == [1, 2]

    # GPU: the second run was Scheduled (Late by then) from before the first started Running until after the first
    # ended, and was handed to the worker (Pending) only then
    at = {n: {name: [t for t, _, nm in h if nm == name] for _, _, name in h} for n, h in history.items()}
    first_running, first_done = at[first]["Running"][0], at[first]["Completed"][-1]
    assert [s for s in history[second] if s[0] <= first_running], history[second]  # it was there before
    assert all(kind == "SCHEDULED" for t, kind, _ in history[second] if t <= first_done), history[second]
    assert min(t for t, kind, _ in history[second] if kind == "PENDING") >= first_done, history
    assert "Late" in at[second], history[second]
    start, end = (datetime.fromisoformat(flow_runs[n][k]) for n, k in ((second, "start_time"), (first, "end_time")))
    assert start >= end, (flow_runs[first], flow_runs[second])
    # CPU (no limit): its two runs ran at once
    assert max(at[n]["Running"][0] for n in cpu) < min(at[n]["Completed"][-1] for n in cpu), history
    # the Secret block's key reached the GPU runs through the pool's env, and is stored in no deployment or run
    reports = {n: json.loads((tmp_path / f"{n}.json").read_text()) for n in probes}
    key = hashlib.sha256(SECRET.encode()).hexdigest()
    assert {n: r["key_sha256"] for n, r in reports.items()} == {n: key if n in gpu else None for n in probes}
    assert all(r["arbor_home"] == str(home) and not Path(r["cwd"]).is_relative_to(PROJECT_ROOT)
               for r in reports.values()), reports
    assert SECRET not in stored
    # no ARBOR_HOME: refused before the flow started (Crashed; the reason is in the worker's output)
    assert refused["state"]["type"] == "CRASHED" and not (tmp_path / "unset.json").exists(), refused
    assert "arbor: set ARBOR_HOME to an absolute path" in unguarded.stdout + unguarded.stderr, unguarded.stderr[-3000:]
