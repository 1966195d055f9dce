"""Output validation: pydantic schemas per role, JSON extraction tolerant of code fences and leading prose."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    ValidationError,
    field_validator,
)

from arbor.types import (
    ReflectionGrade,
    RubricDraft,
    RubricGrade,
    RubricItem,
    StageRubricDraft,
    StepLabel,
    StepRubric,
    StepVerdict,
)


class InvalidOutput(ValueError):
    """The judge's reply does not validate against the role's schema (retried, then recorded as a failure)."""


class InvalidAnswer(InvalidOutput):
    """The reply validates but is no answer: the prompt's placeholders or instructions echoed, a loop, an empty
    field (``llm.answers.answer_problem``; issue 50 item 9). Retried with the reason like any invalid output, and
    recorded in the ledger as ``InvalidAnswer``."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore")


def sent_cap(chars: int) -> Any:
    """A ``maxLength`` for the schema sent as ``response_format`` only (issue 31): a server that constrains decoding
    then ends a free-text field instead of letting a weak judge write one string until ``max_tokens`` (a 135M
    model did, and every such reply was cut off). The parser does not enforce it: a longer field from a server
    that ignores the schema is still read."""
    return Field(json_schema_extra={"maxLength": chars})


# the caps: a description or a piece of feedback of a few sentences, an item or a justification of one or two
PROSE, SENTENCE, LABEL = 400, 240, 16


def sent_choices(values: Sequence[float]) -> dict[str, Any]:
    """A bounded number as the ``enum`` of the values a constraining server may write (sent only, like
    ``sent_cap``): llama.cpp's schema grammar ignores ``minimum``/``maximum``, and a 135M judge wrote a grade of 3
    on the 0-2 scale and 3.5 on a [0, 1] one (issue 31, measured). The parser keeps the range check."""
    return {"enum": list(values)}


TENTHS = [round(i / 10, 1) for i in range(11)]  # a [0, 1] grade under a schema: 0.0, 0.1, ..., 1.0


class DraftOut(_Strict):
    title: str = Field(min_length=1, max_length=300)
    description: str = Field(min_length=1, json_schema_extra={"maxLength": PROSE})
    counter_description: str = Field(min_length=1, json_schema_extra={"maxLength": PROSE})

    def to_draft(self) -> RubricDraft:
        return RubricDraft(self.title.strip(), self.description.strip(), self.counter_description.strip())


class InductionOut(_Strict):
    rubrics: list[DraftOut] = Field(max_length=3)  # 1-3 rubrics, or [] ("existing rubrics already cover it")


class ConsolidationOut(_Strict):
    new_common_rubrics: list[DraftOut] = Field(max_length=2)  # 1-2 standards, or []


class AccuracyOut(_Strict):
    """E.4's verdict as structured outputs carry it (a server that constrains decoding cannot write anything else;
    the literal verdict word stays the reply without them, ``parse_accuracy``)."""

    verdict: Literal["Correct", "Incorrect"]


class PairwiseOut(_Strict):
    winner: Literal["A", "B", "TIE"]

    @field_validator("winner", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.strip().upper() if isinstance(v, str) else v


class RarRubricsOut(_Strict):
    items: list[Annotated[str, sent_cap(SENTENCE)]] = Field(min_length=5, max_length=10)

    @field_validator("items")
    @classmethod
    def _non_empty(cls, v: list[str]) -> list[str]:
        if any(not s.strip() for s in v):
            raise ValueError("empty rubric item")
        return [s.strip() for s in v]


class RarRateOut(_Strict):
    rating: int = Field(ge=1, le=10, json_schema_extra=sent_choices(range(1, 11)))


# ---- RubricEM roles (App. C.2, C.3, D.6.2) -------------------------------------------------------------------
STAGE_MAX_NEW = (4, 4, 4, 5)  # C.2 targets, read as the most one reply may add per stage (positive + negative)


def _not_bool(v: Any) -> Any:
    if isinstance(v, bool):  # JSON true is not the number 1
        raise ValueError("a boolean is not a number")
    return v


Number = Annotated[int, BeforeValidator(_not_bool)]
Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


class StageDraftOut(_Strict):
    title: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=300)]
    description: Annotated[Text, sent_cap(PROSE)]
    weight: Number = Field(ge=1, le=3, json_schema_extra=sent_choices((1, 2, 3)))  # 1 minor, 2 important, 3 critical


class StageSetOut(_Strict):
    positive_rubrics: list[StageDraftOut] = Field(default_factory=list)
    negative_rubrics: list[StageDraftOut] = Field(default_factory=list)


