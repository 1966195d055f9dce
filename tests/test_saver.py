"""The trainer's checkpoints (``tasks.training.saver``) on a stand-in engine, without DeepSpeed: a synchronous save
commits at once and retention runs; a save in the background writes the copy taken at the save and commits only when
its writer finished; an abandoned one never commits; a writer other than DeepSpeed's torch engine keeps the
synchronous path; ``load_latest`` restores the latest. The trainer end to end: tests/test_checkpoint_async.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine

from arbor.config import CheckpointConfig
from arbor.tasks.training import checkpoint as ckpt
from arbor.tasks.training.checkpoint_async import hold_writes, in_flight
from arbor.tasks.training.saver import CheckpointSaver


class LM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def save_pretrained(self, path: Path, state_dict: dict[str, torch.Tensor]) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        torch.save(dict(state_dict), Path(path) / "weights.pt")


class Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lm = LM()


class PlainWriter:
    """A checkpoint writer that is not DeepSpeed's torch engine (a configured ``checkpoint.writer``)."""

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        Path(path).mkdir(parents=True, exist_ok=exist_ok)

    def save(self, state_dict: Any, path: str) -> None:
        torch.save(state_dict, path)


class Engine:
    """What the saver reads of a DeepSpeed engine: the module (``lm``), its checkpoint writer, save and load."""

    def __init__(self, writer: Any) -> None:
        self.module = Head()
        self.checkpoint_engine = writer

    def save_checkpoint(self, path: str, tag: str, save_latest: bool) -> None:
        self.checkpoint_engine.makedirs(str(Path(path) / tag), exist_ok=True)
        self.checkpoint_engine.save({"w": self.module.lm.lin.weight.detach()}, str(Path(path) / tag / "model.pt"))

    def load_checkpoint(self, path: str, tag: str, **_: Any) -> tuple[str, dict[str, Any]]:
        with torch.no_grad():
            self.module.lm.lin.weight.copy_(torch.load(Path(path) / tag / "model.pt")["w"])
        return path, {}

    def set_weight(self, value: float) -> None:
        with torch.no_grad():
            self.module.lm.lin.weight.fill_(value)


def saver(tmp_path: Path, keep_last: int = 2) -> CheckpointSaver:
    return CheckpointSaver(tmp_path / "ckpt", CheckpointConfig(keep_last=keep_last, keep_best=False), rank=0, world=1,
                           zero_stage=0, model_path=tmp_path)


def written_weight(path: Path) -> float:
    return float(torch.load(path / "ds" / "model.pt")["w"][0, 0])


def test_a_synchronous_save_commits_keeps_the_last_and_loads_back(tmp_path: Path) -> None:
    s, engine = saver(tmp_path, keep_last=1), Engine(PlainWriter())
    engine.set_weight(1.0)
    first = s.save(engine, 1, {"step": 1, "policy_version": 1})
    assert ckpt.complete_steps(s.root) == [1] and first == ckpt.step_dir(s.root, 1)
    assert {p.name for p in first.iterdir()} == {"ds", "hf", "rng_rank0.pt", "state.json", ckpt.MARKER}
    assert set(s.timing or {}) == {"wait_s", "save_s", "write_s"} and (s.timing or {})["write_s"] == 0.0
    engine.set_weight(2.0)
    s.save(engine, 2, {"step": 2, "policy_version": 2})
    assert ckpt.complete_steps(s.root) == [2]  # keep_last 1
    engine.set_weight(3.0)
    assert s.load_latest(engine) == {"step": 2, "policy_version": 2}
    assert float(engine.module.lm.lin.weight.detach()[0, 0]) == 2.0


def test_a_background_save_writes_the_copy_taken_at_the_save(tmp_path: Path) -> None:
    s, engine = saver(tmp_path), Engine(TorchCheckpointEngine())
    engine.set_weight(1.0)
    with hold_writes():
        path = s.save(engine, 1, {"step": 1, "policy_version": 1}, wait=False)
        assert in_flight(s.root) is not None and not path.exists()
        assert (s.timing or {})["snapshot_bytes"] > 0
        engine.set_weight(5.0)  # the next step changes the weights before anything is written
    assert s.finish() >= 0.0
    assert in_flight(s.root) is None and ckpt.complete_steps(s.root) == [1]
    assert written_weight(path) == 1.0 and float(torch.load(path / "hf" / "weights.pt")["lin.weight"][0, 0]) == 1.0
    assert ckpt.read_state(path) == {"step": 1, "policy_version": 1}


def test_an_abandoned_save_never_commits(tmp_path: Path) -> None:
    s, engine = saver(tmp_path), Engine(TorchCheckpointEngine())
    with hold_writes():
        s.save(engine, 1, {"step": 1}, wait=False)
        pending = in_flight(s.root)
        assert pending is not None
        assert s.finish(abandon=True) == 0.0
    assert pending.done.wait(30)
    assert ckpt.complete_steps(s.root) == [] and (s.root / "step_000001.tmp").exists()
    assert s.load_latest(engine) is None


def test_another_writer_keeps_the_synchronous_path(tmp_path: Path) -> None:
    s, engine = saver(tmp_path), Engine(PlainWriter())
    path = s.save(engine, 1, {"step": 1}, wait=False)
    assert in_flight(s.root) is None and ckpt.complete_steps(s.root) == [1] and path.exists()
    assert "snapshot_bytes" not in (s.timing or {})
