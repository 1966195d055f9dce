"""The ``openai`` judge backend against a real local OpenAI-compatible HTTP server (tests/openai_server.py)."""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import statistics
from collections.abc import Iterator
from pathlib import Path

import openai_server
import pytest
from openai_server import FaultPlan, OpenAIServer

from arbor.config.judge import JudgeConfig
from arbor.llm import JUDGE_CALL_COLUMNS, CallContext, make_judge, prompts, role_of
from arbor.llm.cache import ResponseCache, cache_key
from arbor.llm.openai_backend import JudgeSetupError, OpenAIJudge, _role_schema
from arbor.tasks.methods.arbor.roles import CONSOLIDATION, INDUCTION, ask_pairwise
from arbor.tasks.methods.arbor.sparse_graph import presentation_swapped, sparse_edges, verdict_to_outcome
from arbor.tasks.methods.arco.roles import STEP_LABELS
from arbor.tasks.methods.coreact.equations import RANK_LABELS
from arbor.tasks.methods.coreact.roles import ask_ranking
from arbor.tasks.methods.rar.roles import RAR_RATE, RAR_RUBRICS
from arbor.tasks.methods.ss_grpo.roles import STAGE_GRADES, STAGE_RUBRICS
from arbor.tasks.reporting.accuracy import ACCURACY
from arbor.tasks.reporting.evaluate import Prediction, judge_predictions, pass_at_1
from arbor.types import Rubric, Trajectory

KEY_ENV = "ARBOR_TEST_JUDGE_KEY"
SECRET = "sk-arbor-test-7f3c9d2e1b-DO-NOT-LEAK"
Q = "Which city is the capital of the country where the Eiffel Tower stands?"
RUBRIC = Rubric("r-entity", "Precise Entity Queries", "Names the question's entities in each query.",
                "Issues vague queries.", kind="common")


def traj(sample: int, n_search: int, group: int = 0, reward: float = 0.0) -> Trajectory:
    body = "".join(f"<search>Eiffel Tower country {k} {sample}</search>\n<result>France {k}</result>\n"
                   for k in range(n_search))
    return Trajectory("t", 1, group, sample, f"q{group}", Q, ["Paris"], text=f"{body}<answer>\\boxed{{Paris}}</answer>",
                      base_reward=reward, f1=max(reward, 0.0), format_valid=True)


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(api_key=SECRET) as srv:
        yield srv


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)


def config(srv: OpenAIServer, **kw: object) -> JudgeConfig:
    base = dict(backend="openai", base_url=srv.base_url, api_key_env=KEY_ENV, model="test-judge", timeout_s=0.5,
                max_retries=2, backoff_base_s=0.001, backoff_max_s=0.05, concurrency=8)
    base.update(kw)
    return JudgeConfig(**base)  # type: ignore[arg-type]


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(coro)


async def _with(judge: OpenAIJudge, coro):  # noqa: ANN001, ANN201
    try:
        return await coro
    finally:
        await judge.aclose()


def test_a_retry_tells_the_judge_what_was_wrong(server: OpenAIServer, tmp_path: Path) -> None:
    """The second attempt is not a copy of the first; it shows the unusable reply and the
    validation problem, under the same cache key (so the good answer is found again on a resume)."""
    server.plan = FaultPlan(queue=["invalid"])
    judge = make_judge(config(server), home=tmp_path)
    out = run(_with(judge, ask_pairwise(judge, Q, traj(0, 2), traj(1, 1), RUBRIC)))
    assert out.ok and out.value == "A" and out.attempts == 2
    first, second = (b["messages"] for b in server.bodies)
    assert [m["role"] for m in first] == ["system", "user"] and second[:2] == first
    assert second[2] == {"role": "assistant", "content": openai_server._INVALID["pairwise"]}
    assert second[3]["role"] == "user" and "cannot be used: PairwiseOut" in second[3]["content"]
    assert "winner: Input should be 'A', 'B' or 'TIE'" in second[3]["content"]  # the field and its rule, named
    assert len(set(server.counts)) == 1  # one cache key for both attempts
    [row] = judge.drain_calls()
    assert row["attempt_errors"] == ["InvalidOutput", None]  # the ledger shows each attempt


def test_a_truncated_reply_is_recognised_and_retried_shorter(server: OpenAIServer, tmp_path: Path) -> None:
    server.plan = FaultPlan(queue=["length"] * 3)  # max_retries 2: every attempt runs out of tokens
    judge = make_judge(config(server), home=tmp_path)
    out = run(_with(judge, ask_pairwise(judge, Q, traj(0, 2), traj(1, 1), RUBRIC)))
    assert not out.ok and out.error == "Truncated" and out.attempts == 3
    [row] = judge.drain_calls()
    assert row["error"] == "Truncated" and row["attempts"] == 3 and row["attempt_errors"] == ["Truncated"] * 3
    bodies = [b["messages"] for b in server.bodies]
    assert all(len(m) == 4 and "length limit" in m[3]["content"] for m in bodies[1:])
    assert bodies[2][2]["content"] != "" and bodies[2][:2] == bodies[0]  # the second reply shown, not a pile-up


def _formats(server: OpenAIServer) -> list[str | None]:
    return [(b.get("response_format") or {}).get("type") for b in server.bodies]


