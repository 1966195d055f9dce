"""Contrastive anchors (paper eq. 1, Appendix A.1): every corner case with hand-worked indices."""

from __future__ import annotations

import pytest

from arbor.tasks.methods.arbor.induction import contrast_pairs, select_anchors, unlabeled_members

T, F = True, False


def test_contrast_two_pairs():
    # F1 = [0.5, 1.0, 0.0, 0.8]: tau+ = 1 (1.0); below = {0, 2, 3}; hard = 3 (0.8); worst = 2 (0.0).
    a = select_anchors([0.5, 1.0, 0.0, 0.8], [10, 20, 30, 40], [T, T, T, T])
    assert a == {"mode": "contrast", "positive": 1, "worst": 2, "hard": 3}
    assert contrast_pairs(a) == [(1, 2), (1, 3)]


def test_positive_tie_goes_to_shortest_response():
    # F1 1.0 at 0 (len 50) and 1 (len 30): tau+ = 1. hard = 3 (0.5), worst = 2 (0.0).
    a = select_anchors([1.0, 1.0, 0.0, 0.5], [50, 30, 10, 10], [T, T, T, T])
    assert a == {"mode": "contrast", "positive": 1, "worst": 2, "hard": 3}


def test_hard_and_worst_ties_use_the_same_secondary_key():
    # hard: 0.5 at 1 (len 40) and 2 (len 20) -> 2; worst: 0.0 at 3 (len 30) and 4 (len 10) -> 4.
    a = select_anchors([1.0, 0.5, 0.5, 0.0, 0.0], [5, 40, 20, 30, 10], [T] * 5)
    assert a == {"mode": "contrast", "positive": 0, "worst": 4, "hard": 2}


def test_equal_length_ties_fall_back_to_lowest_index():
    a = select_anchors([1.0, 1.0, 0.0, 0.0], [7, 7, 7, 7], [T] * 4)
    assert a["positive"] == 0 and a["hard"] == 2 and a["worst"] == 2


def test_single_trajectory_below_positive_collapses_to_one_pair():
    # F1 [1, 1, 1, 0]: tau+ = 2 (shortest of the 1.0s); only 3 is strictly below -> hard = worst = 3.
    a = select_anchors([1.0, 1.0, 1.0, 0.0], [3, 2, 1, 4], [T] * 4)
    assert a == {"mode": "single_pair", "positive": 2, "worst": 3, "hard": 3}
    assert contrast_pairs(a) == [(2, 3)]


def test_all_below_share_one_f1_collapses_to_one_pair():
    # F1 [0.7, 0, 0, 0]: hard = argmax below = shortest 0.0 = 2, worst = argmin below = shortest 0.0 = 2.
    a = select_anchors([0.7, 0.0, 0.0, 0.0], [9, 5, 3, 7], [T] * 4)
    assert a == {"mode": "single_pair", "positive": 0, "worst": 2, "hard": 2}


@pytest.mark.parametrize("value", [1.0, 0.0])
def test_all_correct_and_all_wrong_skip(value):
    a = select_anchors([value] * 4, [1, 2, 3, 4], [T] * 4)
    assert a == {"mode": "skip", "positive": None, "worst": None, "hard": None}
    assert contrast_pairs(a) == []


def test_shared_intermediate_f1_is_unlabeled_not_skip():
    # A.1 "all share one intermediate F1 -> unlabeled fallback" (docs/decisions/arbor-method-anchors-scoring-admission-lifecycle-shaping.md).
    a = select_anchors([0.5, 0.5, 0.5], [1, 2, 3], [T, T, T])
    assert a == {"mode": "unlabeled", "positive": None, "worst": None, "hard": None}
    assert unlabeled_members([T, T, T]) == [0, 1, 2]


def test_fewer_than_two_format_valid_skip():
    assert select_anchors([1.0, 0.0, 0.0, 0.0], [1, 2, 3, 4], [T, F, F, F])["mode"] == "skip"
    assert select_anchors([0.0, 0.0], [1, 2], [F, F])["mode"] == "skip"


def test_valid_share_intermediate_unlabeled_members_are_the_valid_ones():
    # unlabeled_members is unchanged: the format-valid trajectories, in index order.
    assert unlabeled_members([T, F, T]) == [0, 2]


# ------------------------------------------------------------------ format-invalid negatives (E.1, A.1)
# Positives come from format-valid trajectories only; tau-_worst and tau-_hard from ALL trajectories, a
# format-invalid one's F1 gated to 0; ties: shortest response, then lowest index (docs/decisions/anchors-and-retirement.md).
LEN8 = [40, 30, 50, 20, 35, 10, 60, 25]
VALID2 = [T, T, F, F, F, F, F, F]


def test_two_correct_valid_six_invalid_is_one_contrast_pair():
    # tau+ = 1 (F1 1, len 30 < 40). Strictly below: the six invalid ones (gated 0); hard = argmax = argmin = the
    # shortest of them, 5 (len 10), so hard == worst: single_pair, one pair (1, 5). Old code: skip.
    a = select_anchors([1.0, 1.0, 0, 0, 0, 0, 0, 0], LEN8, VALID2)
    assert a == {"mode": "single_pair", "positive": 1, "worst": 5, "hard": 5}
    assert contrast_pairs(a) == [(1, 5)]


