"""DAPO's equations as pure functions (Yu et al., 2025; the ARBOR paper's baseline, §4.1).

    dynamic sampling (§3.2, eq. 11's constraint 0 < |{o_i : o_i correct}| < G): a group whose rewards are all
        equal carries no GRPO advantage; drop it from the update, and roll out fresh prompts until the batch holds
        enough groups that differ
    soft overlong punishment (§3.4, eq. 13), added to the reward of a response of L tokens:
        R_length(L) = 0                                 if L <= L_max - L_cache
                    = ((L_max - L_cache) - L) / L_cache  if L_max - L_cache < L <= L_max
                    = -1                                if L > L_max

What "all equal" means is the pipeline's (``tasks.training.losses.zero_variance_groups``, the same test that
counts Table 2's outcome-homogeneous groups), so DAPO drops exactly the groups the ``steps`` row counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from arbor.tasks.training.losses import ZERO_VAR_TOL, zero_variance_groups


def dynamic_sampling_filter(rewards: Sequence[float], groups: Sequence[int],
                            tol: float = ZERO_VAR_TOL) -> tuple[list[int], int]:
    """Dynamic sampling's filter (§3.2): the indices of the trajectories whose group's rewards differ (max - min
    > ``tol``), and how many groups were dropped."""
    drop = zero_variance_groups(rewards, groups, tol)
    keep = [i for i, g in enumerate(groups) if int(g) not in drop]
    return keep, len(drop)


def informative(rewards: Sequence[float], tol: float = ZERO_VAR_TOL) -> bool:
    """A group whose rewards differ (an empty one does not): it has a GRPO advantage (§3.2)."""
    return len(rewards) > 0 and not zero_variance_groups(rewards, [0] * len(rewards), tol)


def dynamic_sampling_refill(groups_of_rewards: list[list[float]], target_groups: int,
                            resample: Callable[[int], list[list[float]]] | None = None, max_rounds: int = 3,
                            tol: float = ZERO_VAR_TOL) -> tuple[list[int], int, int]:
    """Dynamic sampling's refill (§3.2, "over-sample and filter out"): keep the informative groups and ask
    ``resample(n)`` for the n groups still missing until ``target_groups`` are kept or ``max_rounds`` rounds ran.
    Returns (indices of the kept groups in the concatenated list, zero-variance groups seen, rounds).

    ``resample`` returns the reward lists of newly sampled groups (the method rolls them out); their indices
    continue after the ones already seen.
    """
    seen = list(groups_of_rewards)
    kept = [i for i, rs in enumerate(seen) if informative(rs, tol)]
    rounds = 0
    while resample is not None and len(kept) < target_groups and rounds < max_rounds:
        rounds += 1
        for rs in resample(target_groups - len(kept)):
            if informative(rs, tol):
                kept.append(len(seen))
            seen.append(rs)
    dropped = sum(1 for rs in seen if not informative(rs, tol))
    return kept[:target_groups], dropped, rounds


def overlong_penalty(length: int, max_len: int, buffer: int) -> float:
    """Soft overlong punishment R_length (§3.4, eq. 13) of a response of ``length`` tokens, with L_max =
    ``max_len`` and the buffer L_cache = ``buffer``; added to the response's reward (a buffer of 0: a hard -1
    beyond L_max)."""
    if buffer <= 0:
        return 0.0 if length <= max_len else -1.0
    start = max_len - buffer
    if length <= start:
        return 0.0
    if length <= max_len:
        return (start - length) / buffer
    return -1.0


__all__ = ["dynamic_sampling_filter", "dynamic_sampling_refill", "informative", "overlong_penalty"]
