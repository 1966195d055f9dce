"""A real judge: llama.cpp's OpenAI-compatible server on the shipped SmolLM2-135M-Instruct, started by
the test from ``.venv-judge`` (``make test`` builds it first: ``make judge-env``, ~2.5 min on two cores), answers one
RL step of every method that asks a judge. A 135M judge answers badly often: each step must end, every call must
be in the ledger with its attempts, and whatever failed must have fallen back (the run never dies of a judge)."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flow_support import STAGED, table

from arbor.llm.answers import answer_problem, template_of
from arbor.llm.openai_backend import _role_schema
from arbor.paths import PROJECT_ROOT
from arbor.tasks.env.policy import shipped_gguf
from arbor.tasks.env.serving import Supervised, llama_judge_spec, served_gguf

pytestmark = pytest.mark.slow

JUDGE_PYTHON = PROJECT_ROOT / ".venv-judge" / "bin" / "python"
KEY_ENV = "ARBOR_LOCAL_JUDGE_KEY"
# one step of each method that asks a judge, so that every judge role's prompt is answered by the real judge once:
# no-memory asks ARBOR's induction and pairwise roles and SS-GRPO RubricEM's stage roles, so each is covered by the
# method that asks a superset (CI time). Co-ReAct guides GRPO's rollouts with the judge's step rubrics: it asks
# three calls a turn, so two trajectories of one question are enough to ask every one of its roles; so do ARCO (the
# teacher labels each trajectory's steps) and RubricEM, which judges every stage of every trajectory (its step took
# 219 s with 2 questions x 4).
METHODS: dict[str, dict[str, Any]] = {
    "arbor": {"run.method": "arbor"},
    "rar": {"run.method": "rar"},  # 2 x 4: with 1 x 2 its one rubric list failed, and no rating was asked
    "arco": {"run.method": "arco", "arco.warmup_steps": 1, "rollout.batch_size": 1, "rollout.k": 2},  # teacher: step 1
    "rubricem": {"run.method": "rubricem", **STAGED, "rollout.batch_size": 1, "rollout.k": 2},
    "co-react": {"run.method": "grpo", "guidance.mode": "co-react", "guidance.source": "judge",
                 "rollout.batch_size": 1, "rollout.k": 2},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def llama_judge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server, up for the module: its /v1 URL."""
    if not JUDGE_PYTHON.is_file():
        pytest.fail(f"{JUDGE_PYTHON} not found: `make judge-env` builds llama.cpp's server (`make test` does)")
    where = tmp_path_factory.mktemp("llama")
    gguf = served_gguf(str(JUDGE_PYTHON), shipped_gguf("smollm2"), where)  # as `arbor judge serve` serves it
    # one thread: the other pytest worker has the other core (two threads each waited on the other's sleep)
    spec = llama_judge_spec(str(JUDGE_PYTHON), gguf, port=_free_port(), alias="smollm2", n_ctx=4096, threads=1)
    log = where / "server.log"
    server = Supervised(spec, startup_timeout_s=180, max_restarts=0, log_path=str(log))
    server.start()
    try:
        yield spec.base_url
    finally:
        server.stop()


@pytest.mark.parametrize("name", list(METHODS))
def test_one_step_of_each_method_with_the_real_judge(name: str, llama_judge: str, sft_policy: Path,
                                                     prefect_harness: Any, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from arbor.flows.train import arbor_train

    monkeypatch.setenv(KEY_ENV, "local")
    monkeypatch.setenv("ARBOR_HOME", str(tmp_path))
    start = sft_policy
    if METHODS[name].get("rollout.protocol", "arbor") != "arbor":
        # the flat SFT start, as a user's own checkpoint (no arbor_sft.json): train start-up refuses an arbor SFT
        # output of another protocol, and this test is about the judge's answers, not the policy's stages
        start = tmp_path / "user-start"
        shutil.copytree(sft_policy, start, ignore=shutil.ignore_patterns("arbor_sft.json"))
    o = {"run.steps": 1, "run.sft_warm_start": False, "run.start_checkpoint": str(start),
         "run.eval_every": None, "rollout.batch_size": 2, "rollout.k": 4, "checkpoint.every": 1,
         "judge.backend": "openai", "judge.base_url": llama_judge, "judge.model": "smollm2",
         "judge.api_key_env": KEY_ENV, "judge.context_tokens": 4096, "judge.max_judge_tokens": 384,
         "judge.timeout_s": 120.0, "judge.max_retries": 0, "judge.concurrency": 1, **METHODS[name]}
    arbor_train(profile="tiny-cpu", overrides=o, run_id=name)
    [step] = table("steps", name, tmp_path)
    assert step["step"] == 1 and step["mean_total_reward"] == step["mean_total_reward"]  # finite, not NaN
    calls = table("judge_calls", name, tmp_path)
    sent = [c for c in calls if c["attempts"]]
    assert sent, f"{name}: the judge was never asked"
    assert {(c["backend"], c["model"]) for c in calls} == {("openai", "smollm2")}
    for c in sent:  # every attempt in the ledger; the last one decides the call
        last = c["attempt_errors"][-1]  # InvalidAnswer attempts carry the filter's reason
        assert len(c["attempt_errors"]) == c["attempts"] and len(c["attempt_replies"]) == c["attempts"]
        assert last == c["error"] or (c["error"] == "InvalidAnswer" and last == f"InvalidAnswer:{c['refusal']}")
    valid = sum(c["error"] is None for c in sent)
    if name == "arbor":  # no draft or common rubric in the memory is the induction prompt's template
        kept = [e for e in table("rubric_events", name, tmp_path) if e["event"] in ("induced", "consolidated")]
        for e in kept:
            reply = {"rubrics": [{k: e[k] for k in ("title", "description", "counter_description")}]}
            assert answer_problem(reply, template_of("induction.v1"), _role_schema("induction")) is None, e
    # the share of each role's signal that came from the judge (a valid answer) and from a fallback (a failed
    # call, filled neutrally by the method): the per-method report, printed with `pytest -s`
    per_role = {r: (sum(c["error"] is None for c in sent if c["role"] == r), sum(c["role"] == r for c in sent))
                for r in sorted({c["role"] for c in sent})}
    print(f"\n{name}: {len(sent)} judge calls, {valid} valid ({valid / len(sent):.0%}), "
          f"{sum(c['attempts'] for c in sent) - len(sent)} retries, "
          f"{sum(c['latency_s'] or 0.0 for c in sent):.1f} s of judging; from the judge / fallback per role: "
          + ", ".join(f"{r} {v}/{n - v}" for r, (v, n) in per_role.items()))
