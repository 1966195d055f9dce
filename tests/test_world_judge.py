"""The ``world`` judge (ARBOR's roles from the synthetic world's facts, never the gold answer) and
the ``random`` judge (seeded coin flips, schema-valid), registered as ``judge.backend=world | random``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from arbor.config import load_config
from arbor.format import ARBOR, check_format, result_block
from arbor.llm import make_judge
from arbor.tasks.env.search import format_results
from arbor.tasks.env.world.entities import build_world
from arbor.tasks.env.world.questions import world_questions
from arbor.tasks.methods import load_judges
from arbor.tasks.methods.arbor.induction import select_anchors
from arbor.tasks.methods.arbor.roles import (
    CONSOLIDATION,
    INDUCTION,
    ConsolidationOut,
    InductionOut,
    ask_pairwise,
)
from arbor.tasks.methods.arbor.scoring import ScoringJob, score_jobs
from arbor.types import Rubric, Trajectory

GOLD = "Zq-SENTINEL-GOLD-7731"  # a gold string no trajectory, question or world fact contains
load_judges()


@pytest.fixture(scope="module")
def world_cfg():
    return load_config("tiny-world")


@pytest.fixture(scope="module")
def bridge(world_cfg):
    """A bridge question of tiny-world's training split, its subject entity and its bridge entity."""
    world = build_world(world_cfg.world)
    q = next(q for q in world_questions(world_cfg.world, "train") if q.kind == "bridge")
    subject, mid = (world.entities[h.doc_id] for h in q.path)
    return q, subject, mid, world


def passage_text(world, e) -> str:
    from arbor.tasks.env.search import SearchHit

    return format_results([SearchHit(e.eid, e.name, world.passages[e.eid], 1.0)], 200)


def render(steps: list[tuple[str, str, object]], answer: str, world) -> str:
    """A trajectory: (thought, query, the entity whose passage comes back) per search, then the boxed answer."""
    parts = []
    for i, (thought, query, hit) in enumerate(steps):
        parts.append(ARBOR.step_block(i, thought, query))
        parts.append(result_block(passage_text(world, hit) if hit is not None else "No results.", ARBOR))
    parts.append(ARBOR.final_block("Done.", f" {answer}"))
    text = "".join(parts)
    assert check_format(text, truncated=False).valid
    return text


def traj(text: str, question: str, sample: int, f1: float, golds: list[str]) -> Trajectory:
    return Trajectory(run_id="r", step=1, group=0, sample=sample, question_id="q", question=question, golds=golds,
                      text=text, format_valid=True, f1=f1, em=f1, base_reward=f1, response_ids=[1] * (10 + sample))


@pytest.fixture(scope="module")
def pair(bridge):
    """Two trajectories with the same (wrong) answer: `full` retrieves the subject and the bridge entity,
    `short` only the subject."""
    q, subject, mid, world = bridge
    wrong = "Nowhere"
    full = render([("Look up.", subject.name, subject), ("Next.", mid.name, mid)], wrong, world)
    short = render([("Look up.", subject.name, subject)], wrong, world)
    return q, full, short


def world_judge(tmp_path: Path, cfg, backend: str = "world"):
    cfg = cfg.model_copy(deep=True)
    cfg.judge.backend = backend
    return make_judge(cfg.judge, home=tmp_path, config=cfg)


BRIDGE_RUBRIC = Rubric("c1", "Resolve the Bridge Entity", "d", "c", kind="common", feature="bridge_retrieved",
                       direction=1)


def test_the_world_judge_prefers_the_trajectory_that_retrieved_the_bridge_entity(tmp_path, world_cfg, pair):
    q, full, short = pair
    judge = world_judge(tmp_path, world_cfg)
    assert judge.backend == "world"
    a, b = traj(full, q.question, 0, 0.0, [GOLD]), traj(short, q.question, 1, 0.0, [GOLD])
    for swap in (False, True):  # the verdict refers to the caller's order whatever is shown first
        assert asyncio.run(ask_pairwise(judge, q.question, a, b, BRIDGE_RUBRIC, swap=swap)).value == "A"
        assert asyncio.run(ask_pairwise(judge, q.question, b, a, BRIDGE_RUBRIC, swap=swap)).value == "B"
    # equal process: a tie, under every world rubric (the same text twice; and the same retrieval, other wording)
    same = full.replace("Look up.", "First find it.")
    for feature in ("chain_coverage", "bridge_retrieved", "answer_supported", "contradictions", "wasted_searches"):
        r = Rubric("c2", "t", "d", "c", kind="common", feature=feature, direction=1)
        assert asyncio.run(ask_pairwise(judge, q.question, a, traj(same, q.question, 2, 0.0, [GOLD]), r)).value == "TIE"
    # the chain covers the subject and the bridge entity: 2/2 against 1/2; one wasted search neither
    from arbor.tasks.methods.arbor.world_judge import chain_coverage, wasted_searches
    assert (chain_coverage(judge.reader, q.question, full), chain_coverage(judge.reader, q.question, short)) == (1, .5)
    assert wasted_searches(judge.reader, q.question, full) == 0.0
    # the ledger row is the world judge's, no cost
    rows = judge.drain_calls()
    assert rows and {(r["backend"], r["model"], r["cost_usd"]) for r in rows} == {("world", "world", 0.0)}


