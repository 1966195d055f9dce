"""Co-ReAct guided inference (tasks/methods/coreact/guidance.py, AgentLoop.place_guidance).

The agent loop is driven by a scripted engine (the model's place: generations chosen from what the context shows),
with a real tokenizer, a real BM25 index and the real rules judge writing and verifying the step rubrics.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from arbor.config import load_config
from arbor.format import check_format
from arbor.llm.rules import RulesJudge
from arbor.tasks.env.agent import (
    AgentLoop,
    Budgets,
    Generation,
    GenRequest,
    check_prefix_property,
    encode_text,
)
from arbor.tasks.env.policy import train_tokenizer
from arbor.tasks.env.search import BM25Search
from arbor.tasks.methods.coreact.guidance import (
    CoReAct,
    JudgeRubrics,
    MemoryRubrics,
    guidance_text,
    make_guide,
)
from arbor.tasks.methods.coreact.roles import STEP_VERIFY
from arbor.types import RubricItem, StepRubric

PASSAGES = [
    {"id": "p1", "title": "Tobara", "text": "Tobara is a film directed by Kerar Silix for Mulan Group."},
    {"id": "p2", "title": "Kerar Silix", "text": "Kerar Silix is a poet from Delina, born in 1950."},
]
QUESTION = "Where was the director of the film Tobara born?"


@pytest.fixture(scope="module")
def tok() -> Any:
    texts = ["<think>a</think><search>q</search>\n<result>\nDoc 1 (Title: t) x\n</result>\n",
             "Step rubric for your next step: query names searches answers Action: search for",
             "<answer>\\boxed{Delina}</answer>", QUESTION] * 20
    texts += [f"{p['title']} {p['text']}" for p in PASSAGES] * 20
    return train_tokenizer(vocab_size=700, texts=iter(texts))


@pytest.fixture(scope="module")
def search(tmp_path_factory: pytest.TempPathFactory) -> BM25Search:
    d = tmp_path_factory.mktemp("corpus")
    path = d / "corpus.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    return BM25Search(path, cache_dir=d / "bm25")


def _loop(tok: Any, search: BM25Search) -> AgentLoop:
    return AgentLoop(tok, search, Budgets(max_turns=5, max_searches=3, max_response_tokens=4000,
                                          max_context_tokens=8000, max_new_tokens_per_turn=200, top_k=1))


def _gen(tok: Any, text: str) -> Generation:
    ids = encode_text(tok, text)
    return Generation(ids, [-0.5] * len(ids), "stop")


RUBRIC = StepRubric((RubricItem(0.6, "query names: Tobara"), RubricItem(0.4, "searches")), "search for Tobara")


def test_guidance_is_loss_masked_replaced_on_retry_and_keeps_the_protocol(tok: Any, search: BM25Search) -> None:
    loop = _loop(tok, search)
    s = loop.start("q1", QUESTION, ["Delina"], seed=1)
    bare_prompt = list(s.prompt_ids)
    loop.place_guidance(s, guidance_text(RUBRIC) + " <answer>forged</answer>")
    prompt = tok.decode(s.prompt_ids).split("<|im_start|>user")[1]  # the user message
    assert "1. [0.6] query names: Tobara" in prompt and "forged" in prompt and "<answer>" not in prompt
    assert s.response_ids == [] and len(s.prompt_ids) > len(bare_prompt)
    loop.advance([s], [_gen(tok, "<think>film first</think><search>Tobara</search>")])
    obs_before = s.text
    loop.place_guidance(s, guidance_text(RUBRIC))
    loop.place_guidance(s, guidance_text(RUBRIC, ["query names: Kerar Silix"]))  # a retry replaces the first
    text = s.text
    assert text.count("Step rubric for your next step") == 1 and "did not pass: query names: Kerar Silix" in text
    assert text.index("Step rubric") < text.rindex("</result>")  # inside the observation block
    assert obs_before.split("\n<result>")[0] == text.split("\n<result>")[0]  # the policy's turn is untouched
    n_policy = sum(s.loss_mask)
    loop.advance([s], [_gen(tok, "<search>Kerar Silix</search>")])
    loop.advance([s], [_gen(tok, "<answer>\\boxed{Delina}</answer>")])
    check_prefix_property(s)
    assert sum(s.loss_mask) == n_policy + len(encode_text(tok, "<search>Kerar Silix</search>")) + len(
        encode_text(tok, "<answer>\\boxed{Delina}</answer>"))  # guidance tokens never enter the loss
    fmt = check_format(s.text, s.truncated)
    assert fmt.valid and fmt.answer == "Delina"


class ScriptedEngine:
    """The model's place in the loop: a first attempt searches the wrong thing; with the verifier's feedback in
    context it searches what the rubric asked for; after a result naming the director it answers (and, told to
    answer now, it does)."""

    def __init__(self, loop: AgentLoop, cfg: Any) -> None:
        self.loop, self.cfg, self.calls = loop, cfg, 0
        self.contexts: list[str] = []
        self.temperatures: list[float] = []

    def complete(self, requests: list[GenRequest], *, temperature: float, stop_strings: list[str]) -> list[Generation]:
        out = []
        for r in requests:
            self.calls += 1
            self.temperatures.append(temperature)
            ctx = self.loop.tokenizer.decode(r.context_ids)
            self.contexts.append(ctx)
            if "Answer now" in ctx:
                text = "<answer>\\boxed{Kerar Silix}</answer>"
            elif "Kerar Silix is a poet" in ctx:
                text = "<answer>\\boxed{Delina}</answer>"
            elif "directed by Kerar Silix" in ctx:
                text = "<search>Kerar Silix</search>"
            elif "did not pass" in ctx:
                text = "<search>Tobara</search>"
            else:
                text = "<search>weather today</search>"
            out.append(_gen(self.loop.tokenizer, text))
        return out


def test_coreact_verifies_retries_and_records_every_guided_step(tok: Any, search: BM25Search,
                                                                 tmp_path: Path) -> None:
    cfg = load_config("tiny-cpu", {"guidance.mode": "co-react"})
    judge = RulesJudge(cfg.judge, home=tmp_path)
    loop = _loop(tok, search)
    engine = ScriptedEngine(loop, cfg)
    guide = CoReAct(cfg.guidance, JudgeRubrics(judge, 3), judge)
    guide.columns = {"run_id": "r", "step": 0}
    s = loop.start("q1", QUESTION, ["Delina"], seed=3)
    guide.run(engine, [s], [(0, 0)])
    rows = guide.drain_records()
    assert [r["turn"] for r in rows] == [0, 1, 2]
    first = rows[0]
    assert "query names: Tobara" in first["rubric"] and first["action"] == "<search>weather today</search>"
    assert first["passed"] is False and first["retried"] is True
    assert first["retry_action"] == "<search>Tobara</search>" and first["retry_passed"] is True
    assert rows[1]["passed"] is True and rows[1]["retried"] is False  # the rubric asked for the director's name
    assert s.search_queries == ["Tobara", "Kerar Silix"]  # the failed action never ran
    assert "weather" not in s.text and check_format(s.text, s.truncated).valid
    assert engine.calls == 4  # three turns and one retry
    # §3.3: only tool calls are verified; the proposed answer (turn 2) is the answer step
    assert rows[2]["rubric"] and rows[2]["action"].startswith("<answer>")
    assert rows[2]["verify_score"] is None and rows[2]["passed"] is None and not rows[2]["retried"]
    roles = [c["role"] for c in judge.drain_calls()]
    assert roles.count("step_rubric") == 3 and roles.count("step_verify") == 3
    assert guide.drain_records() == []
    assert set(engine.temperatures) == {cfg.rollout.temperature}  # outside guided inference: the rollout's sampling
    # arbor's earlier variant: every turn, the answer included, is verified
    every = load_config("tiny-cpu", {"guidance.mode": "co-react", "guidance.steps": "every"})
    guide = CoReAct(every.guidance, JudgeRubrics(judge, 3), judge)
    s = loop.start("q1", QUESTION, ["Delina"], seed=3)
    guide.run(ScriptedEngine(loop, every), [s], [(0, 0)])
    rows = guide.drain_records()
    assert rows[2]["action"].startswith("<answer>") and rows[2]["verify_score"] is not None
    assert [c["role"] for c in judge.drain_calls()].count("step_verify") == 4


class FeedbackJudge(RulesJudge):
    """The rules judge whose verifier writes its own feedback sentence."""

    async def ask(self, role, /, *, ctx=None, **fields):  # noqa: ANN001, ANN003, ANN201
        from dataclasses import replace

        out = await super().ask(role, ctx=ctx, **fields)
        if getattr(role, "name", role) != "step_verify":
            return out
        note = "The query must name the film Tobara." if out.value and not all(out.value.satisfied) else ""
        return replace(out, value=replace(out.value, feedback=note)) if out.value else out


@pytest.mark.parametrize("mode", ["verifier", "items"])
def test_the_verifiers_written_feedback_reaches_the_retry(tok: Any, search: BM25Search, tmp_path: Path,
                                                          mode: str) -> None:
    """§3.3: the retry re-plans with the verifier's per-criterion feedback pinned in context: the
    retry reads the unmet items and the verifier's own sentence; retry_feedback=items keeps the names only."""
    cfg = load_config("tiny-cpu", {"guidance.mode": "co-react", "guidance.retry_feedback": mode})
    judge = FeedbackJudge(cfg.judge, home=tmp_path)
    loop = _loop(tok, search)
    engine = ScriptedEngine(loop, cfg)
    s = loop.start("q1", QUESTION, ["Delina"], seed=3)
    make_guide(cfg, judge).run(engine, [s], [(0, 0)])  # type: ignore[union-attr]
    retry = engine.contexts[1]  # the re-plan of turn 0
    assert "did not pass: query names: Tobara" in retry
    assert ("Verifier's feedback: The query must name the film Tobara." in retry) == (mode == "verifier")
    assert s.search_queries[0] == "Tobara"


