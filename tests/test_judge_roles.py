"""A judge role is declared once and both backends answer it without knowing it.

A test registers a role of its own (count the searches of a trajectory): the rules backend answers with the
role's heuristic, the OpenAI-compatible transport sends the role's prompt with its schema as ``response_format``
to a real HTTP server, parses the reply with the role's parser and records one ledger row; no backend changes.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai_server import FaultPlan, OpenAIServer
from pydantic import BaseModel

from arbor.config.judge import JudgeConfig
from arbor.llm import REGISTRY, Refusal, Role, make_judge, register, role_of
from arbor.llm.base import Messages
from arbor.llm.parse import parse_json
from arbor.llm.stream import StreamedJudge
from arbor.tasks.methods import load_roles
from arbor.types import Trajectory

SYSTEM = "You count searches. Reply with JSON only."


@dataclass(frozen=True)
class CountRequest:
    question: str
    trajectory: Trajectory


class CountOut(BaseModel):
    count: int


def _render(q: CountRequest, budget: int) -> tuple[str, Messages]:
    return "count.v1", [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": f"{q.question}\n{q.trajectory.text[: budget * 4]}"}]


def _heuristic(q: CountRequest, cfg: Any) -> int:
    if "<search>" not in q.trajectory.text and "<answer>" not in q.trajectory.text:
        raise Refusal("NothingToCount")
    return q.trajectory.text.count("<search>")


COUNT = Role(name="count_searches", request=CountRequest, render=_render,
             parse=lambda text, q: parse_json(text, CountOut).count,  # type: ignore[attr-defined]
             schema=CountOut, heuristic=_heuristic, identity=lambda q: (q.question, q.trajectory.text),
             texts=lambda q: 1, skip=lambda q: 0 if not q.trajectory.text else None)


@pytest.fixture
def count_role() -> Iterator[Role[CountRequest, int]]:
    register(COUNT)
    yield COUNT
    REGISTRY.pop(COUNT.name)


def traj(text: str) -> Trajectory:
    return Trajectory("t", 1, 0, 0, "q0", "q?", ["z"], text=text, base_reward=0.0, f1=0.0, format_valid=True)


TWO = "<search>a</search><result>x</result><search>b</search><result>y</result><answer>z</answer>"


BUILTIN_ROLES = ("induction", "consolidation", "pairwise", "accuracy", "rar_rubrics", "rar_rate", "stage_rubrics",
                 "stage_grades", "reflection_grades", "step_labels", "step_rubric", "step_verify", "rank_actions")


def test_every_builtin_role_is_declared_once_with_its_reply_schema() -> None:
    load_roles()
    assert set(BUILTIN_ROLES) <= set(REGISTRY)
    assert all(role_of(r).name == r for r in BUILTIN_ROLES)
    assert [r for r in BUILTIN_ROLES if role_of(r).schema is None] == []  # accuracy too: {"verdict": ...} under a schema
    with pytest.raises(ValueError, match="already registered"):
        register(Role(name="pairwise", request=CountRequest, render=_render, parse=lambda t, q: 0,
                      heuristic=_heuristic, identity=lambda q: ()))
    with pytest.raises(KeyError, match="no judge role 'nope'"):
        role_of("nope")


# which package declares which roles, in import order: what each one adds to the registry
OWNERS = {"arbor.tasks.methods.arbor": ["consolidation", "induction", "pairwise"],
          "arbor.tasks.methods.rar": ["rar_rate", "rar_rubrics"],
          "arbor.tasks.methods.ss_grpo": ["stage_grades", "stage_rubrics"],
          "arbor.tasks.methods.rubricem": ["reflection_grades"],  # it extends SS-GRPO and asks its stage roles too
          "arbor.tasks.methods.arco": ["step_labels"],
          "arbor.tasks.methods.coreact": ["rank_actions", "step_rubric", "step_verify"],
          "arbor.tasks.reporting.evaluate": ["accuracy"]}


def test_the_judge_machinery_declares_no_role_and_each_package_registers_its_own() -> None:
    """In a fresh process: ``arbor.llm`` (both backends, streaming) registers no role; importing each method's
    package adds exactly the roles it declares."""
    script = ("import importlib, json, sys\n"
              "import arbor.llm, arbor.llm.rules, arbor.llm.openai_backend, arbor.llm.stream\n"
              "from arbor.llm import REGISTRY\n"
              "out = {'arbor.llm': sorted(REGISTRY)}\n"
              "for pkg in sys.argv[1:]:\n"
              "    before = set(REGISTRY)\n"
              "    importlib.import_module(pkg)\n"
              "    out[pkg] = sorted(set(REGISTRY) - before)\n"
              "print(json.dumps(out))\n")
    done = subprocess.run([sys.executable, "-c", script, *OWNERS], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == {"arbor.llm": [], **OWNERS}


def test_the_rules_backend_answers_a_registered_role_with_its_heuristic(tmp_path: Path,
                                                                         count_role: Role[Any, Any]) -> None:
    judge = make_judge(JudgeConfig(backend="rules"), home=tmp_path)
    out = asyncio.run(judge.ask("count_searches", question="q?", trajectory=traj(TWO)))
    assert (out.value, out.error, out.attempts) == (2, None, 1)
    refused = asyncio.run(judge.ask("count_searches", question="q?", trajectory=traj("no tags")))
    assert (refused.value, refused.error) == (None, "NothingToCount")
    skipped = asyncio.run(judge.ask("count_searches", question="q?", trajectory=traj("")))
    assert (skipped.value, skipped.attempts) == (0, 0)
    rows = judge.drain_calls()
    assert [(r["role"], r["error"]) for r in rows] == [("count_searches", None), ("count_searches", "NothingToCount")]


def test_the_openai_transport_sends_a_registered_roles_prompt_and_schema(tmp_path: Path, count_role: Role[Any, Any],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARBOR_TEST_KEY", "sk-test")
    with OpenAIServer(FaultPlan(scripted={"You count searches": '{"count": 5}'}), api_key="sk-test") as srv:
        cfg = JudgeConfig(backend="openai", base_url=srv.base_url, model="m", api_key_env="ARBOR_TEST_KEY",
                          backoff_base_s=0.0, structured_outputs="json_schema")
        judge = make_judge(cfg, home=tmp_path)
        streamed = StreamedJudge(judge)  # the streamed wrapper forwards ask like any role
        try:
            out = asyncio.run(streamed.ask("count_searches", question="q?", trajectory=traj(TWO)))
        finally:
            streamed.close()
        body = srv.bodies[-1]
    assert (out.value, out.error, out.attempts) == (5, None, 1)  # the server's reply, not the heuristic's 2
    assert body["messages"][0]["content"] == SYSTEM
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "count_searches", "schema": CountOut.model_json_schema()}}
    [row] = streamed.drain_calls()
    assert (row["role"], row["prompt_version"], row["attempts"]) == ("count_searches", "count.v1", 1)
    assert json.loads(json.dumps(row))  # a plain ledger row
