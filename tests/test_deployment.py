"""The deployment path a user follows (issue 7): a Prefect server on loopback, a process work pool,
`prefect deploy --all` from prefect.yaml, `prefect deployment run 'arbor-train/tiny-cpu'`, a worker — and a
completed 1-step run in the workspace. Then Retry as the Prefect UI does it (issue 13): a deployment run without
`run_id` fails at step 2 (`ARBOR_FAULT`), is set back to AwaitingRetry through the API, and resumes the same arbor
run, its finished stages Cached. The fast tests read prefect.yaml: each paper's profile is deployed (issue 33)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from arbor.paths import PROJECT_ROOT
from arbor.storage.parquet import read_table

PREFECT = str(Path(sys.executable).parent / "prefect")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prefect(args: list[str], env: dict[str, str], timeout: float = 300, ok: bool = True
            ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([PREFECT, *args], env=env, cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0 or not ok, f"prefect {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _deployments() -> dict[tuple[str, str], dict]:
    """prefect.yaml's deployments by (flow, name)."""
    import yaml

    flows = {"flows/train.py:arbor_train": "arbor-train", "flows/sft.py:arbor_sft": "arbor-sft",
             "flows/evaluate.py:arbor_eval": "arbor-eval",
             "flows/guidance.py:arbor_guidance_train": "arbor-guidance-train"}
    spec = yaml.safe_load((PROJECT_ROOT / "prefect.yaml").read_text())
    return {(flows[d["entrypoint"]], d["name"]): d for d in spec["deployments"]}


@pytest.mark.parametrize(("flow", "profile"), [
    ("arbor-sft", "qwen3-8b-rubricem"), ("arbor-train", "qwen3-8b-rubricem"), ("arbor-eval", "qwen3-8b-rubricem"),
    ("arbor-sft", "qwen3-4b-arco"), ("arbor-train", "qwen3-4b-arco"),
    ("arbor-guidance-train", "qwen3-8b-coreact"), ("arbor-eval", "qwen3-8b-coreact"),
])
def test_paper_profiles_are_deployed(flow: str, profile: str) -> None:
    """Issue 33: each paper's profile is deployed (RubricEM and ARCO: their SFT start, then RL; Co-ReAct, which
    trains no policy: its generator, then guided evaluation), one run at a time, and its parameters load."""
    from arbor.config import load_config

    dep = _deployments()[(flow, profile)]
    assert dep["parameters"]["profile"] == profile and dep["concurrency_limit"] == 1
    cfg = load_config(profile, dep["parameters"].get("overrides"))
    assert cfg.run.profile == profile


def test_coreact_generator_is_trained_against_the_papers_evaluator() -> None:
    """App. A: Gemini 2.5 Pro scores the slates while the generator trains; the profile keeps the inference verifier."""
    from arbor.config import load_config

    dep = _deployments()[("arbor-guidance-train", "qwen3-8b-coreact")]
    train = load_config("qwen3-8b-coreact", dep["parameters"]["overrides"]).judge.for_role("step_verify")
    assert (train["model"], train["api_key_env"]) == ("gemini-2.5-pro", "GEMINI_API_KEY")
    assert load_config("qwen3-8b-coreact").judge.for_role("step_verify")["model"] == "Qwen/Qwen3-14B"