def test_guidance_text_carries_the_verifier_sentence() -> None:
    assert guidance_text(RUBRIC, ["searches"], "Search for  the film\n") .endswith(
        "did not pass: searches. Verifier's feedback: Search for the film. Revise it.")
    assert guidance_text(RUBRIC, [], "No search.").endswith("did not pass. Verifier's feedback: No search. Revise it.")
    assert "did not pass" not in guidance_text(RUBRIC, [], "")


def test_the_answer_step_gets_no_rubric(tok: Any, search: BM25Search, tmp_path: Path) -> None:
    """§3.3: inject and verify at each tool-calling step: once no search can run (the search
    budget is spent) the remaining turns are the answer step: no rubric is written or placed there."""
    cfg = load_config("tiny-cpu", {"guidance.mode": "co-react"})
    judge = RulesJudge(cfg.judge, home=tmp_path)
    loop = AgentLoop(tok, search, Budgets(max_turns=5, max_searches=1, max_response_tokens=4000,
                                          max_context_tokens=8000, max_new_tokens_per_turn=200, top_k=1))
    guide = make_guide(cfg, judge)
    s = loop.start("q1", QUESTION, ["Delina"], seed=3)
    guide.run(ScriptedEngine(loop, cfg), [s], [(0, 0)])  # type: ignore[union-attr]
    rows = guide.drain_records()  # type: ignore[union-attr]
    assert s.search_queries == ["Tobara"] and s.forced_final == 1 and s.finish_reason == "answer"
    assert [r["rubric"] is not None for r in rows] == [True, False, False]
    assert all(r["rubric_error"] is None and r["passed"] is None for r in rows[1:])
    assert [c["role"] for c in judge.drain_calls()].count("step_rubric") == 1
    assert "Step rubric" not in s.text  # turn 0's rubric is in the prompt; none after the search budget is spent


