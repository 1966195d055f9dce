"""The synthetic multi-hop world: determinism, entity split, grounded answers, BM25 recall, question mix,
comparison answers, SFT gold trajectories with process flaws, the public dataset / corpus / config hooks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from arbor.config import ArborConfig, ConfigError, load_config
from arbor.config.search import SearchConfig
from arbor.config.world import WorldConfig
from arbor.format import check_format, extract_answer, extract_results, extract_searches, result_block
from arbor.tasks.env.datasets import DatasetError, load_questions
from arbor.tasks.env.search import bm25_tokenize, format_results, load_corpus, make_search
from arbor.tasks.env.world.entities import (
    WORLD_CORPUS,
    Entity,
    World,
    WorldError,
    build_world,
    corpus_rows,
    world_corpus_path,
)
from arbor.tasks.env.world.questions import _make_question, kind_counts, world_questions
from arbor.tasks.env.world.sft import synthesize_world

SMALL = WorldConfig(people=40, cities=12, films=40, companies=16, train_questions=120, eval_questions=40)
SMALL_RUN = ArborConfig(world=SMALL)  # what the loaders get: the run's whole config
TOP_K, MAX_CHARS = 3, 200  # the tiny-cpu search budget


def _mentions(text: str, name: str) -> bool:
    return _names_re([name]).search(text) is not None


def _names_re(names) -> re.Pattern:
    """Any of ``names`` as a whole word (not inside a longer word)."""
    alternation = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(rf"(?<![A-Za-z])(?:{alternation})(?![A-Za-z])")


@pytest.fixture(scope="module")
def search(tmp_path_factory):
    """The real BM25 backend over the default world's corpus (no result cache)."""
    home = tmp_path_factory.mktemp("world_home")
    cfg = SearchConfig(corpus=WORLD_CORPUS, top_k=TOP_K, max_result_chars=MAX_CHARS, cache=False)
    return make_search(cfg, home=home)  # no config: the world's defaults


@pytest.fixture(scope="module")
def sft_rows(search):
    cfg = WorldConfig()
    return synthesize_world(world_questions(cfg, "train"), search, cfg, seed=0, top_k=TOP_K,
                            max_result_chars=MAX_CHARS, max_searches=3)


# ------------------------------------------------------------------------------------------------ the world


def test_same_config_gives_identical_world_and_another_seed_a_different_one(tmp_path: Path) -> None:
    a, b = world_corpus_path(SMALL, tmp_path / "a"), world_corpus_path(SMALL, tmp_path / "b")
    assert a.name == b.name and a.read_bytes() == b.read_bytes()
    assert world_corpus_path(SMALL, tmp_path / "a").stat().st_mtime_ns == a.stat().st_mtime_ns  # written once
    from arbor.tasks.env.world import entities, questions

    entities._build_world.cache_clear()
    questions._world_questions.cache_clear()  # regenerate from scratch, not from the cache
    for split in ("train", "eval"):
        first = [q.__dict__ for q in world_questions(SMALL, split)]
        questions._world_questions.cache_clear()
        entities._build_world.cache_clear()
        assert [q.__dict__ for q in world_questions(SMALL, split)] == first
    other = SMALL.model_copy(update={"seed": 1})
    c = world_corpus_path(other, tmp_path / "a")
    assert c != a and c.read_bytes() != a.read_bytes()
    assert [q.question for q in world_questions(other, "train")] != [q.question for q in world_questions(SMALL, "train")]
    # the question sizes / mix do not change the corpus, only the entities do
    assert world_corpus_path(SMALL.model_copy(update={"train_questions": 7}), tmp_path / "a") == a


