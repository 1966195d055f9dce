"""The synthetic multi-hop world: a seeded generator of entities, passages and questions (tasks/env/world/).

Used by the named sets ``world:train`` / ``world:eval`` (``data.train``, ``data.eval``), the corpus
``search.corpus: world:corpus`` and the SFT source ``sft.data: world:train``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from arbor.config.base import Section

FlawKind = Literal["repeated_query", "search_after_answer", "generic_query"]


class WorldConfig(Section):
    seed: int = Field(0, description="the world's own seed: names, facts, questions (independent of run.seed)")
    people: int = Field(160, ge=4, description="people (each has a birthplace and a birth year)")
    cities: int = Field(40, ge=4, description="cities (each has a country and a founding year)")
    films: int = Field(160, ge=4, description="films (each has a director, a producing company, a release year)")
    companies: int = Field(60, ge=4, description="companies (each has a founder, a home city, a founding year)")
    countries: int = Field(8, ge=2, description="country names (an attribute of cities; no passage of their own)")
    eval_share: float = Field(0.25, gt=0, lt=1, description="share of each entity type held out for world:eval; "
                              "train and eval questions never share an entity")
    share_one_hop: float = Field(0.4, ge=0, le=1, description="share of 1-hop questions (Who directed F?)")
    share_bridge: float = Field(0.4, ge=0, le=1, description="share of 2-hop bridge questions (Where was the "
                                "director of F born?)")
    share_comparison: float = Field(0.2, ge=0, le=1, description="share of comparison questions (Which of A and B "
                                    "was founded earlier?)")
    train_questions: int = Field(1000, ge=1, description="size of world:train")
    eval_questions: int = Field(200, ge=1, description="size of world:eval")
    sft_flaw_share: float = Field(0.2, ge=0, le=1, description="share of world SFT trajectories with one process "
                                  "flaw (still well-formed, still the right answer)")
    sft_flaw_kinds: list[FlawKind] = Field(
        default_factory=lambda: ["repeated_query", "search_after_answer", "generic_query"], min_length=1,
        description="process flaws the flawed SFT trajectories carry, in equal numbers")

    @model_validator(mode="after")
    def _shares_sum_to_one(self) -> WorldConfig:
        total = self.share_one_hop + self.share_bridge + self.share_comparison
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"world.share_one_hop + world.share_bridge + world.share_comparison must be 1 "
                             f"(got {total:g})")
        return self
