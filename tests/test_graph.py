"""Sparse comparison graph and pairwise scoring (paper §3.4, Figure 2)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arbor.seeding import coin
from arbor.tasks.methods.arbor.sparse_graph import (
    edge_scores,
    presentation,
    presentation_swapped,
    score_group,
    sparse_edges,
    verdict_to_outcome,
)


def test_eight_trajectories_hand_built():
    # Ascending by reward, ties by index: -1(1) 0(3) 0.2(6) 0.3(0) 0.5(4) 0.5(5) 1(2) 1(7).
    # order = [1, 3, 6, 0, 4, 5, 2, 7]; neighbours are consecutive ranks; diameters link rank r and r + 4.
    edges = sparse_edges([0.3, -1.0, 1.0, 0.0, 0.5, 0.5, 0.2, 1.0])
    assert edges == [
        (1, 3), (3, 6), (6, 0), (0, 4), (4, 5), (5, 2), (2, 7),  # neighbour edges (7)
        (1, 4), (3, 5), (6, 2), (0, 7),  # diameter edges (4)
    ]


@pytest.mark.parametrize(
    ("k", "expected"),
    [
        (0, []),
        (1, []),
        (2, [(0, 1)]),  # the diameter edge (0, 1) duplicates the neighbour edge: skipped
        (3, [(0, 1), (1, 2), (0, 2)]),  # ceil(3/2) = 2, i < 1
        (4, [(0, 1), (1, 2), (2, 3), (0, 2), (1, 3)]),
        (5, [(0, 1), (1, 2), (2, 3), (3, 4), (0, 3), (1, 4)]),  # ceil(5/2) = 3, i < 2
    ],
)
def test_small_groups(k, expected):
    assert sparse_edges([0.0] * k) == expected


def test_near_equal_rewards_rank_as_ties():
    # 2/3 and 2/3 + 1e-12 are equal within 1e-9: index order decides, not the float noise.
    assert sparse_edges([2 / 3 + 1e-12, 2 / 3]) == [(0, 1)]


def _connected(k: int, edges: list[tuple[int, int]]) -> bool:
    if k <= 1:
        return True
    adj: dict[int, set[int]] = {i: set() for i in range(k)}
    for i, j in edges:
        adj[i].add(j)
        adj[j].add(i)
    seen, todo = {0}, [0]
    while todo:
        for j in adj[todo.pop()] - seen:
            seen.add(j)
            todo.append(j)
    return len(seen) == k


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from([-1.0, 0.0, 0.5, 1.0]), st.floats(-1, 1)), min_size=0, max_size=64))
def test_graph_properties(rewards):
    k = len(rewards)
    edges = sparse_edges(rewards)
    assert _connected(k, edges)
    assert all(i != j and 0 <= i < k and 0 <= j < k for i, j in edges)
    assert len({frozenset(e) for e in edges}) == len(edges)
    assert len(edges) <= 2 * k  # O(K)
    if k >= 3:
        assert len(edges) == (k - 1) + k // 2  # no diameter edge coincides with a neighbour edge
    # Neighbour edges follow the reward ranking.
    order = sorted(range(k), key=lambda i: (round(rewards[i], 9), i))
    assert edges[: max(k - 1, 0)] == [(order[r], order[r + 1]) for r in range(k - 1)]


def test_edge_scores_hand_computed():
    # Triangle: (0,1) first wins, (1,2) tie, (0,2) second wins.
    # s0 = mean(1, 0) = 0.5; s1 = mean(0, 0.5) = 0.25; s2 = mean(0.5, 1) = 0.75.
    assert edge_scores(3, [(0, 1), (1, 2), (0, 2)], [1.0, 0.5, 0.0]) == [0.5, 0.25, 0.75]
    # Failed (1,2): s0 = mean(1, 0) = 0.5; s1 = 0 (only (0,1)); s2 = 1 (only (0,2)).
    assert edge_scores(3, [(0, 1), (1, 2), (0, 2)], [1.0, None, 0.0]) == [0.5, 0.0, 1.0]
    s = edge_scores(3, [(0, 1)], [1.0])
    assert s[:2] == [1.0, 0.0] and math.isnan(s[2])
    with pytest.raises(ValueError, match="not 1, 0.5 or 0"):
        edge_scores(2, [(0, 1)], [0.7])


def test_verdict_mapping_both_presentations():
    assert verdict_to_outcome("A", swapped=False) == 1.0  # i shown as A and wins
    assert verdict_to_outcome("B", swapped=False) == 0.0
    assert verdict_to_outcome("A", swapped=True) == 0.0  # j shown as A and wins
    assert verdict_to_outcome("B", swapped=True) == 1.0
    assert verdict_to_outcome("TIE", swapped=True) == 0.5
    assert verdict_to_outcome(None, swapped=False) is None  # a failed call is never a tie
    with pytest.raises(ValueError, match="not 'A', 'B', 'TIE'"):
        verdict_to_outcome("C", swapped=False)
    assert presentation((2, 5), False) == (2, 5) and presentation((2, 5), True) == (5, 2)


def test_presentation_coin_is_deterministic_and_varies():
    flips = [presentation_swapped(7, 3, 1, "c2.0", e) for e in range(64)]
    assert flips == [presentation_swapped(7, 3, 1, "c2.0", e) for e in range(64)]
    assert flips == [coin(7, 3, 1, "c2.0", e) for e in range(64)]
    assert 16 < sum(flips) < 48  # both orders are used
    assert flips != [presentation_swapped(8, 3, 1, "c2.0", e) for e in range(64)]


def test_score_group_failures():
    edges = sparse_edges([0.0] * 4)  # (0,1) (1,2) (2,3) (0,2) (1,3)
    # (0,1) and (0,2) failed: trajectory 0 has no surviving edge -> None.
    # s1 = (1,2) win 1, (1,3) loss 0 -> 0.5; s2 = (1,2) 0, (2,3) 1 -> 0.5; s3 = (2,3) 0, (1,3) 1 -> 0.5.
    g = score_group(4, edges, [None, 1.0, 1.0, None, 0.0])
    assert not g.judge_error and g.scores == [None, 0.5, 0.5, 0.5]
    assert (g.n_edges, g.n_failed_edges) == (5, 2) and g.scored() == [1, 2, 3]
    # 3 of 5 failed: more than half -> the whole group is discarded.
    g = score_group(4, edges, [None, None, 1.0, None, 0.0])
    assert g.judge_error and g.scores is None and g.n_failed_edges == 3 and g.scored() == []
    # 11 edges for K = 8: 5 failures are tolerated, 6 are not.
    e8 = sparse_edges([0.0] * 8)
    assert not score_group(8, e8, [None] * 5 + [0.5] * 6).judge_error
    assert score_group(8, e8, [None] * 6 + [0.5] * 5).judge_error