def test_names_are_unique_short_and_kept_by_bm25() -> None:
    from arbor.tasks.env.policy import TinyPolicyConfig, train_tokenizer

    world = build_world(WorldConfig())
    names = [e.name for e in world.entities.values()]
    assert len(set(names)) == len(names)
    words = [w for e in world.entities.values() for w in e.name.split() if e.kind != "company"]
    words += [e.name.split()[0] for e in world.entities.values() if e.kind == "company"] + list(world.countries)
    assert len(set(words)) == len(words)  # every name word is used once in the whole world
    assert bm25_tokenize(words) == [[w.lower()] for w in words]  # no name word is a BM25 stopword
    tok = train_tokenizer(TinyPolicyConfig().vocab_size)  # the tiny-cpu policy's tokenizer
    counts = [len(tok.tokenize(" " + n)) for n in names]
    assert max(counts) <= 4, [n for n, c in zip(names, counts, strict=True) if c > 4][:5]


def test_passages_are_short_and_state_every_fact() -> None:
    world = build_world(WorldConfig())
    for e in world.entities.values():
        text = world.passages[e.eid]
        assert len(text) <= MAX_CHARS and _mentions(text, e.name) and str(e.year) in text
        for target in e.facts.values():
            value = world.entities[target].name if target in world.entities else target
            assert _mentions(text, value), (e.eid, text)


def test_entity_split_eval_questions_only_involve_eval_entities() -> None:
    cfg = WorldConfig()
    world = build_world(cfg)
    names = {s: {e.name for e in world.entities.values() if e.split == s} for s in ("train", "eval")}
    ids = {s: {e.eid for e in world.entities.values() if e.split == s} for s in ("train", "eval")}
    assert names["train"] and names["eval"] and not names["train"] & names["eval"]
    for split, other in (("eval", "train"), ("train", "eval")):
        foreign = _names_re(names[other])
        for q in world_questions(cfg, split):
            assert q.split == split and {h.doc_id for h in q.path} <= ids[split]
            text = " ".join([q.question, q.answer, *(h.query for h in q.path), *(h.title for h in q.path)])
            assert not foreign.search(text), (q.question_id, foreign.search(text))
            # both hops: the passages on the gold path only name entities of the same split
            for h in q.path:
                assert not foreign.search(world.passages[h.doc_id])


def test_every_gold_answer_is_verbatim_in_a_gold_passage() -> None:
    cfg = WorldConfig()
    world = build_world(cfg)
    for split in ("train", "eval"):
        for q in world_questions(cfg, split):
            last = world.passages[q.path[-1].doc_id]
            if q.kind == "comparison":
                assert q.answer in {h.title for h in q.path}
                assert any(_mentions(world.passages[h.doc_id], q.answer) for h in q.path)
            else:
                assert _mentions(last, q.answer), (q.question, q.answer, last)
        # the bridge entity is named in the first passage and searched by name
        bridges = [q for q in world_questions(cfg, split) if q.kind == "bridge"]
        assert bridges and all(_mentions(world.passages[q.path[0].doc_id], q.path[1].title) for q in bridges)


def test_gold_queries_find_the_gold_passage_with_real_bm25(search) -> None:
    cfg = WorldConfig()
    for split in ("train", "eval"):
        hops = [h for q in world_questions(cfg, split) for h in q.path]
        assert all(h.query == h.title for h in hops)  # the gold query names the entity
        hits = search.search([h.query for h in hops], TOP_K)
        at1 = sum(r[0].doc_id == h.doc_id for h, r in zip(hops, hits, strict=True) if r) / len(hops)
        at3 = sum(h.doc_id in [x.doc_id for x in r] for h, r in zip(hops, hits, strict=True)) / len(hops)
        assert at3 >= 0.95 and at1 >= 0.9, (split, at1, at3)


@pytest.mark.parametrize("shares", [(0.4, 0.4, 0.2), (0.5, 0.3, 0.2), (1.0, 0.0, 0.0), (0.1, 0.1, 0.8)])
def test_question_mix_matches_the_config(shares) -> None:
    one, bridge, comp = shares
    cfg = SMALL.model_copy(update={"share_one_hop": one, "share_bridge": bridge, "share_comparison": comp,
                                   "train_questions": 77, "eval_questions": 33})
    for split, n in (("train", 77), ("eval", 33)):
        qs = world_questions(cfg, split)
        assert len(qs) == n and len({q.question for q in qs}) == n
        got = {k: sum(q.kind == k for q in qs) for k in ("one_hop", "bridge", "comparison")}
        for k, share in zip(("one_hop", "bridge", "comparison"), shares, strict=True):
            assert abs(got[k] - share * n) <= 1, (split, got)
        assert got == kind_counts(n, cfg)
        for q in qs:
            assert len(q.path) == {"one_hop": 1, "bridge": 2, "comparison": 2}[q.kind]