def test_answer_support_and_contradictions_read_the_worlds_facts(tmp_path, world_cfg, bridge):
    q, subject, mid, world = bridge
    judge = world_judge(tmp_path, world_cfg)
    from arbor.tasks.methods.arbor.world_judge import answer_supported, contradictions
    rd = judge.reader
    second = q.relation.split(">")[1]  # e.g. person.born_in: the fact the question asks of the bridge entity
    from arbor.tasks.env.world.entities import fact, fact_sentence
    value = fact(world, mid, second)[0]
    steps = [("Look up.", subject.name, subject), ("Next.", mid.name, mid)]
    # an answer the bridge entity's retrieved passage states is supported; a made-up one is not; and without the
    # bridge passage retrieved, nothing supports it
    assert answer_supported(rd, q.question, render(steps, value, world)) == 1.0
    assert answer_supported(rd, q.question, render(steps, "Nowhere", world)) == 0.0
    assert answer_supported(rd, q.question, render(steps[:1], value, world)) == 0.0
    first = q.relation.split(">")[0]
    right = fact_sentence(first, subject.name, mid.name)
    wrong = fact_sentence(first, subject.name, "Someone Else")
    ok = render([(right, subject.name, subject)], "x", world)
    bad = render([(f"{wrong} {right}", subject.name, subject), (wrong, mid.name, mid)], "x", world)
    assert (contradictions(rd, q.question, ok), contradictions(rd, q.question, bad)) == (0.0, 2.0)


def test_the_world_judge_never_receives_the_gold_answer(tmp_path, world_cfg, pair):
    """ARBOR's three roles through the machinery (sparse scoring, induction, consolidation) with a gold string on
    every trajectory and in the induction request: nothing the world judge read holds it."""
    q, full, short = pair
    judge = world_judge(tmp_path, world_cfg)
    golds = [GOLD]
    group = [traj(full, q.question, 0, 1.0, golds), traj(short, q.question, 1, 0.0, golds),
             traj(short, q.question, 2, 0.0, golds), traj(full, q.question, 3, 1.0, golds)]
    [scoring] = asyncio.run(score_jobs(judge, [ScoringJob(0, BRIDGE_RUBRIC, group)], run_id="r", seed=0, step=1,
                                       stage="score"))
    assert scoring.scores is not None and scoring.scores[0] > scoring.scores[1]  # the bridge retriever scores higher
    anchors = select_anchors([t.f1 for t in group], [len(t.response_ids) for t in group], [True] * 4)
    drafts = asyncio.run(judge.ask(INDUCTION, question=q.question, golds=golds, trajectories=group, anchors=anchors,
                                   existing=[])).value
    assert drafts and {d.feature for d in drafts} >= {"bridge_retrieved", "chain_coverage"}
    assert all(d.direction == 1 for d in drafts if d.feature in ("bridge_retrieved", "chain_coverage"))
    cand = {q.question: [Rubric("d1", d.title, d.description, d.counter_description, feature=d.feature,
                                direction=d.direction) for d in drafts], "another question": [
        Rubric("d2", drafts[0].title, "x", "y", feature=drafts[0].feature, direction=drafts[0].direction)]}
    common = asyncio.run(judge.ask(CONSOLIDATION, candidates_by_query=cand, existing=[])).value
    assert [(c.feature, c.direction) for c in common] == [(drafts[0].feature, drafts[0].direction)]
    read = list(judge.views)
    assert len(read) == 5 + 1 + 1  # K=4: 5 sparse edges, one induction, one consolidation
    assert not [v for v in read if GOLD in repr(v)]
    assert all(not hasattr(v, "golds") for v in read)
    # the same requests through the rules judge would have carried it: the gold is in what the machinery sends
    assert GOLD in repr(group[0]) and GOLD in repr(golds)


