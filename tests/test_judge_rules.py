"""The offline ``rules`` judge: process features, induction -> admission (eq. 2) -> consolidation on fixtures built
from the shipped corpus (tests/make_rules_fixtures.py), pairwise tolerance, accuracy, the RaR roles."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from make_rules_fixtures import OUT, build

from arbor.config.judge import JudgeConfig
from arbor.llm import JUDGE_CALL_COLUMNS, CallContext, make_judge
from arbor.llm.reading import question_entities
from arbor.seeding import coin
from arbor.tasks.methods.arbor.heuristics import FEATURES, feature_value
from arbor.tasks.methods.arbor.induction import select_anchors
from arbor.tasks.methods.arbor.memory import admission_stats, admit
from arbor.tasks.methods.arbor.roles import CONSOLIDATION, INDUCTION, ask_pairwise
from arbor.tasks.methods.arbor.sparse_graph import score_group, sparse_edges, verdict_to_outcome
from arbor.tasks.methods.rar.roles import RAR_RATE, RAR_RUBRICS
from arbor.tasks.reporting.accuracy import ACCURACY
from arbor.types import Rubric, RubricDraft, Trajectory

Q = "Who directed the film Ed Wood starring Johnny Depp?"


def T(text: str, sample: int = 0, f1: float = 0.0) -> Trajectory:
    return Trajectory("t", 0, 0, sample, "q", Q, ["Tim Burton"], text=text, f1=f1, base_reward=f1, format_valid=True)


HAND = T("<think>plan</think>\n<search>Ed Wood film</search>\n<result>Ed Wood is a film by Tim Burton.</result>\n"
         "<search>Ed Wood film</search>\n<result>Ed Wood is a film by Tim Burton.</result>\n"
         "<search>Johnny Depp</search>\n<result>Johnny Depp is an actor.</result>\n"
         "<answer>\\boxed{Tim Burton}</answer>")


def groups(name: str) -> list[dict[str, Any]]:
    return json.loads((OUT / f"{name}.json").read_text(encoding="utf-8"))


def trajectories(group: dict[str, Any]) -> list[Trajectory]:
    return [Trajectory.from_row(r) for r in group["trajectories"]]


def judge(tmp_path: Path):  # noqa: ANN201
    return make_judge(JudgeConfig(backend="rules"), home=tmp_path)


async def score(j, question: str, trajs: list[Trajectory], rubric: Rubric, group: int) -> list[float | None]:  # noqa: ANN001
    edges = sparse_edges([t.base_reward for t in trajs])
    outs = []
    for e, (a, b) in enumerate(edges):
        res = await ask_pairwise(j, question, trajs[a], trajs[b], rubric,
                                 swap=coin(0, 0, group, rubric.rubric_id, e))
        outs.append(verdict_to_outcome(res.value, swapped=False))
    return score_group(len(trajs), edges, outs).scores


async def induce_and_admit(j, name: str) -> tuple[dict[str, list[RubricDraft]], int]:  # noqa: ANN001
    admitted: dict[str, list[RubricDraft]] = {}
    n_drafts = 0
    for g, grp in enumerate(groups(name)):
        trajs = trajectories(grp)
        f1 = [t.f1 for t in trajs]
        anchors = select_anchors(f1, [len(t.text) for t in trajs], [t.format_valid for t in trajs])
        out = await j.ask(INDUCTION, question=grp["question"], golds=grp["golds"], trajectories=trajs,
                          anchors=anchors, existing=[], ctx=CallContext(group=g))
        assert out.ok
        n_drafts += len(out.value)
        for k, d in enumerate(out.value):
            r = Rubric(f"d{g}.{k}", d.title, d.description, d.counter_description, feature=d.feature,
                       direction=d.direction)
            if admit(await score(j, grp["question"], trajs, r, g), f1, delta_v=0.05, rho_min=0.0):
                admitted.setdefault(grp["question"], []).append(d)
    return admitted, n_drafts


def test_fixture_script_reproduces_the_checked_in_fixtures() -> None:
    built = build()
    for name in ("positive", "negative"):
        assert built[name] == groups(name), f"tests/data/rules/{name}.json is stale: run tests/make_rules_fixtures.py"


def test_fixture_search_results_are_real_corpus_paragraphs() -> None:
    corpus = json.loads((Path(__file__).parent.parent / "data/offline/hotpotqa_dev100_distractor.json").read_text())
    paragraphs = {f"{t}: {''.join(s).strip()}" for item in corpus
                  for t, s in zip(item["context"]["title"], item["context"]["sentences"], strict=True)}
    from arbor.llm.text import parse_trajectory

    for name in ("positive", "negative"):
        for grp in groups(name):
            for t in trajectories(grp):
                assert all(r.strip() in paragraphs for r in parse_trajectory(t.text).results)


def test_drafts_pass_admission_and_consolidate_into_common_rubrics(tmp_path: Path) -> None:
    j = judge(tmp_path)

    async def go() -> tuple[dict[str, list[RubricDraft]], Any]:
        admitted, _ = await induce_and_admit(j, "positive")
        return admitted, await j.ask(CONSOLIDATION, candidates_by_query=admitted, existing=[])

    admitted, common = asyncio.run(go())
    assert len(admitted) >= 4  # most of the 6 groups contribute an admitted draft
    assert common.ok and 1 <= len(common.value) <= 2
    for c in common.value:
        assert c.feature in FEATURES and c.direction in (1, -1)
        queries = [q for q, ds in admitted.items() if any((d.feature, d.direction) == (c.feature, c.direction)
                                                           for d in ds)]
        assert len(queries) >= 2  # a common rubric is seen for at least two queries
        assert "(here:" not in c.description  # abstracted: no query-specific observations
    # a consolidated rubric keeps discriminating on groups it was not induced from (it is a common standard)
    rubric = Rubric("c0", common.value[0].title, common.value[0].description, common.value[0].counter_description,
                    kind="common", feature=common.value[0].feature, direction=common.value[0].direction)
    grp = groups("positive")[-1]
    scores = asyncio.run(score(j, grp["question"], trajectories(grp), rubric, 99))
    var, rho = admission_stats(scores, [t.f1 for t in trajectories(grp)])
    assert var >= 0.05 and rho is not None and rho > 0
    # every call is in the ledger with the judge_calls columns
    rows = j.drain_calls()
    assert rows and all(set(r) == set(JUDGE_CALL_COLUMNS) and r["backend"] == "rules" for r in rows)
    assert {r["role"] for r in rows} == {"induction", "pairwise", "consolidation"}


def test_negative_fixture_yields_no_admissible_draft(tmp_path: Path) -> None:
    j = judge(tmp_path)
    admitted, n_drafts = asyncio.run(induce_and_admit(j, "negative"))
    assert admitted == {}
    assert n_drafts == 0  # identical processes: no feature separates the anchors
    # and any process rubric scores such a group with zero variance, so it could never be admitted
    grp = groups("negative")[0]
    for feature in FEATURES:
        r = Rubric(f"x-{feature}", "t", "d", "c", feature=feature, direction=1)
        scores = asyncio.run(score(j, grp["question"], trajectories(grp), r, 0))
        assert not admit(scores, [t.f1 for t in trajectories(grp)])


def test_feature_values_by_hand() -> None:
    # queries: "Ed Wood film", "Ed Wood film", "Johnny Depp" -> 3 searches, 1 of 3 repeats an earlier one
    assert feature_value("n_searches", HAND, Q) == 3
    assert feature_value("repeated_query_share", HAND, Q) == pytest.approx(1 / 3)
    # answer "Tim Burton": both tokens occur in the results -> 2/2
    assert feature_value("answer_in_evidence", HAND, Q) == 1.0
    # the first result already holds the answer; 2 searches follow it
    assert feature_value("searches_after_evidence", HAND, Q) == 2
    # question entities: "Ed Wood", "Johnny Depp" -> tokens {ed, wood, johnny, depp}; query overlaps 2/4, 2/4, 2/4
    assert question_entities(Q) == ["Ed Wood", "Johnny Depp"]
    assert feature_value("query_entity_overlap", HAND, Q) == pytest.approx(0.5)
    assert feature_value("format_valid", HAND, Q) == 1.0
    assert feature_value("format_valid", T("<search>x</search><answer>\\boxed{y}</answer>"), Q) == 0.0


def test_pairwise_compares_the_feature_with_a_tolerance(tmp_path: Path) -> None:
    j = judge(tmp_path)
    fewer = T("<search>Ed Wood</search><result>Ed Wood by Tim Burton</result><answer>\\boxed{Tim Burton}</answer>")
    same = T("<search>Ed Wood film</search><result>Ed Wood by Tim Burton</result><answer>\\boxed{Tim Burton}</answer>")
    econ = Rubric("r", "Economical", "few searches", "many searches", feature="n_searches", direction=-1)
    more = Rubric("r", "Thorough", "more searches", "fewer", feature="n_searches", direction=1)

    async def go() -> list:
        return [
            await ask_pairwise(j, Q, fewer, HAND, econ),  # 1 vs 3 searches, fewer is better -> A
            await ask_pairwise(j, Q, fewer, HAND, more),  # more is better -> B
            await ask_pairwise(j, Q, fewer, HAND, econ,
                               swap=True),  # shown swapped, reported in caller order -> A
            await ask_pairwise(j, Q, fewer, same, econ),  # 1 vs 1 -> inside the tolerance -> TIE
            await ask_pairwise(j, Q, fewer, HAND,
                               Rubric("r", "LLM rubric", "d", "c")),  # no feature: failed, not TIE
        ]

    outs = asyncio.run(go())
    assert [o.value for o in outs] == ["A", "B", "A", "TIE", None]
    assert outs[-1].error == "RubricWithoutFeature"


def test_induction_skips_features_of_existing_rubrics_and_skip_mode(tmp_path: Path) -> None:
    j = judge(tmp_path)
    grp = groups("positive")[0]
    trajs = trajectories(grp)
    anchors = select_anchors([t.f1 for t in trajs], [len(t.text) for t in trajs], [t.format_valid for t in trajs])

    async def go() -> tuple:
        free = await j.ask(INDUCTION, question=grp["question"], golds=grp["golds"], trajectories=trajs,
                           anchors=anchors, existing=[])
        existing = [Rubric("c", d.title, d.description, d.counter_description, "common", d.feature, d.direction)
                    for d in free.value]
        covered = await j.ask(INDUCTION, question=grp["question"], golds=grp["golds"], trajectories=trajs,
                              anchors=anchors, existing=existing)
        # drafts of other queries in D do not cover a feature: recurrence is what consolidation needs
        drafts = [Rubric("d", r.title, r.description, r.counter_description, "draft", r.feature, r.direction)
                  for r in existing]
        recur = await j.ask(INDUCTION, question=grp["question"], golds=grp["golds"], trajectories=trajs,
                            anchors=anchors, existing=drafts)
        skipped = await j.ask(INDUCTION, question=grp["question"], golds=grp["golds"], trajectories=trajs,
                              anchors={"mode": "skip"}, existing=[])
        return free, covered, recur, skipped

    free, covered, recur, skipped = asyncio.run(go())
    assert free.value and not ({d.feature for d in free.value} & {d.feature for d in covered.value})
    assert recur.value == free.value
    assert skipped.ok and skipped.value == []
    assert all(d.description and d.counter_description and d.title for d in free.value)


def test_unlabeled_induction_uses_prior_directions(tmp_path: Path) -> None:
    j = judge(tmp_path)
    a = T("<search>Ed Wood film</search><result>Tim Burton</result><answer>\\boxed{Tim Burton}</answer>", 0, 0.5)
    b = T("<search>director</search><result>x</result><search>director</search><result>x</result>"
          "<answer>\\boxed{Tim Burton}</answer>", 1, 0.5)
    out = asyncio.run(j.ask(INDUCTION, question=Q, golds=["Tim Burton"], trajectories=[a, b],
                            anchors={"mode": "unlabeled"}, existing=[]))
    got = {(d.feature, d.direction) for d in out.value}
    assert ("repeated_query_share", -1) in got and ("answer_in_evidence", 1) in got
    assert all(d.feature != "n_searches" for d in out.value)  # no prior direction: never guessed without labels


def test_consolidation_needs_two_queries_and_skips_existing(tmp_path: Path) -> None:
    j = judge(tmp_path)
    d = RubricDraft("t", "d", "c", feature="repeated_query_share", direction=-1)
    e = RubricDraft("t", "d", "c", feature="answer_in_evidence", direction=1)

    async def go() -> list:
        return [
            await j.ask(CONSOLIDATION, candidates_by_query={"q1": [d, d]}, existing=[]),  # one query only
            await j.ask(CONSOLIDATION, candidates_by_query={"q1": [d, e], "q2": [d]}, existing=[]),
            await j.ask(CONSOLIDATION, candidates_by_query={"q1": [d], "q2": [d]},
                        existing=[Rubric("c", "t", "d", "c", "common", d.feature, -1)]),
        ]

    one, two, covered = asyncio.run(go())
    assert one.value == [] and covered.value == []
    assert [(r.feature, r.direction) for r in two.value] == [("repeated_query_share", -1)]


def test_accuracy_is_normalised_match_against_any_alias(tmp_path: Path) -> None:
    j = judge(tmp_path)

    async def go() -> list:
        return [(await j.ask(ACCURACY, question=Q, golds=["Tim Burton", "Timothy Burton"],
                             prediction=p)).value
                for p in ["tim burton.", "The Timothy Burton", "Burton", None, ""]]

    assert asyncio.run(go()) == [True, True, False, False, False]


def test_rar_roles(tmp_path: Path) -> None:
    j = judge(tmp_path)
    good = T("<think>x</think>\n<search>Ed Wood Johnny Depp</search>\n<result>Ed Wood was directed by Tim Burton."
             "</result>\n<answer>\\boxed{Tim Burton}</answer>")
    bad = T("<search>film</search><result>A film.</result><search>film</search><result>A film.</result>"
            "<answer>\\boxed{Orson Welles}</answer>")

    async def go() -> tuple:
        items = await j.ask(RAR_RUBRICS, question=Q, golds=["Tim Burton"])
        return items, await j.ask(RAR_RATE, question=Q, trajectory=good,
                                  items=items.value), await j.ask(RAR_RATE, question=Q, trajectory=bad,
                                  items=items.value)

    items, g, b = asyncio.run(go())
    assert 5 <= len(items.value) <= 10
    assert "Query names: Ed Wood" in items.value and "Answer states: Tim Burton" in items.value
    # 6 items: 2 entity queries, evidence, answer, structure, no repeated query.
    # good meets all 6 -> 1 + floor(9 * 6/6 + 0.5) = 10; bad meets only "structure" (its format is valid):
    # 1 + floor(9 * 1/6 + 0.5) = 1 + floor(2.0) = 3
    assert len(items.value) == 6 and g.value == 10 and b.value == 3