def test_comparison_answers_follow_the_years() -> None:
    # fixed examples, computed by hand
    a = Entity("company-0000", "company", "Tobara Group", "train", 1921, {})
    b = Entity("company-0001", "company", "Velix Press", "train", 1950, {})
    world = World({a.eid: a, b.eid: b}, {}, ())
    import random

    for direction, want in (("earlier", "Tobara Group"), ("later", "Velix Press")):
        for s in range(4):  # either order of the two names in the text
            q = _make_question(world, "comparison", ("company", direction, a, b), random.Random(s), "x", "train")
            assert q.answer == want and "Tobara Group" in q.question and "Velix Press" in q.question
    # every generated comparison, against the years read back from the passages' text
    cfg = WorldConfig()
    full = build_world(cfg)
    earlier = re.compile(r"earlier|first|older")
    for split in ("train", "eval"):
        comps = [q for q in world_questions(cfg, split) if q.kind == "comparison"]
        assert comps
        for q in comps:
            years = {}
            for h in q.path:
                text = full.passages[h.doc_id]
                own = [int(y) for y in re.findall(r"\b\d{3,4}\b", text)]
                assert len(own) == 1
                years[h.title] = own[0]
            (n1, y1), (n2, y2) = years.items()
            assert y1 != y2
            want = (n1 if y1 < y2 else n2) if earlier.search(q.question) else (n1 if y1 > y2 else n2)
            assert q.answer == want, (q.question, years)


# ------------------------------------------------------------------------------------------------ SFT


def _gold_shown_before_last_search(row: dict, titles: list[str]) -> bool:
    shown: set[str] = set()
    results = extract_results(row["response"])
    for i, body in enumerate(results):
        shown.update(re.findall(r"\(Title: ([^)]*)\)", body))
        if set(titles) <= shown and i < len(results) - 1:
            return True
    return False


def test_sft_rows_are_valid_gold_trajectories_with_the_configured_flaws(search, sft_rows) -> None:
    cfg = WorldConfig()
    world = build_world(cfg)
    qs = {q.question_id: q for q in world_questions(cfg, "train")}
    any_name = _names_re(e.name for e in world.entities.values())
    eval_name = _names_re(e.name for e in world.entities.values() if e.split == "eval")
    flaws = [r["flaw"] for r in sft_rows]
    assert len(sft_rows) == len(qs)
    n_flawed = sum(f != "none" for f in flaws)
    assert n_flawed == round(cfg.sft_flaw_share * len(sft_rows))
    per_kind = [flaws.count(k) for k in cfg.sft_flaw_kinds]
    assert max(per_kind) - min(per_kind) <= 1
    for row in sft_rows:
        q = qs[row["question_id"]]
        fmt = check_format(row["response"])
        assert fmt.valid, (row["question_id"], fmt.reason)
        assert extract_answer(row["response"]) == q.answer == row["golds"][0]
        queries = extract_searches(row["response"])
        assert len(queries) <= 3 and row["grounded"]
        # the result blocks are what the agent loop would append for these queries
        for query, body in zip(queries, extract_results(row["response"]), strict=True):
            want = result_block(format_results(search.search([query], TOP_K)[0], MAX_CHARS)).strip()
            assert f"<result>\n{body}\n</result>" == want
        titles = [h.title for h in q.path]
        repeated = len(set(queries)) < len(queries)
        late = _gold_shown_before_last_search(row, titles)
        generic = [s for s in queries if not any_name.search(s)]
        present = {"repeated_query": repeated, "search_after_answer": late, "generic_query": bool(generic)}
        if row["flaw"] == "none":
            assert not any(present.values()), (row["question_id"], present)
            assert [s.split(" ")[0] for s in queries] == [t.split(" ")[0] for t in titles]  # the gold path
        else:
            assert present[row["flaw"]], (row["flaw"], row["response"])
        # the policy's own text (results removed) never names an eval entity
        policy_text = re.sub(r"<result>.*?</result>", "", row["response"], flags=re.DOTALL)
        assert not eval_name.search(policy_text)


