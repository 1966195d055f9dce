"""A judge call paid for by a process that was killed before its stage committed is counted once
after the resume (it used to come back as a free cache hit, so ``judge_cost_usd`` and ``judge.cost_cap_usd``
undercounted), and a prefetch wasted and accounted in ``steps.prefetch_wasted_cost_usd`` is not counted again.

Each "process" is a real Python process (the payer is recorded by host, pid and start time) talking to a real HTTP
server that answers every call with 1,000 prompt and 500 completion tokens: at the default prices (0.4 and 1.2 USD
per million) each paid call costs (1000 * 0.4 + 500 * 1.2) / 1e6 = 0.001 USD."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

CALL_USD = 0.001
KEY_ENV = "ARBOR_TEST_SPEND_KEY"

SCRIPT = r'''
import asyncio, json, sys
from arbor.config.judge import JudgeConfig
from arbor.llm import CallContext, make_judge
from arbor.llm.stream import StreamedJudge
from arbor.storage.parquet import write_stage
from arbor.tasks.reporting.accuracy import ACCURACY

spec = json.loads(sys.argv[1])
judge = StreamedJudge(make_judge(JudgeConfig(backend="openai", base_url=spec["url"], api_key_env=spec["key_env"],
                                             model="m", max_retries=0), home=spec["home"]))
ctx = CallContext(run_id=spec["run_id"], step=1, stage="score")


def ask(p):
    return judge.ask(ACCURACY, ctx=ctx, question="Capital of France?", golds=["Paris"], prediction=p)


async def go():
    return [await ask(p) for p in spec["ask"]]

for p in spec.get("prefetch", []):  # streamed ahead and never claimed: a wasted prefetch
    judge.stream(lambda p=p: ask(p))
stats = judge.take_stats()
judge.settle_wasted(stats)  # as the step does once its steps row (with the wasted cost) is committed
outs = asyncio.run_coroutine_threadsafe(go(), judge._loop).result()
rows = judge.drain_calls()
if spec.get("commit"):
    write_stage("judge_calls", rows, run_id=spec["run_id"], step=1, stage="score", home=spec["home"])
print(json.dumps({"costs": [r["cost_usd"] for r in rows], "hits": [r["cache_hit"] for r in rows],
                  "ok": [o.ok for o in outs], "wasted_usd": stats.wasted_cost_usd}), flush=True)
if spec.get("hang"):
    sys.stdin.read()  # paid and printed: the test kills this process here, before anything commits
judge.close()
'''


class FixedJudge:
    """A judge server that answers every chat completion ``content`` ("Correct") with a fixed usage."""

    def __init__(self, content: str = "Correct") -> None:
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers["Content-Length"]))
                owner.requests += 1
                body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                                   "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                                "finish_reason": "stop"}],
                                   "usage": {"prompt_tokens": 1000, "completion_tokens": 500,
                                             "total_tokens": 1500}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server():  # noqa: ANN201
    s = FixedJudge()
    yield s
    s.close()


def _process(server: FixedJudge, home: Path, run_id: str, ask: list[str], *, prefetch: list[str] = (),
             commit: bool = False, killed: bool = False) -> dict:
    """One process of run ``run_id``: asks ``ask`` (after streaming ``prefetch`` ahead, never claimed); its
    ledger rows committed with ``commit``; SIGKILLed once it printed them with ``killed``."""
    spec = {"url": server.url, "key_env": KEY_ENV, "home": str(home), "run_id": run_id, "ask": ask,
            "prefetch": list(prefetch), "commit": commit, "hang": killed}
    env = {**os.environ, KEY_ENV: "sk-spend", "ARBOR_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, json.dumps(spec)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # waits on the process's own report
    if killed:
        os.kill(proc.pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert line, err
    return json.loads(line)


def test_a_kill_and_resume_spends_what_an_uninterrupted_run_spends(server: FixedJudge, tmp_path: Path) -> None:
    asks = ["Paris", "paris", "Paris, France", "The city of Paris"]
    whole = _process(server, tmp_path / "u", "uninterrupted", asks, commit=True)
    assert whole["costs"] == [CALL_USD] * 4 and server.requests == 4

    home = tmp_path / "h"
    killed = _process(server, home, "r", asks[:3], killed=True)  # paid for three calls, committed nothing
    assert killed["costs"] == [CALL_USD] * 3 and server.requests == 7
    resumed = _process(server, home, "r", asks, commit=True)
    # the three paid by the killed process come from the cache (no request) and carry their payment; the fourth
    # is paid now. Earlier: [0, 0, 0, 0.001]
    assert resumed["hits"] == [True, True, True, False] and server.requests == 8
    assert resumed["costs"] == [CALL_USD] * 4
    assert sum(resumed["costs"]) == sum(whole["costs"])
    # carried once: the committed ledger now holds every payment, so a later process of the run hits for free
    again = _process(server, home, "r", asks)
    assert again["costs"] == [0.0] * 4 and again["hits"] == [True] * 4
    other = _process(server, home, "another-run", asks[:1])  # another run never paid: a free hit
    assert other["costs"] == [0.0] and server.requests == 8


def test_a_wasted_prefetch_is_not_counted_twice(server: FixedJudge, tmp_path: Path) -> None:
    """A prefetch paid for and wasted is counted in the step's ``prefetch_wasted_cost_usd``; once that is
    committed (``settle_wasted``), a hit on it after a resume carries nothing, while an uncommitted paid call
    still does: spend + wasted equals the uninterrupted run's."""
    killed = _process(server, tmp_path, "s", ["Paris"], prefetch=["Paris, France"], killed=True)
    assert killed["wasted_usd"] == CALL_USD and killed["costs"] == [CALL_USD] and server.requests == 2
    resumed = _process(server, tmp_path, "s", ["Paris, France", "Paris"])
    assert resumed["hits"] == [True, True] and server.requests == 2
    assert resumed["costs"] == [0.0, CALL_USD]  # the wasted one is accounted already; the killed call carried
    assert sum(resumed["costs"]) + killed["wasted_usd"] == 2 * CALL_USD


