"""Within-group statistics and the paper's Table 2 classification (§4.3)."""

from __future__ import annotations

import pytest

from arbor.group_stats import (
    all_equal,
    classify_group,
    outcome_pattern,
    pearson,
    population_variance,
    table2_fractions,
)

T, F = True, False


def test_population_variance_and_pearson_by_hand():
    # mean 2.5; squared deviations 2.25 + .25 + .25 + 2.25 = 5; / 4 = 1.25 (population, not 5/3).
    assert population_variance([1, 2, 3, 4]) == 1.25
    assert population_variance([3.0]) == 0.0
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # x dev [.5, 0, -.5, 0]; y = [1, .5, 0, 0], mean .375, dev [.625, .125, -.375, -.375];
    # sxy = .5, sxx = .5, syy = .6875 -> r = .5 / sqrt(.34375) = .852803
    assert pearson([1, 0.5, 0, 0.5], [1, 0.5, 0, 0]) == pytest.approx(0.852803, abs=1e-6)
    assert pearson([1, 2, 3], [0.5, 0.5, 0.5]) is None  # constant side: undefined
    assert pearson([1], [1]) is None


def test_all_equal_within_1e_9():
    assert all_equal([0.5, 0.5 + 1e-10])
    assert not all_equal([0.5, 0.5 + 1e-8])


def test_patterns():
    assert outcome_pattern([1, 1, 1], [T, T, T]) == "all_correct"
    assert outcome_pattern([0, 0, 0], [F, F, F]) == "all_wrong"  # format-invalid included
    assert outcome_pattern([0, 0, 0], [T, F, T]) == "all_wrong"
    assert outcome_pattern([0.4, 0.4], [T, T]) == "mixed_uniform"
    assert outcome_pattern([1, 0.4], [T, T]) == "mixed"


def test_table2_counts_only_zero_variance_groups():
    groups = [
        classify_group([1.0] * 4, [1.0] * 4, [T] * 4),  # all-correct, zero variance
        classify_group([-1.0] * 4, [0.0] * 4, [F] * 4),  # all format-invalid: all-wrong, zero variance
        classify_group([-1.0, 0.0, 0.0, 0.0], [0.0] * 4, [F, T, T, T]),  # -1 and 0 mixed: has variance
        classify_group([0.5] * 4, [0.5] * 4, [T] * 4),  # mixed-uniform
    ]
    assert [g.table2_bucket for g in groups] == ["all_correct", "all_wrong", None, "mixed_uniform"]
    assert groups[2].pattern == "all_wrong" and not groups[2].zero_variance
    f = table2_fractions(groups)
    assert f == pytest.approx({"all_correct": 0.25, "all_wrong": 0.25, "mixed_uniform": 0.25, "other": 0.0,
                               "total": 0.75})
    # Under R_total a shaped all-wrong group has variance and leaves the bucket.
    assert classify_group([0.0, 0.0125, -0.003, 0.0], [0.0] * 4, [T] * 4).table2_bucket is None
    assert table2_fractions([])["total"] == 0.0
