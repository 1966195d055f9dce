"""The lifecycle's unit (§3.3, §3.4), as a choice a user can see: ``memory.count_activations`` (group or step)
moves n_r and maturity, ``memory.shaping_filter`` (group or batch) moves the shaping filter; hand-computed cases.

Scores of K = 2 and their population variances: [0.7, 0.3] 0.04, [0.8, 0.2] 0.09, [0.5, 0.5] 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from arbor.config import load_config
from arbor.config.memory import MemoryConfig
from arbor.tasks.methods.arbor.memory import RubricMemory, batch_filter
from arbor.tasks.methods.arbor.method import Arbor
from arbor.tasks.methods.arbor.records import Activation, DraftResult, GroupInfo, Records
from arbor.tasks.methods.arbor.sparse_graph import GroupScoring
from arbor.tasks.stage_store import StageStore
from arbor.types import RubricDraft, Trajectory

F1 = [1.0, 0.0]
NARROW, WIDE, TIED = [0.7, 0.3], [0.8, 0.2], [0.5, 0.5]


def ok(scores: list[float]) -> GroupScoring:
    return GroupScoring(scores=list(scores), n_edges=1, n_failed_edges=0)


def pool(cfg: MemoryConfig, titles: tuple[str, ...] = ("a", "b")) -> tuple[RubricMemory, Records]:
    """A memory whose common pool holds ``titles`` (w0, w1, ...), loaded at step 0."""
    mem = RubricMemory(cfg)
    rec = mem.load_pool(0, {"rubrics": [{"title": t, "description": f"does {t}", "counter_description": f"not {t}"}
                                        for t in titles]})
    return mem, rec


def step_one() -> list[Activation]:
    """w0: 0.04 in group 0, 0.09 in group 1 (step mean 0.065); w1: 0 in group 0, 0.09 in group 1 (0.045)."""
    return [Activation("w0", 0, ok(NARROW), F1), Activation("w0", 1, ok(WIDE), F1),
            Activation("w1", 0, ok(TIED), F1), Activation("w1", 1, ok(WIDE), F1)]


# ------------------------------------------------------------------------------------------ the shaping filter
def test_batch_filter_by_hand() -> None:
    rows = [{"rubric_id": a.rubric_id, "variance": v, "judge_error": False}
            for a, v in zip(step_one(), (0.04, 0.09, 0.0, 0.09), strict=True)]
    rows += [{"rubric_id": "w2", "variance": None, "judge_error": True},  # never scored: no step variance
             {"rubric_id": "w3", "variance": 0.05, "judge_error": False},  # exactly delta_v passes (eq. 2's >=)
             {"rubric_id": "w3", "variance": None, "judge_error": True}]  # a failed group does not pull it down
    assert batch_filter(rows, 0.05) == {"w0": True, "w1": False, "w2": False, "w3": True}


def test_kept_is_the_steps_verdict_under_the_batch_filter() -> None:
    """Per group, w0 is dropped where its variance is 0.04 and w1 kept where it is 0.09; per batch, w0
    (mean 0.065 >= 0.05) enters both groups and w1 (0.045) neither."""
    for unit, want in (("group", [False, True, False, True]), ("batch", [True, True, False, False])):
        mem, _ = pool(MemoryConfig(n_active=2, shaping_filter=unit))
        mem.select_active(1)
        rows = mem.apply_activations(1, step_one()).activations
        assert [(r["rubric_id"], r["group"]) for r in rows] == [("w0", 0), ("w1", 0), ("w0", 1), ("w1", 1)]
        assert [r["kept"] for r in sorted(rows, key=lambda r: (r["rubric_id"], r["group"]))] == want, unit
        assert [r["variance"] for r in rows] == pytest.approx([0.04, 0.0, 0.09, 0.09])


@dataclass
class _Run:
    store: StageStore

    def groups(self, trajs: list[Trajectory]) -> list[list[Trajectory]]:
        return [[t for t in trajs if t.group == g] for g in sorted({t.group for t in trajs})]


def test_the_shape_stage_under_each_filter(tmp_path: Path) -> None:
    """Eq. 3/4 by hand (lambda 0.1, alpha 0.25, base 0). Group 0: per group nothing passes (0.04, 0) and R_total =
    R_base; per batch w0 alone ([0.7, 0.3]: centred [0.2, -0.2], terms [0.2, -0.05]) gives [0.02, -0.005].
    Group 1: per group both rubrics pass ([0.8, 0.2] each), per batch w0 alone, the same composite: centred
    [0.3, -0.3], terms [0.3, -0.075], R_total [0.03, -0.0075] either way."""
    want = {"group": [0.0, 0.0, 0.03, -0.0075], "batch": [0.02, -0.005, 0.03, -0.0075]}
    for unit, totals in want.items():
        cfg = load_config("tiny-world", {"run.method": "arbor", "memory.shaping_filter": unit})
        assert (cfg.memory.lambda_, cfg.memory.alpha, cfg.memory.delta_v) == (0.1, 0.25, 0.05)
        mem, _ = pool(cfg.memory)
        mem.select_active(1)
        rec = mem.apply_activations(1, step_one())
        store = StageStore(f"unit-{unit}", tmp_path)
        store.commit(1, "score", {"rubric_events": [], "rubric_activations": rec.activations, "judge_calls": [],
                                  "rubric_verdicts": []})
        trajs = [Trajectory(f"unit-{unit}", 1, g, i, f"q{g}", "q?", ["x"], format_valid=True, base_reward=0.0)
                 for g in (0, 1) for i in (0, 1)]
        Arbor(cfg).shape(_Run(store), 1, trajs)  # type: ignore[arg-type]
        assert [t.shaped_reward for t in trajs] == pytest.approx(totals), unit


# ------------------------------------------------------------------------------------------ maturity
def test_maturity_is_counted_in_the_lifecycles_unit() -> None:
    """Pool full (2 of 2), maturity 2. Step 1 scores w0 (variance 0.09) in two groups and w1 (0) in one. Per group
    only w0 has matured (2 activations) and it is replaced at once, though w1's variance is lower; per step no
    rubric has (one step each), and the new rubric is dropped; at step 2 both have two steps and w1, the lowest
    mean variance, is replaced. A rebuild from the events replays the same state."""
    for unit in ("group", "step"):
        cfg = MemoryConfig(k_consol=1, pool_max=2, maturity=2, n_active=2, count_activations=unit)
        mem, log = pool(cfg)
        groups = {}
        for step in (1, 2):
            log.extend(mem.select_active(step)[1])
            acts = [Activation("w0", 0, ok(WIDE), F1), Activation("w0", 1, ok(WIDE), F1),
                    Activation("w1", 0, ok(TIED), F1)]
            log.extend(mem.apply_activations(step, acts))
            groups.update({(step, g): GroupInfo(f"q{g}", "question?", tuple(F1)) for g in (0, 1)})
            assert (mem.stats["w0"].n_activations, mem.stats["w0"].n_steps) == (2 * step, step)
            assert mem.stats["w0"].activations(unit) == (2 * step if unit == "group" else step)
            r = RubricMemory.make_drafts(step, 0, [RubricDraft(f"draft {step}", "x", "y")])[0]
            log.extend(mem.admit_drafts(step, [DraftResult(r, 0, "q0", "question?", ok([1.0, 0.0]), [1.0, 0.0])]))
            rec = mem.consolidate(step, [RubricDraft(f"new {step}", "d", "c")],
                                  lambda texts: __import__("numpy").eye(len(texts), 8))
            log.extend(rec)
            got = [(e["rubric_id"], e["event"], e["reason"]) for e in rec.events if e["kind"] == "common"]
            if unit == "group" and step == 1:
                assert got[:2] == [("w0", "replaced", "lowest mean within-group variance among matured"),
                                   ("c1.0", "consolidated", "from 1 drafts")]
                break
            if step == 1:
                assert got == [("c1.0", "dropped", "pool full and no rubric has 2 activations (steps)")]
            else:
                assert [(g[0], g[1]) for g in got[:2]] == [("w1", "replaced"), ("c2.0", "consolidated")]
        rebuilt = RubricMemory.from_events(cfg, log.events, log.activations, log.sources, groups)
        assert rebuilt.state() == mem.state() and list(rebuilt.P) == list(mem.P)


def test_which_reading_each_profile_uses() -> None:
    """docs/decisions/the-lifecycles-unit.md: the group reading by default and in the CPU profiles (the record
    they were measured with); ARBOR's paper profiles count n_r and maturity per group (§3.3, Table 3) and filter
    per batch (§3.4's "per-batch variance filter")."""
    assert (MemoryConfig().count_activations, MemoryConfig().shaping_filter) == ("group", "group")
    for p in ("tiny-cpu", "tiny-world", "smol-world", "smol-vllm"):
        m = load_config(p).memory
        assert (m.count_activations, m.shaping_filter) == ("group", "group"), p
    for p in ("qwen3-4b", "qwen3-8b", "qwen3-14b"):
        m = load_config(p).memory
        assert (m.count_activations, m.shaping_filter) == ("group", "batch"), p
