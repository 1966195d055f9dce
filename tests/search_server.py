"""A scripted local search API for the remote backends' tests (tests/test_search.py): a real HTTP server on
127.0.0.1 that speaks Serper (``POST /search {"q", "num"}``) and Search-R1 (``POST /retrieve {"queries", "topk"}``).

Scripting, all without sleeping:
  * ``script[query]``: the answers its first requests get, in order, each ``(status, headers)`` (e.g.
    ``(429, {"Retry-After": "1"})``); once spent, the query is answered 200. For ``/retrieve`` the key is the
    batch's first query.
  * ``peak``: every request waits until ``peak`` requests have been in flight at once (or ``expected`` have
    arrived), so a client that sends at most ``peak`` concurrently is seen at exactly that peak, and one that sends
    them one after another never reaches it (the wait gives up after ``hold_s``: a failing test, never a hang).
  * ``order``: queries answered in this order: each waits until the ones before it are answered.
Observed: ``requests`` (query per request, arrival order), ``answered`` (completion order), ``max_inflight``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class SearchServer:
    def __init__(self, *, script: dict[str, list[tuple[int, dict[str, str]]]] | None = None,
                 peak: int | None = None, expected: int | None = None, order: list[str] | None = None,
                 hold_s: float = 10.0) -> None:
        self.script = {q: list(answers) for q, answers in (script or {}).items()}
        self.peak, self.expected, self.order, self.hold_s = peak, expected, order, hold_s
        self.requests: list[str] = []
        self.answered: list[str] = []
        self.inflight = self.max_inflight = 0
        self._cond = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real API: the client's pool is what bounds it
            disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, headers, payload = outer._handle(self.path, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def _handle(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        query = body["q"] if path == "/search" else body["queries"][0]
        with self._cond:
            self.requests.append(query)
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            self._cond.notify_all()
            if self.peak is not None:
                self._cond.wait_for(lambda: self.max_inflight >= self.peak  # type: ignore[operator]
                                    or len(self.requests) >= (self.expected or 0), timeout=self.hold_s)
            if self.order is not None and query in self.order:
                before = set(self.order[:self.order.index(query)])
                self._cond.wait_for(lambda: before <= set(self.answered), timeout=self.hold_s)
            scripted = self.script.get(query)
            status, headers = scripted.pop(0) if scripted else (200, {})
            self.inflight -= 1
            self.answered.append(query)
            self._cond.notify_all()
        if status != 200:
            return status, headers, {"message": f"scripted {status}"}
        if path == "/search":
            return 200, {}, {"organic": [{"title": f"T{i}", "link": f"https://x/{query}/{i}", "snippet": f"{query} {i}"}
                                         for i in range(body["num"])]}
        return 200, {}, {"result": [[{"document": {"id": f"{q}-{i}", "contents": f'"T{i}"\n{q}'}, "score": 1.0}
                                     for i in range(body["topk"])] for q in body["queries"]]}

    def __enter__(self) -> SearchServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