def test_structured_outputs_send_each_roles_schema(server: OpenAIServer, tmp_path: Path) -> None:
    judge = make_judge(config(server), home=tmp_path)  # judge.structured_outputs: auto, the default

    async def both():  # noqa: ANN202
        return (await ask_pairwise(judge, Q, traj(0, 2), traj(1, 1), RUBRIC),
                await judge.ask(ACCURACY, question=Q, golds=["Paris"], prediction="Paris"))

    pair, acc = run(_with(judge, both()))
    assert pair.value == "A" and acc.value is True
    fmt = server.bodies[0]["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "pairwise"
    assert fmt["json_schema"]["schema"]["properties"]["winner"]["enum"] == ["A", "B", "TIE"]
    # accuracy: E.4's verdict word as a constrained enum (a 135M judge parrots the prompt without it)
    assert server.bodies[1]["response_format"]["json_schema"]["schema"]["properties"]["verdict"]["enum"] == [
        "Correct", "Incorrect"]


def test_a_requests_schema_carries_its_counts(server: OpenAIServer, tmp_path: Path) -> None:
    """The schema sent is narrowed to the request: three rubrics -> exactly three grades, indices 1-3; three
    shown candidates -> a ranking of exactly three of X, Y, Z (the bare-JSON ranking: a reasoned one, App. A, carries
    no schema); k criteria -> k scores per step."""
    from arbor.types import StageRubric

    judge = make_judge(config(server), home=tmp_path)
    rubrics = [StageRubric(f"r{i}", 1, f"Title {i}", "d", 1, 1) for i in range(3)]

    async def three():  # noqa: ANN202
        return (await judge.ask(STAGE_GRADES, question=Q, golds=["Paris"], trajectory=traj(0, 1),
                                rubrics=rubrics),
                await ask_ranking(judge, Q, ["Paris"], "", ["a", "b", "c"], order=[2, 0, 1], rationale=False),
                await judge.ask(STEP_LABELS, question=Q, golds=["Paris"], trajectory=traj(0, 2),
                                steps=[("s1", "r1"), ("s2", "r2")], k=4))

    grades, ranks, labels = run(_with(judge, three()))
    assert len(grades.value) == 3 and sorted(ranks.value) == [1, 2, 3] and len(labels.value) == 2
    g, r, s = (b["response_format"]["json_schema"]["schema"] for b in server.bodies)
    assert (g["properties"]["scores"]["minItems"], g["properties"]["scores"]["maxItems"]) == (3, 3)
    assert [it["properties"]["index"]["const"] for it in g["properties"]["scores"]["prefixItems"]] == [1, 2, 3]
    assert g["properties"]["scores"]["items"] is False  # no grade beyond the third
    assert r["properties"]["ranking"]["items"]["enum"] == ["X", "Y", "Z"] == list(RANK_LABELS[:3])
    assert r["properties"]["ranking"]["maxItems"] == 3
    step = s["properties"]["steps"]
    assert step["minItems"] == step["maxItems"] == 2
    assert step["items"]["properties"]["scores"]["maxItems"] == 4 == step["items"]["properties"]["criteria"]["minItems"]
    assert "minItems" not in _role_schema("stage_grades")["properties"]["scores"]  # narrowed on a copy


@pytest.mark.parametrize("status", [500, 422])
def test_auto_steps_down_to_the_dialect_the_endpoint_takes(server: OpenAIServer, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture, status: int) -> None:
    """llama-cpp-python's server refuses json_schema (its real 0.3.36 server with a 500 that carries the validation
    error; fastapi's own 422) and takes json_object with a schema: the first call learns that without spending an
    attempt, later calls send json_object at once, and it is logged once."""
    server.plan = FaultPlan(formats=("text", "json_object"), refusal_status=status)
    judge = make_judge(config(server), home=tmp_path)
    caplog.set_level(logging.WARNING, logger="arbor.judge")

    async def two():  # noqa: ANN202
        return [await ask_pairwise(judge, Q, traj(0, 2), traj(1, 1), RUBRIC),
                await ask_pairwise(judge, Q, traj(2, 1), traj(3, 3), RUBRIC)]

    outs = run(_with(judge, two()))
    assert [o.value for o in outs] == ["A", "B"] and [o.attempts for o in outs] == [1, 1]
    assert _formats(server) == ["json_schema", "json_object", "json_object"]
    assert server.bodies[1]["response_format"]["schema"]["required"] == ["winner"]
    assert sum("refused response_format json_schema" in r.getMessage() for r in caplog.records) == 1
    server.plan = FaultPlan(formats=("text",), refusal_status=status)  # takes no schema at all: down to none
    judge = make_judge(config(server), home=tmp_path / "b")
    server.bodies.clear()
    assert run(_with(judge, ask_pairwise(judge, Q, traj(0, 2), traj(1, 1), RUBRIC))).value == "A"
    assert _formats(server) == ["json_schema", "json_object", None]


@pytest.mark.parametrize("mode,sent", [("json_object", "json_object"), ("off", None)])
def test_a_fixed_dialect_is_sent_as_configured(server: OpenAIServer, tmp_path: Path, mode: str,
                                               sent: str | None) -> None:
    judge = make_judge(config(server, structured_outputs=mode), home=tmp_path)
    assert run(_with(judge, ask_pairwise(judge, Q, traj(0, 2), traj(1, 1), RUBRIC))).value == "A"
    assert _formats(server) == [sent]


@pytest.mark.parametrize("status", [500, 422])
def test_a_fixed_dialect_the_endpoint_refuses_is_a_recorded_failure(server: OpenAIServer, tmp_path: Path,
                                                                    status: int) -> None:
    server.plan = FaultPlan(formats=("text", "json_object"), refusal_status=status)
    judge = make_judge(config(server, structured_outputs="json_schema"), home=tmp_path)
    out = run(_with(judge, ask_pairwise(judge, Q, traj(0, 2), traj(1, 1), RUBRIC)))
    assert not out.ok and out.error == f"FormatRefused:{status}" and out.attempts == 1  # the same refusal again
    assert _formats(server) == ["json_schema"]


def test_reply_budget_and_request_timeout_by_hand() -> None:
    assert role_of("stage_grades").reply_budget(27) == 32 + 64 * 27  # RubricEM's worst case: 1,760 tokens
    assert role_of("step_labels").reply_budget(4 * 3) == 32 + 40 * 12
    short = [{"role": "user", "content": "x" * 4000}]  # ~1,000 tokens in, 1,000 out: within one timeout
    assert prompts.request_timeout(60.0, short, 1000) == 60.0
    long = [{"role": "system", "content": "x" * 8192}, {"role": "user", "content": "y" * 24576}]  # 8,192 in
    assert prompts.request_timeout(60.0, long, 2048) == pytest.approx(60.0 * (8192 + 2048) / 2048)


def test_a_replys_budget_follows_the_number_of_items(server: OpenAIServer, tmp_path: Path) -> None:
    """27 stage rubrics to grade need more than judge.max_tokens (1,024); 3 do not; a per-role
    setting wins."""
    from arbor.types import StageRubric

    rubrics = [StageRubric(f"r{i}", 1 + i % 4, f"rubric {i}", "d") for i in range(27)]

    def sent(cfg: JudgeConfig, n: int, home: Path) -> int:
        judge = make_judge(cfg, home=home)
        server.bodies.clear()
        out = run(_with(judge, judge.ask(STAGE_GRADES, question=Q, golds=["Paris"], trajectory=traj(0, 1),
                                         rubrics=rubrics[:n])))
        assert out.ok and len(out.value) == n
        return server.bodies[0]["max_tokens"]

    assert sent(config(server), 27, tmp_path / "a") == 32 + 64 * 27
    assert sent(config(server), 3, tmp_path / "b") == 1024
    fixed = config(server, roles={"stage_grades": {"max_tokens": 700}})
    assert sent(fixed, 27, tmp_path / "c") == 700


def test_a_prompt_is_compacted_to_fit_the_judges_context(server: OpenAIServer, tmp_path: Path) -> None:
    """Eight long trajectories for stage_rubrics (2,048 reply tokens) to a judge of 8,192 tokens:
    each is cut to (8,192 - 2,048 - 1,024) / 8 = 640 tokens, so the request fits; unset, they go whole."""
    from arbor.llm.text import estimate_tokens

    body = "".join(f"<search>Eiffel Tower {k}</search>\n<result>{'France and Paris. ' * 90}</result>\n"
                   for k in range(4))
    long = [Trajectory("t", 1, 0, i, "q0", Q, ["Paris"], text=f"{body}<answer>\\boxed{{Paris}}</answer>",
                       format_valid=True) for i in range(8)]
    assert all(estimate_tokens(t.text) > 1200 for t in long)  # ~1,650 tokens each (chars / 4)

    def prompt_tokens(cfg: JudgeConfig, home: Path) -> int:
        judge = make_judge(cfg, home=home)
        server.bodies.clear()
        run(_with(judge, judge.ask(STAGE_RUBRICS, question=Q, golds=["Paris"], trajectories=long,
                                   existing=[])))
        return sum(estimate_tokens(m["content"]) for m in server.bodies[0]["messages"])

    fitted = prompt_tokens(config(server, context_tokens=8192), tmp_path / "a")
    assert fitted + 2048 <= 8192 and fitted > 8 * 500
    assert prompt_tokens(config(server), tmp_path / "b") > 8 * 1200  # no context given: max_judge_tokens (3,000)


@pytest.mark.parametrize("fault,attempts,error_first", [
    ("429", 2, "RateLimitError"), ("500", 2, "InternalServerError"),
    ("malformed", 2, "InvalidOutput"), ("invalid", 2, "InvalidOutput"), ("fenced", 1, None),
])
def test_each_fault_is_retried_and_ends_in_success(server: OpenAIServer, tmp_path: Path, fault: str, attempts: int,
                                                   error_first: str | None, caplog: pytest.LogCaptureFixture) -> None:
    server.plan = FaultPlan(queue=[fault], hang_s=1.5)
    judge = make_judge(config(server), home=tmp_path)
    caplog.set_level(logging.INFO, logger="arbor.judge")
    out = run(_with(judge, ask_pairwise(judge, Q, traj(0, 2), traj(1, 1), RUBRIC,
                                        ctx=CallContext(step=3, edge=4))))
    assert out.ok and out.value == "A" and out.attempts == attempts  # 2 searches beat 1 on the server's rule
    [row] = judge.drain_calls()
    assert row["attempts"] == attempts and row["error"] is None and row["step"] == 3 and row["edge"] == "4"
    assert row["attempt_errors"] == [error_first, None][2 - attempts:]
    assert server.counts[row["cache_key"]] == attempts  # every attempt reached the server with the same key
    if error_first:
        assert error_first in caplog.text  # the retry was logged with its error class


def test_a_hang_past_the_stall_deadline_is_not_retried(server: OpenAIServer, tmp_path: Path) -> None:
    """A reply that does not start within the deadline (here the derived one, judge.timeout_s=0.5 for a
    short request) is a stall: one request, then ``DependencyStalled`` naming the role (it used to be retried)."""
    from arbor.runtime.liveness import DependencyStalled

    server.plan = FaultPlan(queue=["hang"], hang_s=1.5)
    judge = make_judge(config(server), home=tmp_path)
    with pytest.raises(DependencyStalled, match="the judge of role 'pairwise' at http://127.0.0.1:.* stalled"):
        run(_with(judge, ask_pairwise(judge, Q, traj(0, 2), traj(1, 1), RUBRIC)))
    assert sum(server.counts.values()) == 1


@pytest.mark.parametrize("role", ["accuracy", "induction", "consolidation", "rar_rubrics", "rar_rate"])
def test_invalid_output_of_every_role_is_retried(server: OpenAIServer, tmp_path: Path, role: str) -> None:
    server.plan = FaultPlan(queue=["invalid"])
    judge = make_judge(config(server), home=tmp_path)
    calls = {
        "accuracy": lambda: judge.ask(ACCURACY, question=Q, golds=["Paris"], prediction="Paris"),
        "induction": lambda: judge.ask(INDUCTION, question=Q, golds=["Paris"],
                                       trajectories=[traj(0, 2), traj(1, 1)],
                                       anchors={"mode": "single_pair", "positive": 0, "worst": 1, "hard": 1},
                                       existing=[]),
        "consolidation": lambda: judge.ask(CONSOLIDATION,
                                           candidates_by_query={Q: [RUBRIC], "other": [RUBRIC]}, existing=[]),
        "rar_rubrics": lambda: judge.ask(RAR_RUBRICS, question=Q, golds=["Paris"]),
        "rar_rate": lambda: judge.ask(RAR_RATE, question=Q, trajectory=traj(0, 1), items=["a", "b"]),
    }
    out = run(_with(judge, calls[role]()))
    assert out.ok and out.attempts == 2
    expected = {"accuracy": True, "rar_rate": 7}
    if role in expected:
        assert out.value == expected[role]
    elif role == "rar_rubrics":
        assert len(out.value) == 5
    else:
        assert [d.title for d in out.value] == ["Targeted entity queries"]
    assert judge.drain_calls()[0]["role"] == role


def test_persistent_failure_is_recorded_not_cached_and_not_a_tie(server: OpenAIServer, tmp_path: Path) -> None:
    server.plan = FaultPlan(queue=["500"] * 3 + ["malformed"] * 3)
    judge = make_judge(config(server), home=tmp_path)
    a, b = traj(0, 2), traj(1, 1)
    out = run(_with(judge, ask_pairwise(judge, Q, a, b, RUBRIC)))
    assert out.value is None and out.error == "InternalServerError" and out.attempts == 3  # max_retries=2 -> 3 tries
    out2 = run(_with(judge, ask_pairwise(judge, Q, a, b, RUBRIC)))
    assert out2.value is None and out2.error == "InvalidOutput"  # not served from cache: failures are not cached
    rows = judge.drain_calls()
    assert [r["error"] for r in rows] == ["InternalServerError", "InvalidOutput"]
    assert [r["attempt_errors"] for r in rows] == [["InternalServerError"] * 3, ["InvalidOutput"] * 3]
    assert not any(r["cache_hit"] for r in rows) and server.counts[rows[0]["cache_key"]] == 6
    out3 = run(_with(judge, ask_pairwise(judge, Q, a, b, RUBRIC)))  # the plan is used up: now it succeeds
    assert out3.value == "A" and not out3.cache_hit


def test_retry_after_is_honoured(server: OpenAIServer, tmp_path: Path) -> None:
    server.plan = FaultPlan(queue=["429", "429"], retry_after="0.04")
    judge = make_judge(config(server, backoff_base_s=0.0001), home=tmp_path)
    out = run(_with(judge, judge.ask(ACCURACY, question=Q, golds=["Paris"], prediction="Lyon")))
    assert out.value is False and out.attempts == 3
    assert judge.retry_sleeps == [0.04, 0.04]  # the server's Retry-After, not our (much shorter) backoff


def test_retry_after_as_an_http_date_is_honoured_up_to_the_cap(server: OpenAIServer, tmp_path: Path) -> None:
    """A date in Retry-After (RFC 9110) is a wait too, read as the search backends read it; the judge waits at most
    judge.backoff_max_s (here 0.05 s, where the date asks for 30 s), not its own 0.0001 s backoff."""
    import time
    from email.utils import formatdate

    server.plan = FaultPlan(queue=["429"], retry_after=formatdate(time.time() + 30, usegmt=True))
    judge = make_judge(config(server, backoff_base_s=0.0001, backoff_max_s=0.05), home=tmp_path)
    out = run(_with(judge, judge.ask(ACCURACY, question=Q, golds=["Paris"], prediction="Paris")))
    assert out.value is True and out.attempts == 2 and judge.retry_sleeps == [0.05]


def test_backoff_is_exponential_with_bounded_jitter(server: OpenAIServer, tmp_path: Path) -> None:
    server.plan = FaultPlan(queue=["500", "500", "500"])
    judge = make_judge(config(server, backoff_base_s=0.002, backoff_max_s=0.006, max_retries=3), home=tmp_path)
    assert run(_with(judge, judge.ask(ACCURACY, question=Q, golds=["Paris"],
                                      prediction="Paris"))).value is True
    # attempt k sleeps in [b_k/2, b_k] with b_k = min(0.006, 0.002 * 2^k): [.001,.002], [.002,.004], [.003,.006]
    for sleep, b in zip(judge.retry_sleeps, [0.002, 0.004, 0.006], strict=True):
        assert b / 2 <= sleep <= b


def test_connection_errors_are_retried_then_recorded(tmp_path: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    cfg = JudgeConfig(backend="openai", base_url=f"http://127.0.0.1:{port}/v1", api_key_env=KEY_ENV, timeout_s=0.5,
                      max_retries=1, backoff_base_s=0.001)
    judge = make_judge(cfg, home=tmp_path)
    out = run(_with(judge, ask_pairwise(judge, Q, traj(0, 1), traj(1, 2), RUBRIC)))
    assert out.value is None and out.error == "APIConnectionError" and out.attempts == 2


def _many_calls(judge: OpenAIJudge) -> list:
    calls = []
    for g in range(4):
        trajs = [traj(i, i % 3, group=g) for i in range(6)]
        for e, (i, j) in enumerate(sparse_edges([t.base_reward for t in trajs])):
            ctx = CallContext(run_id="run1", step=0, stage="score", group=g, rubric_id=RUBRIC.rubric_id, edge=e)
            calls.append(ask_pairwise(judge, Q, trajs[i], trajs[j], RUBRIC,
                                      swap=presentation_swapped(0, 1, g, "r", e), ctx=ctx))
        calls.append(judge.ask(ACCURACY, question=Q, golds=["Paris"], prediction=f"answer {g}"))
    return calls


def test_no_cache_key_is_sent_twice_and_a_rerun_is_all_hits(server: OpenAIServer, tmp_path: Path) -> None:
    async def go(judge: OpenAIJudge) -> list:
        try:
            return await asyncio.gather(*_many_calls(judge))
        finally:
            await judge.aclose()

    first_judge = make_judge(config(server), home=tmp_path)
    first = run(go(first_judge))
    rows1 = first_judge.drain_calls()
    keys = {r["cache_key"] for r in rows1}
    assert all(o.ok for o in first) and len(rows1) == len(first) > len(keys)  # groups repeat some prompts
    assert set(server.counts.values()) == {1} and set(server.counts) == keys  # each key sent exactly once
    # identical prompts in flight together wait for the one request (recorded as hits, cost 0)
    assert sum(not r["cache_hit"] for r in rows1) == len(keys)
    # a fresh judge (a resumed run, another process) over the same workspace: every call is a hit
    second_judge = make_judge(config(server), home=tmp_path)
    second = run(go(second_judge))
    rows2 = second_judge.drain_calls()
    assert all(o.cache_hit for o in second) and [o.value for o in second] == [o.value for o in first]
    assert set(server.counts.values()) == {1}  # no network call
    assert all(r["cache_hit"] and r["cost_usd"] == 0.0 and r["attempts"] == 0 for r in rows2)
    assert sorted(r["cache_key"] for r in rows1) == sorted(r["cache_key"] for r in rows2)
    assert all(set(r) == set(JUDGE_CALL_COLUMNS) for r in rows1 + rows2)


def test_cost_and_tokens_follow_the_price_table(server: OpenAIServer, tmp_path: Path) -> None:
    judge = make_judge(config(server, price_in_per_mtok=2.0, price_out_per_mtok=10.0), home=tmp_path)
    run(_with(judge, judge.ask(ACCURACY, question=Q, golds=["Paris"], prediction="Paris")))
    [row] = judge.drain_calls()
    body = server.bodies[0]
    prompt_chars = sum(len(m["content"]) for m in body["messages"])
    assert row["prompt_tokens"] == prompt_chars // 4  # what the server reported as usage
    assert row["completion_tokens"] == 1  # "Correct" -> max(1, 7 // 4) = 1
    # cost = (prompt_tokens * 2.0 + completion_tokens * 10.0) / 1e6
    assert math.isclose(row["cost_usd"], (row["prompt_tokens"] * 2.0 + 1 * 10.0) / 1e6)


def test_per_role_overrides_reach_the_server(server: OpenAIServer, tmp_path: Path) -> None:
    cfg = config(server, roles={"pairwise": {"model": "small-judge", "temperature": 0.3, "max_tokens": 16}})
    judge = make_judge(cfg, home=tmp_path)
    run(_with(judge, ask_pairwise(judge, Q, traj(0, 1), traj(1, 2), RUBRIC)))
    run(_with(judge, judge.ask(ACCURACY, question=Q, golds=["Paris"], prediction="Paris")))
    pw, acc = server.bodies
    assert (pw["model"], pw["temperature"], pw["max_tokens"]) == ("small-judge", 0.3, 16)
    assert (acc["model"], acc["temperature"], acc["max_tokens"]) == ("test-judge", 0.0, 1024)
    rows = judge.drain_calls()
    assert [r["model"] for r in rows] == ["small-judge", "test-judge"]
    assert rows[0]["cache_key"] == cache_key("pairwise", "small-judge", "pairwise.v1", pw["messages"],
                                             {"temperature": 0.3, "max_tokens": 16})


def test_a_role_can_send_its_reply_limit_as_max_completion_tokens(server: OpenAIServer, tmp_path: Path) -> None:
    """OpenAI's reasoning models (GPT-5, one of Co-ReAct's default rank judges) refuse max_tokens."""
    cfg = config(server, roles={"pairwise": {"reply_limit_field": "max_completion_tokens", "max_tokens": 16}})
    judge = make_judge(cfg, home=tmp_path)
    run(_with(judge, ask_pairwise(judge, Q, traj(0, 1), traj(1, 2), RUBRIC)))
    run(_with(judge, judge.ask(ACCURACY, question=Q, golds=["Paris"], prediction="Paris")))
    pw, acc = server.bodies
    assert pw["max_completion_tokens"] == 16 and "max_tokens" not in pw
    assert acc["max_tokens"] == 1024 and "max_completion_tokens" not in acc
    from arbor.config.guidance import paper_rank_judges

    assert [j.reply_limit_field for j in paper_rank_judges()] == [None, None, "max_completion_tokens"]


def test_accuracy_incorrect_reply_is_false(server: OpenAIServer, tmp_path: Path) -> None:
    judge = make_judge(config(server), home=tmp_path)
    async def both() -> list:
        return await asyncio.gather(judge.ask(ACCURACY, question=Q, golds=["Paris", "City of Paris"],
                                              prediction="city of paris"),
                                    judge.ask(ACCURACY, question=Q, golds=["Paris"], prediction="Lyon"))

    outs = run(_with(judge, both()))
    assert [o.value for o in outs] == [True, False]


EXPLANATION_ONLY = "The predicted answer names Paris, which matches the golden answer, so the prediction is correct."


def test_explanation_only_accuracy_reply_is_a_recorded_error_never_correct(
        server: OpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """E.4: a reply without a leading Correct / Incorrect is invalid output on every attempt; after the retries the
    call is a failure in the ledger and the evaluation row counts it as not correct (never as correct)."""
    monkeypatch.setitem(openai_server._INVALID, "accuracy", EXPLANATION_ONLY)
    server.plan = FaultPlan(queue=["invalid"] * 6)  # max_retries=2: 3 attempts per call, two calls
    judge = make_judge(config(server), home=tmp_path)
    out = run(_with(judge, judge.ask(ACCURACY, question=Q, golds=["Paris"], prediction="Paris")))
    assert out.value is None and out.error == "InvalidOutput" and out.attempts == 3 and not out.ok
    [row] = judge.drain_calls()
    assert row["role"] == "accuracy" and row["error"] == "InvalidOutput" and row["attempts"] == 3
    assert server.counts[row["cache_key"]] == 3

    pred = Prediction("test", "q0", 0, Q, ("Paris",),
                      "<search>Eiffel Tower country</search>\n<result>France</result>\n<answer>\\boxed{Paris}</answer>")
    rows = run(_with(judge, judge_predictions(judge, [pred], run_id="r", step=0, checkpoint=None)))
    assert rows[0]["format_valid"] and rows[0]["judge_correct"] is None  # a failed verdict, not True
    assert pass_at_1(rows, "judge_correct") == 0.0
    [call] = judge.drain_calls()
    assert call["stage"] == "eval" and call["error"] == "InvalidOutput" and call["attempts"] == 3
    assert len(ResponseCache(tmp_path / "cache" / "judge").store) == 0  # failures are never cached


def _scores_vs_rank(server: OpenAIServer, tmp_path: Path, use_swap: bool) -> float:
    """Pearson over (rank, score) pairs pooled across 12 groups of K = 8 judged by an 'always A' server."""
    server.plan = FaultPlan(always="A")
    judge = make_judge(config(server, cache=False, concurrency=32), home=tmp_path)
    groups = [[traj(i, 1, group=g, reward=i / 7) for i in range(8)] for g in range(12)]
    plans, calls = [], []
    for g, trajs in enumerate(groups):
        edges = sparse_edges([t.base_reward for t in trajs])
        plans.append(edges)
        for e, (i, j) in enumerate(edges):
            swap = use_swap and presentation_swapped(0, 1, g, RUBRIC.rubric_id, e)
            calls.append(ask_pairwise(judge, Q, trajs[i], trajs[j], RUBRIC, swap=swap))
    async def all_calls() -> list:
        return await asyncio.gather(*calls)

    outs = run(_with(judge, all_calls()))
    ranks, scores, pos = [], [], 0
    for edges in plans:
        outcomes = [verdict_to_outcome(o.value, swapped=False) for o in outs[pos : pos + len(edges)]]
        pos += len(edges)
        total, count = [0.0] * 8, [0] * 8
        for (i, j), o in zip(edges, outcomes, strict=True):
            total[i] += o
            total[j] += 1 - o
            count[i] += 1
            count[j] += 1
        ranks += list(range(8))  # trajectory i has rank i (rewards ascending)
        scores += [t / c for t, c in zip(total, count, strict=True)]
    return statistics.correlation(ranks, scores)


def test_always_a_judge_gives_scores_uncorrelated_with_rank(server: OpenAIServer, tmp_path: Path) -> None:
    """Sparse edges are (lower rank, higher rank); without the swap "A" always means the lower-ranked trajectory,
    so an always-"A" judge produces scores strongly anti-correlated with rank. The coin-drawn swap, undone by
    ``ask_pairwise``, leaves position bias as noise uncorrelated with rank."""
    assert _scores_vs_rank(server, tmp_path, use_swap=False) < -0.6
    assert abs(_scores_vs_rank(server, tmp_path / "b", use_swap=True)) < 0.25


def test_swap_is_undone(server: OpenAIServer, tmp_path: Path) -> None:
    server.plan = FaultPlan(always="A")
    judge = make_judge(config(server), home=tmp_path)
    a, b = traj(0, 1), traj(1, 2)
    plain = run(_with(judge, ask_pairwise(judge, Q, a, b, RUBRIC, swap=False)))
    swapped = run(_with(judge, ask_pairwise(judge, Q, a, b, RUBRIC, swap=True)))
    assert (plain.value, swapped.value) == ("A", "B")  # "A" on the shown order = traj_b when swapped
    first, second = server.bodies
    assert "Eiffel Tower country 0 0" in first["messages"][1]["content"].split("<response_b>")[0]
    assert "Eiffel Tower country 0 0" in second["messages"][1]["content"].split("<response_b>")[1]


def test_api_key_never_appears_in_logs_ledger_cache_or_parquet(server: OpenAIServer, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    from arbor.storage.parquet import write_stage

    caplog.set_level(logging.DEBUG)  # every logger: ours, openai's, httpx's
    server.plan = FaultPlan(queue=["429", "500", "malformed", "invalid"])
    judge = make_judge(config(server, max_retries=4), home=tmp_path)

    async def go() -> list:
        try:
            out = [await ask_pairwise(judge, Q, traj(0, 2), traj(1, 1), RUBRIC,
                                      ctx=CallContext(run_id="run1", step=0))]
            out += await asyncio.gather(*_many_calls(judge))
            return out
        finally:
            await judge.aclose()

    outs = run(go())
    assert all(o.ok for o in outs)
    rows = judge.drain_calls()
    write_stage("judge_calls", rows, run_id="run1", step=0, stage="score", home=tmp_path)
    assert server.counts  # the key was used: the server refuses requests without it
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in written) and any(p.name == "entries.sqlite3" for p in written)
    for p in written:
        assert SECRET.encode() not in p.read_bytes(), p
    assert SECRET not in caplog.text and SECRET not in repr(rows) and SECRET not in repr(vars(judge))
    assert SECRET not in judge.cfg.model_dump_json()


def test_missing_key_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(JudgeSetupError, match=f"judge.api_key_env: environment variable '{KEY_ENV}'"):
        make_judge(JudgeConfig(backend="openai", api_key_env=KEY_ENV), home=tmp_path)


def test_cost_cap_stops_paid_calls_but_not_cache_hits(server: OpenAIServer, tmp_path: Path) -> None:
    judge = make_judge(config(server, cost_cap_usd=0.0), home=tmp_path)
    out = run(_with(judge, judge.ask(ACCURACY, question=Q, golds=["Paris"], prediction="Paris")))
    assert out.value is None and out.error == "CostCapExceeded" and not server.counts


def test_cache_is_shared_across_processes(server: OpenAIServer, tmp_path: Path) -> None:
    """Another process over the same workspace (a resumed run, a second worker) reuses the answers."""
    import json
    import subprocess
    import sys

    judge = make_judge(config(server), home=tmp_path)
    first = run(_with(judge, judge.ask(ACCURACY, question=Q, golds=["Paris"], prediction="Paris")))
    assert first.value is True and not first.cache_hit
    code = (
        "import asyncio, json, sys\n"
        "from arbor.config.judge import JudgeConfig\nfrom arbor.llm import make_judge\n"
        "from arbor.tasks.reporting.accuracy import ACCURACY\n"
        f"cfg = JudgeConfig.model_validate_json({config(server).model_dump_json()!r})\n"
        f"j = make_judge(cfg, home={str(tmp_path)!r})\n"
        f"o = asyncio.run(j.ask(ACCURACY, question={Q!r}, golds=['Paris'], prediction='Paris'))\n"
        "print(json.dumps([o.value, o.cache_hit, j.drain_calls()[0]['cost_usd']]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True, True, 0.0]
    assert set(server.counts.values()) == {1}  # the second process made no request


# what llama.cpp's server reports for SmolLM2-135M-Instruct's Q8_0 GGUF and for a larger model under the same alias
SMOLLM2 = {"vocab_type": 2, "n_vocab": 49152, "n_ctx_train": 8192, "n_embd": 576, "n_params": 134515008,
           "size": 138953472, "n_ctx": 8192}
BIGGER = {**SMOLLM2, "n_embd": 960, "n_params": 361821120, "size": 384778752}


def test_the_cache_key_follows_the_served_model_not_its_url(tmp_path: Path) -> None:
    """The same model behind a new URL (a resume after the judge moved) is a hit, even with another context size;
    another GGUF served under the same model name is a miss."""
    def ask(srv: OpenAIServer) -> tuple[bool | None, bool]:
        judge = make_judge(config(srv), home=tmp_path)
        out = run(_with(judge, judge.ask(ACCURACY, question=Q, golds=["Paris"], prediction="Paris")))
        return out.value, out.cache_hit

    with (OpenAIServer(api_key=SECRET, models={"test-judge": SMOLLM2}) as first,
          OpenAIServer(api_key=SECRET, models={"test-judge": {**SMOLLM2, "n_ctx": 4096}}) as moved,
          OpenAIServer(api_key=SECRET, models={"test-judge": BIGGER}) as other):
        assert ask(first) == (True, False) and sum(first.counts.values()) == 1
        assert moved.base_url != first.base_url
        assert ask(moved) == (True, True) and not moved.counts  # paid once, not twice
        assert ask(other) == (True, False) and sum(other.counts.values()) == 1  # not the old model's answer
        assert ask(first) == (True, True) and sum(first.counts.values()) == 1


def _searching(sample: int, n_search: int, passage_reps: int, reward: float) -> Trajectory:
    """A trajectory with a think, a query and a long result block per search (passages of ~40 * reps chars)."""
    body = "".join(f"<think>step {k} of {sample}: what is still missing</think>\n<search>tower {k} designer {sample}"
                   f"</search>\n<result>\nDoc {k}: {'passage text about towers and designers ' * passage_reps}\n"
                   "</result>\n" for k in range(n_search))
    return Trajectory("t", 1, 0, sample, "q0", Q, ["Paris"], text=f"{body}<answer>\\boxed{{Paris}}</answer>",
                      base_reward=reward, f1=reward, format_valid=True)


def _user(server: OpenAIServer) -> str:
    return server.bodies[0]["messages"][1]["content"]


def test_the_paper_profiles_show_the_pairwise_judge_both_whole_trajectories(server: OpenAIServer,
                                                                            tmp_path: Path) -> None:
    """App. E.3: qwen3-8b's judge settings send two ~30k-token trajectories (10 searches, long
    results) whole, every result body included, since they fit qwen-plus's 129,024-token input; before, each
    was compacted to 8,448 tokens and the judge never saw the evidence."""
    from arbor.config import load_config
    from arbor.llm.text import escape_block, estimate_tokens

    paper = load_config("qwen3-8b").judge
    a, b = _searching(0, 10, 300, 1.0), _searching(1, 10, 290, 0.0)
    assert min(estimate_tokens(a.text), estimate_tokens(b.text)) > 29_000  # each far over the old 8,448 cap
    cfg = config(server, max_judge_tokens=paper.max_judge_tokens, context_tokens=paper.context_tokens)
    judge = make_judge(cfg, home=tmp_path)
    assert run(_with(judge, ask_pairwise(judge, Q, a, b, RUBRIC))).ok
    user = _user(server)
    assert escape_block(a.text) in user and escape_block(b.text) in user and "elided" not in user


def test_a_prompt_that_does_not_fit_cuts_only_what_it_must(server: OpenAIServer, tmp_path: Path) -> None:
    """max_judge_tokens=null, a 20,000-token window: induction's four slots (best twice, worst, hard) hold ~6k +
    ~0.5k + ~6k + ~6k tokens and the prompt is over the window. The short worst stays whole and the long ones
    share what is left (bisection past the equal share (20,000 - 1,024 - own) / 4 ~ 4.4k), so the request fills
    the window to within a few markers; only result text is cut, every think and query survives."""
    from arbor.llm.text import escape_block, estimate_tokens, parse_trajectory
    from arbor.tasks.methods.arbor.induction import select_anchors

    best, worst, hard = _searching(0, 4, 150, 1.0), _searching(1, 1, 20, 0.0), _searching(2, 4, 150, 0.5)
    group = [best, worst, hard]
    anchors = select_anchors([t.f1 for t in group], [1, 1, 1], [True] * 3)
    assert [estimate_tokens(t.text) > 5_800 for t in group] == [True, False, True]
    judge = make_judge(config(server, max_judge_tokens=None, context_tokens=20_000), home=tmp_path)
    assert run(_with(judge, judge.ask(INDUCTION, question=Q, golds=["Paris"], trajectories=group, anchors=anchors, existing=[]))).ok
    user = _user(server)
    sent = sum(estimate_tokens(m["content"]) for m in server.bodies[0]["messages"])
    assert 20_000 - 300 <= sent + 1024 <= 20_000
    assert escape_block(worst.text) in user and "elided" in user
    for t in (best, hard):
        p = parse_trajectory(t.text)
        assert all(escape_block(x) in user for x in p.of("think") + p.queries)