def test_rubric_tokens_do_not_count_against_the_response_budget(tok: Any, search: BM25Search) -> None:
    """Guidance placed in an observation takes context, not the agent's response budget (a long
    rubric used to end the trajectory as a truncation); a retry's guidance replaces the first, not adds to it."""
    budgets = Budgets(max_turns=5, max_searches=3, max_response_tokens=120, max_context_tokens=8000,
                      max_new_tokens_per_turn=200, top_k=1)
    loop = AgentLoop(tok, search, budgets)
    plain, guided = (loop.start("q1", QUESTION, ["Delina"], seed=1) for _ in range(2))
    for st in (plain, guided):
        loop.advance([st], [_gen(tok, "<search>Tobara</search>")])
    long = StepRubric(tuple(RubricItem(0.1, f"query names: Kerar Silix {i}") for i in range(10)))
    loop.place_guidance(guided, guidance_text(long))
    n_long = guided.guidance_tokens
    assert n_long > budgets.max_response_tokens - len(plain.response_ids)  # more than the room left
    assert not guided.done and guided.trajectory_tokens == len(plain.response_ids)
    assert loop.next_request(guided).max_new_tokens == loop.next_request(plain).max_new_tokens
    loop.place_guidance(guided, guidance_text(RUBRIC, ["query names: Tobara"]))  # the retry's
    assert 0 < guided.guidance_tokens < n_long and guided.trajectory_tokens == len(plain.response_ids)
    loop.advance([guided], [_gen(tok, "<search>Kerar Silix</search>")])
    check_prefix_property(guided)
    assert guided.trajectory_tokens == len(guided.response_ids) - guided.guidance_tokens


def test_inject_only_never_verifies(tok: Any, search: BM25Search, tmp_path: Path) -> None:
    cfg = load_config("tiny-cpu", {"guidance.mode": "co-react", "guidance.verify": False})
    judge = RulesJudge(cfg.judge, home=tmp_path)
    loop = _loop(tok, search)
    guide = make_guide(cfg, judge)
    assert guide is not None and guide.judge is None
    s = loop.start("q1", QUESTION, ["Delina"], seed=3)
    guide.run(ScriptedEngine(loop, cfg), [s], [(0, 0)])
    rows = guide.drain_records()
    assert all(r["passed"] is None and not r["retried"] for r in rows)
    assert s.search_queries[0] == "weather today"  # nothing caught the off-target search
    assert {c["role"] for c in judge.drain_calls()} == {"step_rubric"}


def test_memory_rubrics_weight_by_rho_and_retrieve_by_words() -> None:
    pool = {"rubrics": [
        {"title": "Names the entity", "description": "The query names the film of the question", "rho_r": 0.6},
        {"title": "Short answer", "description": "The answer is a short name", "rho_r": 0.2},
        {"title": "No repeats", "description": "No query repeats an earlier one", "rho_r": None},
    ]}
    top = MemoryRubrics(pool, "top", 2).write([], [])
    assert top == []
    from arbor.tasks.methods.coreact.guidance import BranchPoint

    (r, err), = MemoryRubrics(pool, "top", 2).write([BranchPoint("q", "", 0)], [0])
    assert err is None and [it.condition for it in r.items] == ["The query names the film of the question",
                                                                 "The answer is a short name"]
    assert [it.weight for it in r.items] == [0.75, 0.25]  # 0.6 / 0.8, 0.2 / 0.8
    (r2, _), = MemoryRubrics(pool, "retrieve", 1).write([BranchPoint("Which answer?", "repeats an earlier query", 1)],
                                                        [0])
    assert r2.items[0].condition == "No query repeats an earlier one" and r2.items[0].weight == 1.0
    with pytest.raises(ValueError, match="no rubrics"):
        MemoryRubrics({"rubrics": []}, "top", 2)


def test_the_trajectory_budget_hands_the_agent_over_to_the_answer_step(tok: Any, search: BM25Search,
                                                                        tmp_path: Path) -> None:
    """App. A: each search trajectory is cut at 6,000 tokens before the answer: inside guided
    inference, once the trajectory (rubrics not counted) reaches guidance.trajectory_tokens, the results that reach
    it carry the order to answer, no further rubric is written and the next step answers; the loop's own budgets
    come back after the block."""
    from arbor.tasks.methods.coreact.guidance import guided_inference

    action = len(encode_text(tok, "<search>Tobara</search>"))
    cfg = load_config("tiny-cpu", {"guidance.mode": "co-react", "guidance.trajectory_tokens": action + 1})
    judge = RulesJudge(cfg.judge, home=tmp_path)
    loop = _loop(tok, search)
    engine = ScriptedEngine(loop, cfg)
    guide = make_guide(cfg, judge)
    s = loop.start("q1", QUESTION, ["Delina"], seed=3)
    with guided_inference(engine, cfg.guidance) as temperature:
        assert temperature == 0.0 and loop.budgets.max_trajectory_tokens == action + 1
        guide.run(engine, [s], [(0, 0)])  # type: ignore[union-attr]
    assert loop.budgets.max_trajectory_tokens is None  # restored
    rows = guide.drain_records()  # type: ignore[union-attr]
    assert s.search_queries == ["Tobara"] and s.finish_reason == "answer" and len(s.turns) == 2
    block = s.text.split("</result>")[0]
    assert "directed by Kerar Silix" in block and "Answer now" in block  # the hand-over, inside the results block
    assert [r["rubric"] is not None for r in rows] == [True, False]
    assert check_format(s.text, s.truncated).valid
    # without the budget the same agent searches on
    s2 = loop.start("q1", QUESTION, ["Delina"], seed=3)
    guide.run(ScriptedEngine(loop, cfg), [s2], [(0, 0)])  # type: ignore[union-attr]
    assert s2.search_queries == ["Tobara", "Kerar Silix"]


