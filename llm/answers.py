"""Schema-valid is not the same as an answer.

A small judge under a grammar writes replies that validate against the role's schema and say nothing: the prompt's
own placeholders (a rubric titled ``<short label>``), its instructions copied back, a loop of one phrase, an empty
field. Such a reply is an *invalid answer*: the OpenAI-compatible backend treats it like a reply that does not
parse (retried with the reason, then the role's neutral fallback) and records it in the ledger as
``InvalidAnswer``. What counts as the template is read from the prompt file the call was rendered from
(``tasks/methods/<m>/prompts/<version>.md``, ``llm.prompts.register_prompts``), never typed per role. A prompt holds
three kinds of text:
- its *placeholders*: the strings of its reply example written ``"<...>"`` or ``"..."`` (what a field stands for);
- its *worked examples*: strings it quotes in its prose (``"distinguishes ... (e.g., variant forms)" is general``),
  model answers the prompt holds up, which a reply may reuse;
- its *instructions*: every other word (the reply format's lines included), which a reply must not copy back,
  verbatim or with a few words changed.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from functools import cache
from typing import Any, Literal, NamedTuple

from arbor.llm import prompts
from arbor.llm.parse import InvalidAnswer, InvalidOutput, extract_json

ECHO_NGRAM = 5  # a run of this many words found in the instructions is copied from them
ECHO_MIN_WORDS = 6  # shorter fields are judged by the placeholder rule only (a title may share words with them)
ECHO_SHARE = 0.8  # a field whose words lie this much in copied runs is the instructions, not an answer
LOOP_MIN_WORDS = 12  # a field of at least this many words ...
LOOP_DISTINCT = 0.5  # ... of which fewer than this share of its word trigrams are distinct is a loop
LOOP_MIN_CHARS = 64  # a field of at least this many characters ...
LOOP_COMPRESSED = 0.25  # ... that zlib shrinks below this share of its length is a loop (character repeats)
SAME_MIN_WORDS = 3  # two fields of one object with the same text of this many words say one thing twice
NEAR_COPY = 0.8  # a field this similar (word-sequence ratio) to one instruction sentence is that sentence edited
# (one word in five changed); the closest legitimate answer measured is 0.667, the rules judge's "Precise
# Entity-Anchored Queries" written after the prompt's picture of precise searching (bench/answer_filter.py)

_EXAMPLE_PLACEHOLDER = re.compile(r'"(<[^"<>]+>|\.\.\.|…)"')  # a string of a reply example that stands for text
_QUOTED = re.compile(r'"([^"\n]+)"')  # a string the prompt's prose quotes: a worked example (not on a reply-format line)
_SENTENCE_END = re.compile(r"[.;:!?]\s|\n")  # where an instruction sentence ends
CUT = "\x00"  # where split_prompt cut a worked example or a slot out of the instructions
_TEMPLATE_SLOT = re.compile(r"\{\{\w+\}\}")  # where the data goes: not the prompt's words
_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class Template:
    """What a reply must not echo: the prompt's placeholders (as written, and their words), the word runs
    (``ECHO_NGRAM`` long) and the sentences of its instructions, and what it may: its worked examples."""

    placeholders: tuple[str, ...]
    placeholder_words: frozenset[tuple[str, ...]]
    ngrams: frozenset[tuple[str, ...]]
    sentences: tuple[tuple[str, ...], ...] = ()
    examples: tuple[str, ...] = ()


def _words(text: str) -> tuple[str, ...]:
    return tuple(_WORD.findall(text.lower()))


def _reply_format_line(line: str) -> bool:
    """A line that shows the reply's JSON (``{"rubrics": [...]}``): its strings are keys and placeholders."""
    return '{"' in line or line.lstrip().startswith(("{", "["))


def split_prompt(text: str) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """A prompt's (placeholders, worked examples, instructions): the reply example's ``"<...>"``/``"..."`` strings;
    the other strings its prose lines quote; and its text with the examples and ``{{slots}}`` cut out (each cut
    marked ``CUT``: no word run spans one)."""
    text = _TEMPLATE_SLOT.sub(CUT, text)
    shown = tuple(dict.fromkeys(_EXAMPLE_PLACEHOLDER.findall(text)))
    examples: list[str] = []
    lines = []
    for line in text.splitlines():
        if not _reply_format_line(line):
            examples += [q for q in _QUOTED.findall(line) if q not in shown]
            line = _QUOTED.sub(CUT, line)
        lines.append(line)
    return shown, tuple(dict.fromkeys(examples)), "\n".join(lines)


def template_from_text(text: str) -> Template:
    """A prompt's ``Template`` from its text (both sections, the ``{{slots}}`` left out)."""
    shown, examples, instructions = split_prompt(text)
    ngrams: set[tuple[str, ...]] = set()
    sentences = []
    for piece in instructions.split(CUT):
        words = _words(piece)
        ngrams.update(words[i:i + ECHO_NGRAM] for i in range(len(words) - ECHO_NGRAM + 1))
        sentences += [w for part in _SENTENCE_END.split(piece) if len(w := _words(part)) >= ECHO_MIN_WORDS]
    return Template(shown, frozenset(w for p in shown if (w := _words(p))), frozenset(ngrams),
                    tuple(dict.fromkeys(sentences)), examples)


