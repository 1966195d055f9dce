"""The DeepSpeed trainer on CPU: real engine, tiny random Qwen3 (the acceptance)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from arbor.config import ArborConfig, load_config
from arbor.tasks.methods import make_method
from arbor.tasks.training import checkpoint as ckpt
from arbor.tasks.training.head import scoring_temperature
from arbor.tasks.training.train import Trainer
from arbor.tasks.training.update import policy_update
from arbor.types import Trajectory

VOCAB = 64


def tiny_model_dir(root: Path, tie: bool = True, seed: int = 0) -> Path:
    """A 2-layer Qwen3-architecture model with random weights and a 64-token vocabulary (no tokenizer)."""
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=128, tie_word_embeddings=tie,
    )
    path = root / f"tiny-{'tied' if tie else 'untied'}-{seed}"
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("models"))


def make_batch(step: int, version: int, n_groups: int = 2, k: int = 4, seed: int = 0) -> list[Trajectory]:
    """Groups of k trajectories with random token ids, a masked 'result' span and mixed rewards."""
    g = torch.Generator().manual_seed(seed * 1000 + step)
    out = []
    for grp in range(n_groups):
        prompt = torch.randint(1, VOCAB, (5,), generator=g).tolist()
        for s in range(k):
            n = 6 + s  # different lengths: packing and padding are exercised
            resp = torch.randint(1, VOCAB, (n,), generator=g).tolist()
            mask = [1] * n
            mask[2:4] = [0, 0]  # a search-result block
            lp = (-torch.rand(n, generator=g) * 4 - 2).tolist()
            lp = [x if m else 0.0 for x, m in zip(lp, mask, strict=True)]
            out.append(Trajectory(
                run_id="t", step=step, group=grp, sample=s, question_id=f"q{grp}", question="?", golds=["a"],
                prompt_ids=prompt, response_ids=resp, loss_mask=mask, rollout_logprobs=lp,
                base_reward=float(s % 2), shaped_reward=float(s % 2) + 0.1 * s, policy_version=version,
            ))
    return out


class Driven:
    """A ``Trainer`` driven as the pipeline drives it: the run's method decides each update
    (``tasks.training.update.policy_update``) and its loss settings; the trainer only applies them."""

    def __init__(self, cfg: ArborConfig, model_dir: Path, home: Path) -> None:
        self.cfg, self.method = cfg, make_method(cfg)
        self.trainer = Trainer(cfg, model_dir, home, self.method.loss_settings(cfg.train))

    def train_step(self, batch: list[Trajectory], step: int) -> dict[str, float]:
        update = policy_update(batch, step, self.cfg.train, self.cfg.run.overlap, self.method,
                               source=self.cfg.run.method)
        return self.trainer.train_step(update, step)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.trainer, name)


def make_trainer(model_dir: Path, home: Path, **overrides: object) -> Any:
    cfg = load_config("tiny-cpu", {"run.run_id": "t", "train.lr": 1e-3, **overrides})
    return Driven(cfg, model_dir, home)


def params(tr: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tr.state_dict_for_sync().items()}


def test_one_step_moves_logprobs_along_the_advantage(model_dir: Path, tmp_path: Path) -> None:
    tr = make_trainer(model_dir, tmp_path)
    # one group, two different responses: reward 1 (A > 0) and reward 0 (A < 0)
    batch = make_batch(1, 0, n_groups=1, k=2)
    batch[0].shaped_reward, batch[1].shaped_reward = 1.0, 0.0
    before = tr.logprobs(batch)
    # pi_old through the engine: packed rows (sdpa: the default here), one packed row, padded rows agree
    assert tr.packing == "packed"
    for packing in ("varlen", "padded"):
        tr.trainer.packing = packing
        for a, b in zip(tr.logprobs(batch), before, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    tr.trainer.packing = "packed"
    m = tr.train_step(batch, 1)
    after = tr.logprobs(batch)

    # log-probs of the loss tokens (result tokens excluded), one per loss-mask position
    assert before[0].shape == (sum(batch[0].loss_mask),)
    assert float(after[0].mean()) > float(before[0].mean())  # positive advantage: up
    assert float(after[1].mean()) < float(before[1].mean())  # negative advantage: down
    assert m["policy_version"] == 1.0 and tr.policy_version == 1
    assert m["grad_norm"] > 0
    for key in ("loss", "clip_frac", "approx_kl", "tis_mean", "tis_clip_frac", "entropy", "mean_response_tokens"):
        assert key in m
    # the next batch must come from version 1
    with pytest.raises(AssertionError, match="policy version 0"):
        tr.train_step(make_batch(2, 0), 2)


def test_micro_batching_equals_one_big_batch(model_dir: Path, tmp_path: Path) -> None:
    # gradient accumulation over token-packed micro-batches must give the update of one micro-batch
    batch = make_batch(1, 0)
    big = make_trainer(model_dir, tmp_path / "a", **{"train.micro_batch_tokens": 100000})
    m_big = big.train_step(batch, 1)
    small = make_trainer(model_dir, tmp_path / "b", **{"train.micro_batch_tokens": 24})
    m = small.train_step(batch, 1)
    assert len(small._pack([len(t.prompt_ids) + len(t.response_ids) for t in batch])) == 6  # vs 1
    assert m["loss_tokens"] == m_big["loss_tokens"] == sum(sum(t.loss_mask) for t in batch)
    assert m["loss"] == pytest.approx(m_big["loss"], rel=1e-5)
    assert m["grad_norm"] == pytest.approx(m_big["grad_norm"], rel=1e-5)
    # Adam's first update is ~ lr * sign(g): float summation order may flip near-zero gradients; 10% of a step
    pa, pb = params(big), params(small)
    for k in pa:
        assert torch.allclose(pa[k], pb[k], atol=1e-4), k


def test_dapo_step_drops_zero_variance_groups(model_dir: Path, tmp_path: Path) -> None:
    tr = make_trainer(model_dir, tmp_path, **{"run.method": "dapo"})
    batch = make_batch(1, 0, n_groups=3)
    for t in batch:
        if t.group == 1:
            t.shaped_reward = 1.0  # homogeneous group
    m = tr.train_step(batch, 1)
    assert m["dropped_groups"] == 1.0
    assert m["n_trajectories"] == 8.0
    assert tr.eps_high == pytest.approx(0.28)


def test_zero3_saves_hf_weights_transformers_reloads_identically(tmp_path: Path) -> None:
    model_dir = tiny_model_dir(tmp_path, tie=False, seed=1)
    tr = make_trainer(model_dir, tmp_path / "home", **{"train.zero_stage": 3})
    tr.train_step(make_batch(1, 0), 1)
    out = tr.export_hf(tmp_path / "export")
    assert (out / "model.safetensors").exists()
    ids = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = tr.full_logits(ids)
        got = AutoModelForCausalLM.from_pretrained(out).eval()(input_ids=ids).logits
        start = AutoModelForCausalLM.from_pretrained(model_dir).eval()(input_ids=ids).logits
    assert torch.equal(want, got)
    assert not torch.equal(start, got)  # the step changed the weights, and the export carries the change
    # the trainer's loss-position head (ZeRO-3 hooks, gathered rows/cols) agrees with full logits of the export
    t = make_batch(2, 1)[3]
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        logits = reloaded(input_ids=torch.tensor([t.prompt_ids + t.response_ids])).logits[0]
    P = len(t.prompt_ids)
    cols = [P - 1 + j for j, m in enumerate(t.loss_mask) if m]
    tgts = [t.response_ids[j] for j, m in enumerate(t.loss_mask) if m]
    T = scoring_temperature(tr.cfg.rollout.temperature)  # 0.7 on tiny-cpu: the head scores softmax(z / T)
    assert T == pytest.approx(0.7)
    ref = torch.log_softmax(logits[cols].float() / T, -1)[torch.arange(len(cols)), tgts]
    assert torch.allclose(tr.logprobs([t])[0], ref, atol=1e-5)


def test_checkpoint_resume_replay_is_bitwise_equal(model_dir: Path, tmp_path: Path, deterministic: None) -> None:
    overrides = {"checkpoint.every": 2, "checkpoint.keep_last": 1, "train.updates_per_batch": 2}
    batches = {s: make_batch(s, s - 1) for s in range(1, 5)}

    # uninterrupted run: steps 1..4
    a = make_trainer(model_dir, tmp_path / "a", **overrides)
    for s in range(1, 5):
        a.train_step(batches[s], s)
        a.maybe_save(s, {"mean_total_reward": float(s)})
    # interrupted run: steps 1..3 (checkpoint at 2), then a crash during the save of step 3
    b = make_trainer(model_dir, tmp_path / "b", **overrides)
    for s in range(1, 4):
        b.train_step(batches[s], s)
        b.maybe_save(s)
    b.finish_save()  # step 2's save was written in the background while step 3 trained
    assert ckpt.complete_steps(b.ckpt_root) == [2]
    (b.ckpt_root / "step_000003.tmp" / "hf").mkdir(parents=True)  # a half-written save
    del b
    # resume: a fresh process state, load the latest complete checkpoint, replay steps 3 and 4 from stored batches
    torch.manual_seed(12345)
    c = make_trainer(model_dir, tmp_path / "b", **overrides)
    assert c.load_latest() == 2
    assert c.policy_version == 2
    for s in (3, 4):
        c.train_step(batches[s], s)
    assert c.policy_version == a.policy_version == 4
    pa, pc = params(a), params(c)
    assert pa.keys() == pc.keys()
    for k in pa:
        assert torch.equal(pa[k], pc[k]), k
    # the optimizer state matches too: one more identical step stays bitwise equal
    nxt = make_batch(5, 4)
    a.train_step(nxt, 5)
    c.train_step(nxt, 5)
    for k, v in params(a).items():
        assert torch.equal(v, params(c)[k]), k


def test_micro_batch_without_loss_tokens_is_harmless(model_dir: Path, tmp_path: Path) -> None:
    # a trajectory whose response is all tool output (mask 0 everywhere) alone in its micro-batch
    tr = make_trainer(model_dir, tmp_path, **{"train.micro_batch_tokens": 12})
    batch = make_batch(1, 0, n_groups=1, k=2)
    batch[1].loss_mask = [0] * len(batch[1].loss_mask)
    batch[1].rollout_logprobs = [0.0] * len(batch[1].loss_mask)
    m = tr.train_step(batch, 1)
    assert m["loss_tokens"] == sum(batch[0].loss_mask)
    assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])


def test_kl_to_the_frozen_reference(model_dir: Path, tmp_path: Path) -> None:
    """train.kl_reference=frozen (RubricEM eq. 1): the k3 KL is measured against the start checkpoint, so it is 0
    while the policy equals it and grows once the policy moves; against pi_old it is 0 at the start of every step."""
    batch, b2 = make_batch(1, 0), make_batch(2, 1)
    frozen = make_trainer(model_dir, tmp_path / "f", **{"train.kl_coef": 0.5, "train.kl_reference": "frozen"})
    old = make_trainer(model_dir, tmp_path / "o", **{"train.kl_coef": 0.5})
    assert old.ref_engine is None and frozen.ref_engine is not None
    assert frozen.train_step(batch, 1)["ref_kl"] == pytest.approx(0.0, abs=1e-9)  # one mini-batch, before the update
    ref_before = frozen.logprobs(b2, frozen.ref_engine)
    assert frozen.train_step(b2, 2)["ref_kl"] > 1e-6  # the policy moved away from the start at step 1
    assert all(torch.equal(a, b) for a, b in zip(ref_before, frozen.logprobs(b2, frozen.ref_engine), strict=True))
    old.train_step(batch, 1)
    assert old.train_step(b2, 2)["ref_kl"] == pytest.approx(0.0, abs=1e-9)  # k3 against pi_old


def two_phase_batches() -> tuple[list[Trajectory], list[Trajectory]]:
    """Phase 0 (RubricEM's reflection candidates) and phase 1 (the task batch): different groups and lengths."""
    a = make_batch(1, 0, n_groups=1, k=4, seed=1)
    b = make_batch(1, 0, n_groups=1, k=4, seed=2)
    for t in b:
        t.group = 1
        t.response_ids = t.response_ids * 3  # the task phase has most of the tokens, as at paper sizes
        t.loss_mask = t.loss_mask * 3
        t.rollout_logprobs = t.rollout_logprobs * 3
    return a, b


def test_two_phases_are_two_updates_in_order(model_dir: Path, tmp_path: Path) -> None:
    """Alg. 1 lines 10 and 29: an update in two phases equals the phase-0 update followed by the
    phase-1 update (pi_old re-read after phase 0, each phase its own token-mean), and differs from one joint update
    where phase 0's tokens would only count by their share."""
    from arbor.tasks.training.update import policy_update

    a, b = two_phase_batches()
    phased = make_trainer(model_dir, tmp_path / "phased")
    u = policy_update([*a, *b], 1, phased.cfg.train, phased.cfg.run.overlap)
    u.phases = [0] * len(a) + [1] * len(b)
    m = phased.trainer.train_step(u, 1)
    assert m["phase0_loss_tokens"] == sum(sum(t.loss_mask) for t in a)
    assert m["phase1_loss_tokens"] == sum(sum(t.loss_mask) for t in b)
    assert m["updates"] == 2.0 and phased.policy_version == 1

    seq = make_trainer(model_dir, tmp_path / "seq")
    seq.trainer.train_step(policy_update(a, 1, seq.cfg.train, seq.cfg.run.overlap), 1)
    ub = policy_update(b, 2, seq.cfg.train, seq.cfg.run.overlap)
    ub.versions_behind = [1] * len(b)  # sampled before the phase-0 update, as in the step
    seq.trainer.train_step(ub, 2)
    joint = make_trainer(model_dir, tmp_path / "joint")
    joint.trainer.train_step(policy_update([*a, *b], 1, joint.cfg.train, joint.cfg.run.overlap), 1)

    pp, ps, pj = params(phased), params(seq), params(joint)
    for k in pp:
        assert torch.allclose(pp[k], ps[k], atol=1e-5), k
    assert max(float((pp[k] - pj[k]).abs().max()) for k in pp) > 1e-3


def test_a_phase_scored_at_its_sampling_temperature_has_unit_tis_weights(model_dir: Path, tmp_path: Path) -> None:
    """Candidates sampled at T = 0.7 by the current weights, in a run whose rollouts use T = 1.0.
    Scored at their own temperature every TIS weight is 1; scored at the rollout temperature they are not."""
    from arbor.tasks.training.update import policy_update

    tr = make_trainer(model_dir, tmp_path, **{"rollout.temperature": 1.0})
    cands = make_batch(1, 0, n_groups=2, k=4, seed=3)
    tr.trainer._set_temperature(0.7)
    lp = tr.trainer.logprobs(cands)
    tr.trainer._set_temperature(1.0)
    for t, v in zip(cands, lp, strict=True):
        it = iter(v.tolist())
        t.rollout_logprobs = [next(it) if m else 0.0 for m in t.loss_mask]
    u = policy_update(cands, 1, tr.cfg.train, tr.cfg.run.overlap)
    u.temperatures = [0.7] * len(cands)
    m = tr.trainer.train_step(u, 1)
    assert m["tis_mean"] == pytest.approx(1.0, abs=1e-5) and m["tis_clip_frac"] == 0.0
    assert tr.trainer.engine.module.temperature == 1.0  # restored after the phase

    other = make_trainer(model_dir, tmp_path / "other", **{"rollout.temperature": 1.0})
    m1 = other.trainer.train_step(policy_update(cands, 1, other.cfg.train, other.cfg.run.overlap), 1)
    assert abs(m1["tis_mean"] - 1.0) > 1e-3


def step_observed(tr: Any, batch: list[Trajectory]) -> tuple[dict[str, float], list[torch.Tensor], dict[str, Any],
                                                             dict[str, Any]]:
    """One ``train_step`` with every parameter gradient of every micro-batch's backward recorded (tensor hooks
    observe, they change nothing); the metrics, the gradients in order, the weights before and after the step."""
    start = params(tr)
    grads: list[torch.Tensor] = []
    hooks = [p.register_hook(lambda g: grads.append(g.detach().clone()))
             for p in tr.engine.module.parameters() if p.requires_grad]
    try:
        m = tr.train_step(batch, 1)
    finally:
        for h in hooks:
            h.remove()
    return m, grads, start, params(tr)


@pytest.mark.parametrize("updates", [1, 2])
def test_pi_old_from_the_forward_is_bitwise_the_separate_pass(model_dir: Path, tmp_path: Path, updates: int) -> None:
    """The first mini-batch's pi_old taken from its own forward (detached) gives the loss, every
    gradient and the weights of a separate no-grad pi_old pass over every trajectory, bit for bit, when that pass
    scores the same micro-batches (one sequence each: ``micro_batch_tokens`` 1). With two mini-batches the second
    one's pi_old must still be the pre-update weights' (a pass before the first optimizer step): taken from its own
    forward, after the first update, its ratio would be 1 and approx_kl would vanish."""
    batch = make_batch(1, 0)  # 8 trajectories of different lengths in 2 groups
    over = {"train.micro_batch_tokens": 1, "train.updates_per_batch": updates, "train.kl_coef": 0.1}
    new = make_trainer(model_dir, tmp_path / "new", **over)
    old = make_trainer(model_dir, tmp_path / "old", **over)
    old.trainer.reuse_pi_old = False
    m_new, g_new, start, p_new = step_observed(new, batch)
    m_old, g_old, _, p_old = step_observed(old, batch)

    assert m_new["loss"] == m_old["loss"] and m_new == m_old  # every metric: clip, approx_kl, TIS, KL, grad norm
    n_params = sum(1 for p in new.engine.module.parameters() if p.requires_grad)
    assert len(g_new) == len(g_old) == n_params * len(batch)  # one backward per sequence
    assert all(torch.equal(a, b) for a, b in zip(g_new, g_old, strict=True))
    assert all(torch.equal(p_new[k], p_old[k]) for k in p_old)
    assert any(not torch.equal(p_new[k], v) for k, v in start.items())  # the step did move the weights

    tokens = float(sum(len(t.prompt_ids) + len(t.response_ids) for t in batch))
    assert old.last_timing["old_pass_tokens"] == new.last_timing["tokens"] == tokens
    if updates == 1:  # no pi_old pass at all; the policy is pi_old: every ratio is exactly 1
        assert new.last_timing["old_pass_tokens"] == 0.0
        assert m_new["approx_kl"] == 0.0 and m_new["clip_frac"] == 0.0 and m_new["ref_kl"] == 0.0
    else:  # the pass scores the second mini-batch only (4 of the 8 trajectories), whose ratios moved from 1
        assert 0.0 < new.last_timing["old_pass_tokens"] < tokens
        assert m_new["approx_kl"] > 1e-7 and m_new["ref_kl"] > 1e-7


def summed_grads(tr: Any, batch: list[Trajectory]) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """One ``train_step``; every parameter's gradient summed over the micro-batches' backwards (hooks observe)."""
    acc: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Any:
        def hook(g: torch.Tensor) -> None:
            acc[name] = acc[name] + g.detach().double() if name in acc else g.detach().double().clone()
        return hook

    hooks = [p.register_hook(keep(n)) for n, p in tr.engine.module.named_parameters() if p.requires_grad]
    try:
        m = tr.train_step(batch, 1)
    finally:
        for h in hooks:
            h.remove()
    return m, acc


def test_seq_mean_token_mean_is_the_same_update_in_one_or_many_micro_batches(model_dir: Path, tmp_path: Path) -> None:
    """Under seq-mean-token-mean (slime's default) each micro-batch adds sum_i mean_t(l_it) / N with
    N the mini-batch's samples, so one micro-batch or six give the same loss and summed gradients; the loss is not
    the token-mean's (the 8 samples have 4-7 loss tokens)."""
    batch = make_batch(1, 0)
    over = {"train.loss_agg": "seq-mean-token-mean"}
    big = make_trainer(model_dir, tmp_path / "a", **{**over, "train.micro_batch_tokens": 100000})
    small = make_trainer(model_dir, tmp_path / "b", **{**over, "train.micro_batch_tokens": 24})
    assert big.trainer.loss.loss_agg == "seq-mean-token-mean"
    m_big, g_big = summed_grads(big, batch)
    m_small, g_small = summed_grads(small, batch)
    assert len(small._pack([len(t.prompt_ids) + len(t.response_ids) for t in batch])) == 6
    assert m_small["loss"] == pytest.approx(m_big["loss"], abs=1e-6)
    assert set(g_big) == set(g_small) and g_big
    for k in g_big:
        assert torch.allclose(g_small[k], g_big[k], atol=1e-6, rtol=0), k
    tok = make_trainer(model_dir, tmp_path / "c", **{"train.loss_agg": "token-mean", "train.micro_batch_tokens": 100000})
    m_tok, g_tok = summed_grads(tok, batch)
    assert abs(m_tok["loss"] - m_big["loss"]) > 1e-4
    assert max(float((g_tok[k] - g_big[k]).abs().max()) for k in g_big) > 1e-4
    assert m_tok["clip_frac"] == m_big["clip_frac"] and m_tok["loss_tokens"] == m_big["loss_tokens"]  # token-level
