"""The trainer as a long-lived process group driven step by step through a directory of JSON files.

On several GPUs / nodes the trainer runs under DeepSpeed's launcher (``deepspeed --num_gpus N`` or
``--hostfile``); on a CPU it is one ``python -m arbor.tasks.training.trainer_service`` process. Same trainer code either way.

Control channel (a directory shared with the flow; on several nodes it must be on a filesystem rank 0 sees)::

    config.json          the run's ArborConfig (written by the client before launch)
    loss.json            the method's clip and KL term (``LossSettings``; the trainer builds no method)
    updates/step_*.parquet  each step's ``UpdateBatch`` (``write_update``), kept until a checkpoint covers it
    cmd/{seq:06d}.json   commands, written by the flow (temporary name + os.replace), seq = 1, 2, 3, ...
    resp/{seq:06d}.json  answers, written by rank 0 after every rank executed the command
    heartbeat.json       {pid, step, policy_version, time}, refreshed while idle
    service.log          stdout / stderr of the launcher

Commands (``op`` plus arguments) and answers (always ``ok``; ``error`` when not ok):
    ping                                   -> step, policy_version
    train        step, update (Parquet)    -> metrics           (``write_update``: trajectories + advantages)
    save         step?, metrics?, wait?    -> path, committed   (atomic checkpoint + retention; wait=false: written
                                                                 in the background; committed:
                                                                 the latest complete checkpoint's step, or null)
    finish_save                            -> committed         (wait for the save in flight)
    load_latest                            -> step (null: none) (then the flow replays later steps with train)
    export_hf    path                      -> path, policy_version   (save-and-restart weight sync)
    sync_vllm    base_url, master_address, master_port, packed, buffer_bytes, timeout_s, reset_tries
                                           -> policy_version, weight_version (confirmed), seconds, bytes
    shutdown     abandon?                  -> (the process group exits 0 once the save in flight is written;
                                               abandon=true: it is left uncommitted, as a stop wants)

A failing command answers ``ok: false`` and the service keeps serving; if the process group dies, the client
(``TrainerService``) restarts it, loads the latest checkpoint and replays the steps after it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from arbor.config import ArborConfig, ClusterConfig, TrainConfig
from arbor.tasks.training.checkpoint import checkpoint_due, complete_steps
from arbor.tasks.training.update import grpo_loss_settings
from arbor.types import LossSettings, Trajectory, UpdateBatch

POLL_S = 0.02


class TrainerDied(RuntimeError):
    """The trainer process group exited while a command was pending."""


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, sort_keys=True))
    os.replace(tmp, path)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_launch_command(
    train: TrainConfig, cluster: ClusterConfig, channel: str | Path, model_path: str | Path, home: str | Path, *,
    python: str = sys.executable, master_port: int | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) that start the trainer service.

    GPUs (``train.num_gpus > 0`` or ``train.hostfile``): ``deepspeed [--hostfile H] [--num_gpus N] --master_port P
    --module arbor.tasks.training.trainer_service ...``. CPU: ``python -m arbor.tasks.training.trainer_service ...`` with the single-process
    rendezvous variables."""
    port = master_port or free_port()
    args = ["--channel", str(channel), "--model-path", str(model_path), "--home", str(home)]
    tc = train
    if tc.num_gpus > 0 or tc.hostfile:
        cmd = ["deepspeed"]
        if tc.hostfile:
            cmd += ["--hostfile", tc.hostfile]
        if cluster.train_gpus and not tc.hostfile:  # the profile's GPU layout (rollouts use the others)
            cmd += ["--include", "localhost:" + ",".join(str(g) for g in cluster.train_gpus)]
        elif tc.num_gpus > 0:
            cmd += ["--num_gpus", str(tc.num_gpus)]
        cmd += ["--master_port", str(port), "--no_local_rank", "--module", "arbor.tasks.training.trainer_service", *args]
        return cmd, {}
    env = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    return [python, "-m", "arbor.tasks.training.trainer_service", *args], env


