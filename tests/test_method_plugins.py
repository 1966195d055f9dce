"""Methods as plug-ins: the registry, import paths, per-token advantages in the trainer."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from test_train import make_batch, make_trainer, params, tiny_model_dir
from torch import Tensor

from arbor.config import load_config
from arbor.config.train import TrainConfig
from arbor.preflight import check
from arbor.tasks.methods import BUILTIN, MethodError, method_names, resolve_method
from arbor.tasks.methods.grpo import GRPO
from arbor.tasks.training.losses import group_advantages, segment_advantages
from arbor.types import Trajectory
from examples.length_penalty import LengthPenaltyGRPO


class SegmentGRPO(GRPO):
    """GRPO's advantages written as one segment per trajectory: must train exactly like the broadcast."""

    name = "grpo-segments"

    def token_advantages(self, batch: Sequence[Trajectory], rewards: Sequence[float], groups: Sequence[int],
                         train: TrainConfig) -> list[Tensor]:
        adv = group_advantages(rewards, groups, norm=train.adv_norm, eps=train.adv_eps)
        return [segment_advantages(len(t.response_ids), [(0, len(t.response_ids), float(a))])
                for t, a in zip(batch, adv, strict=True)]


class NegatedGRPO(GRPO):
    name = "grpo-negated"

    def token_advantages(self, batch: Sequence[Trajectory], rewards: Sequence[float], groups: Sequence[int],
                         train: TrainConfig) -> list[Tensor]:
        return [-a for a in super().token_advantages(batch, rewards, groups, train)]


class ShortAdvantages(GRPO):
    name = "grpo-short"

    def token_advantages(self, batch: Sequence[Trajectory], rewards: Sequence[float], groups: Sequence[int],
                         train: TrainConfig) -> list[Tensor]:
        return [a[:-1] for a in super().token_advantages(batch, rewards, groups, train)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("models"))


def test_segment_advantages_by_hand() -> None:
    got = segment_advantages(6, [(0, 2, 1.5), (3, 6, -0.5)])
    assert got.dtype == torch.float32
    assert got.tolist() == [1.5, 1.5, 0.0, -0.5, -0.5, -0.5]  # token 2 lies in no segment: 0
    assert segment_advantages(3, []).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="overlaps"):
        segment_advantages(6, [(0, 3, 1.0), (2, 4, 1.0)])
    with pytest.raises(ValueError, match="outside"):
        segment_advantages(4, [(2, 5, 1.0)])


def test_registry_resolves_names_and_import_paths() -> None:
    assert sorted(method_names()) == ["arbor", "arco", "dapo", "grpo", "no-memory", "rar", "rubricem", "ss-grpo"]
    assert all(resolve_method(name).name == name for name in BUILTIN)
    assert resolve_method("examples.length_penalty:LengthPenaltyGRPO") is LengthPenaltyGRPO
    for spec, words in [("grpo2", "unknown method"), ("examples.length_penalty:Nope", "cannot import"),
                        ("arbor.types:Trajectory", "not a subclass"), ("no_such_pkg.mod:M", "cannot import")]:
        with pytest.raises(MethodError, match=words) as e:
            resolve_method(spec)
        assert str(e.value).startswith("run.method:")


def test_a_bad_method_is_refused_before_anything_starts() -> None:
    missing = check(load_config("tiny-cpu", {"run.method": "no_such_pkg.mod:M"}))
    assert any(m.startswith("run.method: cannot import 'no_such_pkg.mod:M'") for m in missing), missing
    with pytest.raises(ValueError, match="run.method"):  # not even a name or an import path
        load_config("tiny-cpu", {"run.method": "my method"})


def test_length_penalty_example_advantages_by_hand() -> None:
    # rewards [1, 0, 0], lengths [10, 10, 1010], beta 1e-3 -> [0.99, -0.01, -1.01]: mean -0.01, centred [1, 0, -1],
    # sample std 1 -> A = [1, 0, -1] / (1 + 1e-6); plain GRPO would give [2, -1, -1] / sqrt(3)
    batch = [Trajectory(run_id="t", step=1, group=0, sample=i, question_id="q", question="?", golds=["a"],
                        response_ids=[5] * n, loss_mask=[1] * n, rollout_logprobs=[0.0] * n)
             for i, n in enumerate([10, 10, 1010])]
    cfg = load_config("tiny-cpu")
    adv = LengthPenaltyGRPO(cfg).token_advantages(batch, [1.0, 0.0, 0.0], [0, 0, 0], cfg.train)
    assert [len(a) for a in adv] == [10, 10, 1010]
    assert [float(a[0]) for a in adv] == pytest.approx([1 / (1 + 1e-6), 0.0, -1 / (1 + 1e-6)], abs=1e-6)
    plain = GRPO(cfg).token_advantages(batch, [1.0, 0.0, 0.0], [0, 0, 0], cfg.train)
    assert [float(a[0]) for a in plain] == pytest.approx([2 / 3**0.5, -1 / 3**0.5, -1 / 3**0.5], abs=1e-5)


def test_segment_path_trains_bitwise_like_the_broadcast(model_dir: Path, tmp_path: Path) -> None:
    batch = make_batch(1, 0)
    ref = make_trainer(model_dir, tmp_path / "a", **{"run.method": "grpo"})
    seg = make_trainer(model_dir, tmp_path / "b", **{"run.method": "test_method_plugins:SegmentGRPO"})
    m_ref, m_seg = ref.train_step(batch, 1), seg.train_step(batch, 1)
    assert m_ref["loss"] == m_seg["loss"] and m_ref["grad_norm"] == m_seg["grad_norm"]
    pa, pb = params(ref), params(seg)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def test_token_advantages_reach_the_loss(model_dir: Path, tmp_path: Path) -> None:
    batch = make_batch(1, 0)
    m = make_trainer(model_dir, tmp_path / "a", **{"run.method": "grpo"}).train_step(batch, 1)
    neg = make_trainer(model_dir, tmp_path / "b", **{"run.method": "test_method_plugins:NegatedGRPO"})
    m_neg = neg.train_step(batch, 1)
    assert m["loss"] != 0.0 and m_neg["loss"] == pytest.approx(-m["loss"], rel=1e-6)
    short = make_trainer(model_dir, tmp_path / "c", **{"run.method": "test_method_plugins:ShortAdvantages"})
    with pytest.raises(ValueError, match="one advantage per response token"):
        short.train_step(batch, 1)


def test_micro_batch_reads_advantages_at_the_loss_positions() -> None:
    """make_micro gathers a per-token advantage exactly where the loss reads a token (loss_mask 1), by hand."""
    from arbor.tasks.training.packing import make_micro

    m = make_micro([[1, 2], [3]], [[4, 5, 6], [7, 8]], [[1, 0, 1], [0, 1]],
                   advantages=[torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.4, 0.5])])
    # row 0: prompt length 2, response tokens 0 and 2 -> columns 1 and 3; row 1: prompt 1, token 1 -> column 1
    assert m.rows.tolist() == [0, 0, 1] and m.cols.tolist() == [1, 3, 1] and m.targets.tolist() == [4, 6, 8]
    assert m.adv.tolist() == pytest.approx([0.1, 0.3, 0.5])
    assert make_micro([[1]], [[2, 3]], [[1, 1]]).adv.tolist() == [0.0, 0.0]  # none given: zeros
