"""Sparse pairwise process scoring (paper §3.4 "Group-stage process scoring", Figure 2).

Trajectories are ranked by base reward (ascending, ties by index); the comparison graph has
  neighbour edges  (rank r, rank r+1)                      for r = 0 .. K-2,
  diameter edges   (rank i, rank i + ceil(K/2))            for i < floor(K/2), skipping pairs already present,
so K = 8 gives 7 + 4 = 11 edges: connected, O(K), no duplicates or self edges.
Each edge (i, j) is judged once under a rubric; the presentation order is a deterministic coin of
(run seed, step, group, rubric id, edge index), so a re-run shows the judge the same "A"/"B" order. The verdict
is mapped back to an outcome for (i, j): 1 (i wins), 0.5 (tie), 0 (j wins), None (the call failed).
A trajectory's score is the mean outcome over its incident edges (win 1, tie 0.5, loss 0).

Failed edges are left out of the scores and of every statistic. A trajectory whose incident edges all failed has
no score (None): statistics skip it and shaping gives it the group mean (a zero centred term). If more than half
of a group's edges failed, the rubric's scores for that group are discarded (``judge_error``) and no statistic
is updated: a judge outage must never look like low variance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from arbor.seeding import coin

Verdict = str  # "A" | "B" | "TIE"


def sparse_edges(base_rewards: Sequence[float]) -> list[tuple[int, int]]:
    """Neighbour + diameter edges over trajectories ranked by base reward (ascending, ties by index)."""
    k = len(base_rewards)
    # round(., 9): rewards equal within 1e-9 rank as ties (broken by index), e.g. F1 2/3 computed two ways.
    order = sorted(range(k), key=lambda i: (round(float(base_rewards[i]), 9), i))
    edges: list[tuple[int, int]] = []
    seen: set[frozenset[int]] = set()

    def add(a: int, b: int) -> None:
        key = frozenset((a, b))
        if a != b and key not in seen:
            seen.add(key)
            edges.append((a, b))

    for r in range(k - 1):  # neighbour edges
        add(order[r], order[r + 1])
    half_up = math.ceil(k / 2)
    for r in range(k // 2):  # diameter edges
        add(order[r], order[r + half_up])
    return edges


def edge_scores(n: int, edges: Sequence[tuple[int, int]], outcomes: Sequence[float | None]) -> list[float]:
    """s_i = mean over edges incident to i of i's result (first wins 1 / tie 0.5 / second wins 0).

    Edges with outcome None (failed judge call) are skipped; a trajectory left with no edge scores NaN here
    (``score_group`` turns that into None).
    """
    if len(edges) != len(outcomes):
        raise ValueError(f"edge_scores: {len(edges)} edges vs {len(outcomes)} outcomes")
    total = [0.0] * n
    count = [0] * n
    for (i, j), o in zip(edges, outcomes, strict=True):
        if o is None:
            continue
        if o not in (0.0, 0.5, 1.0):
            raise ValueError(f"edge_scores: outcome {o!r} for edge ({i}, {j}) is not 1, 0.5 or 0")
        total[i] += o
        total[j] += 1.0 - o
        count[i] += 1
        count[j] += 1
    return [t / c if c else math.nan for t, c in zip(total, count, strict=True)]


def presentation_swapped(seed: int, step: int, group: int, rubric_id: str, edge_index: int) -> bool:
    """True when edge (i, j) is shown with j as "A" and i as "B" (§3.4: randomised presentation order)."""
    return coin(seed, step, group, rubric_id, edge_index)


def presentation(edge: tuple[int, int], swapped: bool) -> tuple[int, int]:
    """(index shown as A, index shown as B) for an edge."""
    i, j = edge
    return (j, i) if swapped else (i, j)


def verdict_to_outcome(verdict: Verdict | None, swapped: bool) -> float | None:
    """Outcome for the edge's (i, j) from the judge's verdict on (A, B); None (failed call) stays None."""
    if verdict is None:
        return None
    if verdict == "TIE":
        return 0.5
    if verdict not in ("A", "B"):
        raise ValueError(f"judge verdict {verdict!r} is not 'A', 'B', 'TIE' or None")
    a_wins = verdict == "A"
    return 1.0 if a_wins != swapped else 0.0


@dataclass(frozen=True)
class GroupScoring:
    """One rubric's scores on one group: per-trajectory scores (None: no surviving edge) or a judge error."""

    scores: list[float | None] | None  # None when judge_error
    n_edges: int
    n_failed_edges: int
    # the sparse graph's edges and each edge's outcome (1 first wins, 0.5 tie, 0 second wins, None failed), kept
    # for the per-edge verdict rows (``rubric_verdicts``); not part of the scoring's value
    edges: tuple[tuple[int, int], ...] = field(default=(), compare=False)
    outcomes: tuple[float | None, ...] = field(default=(), compare=False)

    @property
    def judge_error(self) -> bool:
        return self.scores is None

    def scored(self) -> list[int]:
        """Indices of trajectories that have a score."""
        return [] if self.scores is None else [i for i, s in enumerate(self.scores) if s is not None]


def score_group(n: int, edges: Sequence[tuple[int, int]], outcomes: Sequence[float | None]) -> GroupScoring:
    """Per-trajectory scores from per-edge outcomes; discarded when more than half of the edges failed."""
    failed = sum(o is None for o in outcomes)
    if len(edges) != len(outcomes):
        raise ValueError(f"score_group: {len(edges)} edges vs {len(outcomes)} outcomes")
    if 2 * failed > len(edges):
        return GroupScoring(scores=None, n_edges=len(edges), n_failed_edges=failed, edges=tuple(edges),
                            outcomes=tuple(outcomes))
    raw = edge_scores(n, edges, outcomes)
    return GroupScoring(
        scores=[None if math.isnan(s) else s for s in raw], n_edges=len(edges), n_failed_edges=failed,
        edges=tuple(edges), outcomes=tuple(outcomes),
    )
