"""Output validation machinery: JSON extraction tolerant of code fences and leading prose, pydantic parsing into a
role's schema, the caps and choices a schema sends, and a schema narrowed to one request. Each role's own schema
and parser live with its method (``tasks/methods/<m>/roles.py``)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, ValidationError


class InvalidOutput(ValueError):
    """The judge's reply does not validate against the role's schema (retried, then recorded as a failure)."""


class InvalidAnswer(InvalidOutput):
    """The reply validates but is no answer: the prompt's placeholders or instructions echoed, a loop, an empty
    field (``llm.answers.answer_problem``). Retried with the reason like any invalid output, and
    recorded in the ledger as ``InvalidAnswer``. ``reason`` is the short cause (``llm.answers.Reason``: a
    placeholder, an instruction copied, a loop, ...), the message what the judge is told."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class Strict(BaseModel):
    """A reply schema: fields it does not declare are ignored."""

    model_config = ConfigDict(extra="ignore")


def sent_cap(chars: int) -> Any:
    """A ``maxLength`` for the schema sent as ``response_format`` only: a server that constrains decoding
    then ends a free-text field instead of letting a weak judge write one string until ``max_tokens`` (a 135M
    model did, and every such reply was cut off). The parser does not enforce it: a longer field from a server
    that ignores the schema is still read."""
    return Field(json_schema_extra={"maxLength": chars})


# the caps: a description or a piece of feedback of a few sentences, an item or a justification of one or two
PROSE, SENTENCE, LABEL = 400, 240, 16


def sent_choices(values: Sequence[float]) -> dict[str, Any]:
    """A bounded number as the ``enum`` of the values a constraining server may write (sent only, like
    ``sent_cap``): llama.cpp's schema grammar ignores ``minimum``/``maximum``, and a 135M judge wrote a grade of 3
    on the 0-2 scale and 3.5 on a [0, 1] one (measured). The parser keeps the range check."""
    return {"enum": list(values)}


TENTHS = [round(i / 10, 1) for i in range(11)]  # a [0, 1] grade under a schema: 0.0, 0.1, ..., 1.0


def _not_bool(v: Any) -> Any:
    if isinstance(v, bool):  # JSON true is not the number 1
        raise ValueError("a boolean is not a number")
    return v


Number = Annotated[int, BeforeValidator(_not_bool)]
Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


def by_index(items: list[Any], n: int, what: str) -> list[Any]:
    """Items with indices 1..n, each exactly once, in index order (InvalidOutput otherwise)."""
    got = sorted(i.index for i in items)
    if got != list(range(1, n + 1)):
        raise InvalidOutput(f"{what}: indices {got} are not 1..{n}, each exactly once")
    return sorted(items, key=lambda i: i.index)


def json_number(v: Any) -> Any:
    """A JSON number only: no boolean, no string holding digits."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError("not a JSON number")
    return v


_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.S)


def extract_json(text: str) -> Any:
    """The first JSON object in a reply: bare, inside a ```json fence, or after leading prose. Raw control
    characters inside strings are read (``strict=False``): llama.cpp's schema grammar lets a judge write a newline
    in a string, and a strict decoder then found no object in a reply that followed the schema."""
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder(strict=False)
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
        where = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'the object'}: {err['msg']}"
                          for err in e.errors()[:3])
        raise InvalidOutput(f"{schema.__name__}: {e.error_count()} validation errors ({where})") from None


# ---- a reply's schema narrowed to one request (structured outputs that carry the counts) ---------------
# The parsers above check counts, indices and permutations that a role's fixed schema cannot say. A request knows
# them (n rubrics, k criteria, the shown labels), so the schema sent as response_format says them too: a server
# that constrains decoding (llama.cpp, vLLM) then cannot write three grades for four rubrics. The parsers still
# check everything (a server may ignore the keywords, e.g. minItems / maxItems, or the format entirely).
JsonSchema = dict[str, Any]


def _inline(schema: JsonSchema, node: JsonSchema) -> JsonSchema:
    """A copy of ``node`` with a top-level ``$ref`` into ``schema["$defs"]`` replaced by its target."""
    ref = node.get("$ref")
    return copy.deepcopy(schema["$defs"][ref.rsplit("/", 1)[1]] if ref else node)


def exactly(schema: JsonSchema, prop: str, n: int, item: Any = None) -> JsonSchema:
    """A copy of ``schema`` whose array property ``prop`` holds exactly ``n`` items; ``item(schema_of_an_item)``
    may narrow the item too (it is inlined first)."""
    out = copy.deepcopy(schema)
    arr = out["properties"][prop]
    arr["minItems"] = arr["maxItems"] = n
    if item is not None:
        one = _inline(out, arr["items"])
        item(one)
        arr["items"] = one
    return out


def numbered(schema: JsonSchema, prop: str, n: int) -> JsonSchema:
    """A copy of ``schema`` whose array property ``prop`` holds exactly ``n`` items numbered 1..n in order: one
    ``prefixItems`` entry per position with ``index`` fixed to it (``const``), no others (``items: false``). The
    parser's rule (each index 1..n exactly once) is then what a constraining server can write, where an enum of
    indices let a 135M judge grade rubric 2 twice and rubric 3 never (measured)."""
    out = copy.deepcopy(schema)
    arr = out["properties"][prop]
    one = _inline(out, arr["items"])
    arr["prefixItems"] = [{**copy.deepcopy(one), "properties": {**copy.deepcopy(one["properties"]), "index": {
        "type": "integer", "const": i}}} for i in range(1, n + 1)]
    arr["items"] = False
    arr["minItems"] = arr["maxItems"] = n
    return out


def each_exactly(n: int, *props: str) -> Any:
    """An item narrowing: each array property in ``props`` holds exactly ``n`` items."""
    def narrow(one: JsonSchema) -> None:
        for p in props:
            one["properties"][p]["minItems"] = one["properties"][p]["maxItems"] = n
    return narrow


def one_of(values: Sequence[str]) -> Any:
    """An item narrowing for an array of strings: each is one of ``values``."""
    def narrow(one: JsonSchema) -> None:
        one.clear()
        one.update({"type": "string", "enum": list(values)})
    return narrow

