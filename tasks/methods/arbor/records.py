"""The rows the rubric memory's calls return and the inputs they take (paper §3.3; docs/interfaces.md):
``rubric_events`` / ``rubric_activations`` / ``rubric_sources`` rows without run_id, a group's query and F1 for
replay, and one judged (rubric, group) or draft."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from arbor.tasks.methods.arbor.sparse_graph import GroupScoring
from arbor.types import Rubric

EVENT_COLUMNS = (
    "step", "seq", "group", "rubric_id", "event", "kind", "title", "description", "counter_description",
    "feature", "direction", "variance", "pearson", "n_r", "rho_r", "n_activations", "mean_variance", "pool_size",
    "candidate_pool_size", "other_rubric_id", "similarity", "reason",
)
ACTIVATION_COLUMNS = (
    "step", "group", "rubric_id", "variance", "n_edges", "n_failed_edges", "kept", "judge_error", "scores",
    "n_r_after", "rho_r_after", "n_activations_after", "mean_variance_after",
)
SOURCE_COLUMNS = ("step", "common_rubric_id", "draft_rubric_id", "draft_step", "group", "question_id", "question")


@dataclass
class Records:
    """Rows a memory call produced, ready for storage (run_id is added by the writer)."""

    events: list[dict[str, Any]] = field(default_factory=list)
    activations: list[dict[str, Any]] = field(default_factory=list)
    sources: list[dict[str, Any]] = field(default_factory=list)

    def extend(self, other: Records) -> Records:
        self.events += other.events
        self.activations += other.activations
        self.sources += other.sources
        return self


@dataclass(frozen=True)
class GroupInfo:
    """What the memory needs to know about a scored group when replaying: its query and per-sample F1."""

    question_id: str
    question: str
    f1: tuple[float, ...]


@dataclass(frozen=True)
class Activation:
    """One active common rubric's judging result on one group of the step."""

    rubric_id: str
    group: int
    scoring: GroupScoring
    f1: Sequence[float]


@dataclass(frozen=True)
class DraftResult:
    """One induced draft judged on its source group (for admission)."""

    rubric: Rubric
    group: int
    question_id: str
    question: str
    scoring: GroupScoring
    f1: Sequence[float]


def group_info_from_rows(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[int, int], GroupInfo]:
    """(step, group) -> GroupInfo from ``trajectories`` rows (question_id, question, f1 in sample order)."""
    acc: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        acc.setdefault((int(r["step"]), int(r["group"])), []).append(r)
    out = {}
    for key, rs in acc.items():
        rs = sorted(rs, key=lambda r: r["sample"])
        out[key] = GroupInfo(str(rs[0]["question_id"]), str(rs[0]["question"]), tuple(float(r["f1"]) for r in rs))
    return out
