"""The trainer's side of vLLM 0.33's weight transfer for RL, spoken over HTTP without importing vLLM.

vLLM 0.33 documents this case ("Trainer Without vLLM over HTTP", ``docs/training/weight_transfer/nccl.md``;
reference ``examples/rl/rlhf_http_nccl_no_vllm.py``). The contract, as read from the 0.33.0 sdist (every fact cited
in docs/decisions/rollouts-and-weight-sync-as-vllm-0-33-speaks-them.md and checked against ``tests/data/vllm_0_33_contract.json`` by ``tests/test_vllm_contract.py``):

- the routes exist only on a server started with ``VLLM_SERVER_DEV_MODE=1``
  (``vllm/entrypoints/launchers/api_server/routers.py::register_api_routers``) and, for the transfer itself,
  ``--weight-transfer-config '{"backend": "nccl"}'`` (``vllm/v1/worker/gpu_worker.py::_check_weight_transfer_engine``);
- once: ``GET /get_world_size`` (TP x PP x DP workers), then ``POST /init_weight_transfer_engine``
  ``{"init_info": {...}}`` while rank 0 (the trainer) joins the group; ``init_info`` carries the rendezvous, the
  ranks and the packing (``NCCLWeightTransferInitInfo``, ``vllm/distributed/weight_transfer/nccl_common.py``);
  every worker then all-reduces one float32 zero, and so must the trainer before anything else;
- each sync: ``POST /start_weight_update``; ``POST /update_weights`` ``{"update_info": {names, dtype_names,
  shapes}}`` in the background while rank 0 broadcasts in ``names`` order (``NCCLWeightTransferUpdateInfo``,
  ``vllm/distributed/weight_transfer/nccl_engine.py``); ``POST /finish_weight_update`` ``{"weight_version": V}``
  (``vllm/entrypoints/rl/online/api_router.py``); ``GET /weight_info`` reads the version back;
- ``POST /reset_prefix_cache`` answers 200 with ``{"success": false}`` while blocks are held
  (``vllm/entrypoints/serve/dev/cache/api_router.py``): arbor retries, then fails naming the cause.

The communicator is ``NcclCommunicator`` on GPUs (a private ``TCPStore`` + ``ProcessGroupNCCL``; the NCCL unique id
is sent as ``nccl_unique_id_b64``). ``GlooCommunicator`` is the CPU stand-in used by the tests and
``bench/weight_sync.py``: it sends 0.33's other rendezvous form (``master_address``/``master_port``), which a real
vLLM GPU worker answers with its own NCCL group, not gloo; everything else (phases, packing, checks) is the same code.
Both rendezvous on the process's one TCPStore on the transfer port (:func:`transfer_store`), so the re-init after a
failed sync joins again on it.
"""

from __future__ import annotations

import base64
import datetime
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import torch

from arbor.tasks.stage_store import fault_point

DEFAULT_PACKED_BUFFER_BYTES = 1 << 30  # vllm/distributed/weight_transfer/packed_tensor.py
UPDATE_INFO_KEYS = ("names", "dtype_names", "shapes")  # NCCLWeightTransferUpdateInfo's fields, nothing else


class VllmSyncError(RuntimeError):
    """A weight sync with `vllm serve` failed; the message says what to fix."""


# (status, text the server's answer contains, what to fix); first match wins. The texts are vLLM 0.33's own.
_HINTS: list[tuple[int | None, str, str]] = [
    (404, "Not Found",
     "the route is not served: start vLLM with VLLM_SERVER_DEV_MODE=1 (arbor's launch sets it; an external server "
     "needs it in its environment), or use cluster.weight_sync=restart"),
    (None, "Weight transfer not configured",
     "start vLLM with --weight-transfer-config '{\"backend\": \"nccl\"}' (arbor's launch passes it)"),
    (None, "start_weight_update must be called before update_weights",
     "the server has no open weight update (it restarted, or another client finished it): arbor re-initialises the "
     "transfer on its next sync; resume the run (arbor train --resume RUN_ID)"),
    (None, "already active",
     "a previous sync left its update open (the trainer died mid-sync): restart the server, then resume the run"),
    (None, "Invalid update_info",
     "update_info holds names, dtype_names and shapes only in vLLM 0.33 (packing is agreed in init_info)"),
    (None, "should be of the same size",
     "update_info's names, dtype_names and shapes must have one entry per tensor"),
    (None, "Invalid init_info",
     "init_info does not match vLLM 0.33's NCCLWeightTransferInitInfo (check `vllm --version` is 0.33.x)"),
    (None, "not initialized",
     "the transfer group is gone (server restarted): arbor re-initialises on its next sync; resume the run"),
]


