"""The RaR baseline's judge roles (App. C.3), each declared once: reference-conditioned rubric items, then a
holistic 1-10 rating; the request, the reply's schema and parser, the prompt (``prompts/``) and the offline
heuristic (items in a checkable "kind: text" form, and the share of them a trajectory meets)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator

from arbor.llm import prompts
from arbor.llm.base import Messages, Role, register
from arbor.llm.parse import SENTENCE, Strict, parse_json, sent_cap, sent_choices
from arbor.llm.reading import contains_phrase, content_tokens, question_entities, repeated_query_share
from arbor.llm.text import escape_block, normalize_answer, parse_trajectory, structure_valid
from arbor.types import Trajectory

prompts.register_prompts(Path(__file__).parent / "prompts")
VERSIONS = {"rar_rubrics": "rar_rubrics.v1", "rar_rate": "rar_rate.v1"}


# ---- reply schemas -------------------------------------------------------------------------------------------------
class RarRubricsOut(Strict):
    items: list[Annotated[str, sent_cap(SENTENCE)]] = Field(min_length=5, max_length=10)

    @field_validator("items")
    @classmethod
    def _non_empty(cls, v: list[str]) -> list[str]:
        if any(not s.strip() for s in v):
            raise ValueError("empty rubric item")
        return [s.strip() for s in v]


class RarRateOut(Strict):
    rating: int = Field(ge=1, le=10, json_schema_extra=sent_choices(range(1, 11)))


# ---- prompts ------------------------------------------------------------------------------------------------------
def rar_rubrics_messages(question: str, golds: Sequence[str]) -> tuple[str, Messages]:
    """RaR baseline (C.3): 5-10 reference-conditioned items from the question and reference answer only."""
    version = VERSIONS["rar_rubrics"]
    return version, prompts.render(version, question=escape_block(question), golds=prompts.golds_block(golds))


def rar_rate_messages(question: str, trajectory: Trajectory, items: Sequence[str], max_tokens: int
                      ) -> tuple[str, Messages]:
    """RaR baseline (C.3): one holistic 1-10 rating of a full trajectory under the query's items."""
    version = VERSIONS["rar_rate"]
    listed = "\n".join(f"{i + 1}. {escape_block(it)}" for i, it in enumerate(items))
    return version, prompts.render(version, question=escape_block(question), items=listed,
                           trajectory=prompts.trajectory_block(trajectory, max_tokens))


# ---- the offline heuristics ----------------------------------------------------------------------------------------
def rar_rubrics(question: str, golds: Sequence[str]) -> list[str]:
    """Items from the question's entities and the reference answer, in a checkable 'kind: text' form."""
    items = [f"Query names: {e}" for e in question_entities(question)[:4]]
    for g in list(golds)[:2]:
        items += [f"Evidence mentions: {g}", f"Answer states: {g}"]
    generic = ["Structure: one boxed final answer with closed tags", "Queries: no repeated query",
               "Searches: at least one search issued", "Results: at least one result read",
               "Answer given: a non-empty final answer"]
    items = list(dict.fromkeys(items))[:8]
    items += generic[: max(2, 5 - len(items))]
    return items[:10]


def rar_rate(trajectory: Trajectory, items: Sequence[str]) -> int:
    """rating = 1 + floor(9 * share of items satisfied + 0.5) (so 1..10, halves round up)."""
    share = sum(_item_met(it, trajectory.text) for it in items) / len(items) if items else 0.0
    return 1 + int(9 * share + 0.5)


def _item_met(item: str, text: str) -> bool:
    kind, _, arg = item.partition(":")
    kind, arg = kind.strip().lower(), arg.strip()
    p = parse_trajectory(text)
    if kind == "query names":
        return any(content_tokens(arg) <= content_tokens(q) for q in p.queries)
    if kind == "evidence mentions":
        return any(contains_phrase(r, arg) for r in p.results)
    if kind == "answer states":
        return contains_phrase(p.answer or "", arg)
    if kind == "structure":
        return structure_valid(text)
    if kind == "queries":
        return bool(p.queries) and repeated_query_share(text, "") == 0.0
    if kind == "searches":
        return bool(p.queries)
    if kind == "results":
        return bool(p.results)
    if kind == "answer given":
        return bool(normalize_answer(p.answer or ""))
    return contains_phrase(text, arg or item)


# ---- the roles ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RarRubrics:
    question: str
    golds: Sequence[str]


RAR_RUBRICS = register(Role(
    name="rar_rubrics", request=RarRubrics,
    render=lambda q, budget: rar_rubrics_messages(q.question, q.golds),
    parse=lambda text, q: parse_json(text, RarRubricsOut).items,  # type: ignore[attr-defined]
    schema=RarRubricsOut, heuristic=lambda q, cfg: rar_rubrics(q.question, q.golds),
    identity=lambda q: (q.question, tuple(q.golds)),
))


@dataclass(frozen=True)
class RarRate:
    question: str
    trajectory: Trajectory
    items: Sequence[str]


RAR_RATE = register(Role(
    name="rar_rate", request=RarRate,
    render=lambda q, budget: rar_rate_messages(q.question, q.trajectory, q.items, budget),
    parse=lambda text, q: parse_json(text, RarRateOut).rating,  # type: ignore[attr-defined]
    schema=RarRateOut, heuristic=lambda q, cfg: rar_rate(q.trajectory, q.items),
    identity=lambda q: (q.question, q.trajectory.text, tuple(q.items)),
    texts=lambda q: 1,
))
