"""Checkpoints off the step's critical path: the step's save copies the state to host memory and a
background writer writes and commits it while the next step runs. Writes are held back (``checkpoint_async.hold_writes``) so a
save is observably in flight: the save returned, the next step ran, nothing is committed yet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from test_train import make_batch, make_trainer, params, tiny_model_dir

from arbor.tasks.training import checkpoint as ckpt
from arbor.tasks.training.checkpoint_async import HostPool, hold_writes, in_flight

pytestmark = pytest.mark.timeout(300)  # a save that waited for its held writer would hang: fail instead


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("models"), tie=False, seed=2)


def optimizer_tensors(tr: Any) -> list[torch.Tensor]:
    """Copies of every tensor of the engine's optimizer state (ZeRO partitions and Adam moments)."""
    out: list[torch.Tensor] = []

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            out.append(x.detach().clone())
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(tr.engine.optimizer.state_dict())
    return out


@pytest.mark.parametrize("overrides", [{}, {"train.zero_stage": 3, "policy.lora.enabled": True}],
                         ids=["zero2", "zero3-lora"])
def test_an_async_save_writes_the_saved_step_while_the_next_step_runs(
        model_dir: Path, tmp_path: Path, deterministic: None, overrides: dict[str, Any]) -> None:
    """(a) the files hold the saved step's weights, not the next step's, though the next step ran before anything
    was written; (b) the save returned and the next step finished while the writer had not written or committed;
    (c) a trainer resumed from that checkpoint replays the next step bitwise like the uninterrupted one."""
    o = {"train.updates_per_batch": 2, **overrides}
    tr = make_trainer(model_dir, tmp_path / "a", **o)
    tr.train_step(make_batch(1, 0), 1)
    at_save = params(tr)
    opt_at_save = optimizer_tensors(tr)
    with hold_writes():
        final = tr.save_checkpoint(1, {"mean_total_reward": 1.0}, wait=False)
        pending = in_flight(tr.ckpt_root)
        assert pending is not None and pending.step == 1
        tr.train_step(make_batch(2, 1), 2)  # the next step runs with the save in flight
        assert not pending.written.is_set() and not pending.committed.is_set()
        assert ckpt.latest_complete(tr.ckpt_root) is None and not final.exists()
        assert (tr.ckpt_root / "step_000001.tmp").is_dir()
    after = params(tr)
    assert any(not torch.equal(at_save[k], after[k]) for k in at_save)  # the step changed what was saved
    assert tr.finish_save() >= 0.0
    assert pending.committed.is_set() and ckpt.latest_complete(tr.ckpt_root) == final
    assert ckpt.read_state(final)["policy_version"] == 1

    hf = load_file(final / "hf" / "model.safetensors")
    for k, v in hf.items():
        assert torch.equal(v, at_save[k]), k
    c = make_trainer(model_dir, tmp_path / "a", **o)
    assert c.load_latest() == 1 and c.policy_version == 1
    got = params(c)
    assert all(torch.equal(got[k], at_save[k]) for k in at_save)
    got_opt = optimizer_tensors(c)
    assert len(got_opt) == len(opt_at_save)
    assert all(torch.equal(a, b) for a, b in zip(got_opt, opt_at_save, strict=True))
    c.train_step(make_batch(2, 1), 2)
    replayed = params(c)
    assert all(torch.equal(replayed[k], after[k]) for k in after)


def test_a_crash_with_a_save_in_flight_leaves_the_previous_checkpoint_latest(model_dir: Path, tmp_path: Path) -> None:
    """(d) while step 2's save is in flight only step 1 is complete (what a crash at that moment leaves); the save
    abandoned (a stop) never commits, and a resume loads step 1. A second save waits for the first (at most one in
    flight) and says how long it waited."""
    tr = make_trainer(model_dir, tmp_path / "a")
    tr.train_step(make_batch(1, 0), 1)
    first = tr.save_checkpoint(1, wait=False)
    tr.train_step(make_batch(2, 1), 2)
    with hold_writes():
        tr.save_checkpoint(2, wait=False)  # waits for step 1's writer, which was free to finish
        assert tr.save_timing is not None and tr.save_timing["wait_s"] >= 0.0
        assert ckpt.complete_steps(tr.ckpt_root) == [1] and ckpt.latest_complete(tr.ckpt_root) == first
        pending = in_flight(tr.ckpt_root)
        assert pending is not None and pending.step == 2
        tr.finish_save(abandon=True)
    pending.done.wait()
    assert pending.error is None and not pending.committed.is_set()
    assert ckpt.complete_steps(tr.ckpt_root) == [1]
    c = make_trainer(model_dir, tmp_path / "a")
    assert c.load_latest() == 1 and c.policy_version == 1
    c.train_step(make_batch(2, 1), 2)
    c.save_checkpoint(2)  # the next save clears the abandoned leftover
    assert ckpt.complete_steps(c.ckpt_root) == [1, 2]
    assert not (c.ckpt_root / "step_000002.tmp").exists()


@pytest.mark.parametrize("overrides", [{}, {"train.zero_stage": 3, "policy.lora.enabled": True}],
                         ids=["zero2", "zero3-lora"])
def test_reserve_before_the_first_step_holds_every_buffer_the_saves_draw(model_dir: Path, tmp_path: Path,
                                                                         overrides: dict[str, Any]) -> None:
    """``CheckpointSaver.reserve`` at the start fills the pool with every buffer the first step's save draws, the
    Adam moments the first step creates included: the first and second saves allocate at most a few scalars (the
    optimizer's step counters). It writes nothing under the checkpoint root. A CPU trainer does not reserve (a
    pool would hold a second copy of the model), so the pool is given here unpinned, as the CUDA one is pinned."""
    tr = make_trainer(model_dir, tmp_path / "a", **overrides)
    assert tr.reserved == (0.0, 0) and tr.saver.pool is None
    tr.saver.pool = HostPool(pin=False)
    _, reserved = tr.saver.reserve(tr.engine)
    assert reserved > 0 and (not tr.ckpt_root.exists() or not any(tr.ckpt_root.iterdir()))
    for step in (1, 2):
        tr.train_step(make_batch(step, step - 1), step)
        tr.save_checkpoint(step, wait=False)
        tr.finish_save()
        assert tr.save_timing is not None and 0 < tr.save_timing["snapshot_bytes"] <= tr.saver.pool.allocated_bytes
        assert tr.saver.pool.allocated_bytes - reserved <= 64, (step, tr.saver.pool.allocated_bytes, reserved)
    assert ckpt.latest_complete(tr.ckpt_root) == ckpt.step_dir(tr.ckpt_root, 2)
