"""Co-ReAct's equations (tasks/methods/coreact/equations.py) against values computed by hand, and the guided agent loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arbor.tasks.methods.coreact.equations import (
    atomicity_reward,
    average_ranks,
    borda,
    consensus_ranks,
    format_reward,
    generator_reward,
    is_atomic,
    parse_rubric,
    passes,
    rank_reward,
    render_rubric,
    repetition_rate,
    select_diverse,
    spearman_rho,
    verification_score,
    verifier_feedback,
)
from arbor.types import RubricItem, StepRubric


def test_spearman_reward_hand_values() -> None:
    assert rank_reward([1, 2, 3, 4], [1, 2, 3, 4]) == pytest.approx(1.0)
    assert rank_reward([4, 3, 2, 1], [1, 2, 3, 4]) == pytest.approx(0.0)
    # first two swapped: rho = 1 - 6 * 2 / (4 * 15) = 0.8 -> (0.8 + 1) / 2 = 0.9
    assert rank_reward([2, 1, 3, 4], [1, 2, 3, 4]) == pytest.approx(0.9)
    # ties: Pearson of the tie-averaged ranks, 4.5 / sqrt(4.5 * 5) = 0.94868 -> 0.97434
    assert rank_reward([1.5, 1.5, 3, 4], [1, 2, 3, 4]) == pytest.approx(0.97434, abs=1e-5)
    assert spearman_rho([2.5, 2.5, 2.5, 2.5], [1, 2, 3, 4]) is None
    assert rank_reward([2.5, 2.5, 2.5, 2.5], [1, 2, 3, 4]) == 0.5  # undefined rho: chance


def test_without_ties_spearman_is_the_closed_form() -> None:
    a, b = [3, 1, 4, 2, 5], [1, 2, 3, 4, 5]
    d2 = sum((x - y) ** 2 for x, y in zip(a, b, strict=True))
    assert spearman_rho(a, b) == pytest.approx(1 - 6 * d2 / (5 * (25 - 1)))


def test_average_ranks_share_ties_and_follow_direction() -> None:
    assert average_ranks([0.9, 0.5, 0.5, 0.1], descending=True) == [1.0, 2.5, 2.5, 4.0]
    assert average_ranks([4, 6, 8, 12], descending=False) == [1.0, 2.0, 3.0, 4.0]


def test_borda_and_consensus() -> None:
    rankings = [[1, 2, 3, 4], [2, 1, 3, 4], [1, 3, 2, 4]]
    assert borda(rankings) == [4, 6, 8, 12]
    assert consensus_ranks(rankings) == [1.0, 2.0, 3.0, 4.0]
    assert consensus_ranks([[1, 2, 3, 4], [2, 1, 3, 4]]) == [1.5, 1.5, 3.0, 4.0]  # tied Borda sums
    with pytest.raises(ValueError):
        borda([])


def test_composite_reward_and_gate() -> None:
    # rho = .8 -> r_rank = .9; 3 of 4 items atomic; format 1: .75 * .9 + .15 * .75 + .10 * 1 = .8875
    assert generator_reward(0.9, 0.75, 1.0) == pytest.approx(0.8875)
    assert generator_reward(0.9, 0.75, 1.0, repetition=0.41) == 0.0
    assert generator_reward(0.9, 0.75, 1.0, repetition=0.40) == pytest.approx(0.8875)  # the gate is strict


def test_format_and_atomicity_rewards() -> None:
    assert format_reward([0.4, 0.3, 0.2, 0.1]) == 1.0
    assert format_reward([0.5, 0.5]) == 0.5  # two items; positive weights sum to 1
    assert format_reward([0.5, 0.3, 0.1, -0.3]) == 1.0  # negatives do not count toward the sum
    assert format_reward([0.2, 0.2, 0.2]) == 0.5  # sum 0.6: off by more than 0.15
    assert format_reward([]) == 0.0
    assert is_atomic("The query names the film") and not is_atomic("The query names the film and its year")
    assert atomicity_reward(["a b", "c d", "e, f", "g"]) == 0.75


def test_repetition_rate() -> None:
    assert repetition_rate("one two three four five") == 0.0
    # 8 words "a b c d a b c d": 5 four-grams, unique {abcd, bcda, cdab, dabc} = 4 -> 1 - 4/5 = 0.2
    assert repetition_rate("a b c d a b c d") == pytest.approx(0.2)
    assert repetition_rate("x x x x x x x x x x") == pytest.approx(1 - 1 / 7)
    assert repetition_rate("too short") == 0.0


def test_verification_hand_values() -> None:
    w = [0.4, 0.3, 0.2, 0.1]
    s1 = verification_score(w, [True, False, True, False])
    s2 = verification_score(w, [False, True, True, False])
    assert s1 == pytest.approx(0.6) and passes(s1)
    assert s2 == pytest.approx(0.5) and not passes(s2)  # strictly above tau
    # a present flaw (negative item satisfied) subtracts: (.6 + .4 - .5) / 1.0
    assert verification_score([0.6, 0.4, -0.5], [True, True, True]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        verification_score(w, [True])


def test_rubric_text_round_trip_and_feedback() -> None:
    rubric = StepRubric((RubricItem(0.5, "query names: Tobara"), RubricItem(0.5, "query is new"),
                         RubricItem(-0.2, "query repeats")), "search for Tobara")
    text = render_rubric(rubric)
    assert text.splitlines()[0] == "1. [0.5] query names: Tobara" and text.endswith("Action: search for Tobara")
    assert parse_rubric(text) == rubric
    assert parse_rubric("noise\n1) [2.5] big\n[x] no\nAction: go").items == (RubricItem(1.0, "big"),)
    assert verifier_feedback(rubric, [True, False, True]) == ["query is new", "query repeats"]


def test_select_diverse_drops_duplicates_and_spreads() -> None:
    actions = ["search Tobara director", "search  Tobara director", "search Tobara director film",
               "answer Kerar Silix", "search Kerar Silix birthplace", "search Tobara"]
    chosen = select_diverse(actions, k=3)
    assert len(chosen) == 3 and 1 not in chosen  # the whitespace duplicate of action 0 is gone
    texts = {actions[i] for i in chosen}
    assert "answer Kerar Silix" in texts or "search Kerar Silix birthplace" in texts  # not three Tobara searches
    assert select_diverse(actions[:2], k=4) == [0]


# ---- the generator's judges failing for good ------------------------------------------------------
Q = "Where was the director of the film Film X born?"
H1 = ("<think>find the film first</think>\n<search>Film X director</search>\n"
      "<result>Film X was directed by Ann Lee in 1990.</result>")
SLATE = ["<search>Ann Lee birthplace</search>", "<search>Film X director</search>", "<answer>\\boxed{Rema}</answer>"]
POINT = {"point_id": "q/t1", "question": Q, "golds": ["Rema"], "history": H1, "tool_calls": 1, "candidates": SLATE}


class _Down:
    """Mixed into the rules judge: ``rank_actions``, or ``step_verify`` under ``FAILING``, fails past the retries."""

    FAILING = "answer names: Rema"

    async def ask(self, role, /, *, ctx=None, **fields):  # noqa: ANN001, ANN003, ANN201
        from arbor.llm.base import JudgeOutcome

        name = getattr(role, "name", role)
        if name == "rank_actions":
            return JudgeOutcome(None, "InvalidOutput: not a permutation", 3, False)
        if name == "step_verify" and any(it.condition == self.FAILING for it in fields["rubric"].items):
            return JudgeOutcome(None, "RateLimitError", 3, False)
        return await super().ask(role, ctx=ctx, **fields)  # type: ignore[misc]


class _Sampler:
    """The generator's place: rubric i of each point is TEXTS[i] (one id per character)."""

    TEXTS = ["1. [0.6] answers\n2. [0.4] query is new",  # scores .4, 0, .6: the consensus order
             "1. [1.0] answers",  # scores 0, 0, 1
             "1. [0.5] answers\n2. [0.5] answer names: Rema",  # its verification fails for good
             "no rubric here"]  # no items: ranks nothing by its own fault

    def requests(self, points, seeds):  # noqa: ANN001, ANN201
        from arbor.tasks.env.agent import GenRequest

        return [GenRequest([1], 64, s) for s in seeds]

    def sample(self, requests):  # noqa: ANN001, ANN201
        from arbor.tasks.env.agent import Generation

        texts = [self.TEXTS[i % len(self.TEXTS)] for i in range(len(requests))]
        return [Generation([ord(c) for c in t], [-0.5] * len(t), "stop") for t in texts]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