class StageRubricsOut(_Strict):
    """C.2: rubrics by stage, each stage key present (empty lists where there is nothing to add)."""

    stage_1: StageSetOut
    stage_2: StageSetOut
    stage_3: StageSetOut
    stage_4: StageSetOut

    def to_drafts(self) -> list[StageRubricDraft]:
        """Stage order; within a stage the positive rubrics, then the negative ones. More rubrics in one stage
        than ``STAGE_MAX_NEW`` allows is invalid output."""
        out: list[StageRubricDraft] = []
        for k, s in enumerate((self.stage_1, self.stage_2, self.stage_3, self.stage_4), start=1):
            if len(s.positive_rubrics) + len(s.negative_rubrics) > STAGE_MAX_NEW[k - 1]:
                raise InvalidOutput(f"StageRubricsOut: more than {STAGE_MAX_NEW[k - 1]} rubrics in stage_{k}")
            for polarity, items in ((1, s.positive_rubrics), (-1, s.negative_rubrics)):
                out += [StageRubricDraft(k, d.title, d.description, d.weight, polarity) for d in items]
        return out


class GradeOut(_Strict):
    index: Number
    score: Number = Field(ge=0, le=2, json_schema_extra=sent_choices((0, 1, 2)))
    justification: Annotated[str, StringConstraints(strip_whitespace=True), sent_cap(SENTENCE)] = ""


class StageGradesOut(_Strict):
    scores: list[GradeOut]


class ReflectionGradeOut(_Strict):
    index: Number
    diagnosis: float = Field(ge=0.0, le=1.0, allow_inf_nan=False, json_schema_extra=sent_choices(TENTHS))
    specificity: float = Field(ge=0.0, le=1.0, allow_inf_nan=False, json_schema_extra=sent_choices(TENTHS))
    scope: float = Field(ge=0.0, le=1.0, allow_inf_nan=False, json_schema_extra=sent_choices(TENTHS))


class ReflectionGradesOut(_Strict):
    grades: list[ReflectionGradeOut]


class StepLabelOut(_Strict):
    criteria: list[Annotated[str, sent_cap(SENTENCE)]]
    scores: list[Annotated[float, Field(allow_inf_nan=False)]]


class StepLabelsOut(_Strict):
    steps: list[StepLabelOut]


def _by_index(items: list[Any], n: int, what: str) -> list[Any]:
    """Items with indices 1..n, each exactly once, in index order (InvalidOutput otherwise)."""
    got = sorted(i.index for i in items)
    if got != list(range(1, n + 1)):
        raise InvalidOutput(f"{what}: indices {got} are not 1..{n}, each exactly once")
    return sorted(items, key=lambda i: i.index)


def parse_stage_rubrics(text: str) -> list[StageRubricDraft]:
    """C.2: drafts by stage (``StageRubricsOut.to_drafts``)."""
    return parse_json(text, StageRubricsOut).to_drafts()  # type: ignore[attr-defined]


def parse_stage_grades(text: str, n: int) -> list[RubricGrade]:
    """C.3: one 0/1/2 score per rubric index 1..n, returned in rubric order."""
    scores = _by_index(parse_json(text, StageGradesOut).scores, n, "StageGradesOut")  # type: ignore[attr-defined]
    return [RubricGrade(g.score, g.justification) for g in scores]


def parse_reflection_grades(text: str, n: int) -> list[ReflectionGrade]:
    """D.6.2: one (diagnosis, specificity, scope) in [0, 1] per candidate index 1..n, returned in candidate order."""
    grades = _by_index(parse_json(text, ReflectionGradesOut).grades, n,  # type: ignore[attr-defined]
                       "ReflectionGradesOut")
    return [ReflectionGrade(g.diagnosis, g.specificity, g.scope) for g in grades]


def parse_step_labels(text: str, n: int, k: int) -> list[StepLabel]:
    """ARCO's teacher: one entry per step (exactly ``n``); each step's criteria and scores are cut or padded to
    ``k`` (a short score list repeats its last value, missing criteria are empty) and scores clamped to [-1, 1]."""
    steps = parse_json(text, StepLabelsOut).steps  # type: ignore[attr-defined]
    if len(steps) != n:
        raise InvalidOutput(f"StepLabelsOut: {len(steps)} steps for a trajectory of {n}")
    out = []
    for s in steps:
        if not s.scores:
            raise InvalidOutput("StepLabelsOut: a step without scores")
        scores = [min(1.0, max(-1.0, float(v))) for v in s.scores[:k]]
        scores += [scores[-1]] * (k - len(scores))
        criteria = [c.strip() for c in s.criteria[:k]] + [""] * (k - len(s.criteria[:k]))
        out.append(StepLabel(tuple(criteria), tuple(scores)))
    return out


# ---- Co-ReAct roles (its §3.1-3.3) ------------------------------------------------------------------------------
STEP_RUBRIC_MAX_ITEMS = 8  # the prompt asks for 3-5; the format reward, not the parser, scores that


