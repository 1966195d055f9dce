"""Schema-valid is not the same as an answer: a reply that echoes its prompt's placeholders or
instructions, loops or leaves a field empty is an invalid answer; the OpenAI-compatible backend retries it with
the reason, records it as ``InvalidAnswer`` and falls back neutrally when no attempt answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai_server
import pytest
from flow_support import OneJudgeStep
from openai_server import FaultPlan, OpenAIServer

from arbor.config import ArborConfig
from arbor.config.judge import JudgeConfig
from arbor.llm import make_judge, prompts
from arbor.llm.answers import (
    NEAR_COPY,
    _words,
    answer_problem,
    check_reply,
    find_problem,
    near_copy,
    template_from_text,
    template_of,
)
from arbor.llm.openai_backend import _role_schema
from arbor.llm.parse import InvalidAnswer
from arbor.paths import PROJECT_ROOT
from arbor.tasks.methods import load_roles
from arbor.tasks.methods.arbor import Arbor, heuristics
from arbor.tasks.methods.arbor import roles as arbor_roles
from arbor.types import Trajectory

KEY_ENV = "ARBOR_TEST_JUDGE_KEY"
INDUCTION = template_of("induction.v1")
SCHEMA = _role_schema("induction")
Q = "Which city is the capital of the country where the Eiffel Tower stands?"
ANCHORS = {"mode": "single_pair", "positive": 0, "worst": 1, "hard": 1}


def rubric(title: str, description: str, counter: str) -> dict[str, Any]:
    return {"rubrics": [{"title": title, "description": description, "counter_description": counter}]}


def test_a_template_is_read_from_the_prompt_file() -> None:
    """The placeholders are the prompt's own reply example's ``"<...>"`` strings, not a list typed per role."""
    assert INDUCTION.placeholders == ("<short label>", "<what a high-scoring trajectory does>",
                                      "<what a low-scoring trajectory does>")
    assert template_of("consolidation.v1").placeholders[0] == "..."
    made = template_from_text('Say {{x}} twice.\n{"a": "<one thing>", "b": "B"}')
    assert made.placeholders == ("<one thing>",) and ("one", "thing") in made.placeholder_words


def test_the_prompts_own_example_is_never_an_answer() -> None:
    """Every role's prompt that shows a reply with placeholders: that reply, sent back, is rejected."""
    load_roles()  # every built-in method's prompt files; a user's (an example's) registered here too is left out
    shipped = {v for v, path in prompts.PROMPT_FILES.items() if Path(path).is_relative_to(PROJECT_ROOT / "tasks")}
    roles = {"induction_unlabeled": "induction"}
    checked = 0
    for version in sorted(shipped):
        key = version.split(".v")[0]
        example = openai_server.echo_of(prompts.load_prompt(version)[0])
        if '"<' not in example:
            continue
        problem = answer_problem(json.loads(example), template_of(version), _role_schema(roles.get(key, key)))
        assert problem is not None and "placeholder" in problem, (version, problem)
        checked += 1
    assert checked == 10  # all but pairwise, accuracy, rar_rate, reflection_grades and rank_actions v2 (no "<...>")


