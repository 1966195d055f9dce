"""A scripted `vllm serve` (ours, for tests): vLLM 0.33.0's HTTP contract for rollouts and RL weight transfer, with
the transfer itself over a real torch.distributed gloo group on the CPU.

Every behaviour reproduces a line of the 0.33.0 sdist (cited beside it; the facts are also in
``tests/data/vllm_0_33_contract.json``, which ``tests/test_vllm_contract.py`` re-reads from the source when
``ARBOR_VLLM_SRC`` names an unpacked sdist). It is configured the way vLLM is, from the launch's argv and
environment (``ScriptedVllm.from_spec``), so a launch that forgets ``--served-model-name`` or
``VLLM_SERVER_DEV_MODE=1`` gets vLLM's answers.

Where it departs from vLLM, on purpose:
- an unknown ``/v1/completions`` field is refused (400); vLLM logs it and ignores it (``extra="allow"``), which is
  exactly how a renamed field would go unnoticed;
- the workers join a gloo group through ``master_address``/``master_port`` (vLLM's GPU workers would build an NCCL
  communicator); a ``world_size`` that does not match answers 500 instead of hanging;
- ``/weight_checker`` ``checksum`` answers sha256 of each tensor's bytes (vLLM's checksum format is its own).

Run as a program (``python -m tests.vllm_server serve PATH ...``) it serves until killed, loading PATH's safetensors.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import torch

CONTRACT = json.loads((Path(__file__).parent / "data" / "vllm_0_33_contract.json").read_text())
INIT_FIELDS = CONTRACT["init_info"]["fields"]
UPDATE_FIELDS = CONTRACT["update_info"]["fields"]
COMPLETION_FIELDS = set(CONTRACT["completion_request_fields"]["fields"])


class HttpError(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(status)
        self.status, self.body = status, body


def worker_error(message: str) -> HttpError:
    """A worker's exception as the API server answers it: Exception(failure_message) -> 500
    (v1/engine/core_client.py:933-941, serve/exception_handling/error_response.py:93-104)."""
    return HttpError(500, {"error": {"message": message, "type": "InternalServerError", "param": None, "code": 500}})


NOT_FOUND = HttpError(404, {"detail": "Not Found"})  # FastAPI's answer for a route never registered


class ScriptedVllm:
    """One API server with ``workers`` inference workers (TP x DP ranks), each holding a copy of the weights."""

    def __init__(self, argv: list[str], env: dict[str, str], *, workers: int = 1,
                 weights: dict[str, torch.Tensor] | None = None, held_resets: int = 0,
                 lose_session_after_start: bool = False, gloo_timeout_s: float = 30.0) -> None:
        args = argv[argv.index("serve") + 1:]
        self.model = args[0]
        self.port = int(_opt(args, "--port") or 8000)
        names = _opt_list(args, "--served-model-name")
        self.served = names or [self.model]  # app_state.py:49-52
        wt = _opt(args, "--weight-transfer-config")
        self.engine_configured = wt is not None and json.loads(wt).get("backend") == "nccl"
        self.dev_mode = bool(int(env.get("VLLM_SERVER_DEV_MODE", "0")))  # envs.py:1468
        if weights is None:
            weights = _load_safetensors(Path(self.model))
        self.weights = [{k: v.clone() for k, v in weights.items()} for _ in range(workers)]
        self.n_workers = workers
        self.held_resets = held_resets
        self.lose_session_after_start = lose_session_after_start
        self.gloo_timeout_s = gloo_timeout_s
        self.requests: list[tuple[str, str, Any]] = []
        self.weight_version = "default"  # v1/engine/core.py:147
        self.active = False  # gpu_worker.py:236 _weight_update_active
        self.pgs: list[Any] = []
        self.paused: str | None = None  # the /pause mode in force; None: generating
        self.running = threading.Event()  # cleared while paused: kept requests wait on it
        self.running.set()
        self.refused = threading.Event()  # set at each completion answered 503 while paused
        self.refusals = 0
        self.held = threading.Event()  # set at each completion kept (not answered) while paused in keep mode
        self.packed = False
        self.buffer_bytes = 1 << 30
        self._httpd: ThreadingHTTPServer | None = None

    @classmethod
    def from_spec(cls, spec: Any, **kw: Any) -> ScriptedVllm:
        """Configured from arbor's ``LaunchSpec`` exactly as `vllm serve` would read it."""
        return cls(list(spec.argv), dict(spec.env), **kw)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---------------------------------------------------------------------------------------------- routes
    def routes(self) -> dict[tuple[str, str], Any]:
        table: dict[tuple[str, str], Any] = {
            ("GET", "/health"): lambda q, b: {},
            ("GET", "/v1/models"): lambda q, b: {"object": "list", "data": [{"id": n, "object": "model"}
                                                                          for n in self.served]},
            ("POST", "/v1/completions"): self.completions,
        }
        if self.dev_mode:  # routers.py:46-53: dev and RL routers only with VLLM_SERVER_DEV_MODE
            table.update({
                ("POST", "/init_weight_transfer_engine"): self.init_engine,
                ("POST", "/start_weight_update"): self.start,
                ("POST", "/update_weights"): self.update,
                ("POST", "/finish_weight_update"): self.finish,
                ("POST", "/update_weight_version"): self.set_version,
                ("GET", "/weight_info"): lambda q, b: {"weight_version": self.weight_version},
                ("GET", "/get_world_size"): lambda q, b: {"world_size": self.n_workers},
                ("POST", "/reset_prefix_cache"): self.reset_prefix_cache,
                ("POST", "/weight_checker"): self.weight_checker,
                ("POST", "/pause"): self.pause,
                ("POST", "/resume"): self.resume,
                ("GET", "/is_paused"): lambda q, b: {"is_paused": self.paused is not None},  # api_router.py:145-159
            })
        return table

    def completions(self, q: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        unknown = set(body) - COMPLETION_FIELDS
        if unknown:
            raise HttpError(400, {"error": {"message": f"scripted: fields not in CompletionRequest: {sorted(unknown)}",
                                            "type": "BadRequestError", "param": None, "code": 400}})
        model = body.get("model")
        if model and model not in self.served:  # serving.py:58-84 _check_model
            raise HttpError(404, {"error": {
                "message": f"The model `{model}` does not exist. Valid aliases: {', '.join(self.served)}.",
                "type": "NotFoundError", "param": "model", "code": 404}})
        self._admit()
        n = int(body.get("max_tokens") or 16)
        ids = [(7 + i) % 50 for i in range(n)]
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "model": model or self.served[0],
                "choices": [{"index": 0, "text": "", "token_ids": ids, "finish_reason": "length",
                             "stop_reason": None,
                             "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-1.0] * n,
                                          "top_logprobs": None, "text_offset": [0] * n}}]}

    def _admit(self) -> None:
        """A generation request reaching a paused engine. 0.33: after ``/pause`` in abort or wait mode the engine
        core refuses new requests (v1/engine/core.py:2225-2233 sets ``reject_new_requests`` unless mode is keep;
        1759 and 1796-1816 answer each with a retryable ``engine_paused`` error), which reaches the client as
        ``RetryableRequestError`` (v1/engine/output_processor.py:764-767, outputs.py:30-35), re-raised by
        ``generate`` (v1/engine/async_llm.py:821-827) and answered 503 ``ServiceUnavailableError``
        (exceptions.py:139-144, serve/exception_handling/handlers/vllm_error.py:22-23, error_response.py:61-68).
        In keep mode the request waits in the queue and runs after ``/resume`` (core.py:2214; 0.32 does this in
        every mode: it has no ``reject_new_requests``)."""
        if self.paused in ("abort", "wait"):
            self.refusals += 1
            self.refused.set()
            paused = CONTRACT["paused"]
            raise HttpError(paused["status"], {"error": {"message": paused["message"], "type": paused["type"],
                                                         "param": None, "code": paused["status"]}})
        if self.paused == "keep":
            self.held.set()
            self.running.wait()

    def pause(self, q: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        """``POST /pause?mode=abort|wait|keep`` (rl/online/api_router.py:31-75; abort is the default, any other
        mode fails FastAPI's check of the ``PauseMode`` literal, v1/engine/__init__.py:33). Nothing runs here, so
        there is nothing to abort or drain."""
        mode = q.get("mode", ["abort"])[0]
        if mode not in ("abort", "wait", "keep"):
            raise HttpError(422, {"detail": [{"type": "literal_error", "loc": ["query", "mode"],
                                              "msg": "Input should be 'abort', 'wait' or 'keep'"}]})
        self.paused = mode
        self.running.clear()
        return {"status": "paused"}

    def resume(self, q: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        """``POST /resume`` (api_router.py:78-94): new requests are admitted again (core.py:2235-2237), kept ones
        run."""
        self.paused = None
        self.running.set()
        return {"status": "resumed"}

    def _engine(self) -> None:
        if not self.engine_configured:  # gpu_worker.py:1512-1517
            raise worker_error("Weight transfer not configured. Please set weight_transfer_config to enable "
                               "weight transfer.")

    def init_engine(self, q: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        info = _embedded(body, "init_info")
        self._engine()
        unknown = [k for k in info if k not in INIT_FIELDS]  # base.py:517-535 parse_init_info (kw_only dataclass)
        if unknown:
            raise worker_error(f"Invalid init_info for NCCLWeightTransferEngine: NCCLWeightTransferInitInfo.__init__()"
                               f" got an unexpected keyword argument '{unknown[0]}'")
        for req in CONTRACT["init_info"]["required"]:
            if req not in info:
                raise worker_error("Invalid init_info for NCCLWeightTransferEngine: NCCLWeightTransferInitInfo."
                                   f"__init__() missing 1 required keyword-only argument: '{req}'")
        has_uid = bool(info.get("nccl_unique_id_b64"))  # nccl_common.py:36-72 decode_nccl_unique_id
        has_addr, has_port = info.get("master_address") is not None, info.get("master_port") is not None
        if has_uid and (has_addr or has_port):
            raise worker_error("NCCLWeightTransferInitInfo: pass nccl_unique_id_b64 OR master_address/master_port, "
                               "not both")
        if not has_uid and not (has_addr and has_port):
            raise worker_error("NCCLWeightTransferInitInfo: need nccl_unique_id_b64, or both master_address and "
                               "master_port")
        if has_uid:
            raise worker_error("scripted: a CPU gloo stand-in cannot join an NCCL unique-id rendezvous")
        if int(info["world_size"]) != int(info["rank_offset"]) + self.n_workers:
            raise worker_error("scripted: world_size != rank_offset + workers (vLLM would wait in NCCL for ever)")
        # nccl_engine.py:149-165: the packing is recorded at the handshake, saved update lists cleared
        self.packed = bool(info.get("packed", CONTRACT["init_info"]["defaults"]["packed"]))
        self.buffer_bytes = int(info.get("packed_buffer_size_bytes",
                                         CONTRACT["init_info"]["defaults"]["packed_buffer_size_bytes"]))
        self.pgs = [None] * self.n_workers

        def join(i: int) -> None:
            import torch.distributed as dist

            store = dist.TCPStore(info["master_address"], int(info["master_port"]), is_master=False)
            pg = dist.ProcessGroupGloo(store, int(info["rank_offset"]) + i, int(info["world_size"]),
                                       datetime.timedelta(seconds=self.gloo_timeout_s))
            pg.allreduce([torch.zeros(1)]).wait()  # the warm-up all_reduce (nccl_common.py:92-97)
            self.pgs[i] = pg

        _on_all_workers(join, self.n_workers)
        return {"message": "Weight transfer initialized"}  # api_router.py:171

    def start(self, q: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        self._engine()
        if self.active:  # gpu_worker.py:1569-1573
            raise worker_error("start_weight_update called while a weight update is already active. Call "
                               "finish_weight_update first.")
        self.active = not self.lose_session_after_start  # (a server that restarted between start and update)
        return {"message": "Weight update started"}

    def update(self, q: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        info = _embedded(body, "update_info")
        self._engine()
        if not self.active:  # gpu_worker.py:1608-1611
            raise worker_error("start_weight_update must be called before update_weights.")
        try:
            if not isinstance(info, dict):
                raise ValueError("scripted: list update_info (one per rank) is not reproduced")
            unknown = [k for k in info if k not in UPDATE_FIELDS]  # base.py:537-555 parse_update_info
            if unknown:
                raise ValueError("Invalid update_info for NCCLWeightTransferEngine: NCCLWeightTransferUpdateInfo."
                                 f"__init__() got an unexpected keyword argument '{unknown[0]}'")
            names, dtypes, shapes = (info.get(k, []) for k in UPDATE_FIELDS)
            for key, seq in (("dtype_names", dtypes), ("shapes", shapes)):  # nccl_engine.py:102-113
                if len(seq) != len(names):
                    raise ValueError(f"`{key}` should be of the same size as `names`: got {len(seq)} and {len(names)}")
            if self.pgs == [] or None in self.pgs:  # nccl_engine.py:196-199
                raise RuntimeError("NCCL weight transfer not initialized. Call init_transfer_engine() first.")
        except (ValueError, RuntimeError) as e:
            self.active = False  # gpu_worker.py:1620-1623: a failed update ends the session
            raise worker_error(str(e)) from e
        metas = [(n, getattr(torch, d), list(s)) for n, d, s in zip(names, dtypes, shapes, strict=True)]
        _on_all_workers(lambda i: self._receive(i, metas), self.n_workers)
        return {"message": "Weights updated"}  # api_router.py:204

    def _receive(self, i: int, metas: list[tuple[str, torch.dtype, list[int]]]) -> None:
        """One worker's receive_weights (nccl_engine.py:183-240; packed: packed_tensor.py:259-276)."""
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        pg, model = self.pgs[i], self.weights[i]
        if not self.packed:
            for name, dtype, shape in metas:
                t = torch.empty(shape, dtype=dtype)
                pg.broadcast([t], opts).wait()
                model[name].copy_(t)
            return
        chunk: list[tuple[str, torch.dtype, list[int], int]] = []
        size = 0
        for k, (name, dtype, shape) in enumerate(metas):
            nbytes = math.prod(shape) * dtype.itemsize
            chunk.append((name, dtype, shape, nbytes))
            size += nbytes
            if size > self.buffer_bytes or k == len(metas) - 1:
                buf = torch.empty(size, dtype=torch.uint8)
                pg.broadcast([buf], opts).wait()
                for (n, d, s, _), part in zip(chunk, buf.split([c[3] for c in chunk]), strict=True):
                    model[n].copy_(part.view(d).view(s))
                chunk, size = [], 0

    def finish(self, q: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        self._engine()
        if not self.active:  # gpu_worker.py:1634-1641
            raise worker_error("finish_weight_update called without a matching start_weight_update.")
        self.active = False
        version = body.get("weight_version")
        if version is not None:  # async_llm.py:1432-1436
            self.weight_version = str(version)
        return {"message": "Weight update finished"}

    def set_version(self, q: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        version = _embedded(body, "new_version")
        self.weight_version = str(version)
        return {"success": True, "new_version": version}  # api_router.py:217-223

    def reset_prefix_cache(self, q: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        if self.held_resets > 0:  # dev/cache/api_router.py:31-33: fails while blocks are held
            self.held_resets -= 1
            return {"success": False}
        return {"success": True}

    def weight_checker(self, q: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        if body.get("action") != "checksum":
            raise worker_error("scripted: only action=checksum")
        return {"checksums": {f"{i}:{n}": checksum(t) for i, w in enumerate(self.weights) for n, t in w.items()}}

    # ---------------------------------------------------------------------------------------------- serving
    def start_serving(self) -> ScriptedVllm:
        server = self
        table = self.routes()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _go(self, method: str) -> None:
                url = urlparse(self.path)
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                body = json.loads(raw) if raw else {}
                server.requests.append((method, url.path, body))
                fn = table.get((method, url.path))
                try:
                    if fn is None:
                        raise NOT_FOUND
                    status, out = 200, fn(parse_qs(url.query), body)
                except HttpError as e:
                    status, out = e.status, e.body
                data = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self._go("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._go("POST")

        ThreadingHTTPServer.daemon_threads = True
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.running.set()  # no handler thread stays kept
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> ScriptedVllm:
        return self.start_serving()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def checksum(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def _embedded(body: Any, key: str) -> Any:
    """FastAPI ``Body(embed=True)``: the value under ``key``; missing -> 422 (api_router.py:165, 198, 220)."""
    if not isinstance(body, dict) or key not in body:
        raise HttpError(422, {"detail": [{"type": "missing", "loc": ["body", key], "msg": "Field required"}]})
    return body[key]


def _on_all_workers(fn: Any, n: int) -> None:
    """Run ``fn(i)`` for every worker at once (their collectives meet the trainer's); re-raise the first error."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            fn(i)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise worker_error(f"scripted worker failed: {errors[0]}")


def _opt(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def _opt_list(args: list[str], name: str) -> list[str]:
    if name not in args:
        return []
    out = []
    for a in args[args.index(name) + 1:]:
        if a.startswith("--"):
            break
        out.append(a)
    return out


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    sd: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")) if path.is_dir() else []:
        sd.update(load_file(str(f)))
    return sd


def main(argv: list[str]) -> int:
    """``tests/vllm_server.py --version`` or ``... serve PATH [vllm serve options]`` (serves until killed)."""
    if argv[:1] == ["--version"]:
        print(CONTRACT["sdist"]["version"])
        return 0
    server = ScriptedVllm(["vllm", *argv], dict(os.environ)).start_serving()
    assert server._httpd is not None
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