def _json_number(v: Any) -> Any:
    """A JSON number only: no boolean, no string holding digits."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError("not a JSON number")
    return v


class RubricItemOut(_Strict):
    weight: Annotated[float, BeforeValidator(_json_number), Field(allow_inf_nan=False)]
    condition: Annotated[Text, sent_cap(SENTENCE)]


class StepRubricOut(_Strict):
    items: list[RubricItemOut] = Field(min_length=1, max_length=STEP_RUBRIC_MAX_ITEMS)
    action: Annotated[str, StringConstraints(strip_whitespace=True), sent_cap(PROSE)]


class StepVerdictOut(_Strict):
    satisfied: list[StrictBool]
    feedback: Annotated[str, StringConstraints(strip_whitespace=True), sent_cap(PROSE)]


class RankingOut(_Strict):
    ranking: list[Annotated[str, StringConstraints(strip_whitespace=True, to_upper=True), sent_cap(LABEL)]]


def parse_step_rubric(text: str) -> StepRubric:
    """Co-ReAct's step rubric: 1-8 items, each a JSON-number weight (clamped to [-1, 1]) and a non-empty
    condition, and the recommended action (may be empty)."""
    out = parse_json(text, StepRubricOut)
    items = tuple(RubricItem(min(1.0, max(-1.0, float(i.weight))), i.condition)
                  for i in out.items)  # type: ignore[attr-defined]
    return StepRubric(items, out.action)  # type: ignore[attr-defined]


def parse_step_verdict(text: str, n_items: int) -> StepVerdict:
    """Co-ReAct's verifier: exactly ``n_items`` JSON booleans (rubric order) and a feedback string."""
    out = parse_json(text, StepVerdictOut)
    if len(out.satisfied) != n_items:  # type: ignore[attr-defined]
        raise InvalidOutput(f"StepVerdictOut: {len(out.satisfied)} verdicts for a rubric of {n_items}")  # type: ignore[attr-defined]
    return StepVerdict(tuple(out.satisfied), out.feedback)  # type: ignore[attr-defined]


def parse_ranking(text: str, labels: Sequence[str]) -> list[str]:
    """Co-ReAct's list-wise ranking: the shown ``labels`` (case-insensitive), each exactly once, best first."""
    ranking = parse_json(text, RankingOut).ranking  # type: ignore[attr-defined]
    if len(ranking) != len(labels) or set(ranking) != set(labels):
        raise InvalidOutput(f"RankingOut: {ranking} is not a permutation of {list(labels)}")
    return list(ranking)


# the heading: "Final answer" then a colon or the line's end (markdown around it allowed), not the phrase in a sentence
_FINAL_ANSWER = re.compile(r"final\s+answer[ \t*_#`]*(?::|\n|$)", re.I)
_LABEL_TOKEN = re.compile(r"(?<![A-Za-z0-9_'])([A-Z])(?![A-Za-z0-9_'])")


def parse_final_ranking(text: str, labels: Sequence[str]) -> list[str]:
    """Co-ReAct's list-wise ranking read from a judge's final answer (App. A: a rationale, then the ranking): the
    text after the LAST "Final answer:" heading (any case, markdown around it is fine), and in it the last JSON list
    of labels (or ``{"ranking": [...]}``); a final answer without JSON is read as the labels in the order they are
    written ("Y > X > W > Z"). It must hold the shown ``labels`` (any case), each exactly once, best first. No final
    answer, or one that is no such permutation: ``InvalidOutput`` (that judge's ranking is invalid)."""
    heads = list(_FINAL_ANSWER.finditer(text))
    if not heads:
        raise InvalidOutput("no 'Final answer:' section in the reply")
    section = text[heads[-1].end():].lstrip(" \t*_#:>`\n")
    found: list[Any] | None = None
    decoder = json.JSONDecoder(strict=False)
    for start in sorted((i for i, ch in enumerate(section) if ch in "[{"), reverse=True):  # the last one first
        try:
            obj, _ = decoder.raw_decode(section, start)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("ranking"), list):
            obj = obj["ranking"]
        if isinstance(obj, list) and obj and all(isinstance(x, str) for x in obj):
            found = obj
            break
    if found is None:
        found = [m.group(1) for m in _LABEL_TOKEN.finditer(section) if m.group(1) in labels]
    ranking = [str(x).strip().upper() for x in found]
    if len(ranking) != len(labels) or set(ranking) != set(labels):
        raise InvalidOutput(f"final answer {ranking} is not a permutation of {list(labels)}")
    return ranking


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


# ---- a reply's schema narrowed to one request (issue 31: structured outputs that carry the counts) ---------------
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
    indices let a 135M judge grade rubric 2 twice and rubric 3 never (issue 31, measured)."""
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

