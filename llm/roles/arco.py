"""ARCO's judge role: the warm-up teacher that labels each step of a trajectory with k criteria and scores."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from arbor.llm import prompts, rules
from arbor.llm.base import Messages, Role, register
from arbor.llm.parse import StepLabelsOut, each_exactly, exactly, parse_step_labels
from arbor.types import Trajectory


@dataclass(frozen=True)
class StepLabels:
    question: str
    golds: Sequence[str] | None
    trajectory: Trajectory
    steps: Sequence[tuple[str, str]]  # (action, the result that followed), in order
    k: int  # criteria per step


def _step_labels_prompt(q: StepLabels, budget: int) -> tuple[str, Messages]:
    return prompts.step_labels_messages(q.question, q.golds, q.trajectory, q.steps, q.k, budget)


register(Role(
    # step_labels.v1: one entry per step with k criteria and scores (another number of steps is invalid output)
    name="step_labels", request=StepLabels, render=_step_labels_prompt,
    parse=lambda text, q: parse_step_labels(text, len(q.steps), q.k), schema=StepLabelsOut,
    heuristic=lambda q, cfg: rules.step_labels(q.question, q.golds, q.steps, q.k),
    identity=lambda q: (q.question, tuple(q.golds or ()), tuple(q.steps), q.k),
    texts=lambda q: len(q.steps), items=lambda q: len(q.steps) * q.k,
    reply=(32, 40),  # per step and criterion: a short criterion and its score
    skip=lambda q: [] if not q.steps else None,
    narrow=lambda q, s: exactly(s, "steps", len(q.steps), each_exactly(q.k, "criteria", "scores")),
))