# after a failed /update_weights: vLLM 0.33 ends the update session (gpu_worker.py:1620-1623) without
# putting back the layers already received, and the trainer holds only the new weights, so the whole policy is pushed
# again, on resume, before anything generates (flows/run_setup.py::restore_policy syncs before the first rollout)
PARTLY_UPDATED = ("The served weights may be partly overwritten (vLLM does not restore them): the run stops before "
                  "any rollout on them, and its resume pushes the whole policy again before its first rollout")


def explain(method: str, route: str, status: int, text: str) -> str:
    """One line: what vLLM answered to ``method route`` and what to change."""
    for code, needle, hint in _HINTS:
        if (code is None or code == status) and needle in text:
            return f"vLLM answered {method} {route} with HTTP {status} ({text[:300]}): {hint}"
    return f"vLLM answered {method} {route} with HTTP {status}: {text[:300]}"


class VllmControl:
    """The HTTP control plane of one `vllm serve` (its root URL, without ``/v1``)."""

    def __init__(self, base_url: str, timeout_s: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.timeout_s = timeout_s

    def call(self, method: str, route: str, body: dict[str, Any] | None = None,
             params: dict[str, Any] | None = None) -> Any:
        """One request; a non-200 answer raises ``VllmSyncError`` with ``explain``'s hint."""
        try:
            r = httpx.request(method, f"{self.base_url}{route}", json=body if method == "POST" else None,
                              params=params, timeout=self.timeout_s)
        except httpx.HTTPError as e:
            raise VllmSyncError(f"vLLM at {self.base_url} did not answer {route} ({type(e).__name__}: {e}): is "
                                "the server up? (docs/gpu.md)") from e
        if r.status_code != 200:
            raise VllmSyncError(explain(method, route, r.status_code, r.text))
        return r.json() if r.content else None

    def world_size(self) -> int:
        """The server's inference workers across data parallelism (TP x PP x DP)."""
        return int(self.call("GET", "/get_world_size")["world_size"])

    def weight_version(self) -> str | None:
        return self.call("GET", "/weight_info")["weight_version"]

    def set_weight_version(self, version: str) -> None:
        """Tag the served weights (after a restart onto new weights) without a transfer."""
        self.call("POST", "/update_weight_version", {"new_version": version})

    def confirm_version(self, version: str) -> None:
        """Raise unless ``GET /weight_info`` reports ``version``."""
        got = self.weight_version()
        if got != version:
            raise VllmSyncError(f"vLLM reports weight_version {got!r} after the sync, arbor sent {version!r}: the "
                                "weights did not land (another trainer or a restart?); the policy version is not "
                                "advanced")

    def pause(self, mode: str = "keep") -> None:
        """``POST /pause?mode=keep``: requests in flight are frozen in the queue and finish after ``/resume``
        (``vllm/entrypoints/rl/online/api_router.py`` lines 31-72 in 0.32.0)."""
        self.call("POST", "/pause", params={"mode": mode})

    def resume(self) -> None:
        self.call("POST", "/resume")

    def reload_weights(self, path: str | Path) -> None:
        """``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}``: every worker
        reloads its weights in place from the HF folder ``DIR`` (0.32.0: ``entrypoints/serve/dev/rpc/api_router.py``
        lines 23-59 take string kwargs only; ``v1/worker/gpu_worker.py::reload_weights`` ->
        ``model_executor/model_loader/reload/inplace.py::reload_weights``)."""
        self.call("POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(path)}})

    def reset_prefix_cache(self, tries: int = 5, backoff_s: float = 1.0) -> int:
        """Reset the prefix cache (KV blocks of the old weights); returns the tries used. vLLM answers
        ``{"success": false}`` while blocks are held, so retry, then fail."""
        for i in range(1, tries + 1):
            if self.call("POST", "/reset_prefix_cache").get("success") is True:
                return i
            if i < tries:
                time.sleep(backoff_s * i)
        raise VllmSyncError(f"vLLM's /reset_prefix_cache answered success=false {tries} times: KV blocks are still "
                            "held by running requests, so cached prefixes of the old weights could be reused. Finish "
                            "rollouts before a sync (run.overlap=none) or raise cluster.sync_reset_tries")


# --------------------------------------------------------------------------------------------- communicators
_STORES: dict[tuple[str, int], Any] = {}
_STORES_LOCK = threading.Lock()


def transfer_store(host: str, port: int) -> Any:
    """This process's one listening ``TCPStore`` on ``host:port`` for the weight transfer, emptied for the
    rendezvous about to start.

    A failed sync re-initialises the transfer on the next one (``VllmWeightSync.ready``), but the previous group
    (``ProcessGroupNCCL`` / ``ProcessGroupGloo``) still holds its store, whose socket stays bound until the last
    reference goes: torch 2.13's ``TCPStore`` has no close or shutdown (``torch/_C/_distributed_c10d.pyi``), so a
    second listening store on the port failed with EADDRINUSE. The store is made once and kept; each later
    rendezvous deletes every key first (``list_keys``, ``delete_key``), so nobody reads the previous group's NCCL
    unique id (key "0") or gloo's rank addresses."""
    import torch.distributed as dist

    with _STORES_LOCK:
        store = _STORES.get((host, port))
        if store is None:
            store = _STORES[(host, port)] = dist.TCPStore(host, port, is_master=True, wait_for_workers=False)
        else:
            for key in store.list_keys():
                store.delete_key(key)
        return store


class Work(Protocol):
    def is_completed(self) -> bool: ...
    def wait(self) -> Any: ...


class Communicator(Protocol):
    """Rank 0 of the transfer group. ``rendezvous`` returns init_info's rendezvous fields; ``join`` blocks until
    every worker joined (run it while ``/init_weight_transfer_engine`` is in flight)."""

    device: torch.device

    def rendezvous(self, world_size: int) -> dict[str, Any]: ...
    def join(self) -> None: ...
    def broadcast(self, tensor: torch.Tensor) -> Work: ...
    def close(self) -> None: ...


class GlooCommunicator:
    """CPU stand-in (tests, bench): a gloo group on a private TCPStore announced as master_address/master_port."""

    def __init__(self, host: str, port: int, timeout_s: float = 600.0) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self.device = torch.device("cpu")
        self.store: Any = None
        self.pg: Any = None
        self.world_size = 0

    def rendezvous(self, world_size: int) -> dict[str, Any]:
        self.world_size = world_size
        self.pg = None  # a previous group (a re-init after a failed sync) is not used again
        self.store = transfer_store(self.host, self.port)
        return {"master_address": self.host, "master_port": self.port}

    def join(self) -> None:
        import torch.distributed as dist

        self.pg = dist.ProcessGroupGloo(self.store, 0, self.world_size, datetime.timedelta(seconds=self.timeout_s))
        self.pg.allreduce([torch.zeros(1)]).wait()  # the workers' warm-up all_reduce (nccl_common.py)

    def broadcast(self, tensor: torch.Tensor) -> Work:
        import torch.distributed as dist

        return self.pg.broadcast([tensor], dist.BroadcastOptions())  # rootRank defaults to 0: the trainer

    def close(self) -> None:
        self.pg = None
        self.store = None


class NcclCommunicator:
    """GPU: ``ProcessGroupNCCL`` on a private TCPStore only the trainer joins; its ``ncclUniqueId`` (store key "0",
    a torch implementation detail the vLLM example relies on too) goes to the workers as ``nccl_unique_id_b64``.
    Not run in CI (no GPU)."""

    def __init__(self, host: str, port: int, device: torch.device, timeout_s: float = 600.0) -> None:
        self.host, self.port, self.device, self.timeout_s = host, port, device, timeout_s
        self.pg: Any = None
        self._connect: threading.Thread | None = None

    def rendezvous(self, world_size: int) -> dict[str, Any]:
        import torch.distributed as dist

        store = transfer_store(self.host, self.port)
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = datetime.timedelta(seconds=self.timeout_s)
        self.pg = dist.ProcessGroupNCCL(store, 0, world_size, opts)
        self._connect = threading.Thread(target=self.pg.eager_connect_single_device, args=(self.device,),
                                         daemon=True)
        self._connect.start()  # publishes the unique id, then waits in ncclCommInitRank for the workers
        reader = dist.TCPStore(self.host, self.port, is_master=False)
        reader.wait(["0"], datetime.timedelta(seconds=60))
        uid = reader.get("0")
        if len(uid) != 128:
            raise VllmSyncError(f"torch published a {len(uid)}-byte NCCL unique id (128 expected): this torch "
                                "build does not fit vLLM 0.33's unique-id rendezvous; use cluster.weight_sync=restart")
        return {"nccl_unique_id_b64": base64.b64encode(uid).decode()}  # standard, not URL-safe, base64

    def join(self) -> None:
        assert self._connect is not None
        self._connect.join()
        self.pg.allreduce([torch.zeros(1, device=self.device)]).wait()  # the workers' warm-up all_reduce

    def broadcast(self, tensor: torch.Tensor) -> Work:
        import torch.distributed as dist

        return self.pg.broadcast([tensor], dist.BroadcastOptions())  # rootRank defaults to 0: the trainer

    def close(self) -> None:
        if self.pg is not None:
            self.pg.shutdown()
        self.pg = None


# --------------------------------------------------------------------------------------------- payloads
def update_info(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, list[Any]]:
    """0.33's per-round update_info: names, torch dtype attribute names, full shapes (nothing else)."""
    names, dtypes, shapes = [], [], []
    for n, t in named:
        names.append(n)
        dtypes.append(str(t.dtype).removeprefix("torch."))
        shapes.append(list(t.shape))
    return {"names": names, "dtype_names": dtypes, "shapes": shapes}


def check_update_info(info: dict[str, Any]) -> None:
    """0.33's own checks (``NCCLWeightTransferUpdateInfo`` and ``parse_update_info``), before anything is sent: a
    refusal after the broadcast began would leave the trainer waiting in it."""
    extra = set(info) - set(UPDATE_INFO_KEYS)
    if extra:
        raise VllmSyncError(f"update_info has {sorted(extra)}: vLLM 0.33 takes only {list(UPDATE_INFO_KEYS)} "
                            "(packing belongs in init_info)")
    n = len(info.get("names", []))
    if any(len(info.get(k, [])) != n for k in UPDATE_INFO_KEYS):
        raise VllmSyncError("update_info's names, dtype_names and shapes differ in length")
    bad = [d for d in info.get("dtype_names", []) if not isinstance(getattr(torch, d, None), torch.dtype)]
    if bad:
        raise VllmSyncError(f"update_info dtype_names {bad[:3]} are not torch dtype names")


def packed_chunks(named: Iterable[tuple[str, torch.Tensor]], buffer_bytes: int) -> Iterator[torch.Tensor]:
    """0.33's packing: byte views in ``names`` order, a chunk closed right after the tensor that takes it past
    ``buffer_bytes`` (``packed_tensor.py::packed_nccl_broadcast_consumer`` cuts the same way), then the rest."""
    chunk: list[torch.Tensor] = []
    size = 0
    for _, t in named:
        chunk.append(t.contiguous().view(-1).view(torch.uint8))
        size += chunk[-1].numel()
        if size > buffer_bytes:
            yield torch.cat(chunk)
            chunk, size = [], 0
    if chunk:
        yield torch.cat(chunk)


class _Background:
    """An HTTP call on a thread: the server answers only once this process has taken part in the collective."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.error: BaseException | None = None
        self.done = threading.Event()

        def run() -> None:
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                self.error = e
            finally:
                self.done.set()

        threading.Thread(target=run, daemon=True).start()

    def failed(self) -> bool:
        return self.done.is_set() and self.error is not None

    def result(self, timeout_s: float) -> None:
        if not self.done.wait(timeout_s):
            raise VllmSyncError(f"vLLM did not answer within {timeout_s:.0f} s")
        if self.error is not None:
            raise self.error


@dataclass
class SyncReport:
    version: str
    seconds: float
    tensors: int
    bytes: int
    reset_tries: int


class VllmWeightSync:
    """One trainer (rank 0) pushing full weights to one `vllm serve` (any TP x DP) each step."""

    def __init__(self, base_url: str, comm: Communicator, *, packed: bool = True,
                 buffer_bytes: int = DEFAULT_PACKED_BUFFER_BYTES, num_buffers: int = 2, timeout_s: float = 600.0,
                 reset_tries: int = 5, reset_backoff_s: float = 1.0) -> None:
        self.http = VllmControl(base_url, timeout_s)
        self.comm = comm
        self.packed, self.buffer_bytes, self.num_buffers = packed, buffer_bytes, num_buffers
        self.timeout_s = timeout_s
        self.reset_tries, self.reset_backoff_s = reset_tries, reset_backoff_s
        self.ready = False
        self.world_size = 0

    def init(self) -> None:
        """Join the server's workers as rank 0; packing is agreed here (0.33: an init_info setting)."""
        self.world_size = 1 + self.http.world_size()
        init_info = {**self.comm.rendezvous(self.world_size), "rank_offset": 1, "world_size": self.world_size,
                     "packed": self.packed, "packed_buffer_size_bytes": self.buffer_bytes,
                     "packed_num_buffers": self.num_buffers}
        call = _Background(lambda: self.http.call("POST", "/init_weight_transfer_engine", {"init_info": init_info}))
        joined = _Background(self.comm.join)
        while not joined.done.wait(0.05):
            if call.failed():  # refused before the workers joined: the trainer would wait for ever
                assert call.error is not None
                raise call.error
        if joined.error is not None:
            raise VllmSyncError(f"joining vLLM's transfer group failed: {joined.error}") from joined.error
        call.result(self.timeout_s)
        self.ready = True

    def _await(self, work: Work, update: _Background) -> None:
        """Wait for one broadcast; if the server refused the update meanwhile, stop waiting and say why."""
        while not work.is_completed():
            if update.done.wait(0.02) and update.error is not None:
                raise update.error  # the group is left mid-collective: push marks it for a new init
        work.wait()

    def _send(self, info: dict[str, list[Any]],
              named_tensors: Callable[[], Iterable[tuple[str, torch.Tensor]]]) -> int:
        """``/update_weights`` in the background while rank 0 broadcasts; returns the bytes sent."""
        update = _Background(lambda: self.http.call("POST", "/update_weights", {"update_info": info}))
        total = 0
        dev = self.comm.device
        data = ((n, t.to(dev)) for n, t in named_tensors())
        in_flight: list[tuple[Work, torch.Tensor]] = []
        stream = packed_chunks(data, self.buffer_bytes) if self.packed else (t.contiguous() for _, t in data)
        for buf in stream:
            total += buf.numel() * buf.element_size()
            in_flight.append((self.comm.broadcast(buf), buf))
            if len(in_flight) >= self.num_buffers:  # bounded memory: at most num_buffers chunks alive
                self._await(in_flight.pop(0)[0], update)
        for work, _ in in_flight:
            self._await(work, update)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        update.result(self.timeout_s)
        return total

    def push(self, named_tensors: Callable[[], Iterable[tuple[str, torch.Tensor]]], version: int | str) -> SyncReport:
        """start -> update (+ broadcast) -> finish(weight_version) -> confirm -> reset prefix cache.
        ``named_tensors`` is called twice (metadata, then data): it must be re-iterable."""
        if not self.ready:
            self.init()
        t0 = time.perf_counter()
        info = update_info(named_tensors())
        check_update_info(info)
        self.http.call("POST", "/start_weight_update")
        try:
            total = self._send(info, named_tensors)
        except BaseException as e:
            self.ready = False  # the group may be left mid-collective: the next sync initialises it again
            if isinstance(e, VllmSyncError):
                raise VllmSyncError(f"{e}. {PARTLY_UPDATED}") from e
            raise
        v = str(version)
        self.http.call("POST", "/finish_weight_update", {"weight_version": v})
        self.http.confirm_version(v)
        tries = self.http.reset_prefix_cache(self.reset_tries, self.reset_backoff_s)
        return SyncReport(version=v, seconds=time.perf_counter() - t0, tensors=len(info["names"]), bytes=total,
                          reset_tries=tries)

    def close(self) -> None:
        self.comm.close()
        self.ready = False


# --------------------------------------------------------------------------------------------- reload
def reload_sync(http: VllmControl, path: str | Path, version: int | str, *, reset_tries: int = 5,
                reset_backoff_s: float = 1.0) -> SyncReport:
    """``cluster.weight_sync=reload``: the server reloads the HF folder ``path`` in place. ``/pause?mode=keep`` (no
    request runs on half-loaded layers; kept requests finish on the new weights), ``/collective_rpc
    reload_weights``, ``/update_weight_version`` with the policy version, ``/weight_info`` read back,
    ``/reset_prefix_cache`` (KV blocks of the old weights), ``/resume``. On a failure the server is left paused:
    its layers may be half-loaded, and the next generation would kill its engine (``EngineDeadError``), so the
    caller restores good weights before resuming (``tasks.training.weight_sync.ReloadSync``)."""
    t0 = time.perf_counter()
    v = str(version)
    http.pause("keep")
    fault_point(int(v) if v.isdigit() else -1, "sync", "mid")  # ARBOR_FAULT=N:sync:kill-mid: the server left paused
    http.reload_weights(path)
    http.set_weight_version(v)
    http.confirm_version(v)
    tries = http.reset_prefix_cache(reset_tries, reset_backoff_s)
    http.resume()
    return SyncReport(version=v, seconds=time.perf_counter() - t0, tensors=0, bytes=0, reset_tries=tries)
