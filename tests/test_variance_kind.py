"""``memory.variance`` (population 1/n or sample 1/(n-1)) used alike by eq. 2's admission, the
shaping filter (§3.4) and n_r (§3.3), on a K = 8 score vector whose two variances straddle delta_v = 0.05."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from arbor.config import load_config
from arbor.config.memory import MemoryConfig
from arbor.group_stats import group_variance, population_variance, sample_variance
from arbor.tasks.methods.arbor.memory import RubricMemory, admission
from arbor.tasks.methods.arbor.records import Activation, DraftResult
from arbor.tasks.methods.arbor.sparse_graph import GroupScoring
from arbor.tasks.methods.base import RubricScores
from arbor.tasks.methods.grpo import GRPO
from arbor.tasks.shaping import shape_group
from arbor.types import RubricDraft, Trajectory

# mean 0.5; squared deviations 3 x 1/16 + 2 x 0 + 3 x 1/16 = 0.375: population 0.375 / 8 = 0.046875 < 0.05,
# sample 0.375 / 7 = 0.0535714... >= 0.05 (edge means of a K = 8 sparse graph take such values)
SCORES = [0.25, 0.25, 0.25, 0.5, 0.5, 0.75, 0.75, 0.75]
F1 = [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
POP, SAMPLE = 0.375 / 8, 0.375 / 7


def test_the_two_variances_by_hand() -> None:
    assert population_variance(SCORES) == pytest.approx(POP, abs=1e-15) and POP < 0.05
    assert sample_variance(SCORES) == pytest.approx(SAMPLE, abs=1e-15) and SAMPLE > 0.05
    assert group_variance(SCORES, "population") == population_variance(SCORES)
    assert group_variance(SCORES, "sample") == sample_variance(SCORES)
    assert sample_variance([0.3]) == 0.0 == population_variance([0.3])
    with pytest.raises(ValueError, match="memory.variance"):
        group_variance(SCORES, "unbiased")  # type: ignore[arg-type]


def test_admission_differs_by_the_key() -> None:
    """Eq. 2 at delta_v = 0.05: rejected on variance with n, admitted with n - 1 (Pearson > 0 either way)."""
    pop = admission(SCORES, F1, 0.05, 0.0, "population")
    smp = admission(SCORES, F1, 0.05, 0.0, "sample")
    assert (pop.admitted, pop.reason, pop.variance) == (False, "variance < delta_v", pytest.approx(POP))
    assert (smp.admitted, smp.variance) == (True, pytest.approx(SAMPLE))
    assert pop.pearson == smp.pearson and smp.pearson > 0
    # through the memory, as its config says
    for kind, admitted in (("population", False), ("sample", True)):
        mem = RubricMemory(MemoryConfig(variance=kind))
        r = RubricMemory.make_drafts(0, 0, [RubricDraft("a", "does a", "fails a")])[0]
        rec = mem.admit_drafts(0, [DraftResult(r, 0, "q0", "question?", GroupScoring(SCORES, 11, 0), F1)])
        assert [e["event"] for e in rec.events] == ["induced", "admitted" if admitted else "rejected"]
        assert rec.events[1]["variance"] == pytest.approx(SAMPLE if admitted else POP)


def test_shaping_filter_differs_by_the_key() -> None:
    """§3.4's filter: the rubric is dropped with n (R_total = R_base), kept with n - 1; then eq. 3/4 by hand:
    centred s - 0.5, negatives x alpha 0.25, lambda 0.1."""
    base = [0.0] * 8
    pop = shape_group(base, [SCORES], [True] * 8, lambda_=0.1, alpha=0.25, delta_v=0.05, variance="population")
    smp = shape_group(base, [SCORES], [True] * 8, lambda_=0.1, alpha=0.25, delta_v=0.05, variance="sample")
    assert pop.kept == [False] and pop.total == base and pop.variances == [pytest.approx(POP)]
    assert smp.kept == [True] and smp.variances == [pytest.approx(SAMPLE)]
    assert smp.total == pytest.approx([-0.00625] * 3 + [0.0] * 2 + [0.025] * 3)


def test_n_r_counts_by_the_key() -> None:
    """§3.3: the same activation is low-variance (n_r 1) with n and resets n_r (0) with n - 1."""
    for kind, n_r, kept in (("population", 1, False), ("sample", 0, True)):
        mem = RubricMemory(MemoryConfig(variance=kind))
        mem.load_pool(0, {"rubrics": [{"title": "a", "description": "x", "counter_description": "y"}]})
        (rid,) = list(mem.P)
        mem.select_active(1)
        row = mem.apply_activations(1, [Activation(rid, 0, GroupScoring(SCORES, 11, 0), F1)]).activations[0]
        assert (row["n_r_after"], row["kept"], mem.stats[rid].n_r) == (n_r, kept, n_r)
        assert row["variance"] == pytest.approx(SAMPLE if kind == "sample" else POP)


class _OneRubric(GRPO):
    """A plug-in method (docs/methods.md) whose one rubric scores every group with SCORES."""

    name = "one-rubric"

    def rubric_scores(self, run, step, trajs):  # type: ignore[no-untyped-def]
        return RubricScores(per_group={0: [SCORES]})


@dataclass
class _Run:
    cfg: object

    def groups(self, trajs):  # type: ignore[no-untyped-def]
        return [list(trajs)]


def test_the_shape_stage_reads_memory_variance() -> None:
    """Method.shape passes memory.variance to the filter: the same group is shaped only under 'sample'."""
    shaped = {}
    for kind in ("population", "sample"):
        cfg = load_config("tiny-cpu", {"memory.variance": kind})
        trajs = [Trajectory("r", 0, 0, i, "q0", "q?", ["x"], format_valid=True, base_reward=0.0) for i in range(8)]
        _OneRubric(cfg).shape(_Run(cfg), 0, trajs)
        shaped[kind] = [t.shaped_reward for t in trajs]
    assert shaped["population"] == [0.0] * 8
    assert shaped["sample"] == pytest.approx([-0.00625] * 3 + [0.0] * 2 + [0.025] * 3)


def test_profiles_variance() -> None:
    """Population everywhere: the default (tiny / smol rows unchanged) and ARBOR's paper profiles' stated choice."""
    for p in ("tiny-cpu", "tiny-world", "smol-world", "qwen3-4b", "qwen3-8b", "qwen3-14b"):
        assert load_config(p).memory.variance == "population", p
    assert load_config("qwen3-8b", {"memory.variance": "sample"}).memory.variance == "sample"
