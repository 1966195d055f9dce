"""pi_old from the first mini-batch's own forward.

The clipped surrogate and TIS compare pi_theta with pi_old, the policy the step starts from, scored at the loss
tokens (paper App. B.2; Schulman et al. 2017, PPO). Before the first optimizer step of an update phase the weights
are pi_old's, so the forward of the phase's first mini-batch computes pi_old itself: its log-probs, detached, are
pi_old (bit for bit a no-grad pass over the same micro-batches). Only the trajectories of the later mini-batches
need that pass, scored before the first step; with one mini-batch per phase none does. The trainer's ``reuse_pi_old``
False keeps the separate pass over every trajectory (the bitwise test and ``bench/train.py``'s before/after).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def old_pass_members(members: list[int], first_minibatch: list[int], from_forward: bool) -> list[int]:
    """The trajectories of a phase (``members``, in order) whose pi_old a no-grad pass scores before the phase's first
    optimizer step: with ``from_forward`` those outside ``first_minibatch``, else every one."""
    first = set(first_minibatch) if from_forward else set()
    return [i for i in members if i not in first]


def pi_old_at(logp: Tensor, scored: list[Tensor], order: list[int], from_forward: bool, device: Any) -> Tensor:
    """pi_old at a micro-batch's loss positions: its forward's log-probs ``logp``, detached in float32, when the
    weights are still pi_old's (``from_forward``); else the no-grad pass's log-probs (``scored``, one tensor per
    trajectory) of its trajectories in ``order``, on ``device``."""
    return logp.detach().float() if from_forward else torch.cat([scored[i] for i in order]).to(device)
