"""Data sources as plug-ins: a user's source reaches the question loader, the search factory and
the SFT key exactly as arbor's synthetic world does; bad specs and bad sources are refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbor.config import ArborConfig, load_config
from arbor.config.search import SearchConfig
from arbor.plugins import PluginError
from arbor.tasks.env import sources
from arbor.tasks.env.datasets import DatasetError, load_questions
from arbor.tasks.env.search import SearchError, make_search
from arbor.tasks.env.sources import Source, find_source, register_source, source_names


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry of this test's own: what it registers is gone afterwards."""
    monkeypatch.setattr(sources, "_loaded", dict(sources._loaded))


def test_the_world_is_found_through_its_entry_point() -> None:
    from arbor.tasks.env import world

    assert "world" in source_names() and find_source("world") is world.SOURCE
    assert find_source("offline") is None  # the shipped splits are the loader's own, not a source


def test_a_users_source_serves_questions_and_corpus(registry, tmp_path: Path) -> None:
    from examples.capitals_source import SOURCE

    register_source("capitals", SOURCE)
    train, eval_ = load_questions("capitals:train"), load_questions("capitals:eval", config=ArborConfig())
    assert len(train) == 4 and {q.golds[0] for q in eval_} == {"Lima", "Cairo"}
    assert len(load_questions("capitals:train", size=2, seed=1)) == 2
    backend = make_search(SearchConfig(corpus="capitals:corpus", top_k=1, cache=False), home=tmp_path)
    assert backend.search(["capital of Kenya"], 1)[0][0].text == "The capital of Kenya is Nairobi."
    with pytest.raises(DatasetError, match="capitals:eval"):
        load_questions("capitals:test")
    with pytest.raises(ValueError, match="capitals:corpus"):
        make_search(SearchConfig(corpus="capitals:passages", cache=False), home=tmp_path)


def test_a_source_without_a_part_is_refused_by_name(registry, tmp_path: Path) -> None:
    register_source("qonly", Source(questions=lambda name, cfg: []))
    assert load_questions("qonly:anything") == []
    with pytest.raises(SearchError, match="'qonly' serves no corpus"):
        make_search(SearchConfig(corpus="qonly:corpus"), home=tmp_path)
    register_source("conly", Source(corpus=lambda name, cfg, home: home))
    with pytest.raises(DatasetError, match="'conly' serves no questions"):
        load_questions("conly:train")


def test_an_unknown_prefix_names_the_known_sources() -> None:
    with pytest.raises(DatasetError, match=r"known sources: .*world:\.\.\."):
        load_questions("wrld:train")


def test_a_source_key_joins_the_sft_key_only_when_named(registry) -> None:
    from arbor.flows.sft import sft_key

    register_source("capitals", Source(key=lambda cfg: {"version": 1}))
    plain, named = load_config("tiny-cpu"), load_config("tiny-cpu", {"data.train": "capitals:train"})
    before = sft_key(plain), sft_key(named)
    assert before[0] != before[1]
    register_source("capitals", Source(key=lambda cfg: {"version": 2}))  # the source's data changed
    assert sft_key(plain) == before[0] and sft_key(named) != before[1]


def test_an_entry_point_that_is_no_source_is_refused(registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "_declared", lambda: {"bad": "arbor.tasks.env.sources:GROUP", "gone": "no.such:X"})
    with pytest.raises(PluginError, match="entry point 'bad'.*expected an arbor.tasks.env.sources.Source"):
        find_source("bad")
    with pytest.raises(PluginError, match="entry point 'gone': cannot import"):
        find_source("gone")


def test_preflight_imports_the_named_sources(registry, monkeypatch: pytest.MonkeyPatch) -> None:
    from arbor.preflight import check

    monkeypatch.setattr(sources, "_declared", lambda: {"gone": "no.such:X"})
    problems = check(load_config("tiny-cpu", {"data.train": "gone:train"}), gpu_count=0, env={})
    assert any("entry point 'gone': cannot import 'no.such'" in p for p in problems), problems
