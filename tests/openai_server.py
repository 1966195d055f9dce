"""A local OpenAI-compatible chat-completions server for tests and benchmarks (loopback only, real HTTP).

It answers every judge role in the right shape (the role is recognised from the system prompt) and follows a
programmable fault plan. Counters per cache key (the ``X-Arbor-Cache-Key`` request header) are readable by tests.

In a thread::

    with OpenAIServer(FaultPlan(queue=["429", "500"]), api_key="sk-test") as srv:
        cfg = JudgeConfig(backend="openai", base_url=srv.base_url, ...)
        ...; srv.counts  # Counter: cache key -> requests

As a process (benchmarks): ``python tests/openai_server.py --latency 0.2`` prints ``PORT <n>`` then serves;
``GET /_arbor/counts`` returns the counters as JSON. ``start_server_process(...)`` wraps that.

Fault kinds (``FaultPlan.queue`` is consumed one entry per request, in arrival order; then normal answers):
``429`` (with ``Retry-After: plan.retry_after``), ``500``, ``hang`` (sleeps ``hang_s`` before answering, past the
client's timeout), ``malformed`` (not JSON), ``fenced`` (valid JSON inside a ```json fence after prose),
``invalid`` (JSON of the wrong shape), ``echo`` (what the real SmolLM2-135M judge under llama.cpp's grammar
answered: its recorded temperature-0 reply for the role, ``tests/data/smollm2_replies.json`` with its provenance,
written by ``tests/make_smollm2_replies.py``; for a role with no recording, the reply example of the role's own
prompt, placeholders and all), ``length`` (the first half of the answer, ``finish_reason: "length"``,
as when ``max_tokens`` runs out), ``ok``. ``always="A"`` makes every pairwise answer ``{"winner": "A"}``.
``accuracy_by_model={"judge-b": "inverse"}`` scripts the accuracy verdict by the requested model (a second judge).
``scripted={"You count": '{"count": 2}'}`` answers a role the server does not know (one a test registers).

``OpenAIServer(models={"judge": {"n_params": ..., "size": ...}})`` answers ``GET /v1/models`` as llama.cpp's
``llama-server`` does for the GGUF it serves (ggml-org/llama.cpp, tools/server: the models handler's entry is
``id`` (the alias), ``object: "model"``, ``created: std::time(0)`` (the time of the request), ``owned_by:
"llamacpp"`` and ``meta`` = ``model_meta()``: vocab_type, n_vocab, n_ctx_train, n_embd, n_params, size); without
``models`` it has no such route (404), like an endpoint that lists nothing. llama-cpp-python's server, which
``arbor judge serve`` runs, lists only ``id``, ``object``, ``owned_by: "me"`` and ``permissions: []``
(llama_cpp/server/app.py lines 535-549 at 3691546, v0.3.35) and answers any model name with its one model
(llama_cpp/server/model.py lines 36-41).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

CACHE_HEADER = "x-arbor-cache-key"
FAULTS = ("429", "500", "hang", "malformed", "fenced", "invalid", "echo", "length", "ok")
ACCURACY_RULES = ("match", "inverse", "correct", "incorrect")
_ROLE_MARKERS = [
    ("You are an expert judge", "pairwise"),
    ("You consolidate scoring rubrics", "consolidation"),
    ("You check answers", "accuracy"),
    ("You write grading rubrics", "rar_rubrics"),
    ("You grade a search agent", "rar_rate"),
    ("You review the work of a search agent", "induction"),
    ("You write stage rubrics", "stage_rubrics"),
    ("You score one research agent", "stage_grades"),
    ("You rate reflection candidates", "reflection_grades"),
    ("You teach a step-level reward model", "step_labels"),
    ("You write step rubrics", "step_rubric"),
    ("You verify a proposed action", "step_verify"),
    ("You rank candidate next actions", "rank_actions"),
]


@dataclass
class FaultPlan:
    queue: list[str] = field(default_factory=list)
    latency_s: float = 0.0
    retry_after: str | None = "0"
    hang_s: float = 2.0
    always: str | None = None  # "A": every pairwise verdict is A
    fewer_searches_win: bool = False  # pairwise rule: by default the response with more searches wins
    # accuracy rule per requested model (a second judge, App. C.2): "match" (the default: normalised string match),
    # "inverse" (the opposite verdict), "correct" or "incorrect" (always that verdict)
    accuracy_by_model: dict[str, str] = field(default_factory=dict)
    # faults for one judge role only, served to that role's requests in arrival order before ``queue`` is read
    by_role: dict[str, list[str]] = field(default_factory=dict)
    # the response_format types the server takes (None: any); another is refused with ``refusal_status``:
    # llama-cpp-python 0.3.36's real server refuses {"type": "json_schema"} (it takes "text" and "json_object" with
    # a "schema") with a 500 whose message is fastapi's validation error; 422 is that error as fastapi sends it
    formats: tuple[str, ...] | None = None
    refusal_status: int = 500
    # replies for roles the server does not know (a role a test registers): system-prompt prefix -> reply
    scripted: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = [f for f in [*self.queue, *(f for q in self.by_role.values() for f in q)] if f not in FAULTS]
        if bad:
            raise ValueError(f"FaultPlan.queue: unknown fault kinds {bad}; known: {FAULTS}")
        bad = [r for r in self.accuracy_by_model.values() if r not in ACCURACY_RULES]
        if bad:
            raise ValueError(f"FaultPlan.accuracy_by_model: unknown rules {bad}; known: {ACCURACY_RULES}")


def recognise_role(messages: list[dict[str, Any]]) -> str | None:
    system = next((m.get("content", "") for m in messages if m.get("role") == "system"), "")
    for marker, role in _ROLE_MARKERS:
        if system.startswith(marker):
            return role
    return None


def _block(text: str, tag: str) -> str:
    m = re.search(rf"<{tag}>(.*?)</{tag}>", text, re.S)
    return m.group(1) if m else ""


def _norm(s: str) -> str:
    s = re.sub(r"[^\w\s]", "", s.lower())
    return " ".join(w for w in s.split() if w not in {"a", "an", "the"})


def answer_for(role: str, user: str, plan: FaultPlan, model: str | None = None, system: str = "") -> str:
    """A well-formed answer for the role (deterministic in the prompt and, for accuracy, the requested model)."""
    if role == "pairwise":
        if plan.always:
            return json.dumps({"winner": plan.always})
        a, b = _block(user, "response_a").count("<search>"), _block(user, "response_b").count("<search>")
        if plan.fewer_searches_win:
            a, b = b, a
        return json.dumps({"winner": "A" if a > b else "B" if b > a else "TIE"})
    if role == "accuracy":
        rule = plan.accuracy_by_model.get(model or "", "match")
        if rule in ("correct", "incorrect"):
            return rule.capitalize()
        golds = [_norm(g) for g in _block(user, "golden_answer").split("|")]
        match = _norm(_block(user, "predicted_answer")) in golds
        return "Correct" if match != (rule == "inverse") else "Incorrect"
    rubric = {"title": "Targeted entity queries", "description": "Names the question's entities in each query.",
              "counter_description": "Issues vague queries without the key entities."}
    if role == "induction":
        return json.dumps({"rubrics": [rubric]})
    if role == "consolidation":
        return json.dumps({"new_common_rubrics": [rubric]})
    if role == "rar_rubrics":
        return json.dumps({"items": [f"Item {i}: establishes fact {i}" for i in range(1, 6)]})
    if role == "rar_rate":
        return json.dumps({"rating": 7})
    if role == "stage_rubrics":  # one positive plan rubric and one negative research rubric (RubricEM C.2)
        empty = {"positive_rubrics": [], "negative_rubrics": []}
        return json.dumps({
            "stage_1": {"positive_rubrics": [{"title": "Plan names the entities", "weight": 2,
                                              "description": "The plan names every entity of the question."}],
                        "negative_rubrics": []},
            "stage_2": {"positive_rubrics": [], "negative_rubrics": [{
                "title": "Repeated queries", "weight": 1, "description": "Issues the same query twice."}]},
            "stage_3": empty, "stage_4": empty})
    if role == "stage_grades":  # rubric i gets (searches + i) mod 3: grades differ with the trajectory
        n = len(re.findall(r"^\d+\. ", _block(user, "stage_rubrics"), re.M))
        k = _block(user, "trajectory").count("<search>")
        return json.dumps({"scores": [{"index": i, "score": (k + i) % 3, "justification": f"{k} searches"}
                                      for i in range(1, n + 1)]})
    if role == "reflection_grades":
        n = len(re.findall(r"<candidate index=", user))
        # diagnosis 0, .5, 1, 0, ... by candidate index: utilities differ within a group
        return json.dumps({"grades": [{"index": i, "diagnosis": (i - 1) % 3 / 2, "specificity": 0.5, "scope": 0.5}
                                      for i in range(1, n + 1)]})
    if role == "step_labels":  # step i: criteria "c1".."ck", scores rising with i (a search step -0.5, then up)
        n = len(re.findall(r"^Step \d+:", _block(user, "steps"), re.M))
        k = int(_block(user, "criteria_per_step"))
        return json.dumps({"steps": [{"criteria": [f"step {i} criterion {j}" for j in range(1, k + 1)],
                                      "scores": [round(-0.5 + 0.5 * i, 3)] * k} for i in range(n)]})
    if role == "step_rubric":  # early (no search yet): search items; later: answer items and a negative one
        made = re.search(r"^Searches made: (\d+)", user, re.M)
        if made is None or made.group(1) == "0":
            return json.dumps({"items": [{"weight": 0.6, "condition": "The query names the question's entity"},
                                         {"weight": 0.4, "condition": "The query is new"}],
                               "action": "search for the question's entity"})
        return json.dumps({"items": [{"weight": 1.0, "condition": "The answer is supported by the results"},
                                     {"weight": -0.2, "condition": "The query repeats an earlier search"}],
                           "action": "answer"})
    if role == "step_verify":  # item i met when i is odd (1, 3, ...): verdicts True, False, True, ...
        n = len(re.findall(r"^\d+\. ", _block(user, "rubric_items"), re.M))
        unmet = [str(i) for i in range(2, n + 1, 2)]
        return json.dumps({"satisfied": [i % 2 == 1 for i in range(1, n + 1)],
                           "feedback": f"Items {', '.join(unmet)} are unmet." if unmet else ""})
    if role == "rank_actions":  # the shown candidates in reverse: the last label shown is ranked best
        labels = re.findall(r'<candidate label="(\w+)">', _block(user, "candidates"))
        if "Final answer:" in system:  # rank_actions.v2: a rationale, then the ranking as the final answer
            return (f"Rationale: the later candidates target the missing fact; {labels[0]} is the weakest.\n\n"
                    f"**Final answer:**\n{json.dumps(labels[::-1])}")
        return json.dumps({"ranking": labels[::-1]})
    raise ValueError(role)


_INVALID = {"pairwise": '{"winner": "C"}', "accuracy": "I cannot decide.", "induction": '{"rubrics": "none"}',
            "consolidation": '{"standards": []}', "rar_rubrics": '{"items": ["only one"]}', "rar_rate": '{"rating": 11}',
            "stage_rubrics": '{"stage_1": []}', "stage_grades": '{"scores": [{"index": 1, "score": 3}]}',
            "reflection_grades": '{"grades": []}', "step_labels": '{"steps": []}',
            "step_rubric": '{"items": [], "action": "search"}', "step_verify": '{"satisfied": [], "feedback": ""}',
            "rank_actions": '{"ranking": ["X"]}'}


RECORDED_REPLIES = Path(__file__).resolve().parent / "data" / "smollm2_replies.json"


@cache
def recorded_echoes() -> dict[str, str]:
    """role -> the first temperature-0 reply of the real SmolLM2 judge to a request of that role (all 14 recorded
    replies were refused by the answer filter: the prompt's placeholders echoed)."""
    out: dict[str, str] = {}
    for r in json.loads(RECORDED_REPLIES.read_text())["replies"]:
        if r["temperature"] == 0.0 and r["refused_as"]:
            out.setdefault(r["role"], r["reply"])
    return out


def echo_reply(role: str, system: str) -> str:
    """The ``echo`` fault's reply: the real judge's recorded one for ``role``, else the prompt's own example."""
    return recorded_echoes().get(role) or echo_of(system)


def echo_of(system: str) -> str:
    """The reply example of a system prompt: its first JSON object holding a ``"<...>"`` placeholder, else its first
    JSON object (what a small judge under a grammar writes back)."""
    decoder = json.JSONDecoder()
    found = []
    for start in (i for i, ch in enumerate(system) if ch == "{"):
        try:
            obj, end = decoder.raw_decode(system, start)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            found.append(system[start:end])
    return next((f for f in found if re.search(r'"<[^"]+>"', f)), found[0] if found else "{}")


class OpenAIServer:
    """A uvicorn + starlette server on 127.0.0.1 with an ephemeral port, run in a background thread."""

    def __init__(self, plan: FaultPlan | None = None, *, api_key: str | None = None,
                 models: dict[str, dict[str, Any]] | None = None):
        self.plan = plan or FaultPlan()
        self.api_key = api_key
        self.models = models  # model name -> the ``meta`` GET /v1/models reports for it (None: no such route)
        self.counts: Counter[str] = Counter()  # cache key -> requests received
        self.roles: Counter[str] = Counter()
        self.faults_served: list[str] = []
        self.bodies: list[dict[str, Any]] = []  # request bodies (never the Authorization header)
        self.arrivals: list[tuple[float, str]] = []  # (wall-clock time, role) of each request (streamed judging)
        self.keyed: list[tuple[float, str]] = []  # (wall-clock time, cache key) of each request read whole
        self.app = Starlette(routes=[
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/_arbor/counts", self._counts, methods=["GET"]),
        ])
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _counts(self, request: Request) -> JSONResponse:
        return JSONResponse({"counts": dict(self.counts), "roles": dict(self.roles), "faults": self.faults_served,
                             "arrivals": self.arrivals})

    async def _models(self, request: Request) -> JSONResponse:
        if self.models is None:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return JSONResponse({"error": {"message": "bad api key", "type": "auth"}}, status_code=401)
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": int(time.time()), "owned_by": "llamacpp", "meta": meta}
            for name, meta in self.models.items()]})

    async def _chat(self, request: Request) -> JSONResponse:
        if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return JSONResponse({"error": {"message": "bad api key", "type": "auth"}}, status_code=401)
        body = await request.json()
        self.bodies.append(body)
        key = request.headers.get(CACHE_HEADER, "")
        self.counts[key] += 1
        self.keyed.append((time.time(), key))
        messages = body.get("messages", [])
        role = recognise_role(messages)
        system = next((m.get("content", "") for m in messages if m.get("role") == "system"), "")
        scripted = next((reply for marker, reply in self.plan.scripted.items() if system.startswith(marker)), None)
        if role is None and scripted is not None:
            self.roles["scripted"] += 1
            return JSONResponse({
                "id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "test"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": scripted},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})
        if role is None:
            return JSONResponse({"error": {"message": "unknown prompt"}}, status_code=400)
        fmt = (body.get("response_format") or {}).get("type")
        if fmt is not None and self.plan.formats is not None and fmt not in self.plan.formats:
            allowed = " or ".join(repr(f) for f in self.plan.formats)
            detail = {"type": "literal_error", "loc": ("body", "response_format", "type"),
                      "msg": f"Input should be {allowed}", "input": fmt}
            if self.plan.refusal_status == 422:
                return JSONResponse({"detail": [{**detail, "loc": list(detail["loc"])}]}, status_code=422)
            message = f"1 validation error:\n  {detail!r}\n\n  File \"llama_cpp/server/app.py\", line 376"
            return JSONResponse({"error": {"message": message, "type": "internal_server_error", "param": None,
                                           "code": None}}, status_code=self.plan.refusal_status)
        self.roles[role] += 1
        self.arrivals.append((time.time(), role))
        mine = self.plan.by_role.get(role)
        fault = mine.pop(0) if mine else self.plan.queue.pop(0) if self.plan.queue else "ok"
        self.faults_served.append(fault)
        if self.plan.latency_s:
            await asyncio.sleep(self.plan.latency_s)
        if fault == "429":
            headers = {"retry-after": self.plan.retry_after} if self.plan.retry_after is not None else {}
            return JSONResponse({"error": {"message": "rate limited", "type": "rate_limit"}}, 429, headers)
        if fault == "500":
            return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500)
        if fault == "hang":
            await asyncio.sleep(self.plan.hang_s)
        user = next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
        content = answer_for(role, user, self.plan, body.get("model"), system)
        if fault == "malformed":
            content = "Let me think about this... {not json"
        elif fault == "fenced":
            content = f"Here is my judgement.\n```json\n{content}\n```\nThat is all."
        elif fault == "invalid":
            content = _INVALID[role]
        elif fault == "echo":
            content = echo_reply(role, system)
        elif fault == "length":
            content = content[: len(content) // 2]
        prompt_chars = sum(len(m.get("content", "")) for m in messages)
        return JSONResponse({
            "id": f"chatcmpl-{sum(self.counts.values())}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "test"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "length" if fault == "length" else "stop"}],
            "usage": {"prompt_tokens": prompt_chars // 4, "completion_tokens": max(1, len(content) // 4),
                      "total_tokens": prompt_chars // 4 + max(1, len(content) // 4)},
        })

    def start(self) -> OpenAIServer:
        # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on accepted sockets whose proto says TCP, and
        # without it every response waits ~40 ms for a delayed ACK (Nagle; headers and body are separate writes)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", access_log=False,
                                timeout_graceful_shutdown=1, backlog=2048)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("local OpenAI-compatible server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server_process(latency_s: float = 0.0, always: str | None = None) -> tuple[subprocess.Popen[str], str]:
    """Run the server in its own process (no GIL shared with the client); returns (process, base_url)."""
    cmd = [sys.executable, __file__, "--latency", str(latency_s)] + (["--always", always] if always else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("PORT "):
        proc.terminate()
        raise RuntimeError(f"server process did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}/v1"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=0.0)
    ap.add_argument("--always", default=None)
    args = ap.parse_args()
    srv = OpenAIServer(FaultPlan(latency_s=args.latency, always=args.always)).start()
    print(f"PORT {srv.port}", flush=True)
    try:
        srv._thread.join()  # type: ignore[union-attr]
    except KeyboardInterrupt:
        srv.stop()


if __name__ == "__main__":
    main()
