"""In-process weight sync trainer -> transformers rollout engine, with policy-version tagging."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arbor.config import load_config
from arbor.tasks.env.policy import build_tiny_policy, load_policy
from arbor.tasks.env.rollout import TransformersEngine
from arbor.tasks.training.train import Trainer
from arbor.tasks.training.update import policy_update
from arbor.tasks.training.weight_sync import sync_weights
from arbor.types import Trajectory


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(home=tmp_path_factory.mktemp("home"))


def batch(version: int, vocab: int) -> list[Trajectory]:
    g = torch.Generator().manual_seed(version)
    out = []
    for s in range(4):
        resp = torch.randint(10, vocab, (8,), generator=g).tolist()
        out.append(Trajectory(
            run_id="w", step=version + 1, group=0, sample=s, question_id="q", question="?", golds=["a"],
            prompt_ids=torch.randint(10, vocab, (6,), generator=g).tolist(), response_ids=resp,
            loss_mask=[1] * 8, rollout_logprobs=[-9.0] * 8, base_reward=float(s % 2), policy_version=version,
        ))
    return out


def test_sync_into_rollout_engine_tags_the_version(tiny_dir: Path, tmp_path: Path) -> None:
    cfg = load_config("tiny-cpu", {"run.run_id": "w", "train.lr": 1e-3})
    tr = Trainer(cfg, tiny_dir, tmp_path)
    model, tok = load_policy(str(tiny_dir))
    engine = TransformersEngine(cfg, model, tok, search=None)
    vocab = model.config.vocab_size
    ids = torch.randint(10, vocab, (1, 16), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        before = engine.model(input_ids=ids).logits

    tr.train_step(policy_update(batch(0, vocab), 1, cfg.train, cfg.run.overlap), 1)
    assert sync_weights(tr, engine) == 1
    assert engine.policy_version == 1
    with torch.no_grad():
        after = engine.model(input_ids=ids).logits
        want = tr.full_logits(ids)
    assert torch.equal(after, want)  # the rollout model now computes exactly the trainer's policy
    assert not torch.equal(before, after)
    # the next step accepts batches tagged with the synced version only
    tr.train_step(policy_update(batch(1, vocab), 2, cfg.train, cfg.run.overlap), 2)
    with pytest.raises(AssertionError, match="version 1"):
        tr.train_step(policy_update(batch(1, vocab), 3, cfg.train, cfg.run.overlap), 3)


def test_sync_into_plain_module(tiny_dir: Path, tmp_path: Path) -> None:
    cfg = load_config("tiny-cpu", {"run.run_id": "w", "train.lr": 1e-3})
    tr = Trainer(cfg, tiny_dir, tmp_path)
    model, _ = load_policy(str(tiny_dir))
    tr.train_step(policy_update(batch(0, model.config.vocab_size), 1, cfg.train, cfg.run.overlap), 1)
    assert sync_weights(tr, model) == 1
    for k, v in tr.state_dict_for_sync().items():
        assert torch.equal(model.state_dict()[k], v), k
