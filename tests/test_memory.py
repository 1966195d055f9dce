"""RubricMemory unit tests (paper §3.3, §3.4 active selection, Table 4) with hand-worked values."""

from __future__ import annotations

import json

import numpy as np
import pytest

from arbor.config.memory import MemoryConfig
from arbor.group_stats import pearson
from arbor.tasks.methods.arbor.memory import RubricMemory, admission_stats, admit, load_pool_file
from arbor.tasks.methods.arbor.records import (
    ACTIVATION_COLUMNS,
    EVENT_COLUMNS,
    SOURCE_COLUMNS,
    Activation,
    DraftResult,
    GroupInfo,
    Records,
)
from arbor.tasks.methods.arbor.rubric_stats import step_variance
from arbor.tasks.methods.arbor.sparse_graph import GroupScoring
from arbor.types import RubricDraft


def ok(scores):
    return GroupScoring(scores=list(scores), n_edges=11, n_failed_edges=0)


ERR = GroupScoring(scores=None, n_edges=11, n_failed_edges=6)


def toy_embed(texts):
    """Deterministic embedding: one random direction per title (text before ':'); '(copy)' suffix ignored."""
    out = []
    for t in texts:
        key = t.split(":")[0].replace(" (copy)", "")
        rng = np.random.default_rng(abs(hash(key)) % (2**32))
        out.append(rng.normal(size=64))
    return np.array(out)


def common(title):
    return RubricDraft(title, f"does {title}", f"fails {title}")


# ------------------------------------------------------------------------------------------------ admit (eq. 2)
def test_admit_hand_computed():
    # scores [1, .5, 0, .5]: Var = (.25 + 0 + .25 + 0) / 4 = .125; Pearson with F1 [1, .5, 0, 0] = .852803.
    var, p = admission_stats([1.0, 0.5, 0.0, 0.5], [1.0, 0.5, 0.0, 0.0])
    assert var == pytest.approx(0.125) and p == pytest.approx(0.852803, abs=1e-6)
    assert admit([1.0, 0.5, 0.0, 0.5], [1.0, 0.5, 0.0, 0.0])
    assert not admit([0.0, 0.5, 1.0, 0.5], [1.0, 0.5, 0.0, 0.0])  # Pearson -.85 < rho_min = 0
    assert not admit([0.6, 0.5, 0.4, 0.5], [1.0, 0.5, 0.0, 0.0])  # Var = .02 / 4 = .005 < .05
    assert admit([0.6, 0.5, 0.4, 0.5], [1.0, 0.5, 0.0, 0.0], delta_v=0.005)
    assert not admit([1.0, 0.5, 0.0, 0.5], [1.0, 0.5, 0.0, 0.0], rho_min=0.9)


def test_admit_constant_f1_uses_variance_alone():
    assert admission_stats([1.0, 0.5, 0.0, 0.5], [0.5] * 4) == (pytest.approx(0.125), None)
    assert admit([1.0, 0.5, 0.0, 0.5], [0.5] * 4, rho_min=0.5)
    assert not admit([0.5, 0.5, 0.5, 0.6], [0.5] * 4)


def test_admit_skips_unscored_trajectories():
    # Pairs with a score: ([1, 0], [1, 0]) -> Var .25, Pearson 1.
    assert admission_stats([1.0, None, 0.0], [1.0, 0.3, 0.0]) == (pytest.approx(0.25), pytest.approx(1.0))


# ------------------------------------------------------------------------------------------------ helpers
def draft(step, group, i, scores, f1, title=None):
    r = RubricMemory.make_drafts(step, group, [common(title or f"draft {step}.{group}.{i}")] * (i + 1))[i]
    return DraftResult(r, group, f"q{group}", f"question {group}?", ok(scores) if scores else ERR, f1)


GOOD = ([1.0, 0.5, 0.0, 0.5], [1.0, 0.5, 0.0, 0.0])  # admitted
ANTI = ([0.0, 0.5, 1.0, 0.5], [1.0, 0.5, 0.0, 0.0])  # rejected (Pearson < 0)


def memory_with_pool(titles, cfg=None, step=0):
    """A memory whose P holds ``titles`` (k_consol = 1: one admitted draft triggers a consolidation)."""
    mem = RubricMemory(cfg or MemoryConfig(k_consol=1))
    rec = Records()
    rec.extend(mem.select_active(step)[1])
    rec.extend(mem.admit_drafts(step, [draft(step, 0, 0, *GOOD)]))
    rec.extend(mem.consolidate(step, [common(t) for t in titles], toy_embed))
    return mem, rec


