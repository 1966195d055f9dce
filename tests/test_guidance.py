"""Co-ReAct guided inference (tasks/methods/coreact/guidance.py, AgentLoop.place_guidance; issue 17).

The agent loop is driven by a scripted engine (the model's place: generations chosen from what the context shows),
with a real tokenizer, a real BM25 index and the real rules judge writing and verifying the step rubrics.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from arbor.config import load_config
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
from arbor.tasks.format import check_format
from arbor.tasks.methods.coreact.guidance import (
    CoReAct,
    JudgeRubrics,
    MemoryRubrics,
    guidance_text,
    make_guide,
)
from arbor.tasks.types import RubricItem, StepRubric

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
    context it searches what the rubric asked for; after a result naming the director it answers."""

    def __init__(self, loop: AgentLoop, cfg: Any) -> None:
        self.loop, self.cfg, self.calls = loop, cfg, 0

    def complete(self, requests: list[GenRequest], *, temperature: float, stop_strings: list[str]) -> list[Generation]:
        out = []
        for r in requests:
            self.calls += 1
            ctx = self.loop.tokenizer.decode(r.context_ids)
            if "Kerar Silix is a poet" in ctx:
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
    roles = [c["role"] for c in judge.drain_calls()]
    assert roles.count("step_rubric") == 3 and roles.count("step_verify") == 4
    assert guide.drain_records() == []


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


def test_make_guide_names_the_missing_key(tmp_path: Path) -> None:
    assert make_guide(load_config("tiny-cpu"), None) is None
    with pytest.raises(ValueError, match="guidance.memory_pool"):
        make_guide(load_config("tiny-cpu", {"guidance.mode": "co-react", "guidance.source": "memory"}), None)
    with pytest.raises(ValueError, match="guidance.generator"):
        make_guide(load_config("tiny-cpu", {"guidance.mode": "co-react", "guidance.source": "generator"}), None)


def test_preflight_names_a_missing_source_and_a_judge_without_the_roles(tmp_path: Path) -> None:
    from arbor.preflight import guidance_problems

    cfg = load_config("tiny-cpu", {"guidance.mode": "co-react", "guidance.source": "memory",
                                   "guidance.memory_pool": str(tmp_path / "nope.json")})
    assert [p.split(":")[0] for p in guidance_problems(cfg)] == ["guidance.memory_pool"]
    cfg = load_config("tiny-cpu", {"guidance.mode": "co-react", "judge.backend": "test_guidance:NoStepJudge"})
    problems = guidance_problems(cfg)
    assert len(problems) == 2 and "no step_rubric role" in problems[0] and "no step_verify role" in problems[1]
    cfg = load_config("tiny-cpu", {"guidance.mode": "co-react", "guidance.verify": False,
                                   "judge.backend": "test_guidance:NoStepJudge"})
    assert len(guidance_problems(cfg)) == 1  # inject-only needs no verifier
    assert guidance_problems(load_config("tiny-cpu", {"judge.backend": "test_guidance:NoStepJudge"})) == []


class NoStepJudge(RulesJudge):
    """A plug-in judge without Co-ReAct's roles (the base class's, which raise)."""

    from arbor.llm.base import Judge as _J

    step_rubric = _J.step_rubric  # type: ignore[assignment]
    step_verify = _J.step_verify  # type: ignore[assignment]


# ---- issue 31 item 4: a rubric or verification call that fails for good ------------------------------------------
class VerifierDown(RulesJudge):
    """The rules rubric writer; every verification fails past the client's retries."""

    async def step_verify(self, question, history, action, rubric, *, ctx=None):  # noqa: ANN001, ANN201
        from arbor.llm.base import JudgeOutcome

        return JudgeOutcome(None, "RateLimitError", 3, False)


class WriterDown(RulesJudge):
    """The rules verifier; every step rubric fails past the client's retries."""

    async def step_rubric(self, question, history, *, tool_calls, max_tool_calls, ctx=None):  # noqa: ANN001, ANN201
        from arbor.llm.base import JudgeOutcome

        return JudgeOutcome(None, "InvalidOutput: no rubric items", 3, False)


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
    """Issue 31 item 4: a verification that fails for good is no rejection: the proposed action stands, with no
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
    assert all(r["verify_error"] == "RateLimitError" and r["rubric"] for r in rows)
    assert roles.count("step_rubric") == len(rows)
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
    assert all(r["rubric"] is None and r["rubric_error"].startswith("InvalidOutput") and r["passed"] is None
               and not r["retried"] and r["verify_error"] is None for r in rows)
    assert "step_verify" not in roles and calls == engine.calls == len(rows)