@pytest.mark.parametrize(("reply", "why"), [
    # the 135M judge's induction answers, and the same placeholder in another field
    (rubric("<short label>", "<what a high-scoring trajectory does>", "The agent the agent."), "placeholder"),
    (rubric("Entity queries", "<what a low-scoring trajectory does>", "Vague queries."), "placeholder"),
    (rubric("short label", "Names the tower's country before the capital.", "Vague queries."), "words of a placeholder"),
    (rubric("Queries", "<a good trajectory>", "Vague queries."), "angle brackets"),
    (rubric("Queries", "Names the entities.", "<answer>"), "angle brackets"),
    # a loop of words, and of characters
    (rubric("Queries", "Names the entities.", "The agent searches and then the agent searches and then the agent "
                                              "searches and then the agent searches and then the agent searches."),
     "loop"),
    (rubric("Queries", "Names the entities.", "ha" * 40), "loop"),
    # the instructions copied back (a sentence of the prompt's picture of an excellent agent)
    (rubric("Precision", "Writes focused queries that name the specific entities and relations it needs, so the "
                         "right page comes back directly.", "Vague queries."), "copies the instructions"),
    # empty where text is asked for; both sides of the rubric the same
    (rubric("   ", "Names the entities.", "Vague queries."), "empty"),
    (rubric("Queries", "Names both entities in one query.", "names both entities in one query"), "says the same"),
])
def test_a_reply_that_is_not_an_answer_is_named(reply: dict[str, Any], why: str) -> None:
    problem = answer_problem(reply, INDUCTION, SCHEMA)
    assert problem is not None and why in problem and problem.startswith("rubrics[0].")


@pytest.mark.parametrize("reply", [
    rubric("Precise Entity Queries", "Names the tower and its country in the first query instead of a generic word.",
           "Searches a generic word twice and answers with the tower's name."),
    # words and a short run of the instructions ("does not repeat queries"), in an answer of its own
    rubric("No repeated searches", "Does not repeat queries once the country is established and answers with the "
                                   "capital.", "Searches 'Eiffel Tower' three times and never asks for the capital."),
    rubric("Stops", "Stops.", "Goes on."),  # short, but an answer
    {"rubrics": []},  # "the existing rubrics already cover it" is an answer
])
def test_a_genuine_answer_is_accepted(reply: dict[str, Any]) -> None:
    assert answer_problem(reply, INDUCTION, SCHEMA) is None


def test_fields_allowed_empty_stay_allowed() -> None:
    """A justification or feedback may be empty (the schema asks no text of them); an empty criterion may not."""
    grades = {"scores": [{"index": 1, "score": 2, "justification": ""}, {"index": 2, "score": 0, "justification": ""}]}
    assert answer_problem(grades, template_of("stage_grades.v1"), _role_schema("stage_grades")) is None
    verdict = {"satisfied": [True], "feedback": ""}
    assert answer_problem(verdict, template_of("step_verify.v1"), _role_schema("step_verify")) is None
    labels = {"steps": [{"criteria": ["Names the tower", ""], "scores": [0.5, 0.1]}]}
    assert "empty" in str(answer_problem(labels, template_of("step_labels.v1"), _role_schema("step_labels")))


# ---- end to end: the real backend against the scripted server ----------------------------------------------------
@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIServer]:
    monkeypatch.setenv(KEY_ENV, "sk-test")
    with OpenAIServer(api_key="sk-test") as srv:
        yield srv


def config(srv: OpenAIServer) -> JudgeConfig:
    return JudgeConfig(backend="openai", base_url=srv.base_url, api_key_env=KEY_ENV, model="test-judge",
                       timeout_s=2.0, max_retries=2, backoff_base_s=0.001, backoff_max_s=0.01, concurrency=4)


def trajs(group: int = 0) -> list[Trajectory]:
    def one(sample: int, searches: int, f1: float) -> Trajectory:
        body = "".join(f"<search>Eiffel Tower country {k}</search>\n<result>France {k}</result>\n"
                       for k in range(searches))
        return Trajectory("r", 1, group, sample, f"q{group}", Q, ["Paris"],
                          text=f"{body}<answer>\\boxed{{{'Paris' if f1 else 'Lyon'}}}</answer>", base_reward=f1,
                          f1=f1, format_valid=True)
    return [one(0, 2, 1.0), one(1, 1, 0.0), one(2, 2, 1.0), one(3, 0, 0.0)]