# ------------------------------------------------------------------------------------------------ admission
def test_admit_drafts_events_and_candidate_pool():
    mem = RubricMemory(MemoryConfig())
    rec = mem.admit_drafts(3, [draft(3, 1, 1, *ANTI), draft(3, 1, 0, *GOOD), draft(3, 0, 0, None, [0.0] * 4),
                               draft(3, 2, 0, GOOD[0], [0.5] * 4)])
    kinds = [(e["rubric_id"], e["event"]) for e in rec.events]
    # Group-index order, then draft index, whatever order the results came in.
    assert kinds == [("d3.0.0", "induced"), ("d3.0.0", "judge_error"), ("d3.1.0", "induced"), ("d3.1.0", "admitted"),
                     ("d3.1.1", "induced"), ("d3.1.1", "rejected"), ("d3.2.0", "induced"), ("d3.2.0", "admitted")]
    adm = rec.events[3]
    assert adm["variance"] == pytest.approx(0.125) and adm["pearson"] == pytest.approx(0.852803, abs=1e-6)
    assert adm["candidate_pool_size"] == 1 and adm["kind"] == "draft" and adm["group"] == 1
    assert rec.events[5]["reason"] == "pearson < rho_min"
    assert rec.events[7]["pearson"] is None  # constant F1: Pearson recorded NULL
    assert all(set(e) == set(EVENT_COLUMNS) for e in rec.events)
    assert [d.rubric.rubric_id for d in mem.D] == ["d3.1.0", "d3.2.0"]
    assert mem.candidates_by_query() == {"question 1?": [mem.D[0].rubric], "question 2?": [mem.D[1].rubric]}
    assert not mem.consolidation_due()  # 2 < k_consol = 8


def test_frozen_memory_admits_consolidates_and_retires_nothing():
    mem = RubricMemory(MemoryConfig(frozen=True, k_consol=1))
    mem.load_pool(0, {"rubrics": [{"title": "a", "description": "x", "counter_description": "y"}]})
    rec = mem.admit_drafts(0, [draft(0, 0, 0, *GOOD)])
    assert [e["event"] for e in rec.events] == ["induced", "rejected"] and not mem.D
    assert not mem.consolidation_due()
    mem.apply_activations(1, [Activation("w0", 0, ok([0.0, 1.0]), [1.0, 0.0])])  # rho = -1
    assert mem.retire(1).events == [] and "w0" in mem.P


# ------------------------------------------------------------------------------------------------ consolidation
def test_consolidation_dedup_lineage_and_clearing():
    cfg = MemoryConfig(k_consol=2)
    mem = RubricMemory(cfg)
    mem.admit_drafts(0, [draft(0, 0, 0, *GOOD), draft(0, 1, 0, *GOOD)])
    assert mem.consolidation_due()
    rec = mem.consolidate(0, [common("precise queries"), common("stop when sure"),
                              common("stop when sure (copy)")], toy_embed)
    ev = [(e["rubric_id"], e["event"], e["kind"]) for e in rec.events]
    assert ev == [("c0.0", "consolidated", "common"), ("c0.1", "consolidated", "common"),
                  ("c0.2", "duplicate", "common"), ("d0.0.0", "consolidated", "draft"),
                  ("d0.1.0", "consolidated", "draft")]
    dup = rec.events[2]
    assert dup["other_rubric_id"] == "c0.1" and dup["similarity"] == pytest.approx(1.0)
    assert rec.events[-1]["candidate_pool_size"] == 0 and rec.events[-1]["pool_size"] == 2
    assert not mem.D and list(mem.P) == ["c0.0", "c0.1"]
    # Lineage: each new common <- every draft of the round <- its query.
    assert [(s["common_rubric_id"], s["draft_rubric_id"], s["question_id"]) for s in rec.sources] == [
        ("c0.0", "d0.0.0", "q0"), ("c0.0", "d0.1.0", "q1"), ("c0.1", "d0.0.0", "q0"), ("c0.1", "d0.1.0", "q1")]
    assert all(set(s) == set(SOURCE_COLUMNS) for s in rec.sources)
    # Next round: a duplicate of an existing common is refused against P.
    mem.admit_drafts(1, [draft(1, 0, 0, *GOOD), draft(1, 1, 0, *GOOD)])
    rec = mem.consolidate(1, [common("precise queries (copy)")], toy_embed)
    assert rec.events[0]["event"] == "duplicate" and rec.events[0]["other_rubric_id"] == "c0.0"
    assert not rec.sources


def test_consolidation_out_of_turn_is_refused():
    mem = RubricMemory(MemoryConfig())
    with pytest.raises(RuntimeError, match="not due"):
        mem.consolidate(0, [], toy_embed)
    mem = RubricMemory(MemoryConfig())
    mem.retire(0)
    with pytest.raises(RuntimeError, match="select_active called after retire"):
        mem.select_active(0)
    with pytest.raises(ValueError, match="must not go back"):
        mem.select_active(-1)