def test_the_random_judge_is_schema_valid_and_deterministic(tmp_path, world_cfg, pair):
    q, full, short = pair
    a, b = traj(full, q.question, 0, 1.0, [GOLD]), traj(short, q.question, 1, 0.0, [GOLD])
    judges = [world_judge(tmp_path / str(i), world_cfg, "random") for i in range(2)]
    other = world_cfg.model_copy(deep=True)
    other.run.seed = 1
    reseeded = world_judge(tmp_path / "s1", other, "random")

    def verdicts(judge) -> list[str]:
        out = []
        for i in range(60):
            r = Rubric(f"c{i}", "t", "d", "c", kind="common", feature="chain_coverage", direction=1)
            out.append(asyncio.run(ask_pairwise(judge, f"{q.question} #{i}", a, b, r, swap=bool(i % 2))).value)
        return out

    first, again, seeded = verdicts(judges[0]), verdicts(judges[1]), verdicts(reseeded)
    assert first == again and first != seeded  # same (seed, call content): same answers; another seed: others
    assert set(first) == {"A", "B", "TIE"}  # coin flips, ties included
    group = [a, b, traj(short, q.question, 2, 0.0, [GOLD]), traj(full, q.question, 3, 1.0, [GOLD])]
    anchors = select_anchors([t.f1 for t in group], [len(t.response_ids) for t in group], [True] * 4)
    sizes = set()
    for i in range(12):
        drafts = asyncio.run(judges[0].ask(INDUCTION, question=f"{q.question} {i}", golds=[GOLD], trajectories=group,
                                           anchors=anchors, existing=[])).value
        again_d = asyncio.run(judges[1].ask(INDUCTION, question=f"{q.question} {i}", golds=[GOLD],
                                            trajectories=group, anchors=anchors, existing=[])).value
        assert drafts == again_d
        sizes.add(len(drafts))
        InductionOut.model_validate({"rubrics": [{"title": d.title, "description": d.description,
                                                  "counter_description": d.counter_description} for d in drafts]})
        cand = {"q1": [Rubric("d", x.title, x.description, x.counter_description, feature=x.feature,
                              direction=x.direction) for x in drafts]}
        common = asyncio.run(judges[0].ask(CONSOLIDATION, candidates_by_query=cand, existing=[])).value
        ConsolidationOut.model_validate({"new_common_rubrics": [
            {"title": c.title, "description": c.description, "counter_description": c.counter_description}
            for c in common]})
        assert {(c.feature, c.direction) for c in common} <= {(x.feature, x.direction) for x in drafts}
    assert len(sizes) > 1  # it drafts different numbers of rubrics
    assert not [v for v in judges[0].views if GOLD in repr(v)]


def test_the_backends_are_known_by_name_and_refuse_a_run_without_the_world(tmp_path):
    from arbor.config.judge import JudgeConfig
    from arbor.tasks.methods import load_roles

    load_roles()
    for name in ("world", "random"):
        assert JudgeConfig(backend=name).backend == name
    cfg = load_config("tiny-cpu", {"judge.backend": "world"})
    with pytest.raises(ValueError, match="judge.backend=world reads the synthetic world's facts"):
        make_judge(cfg.judge, home=tmp_path, config=cfg)
    # every other role is the rules judge's (evaluation's accuracy)
    world = world_judge(tmp_path, load_config("tiny-world"))
    assert asyncio.run(world.ask("accuracy", question="?", golds=["Paris"], prediction="paris")).value is True


def test_the_world_judge_follows_a_three_hop_chain(tmp_path, world_cfg):
    """Nested bridge phrases: both bridge entities are found from the question; coverage counts
    three entities; only the second bridge's passage supports an answer."""
    from arbor.tasks.env.world.entities import fact
    from arbor.tasks.methods.arbor.world_judge import answer_supported, bridge_retrieved, chain_coverage

    world = build_world(world_cfg.world)
    q = world_questions(world_cfg.world, "train-three_hop")[0]
    a, b, c = (world.entities[h.doc_id] for h in q.path)
    judge = world_judge(tmp_path, world_cfg)
    rd = judge.reader
    assert rd.chain(q.question) == ((a,), (b, c))
    value = fact(world, c, q.relation.split(">")[2])[0]
    full = render([("Look up.", a.name, a), ("Next.", b.name, b), ("Next.", c.name, c)], value, world)
    two = render([("Look up.", a.name, a), ("Next.", b.name, b)], value, world)
    assert (chain_coverage(rd, q.question, full), chain_coverage(rd, q.question, two)) == (1.0, pytest.approx(2 / 3))
    assert (bridge_retrieved(rd, q.question, full), bridge_retrieved(rd, q.question, two)) == (1.0, 0.5)
    assert (answer_supported(rd, q.question, full), answer_supported(rd, q.question, two)) == (1.0, 0.0)