def test_a_placeholder_answer_is_retried_with_the_reason(server: OpenAIServer, tmp_path: Path) -> None:
    server.plan = FaultPlan(by_role={"induction": ["echo"]})
    judge = make_judge(config(server), home=tmp_path)

    async def ask() -> Any:
        try:
            return await judge.ask(arbor_roles.INDUCTION, question=Q, golds=["Paris"],
                                   trajectories=trajs()[:2], anchors=ANCHORS, existing=[])
        finally:
            await judge.aclose()

    out = asyncio.run(ask())
    assert out.ok and out.attempts == 2 and [d.title for d in out.value] == ["Targeted entity queries"]
    [row] = judge.drain_calls()
    # the refused attempt keeps the filter's reason and the start of the reply that was refused
    assert row["error"] is None and row["attempt_errors"] == ["InvalidAnswer:placeholder", None]
    retry = server.bodies[1]["messages"]
    recorded = openai_server.recorded_echoes()["induction"]  # the real SmolLM2 judge's reply
    assert row["attempt_replies"] == [recorded, None]  # the whole reply: 161 characters
    assert retry[2]["content"] == recorded  # the reply shown back ...
    assert "rubrics[0].title is the prompt's placeholder '<short label>'" in retry[3]["content"]  # ... and why


def test_a_refused_reply_is_kept_to_its_first_200_characters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long reply that is no verdict, refused at every attempt: each attempt's entry names the
    refusal and keeps the reply's first 200 characters, so a weak judge can be told from a strict filter."""
    from test_resume_spend import FixedJudge

    from arbor.config.judge import JudgeConfig
    from arbor.tasks.reporting.accuracy import ACCURACY

    monkeypatch.setenv(KEY_ENV, "sk-test")
    reply = "I think that the answer given is probably right, " * 20  # 1,000 characters, no verdict word first
    server = FixedJudge(reply)
    try:
        cfg = JudgeConfig(backend="openai", base_url=server.url, api_key_env=KEY_ENV, model="m", max_retries=1,
                          backoff_base_s=0.0)
        judge = make_judge(cfg, home=tmp_path)

        async def ask() -> Any:
            try:
                return await judge.ask(ACCURACY, question=Q, golds=["Paris"], prediction="Paris")
            finally:
                await judge.aclose()

        out = asyncio.run(ask())
    finally:
        server.close()
    [row] = judge.drain_calls()
    assert not out.ok and row["error"] == "InvalidOutput" and row["refusal"] == "unparseable"
    assert row["attempt_errors"] == ["InvalidOutput", "InvalidOutput"]
    assert row["attempt_replies"] == [reply[:200]] * 2


@pytest.mark.parametrize("echoes", [0, 3])
def test_when_every_attempt_is_a_placeholder_nothing_is_admitted(server: OpenAIServer, tmp_path: Path,
                                                                echoes: int) -> None:
    """ARBOR's induce stage on one group: three placeholder replies (max_retries 2) end in the neutral fallback (no
    draft, nothing induced or admitted, the call recorded as InvalidAnswer); the same step with answers induces."""
    server.plan = FaultPlan(by_role={"induction": ["echo"] * echoes})
    cfg = ArborConfig.model_validate({"run": {"method": "arbor"}, "judge": config(server).model_dump()})
    method = Arbor(cfg)
    rows = method.induce(OneJudgeStep(make_judge(cfg.judge, home=tmp_path)), 1, trajs())
    [call] = [c for c in rows["judge_calls"] if c["role"] == "induction"]
    events = [e["event"] for e in rows["rubric_events"]]
    if echoes:
        assert call["error"] == "InvalidAnswer" and call["attempt_errors"] == ["InvalidAnswer:placeholder"] * 3
        assert events == [] and rows["draft_scores"] == [] and not method.memory.D
    else:
        assert call["error"] is None and "induced" in events and len(rows["draft_scores"]) == 1


# ---- near-placeholders and near-copies rejected, the prompt's worked examples accepted ----------
CONSOLIDATION = template_of("consolidation.v1")
EDITED = ("Writes focused queries naming the specific entities and relations it needs, so the right page comes back "
          "quickly.")  # the induction prompt's "Searches with precision" sentence, three words edited