def test_capacity_replacement_and_drop():
    cfg = MemoryConfig(k_consol=1, pool_max=2, maturity=2, n_active=2)
    mem, _ = memory_with_pool(["a", "b"], cfg)
    # Step 1: "a" (c0.0) gets 2 activations with Var .25 each, "b" (c0.1) 1 activation with Var .0 (immature).
    mem.select_active(1)
    mem.apply_activations(1, [Activation("c0.0", 0, ok([1.0, 0.0]), [1.0, 0.0]),
                              Activation("c0.0", 1, ok([1.0, 0.0]), [1.0, 0.0]),
                              Activation("c0.1", 0, ok([0.5, 0.5]), [1.0, 0.0])])
    mem.admit_drafts(1, [draft(1, 0, 0, *GOOD)])
    # Pool full; only c0.0 has matured (2 >= maturity) -> it is replaced by c1.0 although its mean Var is higher.
    rec = mem.consolidate(1, [common("c"), common("d")], toy_embed)
    ev = [(e["rubric_id"], e["event"], e["other_rubric_id"]) for e in rec.events]
    assert ev[:3] == [("c0.0", "replaced", "c1.0"), ("c1.0", "consolidated", None), ("c1.1", "dropped", None)]
    assert rec.events[0]["mean_variance"] == pytest.approx(0.25) and rec.events[0]["n_activations"] == 2
    assert list(mem.P) == ["c0.1", "c1.0"]
    assert [s["common_rubric_id"] for s in rec.sources] == ["c1.0"]


def test_replacement_picks_lowest_mean_variance_then_oldest():
    cfg = MemoryConfig(k_consol=1, pool_max=3, maturity=1)
    mem, _ = memory_with_pool(["a", "b", "c"], cfg)
    mem.select_active(1)
    # mean Var: a .25, b .0625 ([.75, .25]), c .0625 -> tie b / c broken by age: b (older) is replaced.
    mem.apply_activations(1, [Activation("c0.0", 0, ok([1.0, 0.0]), [1.0, 0.0]),
                              Activation("c0.1", 0, ok([0.75, 0.25]), [1.0, 0.0]),
                              Activation("c0.2", 0, ok([0.25, 0.75]), [1.0, 0.0])])
    mem.admit_drafts(1, [draft(1, 0, 0, *GOOD)])
    rec = mem.consolidate(1, [common("d")], toy_embed)
    assert rec.events[0]["event"] == "replaced" and rec.events[0]["rubric_id"] == "c0.1"


# ------------------------------------------------------------------------------------------------ statistics
def test_n_r_and_cumulative_rho_by_hand():
    mem, _ = memory_with_pool(["a"])
    mem.select_active(1)
    rec = mem.apply_activations(1, [Activation("c0.0", 1, ok([0.5, 0.5, 0.5]), [0.0, 0.5, 1.0]),
                                    Activation("c0.0", 0, ok([1.0, 0.0, 0.5]), [1.0, 0.0, 0.0])])
    # Group 0 first (group-index order): Var([1, 0, .5]) = 1/6 >= .05 -> n_r 0; pairs (1,1) (0,0) (.5,0).
    # Group 1: Var 0 < .05 -> n_r 1; pooled pairs add (.5,0) (.5,.5) (.5,1).
    rows = rec.activations
    assert [r["group"] for r in rows] == [0, 1]
    assert [r["n_r_after"] for r in rows] == [0, 1] and [r["kept"] for r in rows] == [True, False]
    assert rows[0]["variance"] == pytest.approx(1 / 6) and rows[1]["variance"] == 0.0
    xs, ys = [1.0, 0.0, 0.5, 0.5, 0.5, 0.5], [1.0, 0.0, 0.0, 0.0, 0.5, 1.0]
    assert rows[1]["rho_r_after"] == pytest.approx(pearson(xs, ys), abs=1e-12)
    assert rows[1]["mean_variance_after"] == pytest.approx(1 / 12) and rows[1]["n_activations_after"] == 2
    assert all(set(r) == set(ACTIVATION_COLUMNS) for r in rows)
    # A high-variance activation resets n_r.
    mem.retire(1)
    mem.select_active(2)
    rec = mem.apply_activations(2, [Activation("c0.0", 0, ok([1.0, 0.0]), [1.0, 0.0])])
    assert rec.activations[0]["n_r_after"] == 0


def test_retirement_after_kappa_plus_one_low_variance_activations():
    mem, _ = memory_with_pool(["a", "b"], MemoryConfig(k_consol=1, n_active=2, kappa=5))
    # "b" keeps discriminating (and defines rho), "a" stops: one low-variance group per step.
    for step in range(1, 8):
        mem.select_active(step)
        mem.apply_activations(step, [Activation("c0.0", 0, ok([0.5, 0.5]), [1.0, 0.0]),
                                     Activation("c0.1", 0, ok([1.0, 0.0]), [1.0, 0.0])])
        retired = [e["rubric_id"] for e in mem.retire(step).events]
        if step <= 5:  # n_r = step <= kappa: kept
            assert retired == [] and mem.stats["c0.0"].n_r == step
        else:  # n_r = 6 > kappa = 5 at the end of step 6
            assert step == 6 and retired == ["c0.0"]
            break
    assert list(mem.P) == ["c0.1"]


