"""pi_old from the first mini-batch's own forward, by hand: which trajectories the no-grad pass
scores, and which log-probs a micro-batch's loss takes as pi_old. The trainer-level check (the update bit for bit the
separate pass's) is tests/test_train.py::test_pi_old_from_the_forward_is_bitwise_the_separate_pass."""

from __future__ import annotations

import torch

from arbor.tasks.training.pi_old import old_pass_members, pi_old_at


def test_the_pass_scores_only_the_later_mini_batches() -> None:
    members = [5, 0, 3, 2, 4, 1]  # a phase's trajectories, in the update's order
    assert old_pass_members(members, [3, 1], from_forward=True) == [5, 0, 2, 4]  # members' order kept
    assert old_pass_members(members, [3, 1], from_forward=False) == members  # the separate pass: every one
    assert old_pass_members([7, 8], [7, 8], from_forward=True) == []  # one mini-batch: no pass at all


def test_pi_old_is_the_forward_detached_or_the_pass_in_micro_batch_order() -> None:
    logp = torch.tensor([-0.5, -1.25, -2.0], dtype=torch.bfloat16, requires_grad=True)
    stored = [torch.tensor([-3.0]), torch.tensor([-4.0, -5.0]), torch.tensor([-6.0])]

    own = pi_old_at(logp, stored, [2, 0], from_forward=True, device="cpu")
    assert own.dtype == torch.float32 and not own.requires_grad
    assert own.tolist() == [-0.5, -1.25, -2.0]

    passed = pi_old_at(logp, stored, [2, 0, 1], from_forward=False, device="cpu")
    assert passed.tolist() == [-6.0, -3.0, -4.0, -5.0]  # the micro-batch's trajectories in its order
