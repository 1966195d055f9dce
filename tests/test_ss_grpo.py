"""SS-GRPO (RubricEM §3.3 eq. 1, App. C): every formula against values computed by hand, the staged
protocol's checker and stage cuts, the stage buffer's lifecycle and replay, and the reduction to GRPO."""

from __future__ import annotations

import pytest
import torch

from arbor.config import ArborConfig
from arbor.config.rubricem import DEFAULT_LAMBDA
from arbor.format import RUBRICEM, check_format, stage_spans, token_starts
from arbor.tasks.methods.base import Method
from arbor.tasks.methods.ss_grpo.method import SSGRPO, neutral_grades, trajectory_stage_scores
from arbor.tasks.methods.ss_grpo.stagewise import (
    StageBuffer,
    grade_variance,
    prune_stage,
    stage_advantages,
    stage_returns,
    stage_score,
)
from arbor.tasks.training.losses import group_advantages, policy_loss
from arbor.types import RubricGrade, StageRubric, StageRubricDraft, Trajectory

STAGED = (
    "<structured_plan>Need the director of Film X.</structured_plan>\n<search>Film X</search>\n<tool_output>\n"
    "Doc 1 (Title: Film X) Film X was directed by Ann Bo.\n</tool_output>\n"
    "<state_evaluation>Ann Bo directed it; next her birthplace.</state_evaluation>\n<search>Ann Bo</search>\n"
    "<tool_output>\nDoc 1 (Title: Ann Bo) Ann Bo was born in Rema.\n</tool_output>\n"
    "<think>enough</think>\n<review>Ann Bo was born in Rema.</review>\n<answer>\\boxed{ Rema}</answer>")


# ---------------------------------------------------------------------------------------------- eq. 1
@pytest.mark.parametrize(("scores", "returns"), [
    ([1, 1, 1, 1], [2.8, 2.2, 1.8, 1.0]),  # 1+.4+.6+.8, 1+.4+.8, 1+.8, 1
    ([.5, 0, 1, .25], [1.3, 0.6, 1.2, 0.25]),  # .5+0+.6+.2, 0+.4+.2, 1+.2, .25
])
def test_stage_returns_with_the_papers_lambda(scores, returns) -> None:
    assert stage_returns(scores, DEFAULT_LAMBDA) == pytest.approx(returns)


def test_stage_score_weights_and_inverts_negative_rubrics() -> None:
    # positive w3 graded 2 -> 3 * 1; negative w1 graded 1 (flaw partly there) -> 1 * (2 - 1) / 2 = .5; / (3 + 1)
    assert stage_score([2, 1], [3, 1], [1, -1]) == pytest.approx(0.875)
    assert stage_score([2, 1], [3, 1], [1, -1], extra=(0.5, 2)) == pytest.approx((3.5 + 1.0) / 6)
    assert stage_score([0], [2], [-1]) == 1.0  # a negative rubric whose flaw is absent scores full
    assert stage_score([], [], []) == 0.0  # a stage without rubrics
    with pytest.raises(ValueError):
        stage_score([1], [1, 2], [1])


def test_stage_advantages_normalise_each_stage_across_the_group() -> None:
    adv = stage_advantages([[1.0, 0.5], [3.0, 0.5]])
    s = 2 ** 0.5  # sample std of (1, 3)
    assert [a[0] for a in adv] == pytest.approx([-1 / s, 1 / s])
    assert [a[1] for a in adv] == [0.0, 0.0]  # equal returns in a stage: no credit there


def test_all_wrong_group_with_different_stage_scores_gets_stage_credit_grpo_does_not() -> None:
    r = [[0.9, 0.2, 0.5, 0.0], [0.1, 0.8, 0.5, 0.0], [0.5, 0.5, 0.0, 0.0]]  # R_4 = 0: every answer wrong
    adv = stage_advantages([stage_returns(x, DEFAULT_LAMBDA) for x in r])
    assert max(abs(a) for row in adv for a in row) > 0.5
    assert group_advantages([0.0, 0.0, 0.0], [0, 0, 0]).abs().max() == 0