def test_a_search_past_the_trajectory_budget_does_not_run(tok: Any, search: BM25Search) -> None:
    """A turn that itself takes the trajectory past the budget is the answer step: its search gets the forced
    message, not results."""
    import dataclasses

    loop = _loop(tok, search)
    loop.budgets = dataclasses.replace(loop.budgets, max_trajectory_tokens=3)
    s = loop.start("q1", QUESTION, ["Delina"], seed=3)
    assert loop.may_search(s)
    loop.advance([s], [_gen(tok, "<think>the film</think><search>Tobara</search>")])
    assert s.search_queries == [] and s.forced_final == 1 and not loop.may_search(s)


class RecordingEngine:
    """An engine without a model: records, for each pass of an evaluation, whether it was guided, the agent's
    temperature and the trajectory budget it ran under (no questions: nothing to judge)."""

    def __init__(self, cfg: Any, loop: AgentLoop) -> None:
        self.cfg, self.loop, self.guide, self.passes = cfg, loop, None, []

    def generate_groups(self, questions: Any, k: int, seed: int, step: int, run_id: str) -> list:
        self.passes.append((self.guide is not None, self.cfg.rollout.temperature,
                            self.loop.budgets.max_trajectory_tokens))
        return []


@pytest.mark.parametrize("overrides, expected", [
    ({}, (0.0, 6000)),  # the paper's: greedy agent, 6,000-token trajectories, in both arms of the comparison
    ({"guidance.agent_temperature": None, "guidance.trajectory_tokens": None}, (0.3, None)),  # arbor's sampling
])
def test_guided_evaluation_runs_the_papers_inference_protocol(tok: Any, search: BM25Search, tmp_path: Path,
                                                              overrides: dict, expected: tuple) -> None:
    """§4.1, App. A (the search agent decodes greedily; trajectories are cut at 6,000 tokens):
    ``arbor eval`` with guidance answers both passes greedily under the trajectory budget by default; an unguided
    evaluation and the engine afterwards keep their own settings."""
    from arbor.tasks.reporting.evaluate import evaluate_questions

    cfg = load_config("tiny-cpu", {"guidance.mode": "co-react", **overrides})
    judge = RulesJudge(cfg.judge, home=tmp_path)
    engine = RecordingEngine(cfg, _loop(tok, search))
    guide = make_guide(cfg, judge)
    evaluate_questions(engine, judge, {"s": []}, runs=1, seed=0, run_id="r", step=0, checkpoint=None,
                       temperature=0.3, guide=guide, guidance="co-react:judge")
    assert engine.passes == [(False, *expected), (True, *expected)]
    assert engine.loop.budgets.max_trajectory_tokens is None and engine.cfg.rollout.temperature == 0.7
    engine.passes = []
    evaluate_questions(engine, judge, {"s": []}, runs=1, seed=0, run_id="r", step=0, checkpoint=None,
                       temperature=0.3)
    assert engine.passes == [(False, 0.3, None)]  # no guidance: eval.temperature, the rollout budgets


def test_guidance_defaults_are_the_papers_and_bad_settings_name_their_key() -> None:
    """J = 3 rank judges of three vendors, each with its own endpoint and key variable, a point
    kept with 2 valid rankings; tool-step guidance, the verifier's feedback, a 6,000-token trajectory budget and a
    greedy agent by default. A setting that cannot work names its key (and never echoes a key)."""
    from arbor.config import ConfigError

    g = load_config("tiny-cpu").guidance
    assert len(g.rank_judges) == 3 and g.min_rankings == 2
    assert len({j.model for j in g.rank_judges}) == len({j.base_url for j in g.rank_judges}) == 3
    assert [j.api_key_env for j in g.rank_judges] == ["ANTHROPIC_API_KEY", "GEMINI_API_KEY", "OPENAI_API_KEY"]
    assert all(j.rationale for j in g.rank_judges)
    assert (g.steps, g.retry_feedback, g.trajectory_tokens, g.agent_temperature) == ("tool", "verifier", 6000, 0.0)
    with pytest.raises(ConfigError, match="guidance.min_rankings"):
        load_config("tiny-cpu", {"guidance.rank_judges": [{}], "guidance.min_rankings": 2})
    with pytest.raises(ConfigError, match="guidance.rank_judges"):
        load_config("tiny-cpu", {"guidance.rank_judges": []})
    with pytest.raises(ConfigError, match=r"guidance\.rank_judges\.1\.api_key_env: must name") as err:
        load_config("tiny-cpu", {"guidance.rank_judges": [{}, {"api_key_env": "sk-live-0123456789"}]})
    assert "sk-live" not in str(err.value)
    with pytest.raises(ConfigError, match="guidance.rank_judges.0.modle"):
        load_config("tiny-cpu", {"guidance.rank_judges": [{"modle": "x"}]})
    # a stored config of the earlier shape (model names on the judge's endpoint) reads as that council
    from arbor.config.guidance import GuidanceConfig

    old = GuidanceConfig.model_validate({"rank_models": ["m1", "m2"], "min_rankings": 2})
    assert [j.model for j in old.rank_judges] == [None, "m1", "m2"] and old.min_rankings == 2
    assert GuidanceConfig.model_validate({"rank_models": []}).min_rankings == 1  # the earlier cap


