"""Mean ± SE over seeds and the paired start/final change (tasks/reporting/curves.py), checked against hand figures."""

from __future__ import annotations

import math

import pytest

from arbor.tasks.reporting.curves import curves, mean_se, rises_by, start_final_delta


def test_mean_se_by_hand() -> None:
    # [0.2, 0.4, 0.6]: mean 0.4, sample variance (0.04 + 0 + 0.04) / 2 = 0.04, SE = 0.2 / sqrt(3)
    ms = mean_se([0.2, 0.4, 0.6])
    assert ms is not None and ms.mean == pytest.approx(0.4) and ms.se == pytest.approx(0.2 / math.sqrt(3))
    assert mean_se([None, 0.5]).se == 0.0 and mean_se([None]) is None  # type: ignore[union-attr]


ROWS = [  # method, seed, step, F1 (eval at 0 and 4 only), reward
    ("grpo", 0, 0, 0.30, None), ("grpo", 0, 2, None, 0.2), ("grpo", 0, 4, 0.50, 0.4),
    ("grpo", 1, 0, 0.34, None), ("grpo", 1, 2, None, 0.3), ("grpo", 1, 4, 0.44, 0.5),
    ("grpo", 2, 0, 0.26, None), ("grpo", 2, 2, None, 0.1), ("grpo", 2, 4, 0.48, 0.3),
    ("bad", 0, 0, 0.30, None), ("bad", 0, 4, 0.20, 0.1),
    ("bad", 1, 0, 0.30, None), ("bad", 1, 4, 0.40, 0.1),
]


def _rows() -> list[dict]:
    return [dict(method=m, seed=s, step=st, strict_f1=f, mean_base_reward=r) for m, s, st, f, r in ROWS]


def test_curves_and_paired_delta_by_hand() -> None:
    c = curves(_rows(), "strict_f1")
    assert set(c["grpo"]) == {0, 4}  # step 2 has no evaluation
    assert c["grpo"][0].mean == pytest.approx(0.30) and c["grpo"][4].mean == pytest.approx(1.42 / 3)
    start, final, delta = start_final_delta(_rows(), "strict_f1")["grpo"]
    # per-seed deltas 0.20, 0.10, 0.22: mean 0.52 / 3; deviations .0267, -.0733, .0467 -> s^2 = .0084 / 2
    assert delta.mean == pytest.approx(0.52 / 3)
    assert delta.se == pytest.approx(math.sqrt((0.2 - 0.52 / 3) ** 2 + (0.1 - 0.52 / 3) ** 2
                                               + (0.22 - 0.52 / 3) ** 2) / math.sqrt(2) / math.sqrt(3))
    assert start.mean == pytest.approx(0.30) and final.mean == pytest.approx(1.42 / 3)
    assert rises_by(delta)  # 0.173 vs 3 * 0.037 = 0.111
    _, _, bad = start_final_delta(_rows(), "strict_f1")["bad"]
    assert bad.mean == pytest.approx(0.0) and not rises_by(bad)  # -0.1 and +0.1: no rise
    # a positive but noisy change is not enough: deltas 0.3 and -0.1 -> mean 0.1, SE 0.2
    assert not rises_by(mean_se([0.3, -0.1]))  # type: ignore[arg-type]
    assert not rises_by(mean_se([0.2]))  # type: ignore[arg-type]  # one seed: no SE, no verdict


def test_common_dice_delta_by_hand() -> None:
    from arbor.tasks.reporting.curves import common_dice_delta

    start = {"a": 0.0, "b": 0.5, "c": 1.0, "d": 0.5}
    finals = [{"a": 0.4, "b": 0.5, "c": 1.0, "d": 0.5},   # change per seed: 0.1
              {"a": 0.0, "b": 1.0, "c": 1.0, "d": 0.3},   # 0.075
              {"a": 0.2, "b": 0.7, "c": 0.8, "d": 0.9}]   # 0.15
    d = common_dice_delta(start, finals)
    assert d.mean == pytest.approx(0.325 / 3) and d.n == 3
    seeds = [0.1, 0.075, 0.15]
    se_seeds2 = sum((x - 0.325 / 3) ** 2 for x in seeds) / 2 / 3
    per_q = [(0.4 + 0.0 + 0.2) / 3 - 0.0, (0.5 + 1.0 + 0.7) / 3 - 0.5,  # each question's change, seed-averaged
             (1.0 + 1.0 + 0.8) / 3 - 1.0, (0.5 + 0.3 + 0.9) / 3 - 0.5]
    m = sum(per_q) / 4
    se_q2 = sum((x - m) ** 2 for x in per_q) / 3 / 4
    assert m == pytest.approx(d.mean)  # the two ways of averaging agree on the change
    assert d.se == pytest.approx(math.sqrt(se_seeds2 + se_q2))
    assert not rises_by(d)  # 0.108 against an SE of ~0.07
    with pytest.raises(ValueError, match="exactly the start's questions"):
        common_dice_delta(start, [{"a": 1.0}])