@pytest.mark.slow
def test_deploy_and_run_tiny_cpu(tmp_path: Path) -> None:
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_API_URL": api,
           "ARBOR_HOME": str(tmp_path / "home"), "ARBOR_PROJECT_DIR": str(PROJECT_ROOT),
           "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}
    server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
        _prefect(["work-pool", "create", "arbor", "--type", "process", "--overwrite"], env)
        _prefect(["--no-prompt", "deploy", "--all"], env)
        listing = _prefect(["deployment", "ls"], env).stdout
        for name in ("arbor-train/tiny-cpu", "arbor-train/qwen3-8b", "arbor-sft/tiny-cpu", "arbor-eval/tiny-cpu"):
            assert name in listing, listing
        overrides = {"run.steps": 1, "run.sft_warm_start": False, "rollout.batch_size": 2, "rollout.k": 2,
                     "rollout.max_new_tokens_per_turn": 16, "rollout.max_turns": 2}
        _prefect(["deployment", "run", "arbor-train/tiny-cpu", "--param", f"overrides={json.dumps(overrides)}",
                  "--param", "run_id=deployed"], env)
        _prefect(["worker", "start", "--pool", "arbor", "--run-once"], env, timeout=600)
        runs = httpx.post(f"{api}/flow_runs/filter", json={}, timeout=10).json()
        assert [r["state"]["type"] for r in runs] == ["COMPLETED"], runs  # the worker exits 0 even on failure
        assert runs[0]["name"] == "deployed"  # the flow run is named after the arbor run
        deps = httpx.post(f"{api}/deployments/filter", json={}, timeout=10).json()
        limits = {(d["name"], (d.get("global_concurrency_limit") or {}).get("limit")) for d in deps}
        assert all((lim == 1) == name.startswith("qwen3") for name, lim in limits), limits  # GPU: one at a time
        papers = [d for d in deps if d["name"] in ("qwen3-8b-rubricem", "qwen3-4b-arco", "qwen3-8b-coreact")]
        assert len(papers) == 7, [d["name"] for d in papers]  # issue 33: sft, train, eval / guidance-train, eval

        # Retry in the UI: a run without run_id, failed at step 2, resumes the same arbor run
        two = {**overrides, "run.steps": 2}
        _prefect(["deployment", "run", "arbor-train/tiny-cpu", "--param", f"overrides={json.dumps(two)}"], env)
        _prefect(["worker", "start", "--pool", "arbor", "--run-once"], {**env, "ARBOR_FAULT": "2:score"},
                 timeout=600, ok=False)
        failed = [r for r in httpx.post(f"{api}/flow_runs/filter", json={}, timeout=10).json()
                  if r["name"] != "deployed"]
        assert [r["state"]["type"] for r in failed] == ["FAILED"], failed
        fid, rid = failed[0]["id"], failed[0]["name"]
        assert rid.startswith("tiny-cpu-") and rid.endswith(fid.replace("-", "")[:8])
        got = httpx.post(f"{api}/flow_runs/{fid}/set_state", timeout=10,
                         json={"state": {"type": "SCHEDULED", "name": "AwaitingRetry"}, "force": True}).json()
        assert got["status"] == "ACCEPT", got
        _prefect(["worker", "start", "--pool", "arbor", "--run-once"], env, timeout=600)
        after = httpx.get(f"{api}/flow_runs/{fid}", timeout=10).json()
        assert after["state"]["type"] == "COMPLETED" and after["name"] == rid, after
        tasks = httpx.post(f"{api}/task_runs/filter", timeout=10,
                           json={"flow_runs": {"id": {"any_": [fid]}}}).json()
        states: dict[str, list[str]] = {}
        for t in sorted(tasks, key=lambda t: t["expected_start_time"] or ""):
            states.setdefault(t["name"], []).append(t["state"]["name"])
    finally:
        server.terminate()
        server.wait(timeout=30)
    steps = read_table("steps", run_id="deployed", home=tmp_path / "home").to_pylist()
    assert [s["step"] for s in steps] == [1]
    # the retried flow run trained the run it started: step 1 from its first attempt (Cached), step 2 completed
    for stage in ("rollout", "score", "retire", "induce", "shape", "consolidate", "train"):
        assert states[f"{stage}-step1"] == ["Completed", "Cached"], (stage, states)
    assert states["rollout-step2"] == ["Completed", "Cached"] and states["score-step2"] == ["Failed", "Completed"]
    assert [s["step"] for s in read_table("steps", run_id=rid, home=tmp_path / "home").to_pylist()] == [1, 2]

