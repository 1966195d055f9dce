"""Training and evaluation question sets (§4.1, App. B.1)."""

from __future__ import annotations

from pydantic import Field

from arbor.config.base import Section


class DataConfig(Section):
    train: str = "offline:train"  # a JSONL/Parquet path or a named split of the shipped data
    eval: str = "offline:eval"
    train_size: int | None = Field(None, ge=1, description="seeded sample of the training pool")
    question_field: str = Field("question", description="a file's question field; dotted for nested records")
    answer_field: str | None = Field(None, description="a file's gold answer field (a string, a list, or a mapping "
                                     "with 'target'), dotted for nested records, e.g. verl's "
                                     "reward_model.ground_truth; None: answer, answers or golden_answers")
    id_field: str | None = Field(None, description="a file's question id field; None: question_id or id")