def test_failed_rankings_and_verifications_leave_the_generators_credit_neutral(tmp_path: Path) -> None:
    """A ranking call that fails for good is left out of the Borda consensus (not a last place
    for anyone), and a point short of valid rankings is not kept; a rubric whose slate could not be verified takes
    its group's mean r_rank (the verified rubrics'), where chance (0.5) read as a worse ranking than its group's."""
    from arbor.config.judge import JudgeConfig
    from arbor.llm.rules import RulesJudge
    from arbor.tasks.methods.coreact.generator import rank_points, sample_update

    class Down(_Down, RulesJudge):
        pass

    rules, down = RulesJudge(JudgeConfig(backend="rules"), home=tmp_path), Down(JudgeConfig(backend="rules"),
                                                                                 home=tmp_path)
    [alone] = rank_points([POINT], [("rules", rules)], min_rankings=1, seed=0)
    [both] = rank_points([POINT], [("rules", rules), ("down", down)], min_rankings=1, seed=0)
    assert both["consensus"] == alone["consensus"] and both["n_rankings"] == 1 and both["kept"]
    assert '"down": null' in both["judge_ranks"]
    [short] = rank_points([POINT], [("rules", rules), ("down", down)], min_rankings=2, seed=0)
    assert short["kept"] is False and short["consensus"] is None

    point = {**POINT, "consensus": [2.0, 3.0, 1.0]}  # the answer, then the new search, then the repeat
    rows = sample_update(_Sampler(), down, [point], update=1, group_size=4, seed=0, run_id="g", policy_version=0)
    # rubric 0 ranks the slate as the consensus: rho 1, r_rank 1. Rubric 1 ranks (2.5, 2.5, 1): centred (.5, .5, -1)
    # against (0, 1, -1): rho = 1.5 / sqrt(1.5 x 2) = .8660, r_rank = .9330. Rubric 2 was not verified: their mean
    # (1 + .9330) / 2 = .9665 (not 0.5); rubric 3 has no items: 0.5
    r3 = 3 ** 0.5 / 2
    assert [r["r_rank"] for r in rows] == pytest.approx([1.0, (r3 + 1) / 2, (1 + (r3 + 1) / 2) / 2, 0.5])
    assert [r["eval_errors"] for r in rows] == [0, 0, 3, 0] and rows[2]["candidate_scores"] is None
    # its own atomicity (2 of 2) and format (2 items: 0; weights sum to 1: .5) still count:
    # .75 x .9665 + .15 x 1 + .10 x .5
    assert rows[2]["reward"] == pytest.approx(0.75 * (1 + (r3 + 1) / 2) / 2 + 0.15 + 0.05)
    assert rows[3]["reward"] == pytest.approx(0.75 * 0.5)  # no items: r_atom 0, r_fmt 0


