"""A server that takes a request and never answers is named within its progress deadline
(``*.stall_s``: no byte for N s), once, without its credentials, for each client a run talks through: the judge
(the openai client), the search services (httpx) and the rollout server (httpx). Real TCP servers on loopback."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

import pytest
from raw_server import RawServer

from arbor.config import load_config
from arbor.config.judge import JudgeConfig
from arbor.llm import make_judge
from arbor.runtime.liveness import DependencyStalled
from arbor.tasks.reporting.accuracy import ACCURACY

KEY_ENV = "ARBOR_TEST_STALL_KEY"


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-stall-secret")


def _judge(url: str, tmp_path: Path, **kw: object):  # noqa: ANN202
    cfg = JudgeConfig(backend="openai", base_url=url, api_key_env=KEY_ENV, model="m", timeout_s=30.0,
                      max_retries=4, backoff_base_s=0.001, backoff_max_s=0.01, **kw)  # type: ignore[arg-type]
    return make_judge(cfg, home=tmp_path)


async def _ask(judge):  # noqa: ANN001, ANN202
    try:
        return await judge.ask(ACCURACY, question="Capital of France?", golds=["Paris"], prediction="Paris")
    finally:
        await judge.aclose()


def test_a_silent_judge_is_a_stall_named_once(tmp_path: Path) -> None:
    """judge.stall_s=1 against a server that reads the request and stays silent: one request (not the five that
    judge.max_retries=4 allows), the error names the role and the URL, within the deadline. Earlier the call was retried 5 times and came back as a failed call (APITimeoutError)."""
    server = RawServer("silent")
    try:
        url = f"http://127.0.0.1:{server.port}/v1"
        t0 = time.monotonic()
        with pytest.raises(DependencyStalled) as e:
            asyncio.run(_ask(_judge(url, tmp_path, stall_s=1.0)))
        secs = time.monotonic() - t0
    finally:
        server.close()
    assert str(e.value) == (f"the judge of role 'accuracy' at http://127.0.0.1:{server.port}/v1 stalled: "
                            "no bytes for 1 s")
    assert server.requests == 1
    assert 1.0 <= secs < 1.0 + 2.0, secs


def test_a_role_stall_s_overrides_the_judges(tmp_path: Path) -> None:
    server = RawServer("silent")
    try:
        with pytest.raises(DependencyStalled, match="no bytes for 0.5 s"):
            asyncio.run(_ask(_judge(f"http://127.0.0.1:{server.port}/v1", tmp_path, stall_s=30.0,
                                    roles={"accuracy": {"stall_s": 0.5}})))
    finally:
        server.close()


class Trickle:
    """A server that answers a chat completion one byte every ``every_s`` seconds: slow, never silent."""

    BODY = (b'{"id":"x","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,'
            b'"message":{"role":"assistant","content":"Correct"},"finish_reason":"stop"}],'
            b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}')

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            buf = b""
            while True:  # a GET (the judge reads /v1/models first) is answered 404: no such route here
                while b"\r\n\r\n" not in buf:
                    buf += conn.recv(65536)
                head, _, buf = buf.partition(b"\r\n\r\n")
                if not head.startswith(b"GET "):
                    break
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            reply = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % len(self.BODY)) + self.BODY
            head, body = reply[:-40], reply[-40:]  # the headers at once, the last 40 bytes one by one
            conn.sendall(head)
            for i in range(len(body)):
                time.sleep(self.every_s)  # the server's pace (what is tested), not a wait for another thread
                conn.sendall(body[i:i + 1])
            conn.recv(1)  # until the client is done with the connection


def test_a_reply_that_keeps_coming_is_not_a_stall(tmp_path: Path) -> None:
    """The deadline is "no byte for stall_s", not a total: 40 bytes 0.1 s apart (4 s in all) pass a 1 s deadline
    (httpcore wraps each receive in its own fail_after(read): httpcore/_backends/anyio.py)."""
    server = Trickle(every_s=0.1)
    try:
        out = asyncio.run(_ask(_judge(f"http://127.0.0.1:{server.port}/v1", tmp_path, stall_s=1.0)))
    finally:
        server.sock.close()
    assert out.ok and out.value is True and out.attempts == 1


def test_a_silent_search_service_is_a_stall_not_retried() -> None:
    from arbor.tasks.env.search import HttpSearch, RetryPolicy

    server = RawServer("silent")
    try:
        search = HttpSearch(f"http://u:pw@127.0.0.1:{server.port}", timeout_s=30.0, stall_s=1.0,
                            retry=RetryPolicy(max_attempts=5, backoff_base_s=0.0))
        with pytest.raises(DependencyStalled) as e:
            search.search(["who wrote Book 1?"], 3)
    finally:
        server.close()
    assert str(e.value) == f"the search server at http://127.0.0.1:{server.port}/retrieve stalled: no bytes for 1 s"
    assert server.requests == 1


def test_a_silent_rollout_server_is_a_stall() -> None:
    from arbor.paths import arbor_home
    from arbor.tasks.env.agent import GenRequest
    from arbor.tasks.env.policy import load_tokenizer, policy_source
    from arbor.tasks.env.rollout import OpenAIEngine

    server = RawServer("silent")
    try:
        cfg = load_config("tiny-cpu", {"rollout.engine": "openai", "rollout.stall_s": 1.0,
                                       "rollout.base_url": f"http://127.0.0.1:{server.port}/v1"})
        engine = OpenAIEngine(cfg, load_tokenizer(policy_source(cfg.policy, arbor_home()), cfg.policy), search=None)
        with pytest.raises(DependencyStalled) as e:
            engine.complete([GenRequest([1, 2, 3], 4, 0)], temperature=0.0, stop_strings=[])
    finally:
        server.close()
    assert str(e.value) == (f"the rollout server at http://127.0.0.1:{server.port}/v1/completions stalled: "
                            "no bytes for 1 s")
    assert server.requests == 1