# ---------------------------------------------------------------------------------------------- server side
UPDATE_COLUMNS = ("advantages", "advantage_dtype", "versions_behind", "update_phase", "scoring_temperature")


def write_update(update: UpdateBatch, path: str | Path) -> Path:
    """The controller's ``UpdateBatch`` as one Parquet file (written atomically): a row per trajectory
    (``Trajectory.to_row()``) with its per-token advantages and version lag; the KL coefficient and the
    controller's metrics in the file's metadata. Advantages are stored as float64, which holds every float32
    and float64 value exactly, with their dtype, so the trainer applies bit for bit what the controller computed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{**t.to_row(), "advantages": a.tolist(), "advantage_dtype": str(a.dtype).removeprefix("torch."),
             "versions_behind": v, "update_phase": ph, "scoring_temperature": temp}
            for t, a, v, ph, temp in zip(update.trajectories, update.advantages, update.versions_behind,
                                         update.phases or [0] * len(update.trajectories),
                                         update.temperatures or [None] * len(update.trajectories), strict=True)]
    table = pa.Table.from_pylist(rows).replace_schema_metadata({
        "arbor.kl_coef": repr(float(update.kl_coef)), "arbor.metrics": json.dumps(update.metrics)})
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, p)
    return p


def read_update(path: str | Path) -> UpdateBatch:
    """``write_update``'s file back as an ``UpdateBatch``."""
    import pyarrow.parquet as pq
    import torch

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"update {p}: no such Parquet file")
    table = pq.read_table(p)
    meta = table.schema.metadata or {}
    rows = table.to_pylist()
    return UpdateBatch(
        trajectories=[Trajectory.from_row({k: v for k, v in r.items() if k not in UPDATE_COLUMNS}) for r in rows],
        advantages=[torch.tensor(r["advantages"], dtype=getattr(torch, r["advantage_dtype"])) for r in rows],
        versions_behind=[int(r["versions_behind"]) for r in rows],
        kl_coef=float(meta[b"arbor.kl_coef"]), metrics=json.loads(meta[b"arbor.metrics"]),
        phases=[int(r["update_phase"]) for r in rows],
        temperatures=[None if r["scoring_temperature"] is None else float(r["scoring_temperature"]) for r in rows])


def torch_device(trainer: Any) -> Any:
    """The trainer's CUDA device (the NCCL transfer group lives there)."""
    import torch

    return torch.device(getattr(trainer, "device", "cuda"))