# n_r > kappa at ANY activation of the step (group order) retires at the step's ``retire`` call, even when
# a later group of the same step resets n_r; the event names the group of that activation.
MID_GROUPS = [3, 5, 8, 9, 12, 14, 15, 20]  # n_r after each: 1 2 3 4 5 6 7 0 -> crosses kappa = 5 at group 14
FLAT, SHARP, F1_2 = [0.5, 0.5], [1.0, 0.0], [1.0, 0.0]


def mid_step_acts(rid="c0.0"):
    acts = [Activation(rid, g, ok(FLAT if i < 7 else SHARP), F1_2) for i, g in enumerate(MID_GROUPS)]
    acts += [Activation("c0.1", g, ok(SHARP), F1_2) for g in MID_GROUPS]
    return acts[::-1]  # arrival order does not matter: group-index order is applied


def test_n_r_over_kappa_in_the_middle_of_a_step_retires_and_names_the_group():
    cfg = MemoryConfig(k_consol=1, n_active=2, kappa=5)  # kappa = Table 4 / config default
    assert cfg.kappa == MemoryConfig().kappa == 5
    mem, _ = memory_with_pool(["a", "b"], cfg)
    mem.select_active(1)
    rec = mem.apply_activations(1, mid_step_acts())
    rows = [r for r in rec.activations if r["rubric_id"] == "c0.0"]
    assert [r["group"] for r in rows] == MID_GROUPS
    assert [r["n_r_after"] for r in rows] == [1, 2, 3, 4, 5, 6, 7, 0]
    assert mem.stats["c0.0"].n_r == 0 and mem.rho("c0.0") > 0  # final state alone would keep it
    ev = mem.retire(1).events
    assert [(e["rubric_id"], e["event"]) for e in ev] == [("c0.0", "retired")]
    assert ev[0]["group"] == 14 and ev[0]["step"] == 1
    assert "n_r=6 > kappa=5" in ev[0]["reason"] and "group 14" in ev[0]["reason"]
    assert list(mem.P) == ["c0.1"]


def test_n_r_run_carried_over_steps_retires_at_the_crossing_group():
    mem, _ = memory_with_pool(["a", "b"], MemoryConfig(k_consol=1, n_active=2, kappa=5))
    mem.select_active(1)
    mem.apply_activations(1, [Activation("c0.0", g, ok(FLAT), F1_2) for g in range(4)]
                          + [Activation("c0.1", g, ok(SHARP), F1_2) for g in range(4)])
    assert mem.retire(1).events == [] and mem.stats["c0.0"].n_r == 4
    mem.select_active(2)
    mem.apply_activations(2, [Activation("c0.0", g, ok(FLAT if g < 2 else SHARP), F1_2) for g in range(3)]
                          + [Activation("c0.1", g, ok(SHARP), F1_2) for g in range(3)])
    ev = mem.retire(2).events  # n_r 5 (group 0), 6 (group 1), 0 (group 2)
    assert [(e["rubric_id"], e["group"]) for e in ev] == [("c0.0", 1)]
    assert "n_r=6 > kappa=5" in ev[0]["reason"]


@pytest.mark.parametrize("partial_phase", ["score", "apply_activations", "induce"])
def test_mid_step_retirement_is_reached_again_after_a_rebuild(partial_phase):
    """Resume after the score stage: the memory rebuilt from the emitted rows retires the same rubric, same event."""
    cfg = MemoryConfig(k_consol=1, n_active=2, kappa=5)
    live, log = memory_with_pool(["a", "b"], cfg)
    _, sel = live.select_active(1)
    log.extend(sel)
    log.extend(live.apply_activations(1, mid_step_acts()))
    if partial_phase == "induce":
        log.extend(live.admit_drafts(1, []))
    groups = {(1, g): GroupInfo(f"q{g}", f"question {g}?", tuple(F1_2)) for g in MID_GROUPS}
    rebuilt = RubricMemory.from_events(cfg, log.events, log.activations, log.sources, groups,
                                       partial_phase=partial_phase)
    assert rebuilt.state() == live.state()
    ev_live, ev_rebuilt = live.retire(1).events, rebuilt.retire(1).events
    assert ev_live == ev_rebuilt
    assert [(e["rubric_id"], e["event"], e["group"]) for e in ev_live] == [("c0.0", "retired", 14)]
    assert rebuilt.state() == live.state()
    # After the retire stage, too: a rebuild replays the retired event and agrees.
    log.extend(Records(events=ev_live))
    again = RubricMemory.from_events(cfg, log.events, log.activations, log.sources, groups, partial_phase="retire")
    assert again.state() == live.state() and list(again.P) == ["c0.1"]