class _Replies:
    """A judge backend that answers ``rank_actions`` with a fixed reply text, read by the role's own parser (the
    parsing an LLM judge's reply goes through; the rules backend parses nothing)."""

    def __init__(self, reply: str, home: Path) -> None:
        from arbor.config.judge import JudgeConfig
        from arbor.llm.base import Judge, JudgeOutcome
        from arbor.llm.parse import InvalidOutput

        class Backend(Judge):
            backend = "replies"

            async def _answer(self, role, request, ctx):  # noqa: ANN001, ANN202
                self.seen.append(request)
                try:
                    return JudgeOutcome(role.parse(reply, request), None, 1, False)
                except InvalidOutput as e:
                    return JudgeOutcome(None, f"InvalidOutput: {e}", 1, False)

        self.judge = Backend(JudgeConfig(backend="rules"), home=home)
        self.judge.seen = []


def test_a_judge_without_a_final_ranking_is_left_out_and_two_valid_rankings_keep_the_point(tmp_path: Path) -> None:
    """§3.1, App. A: each judge reasons and ends with a final answer; the ranking is read from it.
    A judge whose reply holds no parseable final ranking (a bare JSON reply, a final answer that is no permutation)
    has an invalid ranking, stored as null; the point is kept with at least min_rankings (2) valid ones."""
    from arbor.tasks.methods.coreact.generator import rank_points, shuffled_order

    def reasoned(name: str) -> _Replies:  # ranks the shown labels in their shown order, after a rationale
        return _Replies('Rationale: X names the missing entity; Z answers too early.\n\nFinal answer:\n["X", "Y", "Z"]',
                        tmp_path / name)

    good_a, good_b = reasoned("a"), reasoned("b")
    bare = _Replies('{"ranking": ["X", "Y", "Z"]}', tmp_path / "c")  # no final answer: today's bare JSON
    short = _Replies('Rationale: ...\nFinal answer: ["X", "Y"]', tmp_path / "d")
    judges = [("a", good_a.judge), ("b", good_b.judge), ("c", bare.judge)]
    [kept] = rank_points([POINT], judges, min_rankings=2, seed=0)
    ranks = json.loads(kept["judge_ranks"])
    assert ranks["c"] is None and kept["n_rankings"] == 2 and kept["kept"] is True
    for name in ("a", "b"):  # shown order best first, mapped back through the judge's own shuffle
        order = shuffled_order(0, POINT["point_id"], name, 3)
        assert [ranks[name][order[j]] for j in range(3)] == [1, 2, 3]
    assert kept["consensus"] == consensus_ranks([ranks["a"], ranks["b"]])
    assert all(q.rationale for q in good_a.judge.seen)  # asked for the reasoned ranking
    [dropped] = rank_points([POINT], [("a", good_a.judge), ("c", bare.judge), ("d", short.judge)], min_rankings=2,
                            seed=0)
    assert dropped["n_rankings"] == 1 and dropped["kept"] is False and dropped["consensus"] is None
    # arbor's bare-JSON variant (rank_judges[i].rationale=false) reads that same JSON reply
    [json_kept] = rank_points([POINT], judges, min_rankings=3, seed=0, rationale={"c": False})
    assert json_kept["n_rankings"] == 3 and json_kept["kept"]