TWO_WORKSPACES = r'''
import asyncio, json, sys
from arbor.config.judge import JudgeConfig
from arbor.llm import CallContext, make_judge
from arbor.tasks.reporting.accuracy import ACCURACY

spec = json.loads(sys.argv[1])
costs = []
for home in spec["homes"]:  # one process resumes the run of the same id in each workspace in turn
    judge = make_judge(JudgeConfig(backend="openai", base_url=spec["url"], api_key_env=spec["key_env"], model="m",
                                   max_retries=0), home=home)
    ctx = CallContext(run_id=spec["run_id"], step=1, stage="score")
    out = asyncio.run(judge.ask(ACCURACY, ctx=ctx, question="Capital of France?", golds=["Paris"],
                                prediction="Paris"))
    assert out.ok
    costs.append([r["cost_usd"] for r in judge.drain_calls()])
print(json.dumps(costs), flush=True)
'''


def test_one_process_resuming_the_same_run_id_in_two_workspaces_carries_each_payment(server: FixedJudge,
                                                                                        tmp_path: Path) -> None:
    """A run id names a run within its workspace: a process that resumes run ``r`` of workspace A and then run
    ``r`` of workspace B (a notebook; a test worker) carries each workspace's killed payment once. Before the fix
    the process-wide "already carried" mark was keyed by run id and cache key only, so B's hit came back free."""
    homes = [tmp_path / "a", tmp_path / "b"]
    for home in homes:
        assert _process(server, home, "r", ["Paris"], killed=True)["costs"] == [CALL_USD]
    spec = {"url": server.url, "key_env": KEY_ENV, "homes": [str(h) for h in homes], "run_id": "r"}
    out = subprocess.run([sys.executable, "-c", TWO_WORKSPACES, json.dumps(spec)], env={**os.environ, KEY_ENV: "k"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == [[CALL_USD], [CALL_USD]] and server.requests == 2