def execute(trainer: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    """Run one command on every rank; the answer (rank 0's) is JSON-serialisable."""
    op = cmd.get("op")
    if op == "ping":
        return {"step": trainer.step, "policy_version": trainer.policy_version}
    if op == "train":
        metrics = trainer.train_step(read_update(cmd["update"]), int(cmd["step"]))
        trainer.data_position = {"step": int(cmd["step"]), "update": str(cmd["update"])}
        return {"metrics": metrics, "policy_version": trainer.policy_version}
    if op == "save":
        path = trainer.save_checkpoint(cmd.get("step"), cmd.get("metrics"), wait=bool(cmd.get("wait", True)))
        return {"path": str(path), "committed": _committed(trainer)}
    if op == "finish_save":
        trainer.finish_save()
        return {"committed": _committed(trainer)}
    if op == "load_latest":
        return {"step": trainer.load_latest(), "policy_version": trainer.policy_version}
    if op == "export_hf":
        return {"path": str(trainer.export_hf(cmd["path"])), "policy_version": trainer.policy_version}
    if op == "sync_vllm":
        from arbor.tasks.training.vllm_sync import NcclCommunicator, VllmWeightSync
        from arbor.tasks.training.weight_sync import push_state_dict

        if not hasattr(trainer, "_vllm"):  # once: rank 0 joins the server's workers (vLLM 0.33, no vLLM import)
            comm = NcclCommunicator(cmd["master_address"], int(cmd["master_port"]), torch_device(trainer),
                                    timeout_s=float(cmd["timeout_s"]))
            trainer._vllm = VllmWeightSync(cmd["base_url"], comm, packed=bool(cmd["packed"]),
                                           buffer_bytes=int(cmd["buffer_bytes"]), timeout_s=float(cmd["timeout_s"]),
                                           reset_tries=int(cmd["reset_tries"]))
        report = push_state_dict(trainer._vllm, trainer)
        if report is None:
            return {"policy_version": trainer.policy_version}
        return {"policy_version": trainer.policy_version, "weight_version": report.version,
                "seconds": report.seconds, "bytes": report.bytes}
    raise ValueError(f"unknown op {op!r} (known: ping, train, save, finish_save, load_latest, export_hf, sync_vllm, "
                     "shutdown)")


def _committed(trainer: Any) -> int | None:
    """The step of the latest complete checkpoint (a save in flight is not one yet)."""
    steps = complete_steps(trainer.ckpt_root)
    return steps[-1] if steps else None


def serve(channel: Path, model_path: Path, home: Path) -> int:
    """The service loop (every rank). Rank 0 reads commands and broadcasts them; all ranks execute."""
    from arbor.tasks.training.engine import init_single_process_env
    from arbor.tasks.training.train import Trainer

    init_single_process_env()
    cfg = ArborConfig.model_validate_json((channel / "config.json").read_text())
    loss = LossSettings(**json.loads((channel / "loss.json").read_text()))
    trainer = Trainer(cfg, model_path, home, loss)
    rank, world = trainer.rank, trainer.world
    cmd_dir, resp_dir = channel / "cmd", channel / "resp"
    seq = 0
    while True:
        seq += 1
        cmd: dict[str, Any] | None = None
        if rank == 0:
            path = cmd_dir / f"{seq:06d}.json"
            last_beat = 0.0
            while not path.exists():
                if time.monotonic() - last_beat > 1.0:
                    write_json_atomic(channel / "heartbeat.json", dict(
                        pid=os.getpid(), step=trainer.step, policy_version=trainer.policy_version, time=time.time()))
                    last_beat = time.monotonic()
                time.sleep(POLL_S)
            cmd = json.loads(path.read_text())
        if world > 1:
            import deepspeed.comm as dist

            box = [cmd]
            dist.broadcast_object_list(box, src=0)
            cmd = box[0]
        assert cmd is not None
        if cmd.get("op") == "shutdown":
            trainer.finish_save(abandon=bool(cmd.get("abandon")))  # never exit mid-write
            if rank == 0:
                write_json_atomic(resp_dir / f"{seq:06d}.json", {"ok": True})
            return 0
        try:
            answer = {"ok": True, **execute(trainer, cmd)}
        except Exception as e:  # noqa: BLE001 - reported to the flow, which decides
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        if rank == 0:
            write_json_atomic(resp_dir / f"{seq:06d}.json", answer)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="arbor trainer service (driven through a control directory)")
    ap.add_argument("--channel", required=True, type=Path)
    ap.add_argument("--model-path", required=True, type=Path)
    ap.add_argument("--home", required=True, type=Path)
    args, _ = ap.parse_known_args(argv)  # tolerate launcher extras such as --local_rank
    from arbor.runtime.quiet import quiet

    quiet()
    return serve(args.channel, args.model_path, args.home)


