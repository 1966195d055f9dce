"""Training and evaluation question sets (§4.1, App. B.1)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, field_validator

from arbor.config.base import Section

FIELD_PATH = re.compile(r"[^.\[\]]+(\[-?\d+\])*(\.[^.\[\]]+(\[-?\d+\])*)*")  # a.b[0].c, prompt[-1].content


def field_path(v: str | None) -> str | None:
    """A row's field path: keys joined by '.', list positions as [i] (tasks.env.datasets.field_value)."""
    if v is not None and not FIELD_PATH.fullmatch(v):
        raise ValueError(f"malformed field path {v!r}: keys joined by '.', list positions as [i] "
                         "(e.g. extra_info.question, prompt[-1].content)")
    return v


FieldPath = Annotated[str | None, AfterValidator(field_path)]


class DataConfig(Section):
    # a named split (offline:train, bench:hotpotqa, a source's <prefix>:<name>), a Hugging Face Hub question set
    # (hf:<owner>/<name>/<file> or hf:<owner>/<name>[/<folder>]:<split>), or a JSONL / Parquet / save_to_disk path
    train: str = "offline:train"
    eval: str | list[str] = Field("offline:eval", description="the held-out set, or a list of them evaluated and "
                                  "reported one by one (ARBOR B.1: [bench:hotpotqa, bench:2wiki, bench:musique, "
                                  "bench:bamboogle])")
    train_size: int | None = Field(None, ge=1, description="seeded sample of the training pool (the whole pool when "
                                   "it holds fewer, said in the run's start line)")
    question_field: FieldPath = Field(None, description="a file's question field, a path with dots and [i] (a chat "
                                      "list gives its last user message); None: question, else extra_info.question, "
                                      "else the last user message of a chat-list prompt (verl)")
    answer_field: FieldPath = Field(None, description="a file's gold answer field (a string, a list, or a mapping "
                                    "with 'target'), a path with dots and [i], e.g. verl's "
                                    "reward_model.ground_truth; None: answer, answers or golden_answers, else "
                                    "reward_model.ground_truth")
    id_field: FieldPath = Field(None, description="a file's question id field; None: question_id, else id, else "
                                "extra_info.index")
    require_answers: bool = Field(True, description="every row must carry a gold answer; false: a row without one "
                                  "is a question with no golds (DR Tulu's research queries: rubrics, no answer key; "
                                  "EM / F1 then score 0 and the judges' rewards carry the signal)")

    @field_validator("eval")
    @classmethod
    def _eval_sets(cls, v: str | list[str]) -> str | list[str]:
        sets = [v] if isinstance(v, str) else v
        if not sets or any(not isinstance(s, str) or not s.strip() for s in sets):
            raise ValueError("data.eval: a question set, or a non-empty list of them")
        if len(set(sets)) != len(sets):
            raise ValueError(f"data.eval: a set named twice in {sets}")
        return v

    def eval_sets(self) -> list[str]:
        """``data.eval`` as a list: the held-out sets, each evaluated and reported on its own."""
        return [self.eval] if isinstance(self.eval, str) else list(self.eval)