@cache
def template_of(version: str) -> Template:
    """The ``Template`` of one prompt version (its registered file), read once per process."""
    system, user = prompts.load_prompt(version)
    return template_from_text(f"{system}\n{user}")


def _resolve(node: Any, defs: Mapping[str, Any]) -> dict[str, Any]:
    """A schema node with its ``$ref`` (or the one non-null branch of an ``anyOf``) followed."""
    while isinstance(node, dict):
        if "$ref" in node:
            node = defs.get(node["$ref"].rsplit("/", 1)[-1], {})
        elif "anyOf" in node:
            node = next((n for n in node["anyOf"] if n.get("type") != "null"), {})
        else:
            return node
    return {}


def text_fields(reply: Any, schema: Mapping[str, Any] | None) -> Iterator[tuple[str, str, bool, str]]:
    """Every string of ``reply`` the schema declares, as (path, text, must hold text, parent path): a string is
    required to hold text when its schema sets ``minLength`` >= 1 or it is an item of a list (a list entry that says
    nothing is no entry). Keys the schema does not declare are not read (the parser ignores them too)."""
    defs = (schema or {}).get("$defs", {})

    def walk(value: Any, node: Any, path: str, in_list: bool) -> Iterator[tuple[str, str, bool, str]]:
        node = _resolve(node, defs)
        if isinstance(value, dict):
            props = node.get("properties")
            for k, v in value.items():
                if props is None or k in props:
                    yield from walk(v, (props or {}).get(k, {}), f"{path}.{k}" if path else k, False)
        elif isinstance(value, list):
            items = node.get("items") if isinstance(node.get("items"), dict) else {}
            for i, v in enumerate(value):
                yield from walk(v, items, f"{path}[{i}]", True)
        elif isinstance(value, str):
            parent = path.rsplit(".", 1)[0] if "." in path else ""
            yield path, value, in_list or int(node.get("minLength", 0)) >= 1, parent

    yield from walk(reply, schema or {}, "", False)


def _copied_share(words: tuple[str, ...], ngrams: frozenset[tuple[str, ...]]) -> float:
    """The share of ``words`` inside a run of ``ECHO_NGRAM`` words that the instructions contain."""
    covered = [False] * len(words)
    for i in range(len(words) - ECHO_NGRAM + 1):
        if words[i:i + ECHO_NGRAM] in ngrams:
            covered[i:i + ECHO_NGRAM] = [True] * ECHO_NGRAM
    return sum(covered) / len(words) if words else 0.0


def _looped(text: str, words: tuple[str, ...]) -> bool:
    """A repetition loop: few distinct word trigrams in a long field, or characters that compress to almost
    nothing (a phrase or a symbol repeated)."""
    if len(words) >= LOOP_MIN_WORDS:
        trigrams = [words[i:i + 3] for i in range(len(words) - 2)]
        if len(set(trigrams)) < LOOP_DISTINCT * len(trigrams):
            return True
    raw = text.encode()
    return len(raw) >= LOOP_MIN_CHARS and len(zlib.compress(raw, 9)) < LOOP_COMPRESSED * len(raw)


def _near_placeholder(words: tuple[str, ...], placeholder: tuple[str, ...]) -> bool:
    """``words`` are a placeholder of at least two words with one word changed, added or dropped, its last word
    kept; numbers index a slot and are left out (``criterion 3`` is ``<criterion 1>``). A placeholder names what a field stands
    for by its last word (``label``, ``item``, ``does``); a field that keeps it and changes one modifier still names
    the slot (``concise label``, ``what a high-scoring response does``), one that changes it says something of its
    own (``short queries``)."""
    a, b = (tuple(w for w in x if not w.isdigit()) for x in (words, placeholder))
    if a == b and a:
        return True
    if len(b) < 2 or not a or a[-1] != b[-1] or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) <= 1
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def near_copy(words: tuple[str, ...], sentences: Sequence[tuple[str, ...]]) -> float:
    """How close ``words`` come to one instruction sentence: the highest word-sequence similarity
    (``difflib.SequenceMatcher.ratio``, 2·matched / total words) to any of them, 0.0 when there is none."""
    return max((SequenceMatcher(None, words, s, autojunk=False).ratio() for s in sentences), default=0.0)


Reason = Literal["placeholder", "empty", "placeholder_words", "near_placeholder", "angle_brackets",
                 "instruction_copy", "instruction_near_copy", "loop", "same_text"]


class Problem(NamedTuple):
    """Why a reply is no answer: a short ``reason`` (for the ledger) and the ``message`` sent back to the judge with
    its retry."""

    reason: Reason
    message: str


