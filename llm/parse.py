"""Output validation: pydantic schemas per role, JSON extraction tolerant of code fences and leading prose."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from arbor.tasks.types import RubricDraft


class InvalidOutput(ValueError):
    """The judge's reply does not validate against the role's schema (retried, then recorded as a failure)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore")


class DraftOut(_Strict):
    title: str = Field(min_length=1, max_length=300)
    description: str = Field(min_length=1)
    counter_description: str = Field(min_length=1)

    def to_draft(self) -> RubricDraft:
        return RubricDraft(self.title.strip(), self.description.strip(), self.counter_description.strip())


class InductionOut(_Strict):
    rubrics: list[DraftOut] = Field(max_length=3)  # 1-3 rubrics, or [] ("existing rubrics already cover it")


class ConsolidationOut(_Strict):
    new_common_rubrics: list[DraftOut] = Field(max_length=2)  # 1-2 standards, or []


class PairwiseOut(_Strict):
    winner: Literal["A", "B", "TIE"]

    @field_validator("winner", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.strip().upper() if isinstance(v, str) else v


class RarRubricsOut(_Strict):
    items: list[str] = Field(min_length=5, max_length=10)

    @field_validator("items")
    @classmethod
    def _non_empty(cls, v: list[str]) -> list[str]:
        if any(not s.strip() for s in v):
            raise ValueError("empty rubric item")
        return [s.strip() for s in v]


class RarRateOut(_Strict):
    rating: int = Field(ge=1, le=10)


_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.S)


def extract_json(text: str) -> Any:
    """The first JSON object in a reply: bare, inside a ```json fence, or after leading prose."""
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    for cand in candidates:
        cand = cand.strip()
        for start in [i for i, ch in enumerate(cand) if ch == "{"]:
            try:
                obj, _ = decoder.raw_decode(cand, start)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                return obj
    raise InvalidOutput(f"no JSON object in reply ({len(text)} chars)")


def parse_json(text: str, schema: type[BaseModel]) -> BaseModel:
    try:
        return schema.model_validate(extract_json(text))
    except ValidationError as e:
        raise InvalidOutput(f"{schema.__name__}: {e.error_count()} validation errors") from None


# Leading markup a model may wrap its verdict in: whitespace, markdown emphasis / code / heading / quote marks,
# quotation marks and opening brackets. The verdict word must not run on into a letter, digit or hyphen ("Correctly" is no verdict).
_LEADING_VERDICT = re.compile(r"[\s*_`#>\"'\u201c\u2018(\[]*(incorrect|correct)(?![^\W_]|-)", re.I)


def parse_accuracy(text: str) -> bool:
    """E.4 literal verdict: the reply's *leading* word decides, ``Correct`` -> True, ``Incorrect`` -> False.

    Case, surrounding whitespace / punctuation and markdown emphasis are ignored (``**Correct**``, ``correct.``,
    ``  INCORRECT:``); whatever follows the verdict word (an explanation that says "the correct answer is ...")
    is not read. A reply that does not start with a verdict word (an explanation only, "The answer is correct",
    an empty reply) is invalid output: retried, then a recorded failure (``value=None``), never "correct".
    """
    m = _LEADING_VERDICT.match(text)
    if m is None:
        raise InvalidOutput(f"reply does not start with Correct / Incorrect ({len(text)} chars)")
    return m.group(1).lower() == "correct"