def test_sft_responses_fit_the_tiny_budget(sft_rows) -> None:
    assert max(len(r["response"]) for r in sft_rows) < 2500  # ~450 tokens of the tiny tokenizer at most


def test_world_sft_data_through_flows_sft(arbor_home: Path) -> None:
    from arbor.flows.sft import sft_data_path, sft_key
    from arbor.tasks.env.sft_data import SFTDataError, read_sft_data

    over = {"sft.data": "world:train", "data.train": "world:train", "search.corpus": WORLD_CORPUS,
            "sft.questions": 20, "sft.variants": 2, "world.train_questions": 60, "world.people": 40,
            "world.films": 40, "world.companies": 16, "world.cities": 12, "world.sft_flaw_share": 0.25}
    cfg = load_config("tiny-cpu", over)
    path = sft_data_path(cfg, arbor_home, sft_key(cfg))
    rows = read_sft_data(path)
    assert len(rows) == 40 and sum(r["flaw"] != "none" for r in rows) == 10
    assert {r["question_id"] for r in rows} == {q.question_id for q in world_questions(cfg.world, "train")[:20]}
    assert all(check_format(r["response"]).valid for r in rows)
    # the SFT key follows the world only when the world is used
    assert sft_key(cfg) != sft_key(load_config("tiny-cpu", {**over, "world.seed": 3}))
    plain = load_config("tiny-cpu")
    assert sft_key(plain) == sft_key(load_config("tiny-cpu", {"world.seed": 3}))
    with pytest.raises(SFTDataError, match="search.corpus"):
        bad = load_config("tiny-cpu", {"sft.data": "world:train"})
        sft_data_path(bad, arbor_home, "k-bad")


# ------------------------------------------------------------------------------------------------ public API


def test_load_questions_world_splits_through_the_public_api() -> None:
    default = WorldConfig()
    train, eval_ = load_questions("world:train"), load_questions("world:eval")
    assert (len(train), len(eval_)) == (default.train_questions, default.eval_questions)
    small = load_questions("world:train", config=SMALL_RUN)
    assert len(small) == SMALL.train_questions and len(load_questions("world:eval", config=SMALL_RUN)) == 40
    q = small[0]
    assert q.question_id == "world-train-0000" and q.source.startswith("world:") and q.support and q.golds
    assert len(load_questions("world:train", config=SMALL_RUN, size=10, seed=1)) == 10
    assert not {x.question_id for x in train} & {x.question_id for x in eval_}
    with pytest.raises(DatasetError, match="world:eval"):
        load_questions("world:test")


def test_world_corpus_through_make_search(tmp_path: Path) -> None:
    cfg = SearchConfig(corpus=WORLD_CORPUS, top_k=3, cache=False)
    backend = make_search(cfg, home=tmp_path, config=SMALL_RUN)
    path = world_corpus_path(SMALL, tmp_path)
    assert path.parent == tmp_path / "world" and backend.corpus_path == path
    passages = load_corpus(path)
    assert [p.doc_id for p in passages] == [r["id"] for r in corpus_rows(SMALL)]
    assert len(passages) == SMALL.people + SMALL.cities + SMALL.films + SMALL.companies
    first = json.loads(path.read_text().splitlines()[0])
    assert backend.search([first["title"]], 3)[0][0].doc_id == first["id"]


@pytest.mark.parametrize(("override", "key"), [
    ({"world.eval_share": 1.5}, "world.eval_share"),
    ({"world.people": 1}, "world.people"),
    ({"world.share_bridge": 0.9}, "world.share_"),
    ({"world.sft_flaw_kinds": ["typo"]}, "world.sft_flaw_kinds"),
    ({"world.sft_flaw_share": -0.1}, "world.sft_flaw_share"),
])
def test_invalid_world_config_is_refused_naming_its_key(override, key) -> None:
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config("tiny-cpu", override)