def test_the_ranking_council_sees_no_gold_answer_by_default(tmp_path: Path) -> None:
    """§3.1, App. A: the judges rank a slate from the query, the prefix h_t and the candidates;
    DR Tulu's research queries have no answer key, and the agent never has one: the council's requests carry no
    golds and the prompt says none was provided; ``guidance.rank_golds=true`` (arbor's earlier) shows them."""
    from arbor.config.guidance import GuidanceConfig
    from arbor.tasks.methods.coreact.generator import rank_points
    from arbor.tasks.methods.coreact.roles import rank_actions_messages

    assert GuidanceConfig().rank_golds is False
    plain, shown = _Replies('Final answer:\n["X", "Y", "Z"]', tmp_path / "a"), _Replies(
        'Final answer:\n["X", "Y", "Z"]', tmp_path / "b")
    [kept] = rank_points([POINT], [("a", plain.judge)], min_rankings=1, seed=0)
    assert kept["kept"] and [q.golds for q in plain.judge.seen] == [None]
    q = plain.judge.seen[0]
    user = rank_actions_messages(q.question, q.golds, q.history, q.shown, 3000)[1][1]["content"]
    assert "<ground_truth>(not provided)</ground_truth>" in user
    rank_points([POINT], [("b", shown.judge)], min_rankings=1, seed=0, golds=True)
    assert [q.golds for q in shown.judge.seen] == [["Rema"]]