@pytest.mark.parametrize(("reply", "reason"), [
    (rubric("Entity queries", "What a high-scoring response does.", "Vague queries."), "near_placeholder"),
    (rubric("Concise label", "Names the tower's country before the capital.", "Vague queries."), "near_placeholder"),
    (rubric("Precision", EDITED, "Vague queries."), "instruction_near_copy"),
])
def test_a_reworded_placeholder_or_an_edited_instruction_is_rejected(reply: dict[str, Any], reason: str) -> None:
    """Each passed today's filter; the reason travels on the exception the backend counts."""
    problem = find_problem(reply, INDUCTION, SCHEMA)
    assert problem is not None and problem.reason == reason
    with pytest.raises(InvalidAnswer) as e:
        check_reply(json.dumps(reply), "induction.v1", SCHEMA)
    assert e.value.reason == reason and str(e.value) == problem.message


def test_near_copy_is_the_word_sequence_ratio() -> None:
    """difflib's ratio on words, hand-counted: the sentence has 19 words, the edit 18, and they share 16 in order
    ("writes focused queries", "the specific ... it needs so the right page comes back"): 2 * 16 / 37."""
    assert near_copy(_words(EDITED), INDUCTION.sentences) == pytest.approx(32 / 37)
    assert 32 / 37 >= NEAR_COPY


def test_the_prompts_worked_examples_are_answers() -> None:
    """The consolidation prompt's own examples of a general standard, reused in a consolidated one, are model
    answers (today rejected as a copy of the instructions); its instructions copied are still a copy."""
    assert ("distinguishes functional or contextual differences between closely related entities (e.g., variant "
            "forms, sub-categories, similarly named concepts)") in CONSOLIDATION.examples
    standard = {"new_common_rubrics": [{
        "title": "Distinguishing related entities",
        "description": "Distinguishes functional or contextual differences between closely related entities (e.g., "
                       "variant forms, sub-categories, similarly named concepts).",
        "counter_description": "Does not cross-check key factual claims against the retrieved evidence before "
                               "concluding."}]}
    schema = _role_schema("consolidation")
    assert answer_problem(standard, CONSOLIDATION, schema) is None
    standard["new_common_rubrics"][0]["description"] = ("The description must apply to any question, not to the "
                                                        "questions the candidates came from.")
    problem = find_problem(standard, CONSOLIDATION, schema)
    assert problem is not None and problem.reason == "instruction_copy"


@pytest.mark.parametrize("reply", [
    rubric("Short queries", "Keeps each query to the entity it needs.", "Writes long queries."),  # the head changed
    rubric("Step 2 evidence", "Finds the country in step 2 before the capital.", "Vague queries."),
])
def test_a_title_sharing_a_placeholders_modifier_is_an_answer(reply: dict[str, Any]) -> None:
    assert answer_problem(reply, INDUCTION, SCHEMA) is None


def test_the_rules_judges_rubrics_stay_clear_of_the_thresholds() -> None:
    """Every rubric the offline judge writes (ARBOR's heuristics' texts, as drafts and as common standards)
    passes the induction and consolidation filters, its closest field below ``NEAR_COPY`` (measured 0.667:
    bench/answer_filter.py)."""
    closest = 0.0
    for title, desc, counter in heuristics._TEXT.values():
        assert answer_problem(rubric(title, desc, counter), INDUCTION, SCHEMA) is None, title
        consolidated = {"new_common_rubrics": rubric(title, desc, counter)["rubrics"]}
        assert answer_problem(consolidated, CONSOLIDATION, _role_schema("consolidation")) is None, title
        closest = max(closest, *(near_copy(_words(t), INDUCTION.sentences) for t in (desc, counter)))
    assert closest == pytest.approx(2 * 12 / 36)