def test_counting_activations_per_step():
    """memory.count_activations=step: the step that retires per group (n_r 6 at group 14) counts
    as one activation with variance mean(7 x 0, 1 x 0.25) = 0.03125 <= delta_v, so n_r = 1; the rubric retires
    only after kappa + 1 = 6 such steps, the event naming no group; a rebuild replays the same state."""
    cfg = MemoryConfig(k_consol=1, n_active=2, kappa=5, count_activations="step")
    assert MemoryConfig().count_activations == "group"
    assert step_variance([0.0] * 7 + [0.25]) == pytest.approx(0.03125)
    live, log = memory_with_pool(["a", "b"], cfg)
    groups = {}
    for step in range(1, 7):
        _, sel = live.select_active(step)
        log.extend(sel)
        rec = live.apply_activations(step, mid_step_acts())
        log.extend(rec)
        groups.update({(step, g): GroupInfo(f"q{g}", f"question {g}?", tuple(F1_2)) for g in MID_GROUPS})
        rows = [r for r in rec.activations if r["rubric_id"] == "c0.0"]
        assert [r["n_r_after"] for r in rows] == [step] * len(MID_GROUPS)
        assert live.stats["c0.1"].n_r == 0  # every group sharp: variance 0.25 > delta_v
        ev = live.retire(step).events
        log.extend(Records(events=ev))
        if step <= 5:
            assert ev == []
        else:
            assert [(e["rubric_id"], e["group"]) for e in ev] == [("c0.0", None)]
            assert "n_r=6 > kappa=5" in ev[0]["reason"] and "step 6" in ev[0]["reason"]
    rebuilt = RubricMemory.from_events(cfg, log.events, log.activations, log.sources, groups)
    assert rebuilt.state() == live.state() and list(rebuilt.P) == ["c0.1"]
    # The same rows replayed with per-group counting disagree loudly (the stored n_r is the step's, not the group's)
    with pytest.raises(ValueError, match="replayed n_r"):
        RubricMemory.from_events(MemoryConfig(k_consol=1, n_active=2, kappa=5), log.events, log.activations,
                                 log.sources, groups)


def test_rho_retirement_is_unchanged_and_names_no_group():
    mem, _ = memory_with_pool(["a", "b"], MemoryConfig(k_consol=1, n_active=2, kappa=100))
    mem.select_active(1)
    mem.apply_activations(1, [Activation("c0.0", 3, ok([0.0, 1.0]), [1.0, 0.0]),
                              Activation("c0.1", 3, ok([1.0, 0.0]), [1.0, 0.0])])
    ev = mem.retire(1).events
    assert [(e["rubric_id"], e["group"]) for e in ev] == [("c0.0", None)]
    assert ev[0]["reason"] == "rho_r=-1.0000 < rho_min=0.0"


def test_rho_below_rho_min_retires_and_undefined_rho_never_does():
    mem, _ = memory_with_pool(["a", "b"], MemoryConfig(k_consol=1, n_active=2, kappa=100))
    mem.select_active(1)
    mem.apply_activations(1, [Activation("c0.0", 0, ok([0.0, 1.0]), [1.0, 0.0]),  # rho -1
                              Activation("c0.1", 0, ok([0.0, 1.0]), [0.5, 0.5])])  # F1 constant: undefined
    rec = mem.retire(1)
    assert [(e["rubric_id"], e["event"]) for e in rec.events] == [("c0.0", "retired")]
    assert rec.events[0]["rho_r"] == pytest.approx(-1.0) and "rho_r" in rec.events[0]["reason"]
    assert mem.rho("c0.1") is None and "c0.1" in mem.P


def test_judge_error_updates_nothing():
    mem, _ = memory_with_pool(["a"])
    mem.select_active(1)
    before = mem.state()
    rec = mem.apply_activations(1, [Activation("c0.0", 0, ERR, [1.0, 0.0])])
    row = rec.activations[0]
    assert row["judge_error"] and row["scores"] is None and row["kept"] is False and row["variance"] is None
    assert (row["n_edges"], row["n_failed_edges"], row["n_activations_after"]) == (11, 6, 0)
    assert rec.events[0]["event"] == "judge_error"
    assert mem.state() == before


def test_unknown_or_duplicate_activation_is_refused():
    mem, _ = memory_with_pool(["a"])
    mem.select_active(1)
    with pytest.raises(ValueError, match="not in the common pool"):
        mem.apply_activations(1, [Activation("c9.9", 0, ok([1.0]), [1.0])])
    mem2, _ = memory_with_pool(["a"])
    mem2.select_active(1)
    with pytest.raises(ValueError, match="duplicate"):
        mem2.apply_activations(1, [Activation("c0.0", 0, ok([1.0]), [1.0])] * 2)


# ------------------------------------------------------------------------------------------------ selection
def test_empty_pool_selects_nothing():
    mem = RubricMemory(MemoryConfig())
    assert mem.select_active(0) == ([], Records())


