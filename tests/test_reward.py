"""Base reward (paper eq. 4): SQuAD normalisation, EM / token F1 against hand-computed values, the format gate."""

from __future__ import annotations

import pytest

from arbor.reward import base_reward, exact_match, normalize_answer, score_trajectory, token_f1
from arbor.types import Trajectory


def test_normalize_answer_squad() -> None:
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"  # punctuation removed, not replaced by space
    assert normalize_answer("An apple, a pear and THE plum.") == "apple pear and plum"
    assert normalize_answer("theory") == "theory"  # articles only as whole words


def test_token_f1_hand_computed() -> None:
    # pred "the new york city" -> [new, york, city]; gold "New York" -> [new, york]
    # common = 2, precision = 2/3, recall = 2/2, F1 = 2 * (2/3) * 1 / (2/3 + 1) = (4/3) / (5/3) = 0.8
    assert token_f1("the new york city", "New York") == pytest.approx(0.8)
    # pred [a1, b, b] (after normalisation "a1 b b"), gold [b, c]: common = min(2,1) for b = 1
    # precision 1/3, recall 1/2, F1 = 2 * (1/6) / (5/6) = 0.4
    assert token_f1("a1 b b", "b c") == pytest.approx(0.4)
    assert token_f1("Paris", "London") == 0.0
    assert token_f1(None, "x") == 0.0
    assert token_f1("the", "a") == 1.0  # both normalise to empty: equal
    assert token_f1("the", "Paris") == 0.0


def test_best_over_aliases() -> None:
    golds = ["New York City", "NYC", "Big Apple"]
    # vs "New York City": pred [new, york] common 2, P = 1, R = 2/3 -> F1 = 2*(2/3)/(5/3) = 0.8; others 0
    assert token_f1("New York", golds) == pytest.approx(0.8)
    assert exact_match("nyc.", golds) == 1.0
    assert exact_match("New York", golds) == 0.0
    assert exact_match("x", []) == 0.0 and token_f1("x", []) == 0.0


def test_base_reward_valid_uses_f1() -> None:
    text = "<search>q</search><result>r</result><answer>\\boxed{the new york city}</answer>"
    r = base_reward(text, ["New York"], truncated=False)
    assert r.format_valid and r.answer == "the new york city"
    assert r.em == 0.0 and r.f1 == pytest.approx(0.8) and r.base_reward == pytest.approx(0.8)


def test_base_reward_invalid_is_minus_one_and_gates_metrics() -> None:
    # correct answer, but two answer blocks: R_base = -1, EM = F1 = 0 (eq. 4, App. C.1)
    text = "<answer>\\boxed{Paris}</answer><answer>\\boxed{Paris}</answer>"
    r = base_reward(text, "Paris")
    assert not r.format_valid
    assert (r.em, r.f1, r.base_reward) == (0.0, 0.0, -1.0)
    assert r.format_reason == "2 <answer> blocks (exactly one allowed)"
    r = base_reward("<answer>\\boxed{Paris}</answer>", "Paris", truncated=True)
    assert (r.format_valid, r.base_reward, r.em) == (False, -1.0, 0.0)


def test_score_trajectory_fills_fields() -> None:
    t = Trajectory(run_id="r", step=0, group=0, sample=0, question_id="q", question="?", golds=["Paris", "City of Paris"],
                   text="<think>easy</think><answer>\\boxed{paris}</answer>")
    out = score_trajectory(t, truncated=False)
    assert out is t
    assert (t.format_valid, t.format_reason, t.answer, t.em, t.f1, t.base_reward) == (True, "", "paris", 1.0, 1.0, 1.0)
    score_trajectory(t, truncated=True)
    assert (t.format_valid, t.em, t.f1, t.base_reward) == (False, 0.0, 0.0, -1.0)
    assert t.format_reason.startswith("truncated")
