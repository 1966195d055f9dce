"""A user's method in one file: GRPO whose reward pays ``beta`` per response token (docs/methods.md).

    arbor train --set run.method=examples.length_penalty:LengthPenaltyGRPO
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from arbor.config.train import TrainConfig
from arbor.tasks.methods.grpo import GRPO
from arbor.types import Trajectory

BETA = 1e-3  # reward per response token


class LengthPenaltyGRPO(GRPO):
    name = "grpo-length"

    def token_advantages(self, batch: Sequence[Trajectory], rewards: Sequence[float], groups: Sequence[int],
                         train: TrainConfig) -> list[Tensor]:
        penalised = [r - BETA * len(t.response_ids) for r, t in zip(rewards, batch, strict=True)]
        return super().token_advantages(batch, penalised, groups, train)