def test_selection_top_rho_plus_lru_rotation():
    mem, _ = memory_with_pool(["a", "b", "c", "d"], MemoryConfig(k_consol=1, n_active=2, kappa=100))
    # Give a (c0.0) rho 1 and b (c0.1) rho .5-ish; c, d stay undefined.
    mem.select_active(1)
    mem.apply_activations(1, [Activation("c0.0", 0, ok([1.0, 0.0, 0.5]), [1.0, 0.0, 0.5]),
                              Activation("c0.1", 0, ok([1.0, 0.0, 0.0]), [1.0, 0.0, 0.5])])
    mem.retire(1)
    assert mem.rho("c0.0") == pytest.approx(1.0) and 0 < mem.rho("c0.1") < 1
    picks = []
    for step in range(2, 8):
        active, rec = mem.select_active(step)
        mem.retire(step)
        picks.append([r.rubric_id for r in active])
        assert [e["reason"] for e in rec.events] == ["top rho_r", "lru"]
    # Top slot: c0.0 every step. LRU slot: c0.2 and c0.3 never used (undefined rho -> by age), then c0.1 (used at
    # step 1), then cycling in least-recently-used order.
    assert [p[0] for p in picks] == ["c0.0"] * 6
    assert [p[1] for p in picks] == ["c0.2", "c0.3", "c0.1", "c0.2", "c0.3", "c0.1"]


def test_selection_never_used_ties_prefer_higher_rho_and_rotation_pool_limits():
    mem, _ = memory_with_pool(["a", "b", "c"], MemoryConfig(k_consol=1, n_active=2, rotation_pool=1))
    st = mem.stats
    st["c0.2"].n, st["c0.2"].sx, st["c0.2"].sy, st["c0.2"].sxx, st["c0.2"].syy, st["c0.2"].sxy = 2, 1, 1, 1, 1, 1
    # c0.2 has rho 1 (top); the rotation pool is the single next strongest: c0.0 (undefined rho, older).
    assert [r.rubric_id for r in mem.select_active(1)[0]] == ["c0.2", "c0.0"]
    mem3 = RubricMemory(MemoryConfig(n_active=3))
    mem3.load_pool(0, {"rubrics": [{"title": t, "description": "x", "counter_description": "y"} for t in "ab"]})
    assert len(mem3.select_active(0)[0]) == 2  # min(n_active, |P|)


# ------------------------------------------------------------------------------------------------ warm start, resume
def test_export_and_load_pool(tmp_path):
    mem, _ = memory_with_pool(["a", "b"])
    path = tmp_path / "pool.json"
    path.write_text(json.dumps(mem.export_pool()))
    other = RubricMemory(MemoryConfig(pool_max=1))
    rec = other.load_pool(0, load_pool_file(path), source=str(path))
    assert [(e["rubric_id"], e["event"]) for e in rec.events] == [("w0", "consolidated"), ("w1", "dropped")]
    assert other.P["w0"].title == "a" and other.P["w0"].kind == "common" and other.stats["w0"].n == 0
    bad = tmp_path / "bad.json"
    bad.write_text('{"rubrics": [\n  {"title": 1,}]}')
    with pytest.raises(ValueError, match=r"bad.json, line 2"):
        load_pool_file(bad)
    with pytest.raises(FileNotFoundError, match="memory.init_from"):
        load_pool_file(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="rubric 0 lacks description"):
        RubricMemory(MemoryConfig()).load_pool(0, {"rubrics": [{"title": "a", "counter_description": "y"}]})


def drive(mem, step, log, groups, retire_last=False, phases=("score", "retire", "induce", "consolidate")):
    """The flow's calls for one step (3 samples x 2 groups), or only ``phases`` of them."""
    f1 = [1.0, 0.5, 0.0]
    for g in range(2):
        groups[(step, g)] = GroupInfo(f"q{g}", f"question {g}?", tuple(f1))
    order = ("score", "induce", "consolidate", "retire") if retire_last else ("score", "retire", "induce", "consolidate")
    for ph in order:
        if ph not in phases:
            continue
        if ph == "score":
            active, r = mem.select_active(step)
            log.extend(r)
            s = [1.0, 0.5 * (step % 3), 0.0] if step % 4 else [0.5, 0.5, 0.5]
            log.extend(mem.apply_activations(step, [Activation(a.rubric_id, g, ok(s) if step != 5 else ERR, f1)
                                                    for a in active for g in range(2)]))
        elif ph == "retire":
            log.extend(mem.retire(step))
        elif ph == "induce":
            log.extend(mem.admit_drafts(step, [draft(step, g, 0, [1.0, 0.5, 0.0], f1) for g in range(2)
                                               if (step + g) % 3]))
        else:
            while mem.consolidation_due():  # one call per batch of k_consol drafts, as the flow's stage (§3.3)
                log.extend(mem.consolidate(step, [common(f"r{step}a{mem._commons}"),
                                                  common(f"r{step}b{mem._commons}")], toy_embed))


