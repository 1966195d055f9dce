"""The trainer scores tokens under the distribution the rollout sampled from.

The transformers engine samples from softmax(z / T) and records those log-probs; the trainer's pi_old and pi_theta
must be the same distribution, or the TIS weight exp(logp_old - logp_rollout) is far from 1 with identical weights
and the loss optimises the T = 1 policy instead of the one that generated the data.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arbor.config import load_config
from arbor.tasks.env.datasets import load_questions
from arbor.tasks.env.policy import load_policy
from arbor.tasks.env.rollout import make_engine
from arbor.tasks.env.search import make_search
from arbor.tasks.training.head import PolicyHead, scoring_temperature
from arbor.tasks.training.train import Trainer
from arbor.tasks.training.update import policy_update

pytestmark = pytest.mark.slow


def test_scoring_temperature_follows_the_rollout() -> None:
    assert scoring_temperature(0.7) == 0.7
    assert scoring_temperature(1.3) == 1.3
    assert scoring_temperature(0.0) == 1.0  # greedy rollouts record log_softmax(z), i.e. T = 1
    with pytest.raises(ValueError, match="temperature"):
        PolicyHead(torch.nn.Linear(1, 1), temperature=0.0)


@pytest.fixture(scope="module")
def rollout_and_trainer(sft_policy: Path, tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("tis_home")
    cfg = load_config("tiny-cpu", {"run.run_id": "tis", "rollout.k": 4, "rollout.batch_size": 3,
                                   "rollout.temperature": 0.7})
    policy, tokenizer = load_policy(sft_policy, home=home)
    engine = make_engine(cfg, policy, tokenizer, search=make_search(cfg.search, home=home), home=home)
    questions = load_questions(cfg.data.train, size=cfg.data.train_size, seed=0)[:3]
    trajs = engine.generate_groups(questions, 4, 0, 1, run_id="tis")
    return cfg, trajs, Trainer(cfg, sft_policy, home)


def test_trainer_logprobs_equal_rollout_logprobs_with_the_rollout_policy(rollout_and_trainer) -> None:
    _cfg, trajs, trainer = rollout_and_trainer
    assert any(0 in t.loss_mask for t in trajs), "no search result was masked: the check would not cover masking"
    got = trainer.logprobs(trajs)
    worst = 0.0
    for t, lp in zip(trajs, got, strict=True):
        want = torch.tensor([x for x, m in zip(t.rollout_logprobs, t.loss_mask, strict=True) if m])
        assert lp.shape == want.shape
        worst = max(worst, float((lp - want).abs().max()))
    assert worst < 1e-4, f"trainer and rollout log-probs differ by {worst:.2e} with the same weights"


def test_first_step_tis_weights_are_one(rollout_and_trainer) -> None:
    """Step 1 trains on rollouts of policy version 0 with version-0 weights: every TIS weight is exactly ~1."""
    _cfg, trajs, trainer = rollout_and_trainer
    rewards = [float(t.sample % 2) for t in trajs]  # mixed groups so the step has a gradient
    for t, r in zip(trajs, rewards, strict=True):
        t.shaped_reward = r
    m = trainer.train_step(policy_update(trajs, 1, _cfg.train, _cfg.run.overlap), 1)
    assert abs(m["tis_mean"] - 1.0) < 1e-3, m["tis_mean"]
    assert m["tis_clip_frac"] == 0.0
