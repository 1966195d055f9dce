"""Shared pieces of the integration tests: tiny run settings, reading a run back, comparing two runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from prefect import flow

from arbor.storage.parquet import read_table


def train_until_killed(home: Path, run_id: str, overrides: dict[str, Any], fault: str, log: Path,
                       profile: str = "tiny-cpu") -> None:
    """Run ``arbor train`` in a child process with ``ARBOR_FAULT=fault`` (a SIGKILL mode) against the test's
    Prefect server, and check that it died by SIGKILL (the log's tail otherwise)."""
    from prefect.settings import PREFECT_API_URL

    from arbor.paths import PROJECT_ROOT

    env = {**os.environ, "ARBOR_HOME": str(home), "ARBOR_FAULT": fault,
           "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    with open(log, "w") as out:
        proc = subprocess.run([sys.executable, "-m", "arbor.cli", "train", "-p", profile, "--run-id", run_id,
                               *[f"--set={k}={v}" for k, v in overrides.items()]], env=env, stdout=out,
                              stderr=subprocess.STDOUT, cwd=PROJECT_ROOT, timeout=900)
    assert proc.returncode == -9, log.read_text()[-2000:]


JUDGE_KEY_ENV = "ARBOR_TEST_JUDGE_KEY"
JUDGE_KEY = "sk-test-secret-0123456789"

# the world's short prompt, in the staged protocol's tags (tiny-world's own names <result>, which it refuses)
STAGED = {"rollout.protocol": "rubricem", "rollout.system_prompt": (
    "Answer the question by searching. Plan in <structured_plan></structured_plan>, search with <search>query"
    "</search>, read the <tool_output></tool_output>, weigh it in <state_evaluation></state_evaluation>, review in "
    "<review></review>, and give the final answer as <answer>\\boxed{answer}</answer>.")}


def tiny_overrides(start_checkpoint: Path, **extra: Any) -> dict[str, Any]:
    """Small enough for two cores: the tiny-cpu profile with 8 prompts x K=4 and two steps; one admitted draft
    triggers a consolidation (k_consol=1) over all of D (consolidation_batch=all: the rules judge abstracts a feature
    seen for two queries in one call) so that step 2 already activates a common rubric."""
    o: dict[str, Any] = {
        "run.steps": 2,
        "run.sft_warm_start": False,
        "run.start_checkpoint": str(start_checkpoint),
        "rollout.batch_size": 8,
        "rollout.k": 4,
        "memory.k_consol": 1,
        "memory.consolidation_batch": "all",
        "checkpoint.every": 1,
    }
    o.update(extra)
    return o


def sft_start(profile: str, shared: Path, overrides: dict[str, Any] | None = None) -> Path:
    """The SFT checkpoint of ``profile`` (with ``overrides``), trained once per test run and kept under
    ``shared/<profile>-<key>`` (its own workspace, keyed like the checkpoint: ``flows.sft.sft_key``). Whichever
    pytest worker asks first trains it while the others wait on its lock, then every worker reuses it. Developers
    keep the starts between runs with ARBOR_TEST_SFT_CACHE (checkpoints are content-addressed)."""
    import os

    from filelock import FileLock

    from arbor.config import load_config
    from arbor.flows.sft import sft_checkpoint, sft_key

    cfg = load_config(profile, overrides)
    root = Path(os.environ.get("ARBOR_TEST_SFT_CACHE") or shared)
    home = root / f"{profile}-{sft_key(cfg)}"
    home.mkdir(parents=True, exist_ok=True)
    old = os.environ.get("ARBOR_HOME")
    os.environ["ARBOR_HOME"] = str(home)
    try:
        with FileLock(str(home) + ".lock"):
            return sft_checkpoint(cfg, home)
    finally:
        if old is None:
            os.environ.pop("ARBOR_HOME", None)
        else:
            os.environ["ARBOR_HOME"] = old


class JsonServer:
    """A real HTTP server on 127.0.0.1 that answers JSON POSTs with ``answer(path, body, headers) -> (status,
    payload)``; every request is kept (path, body, ``X-API-KEY``) for assertions. A context manager."""

    def __init__(self, answer: Any) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "body": body, "key": self.headers.get("X-API-KEY")})
                status, payload = answer(self.path, body, self.headers)
                data = json.dumps(payload).encode() if payload is not None else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> JsonServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def retriever(search: Any) -> JsonServer:
    """A Search-R1 retriever (``POST /retrieve {queries, topk, return_scores}``) answering from a real search
    backend: ``{"result": [[{"document": {"id", "contents": '"Title"\\ntext'}, "score"}, ...]]}``."""
    def answer(path: str, body: dict[str, Any], headers: Any) -> tuple[int, Any]:
        if path != "/retrieve":
            return 404, None
        hits = search.search(list(body["queries"]), int(body["topk"]))
        return 200, {"result": [[{"document": {"id": h.doc_id, "contents": f'"{h.title}"\n{h.text}'},
                                  "score": h.score} for h in per_query] for per_query in hits]}
    return JsonServer(answer)


def wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    """The history rows of an offline W&B run (``run-<id>.wandb``: W&B's LevelDB-style log of protobuf
    ``Record``s — a 7-byte file header, then 32 KiB blocks of records with 7-byte headers: crc, length, type
    FULL / FIRST / MIDDLE / LAST); each row maps a metric name to its decoded JSON value."""
    import json
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    [path] = run_dir.glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    rows, pos, block, buf = [], 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if n == 0 and kind == 0:  # block padding
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + n], pos + 7 + n
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            if record.WhichOneof("record_type") == "history":
                rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
    return rows


def judge_server() -> Any:
    """The local OpenAI-compatible judge; its pairwise rule (fewer searches win) suits the tiny policy, whose
    memorised correct answers search less."""
    from openai_server import FaultPlan, OpenAIServer

    return OpenAIServer(FaultPlan(fewer_searches_win=True))


def openai_judge(base_url: str) -> dict[str, Any]:
    return {"judge.backend": "openai", "judge.base_url": base_url, "judge.api_key_env": JUDGE_KEY_ENV,
            "judge.model": "test-judge", "judge.max_retries": 2, "judge.backoff_base_s": 0.01}


def table(name: str, run_id: str, home: Path) -> list[dict[str, Any]]:
    return read_table(name, run_id=run_id, home=home).to_pylist()


def comparable_events(run_id: str, home: Path) -> list[tuple]:
    """rubric_events without the run id, in (step, seq) order."""
    rows = sorted(table("rubric_events", run_id, home), key=lambda e: (e["step"], e["seq"]))
    keys = [k for k in rows[0] if k != "run_id"] if rows else []
    return [tuple(_round(r[k]) for k in keys) for r in rows]


def shaped_rewards(run_id: str, home: Path) -> list[tuple[int, int, int, float]]:
    rows = table("trajectories", run_id, home)
    return sorted((r["step"], r["group"], r["sample"], round(r["shaped_reward"], 9)) for r in rows)


def _round(v: Any) -> Any:
    return round(v, 9) if isinstance(v, float) else v


@flow(name="arbor-probe")
def probe(gate: str, report: str, key_env: str = "", timeout_s: float = 300.0) -> str:
    """A test-only deployment's flow (tests/test_deployment.py): it writes what its flow run sees to ``report``
    (working directory, ``ARBOR_HOME``, the SHA-256 of ``$key_env`` or None), then holds its work pool's slot until
    the file ``gate`` exists (``TimeoutError`` after ``timeout_s``)."""
    import hashlib
    import json
    import time

    key = os.environ.get(key_env) if key_env else None
    Path(report).write_text(json.dumps({"cwd": os.getcwd(), "arbor_home": os.environ.get("ARBOR_HOME"),
                                        "key_sha256": hashlib.sha256(key.encode()).hexdigest() if key else None}))
    deadline = time.monotonic() + timeout_s
    while not Path(gate).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"probe: {gate} did not appear within {timeout_s} s")
        time.sleep(0.05)
    return "released"


class OneJudgeStep:
    """What a method's stage reads of a run (``tasks.methods.base.StepResources``), for one stage call of one judge:
    its groups, the judge, and an event loop that closes the judge when the stage's coroutine ends."""

    def __init__(self, judge: Any) -> None:
        self.judge, self.run_id, self.seed = judge, "r", 0

    def groups(self, ts: list[Any]) -> list[list[Any]]:
        return [[t for t in ts if t.group == g] for g in sorted({t.group for t in ts})]

    def run_async(self, coro: Any) -> Any:
        import asyncio

        async def closing() -> Any:
            try:
                return await coro
            finally:
                await self.judge.aclose()
        return asyncio.run(closing())

    def judge_capped(self) -> bool:
        return False

    def judge_rows(self) -> list[dict[str, Any]]:
        return self.judge.drain_calls()
