"""The RaR baseline's judge roles (App. C.3): reference-conditioned rubric items, then a holistic 1-10 rating."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from arbor.llm import prompts, rules
from arbor.llm.base import Role, register
from arbor.llm.parse import RarRateOut, RarRubricsOut, parse_json
from arbor.types import Trajectory


@dataclass(frozen=True)
class RarRubrics:
    question: str
    golds: Sequence[str]


register(Role(
    name="rar_rubrics", request=RarRubrics,
    render=lambda q, budget: prompts.rar_rubrics_messages(q.question, q.golds),
    parse=lambda text, q: parse_json(text, RarRubricsOut).items,  # type: ignore[attr-defined]
    schema=RarRubricsOut, heuristic=lambda q, cfg: rules.rar_rubrics(q.question, q.golds),
    identity=lambda q: (q.question, tuple(q.golds)),
))


@dataclass(frozen=True)
class RarRate:
    question: str
    trajectory: Trajectory
    items: Sequence[str]


register(Role(
    name="rar_rate", request=RarRate,
    render=lambda q, budget: prompts.rar_rate_messages(q.question, q.trajectory, q.items, budget),
    parse=lambda text, q: parse_json(text, RarRateOut).rating,  # type: ignore[attr-defined]
    schema=RarRateOut, heuristic=lambda q, cfg: rules.rar_rate(q.trajectory, q.items),
    identity=lambda q: (q.question, q.trajectory.text, tuple(q.items)),
    texts=lambda q: 1,
))
