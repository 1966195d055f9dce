"""A user's base reward in one function (docs/plugins.md): exact match, minus a small price per search call.

    arbor train reward.fn=examples.search_cost_reward:em_minus_search_cost

Behind arbor's format gate (reward.format_gate, the default) a malformed trajectory gets -1 and this function is
not asked; ``trajectory.em`` / ``f1`` / ``answer`` are already filled, ``golds`` are the gold aliases.
"""

from __future__ import annotations

from arbor.types import Trajectory

PRICE = 0.05  # reward given up per search call


def em_minus_search_cost(trajectory: Trajectory, golds: list[str]) -> float:
    return trajectory.em - PRICE * trajectory.search_calls
