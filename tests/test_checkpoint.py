"""Checkpoint directory protocol: atomic commit, crash leftovers ignored, retention."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from arbor.tasks.training import checkpoint as ckpt


def save(root: Path, step: int, metric: float | None = None, payload: str = "w") -> Path:
    tmp = ckpt.begin(root, step)
    (tmp / "hf").mkdir()
    (tmp / "hf" / "weights").write_text(payload)
    return ckpt.commit(tmp, step, {"step": step, "metrics": {} if metric is None else {"reward": metric}})


def test_only_committed_checkpoints_count(tmp_path: Path) -> None:
    save(tmp_path, 1)
    save(tmp_path, 2)
    # a crash while saving step 3: the temporary directory exists, fully populated but never renamed
    tmp = ckpt.begin(tmp_path, 3)
    (tmp / "hf").mkdir()
    # and a directory with the final name but no marker (e.g. copied by hand, interrupted)
    (tmp_path / "step_000004").mkdir()
    assert ckpt.complete_steps(tmp_path) == [1, 2]
    assert ckpt.latest_complete(tmp_path) == tmp_path / "step_000002"
    # the next save clears the crashed leftover
    save(tmp_path, 3)
    assert not (tmp_path / "step_000003.tmp").exists()
    assert ckpt.complete_steps(tmp_path) == [1, 2, 3]
    assert ckpt.read_state(tmp_path / "step_000003")["step"] == 3


def test_saving_a_step_again_replaces_it(tmp_path: Path) -> None:
    save(tmp_path, 5, payload="old")
    save(tmp_path, 5, payload="new")  # a replayed step saved again
    assert (tmp_path / "step_000005" / "hf" / "weights").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000005"]


def test_retention_keeps_last_k_and_best(tmp_path: Path) -> None:
    for step, metric in [(1, 0.1), (2, 0.9), (3, 0.2), (4, 0.3), (5, 0.25)]:
        save(tmp_path, step, metric)
    removed = ckpt.apply_retention(tmp_path, keep_last=2, keep_best=True, best_metric="reward")
    # last two: 4, 5; best reward 0.9 at step 2
    assert removed == [1, 3]
    assert ckpt.complete_steps(tmp_path) == [2, 4, 5]
    ckpt.apply_retention(tmp_path, keep_last=1, keep_best=False, best_metric="reward")
    assert ckpt.complete_steps(tmp_path) == [5]


def test_rng_state_roundtrip() -> None:
    state = ckpt.rng_state()
    a = (random.random(), torch.rand(3))
    ckpt.set_rng_state(state)
    b = (random.random(), torch.rand(3))
    assert a[0] == b[0] and torch.equal(a[1], b[1])


def test_the_last_step_is_always_checkpointed() -> None:
    from arbor.tasks.training.checkpoint import checkpoint_due

    assert [s for s in range(1, 8) if checkpoint_due(s, 5, 7)] == [5, 7]
    assert [s for s in range(1, 11) if checkpoint_due(s, 5, 10)] == [5, 10]
    assert [s for s in range(1, 4) if checkpoint_due(s, 1, 3)] == [1, 2, 3]


def test_redo_discards_the_checkpoints_from_its_step_on(tmp_path: Path) -> None:
    """``--redo S:X``: checkpoints of step S and later go, complete or a crashed save's leftover;
    earlier ones and unrelated files stay."""
    from arbor.tasks.training.checkpoint import discard_from

    for name in ("step_000001", "step_000002", "step_000003.tmp", "step_000004.trash", "step_000005", "notes"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text("x")
    assert discard_from(tmp_path, 2) == [2, 3, 4, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "step_000001"]
    assert discard_from(tmp_path / "missing", 1) == []


def test_export_copies_the_latest_complete_policy_atomically(tmp_path: Path) -> None:
    """``export_policy``: the latest *complete* checkpoint's hf/ (a crashed save's .tmp and a step
    without its marker are skipped), a chosen step, provenance beside the weights, and no overwrite."""
    import json

    from arbor.tasks.training.checkpoint import MARKER, export_policy, final_policy, run_root_from_config

    root = tmp_path / "ckpt"
    for step, complete in ((1, True), (2, True), (3, False)):
        hf = root / f"step_{step:06d}" / "hf"
        hf.mkdir(parents=True)
        (hf / "config.json").write_text(json.dumps({"step": step}))
        (hf.parent / "state.json").write_text(json.dumps({"step": step, "policy_version": step, "metrics": {}}))
        if complete:
            (hf.parent / MARKER).write_text("")
    (root / "step_000004.tmp" / "hf").mkdir(parents=True)
    assert final_policy(root) == root / "step_000002" / "hf"
    out = export_policy(root, tmp_path / "final")
    assert json.loads((out / "config.json").read_text()) == {"step": 2}
    assert json.loads((out / "arbor_export.json").read_text())["step"] == 2
    assert json.loads((export_policy(root, tmp_path / "first", step=1) / "config.json").read_text()) == {"step": 1}
    with pytest.raises(FileExistsError):
        export_policy(root, tmp_path / "final")
    with pytest.raises(FileNotFoundError, match="complete: 1, 2"):
        export_policy(root, tmp_path / "third", step=3)
    assert not (tmp_path / "third").exists() and not (tmp_path / "final.tmp").exists()
    assert final_policy(tmp_path / "empty") is None
    # where a stored run's checkpoints are: its checkpoint.dir, else {home}/checkpoints/{run_id}
    assert run_root_from_config('{"checkpoint": {"dir": "/x/y"}}', "r", tmp_path) == Path("/x/y")
    assert run_root_from_config('{"checkpoint": {"dir": null}}', "r", tmp_path) == tmp_path / "checkpoints" / "r"
    assert run_root_from_config(None, "r", tmp_path) == tmp_path / "checkpoints" / "r"