@pytest.mark.parametrize(("retire_last", "batch"), [(False, "k_consol"), (True, "all")])
def test_rebuild_from_events_is_identical_and_continues_identically(retire_last, batch):
    # both consolidation batches; either pairing meets every kind of event below
    cfg = MemoryConfig(k_consol=2, pool_max=2, maturity=1, kappa=1, consolidation_batch=batch)
    live, log, groups = RubricMemory(cfg), Records(), {}
    for step in range(12):
        drive(live, step, log, groups, retire_last)
    rebuilt = RubricMemory.from_events(cfg, log.events, log.activations, log.sources, groups)
    assert rebuilt.state() == live.state()
    assert {e["event"] for e in log.events} >= {"consolidated", "activated", "replaced", "admitted", "judge_error",
                                                 "retired"}
    # Resume: both continue identically.
    log_a, log_b = Records(), Records()
    for step in range(12, 20):
        drive(live, step, log_a, groups, retire_last)
        drive(rebuilt, step, log_b, groups, retire_last)
    assert log_a == log_b and live.state() == rebuilt.state()
    # A wrong F1 mapping is detected, not silently absorbed.
    wrong = {k: GroupInfo(v.question_id, v.question, (0.0, 0.0, 0.0)) for k, v in groups.items()}
    with pytest.raises(ValueError, match="wrong GroupInfo"):
        RubricMemory.from_events(cfg, log.events + log_a.events, log.activations + log_a.activations, [], wrong)
    with pytest.raises(ValueError, match="GroupInfo"):
        RubricMemory.from_events(cfg, log.events, log.activations, [], {})


@pytest.mark.parametrize(("retire_last", "done"), [
    (False, ("score",)), (False, ("score", "retire")), (False, ("score", "retire", "induce")),
    (True, ("score", "induce")), (True, ("score", "induce", "consolidate")),
])
def test_resume_inside_a_step(retire_last, done):
    cfg = MemoryConfig(k_consol=2, pool_max=2, maturity=1, kappa=1)
    live, log, groups = RubricMemory(cfg), Records(), {}
    for step in range(9):
        drive(live, step, log, groups, retire_last)
    drive(live, 9, log, groups, retire_last, phases=done)
    rebuilt = RubricMemory.from_events(cfg, log.events, log.activations, log.sources, groups, partial_phase=done[-1])
    assert rebuilt.state() == live.state()
    rest = tuple(p for p in ("score", "retire", "induce", "consolidate") if p not in done)
    log_a, log_b = Records(), Records()
    for mem, lg in ((live, log_a), (rebuilt, log_b)):
        drive(mem, 9, lg, groups, retire_last, phases=rest)
        drive(mem, 10, lg, groups, retire_last)
    assert log_a == log_b and live.state() == rebuilt.state()
    with pytest.raises(ValueError, match="unknown partial_phase"):
        RubricMemory.from_events(cfg, log.events, log.activations, [], groups, partial_phase="train")


def test_retire_once_per_step_and_not_before_scoring_calls():
    mem, _ = memory_with_pool(["a"])
    mem.select_active(1)
    mem.retire(1)
    with pytest.raises(RuntimeError, match="retire called twice"):
        mem.end_step(1)
    with pytest.raises(RuntimeError, match="apply_activations called after retire"):
        mem.apply_activations(1, [])


def test_consolidation_with_no_output_clears_d_and_replays():
    cfg = MemoryConfig(k_consol=1)
    mem = RubricMemory(cfg)
    log = Records()
    log.extend(mem.admit_drafts(0, [draft(0, 0, 0, *GOOD)]))
    log.extend(mem.consolidate(0, [], toy_embed))  # the judge found nothing new: D is still cleared
    assert not mem.D and not mem.P
    assert [(e["rubric_id"], e["event"], e["kind"]) for e in log.events][-1] == ("d0.0.0", "consolidated", "draft")
    groups = {(0, 0): GroupInfo("q0", "question 0?", tuple(GOOD[1]))}
    assert RubricMemory.from_events(cfg, log.events, log.activations, [], groups).state() == mem.state()
    mem2 = RubricMemory(cfg)
    mem2.admit_drafts(0, [draft(0, 0, 0, *GOOD)])
    with pytest.raises(ValueError, match="memory.embedder"):
        mem2.consolidate(0, [common("a")], lambda texts: np.zeros((5, 3)))