def test_trajectory_stage_scores_gate_and_fallback() -> None:
    rubrics = [StageRubric("a", 1, "t", "d", 2, 1), StageRubric("b", 4, "t", "d", 1, -1)]
    grades = [1, 0]
    # plan: 2 * .5 / 2 = .5; answer: negative graded 0 -> 1 * 1, plus F1 .5 at weight 3 -> (1 + 1.5) / 4
    assert trajectory_stage_scores(rubrics, grades, 0.5, True, 3.0) == pytest.approx([0.5, 0.0, 0.0, 0.625])
    assert trajectory_stage_scores(rubrics, grades, 0.5, False, 3.0) == [0.0] * 4  # the format gate
    # a group mean as the grades: plan 2 * (1.5 / 2) / 2 = .75; answer (1 * (2 - .5) / 2 + 1.5) / 4 = .5625
    assert trajectory_stage_scores(rubrics, [1.5, 0.5], 0.5, True, 3.0) == pytest.approx([0.75, 0.0, 0.0, 0.5625])
    assert trajectory_stage_scores(rubrics, None, 0.5, True, 3.0) == [0.0, 0.0, 0.0, 0.5]  # nothing graded: F1 only
    assert trajectory_stage_scores(rubrics, None, 0.5, True, 0.0) == [0.0] * 4


def test_neutral_grades_are_the_groups_mean_per_rubric() -> None:
    g = [RubricGrade(2), RubricGrade(0)], None, [RubricGrade(1), RubricGrade(1)], [RubricGrade(0)]  # last: wrong count
    assert neutral_grades(g, 2) == [1.5, 0.5]
    assert neutral_grades([None, None], 2) is None and neutral_grades([[], []], 0) is None


def test_a_failed_grading_leaves_the_groups_stage_credit_neutral() -> None:
    """The trajectory whose grading call failed gets advantage 0 in every stage (its process is
    the group's average, its answer as good as theirs), where the literal (0, 0, 0, F1) fallback read as a bad
    plan; the graded ones keep their credit, one up and one down."""
    rubrics = [StageRubric("a", 1, "names the entity", "d", 1, 1)]
    per_traj = [[RubricGrade(2)], [RubricGrade(0)], None]  # trajectory 2: the call failed after its retries
    neutral = neutral_grades(per_traj, 1)
    scores = [trajectory_stage_scores(rubrics, [x.score for x in g] if g is not None else neutral, 0.5, True, 1.0)
              for g in per_traj]
    assert [s[0] for s in scores] == [1.0, 0.0, 0.5]  # plan: 2 / 2, 0 / 2, the mean 1 / 2
    adv = stage_advantages([stage_returns(s, DEFAULT_LAMBDA) for s in scores])
    assert adv[2] == pytest.approx([0.0] * 4, abs=1e-9)
    assert adv[0][0] == pytest.approx(-adv[1][0]) and adv[0][0] > 0.5
    literal = [scores[0], scores[1], [0.0, 0.0, 0.0, 0.5]]  # the old fallback: as bad a plan as the worst one
    assert stage_advantages([stage_returns(s, DEFAULT_LAMBDA) for s in literal])[2][0] < -0.5


# ---------------------------------------------------------------------------------------------- App. C.4
def test_prune_drops_the_least_discriminative_adaptive_rubrics() -> None:
    rs = [StageRubric(f"r{i}", 1, f"t{i}", "d") for i in range(4)] + [StageRubric("p", 1, "gold", "d", persistent=True)]
    var = {"r0": 0.5, "r1": 0.0, "r2": 0.25, "r3": 0.0, "p": 0.0}
    kept, dropped = prune_stage(rs, var, cap=2, created={"r1": 2, "r3": 1})
    # two over the cap: r3 and r1 have variance 0; r3 is older -> dropped first, then r1; persistent p stays
    assert [r.rubric_id for r in dropped] == ["r1", "r3"]
    assert [r.rubric_id for r in kept] == ["r0", "r2", "p"]
    assert prune_stage(rs[:2], var, cap=3) == (rs[:2], [])
    assert grade_variance([0, 2, None]) == 1.0 and grade_variance([1]) == 0.0


def test_stage_buffer_events_rebuild_the_same_buffer() -> None:
    buf = StageBuffer((1, 2, 2, 3))
    ev = buf.add(1, 0, "q1", [StageRubricDraft(1, "Names the entity", "d", 3, 1, "plan_entities"),
                              StageRubricDraft(1, "Vague plan", "d", 1, -1),
                              StageRubricDraft(1, "names the entity", "dup title", 2, 1),  # same stage+title: skipped
                              StageRubricDraft(7, "Bad stage", "d")])  # no such stage: skipped
    assert [e["rubric_id"] for e in ev] == ["st1.0.0", "st1.0.1"]
    ev += buf.prune(1, 0, "q1", {"st1.0.0": 0.6, "st1.0.1": 0.1})  # stage 1 cap is 1
    assert [(e["rubric_id"], e["event"], e["variance"]) for e in ev[2:]] == [("st1.0.0", "kept", 0.6),
                                                                           ("st1.0.1", "dropped", 0.1)]
    again = StageBuffer.from_events((1, 2, 2, 3), ev)
    assert again.rubrics("q1") == buf.rubrics("q1") == [StageRubric("st1.0.0", 1, "Names the entity", "d", 3, 1,
                                                                    False, "plan_entities")]


