"""RubricEM's reflection meta-policy and rubric bank (§3.4, App. D): the curriculum, the utility, the
bank's writes, replay and retrieval ranking, the injection formats, the SFT reflection rows, the advantages of a
mixed task + reflection batch (against values computed by hand) and the trainer's one-step-lag rule."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from arbor.config import ArborConfig
from arbor.format import reflection_blocks
from arbor.tasks.methods.rubricem import RubricEM
from arbor.tasks.reflection import (
    REFLECTION_GROUP,
    BankItem,
    RubricBank,
    best_candidate,
    gold_reflection,
    rank_related,
    reference_block,
    reflection_sft_rows,
    reflection_utility,
    windowed_batch,
    with_reference,
)
from arbor.types import ReflectionGrade, Trajectory


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from arbor.tasks.env.policy import build_tiny_policy

    return build_tiny_policy(home=tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


GOLD = ("<structured_plan>Find who founded Zorblat Mills.</structured_plan>\n<search>Zorblat Mills founder</search>\n"
        "<tool_output>\nDoc 1 (Title: Zorblat Mills) Zorblat Mills was founded by Quenby Arl.\n</tool_output>\n"
        "<think>done</think>\n<review>Quenby Arl founded it.</review>\n<answer>\\boxed{Quenby Arl}</answer>")


# ---------------------------------------------------------------------------------------------- D.3 curriculum
def test_windowed_curriculum_replays_each_window_within_episode() -> None:
    got = [windowed_batch(s, 3) for s in range(1, 14)]
    assert got == [(1, "cross"), (2, "cross"), (3, "cross"), (1, "within"), (2, "within"), (3, "within"),
                   (4, "cross"), (5, "cross"), (6, "cross"), (4, "within"), (5, "within"), (6, "within"),
                   (7, "cross")]
    assert [windowed_batch(s, 1) for s in range(1, 5)] == [(1, "cross"), (1, "within"), (2, "cross"), (2, "within")]
    with pytest.raises(ValueError):
        windowed_batch(0, 3)


# ---------------------------------------------------------------------------------------------- D.6.2 utility
def test_reflection_only_in_the_new_query_phase_by_default() -> None:
    """D.4: with K = 3, steps 1-3 draw fresh batches and reflect, 4-6 replay them and do not;
    every-step reflects always; with the curriculum off every batch is fresh."""
    from arbor.config.rubricem import RubricEMConfig
    from arbor.tasks.methods.rubricem.method import reflects_at

    assert RubricEMConfig().reflect_in == "new-query"
    assert [reflects_at(s, "new-query", "windowed", 3) for s in range(1, 10)] == [True] * 3 + [False] * 3 + [True] * 3
    assert all(reflects_at(s, "every-step", "windowed", 3) for s in range(1, 10))
    assert all(reflects_at(s, "new-query", "off", 3) for s in range(1, 10))


def test_utility_weights_the_three_dimensions() -> None:
    assert reflection_utility(ReflectionGrade(1.0, 0.5, 0.0)) == pytest.approx(0.4 + 0.15)
    assert reflection_utility(ReflectionGrade(0.5, 1.0, 1.0)) == pytest.approx(0.2 + 0.3 + 0.3)
    assert reflection_utility(ReflectionGrade(1.0, 1.0, 1.0), (0.5, 0.25, 0.25)) == pytest.approx(1.0)


def test_within_cross_utility_averages_alg1s_two_usefulness_scores() -> None:
    """Alg. 1 lines 37-38: u = (u_within + u_cross) / 2, u_within = (d + specificity) / 2, u_cross = (d + scope) / 2.
    By hand: (1.0, 0.5, 0.0) -> u_within 0.75, u_cross 0.5, u 0.625 (D.6.2's weights give 0.55)."""
    from arbor.tasks.methods.rubricem.method import candidate_utility
    from arbor.tasks.reflection import within_cross_utility

    g = ReflectionGrade(1.0, 0.5, 0.0)
    assert within_cross_utility(g) == pytest.approx(0.625)
    assert within_cross_utility(ReflectionGrade(0.2, 1.0, 0.6)) == pytest.approx((0.6 + 0.4) / 2)
    w = (0.4, 0.3, 0.3)
    assert candidate_utility(g, True, "within-cross", w, False) == pytest.approx(0.625)
    assert candidate_utility(g, True, "weighted", w, False) == pytest.approx(0.55)
    # F.1.2 (no format reward): a candidate without its blocks keeps the judge's score; behind the gate it gets 0
    assert candidate_utility(g, False, "weighted", w, False) == pytest.approx(0.55)
    assert candidate_utility(g, False, "weighted", w, True) == 0.0
    assert candidate_utility(g, True, "weighted", w, True) == pytest.approx(0.55)


def test_paper_profile_reflection_settings() -> None:
    """The paper profile: no format gate (F.1.2), D.6.2's weighted utility, and a reflection
    budget that holds a Qwen3 <think> block and D.6.1's two blocks; the tiny profiles keep the recorded 256."""
    from arbor.config import load_config

    rc = load_config("qwen3-8b-rubricem").rubricem
    assert (rc.format_gate, rc.reflection_utility, rc.reflection_weights) == (False, "weighted", (0.4, 0.3, 0.3))
    assert rc.reflection_max_tokens == 4096
    assert all(load_config(p).rubricem.reflection_max_tokens == 256 for p in ("tiny-world", "tiny-cpu", "smol-world"))


def test_best_candidate_is_the_highest_valid_one() -> None:
    assert best_candidate([0.2, 0.9, 0.9, 0.5], [True, False, True, True]) == 2  # 1 is invalid; 2 beats 3
    assert best_candidate([0.7, 0.7], [True, True]) == 0  # ties: the first
    assert best_candidate([0.4, 0.9], [False, False]) is None
    assert best_candidate([0.0, 0.0], [True, True]) is None  # nothing useful: the bank is left alone


# ---------------------------------------------------------------------------------------------- D.5 bank
def _item(qid: str, step: int, q: str = "") -> BankItem:
    return BankItem(f"r/bank/{step}/{qid}", qid, q or f"question {qid}", f"rubrics {qid}", f"lessons {qid}", step,
                    f"r/{step}/0/0", 0.5)


def test_rank_related_by_inner_product_ties_in_order() -> None:
    cands = [("a", [0.6, 0.8]), ("b", [1.0, 0.0]), ("c", [0.6, -0.8]), ("d", [1.0, 0.0])]
    assert rank_related([1.0, 0.0], cands, 2) == [("b", 1.0), ("d", 1.0)]
    assert [c for c, _ in rank_related([1.0, 0.0], cands, 4)] == ["b", "d", "a", "c"]
    assert [c for c, _ in rank_related([0.0, 1.0], cands, 1)] == ["a"]  # 0.8 > 0 > -0.8
    assert rank_related([1.0, 0.0], cands, 0) == []


def test_bank_keeps_one_item_per_question_and_replays_from_events() -> None:
    bank = RubricBank()
    events = [bank.write(_item("q1", 1), 0), bank.write(_item("q2", 1), 1), bank.write(_item("q1", 2), 0)]
    assert [e["event"] for e in events] == ["written", "written", "replaced"]
    assert events[2]["replaced_item_id"] == "r/bank/1/q1" and events[0]["replaced_item_id"] is None
    assert list(bank.items) == ["q2", "q1"]  # write order of the current items
    assert bank.within("q1") == _item("q1", 2) and bank.within("q3") is None
    vecs = {"q1": [1.0, 0.0], "q2": [0.0, 1.0]}
    # cross-episode retrieval never returns the question's own item
    assert [(it.question_id, s) for it, s in bank.cross("q1", [0.6, 0.8], vecs, 2)] == [("q2", 0.8)]
    assert [it.question_id for it, _ in bank.cross("q9", [0.6, 0.8], vecs, 2)] == ["q2", "q1"]
    again = RubricBank.from_events(events)
    assert again.items == bank.items and list(again.items) == list(bank.items)


# ---------------------------------------------------------------------------------------------- D.6.3 injection
def test_reference_blocks_precede_the_question() -> None:
    within = reference_block("within", [_item("q1", 1), _item("q2", 1)])
    assert within.startswith("<reference_examples>") and within.endswith("</reference_examples>")
    assert "rubrics q1" in within and "lessons q1" in within and "q2" not in within  # its own item only
    cross = reference_block("cross", [_item("q1", 1, "Who built A?"), _item("q2", 1, "Where is B?")])
    assert cross.index("Who built A?") < cross.index("rubrics q1") < cross.index("Where is B?")
    assert "Similar question 1" in cross and "Similar question 2" in cross
    assert reference_block("cross", []) == ""
    msg = with_reference("  Who founded X? ", cross)
    assert msg.startswith("<reference_examples>") and msg.endswith("\n\nWho founded X?")
    assert with_reference("Who?", "") == "Who?"


def test_prompt_shows_the_reference_but_the_trajectory_keeps_the_question(tiny_tokenizer) -> None:
    from arbor.format import RUBRICEM
    from arbor.tasks.env.agent import AgentLoop, Budgets, build_prompt_ids

    loop = AgentLoop(tiny_tokenizer, None, Budgets(), protocol=RUBRICEM)
    block = reference_block("within", [_item("q1", 1)])
    s = loop.start("q1", "Who founded X?", ["a"], 0, block)
    assert s.question == "Who founded X?"
    assert s.prompt_ids == build_prompt_ids(tiny_tokenizer, with_reference("Who founded X?", block),
                                             RUBRICEM.system_prompt)
    assert len(s.prompt_ids) > len(loop.start("q1", "Who founded X?", ["a"], 0).prompt_ids)


# ---------------------------------------------------------------------------------------------- SFT rows
def test_gold_reflections_are_grounded_and_valid() -> None:
    text = gold_reflection("Who founded Zorblat Mills?", GOLD, random.Random(3), "rubricem")
    rubrics, takeaways = reflection_blocks(text) or ("", "")
    assert "Zorblat Mills" in text and "Who" not in rubrics.split("Zorblat")[0].split(":")[-1]
    assert rubrics.strip() and takeaways.strip()
    rows = [{"question_id": f"q{i}", "question": "Who founded Zorblat Mills?", "golds": ["Quenby Arl"],
             "response": GOLD} for i in range(40)]
    out = reflection_sft_rows(rows, 0.5, seed=1, protocol="rubricem")
    assert out == reflection_sft_rows(rows, 0.5, seed=1, protocol="rubricem")
    refl = [r for r in out if "system" in r]
    refs = [r for r in out if "system" not in r]
    assert 10 <= len(refl) == len(refs) <= 30  # one reflection row and one reference copy per chosen row
    assert all(r["question"].startswith("Question: Who founded") for r in refl)
    assert len({r["response"] for r in refl}) > 1  # parts are left out at random: samples differ
    # the copies keep the gold response and show a reference block before the question, within / cross alternately
    assert all(r["response"] == GOLD and r["question"].endswith("\n\nWho founded Zorblat Mills?") for r in refs)
    assert all(r["question"].startswith("<reference_examples>") for r in refs)
    assert ["Similar question 2" in r["question"] for r in refs[:4]] == [False, True, False, True]
    assert reflection_sft_rows(rows, 0.0, seed=1) == []


# ---------------------------------------------------------------------------------------------- advantages
def _task(sample: int, n: int, rewards: list[float]) -> Trajectory:
    return Trajectory("r", 2, 0, sample, "q", "Q?", ["a"], prompt_ids=[1], response_ids=list(range(n)),
                      loss_mask=[1] * n, rollout_logprobs=[0.0] * n, stage_starts=[0, 1, 2, 3], stage_rewards=rewards,
                      shaped_reward=rewards[-1])


def _refl(sample: int, n: int, u: float) -> Trajectory:
    return Trajectory("r", 1, REFLECTION_GROUP + 0, sample, "q", "Q?", ["a"], prompt_ids=[1],
                      response_ids=list(range(n)), loss_mask=[1] * n, rollout_logprobs=[0.0] * n, base_reward=u,
                      shaped_reward=u)


def test_mixed_batch_task_stage_credit_and_reflection_group_advantages() -> None:
    cfg = ArborConfig.model_validate({"run": {"method": "rubricem"}, "rollout": {"protocol": "rubricem"}})
    batch = [_task(0, 5, [1.0, 0.0, 0.0, 0.0]), _task(1, 5, [0.0, 0.0, 0.0, 0.0]),
             _refl(0, 3, 0.2), _refl(1, 4, 0.6), _refl(2, 2, 0.4)]
    rewards = [t.shaped_reward or 0.0 for t in batch]
    adv = RubricEM(cfg).token_advantages(batch, rewards, [t.group for t in batch], cfg.train)
    s = 2 ** 0.5
    # task: stage 1 returns 1 vs 0 -> +-1/sqrt(2) on the plan token, stages 2-4 equal -> 0
    assert adv[0].tolist() == pytest.approx([1 / s, 0, 0, 0, 0], abs=1e-5)
    assert adv[1].tolist() == pytest.approx([-1 / s, 0, 0, 0, 0], abs=1e-5)
    # reflections: u = .2, .6, .4 -> mean .4, sample std .2 -> A = -1, +1, 0 on every token of the candidate
    assert adv[2].tolist() == pytest.approx([-1.0] * 3, abs=1e-4)
    assert adv[3].tolist() == pytest.approx([1.0] * 4, abs=1e-4)
    assert adv[4].tolist() == pytest.approx([0.0] * 2, abs=1e-4)
    m = RubricEM(cfg)
    assert [m.policy_lag(t) for t in batch] == [0, 0, 1, 1, 1]


def test_trainer_takes_lagged_reflections_and_refuses_stale_rollouts(tiny_dir: Path, tmp_path: Path) -> None:
    """A reflection candidate sampled at step s-1 by version v-1 trains at step s; a task trajectory must be
    on-policy, and a reflection must be exactly one step old."""
    from test_train import Driven

    from arbor.config import load_config

    cfg = load_config("tiny-cpu", {"run.run_id": "r", "run.method": "rubricem", "rollout.protocol": "rubricem",
                                   "train.lr": 1e-3})
    tr = Driven(cfg, tiny_dir, tmp_path)  # RubricEM decides the update, the trainer checks the versions
    g = torch.Generator().manual_seed(0)

    def traj(step: int, group: int, sample: int, version: int, u: float) -> Trajectory:
        n = 5
        return Trajectory("r", step, group, sample, "q", "Q?", ["a"], prompt_ids=[5, 6, 7],
                          response_ids=torch.randint(10, 200, (n,), generator=g).tolist(), loss_mask=[1] * n,
                          rollout_logprobs=[-3.0] * n, stage_starts=[0, 1, 2, 3] if group < REFLECTION_GROUP else None,
                          stage_rewards=[u, 0, 0, u] if group < REFLECTION_GROUP else None, base_reward=u,
                          shaped_reward=u, policy_version=version)

    tr.train_step([traj(1, 0, i, 0, float(i % 2)) for i in range(4)], 1)
    ok = [traj(2, 0, i, 1, float(i % 2)) for i in range(4)] + [traj(1, REFLECTION_GROUP, i, 0, 0.1 * i)
                                                                 for i in range(3)]
    m = tr.train_step(ok, 2)
    assert m["n_trajectories"] == 7.0
    # Phase A (the reflections, scored at their sampling T) before Phase B (the task batch)
    assert m["phase0_loss_tokens"] == 3 * 5 and m["phase1_loss_tokens"] == 4 * 5
    from arbor.tasks.training.update import policy_update

    u = policy_update(ok, 2, cfg.train, cfg.run.overlap, tr.method, source="rubricem")
    assert u.phases == [1] * 4 + [0] * 3 and u.temperatures == [None] * 4 + [0.7] * 3
    joint = load_config("tiny-cpu", {"run.method": "rubricem", "rubricem.reflection_update": "joint"})
    u = policy_update(ok, 2, joint.train, joint.run.overlap, RubricEM(joint), source="rubricem")
    assert u.phases == [0] * 7 and u.temperatures == [None] * 7
    with pytest.raises(AssertionError, match="policy version"):  # an off-policy task trajectory
        tr.train_step([traj(3, 0, i, 1, float(i % 2)) for i in range(4)], 3)
    with pytest.raises(AssertionError, match="policy version"):  # a reflection two steps old
        tr.train_step([traj(3, 0, i, 2, float(i % 2)) for i in range(4)] + [traj(1, REFLECTION_GROUP, 0, 0, 0.5)], 3)


# ---------------------------------------------------------------------------------- a judge call failed for good
REFLECTIONS = ["<reflection_rubrics>\nCritical requirement: the founder of Zorblat Mills.\n</reflection_rubrics>\n"
               "<reflection_takeaways>\n1. Search the mill's name first.\n</reflection_takeaways>",
               "<reflection_rubrics>\nPitfalls: stopping early.\n</reflection_rubrics>\n"
               "<reflection_takeaways>\n1. Check the last result.\n</reflection_takeaways>",
               "I would search again."]  # no blocks: an invalid candidate


class ReflectingEngine:
    """The policy's place in reflection: candidate i of each reflected query writes REFLECTIONS[i]."""

    policy_version = 0

    def __init__(self, tokenizer) -> None:  # noqa: ANN001
        self.tokenizer = tokenizer

    def complete(self, requests, *, temperature: float, stop_strings: list[str]):  # noqa: ANN201, ANN001
        from arbor.tasks.env.agent import Generation, encode_text

        out = []
        for i, _ in enumerate(requests):
            ids = encode_text(self.tokenizer, REFLECTIONS[i % len(REFLECTIONS)])
            out.append(Generation(ids, [-0.5] * len(ids), "stop"))
        return out


def _grading_judge(fail: bool):  # noqa: ANN202
    """The rules judge for the stage roles; its reflection grades fixed by hand, or a call failed for good."""
    from arbor.llm.base import JudgeOutcome
    from arbor.llm.rules import RulesJudge

    class Grades(RulesJudge):
        async def ask(self, role, /, *, ctx=None, **fields):  # noqa: ANN001, ANN003, ANN201
            if getattr(role, "name", role) != "reflection_grades":
                return await super().ask(role, ctx=ctx, **fields)
            if fail:
                return JudgeOutcome(None, "InvalidOutput: 2 grades for 3 candidates", 3, False)
            return JudgeOutcome([ReflectionGrade(1.0, 1.0, 1.0), ReflectionGrade(0.5, 0.5, 0.5),
                                 ReflectionGrade(1.0, 1.0, 1.0)], None, 1, False)

    return Grades


def _reflect_step(home: Path, tiny_dir: Path, fail: bool, sets: dict | None = None,
                  ) -> tuple[list[dict], list[dict], list[dict], list[Trajectory], RubricEM]:
    """Step 1 of a RubricEM run through the real stages (score with the rules stage judge, induce, shape) on one
    group of three staged trajectories: (reflections, bank rows, shaped trajectory rows, step 2's lagged
    reflections, the method)."""
    from arbor.config import load_config
    from arbor.format import RUBRICEM, check_format
    from arbor.reward import token_f1
    from arbor.tasks.env.agent import tokenize_trajectory
    from arbor.tasks.env.policy import load_tokenizer
    from arbor.tasks.stage_store import StageStore
    from arbor.tasks.step import RunState

    cfg = load_config("tiny-cpu", {"run.method": "rubricem", "rollout.protocol": "rubricem", "run.run_id": "r",
                                   "rubricem.reflection_samples": 3, **(sets or {})})
    tok = load_tokenizer(tiny_dir, cfg.policy)
    q = "Who founded Zorblat Mills?"
    trajs = []
    for i, text in enumerate([GOLD, GOLD.replace("{Quenby Arl}", "{Arl Mills}"),
                              GOLD.replace("Zorblat Mills founder", "mills")]):
        p, r, m = tokenize_trajectory(tok, q, text, protocol=RUBRICEM)
        fmt = check_format(text, protocol=RUBRICEM)
        f1 = token_f1(fmt.answer, ["Quenby Arl"])
        trajs.append(Trajectory("r", 1, 0, i, "q1", q, ["Quenby Arl"], prompt_ids=p, response_ids=r, loss_mask=m,
                                rollout_logprobs=[0.0] * len(r), text=text, format_valid=fmt.valid, answer=fmt.answer,
                                f1=f1, base_reward=f1))
    store = StageStore("r", home)
    store.commit(1, "rollout", {"rollouts": [t.to_row() for t in trajs]})
    state = RunState(cfg=cfg, run_id="r", home=home, store=store, questions=[], engine=ReflectingEngine(tok),
                     trainer=None, judge=_grading_judge(fail)(cfg.judge, home=home),
                     embed=None)  # type: ignore[arg-type]
    with state:
        for stage in ("score", "reflect", "shape"):
            store.commit(1, stage, state.compute(stage, 1))
        lagged = state.method.train_batch(state, 2, [])  # what step 2 trains on besides its own rollouts
        out = store.load(1, "reflect", ("reflections", "rubric_bank"))
        return (out["reflections"], out["rubric_bank"], store.load(1, "shape", ("trajectories",))["trajectories"],
                lagged, state.method)  # type: ignore[return-value]


def test_a_failed_reflection_grading_gives_its_candidates_no_gradient_and_the_bank_nothing(
        tiny_dir: Path, tmp_path: Path) -> None:
    """When the reflection-grade call fails for good every candidate's utility is 0, so the
    candidate group has zero variance (all advantages 0; the trainer drops it) and nothing enters the bank; the
    same candidates graded give u = 1, 0.5, 0 and advantages +1, 0, -1. The task group's stage credit comes from
    the score stage and is the same either way."""
    gate = {"rubricem.format_gate": True}  # arbor's gate: the blockless third candidate's utility is 0
    ok_refl, ok_bank, ok_shaped, ok_lagged, m = _reflect_step(tmp_path / "ok", tiny_dir, False, gate)
    bad_refl, bad_bank, bad_shaped, bad_lagged, _ = _reflect_step(tmp_path / "bad", tiny_dir, True, gate)
    cfg = m.cfg

    def advantages(cands: list[Trajectory]) -> list[float]:
        adv = m.token_advantages(cands, [c.base_reward for c in cands], [c.group for c in cands], cfg.train)
        return [float(a[0]) for a in adv]

    # graded: u = 0.4 + 0.3 + 0.3 = 1; 0.5 (0.4 + 0.3 + 0.3) = 0.5; the third has no blocks: 0 whatever its grade.
    # Mean 0.5, sample std 0.5: A = +1, 0, -1; the best (candidate 0) enters the bank.
    assert [r["utility"] for r in ok_refl] == pytest.approx([1.0, 0.5, 0.0])
    assert [r["chosen"] for r in ok_refl] == [True, False, False] and len(ok_bank) == 1
    assert [c.sample for c in ok_lagged] == [0, 1, 2]
    assert advantages(ok_lagged) == pytest.approx([1.0, 0.0, -1.0], abs=1e-5)
    # failed: every utility 0 (none chosen, the bank untouched), recorded with the call's error
    assert [r["utility"] for r in bad_refl] == [0.0, 0.0, 0.0] and not any(r["chosen"] for r in bad_refl)
    assert bad_bank == [] and all(r["judge_error"].startswith("InvalidOutput") for r in bad_refl)
    assert all(r["judge_error"] is None for r in ok_refl)
    assert bad_lagged == []  # a zero-variance reflection group is not trained on
    bad_cands = [Trajectory.from_row(r) for r in bad_refl]
    assert advantages(bad_cands) == [0.0, 0.0, 0.0]  # and, were it trained, it would carry no gradient
    # the policy's own credit: stage scores and R_total of the task group as when the reflection was graded
    key = lambda r: r["traj_id"]  # noqa: E731
    assert [(r["stage_starts"], r["stage_rewards"], r["shaped_reward"]) for r in sorted(bad_shaped, key=key)] == \
        [(r["stage_starts"], r["stage_rewards"], r["shaped_reward"]) for r in sorted(ok_shaped, key=key)]
    assert len({tuple(r["stage_rewards"]) for r in ok_shaped}) > 1  # the group's stages do tell them apart


def test_without_the_format_gate_a_blockless_candidate_keeps_its_judged_utility_but_not_the_bank(
        tiny_dir: Path, tmp_path: Path) -> None:
    """F.1.2 / D.4: the reward of a reflection is the judge's score; the format only decides the
    bank. The judge grades the three candidates u = 1, 0.5, 1 (the third has no blocks). By hand: mean 5/6,
    sample std sqrt(1/12), so A = +0.577, -1.155, +0.577; candidate 0 (the best valid) enters the bank."""
    refl, bank, _, lagged, m = _reflect_step(tmp_path, tiny_dir, False)
    assert [r["utility"] for r in refl] == pytest.approx([1.0, 0.5, 1.0])
    assert [r["format_valid"] for r in refl] == [True, True, False]
    assert [r["chosen"] for r in refl] == [True, False, False] and len(bank) == 1
    adv = m.token_advantages(lagged, [c.base_reward for c in lagged], [c.group for c in lagged], m.cfg.train)
    assert [float(a[0]) for a in adv] == pytest.approx([0.57735, -1.1547, 0.57735], abs=1e-4)


def _score_group(home: Path, tiny_dir: Path, texts: list[str], sets: dict) -> dict[str, list[float]]:
    """SS-GRPO's score stage (the rules stage judge) on one group; each trajectory's R_{i,1..4} by sample, after a
    rollout's own reward (F1 gated to 0 when the scaffold check fails)."""
    from arbor.config import load_config
    from arbor.format import RUBRICEM
    from arbor.llm.rules import RulesJudge
    from arbor.reward import base_reward
    from arbor.tasks.env.agent import tokenize_trajectory
    from arbor.tasks.env.policy import load_tokenizer
    from arbor.tasks.stage_store import StageStore
    from arbor.tasks.step import RunState

    cfg = load_config("tiny-cpu", {"run.method": "ss-grpo", "rollout.protocol": "rubricem", "run.run_id": "r", **sets})
    tok = load_tokenizer(tiny_dir, cfg.policy)
    q, golds = "Who founded Zorblat Mills?", ["Quenby Arl"]
    trajs = []
    for i, text in enumerate(texts):
        p, r, m = tokenize_trajectory(tok, q, text, protocol=RUBRICEM)
        rr = base_reward(text, golds, protocol=RUBRICEM)
        trajs.append(Trajectory("r", 1, 0, i, "q1", q, golds, prompt_ids=p, response_ids=r, loss_mask=m,
                                rollout_logprobs=[0.0] * len(r), text=text, format_valid=rr.format_valid,
                                answer=rr.answer, f1=rr.f1, base_reward=rr.base_reward))
    store = StageStore("r", home)
    store.commit(1, "rollout", {"rollouts": [t.to_row() for t in trajs]})
    state = RunState(cfg=cfg, run_id="r", home=home, store=store, questions=[], engine=ReflectingEngine(tok),
                     trainer=None, judge=RulesJudge(cfg.judge, home=home), embed=None)  # type: ignore[arg-type]
    with state:
        rows = state.compute("score", 1)["stage_scores"]
    out: dict[str, list[float]] = {}
    for r in sorted(rows, key=lambda r: (r["sample"], r["stage"])):
        out.setdefault(r["sample"], []).append(r["score"])
    return out


def test_without_the_format_gate_a_scaffold_breaking_trajectory_is_graded_like_any_other(
        tiny_dir: Path, tmp_path: Path) -> None:
    """F.1.2: no format reward, so a trajectory that fails the strict scaffold check (here: text
    after its </answer>) is graded on its stages and its answer like the others: it scores what the same trajectory
    without the trailing text scores, the persistent Answer rubric included (F1 of its answer, 1 here, not the
    rollout's gated 0). Behind arbor's gate (``rubricem.format_gate=true``) it scores 0 in every stage."""
    texts = [GOLD, GOLD.replace("{Quenby Arl}", "{Arl Mills}"), GOLD + "\nThat is all."]
    paper = _score_group(tmp_path / "paper", tiny_dir, texts, {})
    gated = _score_group(tmp_path / "gated", tiny_dir, texts, {"rubricem.format_gate": True})
    assert paper[2] == pytest.approx(paper[0]) and paper[2][3] > paper[1][3]  # its right answer counts
    assert gated[2] == [0.0] * 4
    assert gated[0] == pytest.approx(paper[0]) and gated[1] == pytest.approx(paper[1])  # valid ones: unchanged
