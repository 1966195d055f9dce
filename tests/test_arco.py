"""ARCO: its equations against hand-computed values, the teacher role (rules and OpenAI-compatible), the
method's per-turn credit, and a learning check: a tiny rubric model trained with the decomposition loss on two-step
trajectories, where only the second step decides the outcome, learns to credit that step."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from arbor.config import load_config
from arbor.config.judge import JudgeConfig
from arbor.format import turn_spans
from arbor.llm import make_judge
from arbor.llm.parse import InvalidOutput
from arbor.llm.rules import RulesJudge
from arbor.tasks.methods.arco import equations as arco
from arbor.tasks.methods.arco.roles import STEP_LABELS, parse_step_labels
from arbor.types import StepLabel, Trajectory


# ---- the equations --------------------------------------------------------------------------------------------
def test_decomposition_loss_and_class_balance_by_hand() -> None:
    # step means .2 and .5: (0.7 - 1)^2 = 0.09
    assert float(arco.decomposition_loss([[.2, .4, 0], [.5, .5, .5]], R=1)) == pytest.approx(0.09)
    assert float(arco.decomposition_loss([[.2, .4, 0], [.5, .5, .5]], R=1, weight=2.0)) == pytest.approx(0.18)
    # N = 4, one positive: 4 / 2 = 2; three negatives: 4 / 6
    assert arco.class_balance_weights([1, 0, 0, 0]) == pytest.approx([2, 2 / 3, 2 / 3, 2 / 3])
    assert arco.class_balance_weights([0.4, 0.6]) == pytest.approx([1, 1])  # 0.5 is the threshold
    assert arco.class_balance_weights([0, 0]) == pytest.approx([.5, .5])  # one class: N / (2 N) (as the authors)


def test_reward_to_go_variants_by_hand() -> None:
    assert arco.reward_to_go([.2, .5, .3], "sum") == pytest.approx([1, .8, .3])
    assert arco.reward_to_go([.2, .5, .3], "avg") == pytest.approx([1 / 3, .4, .3])
    # .3; .5 + .9 * .3 = .77; .2 + .9 * .77 = .893
    assert arco.reward_to_go([.2, .5, .3], "discounted", gamma=0.9) == pytest.approx([.893, .77, .3])
    with pytest.raises(ValueError, match="signal"):
        arco.reward_to_go([.1], "max")


def test_position_buckets() -> None:
    assert arco.step_buckets(["search", "search", "finish"]) == ["search_1", "search_2", "terminal"]
    assert arco.step_buckets(["search", "search"]) == ["search_1", "terminal"]  # unfinished: the last is terminal
    assert arco.step_buckets(["search", "other", "search", "finish"]) == ["search_1", "terminal", "search_2",
                                                                           "terminal"]


def test_bucket_baselines_and_dense_advantages_by_hand() -> None:
    returns = [[1.0, 0.4], [0.2, 0.6], [0.9]]
    buckets = [["search_1", "terminal"], ["search_1", "terminal"], ["terminal"]]
    b = arco.bucket_baselines(returns, buckets)
    # search_1: (1 + .2) / 2 = .6; terminal: (.4 + .6 + .9) / 3 = .633..
    assert b == [pytest.approx([.6, 1.9 / 3]), pytest.approx([.6, 1.9 / 3]), pytest.approx([1.9 / 3])]
    single = arco.bucket_baselines([[1.0, 0.5], [0.0]], [["search_1", "terminal"], ["terminal"]])
    assert single[0][0] == pytest.approx(0.5)  # search_1 has one member: the global mean (1 + .5 + 0) / 3
    glob = arco.bucket_baselines(returns, buckets, mode="global")
    assert glob[2] == [pytest.approx(3.1 / 5)]
    A = arco.dense_advantages(returns, b, c=0.5)
    assert A[0] == pytest.approx([0.5 * (1.0 - .6), 0.5 * (0.4 - 1.9 / 3)])


def test_sparse_advantages_have_no_std_normalisation() -> None:
    assert arco.sparse_advantages([1.0, 0.0, 0.5, 0.5], [0, 0, 1, 1]) == pytest.approx([0.5, -0.5, 0.0, 0.0])
    assert arco.sparse_advantages([1.0, 0.0, 0.0, 0.0], [0, 0, 0, 0]) == pytest.approx([.75, -.25, -.25, -.25])


def test_teacher_projection_by_hand() -> None:
    x, lam = arco.project_labels([[.9, .2, -.2], [.1, 0, .3]], R=1)
    # lambda = .32: [1.22 -> 1, .52, .12] (mean .5467) and [.42, .32, .62] (mean .4533) add up to 1
    assert lam == pytest.approx(0.32, abs=1e-9)
    assert x == [pytest.approx([1, .52, .12]), pytest.approx([.42, .32, .62])]
    assert sum(sum(r) / 3 for r in x) == pytest.approx(1.0)
    same, lam0 = arco.project_labels([[.5], [.5]], R=1)
    assert lam0 == 0.0 and same == [[.5], [.5]]
    out, _ = arco.project_labels([[0.0]], R=3)  # beyond reach (T = 1): the nearest bound
    assert out == [[pytest.approx(1.0)]]


def test_turns_and_their_token_advantages() -> None:
    mask = [1, 1, 0, 0, 1, 1, 1, 0]
    spans = turn_spans(mask)
    assert spans == [(0, 2), (4, 7)]
    adv = arco.turn_token_advantages(len(mask), spans, [0.3, -0.2])
    assert adv.tolist() == pytest.approx([0.3, 0.3, 0, 0, -0.2, -0.2, -0.2, 0])
    assert turn_spans([1, 1]) == [(0, 2)] and turn_spans([0, 0]) == []
    with pytest.raises(ValueError):
        arco.turn_token_advantages(3, [(0, 4)], [1.0])
    assert arco.step_kind("<think>x</think><search>q</search>") == "search"
    assert arco.step_kind("<answer>\\boxed{y}</answer>") == "finish"
    assert arco.step_kind("<think>only</think>") == "other"


# ---- the method's credit ----------------------------------------------------------------------------------------
def _traj(group: int, sample: int, reward: float, n: int, starts: list[int], advs: list[float]) -> Trajectory:
    return Trajectory("r", 2, group, sample, f"q{group}", "Q", ["a"], prompt_ids=[1], response_ids=list(range(n)),
                      loss_mask=[1] * n, rollout_logprobs=[0.0] * n, base_reward=reward, shaped_reward=reward,
                      stage_starts=starts, stage_rewards=advs)


def test_method_token_advantages_sparse_then_dense() -> None:
    from arbor.tasks.methods.arco import ARCO

    cfg = load_config("tiny-cpu", {"run.method": "arco", "arco.dense_start_step": 3})
    m = ARCO(cfg)
    a, b = _traj(0, 0, 1.0, 5, [0, 3], [0.4, -0.1]), _traj(0, 1, 0.0, 4, [0, 2], [0.2, 0.3])
    a.step = b.step = 2  # sparse: R - group mean on every token, whatever the turns carry
    sparse = m.token_advantages([a, b], [1.0, 0.0], [0, 0], cfg.train)
    assert sparse[0].tolist() == pytest.approx([0.5] * 5) and sparse[1].tolist() == pytest.approx([-0.5] * 4)
    a.step = b.step = 3  # dense: each turn's A_t on its tokens
    dense = m.token_advantages([a, b], [1.0, 0.0], [0, 0], cfg.train)
    assert dense[0].tolist() == pytest.approx([0.4, 0.4, 0.4, -0.1, -0.1])
    assert dense[1].tolist() == pytest.approx([0.2, 0.2, 0.3, 0.3])
    assert m.kl_coef_at(2, cfg.train) == 0.0 and m.kl_coef_at(3, cfg.train) == cfg.arco.kl_coef_dense


def test_phase_defaults_follow_the_run_length() -> None:
    cfg = load_config("tiny-cpu", {"run.steps": 16})
    assert cfg.arco.dense_start(16) == 7 and cfg.arco.warmup(16) == 3  # 3/8 of 16 = 6 sparse steps, half taught
    assert cfg.arco.dense_start(2) == 2


# ---- the teacher --------------------------------------------------------------------------------------------------
Q = "Where was the director of Film X born?"
SEARCH = "<think>find the director</think>\n<search>Film X director</search>"
REPEAT = "<search>Film X director</search>"
ANSWER = "<answer>\\boxed{Rema}</answer>"


def test_rules_teacher_labels_each_step(tmp_path: Path) -> None:
    judge = make_judge(JudgeConfig(backend="rules"), home=tmp_path)
    t = Trajectory("r", 1, 0, 0, "q", Q, ["Rema"], text=SEARCH + ANSWER)
    steps = [(SEARCH, "<result>Film X was directed by Ann Lee, born in Rema.</result>"),
             (REPEAT, "<result>Film X is a 1990 film.</result>"), (ANSWER, "")]
    out = asyncio.run(judge.ask(STEP_LABELS, question=Q, golds=["Rema"], trajectory=t, steps=steps, k=3))
    first, second, third = out.value
    # names 'Film X' (both entity tokens of the question: 2 x 1 - 1 = 1), new query, the result holds the gold
    assert first.scores == (1.0, 1.0, 1.0)
    assert second.scores == (1.0, -1.0, 0.0)  # a repeat; its result names the entity but not the answer
    assert third.scores == (1.0, 1.0, 1.0) and third.criteria[0] == "The answer matches Rema"
    two = asyncio.run(judge.ask(STEP_LABELS, question=Q, golds=["Rema"], trajectory=t,
                                steps=[("<think>hm</think>", "")], k=2)).value
    assert two == [StepLabel(("The step searches or answers",) * 2, (-1.0, -1.0))]  # one criterion, cycled
    assert [r["role"] for r in judge.drain_calls()] == ["step_labels", "step_labels"]


def test_parse_step_labels_pads_clamps_and_refuses_a_wrong_count() -> None:
    got = parse_step_labels('{"steps": [{"criteria": ["a"], "scores": [2.0]}, '
                            '{"criteria": ["b", "c", "d", "e"], "scores": [0.1, -3, 0.2, 0.9]}]}', 2, 3)
    assert got[0] == StepLabel(("a", "", ""), (1.0, 1.0, 1.0))  # clamped, then the last value repeated
    assert got[1] == StepLabel(("b", "c", "d"), (0.1, -1.0, 0.2))
    with pytest.raises(InvalidOutput, match="1 steps for a trajectory of 2"):
        parse_step_labels('{"steps": [{"criteria": ["a"], "scores": [0]}]}', 2, 3)
    with pytest.raises(InvalidOutput):
        parse_step_labels('{"steps": [{"criteria": ["a"], "scores": []}]}', 1, 3)


def test_openai_teacher_through_a_local_server_with_a_retried_fault(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from openai_server import FaultPlan, OpenAIServer

    monkeypatch.setenv("ARCO_TEST_KEY", "sk-arco")
    with OpenAIServer(FaultPlan(by_role={"step_labels": ["invalid"]}), api_key="sk-arco") as srv:
        cfg = JudgeConfig(backend="openai", base_url=srv.base_url, api_key_env="ARCO_TEST_KEY", model="m",
                          max_retries=2, backoff_base_s=0.001, backoff_max_s=0.01)
        judge = make_judge(cfg, home=tmp_path)
        t = Trajectory("r", 1, 0, 0, "q", Q, ["Rema"], text=SEARCH + ANSWER, base_reward=1.0)

        async def go():  # noqa: ANN202
            try:
                return await judge.ask(STEP_LABELS, question=Q, golds=["Rema"], trajectory=t,
                                       steps=[(SEARCH, "<result>x</result>"), (ANSWER, "")], k=2)
            finally:
                await judge.aclose()

        out = asyncio.run(go())
    assert out.ok and out.attempts == 2  # the invalid reply (no steps) was retried
    assert out.value == [StepLabel(("step 0 criterion 1", "step 0 criterion 2"), (-0.5, -0.5)),
                         StepLabel(("step 1 criterion 1", "step 1 criterion 2"), (0.0, 0.0))]
    [row] = judge.drain_calls()
    assert row["role"] == "step_labels" and row["attempts"] == 2 and "sk-arco" not in str(row)


# ---- learning: mu credits the step that decides the outcome -------------------------------------------------------
def test_a_tiny_rubric_model_learns_which_step_decides_the_outcome(tmp_path: Path) -> None:
    """Two-step trajectories: a search for the red or the blue door (irrelevant), then either an answer (R = 1) or
    a hesitation without one (R = 0). Trained only on sum_t s̄_t = R (45 updates of the decomposition loss), mu must
    move the credit onto the second step. A constant scorer (or a loss that ignored the steps' scores) stays at a
    weighted squared error of 0.25 per trajectory; a flipped sign drives the sums away from R."""
    from arbor.tasks.env.policy import TINY_SHAPES, build_tiny_policy
    from arbor.tasks.methods.arco.rubric_model import MuExample, RubricModelTrainer, encode_prompt

    cfg = load_config("tiny-cpu", {"run.method": "arco", "arco.criteria": "none", "arco.lr": 5e-4,
                                   "arco.head_lr": 1e-3, "arco.updates": 45})
    mu = RubricModelTrainer(cfg, build_tiny_policy(TINY_SHAPES["1.5m"], home=tmp_path), tmp_path / "mu")
    assert cfg.arco.max_prompt_tokens is None and mu.prompt_tokens == 4096 - cfg.arco.max_criteria_tokens
    tok = mu.tokenizer
    examples, outcomes, kinds = [], [], []
    for i in range(8):
        color, answers = ["red", "blue"][i // 2 % 2], i % 2 == 0
        search = f"<search>door {color}</search>"
        second = "<answer>\\boxed{the red door}</answer>" if answers else "<think>I am not sure which to pick</think>"
        p1 = encode_prompt(tok, "Which door?", "", 3, search, 3, 512)
        p2 = encode_prompt(tok, "Which door?", search + "<result>a door</result>", 2, second, 3, 512)
        examples += [MuExample(p1, [], i), MuExample(p2, [], i)]
        outcomes.append(1.0 if answers else 0.0)
        kinds.append((color, answers))
    got = mu.update_decompose(examples, outcomes, step=1)
    after = [s[0] for s in mu.score(examples)]  # criteria=none: one score per step

    def mean_step(turn: int, keep) -> float:  # noqa: ANN001
        vals = [after[2 * i + turn] for i, k in enumerate(kinds) if keep(k)]
        return sum(vals) / len(vals)

    second_gap = mean_step(1, lambda k: k[1]) - mean_step(1, lambda k: not k[1])
    first_gap = mean_step(0, lambda k: k[0] == "red") - mean_step(0, lambda k: k[0] == "blue")
    sums = [after[2 * i] + after[2 * i + 1] for i in range(8)]
    assert second_gap > 0.7, (second_gap, after)  # the deciding step carries the outcome
    assert abs(first_gap) < 0.1  # the irrelevant search does not
    assert got["decomposition"] < 0.05  # a constant scorer cannot go below 0.25
    assert max(abs(s - r) for s, r in zip(sums, outcomes, strict=True)) < 0.3
    assert got["kl"] == 0.0 and mu.version == 1  # no criteria tokens: no KL term


def test_mu_prompt_keeps_the_question_and_both_ends_of_the_step(tmp_path: Path) -> None:
    """The window is the model's context less the criteria budget; when a step prompt must be cut,
    the oldest history goes first, then the middle of the step, never the question (the old cut kept the last
    max_tokens ids, dropping the instructions and the question)."""
    from arbor.tasks.env.policy import TINY_SHAPES, build_tiny_policy, load_tokenizer
    from arbor.tasks.methods.arco.rubric_model import ELIDED, encode_prompt, prompt_window

    assert prompt_window(32768, 128) == 32640 and prompt_window(4096, 48) == 4048
    tok = load_tokenizer(build_tiny_policy(TINY_SHAPES["1.5m"], home=tmp_path))
    question = "Which river flows past the city where the bridge builder Ada Lark was born?"
    history = " ".join(f"<think>early note {i}</think>" for i in range(200)) + " <think>LATEST NOTE</think>"
    step = "<think>OPENING " + "pondering " * 300 + "</think><search>LAST QUERY</search>"
    full = encode_prompt(tok, question, history, 2, step, 3, 100_000)
    assert len(full) > 2000  # nothing cut when it fits
    # history too long: the oldest history goes, the newest stays, the step stays whole
    short_step = "<search>LAST QUERY</search>"
    ids = encode_prompt(tok, question, history, 2, short_step, 3, 600)
    text = tok.decode(ids)
    assert len(ids) <= 600 and question in text and "LATEST NOTE" in text and "early note 0<" not in text
    assert short_step in text
    # the step alone is too long: its middle goes, its opening and its action stay, with the question
    ids = encode_prompt(tok, question, history, 2, step, 3, 400)
    text = tok.decode(ids)
    assert len(ids) <= 400 and question in text and "OPENING" in text and "LAST QUERY" in text
    assert ELIDED.strip() in text and "LATEST NOTE" not in text
    with pytest.raises(ValueError, match="arco.max_prompt_tokens=64"):
        encode_prompt(tok, question * 20, history, 2, step, 3, 64)


def test_rubric_model_checkpoint_round_trip(tmp_path: Path) -> None:
    """mu's checkpoint restores its scores exactly (LoRA, head, reference, optimizer) and retention applies."""
    from arbor.tasks.env.policy import build_tiny_policy
    from arbor.tasks.methods.arco.rubric_model import MuExample, RubricModelTrainer, encode_prompt

    cfg = load_config("tiny-cpu", {"run.method": "arco", "arco.criteria": "none", "arco.lr": 1e-3})
    start = build_tiny_policy(home=tmp_path)
    mu = RubricModelTrainer(cfg, start, tmp_path / "mu")
    ex = [MuExample(encode_prompt(mu.tokenizer, "Q?", "", 3, f"<search>q{i}</search>", 3, 256), [], i)
          for i in range(4)]
    mu.update_decompose(ex, [1.0, 0.0, 1.0, 0.0], step=1)
    mu.save(1, keep_last=1)
    want = mu.score(ex)
    mu.update_decompose(ex, [1.0, 0.0, 1.0, 0.0], step=2)
    mu.save(2, keep_last=1)
    assert [p.name for p in sorted((tmp_path / "mu").iterdir())] == ["step_000002"]  # keep_last = 1
    fresh = RubricModelTrainer(cfg, start, tmp_path / "mu")
    assert fresh.load_latest() == 2 and fresh.version == 2
    fresh2 = RubricModelTrainer(cfg, start, tmp_path / "mu2")
    assert fresh2.load_latest() == 0
    torch.testing.assert_close(torch.tensor(fresh.score(ex)), torch.tensor(mu.score(ex)))
    assert want != mu.score(ex)  # the second update changed the scores


class NoTeacherJudge(RulesJudge):
    """A plug-in judge without ARCO's teacher role (``answers`` names the roles it takes)."""

    answers = frozenset({"induction", "consolidation", "pairwise", "accuracy"})


def test_preflight_refuses_a_plugin_judge_without_the_teacher_role() -> None:
    from arbor.preflight import check

    base = {"run.method": "arco", "judge.backend": "test_arco:NoTeacherJudge", "run.steps": 8}
    problems = check(load_config("tiny-cpu", base), gpu_count=0)
    assert any(p.startswith("judge.backend: test_arco:NoTeacherJudge has no step_labels role") for p in problems)
    without = check(load_config("tiny-cpu", {**base, "arco.warmup_steps": 0}), gpu_count=0)
    assert not any("step_labels" in p for p in without)  # no warm-up: no teacher needed
    rules = check(load_config("tiny-cpu", {**base, "judge.backend": "rules"}), gpu_count=0)
    assert not any("step_labels" in p for p in rules)


# ---- a failed teacher call --------------------------------------------------------------------
class TeacherFailsForSample1(RulesJudge):
    """The rules teacher, except that its call for sample 1 fails for good (what the client returns after its
    retries)."""

    async def ask(self, role, /, *, ctx=None, **fields):  # noqa: ANN001, ANN003, ANN201
        from arbor.llm.base import JudgeOutcome

        if getattr(role, "name", role) == "step_labels" and fields["trajectory"].sample == 1:
            return JudgeOutcome(None, "InvalidOutput: 1 steps for a trajectory of 2", 3, False)
        return await super().ask(role, ctx=ctx, **fields)


def _arco_step(home: Path, tiny: Path, judge_cls: type) -> tuple[dict, dict, dict]:
    """Step 1 of an ARCO run (teacher warm-up and dense phase at once) on three two-turn trajectories, through
    the real stages (score, shape, consolidate) and store: (mu_scores, turn_advantages, mu_updates) rows."""
    from types import SimpleNamespace

    from arbor.tasks.env.agent import tokenize_trajectory
    from arbor.tasks.env.policy import load_tokenizer
    from arbor.tasks.stage_store import StageStore
    from arbor.tasks.step import RunState

    cfg = load_config("tiny-cpu", {"run.method": "arco", "run.run_id": "r", "run.steps": 2, "arco.criteria": "none",
                                   "arco.warmup_steps": 1, "arco.dense_start_step": 1, "arco.warmup_updates": 1})
    tok = load_tokenizer(tiny, cfg.policy)
    trajs = []
    for i, (query, answer, R) in enumerate([("Film X director", "Rema", 1.0), ("weather today", "Bob", 0.0),
                                            ("Ann Lee", "Rema", 1.0)]):
        text = (f"<think>find it</think>\n<search>{query}</search>\n<result>\nFilm X was directed by Ann Lee, born in "
                f"Rema.\n</result>\n<answer>\\boxed{{{answer}}}</answer>")
        p, r, m = tokenize_trajectory(tok, Q, text)
        trajs.append(Trajectory("r", 1, 0, i, "q", Q, ["Rema"], prompt_ids=p, response_ids=r, loss_mask=m,
                                rollout_logprobs=[0.0] * len(r), text=text, format_valid=True, base_reward=R, f1=R))
    store = StageStore("r", home)
    store.commit(1, "rollout", {"rollouts": [t.to_row() for t in trajs]})
    state = RunState(cfg=cfg, run_id="r", home=home, store=store, questions=[], engine=None,
                     trainer=SimpleNamespace(model_path=str(tiny)), judge=judge_cls(cfg.judge, home=home),
                     embed=None)  # type: ignore[arg-type]
    with state:
        for stage in ("score", "shape", "mu_update"):
            store.commit(1, stage, state.compute(stage, 1))
    return (store.load(1, "score", ("mu_scores",))["mu_scores"],
            store.load(1, "shape", ("turn_advantages",))["turn_advantages"],
            store.load(1, "mu_update", ("mu_updates",))["mu_updates"][0])


def test_a_failed_teacher_call_changes_no_advantage_of_the_step(tmp_path: Path) -> None:
    """ARCO's advantages come from mu's own step scores; the teacher's labels only train mu. A
    teacher call that fails for good (sample 1) leaves every advantage of the group exactly as when it answered,
    is recorded as the trajectory's judge_error and gives mu's warm-up no row for that trajectory."""
    from arbor.tasks.env.policy import build_tiny_policy

    tiny = build_tiny_policy(home=tmp_path)
    ok_scores, ok_adv, ok_update = _arco_step(tmp_path / "ok", tiny, RulesJudge)
    bad_scores, bad_adv, bad_update = _arco_step(tmp_path / "bad", tiny, TeacherFailsForSample1)

    def key(r: dict) -> tuple:
        return r["traj_id"], r["turn"]

    adv = {key(r): r["advantage"] for r in ok_adv}
    assert len(adv) == 6 and {key(r): r["advantage"] for r in bad_adv} == adv  # exactly, every turn of the group
    assert [r["step_score"] for r in sorted(bad_scores, key=key)] == [r["step_score"] for r in sorted(ok_scores,
                                                                                                      key=key)]
    # dense phase: A_t = 0.5 (G_t - b_bucket), b the mean G of the bucket over the group (search_1: every first
    # turn, terminal: every answer), so each bucket's advantages add up to 0 with the failed trajectory inside
    for turn in (0, 1):
        assert sum(a for (_, t), a in adv.items() if t == turn) == pytest.approx(0.0, abs=1e-6)
    assert {r["phase"] for r in bad_adv} == {"dense"} and any(abs(a) > 1e-4 for a in adv.values())
    # the answered teacher: rules labels (1, 1, 1) for both turns (see test_rules_teacher_labels_each_step), moved
    # by lambda = -0.5 so that the two turn means add up to R = 1: (0.5, 0.5, 0.5) each
    first = next(r for r in bad_scores if r["traj_id"] == "r/1/0/0" and r["turn"] == 0)
    assert first["teacher_projected"] == pytest.approx([0.5] * 3) and first["teacher_lambda"] == pytest.approx(-0.5)
    failed = [r for r in bad_scores if r["traj_id"] == "r/1/0/1"]
    assert len(failed) == 2 and all(r["judge_error"].startswith("InvalidOutput") for r in failed)
    assert all(r["teacher_projected"] is None and r["teacher_scores"] is None for r in failed)
    assert all(r["judge_error"] is None for r in ok_scores)
    # mu's warm-up learns 6 labelled turns when the teacher answered, 4 when it failed for one trajectory of three
    assert (ok_update["phase"], ok_update["n_steps"]) == ("warmup", 6)
    assert (bad_update["phase"], bad_update["n_steps"]) == ("warmup", 4)