# ---------------------------------------------------------------------------------------------- client side
class TrainerService:
    """Start, drive and supervise the trainer process group from the flow."""

    def __init__(self, cfg: ArborConfig, model_path: str | Path, home: str | Path, channel: str | Path,
                 loss: LossSettings | None = None, *, python: str = sys.executable) -> None:
        self.cfg = cfg
        self.loss = loss or grpo_loss_settings(cfg.train)
        self.model_path = Path(model_path)
        self.home = Path(home)
        self.channel = Path(channel)
        self.python = python
        self.proc: subprocess.Popen[bytes] | None = None
        self.seq = 0

    def command(self) -> tuple[list[str], dict[str, str]]:
        return build_launch_command(self.cfg.train, self.cfg.cluster, self.channel, self.model_path, self.home,
                                    python=self.python)

    def start(self) -> None:
        """Launch a fresh process group (the channel's command history is cleared)."""
        for sub in ("cmd", "resp"):
            d = self.channel / sub
            d.mkdir(parents=True, exist_ok=True)
            for f in d.glob("*.json"):
                f.unlink()
        (self.channel / "config.json").write_text(self.cfg.to_json())
        write_json_atomic(self.channel / "loss.json", asdict(self.loss))
        argv, env = self.command()
        log = open(self.channel / "service.log", "ab")  # noqa: SIM115 - owned by the child process
        self.proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()
        self.seq = 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def call(self, op: str, timeout_s: float = 3600.0, **args: Any) -> dict[str, Any]:
        """Send one command and wait for its answer; raises ``TrainerDied`` if the group exits meanwhile."""
        if self.proc is None:
            raise RuntimeError("trainer service not started")
        self.seq += 1
        write_json_atomic(self.channel / "cmd" / f"{self.seq:06d}.json", {"op": op, **args})
        resp = self.channel / "resp" / f"{self.seq:06d}.json"
        deadline = time.monotonic() + timeout_s
        while not resp.exists():
            if self.proc.poll() is not None:
                raise TrainerDied(f"trainer exited with code {self.proc.returncode} during '{op}' "
                                  f"(log: {self.channel / 'service.log'})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"trainer did not answer '{op}' within {timeout_s} s")
            time.sleep(POLL_S)
        return json.loads(resp.read_text())

    def stop(self, timeout_s: float = 30.0, abandon: bool = False) -> int | None:
        """Ask for a clean shutdown; kill the process group if it does not exit. ``abandon``: a save in flight is
        left uncommitted instead of waited for (a stop)."""
        if self.proc is None:
            return None
        if self.alive():
            try:
                self.call("shutdown", timeout_s=timeout_s, abandon=abandon)
                self.proc.wait(timeout_s)
            except (TrainerDied, TimeoutError, subprocess.TimeoutExpired):
                self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart_and_replay(self, batches_after: Callable[[int | None], list[tuple[int, str]]]) -> int | None:
        """Supervision: relaunch, load the latest complete checkpoint, replay the training stage of every later
        step from its stored update (``batches_after(step)`` -> [(step, parquet path), ...]). Returns the last
        step trained (or the checkpoint's step when nothing was replayed)."""
        self.kill()
        self.start()
        answer = self.call("load_latest")
        if not answer["ok"]:
            raise RuntimeError(f"load_latest failed: {answer['error']}")
        step = answer["step"]
        for s, path in batches_after(step):
            r = self.call("train", step=s, update=str(path))
            if not r["ok"]:
                raise RuntimeError(f"replay of step {s} failed: {r['error']}")
            step = s
        return step



class RemoteTrainer:
    """The flow's view of a trainer running under DeepSpeed's launcher: the in-process ``Trainer``'s interface
    (``train_step``, ``maybe_save``, ``load_latest``, ``policy_version``) over the control channel, with
    supervision: if the process group dies, it is restarted from the latest checkpoint and the updates sent
    after it are replayed (``update_path(step)``: kept in the channel until a checkpoint covers the step)."""

    def __init__(self, cfg: ArborConfig, model_path: str | Path, home: str | Path, loss: LossSettings | None = None,
                 max_restarts: int = 3) -> None:
        rid = cfg.run.run_id or "default"
        self.cfg = cfg
        self.model_path = Path(model_path)
        self.max_restarts = max_restarts
        self.restarts = 0
        self.service = TrainerService(cfg, model_path, home, Path(home) / "trainer" / rid, loss)
        self.service.start()
        self.step = 0
        self.policy_version = 0

    def _call(self, op: str, **args: Any) -> dict[str, Any]:
        while True:
            try:
                answer = self.service.call(op, **args)
            except TrainerDied:
                if self.restarts >= self.max_restarts:
                    raise
                self.restarts += 1
                self.service.restart_and_replay(self._batches_after)
                continue
            if not answer.get("ok", True):
                raise RuntimeError(f"trainer '{op}' failed: {answer.get('error')}")
            return answer

    def update_path(self, step: int) -> Path:
        return self.service.channel / "updates" / f"step_{step:06d}.parquet"

    def _batches_after(self, ckpt: int | None) -> list[tuple[int, str]]:
        """The updates of the steps trained after checkpoint ``ckpt`` (replayed after a restart)."""
        return [(s, str(self.update_path(s))) for s in range((ckpt or 0) + 1, self.step + 1)]

    def train_step(self, update: UpdateBatch, step: int) -> dict[str, float]:
        answer = self._call("train", step=step, update=str(write_update(update, self.update_path(step))))
        self.step, self.policy_version = step, int(answer["policy_version"])
        return dict(answer["metrics"])

    def maybe_save(self, step: int, metrics: dict[str, float] | None = None) -> None:
        """Save when due; under ``checkpoint.async_save`` the service answers once the state is copied and writes
        it in the background, so only the updates up to the latest *committed* checkpoint go."""
        if checkpoint_due(step, self.cfg.checkpoint.every, self.cfg.run.steps):
            answer = self._call("save", step=step, metrics=metrics or {}, wait=not self.cfg.checkpoint.async_save)
            self._drop_updates(answer.get("committed"))

    def _drop_updates(self, committed: int | None) -> None:
        """A restart replays only the updates after the latest complete checkpoint: the earlier ones go."""
        for s in range(1, (committed or 0) + 1):
            self.update_path(s).unlink(missing_ok=True)

    def load_latest(self) -> int | None:
        answer = self._call("load_latest")
        self.step = answer["step"] or 0
        self.policy_version = int(answer["policy_version"])
        return answer["step"]

    def export_hf(self, path: str | Path) -> Path:
        return Path(self._call("export_hf", path=str(path))["path"])

    def sync_vllm(self, base_url: str | None) -> int:
        """Push the weights to `vllm serve` (vLLM 0.33's weight transfer, ``tasks.training.vllm_sync``; rank 0 of the
        trainer joins the server's workers, whose number the server reports). Returns the version the server
        confirmed. Not run on GPUs in CI; the same client runs against ``tests/vllm_server.py`` over gloo."""
        c = self.cfg.cluster
        answer = self._call("sync_vllm", base_url=(base_url or "").removesuffix("/v1"), master_address="127.0.0.1",
                            master_port=c.vllm_port + 1, packed=c.sync_packed, buffer_bytes=c.sync_buffer_mb << 20,
                            timeout_s=c.sync_timeout_s, reset_tries=c.sync_reset_tries)
        return int(answer["weight_version"])

    def finish_save(self) -> None:
        """Wait for the service's save in flight to be written and committed; the updates it covers go."""
        answer = self._call("finish_save")
        self._drop_updates(answer.get("committed"))

    def close(self) -> None:
        """The run's end: the save in flight is written and committed first (a stop, ``arbor.runtime.stop``, abandons it
        instead: the previous checkpoint stays the latest and a resume replays the steps after it)."""
        from arbor.runtime import stop

        stopping = stop.current() is not None
        if not stopping and self.service.alive():
            try:
                answer = self.service.call("finish_save")
                if answer.get("ok"):
                    self._drop_updates(answer.get("committed"))
            except (TrainerDied, TimeoutError):
                pass  # nothing more to commit: the stored updates stay for a resume
        self.service.stop(abandon=stopping)


if __name__ == "__main__":
    raise SystemExit(main())