# ---------------------------------------------------------------------------------------------- the scaffold
def test_staged_protocol_checker() -> None:
    assert check_format(STAGED, protocol=RUBRICEM).valid
    assert check_format(STAGED, protocol=RUBRICEM).answer == "Rema"
    cases = {
        STAGED.replace("<structured_plan>Need the director of Film X.</structured_plan>\n", ""):
            "must open with <structured_plan>",
        STAGED.replace("<think>enough</think>\n<review>Ann Bo was born in Rema.</review>\n", ""): "no <review>",
        STAGED.replace("<review>Ann Bo was born in Rema.</review>\n<answer>",
                       "<review>x</review><review>y</review>\n<answer>"): "2 <review> blocks",
        STAGED.replace("<state_evaluation>Ann Bo directed it; next her birthplace.</state_evaluation>\n", "")
        .replace("<structured_plan>", "<state_evaluation>e</state_evaluation><structured_plan>"):
            "must open with <structured_plan>",
        STAGED.replace("<think>enough</think>\n<review>Ann Bo was born in Rema.</review>\n", "")
        .replace("</tool_output>\n<state_evaluation>", "</tool_output>\n<review>early</review><state_evaluation>"):
            "right before the <answer>",
    }
    for text, reason in cases.items():
        got = check_format(text, protocol=RUBRICEM)
        assert not got.valid and reason in got.reason, (reason, got)
    plain = "<structured_plan>p</structured_plan>\n<review>r</review>\n<answer>\\boxed{a}</answer>"
    assert "no search" in check_format(plain, protocol=RUBRICEM).reason
    # a state evaluation must follow a tool output
    early = STAGED.replace("<search>Film X</search>", "<state_evaluation>e</state_evaluation>\n<search>Film X</search>")
    assert "not right after a tool output" in check_format(early, protocol=RUBRICEM).reason


def test_stage_spans_follow_the_papers_boundaries() -> None:
    spans = stage_spans(STAGED)
    parts = [STAGED[a:b] for a, b in spans]
    assert "".join(parts) == STAGED and spans[0][0] == 0 and spans[-1][1] == len(STAGED)
    assert parts[0].endswith("</structured_plan>") and parts[0].startswith("<structured_plan>")
    assert parts[1].startswith("\n<search>Film X") and parts[1].endswith("</tool_output>\n")
    assert parts[2] == "<think>enough</think>\n<review>Ann Bo was born in Rema.</review>\n"  # its <think> included
    assert parts[3] == "<answer>\\boxed{ Rema}</answer>"
    # malformed: no plan, no review -> empty spans in place, still tiling the text
    bad = "<search>q</search>\n<tool_output>\nx\n</tool_output>\n<answer>\\boxed{a}</answer>"
    s = stage_spans(bad)
    assert s[0] == (0, 0) and s[2][0] == s[2][1] == bad.index("<answer>") and s[3][1] == len(bad)


def test_token_starts_maps_characters_onto_tokens() -> None:
    vocab = ["<plan>", "ab", "c", "<rev>", "x", "<ans>", "y"]
    ids = list(range(len(vocab)))

    def decode(xs: list[int]) -> str:
        return "".join(vocab[i] for i in xs)

    text = decode(ids)
    starts = [0, text.index("ab"), text.index("<rev>"), text.index("<ans>")]
    assert token_starts(decode, ids, starts) == [0, 1, 3, 5]
    assert token_starts(decode, ids, [len(text)]) == [len(ids)]


# ---------------------------------------------------------------------------------------------- GRPO reduction
def _traj(sample: int, n: int, starts: list[int], rewards: list[float]) -> Trajectory:
    return Trajectory("r", 1, 0, sample, "q", "Q?", ["a"], prompt_ids=[1], response_ids=list(range(n)),
                      loss_mask=[1] * n, rollout_logprobs=[0.0] * n, stage_starts=starts, stage_rewards=rewards,
                      shaped_reward=rewards[-1])