def find_problem(reply: Any, template: Template, schema: Mapping[str, Any] | None = None) -> Problem | None:
    """Why a reply that validates against its role's schema is still not an answer, or None when it is one. ``reply`` is the decoded JSON of the reply, ``template`` the prompt it
    answers (``template_of``), ``schema`` the role's reply schema (which strings are read and which must hold text).

    A reply is not an answer when one of its text fields
    - holds no words where the schema asks for text, or as an entry of a list;
    - is one of the prompt's placeholders, as written (``<short label>``, ``...``) or in its words alone
      (``short label``), whichever field's placeholder it is, or holds one;
    - is a placeholder with one word changed, added or dropped, its last word kept (``_near_placeholder``);
    - is a whole field in angle brackets (a placeholder of the judge's own making, or a bare tag: ``<answer>``);
    - copies the instructions: at least ``ECHO_MIN_WORDS`` words, ``ECHO_SHARE`` of them in runs of ``ECHO_NGRAM``
      words that the prompt contains (a rubric that shares a few words with the instructions is an answer), or a
      word sequence within ``NEAR_COPY`` of one instruction sentence (``near_copy``: the sentence with a few words
      edited); the prompt's worked examples are not instructions, and a reply may reuse them;
    - loops (``_looped``);
    or when two fields of one object, or two entries of one list, hold the same text of ``SAME_MIN_WORDS`` words
    or more. Pure: no I/O, the same answer for the same inputs."""
    seen: dict[tuple[str, tuple[str, ...]], str] = {}
    for path, text, required, parent in text_fields(reply, schema):
        stripped = text.strip()
        words = _words(stripped)
        for shown in template.placeholders:  # "..." only as the whole field: "e.g., ..." is an answer
            if stripped.lower() == shown.lower() or (shown.startswith("<") and shown.lower() in stripped.lower()):
                return Problem("placeholder", f"{path} is the prompt's placeholder {shown!r}: write your own words "
                                              "about these inputs where the format shows <...>")
        if not words:
            if required:
                return Problem("empty", f"{path} is empty: write the text it asks for")
            continue
        if words in template.placeholder_words:
            return Problem("placeholder_words",
                           f"{path} repeats the words of a placeholder of the prompt: write your own words")
        if any(_near_placeholder(words, p) for p in template.placeholder_words):
            return Problem("near_placeholder", f"{path} rewords a placeholder of the prompt: write what it stands "
                                               "for, in your own words about these inputs")
        if re.fullmatch(r"<[^<>]*[^\W\d_][^<>]*>", stripped):
            return Problem("angle_brackets",
                           f"{path} is a placeholder in angle brackets, not an answer: write your own words")
        if len(words) >= ECHO_MIN_WORDS and (_copied_share(words, template.ngrams) >= ECHO_SHARE
                                             or near_copy(words, template.sentences) >= NEAR_COPY):
            copied = _copied_share(words, template.ngrams) >= ECHO_SHARE
            return Problem("instruction_copy" if copied else "instruction_near_copy",
                           f"{path} copies the instructions{'' if copied else ' with a few words changed'} instead "
                           "of answering: describe what you observe in the inputs, in your own words")
        if _looped(stripped, words):
            return Problem("loop", f"{path} repeats itself in a loop: write one short, plain statement")
        if len(words) >= SAME_MIN_WORDS:
            group = re.sub(r"\[\d+\]$", "", path) if path.endswith("]") else parent
            other = seen.get((group, words))
            if other is not None:
                return Problem("same_text", f"{path} says the same as {other}: each field and each entry must say "
                                            "something of its own")
            seen[(group, words)] = path
    return None


def answer_problem(reply: Any, template: Template, schema: Mapping[str, Any] | None = None) -> str | None:
    """``find_problem``'s message, or None when the reply is an answer."""
    problem = find_problem(reply, template, schema)
    return None if problem is None else problem.message


def _has_file(version: str) -> bool:
    return version in prompts.PROMPT_FILES


def check_reply(text: str, version: str, schema: Mapping[str, Any] | None,
                messages: Sequence[Mapping[str, str]] = ()) -> None:
    """``InvalidAnswer`` with the reason when ``text``, a reply to prompt ``version`` that its role's parser has
    accepted, is not an answer (``find_problem``; the short reason on ``InvalidAnswer.reason``). The template is the prompt file ``version``; a role that
    renders its own prompt (one without a registered prompt file) is held to the system
    messages it sent. A reply without a JSON object (a free-text verdict) has no fields to read and passes."""
    try:
        reply = extract_json(text)
    except InvalidOutput:
        return
    template = template_of(version) if _has_file(version) else template_from_text(
        "\n".join(m["content"] for m in messages if m.get("role") == "system"))
    problem = find_problem(reply, template, schema)
    if problem is not None:
        raise InvalidAnswer(problem.message, reason=problem.reason)