def test_rank_council_gives_each_judge_its_own_endpoint_and_key(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Each council member is its own judge: the rank_actions role with the entry's model,
    base_url and key variable (the other roles untouched); offline three rules judges; a missing key variable
    stops the run naming the entry's key; the key itself never enters the config or the judge's ledger."""
    from arbor.flows.guidance import rank_council
    from arbor.llm.openai_backend import JudgeSetupError, OpenAIJudge
    from arbor.tasks.methods.coreact.council import rank_judge_names

    tiny = load_config("tiny-cpu")
    offline = rank_council(tiny.guidance, tiny.judge, tmp_path)
    assert [n for n, _, _ in offline] == ["rules-1", "rules-2", "rules-3"]
    assert all(isinstance(j, RulesJudge) and why for _, j, why in offline)
    cfg = load_config("tiny-cpu", {"judge.backend": "openai", "judge.base_url": "http://127.0.0.1:9/v1",
                                   "judge.api_key_env": "MAIN_KEY"})
    assert rank_judge_names(cfg.guidance, cfg.judge) == ["claude-sonnet-4-5", "gemini-2.5-pro", "gpt-5"]
    for env in ("MAIN_KEY", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.setenv(env, f"sk-secret-{env}")
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    with pytest.raises(JudgeSetupError, match=r"guidance\.rank_judges\.1\.api_key_env: .*'GEMINI_API_KEY'"):
        rank_council(cfg.guidance, cfg.judge, tmp_path)
    monkeypatch.setenv("GEMINI_API_KEY", "sk-secret-GEMINI")
    council = rank_council(cfg.guidance, cfg.judge, tmp_path)
    assert all(isinstance(j, OpenAIJudge) for _, j, _ in council)
    roles = [j.cfg.for_role("rank_actions") for _, j, _ in council]
    assert [(r["model"], r["base_url"], r["api_key_env"]) for r in roles] == [
        (e.model, e.base_url, e.api_key_env) for e in cfg.guidance.rank_judges]
    assert roles[2]["temperature"] == 1.0 and roles[0]["temperature"] == 0.0
    assert all(j.cfg.for_role("pairwise")["base_url"] == "http://127.0.0.1:9/v1" for _, j, _ in council)
    assert "sk-secret" not in cfg.to_json() and "sk-secret" not in str([j.cfg for _, j, _ in council])
    clash = load_config("tiny-cpu", {"judge.backend": "openai", "guidance.rank_judges": [{}, {}]})
    with pytest.raises(ValueError, match="guidance.rank_judges: more than one judge would be stored as"):
        rank_judge_names(clash.guidance, clash.judge)


def test_guidance_train_refuses_a_missing_council_key_before_the_run_exists(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A council member's unset key variable or dead endpoint stops `arbor guidance-train` before anything runs,
    naming the member's key, and leaves no run row behind (a later run with the key set starts fresh)."""
    import socket

    from typer.testing import CliRunner

    from arbor.cli import app
    from arbor.preflight.judges import council_problems
    from arbor.storage.runs import run_row

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    council = f"[{{model: a, api_key_env: A_KEY, base_url: '{dead}'}}, {{model: b, api_key_env: B_KEY}}]"
    sets = {"judge.backend": "openai", "judge.base_url": dead, "judge.api_key_env": "MAIN_KEY",
            "guidance.rank_judges": council}
    cfg = load_config("tiny-world", sets)
    keys = {"MAIN_KEY": "k", "A_KEY": "k"}
    problems = council_problems(cfg.guidance, cfg.judge, keys)
    assert [p.split(":")[0] for p in problems] == ["guidance.rank_judges.1.api_key_env",
                                                   "guidance.rank_judges.0.base_url"]  # one line per dead URL
    assert "'B_KEY' is not set (the key of rank judge 'b'" in problems[0]
    bad_port = load_config("tiny-world", {**sets, "judge.base_url": "http://127.0.0.1:99999/v1"})
    assert council_problems(bad_port.guidance, bad_port.judge, {**keys, "B_KEY": "k"})[0].startswith(
        "guidance.rank_judges.0.base_url")
    offline = load_config("tiny-world")
    assert council_problems(offline.guidance, offline.judge, {}) == []  # the offline rules council needs nothing

    monkeypatch.setenv("ARBOR_HOME", str(tmp_path / "home"))
    for var, value in keys.items():
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("B_KEY", raising=False)
    args = ["guidance-train", "-p", "tiny-world", "--run-id", "council"]
    out = CliRunner().invoke(app, [*args, *(x for k, v in sets.items() for x in ("--set", f"{k}={v}"))])
    assert out.exit_code != 0
    assert "guidance.rank_judges.1.api_key_env" in out.output and "B_KEY" in out.output
    assert "guidance.rank_judges.0.base_url" in out.output
    assert run_row("council", tmp_path / "home") is None


def test_make_guide_names_the_missing_key(tmp_path: Path) -> None:
    assert make_guide(load_config("tiny-cpu"), None) is None
    with pytest.raises(ValueError, match="guidance.memory_pool"):
        make_guide(load_config("tiny-cpu", {"guidance.mode": "co-react", "guidance.source": "memory"}), None)
    with pytest.raises(ValueError, match="guidance.generator"):
        make_guide(load_config("tiny-cpu", {"guidance.mode": "co-react", "guidance.source": "generator"}), None)


def test_preflight_names_a_missing_source_and_a_judge_without_the_roles(tmp_path: Path) -> None:
    from arbor.preflight.judges import guidance_problems

    cfg = load_config("tiny-cpu", {"guidance.mode": "co-react", "guidance.source": "memory",
                                   "guidance.memory_pool": str(tmp_path / "nope.json")})
    assert [p.split(":")[0] for p in guidance_problems(cfg.guidance, cfg.judge)] == ["guidance.memory_pool"]
    cfg = load_config("tiny-cpu", {"guidance.mode": "co-react", "judge.backend": "test_guidance:NoStepJudge"})
    problems = guidance_problems(cfg.guidance, cfg.judge)
    assert len(problems) == 2 and "no step_rubric role" in problems[0] and "no step_verify role" in problems[1]
    cfg = load_config("tiny-cpu", {"guidance.mode": "co-react", "guidance.verify": False,
                                   "judge.backend": "test_guidance:NoStepJudge"})
    assert len(guidance_problems(cfg.guidance, cfg.judge)) == 1  # inject-only needs no verifier
    off = load_config("tiny-cpu", {"judge.backend": "test_guidance:NoStepJudge"})
    assert guidance_problems(off.guidance, off.judge) == []


class NoStepJudge(RulesJudge):
    """A plug-in judge without Co-ReAct's roles (``Judge.answers`` names the roles it plays; ``ask`` refuses
    the others)."""

    answers = frozenset({"induction", "consolidation", "pairwise", "accuracy"})


# ---- a rubric or verification call that fails for good ------------------------------------------
class VerifierDown(RulesJudge):
    """The rules rubric writer; every verification fails past the client's retries."""

    async def ask(self, role, /, *, ctx=None, **fields):  # noqa: ANN001, ANN003, ANN201
        from arbor.llm.base import JudgeOutcome

        if getattr(role, "name", role) == "step_verify":
            return JudgeOutcome(None, "RateLimitError", 3, False)
        return await super().ask(role, ctx=ctx, **fields)


class WriterDown(RulesJudge):
    """The rules verifier; every step rubric fails past the client's retries."""

    async def ask(self, role, /, *, ctx=None, **fields):  # noqa: ANN001, ANN003, ANN201
        from arbor.llm.base import JudgeOutcome

        if getattr(role, "name", role) == "step_rubric":
            return JudgeOutcome(None, "InvalidOutput: no rubric items", 3, False)
        return await super().ask(role, ctx=ctx, **fields)


def _guided(tok: Any, search: BM25Search, tmp_path: Path, judge_cls: type, **overrides: Any) -> tuple:
    cfg = load_config("tiny-cpu", {"guidance.mode": "co-react", **overrides})
    judge = judge_cls(cfg.judge, home=tmp_path)
    loop = _loop(tok, search)
    engine = ScriptedEngine(loop, cfg)
    guide = make_guide(cfg, judge)
    s = loop.start("q1", QUESTION, ["Delina"], seed=3)
    guide.run(engine, [s], [(0, 0)])
    return s, guide.drain_records(), engine.calls, [c["role"] for c in judge.drain_calls()]


def test_a_failed_verification_or_rubric_leaves_the_step_as_unverified_or_unguided(
        tok: Any, search: BM25Search, tmp_path: Path) -> None:
    """A verification that fails for good is no rejection: the proposed action stands, with no
    retry, exactly as under inject-only guidance, and the step is recorded as unverified (passed None, the error).
    A rubric call that fails for good leaves the step unguided: nothing is placed or verified, and the answer is
    the unguided policy's, token for token."""
    # the working verifier rejects the off-target first search (score 0.4 <= tau) and the retry replaces it
    _, ok_rows, _, _ = _guided(tok, search, tmp_path / "ok", RulesJudge)
    assert ok_rows[0]["passed"] is False and ok_rows[0]["retried"] is True
    down, rows, calls, roles = _guided(tok, search, tmp_path / "down", VerifierDown)
    inject, _, inject_calls, _ = _guided(tok, search, tmp_path / "inject", RulesJudge, **{"guidance.verify": False})
    assert down.text == inject.text and down.response_ids == inject.response_ids
    assert down.search_queries[0] == "weather today" and calls == inject_calls == len(rows)  # no retry turn
    assert all(r["passed"] is None and r["verify_score"] is None and not r["retried"] for r in rows)
    # every search proposed while searches remained met the failing verifier; once the three searches are spent
    # the turns are the answer step: no rubric, nothing verified
    assert [(bool(r["rubric"]), r["verify_error"]) for r in rows] == [(True, "RateLimitError")] * 3 + [
        (False, None)] * 2
    assert rows[-1]["action"].startswith("<answer>")
    assert roles.count("step_rubric") == 3
    # a rubric writer that fails: the unguided policy's trajectory, no verification call
    unguided_loop = _loop(tok, search)
    engine = ScriptedEngine(unguided_loop, load_config("tiny-cpu"))
    bare = unguided_loop.start("q1", QUESTION, ["Delina"], seed=3)
    while not bare.done:
        unguided_loop.advance([bare], engine.complete([unguided_loop.next_request(bare)], temperature=1.0,
                                                      stop_strings=unguided_loop.stop_strings))
    no_rubric, rows, calls, roles = _guided(tok, search, tmp_path / "writer", WriterDown)
    assert no_rubric.text == bare.text and no_rubric.prompt_ids == bare.prompt_ids
    assert no_rubric.response_ids == bare.response_ids and "Step rubric" not in no_rubric.text
    assert all(r["rubric"] is None and r["passed"] is None and not r["retried"] and r["verify_error"] is None
               for r in rows)
    errors = [r["rubric_error"] for r in rows]  # the tool-calling steps' failed calls, then the answer step's none
    k = sum(e is not None for e in errors)
    assert k >= 1 and all(e.startswith("InvalidOutput") for e in errors[:k]) and errors[k:] == [None] * (len(rows) - k)
    assert "step_verify" not in roles and calls == engine.calls == len(rows)


# ---- the prefix h_t, and where the generator's branching points lie -------------------------
def _long_state(tok: Any, search: BM25Search) -> tuple[AgentLoop, Any]:
    """A trajectory whose first query lies more than 4,000 characters before its end (a long reasoning turn)."""
    loop = AgentLoop(tok, search, Budgets(max_turns=5, max_searches=3, max_response_tokens=20000,
                                          max_context_tokens=40000, max_new_tokens_per_turn=8000, top_k=1))
    s = loop.start("q1", QUESTION, ["Delina"], seed=1)
    loop.advance([s], [_gen(tok, "<think>find the film first</think><search>Tobara</search>")])
    loop.advance([s], [_gen(tok, "<think>" + "the result names the director. " * 150 + "</think>"
                                 "<search>Kerar Silix</search>")])
    return loop, s


def test_the_writer_and_verifier_read_the_whole_prefix(tok: Any, search: BM25Search, tmp_path: Path) -> None:
    """Co-ReAct §3.1-3.3: the rubric, the verifier and the ranking condition on the whole prefix
    h_t: by default (the paper's) a branching point carries all of the history, so a query made long ago is still
    judgeable as a repeat; arbor's bound (a number) compacts the prefix and keeps every query, where the old
    4,000-character tail cut dropped the first one."""
    import asyncio

    from arbor.config.guidance import GuidanceConfig
    from arbor.tasks.methods.coreact.guidance import branch_point, strip_guidance

    assert GuidanceConfig().max_history_chars is None
    assert load_config("qwen3-8b-coreact").guidance.max_history_chars is None
    loop, s = _long_state(tok, search)
    full = strip_guidance(s.text, loop.protocol.result_close)
    assert len(full) > 4000 and "<search>Tobara</search>" not in full[-4000:]  # what the tail cut lost
    whole = branch_point(s, GuidanceConfig().max_history_chars, loop.protocol.result_close)
    assert whole.history == full and whole.tool_calls == 2
    judge = RulesJudge(load_config("tiny-cpu").judge, home=tmp_path)
    rubric = StepRubric((RubricItem(1.0, "query is new"),))
    out = asyncio.run(judge.ask(STEP_VERIFY, question=QUESTION, history=whole.history, action="<search>Tobara</search>", rubric=rubric))
    assert out.value is not None and out.value.satisfied == (False,)  # the repeat is seen
    bounded = branch_point(s, 1000, loop.protocol.result_close)
    assert len(bounded.history) <= 1100 and "elided" in bounded.history
    assert "<search>Tobara</search>" in bounded.history and "<search>Kerar Silix</search>" in bounded.history


class _BranchEngine:
    """The policy's place for ``collect_branch_points``: one stored trajectory, and candidates drawn in turn from
    a fixed list (distinct, so every slate fills)."""

    CANDIDATES = ["<search>Tobara film director</search>", "<search>Kerar Silix birthplace</search>",
                  "<answer>\\boxed{Delina}</answer>", "<search>Delina poet</search>"]

    def __init__(self, loop: AgentLoop, state: Any) -> None:
        self.loop, self.tokenizer, self.state, self.n = loop, loop.tokenizer, state, 0

    def generate_groups(self, questions: Any, k: int, seed: int, step: int, run_id: str = "") -> list[Any]:
        from types import SimpleNamespace

        s = self.state
        return [SimpleNamespace(prompt_ids=s.prompt_ids, response_ids=s.response_ids, loss_mask=s.loss_mask)]

    def complete(self, requests: list[GenRequest], *, temperature: float, stop_strings: list[str]) -> list[Generation]:
        out = []
        for _ in requests:
            out.append(_gen(self.tokenizer, self.CANDIDATES[self.n % len(self.CANDIDATES)]))
            self.n += 1
        return out


def test_branching_points_are_the_tool_calling_steps_with_the_whole_prefix(tok: Any, search: BM25Search) -> None:
    """§3.1: "at every tool-calling step t"; App. A discards points that already emitted the
    answer: the policy's trajectory searches twice and answers; its two search turns are branching points and its
    answering turn is not (``guidance.branch_steps=every``, arbor's earlier, keeps all three). Each point stores the
    whole prefix h_t (item 4)."""
    from types import SimpleNamespace

    from arbor.tasks.methods.coreact.generator import collect_branch_points, tool_calling_step

    loop, s = _long_state(tok, search)
    loop.advance([s], [_gen(tok, "<answer>\\boxed{Delina}</answer>")])
    assert s.done and len(s.turns) == 3
    q = SimpleNamespace(question_id="q1", question=QUESTION, golds=["Delina"])
    over = {"guidance.branch_temperatures": [0.7], "guidance.branch_samples": 4, "guidance.slate_k": 3}
    cfg = load_config("tiny-cpu", over)
    assert cfg.guidance.branch_steps == "tool" and load_config("qwen3-8b-coreact").guidance.branch_steps == "tool"
    rows = collect_branch_points(_BranchEngine(loop, s), [q], cfg.guidance, run_id="g", seed=0)
    assert [r["turn"] for r in rows] == [0, 1] and [r["tool_calls"] for r in rows] == [0, 1]
    assert all(len(r["candidates"]) == 3 for r in rows)
    assert rows[1]["history"].startswith("<think>find the film first</think><search>Tobara</search>")
    assert len(rows[1]["history"]) < 4000 < len(tok.decode(s.response_ids[:len(s.response_ids)]))
    every = load_config("tiny-cpu", {**over, "guidance.branch_steps": "every"})
    rows = collect_branch_points(_BranchEngine(loop, s), [q], every.guidance, run_id="g", seed=0)
    assert [r["turn"] for r in rows] == [0, 1, 2]
    assert "<search>Tobara</search>" in rows[2]["history"] and len(rows[2]["history"]) > 4000  # no tail cut
    # a search the loop would turn into the forced answer (no search left) is no tool-calling step either
    assert tool_calling_step(loop, "<search>x</search>", 0) and not tool_calling_step(loop, "<search>x</search>", 3)
    assert not tool_calling_step(loop, "<answer>\\boxed{x}</answer>", 0) and not tool_calling_step(loop, "no tag", 0)


# ---- an SFT start that has read guidance ------------------------------------------------------------
GOLD = ["<think>film first</think><search>Tobara</search>",
        "<think>now the director</think><search>Kerar Silix</search>",
        "<think>found it</think><answer>\\boxed{Delina}</answer>"]


class _GoldEngine:
    """Plays the gold actions in turn order; with ``repeat``, a turn after the first proposes the previous turn's
    action again, and the gold action once the verifier's feedback is in the last observation (§3.3's retry)."""

    def __init__(self, loop: AgentLoop, repeat: bool, cfg: Any = None) -> None:
        self.loop, self.repeat, self.cfg = loop, repeat, cfg

    def complete(self, requests: list[GenRequest], *, temperature: float, stop_strings: list[str]) -> list[Generation]:
        out = []
        for r in requests:
            ctx = self.loop.tokenizer.decode(r.context_ids)
            j = ctx.count("(Title:")  # results seen (the system prompt names the tags too)
            retried = "did not pass" in ctx[ctx.rfind("(Title:"):] if j else False
            out.append(_gen(self.loop.tokenizer, GOLD[j - 1] if self.repeat and j and not retried else GOLD[j]))
        return out


@pytest.mark.parametrize("retry", [False, True], ids=["inject", "retry"])
def test_a_guided_sft_row_is_what_guided_inference_shows_the_policy(tok: Any, search: BM25Search, tmp_path: Path,
                                                                     retry: bool) -> None:
    """``sft.guided`` (tasks/methods/coreact/sft.py): a gold row's guided copy tokenises, prompt, response and loss
    mask, exactly as the state Co-ReAct's guide builds when the policy plays the same gold actions under the rules
    writer: the rubric after the question, then inside each observation before its closing tag; with the retry
    form, the rubric with the unmet items and the verifier's feedback of a first attempt that repeated the previous
    turn. The writer reads the question without the guidance placed after it."""
    import random

    from arbor.format import ARBOR
    from arbor.tasks.env.agent import tokenize_trajectory
    from arbor.tasks.methods.coreact.sft import guided_copy

    loop = _loop(tok, search)
    bare = loop.start("q1", QUESTION, ["Delina"], seed=3)
    plain = _GoldEngine(loop, repeat=False)
    while not bare.done:
        loop.advance([bare], plain.complete([loop.next_request(bare)], temperature=0.0, stop_strings=[]))
    gold = bare.text
    cfg = load_config("tiny-cpu", {"guidance.mode": "co-react", "guidance.verify": retry})
    guide = make_guide(cfg, RulesJudge(cfg.judge, home=tmp_path))
    s = loop.start("q1", QUESTION, ["Delina"], seed=3)
    guide.run(_GoldEngine(loop, retry, cfg), [s], [(0, 0)])
    rows = guide.drain_records()
    assert [r["retried"] for r in rows] == [False, retry, retry]  # turn 0's gold search passes its rubric
    question, response, agrees = guided_copy(QUESTION, gold, ARBOR, 3, cfg.guidance, random.Random(0),
                                             retry_share=1.0 if retry else 0.0)
    assert agrees == [True, True, True]  # the gold actions pass the writer's rubrics
    assert response.count("Step rubric for your next step") == 2 and question.startswith(QUESTION + "\n\n")
    assert ("did not pass" in response) == retry and "Kerar Silix Step" not in response
    assert tokenize_trajectory(tok, question, response) == (s.prompt_ids, s.response_ids, s.loss_mask)
    assert check_format(response, truncated=False).valid


def test_guided_sft_rows_copy_a_seeded_share_of_the_clean_gold_rows() -> None:
    """Flawed rows (a repeated query is what a rubric would flag), RubricEM's reflection rows and a question's later
    rows (reference-block copies) get no guided copy; the share is seeded and the figures count what was made."""
    from arbor.config.guidance import GuidanceConfig
    from arbor.format import ARBOR
    from arbor.tasks.methods.coreact.sft import guided_sft_rows

    response = ("<think>film first</think><search>Tobara</search>\n<result>\nDoc 1 (Title: Tobara) Tobara is a film "
                "directed by Kerar Silix.\n</result>\n<think>done</think><answer>\\boxed{Kerar Silix}</answer>")
    rows = [{"question_id": f"q{i}", "question": "Who directed Tobara?", "golds": ["Kerar Silix"],
             "response": response, "flaw": "none"} for i in range(200)]
    rows[0]["flaw"] = "repeated_query"
    rows += [{**rows[1], "question": "<reference_examples>x</reference_examples>\n\nWho directed Tobara?"},
             {**rows[2], "question_id": "r2", "system": "You reflect."}]
    every, figures = guided_sft_rows(rows, 1.0, 0, ARBOR, 3, GuidanceConfig())
    assert [r["question_id"] for r in every] == [f"q{i}" for i in range(1, 200)]
    assert figures == {"rows": 199.0, "guided_steps": 398.0, "gold_passes_rubric": 1.0}
    half, _ = guided_sft_rows(rows, 0.5, 0, ARBOR, 3, GuidanceConfig())
    assert 70 < len(half) < 130 and half == guided_sft_rows(rows, 0.5, 0, ARBOR, 3, GuidanceConfig())[0]
    assert half != guided_sft_rows(rows, 0.5, 1, ARBOR, 3, GuidanceConfig())[0]
    assert guided_sft_rows(rows, 0.0, 0, ARBOR, 3, GuidanceConfig()) == ([], {"rows": 0.0, "guided_steps": 0.0,
                                                                              "gold_passes_rubric": pytest.approx(
                                                                                  float("nan"), nan_ok=True)})


def test_guidance_effect_is_a_paired_difference_over_questions() -> None:
    """``arbor eval`` with guidance (and bench/guidance.py) report guided - unguided F1 with the standard error of
    the per-question differences (computed by hand here), not of two independent means."""
    from arbor.flows.evaluate import paired_difference

    assert paired_difference([(0.2, 0.6), (0.4, 0.6)]) == (pytest.approx(0.3), pytest.approx(0.1), 2)
    mean, se, n = paired_difference([(0.0, 1.0), (0.5, 0.5), (1.0, 0.0)])
    assert (mean, n) == (0.0, 3) and se == pytest.approx(1 / 3 ** 0.5)
    assert paired_difference([(0.3, 0.3)])[2] == 1 and math.isnan(paired_difference([(0.3, 0.3)])[1])