def test_terminal_broadcast_is_grpo_exactly() -> None:
    """Identity Lambda plus lambda_{k,K} = 1 and only R_K non-zero: every token's advantage, hence the loss, equals
    GRPO's (eq. 1 reduces to the existing loss)."""
    terminal = ((1.0, 0.0, 0.0, 1.0), (0.0, 1.0, 0.0, 1.0), (0.0, 0.0, 1.0, 1.0), (0.0, 0.0, 0.0, 1.0))
    cfg = ArborConfig.model_validate({"run": {"method": "ss-grpo"}, "rubricem": {"lambda_matrix": terminal}})
    outcomes = [0.9, 0.1, 0.4, 0.4]
    batch = [_traj(i, 7 + i, [0, 2, 4, 5 + i], [0.0, 0.0, 0.0, r]) for i, r in enumerate(outcomes)]
    groups = [0] * 4
    ss = SSGRPO(cfg).token_advantages(batch, outcomes, groups, cfg.train)
    grpo = Method(cfg).token_advantages(batch, outcomes, groups, cfg.train)
    assert all(torch.equal(a, b) for a, b in zip(ss, grpo, strict=True))
    g = torch.Generator().manual_seed(0)
    logp = [torch.randn(len(t.response_ids), generator=g) * 0.1 - 1 for t in batch]
    pad = max(len(t.response_ids) for t in batch)

    def stack(xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([torch.nn.functional.pad(x, (0, pad - len(x))) for x in xs])

    mask = stack([torch.ones(len(t.response_ids)) for t in batch])
    lp = stack(logp)
    a = policy_loss(lp, lp - 0.05, lp - 0.05, stack(ss), mask)
    b = policy_loss(lp, lp - 0.05, lp - 0.05, stack(grpo), mask)
    assert torch.equal(a.loss, b.loss)


def test_stage_advantages_reach_the_tokens_of_their_stage() -> None:
    cfg = ArborConfig.model_validate({"run": {"method": "ss-grpo"}})
    batch = [_traj(0, 6, [0, 2, 4, 5], [1.0, 0.0, 0.0, 0.0]), _traj(1, 6, [0, 1, 3, 6], [0.0, 0.0, 0.0, 0.0])]
    adv = SSGRPO(cfg).token_advantages(batch, [1.0, 0.0], [0, 0], cfg.train)
    s = 2 ** 0.5
    # stage 1 returns 1 vs 0 -> +-1/sqrt(2); stages 2-4 returns equal -> 0; trajectory 1's answer stage is empty
    assert adv[0].tolist() == pytest.approx([1 / s, 1 / s, 0, 0, 0, 0], abs=1e-5)
    assert adv[1].tolist() == pytest.approx([-1 / s, 0, 0, 0, 0, 0], abs=1e-5)
    with pytest.raises(ValueError, match="no stage scores"):
        SSGRPO(cfg).token_advantages([Trajectory("r", 1, 0, 0, "q", "Q", ["a"], response_ids=[1])], [0.0], [0],
                                     cfg.train)


def test_lambda_must_be_causal_with_a_unit_diagonal() -> None:
    from pydantic import ValidationError

    bad = ((1.0, 0.4, 0.6, 0.8), (0.3, 1.0, 0.4, 0.8), (0.0, 0.0, 1.0, 0.8), (0.0, 0.0, 0.0, 1.0))
    with pytest.raises(ValidationError, match="j < k"):
        ArborConfig.model_validate({"rubricem": {"lambda_matrix": bad}})
    with pytest.raises(ValidationError, match="lambda_kk must be 1"):
        ArborConfig.model_validate({"rubricem": {"lambda_matrix": ((0.5,) * 4,) * 4}})
    with pytest.raises(ValidationError, match="rubricem.stage_caps"):
        ArborConfig.model_validate({"rubricem": {"stage_caps": (3, -1, 2, 3)}})


def test_ss_grpo_requires_the_staged_protocol() -> None:
    from arbor.preflight import check
    from arbor.tasks.methods import BUILTIN, BUILTIN_REQUIRES, requirement_problems, resolve_method

    for name in BUILTIN:  # the import-free copy says what each class says
        assert BUILTIN_REQUIRES.get(name, {}) == resolve_method(name).requires, name
    cfg = ArborConfig.model_validate({"run": {"method": "ss-grpo"}})
    assert requirement_problems(cfg) == ["rollout.protocol: run.method=ss-grpo needs rollout.protocol=rubricem "
                                         "(got 'arbor')"]
    assert any("rollout.protocol: run.method=ss-grpo" in p for p in check(cfg, gpu_count=0))
    ok = ArborConfig.model_validate({"run": {"method": "ss-grpo"}, "rollout": {"protocol": "rubricem"}})
    assert requirement_problems(ok) == []