def test_two_valid_sharing_intermediate_f1_with_invalid_ones_is_one_contrast_pair():
    # Not every trajectory shares F1 .5 (the invalid ones are gated to 0), so this is not the unlabeled fallback:
    # tau+ = 1 (len 30), hard = worst = 5 (shortest invalid). Old code: unlabeled.
    a = select_anchors([0.5, 0.5, 0, 0, 0, 0, 0, 0], LEN8, VALID2)
    assert a == {"mode": "single_pair", "positive": 1, "worst": 5, "hard": 5}
    assert contrast_pairs(a) == [(1, 5)]


def test_format_invalid_can_be_worst_with_a_valid_hard_negative():
    # Valid 0 (1.0), 1 (0.5); invalid 2, 3 (0, len 1 each): hard = 1, worst = 2 (tie on length -> lower index).
    # Old code: single_pair with hard = worst = 1.
    a = select_anchors([1.0, 0.5, 0.0, 0.0], [50, 40, 1, 1], [T, T, F, F])
    assert a == {"mode": "contrast", "positive": 0, "worst": 2, "hard": 1}
    assert contrast_pairs(a) == [(0, 2), (0, 1)]


def test_worst_tie_between_valid_and_invalid_goes_to_the_shorter():
    # F1 0 at 2 (valid, len 30) and 3 (invalid, len 10): A.1 tie-break, no preference for validity -> worst = 3.
    a = select_anchors([1.0, 0.5, 0.0, 0.0], [5, 5, 30, 10], [T, T, T, F])
    assert a == {"mode": "contrast", "positive": 0, "worst": 3, "hard": 1}
    # ... and the valid one when it is the shorter.
    a = select_anchors([1.0, 0.5, 0.0, 0.0], [5, 5, 10, 30], [T, T, T, F])
    assert a == {"mode": "contrast", "positive": 0, "worst": 2, "hard": 1}


def test_invalid_f1_is_gated_to_zero_and_never_positive():
    # 2 is invalid with an ungated F1 of 1.0: it is gated to 0, so it is neither tau+ nor the hard negative.
    a = select_anchors([0.5, 0.2, 1.0], [1, 1, 1], [T, T, F])
    assert a == {"mode": "contrast", "positive": 0, "worst": 2, "hard": 1}
    # Every valid one wrong: nothing is strictly below tau+ (F1 0) -> skip, whatever the invalid one's F1.
    assert select_anchors([0.0, 0.0, 1.0], [1, 2, 3], [T, T, F])["mode"] == "skip"
    assert select_anchors([0.0, 0.0, 0.0], [1, 2, 3], [T, T, F])["mode"] == "skip"


def test_valid_all_correct_with_an_invalid_one_is_a_pair_not_skip():
    # Old code: skip (the valid ones are all-correct). The group has a correctness contrast once the invalid
    # trajectory (gated F1 0) may be the negative.
    a = select_anchors([1.0, 1.0, 0.0], [1, 2, 3], [T, T, F])
    assert a == {"mode": "single_pair", "positive": 0, "worst": 2, "hard": 2}


def test_fewer_than_two_valid_still_skips_with_invalid_negatives_available():
    assert select_anchors([1.0, 0.0, 0.0, 0.0], [4, 1, 2, 3], [T, F, F, F])["mode"] == "skip"


def test_anchor_invariants_on_random_groups():
    """tau+ is valid and maximal among valid (shortest among ties); hard/worst are the extreme gated F1 strictly
    below it (shortest among ties); skip iff < 2 valid or nothing strictly below; unlabeled never with invalid."""
    import random

    rng = random.Random(0)
    for _ in range(2000):
        k = rng.randint(1, 8)
        f1 = [rng.choice([0.0, 0.25, 0.5, 1.0]) for _ in range(k)]
        lengths = [rng.randint(1, 4) for _ in range(k)]
        valid = [rng.random() < 0.6 for _ in range(k)]
        g = [y if ok else 0.0 for y, ok in zip(f1, valid, strict=True)]
        a = select_anchors(f1, lengths, valid)
        vi = [i for i in range(k) if valid[i]]
        if len(vi) < 2:
            assert a["mode"] == "skip"
            continue
        pos = min(vi, key=lambda i: (-g[i], lengths[i], i))
        below = [i for i in range(k) if g[i] < g[pos]]
        if not below:
            assert a["mode"] == ("unlabeled" if 0 < g[pos] < 1 else "skip")
            assert a["mode"] != "unlabeled" or all(valid)
            continue
        hard = min(below, key=lambda i: (-g[i], lengths[i], i))
        worst = min(below, key=lambda i: (g[i], lengths[i], i))
        mode = "single_pair" if hard == worst else "contrast"
        assert a == {"mode": mode, "positive": pos, "worst": worst, "hard": hard}
        assert valid[a["positive"]]


def test_f1_ties_within_1e_9():
    # 2/3 computed two ways differ by ~1e-16: a tie, so the shorter response (1) is tau+.
    a = select_anchors([2 / 3, 1 - 1 / 3 + 1e-12, 0.0], [10, 5, 1], [T, T, T])
    assert a["positive"] == 1 and a["mode"] == "single_pair" and a["hard"] == 2
    # 1 - 1e-12 is not strictly below 1.0: only trajectory 2 is below.
    a = select_anchors([1.0, 1.0 - 1e-12, 0.5], [10, 5, 1], [T, T, T])
    assert a == {"mode": "single_pair", "positive": 1, "worst": 2, "hard": 2}


def test_length_mismatch_is_refused():
    with pytest.raises(ValueError, match="lengths differ"):
        select_anchors([1.0, 0.0], [1], [T, T])
