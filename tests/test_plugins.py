"""Plug-ins by import path: reward.fn, search.backend, judge.backend. Each worked example under
examples/ is checked by hand here and runs one RL step in tests/test_flow_train.py; a wrong plug-in is refused
before anything starts, naming the key."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arbor.config import ConfigError, load_config
from arbor.llm import make_judge
from arbor.plugins import PluginError
from arbor.preflight import check
from arbor.reward import load_reward_fn, score_trajectory
from arbor.tasks.env.search import make_search
from arbor.tasks.reporting.accuracy import ACCURACY
from arbor.types import Trajectory

REWARD = "examples.search_cost_reward:em_minus_search_cost"
SEARCH = "examples.keyword_search:KeywordSearch"
JUDGE = "examples.lenient_judge:LenientJudge"


def _traj(text: str, calls: int) -> Trajectory:
    return Trajectory(run_id="r", step=0, group=0, sample=0, question_id="q", question="?", golds=["Paris"],
                      text=text, search_calls=calls)


def _refuse(trajectory: Trajectory, golds: list[str]) -> float:
    raise AssertionError("the format gate must not ask the plug-in")


def test_reward_plugin_behind_and_without_the_format_gate() -> None:
    fn = load_reward_fn(load_config("tiny-cpu", {"reward.fn": REWARD}).reward)
    good = score_trajectory(_traj("<think>x</think><answer>\\boxed{paris}</answer>", 2), False, fn)
    assert (good.em, good.f1, good.base_reward) == (1.0, 1.0, pytest.approx(1.0 - 2 * 0.05))
    wrong = score_trajectory(_traj("<think>x</think><answer>\\boxed{lyon}</answer>", 1), False, fn)
    assert wrong.base_reward == pytest.approx(-0.05)  # F1 would say 0; the plug-in's price shows
    gated = score_trajectory(_traj("no tags at all", 3), False, _refuse)
    assert gated.base_reward == -1.0 and not gated.format_valid
    ungated = score_trajectory(_traj("no tags at all", 3), False, fn, format_gate=False)
    assert ungated.base_reward == pytest.approx(-0.15) and not ungated.format_valid
    with pytest.raises(PluginError, match=r"reward.fn returned 'high' for trajectory"):
        score_trajectory(_traj("<answer>\\boxed{paris}</answer>", 0), False, lambda t, g: "high")  # type: ignore


def test_keyword_search_plugin_ranks_by_word_overlap(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in [
        {"title": "Lyon", "text": "Lyon is a city in France."},
        {"title": "Paris", "text": "Paris is the capital of France."},
        {"title": "Peru", "text": "Lima is the capital of Peru."}]))
    cfg = load_config("tiny-cpu", {"search.backend": SEARCH, "search.corpus": str(corpus), "search.cache": False})
    backend = make_search(cfg.search, home=tmp_path)
    [hits, none] = backend.search(["capital of France", "zzz"], 2)
    # overlap: Paris 3 (capital, of, france), Peru 2 (capital, of), Lyon 1 (france)
    assert [(h.title, h.score) for h in hits] == [("Paris", 3.0), ("Peru", 2.0)] and none == []


def test_lenient_judge_plugin_accepts_a_contained_alias(tmp_path: Path) -> None:
    lenient = make_judge(load_config("tiny-cpu", {"judge.backend": JUDGE}).judge, home=tmp_path)
    strict = make_judge(load_config("tiny-cpu").judge, home=tmp_path)
    ask = lambda j, pred: asyncio.run(  # noqa: E731
        j.ask(ACCURACY, question="who?", golds=["Lovelace"], prediction=pred)).value
    assert ask(lenient, "Ada Lovelace") and not ask(strict, "Ada Lovelace")
    assert ask(lenient, "lovelace") and not ask(lenient, "Babbage") and not ask(lenient, None)
    assert lenient.backend == "lenient-rules"


@pytest.mark.parametrize(("key", "spec", "words"), [
    ("reward.fn", "no_such_pkg.mod:fn", "reward.fn: cannot import 'no_such_pkg.mod'"),
    ("reward.fn", "examples.search_cost_reward:nope", "reward.fn: module 'examples.search_cost_reward' has no 'nope'"),
    ("reward.fn", "examples.search_cost_reward:PRICE", "reward.fn: examples.search_cost_reward:PRICE is not callable"),
    ("reward.fn", "examples.keyword_search:KeywordSearch", "cannot be called as (trajectory, golds)"),
    ("search.backend", "examples.keyword_search:WORD", "search.backend: examples.keyword_search:WORD is not a class"),
    ("judge.backend", SEARCH, "judge.backend: examples.keyword_search:KeywordSearch is not a subclass of "
                              "arbor.llm.Judge"),
    ("judge.backend", "arbor.llm:Judge", "leaves abstract methods unimplemented"),
])
def test_a_wrong_plugin_is_named_before_anything_starts(key: str, spec: str, words: str) -> None:
    problems = "\n".join(check(load_config("tiny-cpu", {key: spec}), gpu_count=0, env={}))
    assert words in problems, problems


def test_plugin_keys_refuse_what_is_neither_a_name_nor_an_import_path() -> None:
    for key, expected in [("search.backend", "bm25, http, web"), ("judge.backend", "rules, openai, world, random")]:
        with pytest.raises(ConfigError, match=rf"{key}: expected one of {expected} or a plug-in"):
            load_config("tiny-cpu", {key: "bm26"})
    with pytest.raises(ConfigError, match="reward.fn: String should match pattern"):
        load_config("tiny-cpu", {"reward.fn": "not a path"})


def test_cli_refuses_a_wrong_plugin_in_one_line_under_three_seconds(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "arbor.cli", "train", "-p", "tiny-cpu", "reward.fn=no_such.mod:fn"],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={"ARBOR_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}, timeout=60)
    took = time.perf_counter() - t0
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "reward.fn: cannot import 'no_such.mod'" in lines[0]
    assert took < 3.0, took
