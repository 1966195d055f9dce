"""Schema-valid is not the same as an answer (issue 50 item 9).

A small judge under a grammar writes replies that validate against the role's schema and say nothing: the prompt's
own placeholders (a rubric titled ``<short label>``), its instructions copied back, a loop of one phrase, an empty
field. Such a reply is an *invalid answer*: the OpenAI-compatible backend treats it like a reply that does not
parse (retried with the reason, then the role's neutral fallback) and records it in the ledger as
``InvalidAnswer``. What counts as the template is read from the prompt file the call was rendered from
(``tasks/methods/<m>/prompts/<version>.md``, ``llm.prompts.register_prompts``), never typed per role: its placeholders are the strings of its reply example that
are written ``"<...>"`` or ``"..."``, its instructions are the rest of its words.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

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

_EXAMPLE_PLACEHOLDER = re.compile(r'"(<[^"<>]+>|\.\.\.|…)"')  # a string of a reply example that stands for text
_TEMPLATE_SLOT = re.compile(r"\{\{\w+\}\}")  # where the data goes: not the prompt's words
_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class Template:
    """What a reply must not echo: the prompt's placeholders (as written, and their words) and the word runs
    (``ECHO_NGRAM`` long) of its instructions."""

    placeholders: tuple[str, ...]
    placeholder_words: frozenset[tuple[str, ...]]
    ngrams: frozenset[tuple[str, ...]]


def _words(text: str) -> tuple[str, ...]:
    return tuple(_WORD.findall(text.lower()))


def template_from_text(text: str) -> Template:
    """A prompt's ``Template`` from its text (both sections, the ``{{slots}}`` left out)."""
    text = _TEMPLATE_SLOT.sub(" ", text)
    shown = tuple(dict.fromkeys(_EXAMPLE_PLACEHOLDER.findall(text)))
    words = _words(text)
    return Template(shown, frozenset(w for p in shown if (w := _words(p))),
                    frozenset(words[i:i + ECHO_NGRAM] for i in range(len(words) - ECHO_NGRAM + 1)))


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


def answer_problem(reply: Any, template: Template, schema: Mapping[str, Any] | None = None) -> str | None:
    """Why a reply that validates against its role's schema is still not an answer, or None when it is one
    (issue 50 item 9). ``reply`` is the decoded JSON of the reply, ``template`` the prompt it answers
    (``template_of``), ``schema`` the role's reply schema (which strings are read and which must hold text).

    A reply is not an answer when one of its text fields
    - holds no words where the schema asks for text, or as an entry of a list;
    - is one of the prompt's placeholders, as written (``<short label>``, ``...``) or in its words alone
      (``short label``), whichever field's placeholder it is, or holds one;
    - is a whole field in angle brackets (a placeholder of the judge's own making, or a bare tag: ``<answer>``);
    - copies the instructions: at least ``ECHO_MIN_WORDS`` words, ``ECHO_SHARE`` of them in runs of ``ECHO_NGRAM``
      words that the prompt contains (a rubric that shares a few words with the instructions is an answer);
    - loops (``_looped``);
    or when two fields of one object, or two entries of one list, hold the same text of ``SAME_MIN_WORDS`` words
    or more. Pure: no I/O, the same answer for the same inputs."""
    seen: dict[tuple[str, tuple[str, ...]], str] = {}
    for path, text, required, parent in text_fields(reply, schema):
        stripped = text.strip()
        words = _words(stripped)
        for shown in template.placeholders:  # "..." only as the whole field: "e.g., ..." is an answer
            if stripped.lower() == shown.lower() or (shown.startswith("<") and shown.lower() in stripped.lower()):
                return (f"{path} is the prompt's placeholder {shown!r}: write your own words about these inputs "
                        "where the format shows <...>")
        if not words:
            if required:
                return f"{path} is empty: write the text it asks for"
            continue
        if words in template.placeholder_words:
            return f"{path} repeats the words of a placeholder of the prompt: write your own words"
        if re.fullmatch(r"<[^<>]*[^\W\d_][^<>]*>", stripped):
            return f"{path} is a placeholder in angle brackets, not an answer: write your own words"
        if len(words) >= ECHO_MIN_WORDS and _copied_share(words, template.ngrams) >= ECHO_SHARE:
            return (f"{path} copies the instructions instead of answering: describe what you observe in the "
                    "inputs, in your own words")
        if _looped(stripped, words):
            return f"{path} repeats itself in a loop: write one short, plain statement"
        if len(words) >= SAME_MIN_WORDS:
            group = re.sub(r"\[\d+\]$", "", path) if path.endswith("]") else parent
            other = seen.get((group, words))
            if other is not None:
                return f"{path} says the same as {other}: each field and each entry must say something of its own"
            seen[(group, words)] = path
    return None


def _has_file(version: str) -> bool:
    return version in prompts.PROMPT_FILES


def check_reply(text: str, version: str, schema: Mapping[str, Any] | None,
                messages: Sequence[Mapping[str, str]] = ()) -> None:
    """``InvalidAnswer`` with the reason when ``text``, a reply to prompt ``version`` that its role's parser has
    accepted, is not an answer (``answer_problem``). The template is the prompt file ``version``; a role that
    renders its own prompt (one without a registered prompt file) is held to the system
    messages it sent. A reply without a JSON object (a free-text verdict) has no fields to read and passes."""
    try:
        reply = extract_json(text)
    except InvalidOutput:
        return
    template = template_of(version) if _has_file(version) else template_from_text(
        "\n".join(m["content"] for m in messages if m.get("role") == "system"))
    problem = answer_problem(reply, template, schema)
    if problem is not None:
        raise InvalidAnswer(problem)
