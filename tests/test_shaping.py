"""Reward shaping (paper §3.4, eq. 3 and 4) with hand-computed values and hypothesis properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arbor.tasks.shaping import shape_group, shape_rewards

T, F = True, False


def test_one_kept_one_filtered_rubric():
    # Rubric A [1, 0, .5, .5]: mean .5, Var = (.25 + .25 + 0 + 0) / 4 = .125 >= .05 -> kept.
    # Rubric B constant -> Var 0 -> dropped. Composite = A; centred = [.5, -.5, 0, 0].
    # Attenuation: [.5, -.125, 0, 0]; trajectory 3 is format-invalid -> 0.
    # R_total = base + .1 * term = [1.05, -0.0125, 0.5, -1].
    s = shape_group([1.0, 0.0, 0.5, -1.0], [[1.0, 0.0, 0.5, 0.5], [0.5] * 4], [T, T, T, F])
    assert s.kept == [True, False]
    assert s.variances == pytest.approx([0.125, 0.0])
    assert s.centred == pytest.approx([0.5, -0.5, 0.0, 0.0])
    assert s.total == pytest.approx([1.05, -0.0125, 0.5, -1.0])


def test_two_kept_rubrics_are_averaged():
    # A [1, 0, .5, .5] (Var .125) and C [0, 1, 1, 0] (Var .25): composite [.5, .5, .75, .25], mean .5,
    # centred [0, 0, .25, -.25], term [0, 0, .25, -.0625], total = .1 * term.
    out = shape_rewards([0.0] * 4, [[1.0, 0.0, 0.5, 0.5], [0.0, 1.0, 1.0, 0.0]], [T] * 4)
    assert out == pytest.approx([0.0, 0.0, 0.025, -0.00625])


def test_unscored_trajectory_gets_a_zero_term():
    # A [None, 1, 0, .5]: Var over scored [1, 0, .5] = (.25 + .25 + 0) / 3 = 1/6 -> kept. None -> mean .5.
    # filled [.5, 1, 0, .5], mean .5, centred [0, .5, -.5, 0], term [0, .5, -.125, 0].
    out = shape_rewards([0.0] * 4, [[None, 1.0, 0.0, 0.5]], [T] * 4)
    assert out == pytest.approx([0.0, 0.05, -0.0125, 0.0])


def test_variance_threshold_is_inclusive_and_discarded_rubrics_count_as_dropped():
    d = math.sqrt(0.05)  # [.5 + d, .5 - d] has Var exactly .05 (up to rounding)
    assert shape_group([0.0, 0.0], [[0.5 + d, 0.5 - d]], [T, T]).kept == [True]
    d = math.sqrt(0.0499)
    assert shape_group([0.0, 0.0], [[0.5 + d, 0.5 - d]], [T, T]).kept == [False]
    assert shape_group([0.0, 0.0], [None], [T, T]).kept == [False]  # judge error: scores discarded


def test_a_rubric_every_call_failed_for_is_dropped_even_at_delta_v_zero():
    # RaR (delta_v 0) when a group's items could not be written: every rating None. This once crashed the
    # shape stage ("mean of an empty sequence") and with it the run; it must cost the group its signal only.
    got = shape_group([0.2, 0.0, 1.0], [[None, None, None], [0.1, 0.1, 0.4]], [T, T, T], delta_v=0.0)
    assert got.kept == [False, True]
    # the other rubric alone: mean .2, centred [-.1, -.1, .2], attenuated [-.025, -.025, .2], lambda .1
    assert got.total == pytest.approx([0.1975, -0.0025, 1.02])


def test_no_active_rubric_gives_the_base_reward():
    assert shape_rewards([0.2, -1.0, 1.0], [], [T, F, T]) == [0.2, -1.0, 1.0]


def test_bad_lengths_are_refused():
    with pytest.raises(ValueError, match="rubric 0 has 2 scores for a group of 3"):
        shape_rewards([0.0] * 3, [[0.0, 1.0]], [T] * 3)


groups = st.integers(min_value=1, max_value=16).flatmap(
    lambda k: st.tuples(
        st.lists(st.sampled_from([-1.0, 0.0, 0.25, 0.5, 1.0]), min_size=k, max_size=k),
        st.lists(st.lists(st.floats(0, 1), min_size=k, max_size=k), min_size=0, max_size=3),
        st.lists(st.booleans(), min_size=k, max_size=k),
        st.floats(0, 1),
        st.floats(0, 1),
    )
)


@settings(max_examples=300, deadline=None)
@given(groups)
def test_shaping_properties(case):
    base, scores, valid, lambda_, alpha = case
    s = shape_group(base, scores, valid, lambda_=lambda_, alpha=alpha, delta_v=0.05)
    # Eq. 3: the centred term has zero group mean before attenuation.
    assert abs(math.fsum(s.centred)) / len(base) < 1e-9
    # Format-invalid trajectories keep their base reward exactly.
    assert all(t == b for t, b, ok in zip(s.total, base, valid, strict=True) if not ok)
    # Negatives are attenuated by alpha, positives kept.
    kept = [(c, term) for c, term, ok in zip(s.centred, s.term, valid, strict=True) if ok]
    assert [term for _, term in kept] == pytest.approx([c if c >= 0 else alpha * c for c, _ in kept])
    # lambda_ = 0 gives the base reward.
    assert shape_rewards(base, scores, valid, lambda_=0.0, alpha=alpha) == pytest.approx(base)