def test_rows_fit_storage_schemas_and_replay_after_a_parquet_round_trip(tmp_path):
    """The rows go through the real storage layer (Parquet files) and come back to the identical state."""
    from arbor.storage.parquet import read_stage, write_stage

    cfg = MemoryConfig(k_consol=2, pool_max=2, maturity=1, kappa=1)
    mem, groups = RubricMemory(cfg), {}
    back = Records()
    for step in range(10):
        log = Records()
        drive(mem, step, log, groups)
        for table, rows in (("rubric_events", log.events), ("rubric_activations", log.activations),
                            ("rubric_sources", log.sources)):
            if rows:
                write_stage(table, rows, run_id="r1", step=step, stage="memory", home=tmp_path)
            got = read_stage(table, run_id="r1", step=step, stage="memory", home=tmp_path) or []
            {"rubric_events": back.events, "rubric_activations": back.activations,
             "rubric_sources": back.sources}[table].extend(got)
    assert back.activations and back.sources
    assert RubricMemory.from_events(cfg, back.events, back.activations, back.sources, groups).state() == mem.state()


# ---------------------------------------------------------------------------- consolidation batches (K_consol)
class StageRun:
    """What ARBOR's consolidate stage reads of a run (``tasks.methods.base.StepResources``): the rules judge."""

    def __init__(self, cfg, home):
        from arbor.llm import make_judge

        self.cfg, self.run_id, self.embed = cfg, "r", toy_embed
        self.judge = make_judge(cfg.judge, home=home)

    def run_async(self, coro):
        import asyncio

        return asyncio.run(coro)

    def judge_capped(self):
        return False

    def judge_rows(self):
        return self.judge.drain_calls()


def admitted_drafts(mem, step, features):
    """One admitted draft per group g, of rules feature ``features[g]``, from question q{g % 2} (two queries)."""
    results = []
    for g, feat in enumerate(features):
        r = RubricMemory.make_drafts(step, g, [RubricDraft(f"t {feat}", f"does {feat}", f"fails {feat}", feat, 1)])[0]
        results.append(DraftResult(r, g, f"q{g % 2}", f"question {g % 2}?", ok(GOOD[0]), GOOD[1]))
    return mem.admit_drafts(step, results)


@pytest.mark.parametrize(("batch", "calls", "left"), [("k_consol", [4, 4], 2), ("all", [10], 0)])
def test_consolidation_takes_k_consol_drafts_per_call(tmp_path, batch, calls, left):
    """§3.3: consolidation fires when |D| reaches K_consol. With K_consol = 4 and 10 drafts admitted in one step the
    stage makes 2 calls of the 4 oldest drafts each and leaves the newest 2 in D; the stored rows say which drafts
    each call consumed, and replaying them gives the same memory. ``consolidation_batch=all`` (arbor before issue
    50): one call over all 10."""
    from arbor.config import load_config
    from arbor.tasks.methods.arbor.method import Arbor

    cfg = load_config("tiny-cpu", {"run.method": "arbor", "memory.k_consol": 4,
                                   "memory.consolidation_batch": batch, "judge.backend": "rules"})
    method = Arbor(cfg)
    # drafts 0-3 all of answer_in_evidence, 4-7 of query_entity_overlap, 8-9 of format_valid; each feature from both
    # queries, so the rules judge abstracts one common rubric per feature it sees in a call
    feats = ["answer_in_evidence"] * 4 + ["query_entity_overlap"] * 4 + ["format_valid"] * 2
    admit_rows = admitted_drafts(method.memory, 1, feats).events
    out = method.consolidate(StageRun(cfg, tmp_path), 1, [])

    assert [c["stage"] for c in out["judge_calls"]] == ["consolidate"] * len(calls)
    consumed = [e["rubric_id"] for e in out["rubric_events"] if e["kind"] == "draft" and e["event"] == "consolidated"]
    assert consumed == [f"d1.{g}.0" for g in range(sum(calls))]  # oldest first
    assert [d.rubric.rubric_id for d in method.memory.D] == [f"d1.{g}.0" for g in range(10 - left, 10)]
    lineage = {}
    for s in out["rubric_sources"]:
        lineage.setdefault(s["common_rubric_id"], []).append(s["draft_rubric_id"])
    if batch == "k_consol":  # one common per call, ids counted on over the step's calls
        assert lineage == {"c1.0": [f"d1.{g}.0" for g in range(4)], "c1.1": [f"d1.{g}.0" for g in range(4, 8)]}
        assert [r.feature for r in method.memory.pool] == ["answer_in_evidence", "query_entity_overlap"]
    else:  # one call sees three features, the rules judge keeps at most 2 (most widely seen first)
        assert set(lineage) == {"c1.0", "c1.1"} and all(len(v) == 10 for v in lineage.values())
    groups = {(1, g): GroupInfo(f"q{g % 2}", f"question {g % 2}?", tuple(GOOD[1])) for g in range(10)}
    replayed = RubricMemory.from_events(cfg.memory, admit_rows + out["rubric_events"], [], out["rubric_sources"],
                                        groups)
    assert replayed.state() == method.memory.state()
    assert not method.memory.consolidation_due()
