"""The answer-accuracy judge role (ARBOR App. E.4): does a prediction match any golden alias? Asked by evaluation
(``evaluate.py``) for every method, so it is declared here, with its caller: the request, the reply's schema and
parser, the prompt (``prompts/accuracy.v<N>.md``) and the offline heuristic (normalised exact match)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from arbor.llm import prompts
from arbor.llm.base import Messages, Role, register
from arbor.llm.parse import InvalidOutput, Strict, parse_json
from arbor.llm.text import escape_block, normalize_answer

prompts.register_prompts(Path(__file__).parent / "prompts")
VERSION = "accuracy.v2"


class AccuracyOut(Strict):
    """E.4's verdict as structured outputs carry it (a server that constrains decoding cannot write anything else;
    the literal verdict word stays the reply without them, ``parse_accuracy``)."""

    verdict: Literal["Correct", "Incorrect"]


# Leading markup a model may wrap its verdict in: whitespace, markdown emphasis / code / heading / quote marks,
# quotation marks and opening brackets. The verdict word must not run on into a letter, digit or hyphen ("Correctly" is no verdict).
_LEADING_VERDICT = re.compile(r"[\s*_`#>\"'\u201c\u2018(\[]*(incorrect|correct)(?![^\W_]|-)", re.I)


def parse_accuracy(text: str) -> bool:
    """E.4 literal verdict: the reply's *leading* word decides, ``Correct`` -> True, ``Incorrect`` -> False.

    Case, surrounding whitespace / punctuation and markdown emphasis are ignored (``**Correct**``, ``correct.``,
    ``  INCORRECT:``); whatever follows the verdict word (an explanation that says "the correct answer is ...")
    is not read. A reply that does not start with a verdict word (an explanation only, "The answer is correct",
    an empty reply) is invalid output: retried, then a recorded failure (``value=None``), never "correct".
    A JSON object is read as ``AccuracyOut`` (``{"verdict": "Correct"}``: the reply under structured outputs).
    """
    if text.lstrip().startswith("{"):
        return parse_json(text, AccuracyOut).verdict == "Correct"  # type: ignore[attr-defined]
    m = _LEADING_VERDICT.match(text)
    if m is None:
        raise InvalidOutput(f"reply does not start with Correct / Incorrect ({len(text)} chars)")
    return m.group(1).lower() == "correct"


def accuracy_messages(question: str, golds: Sequence[str], prediction: str | None) -> tuple[str, Messages]:
    """E.4: any golden alias counts; the reply leads with the literal word Correct or Incorrect (v2: verdict first)."""
    version = VERSION
    return version, prompts.render(version, question=escape_block(question), golds=prompts.golds_block(golds),
                           prediction=escape_block(prediction or "(no answer)"))


def accuracy_heuristic(golds: Sequence[str], prediction: str | None) -> bool:
    """Normalised exact match against any gold alias (SQuAD normalisation)."""
    pred = normalize_answer(prediction or "")
    return bool(pred) and any(pred == normalize_answer(g) for g in golds)


@dataclass(frozen=True)
class Accuracy:
    question: str
    golds: Sequence[str]
    prediction: str | None


ACCURACY = register(Role(
    name="accuracy", request=Accuracy,
    render=lambda q, budget: accuracy_messages(q.question, q.golds, q.prediction),
    parse=lambda text, q: parse_accuracy(text),  # E.4's verdict word, or {"verdict": ...} under a schema
    schema=AccuracyOut, heuristic=lambda q, cfg: accuracy_heuristic(q.golds, q.prediction),
    identity=lambda q: (q.question, tuple(q.golds), q.prediction),
))