def test_world_that_cannot_be_generated_is_refused_naming_its_key() -> None:
    with pytest.raises(ConfigError, match="world.colour"):
        load_config("tiny-cpu", {"world.colour": 1})
    with pytest.raises(DatasetError, match="world.eval_questions"):
        load_questions("world:eval", config=ArborConfig(world=SMALL.model_copy(update={"eval_questions": 5000})))
    with pytest.raises(WorldError, match="world.cities"):
        build_world(WorldConfig(cities=4, eval_share=0.1))
    with pytest.raises(WorldError, match="world.people"):
        build_world(WorldConfig(people=1500))


def test_kind_splits_keep_one_kind_with_the_same_ids_and_order() -> None:
    from arbor.tasks.env.world.entities import WorldError
    from arbor.tasks.env.world.questions import load_world_questions

    full = world_questions(SMALL, "train")
    bridge = world_questions(SMALL, "train-bridge")
    assert bridge and all(q.kind == "bridge" for q in bridge)
    assert bridge == [q for q in full if q.kind == "bridge"]  # same questions, ids and order as in world:train
    parts = [world_questions(SMALL, f"train-{k}") for k in ("one_hop", "bridge", "comparison")]
    assert sorted(q.question_id for p in parts for q in p) == sorted(q.question_id for q in full)
    assert [q.question_id for q in load_world_questions("eval-comparison", SMALL)] == \
        [q.question_id for q in world_questions(SMALL, "eval") if q.kind == "comparison"]
    for bad in ("train-bridges", "dev-bridge", "train-"):
        with pytest.raises(WorldError, match="unknown world split"):
            world_questions(SMALL, bad)


def test_three_hop_questions_follow_two_bridges_and_leave_the_mix_alone() -> None:
    """``world:<split>-three_hop``: "In which country is the birthplace of the director of the film
    F?" -- the answer is the third fact down the chain, the gold path names all three entities, the split's entities
    only; the default mix (``world:train``) has no three-hop question, so its ids and text stay as they were."""
    from arbor.tasks.env.world.entities import fact

    world = build_world(SMALL)
    for split in ("train", "eval"):
        qs = world_questions(SMALL, f"{split}-three_hop")
        assert qs and len({q.question_id for q in qs}) == len(qs) <= (120 if split == "train" else 40)
        assert all(q.question_id.startswith(f"world-{split}-3h-") for q in qs)
        assert len({q.relation for q in qs}) > 4  # round-robin over the chains
        for q in qs:
            first, second, third = q.relation.split(">")
            a, b, c = (world.entities[h.doc_id] for h in q.path)
            assert {a.split, b.split, c.split} == {split}
            assert fact(world, a, first)[1] == b and fact(world, b, second)[1] == c
            assert q.answer == fact(world, c, third)[0]
            assert _mentions(q.question, a.name) and not _mentions(q.question, b.name)
    assert all(q.kind != "three_hop" for q in world_questions(SMALL, "train"))
    q = world_questions(SMALL, "train-three_hop")[0]
    assert q.to_question().support == [h.doc_id for h in q.path]


def test_three_hop_sft_rows_search_each_entity_of_the_chain(search) -> None:
    """A three-hop gold trajectory searches the subject, then each bridge entity its results name, and stays
    well-formed (three searches: ``rollout.max_searches`` 3)."""
    cfg = WorldConfig()
    qs = world_questions(cfg, "train-three_hop")[:30]
    rows = synthesize_world(qs, search, cfg.model_copy(update={"sft_flaw_share": 0.0}), seed=0, top_k=TOP_K,
                            max_result_chars=MAX_CHARS, max_searches=3)
    world = build_world(cfg)
    for q, row in zip(qs, rows, strict=True):
        queries = extract_searches(row["response"])
        assert len(queries) == 3
        for query, hop in zip(queries, q.path, strict=True):
            assert _mentions(query, world.entities[hop.doc_id].name)
        assert extract_answer(row["response"]).strip() == q.answer and row["grounded"]
