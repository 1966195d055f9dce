"""The paper's SFT sources to arbor's SFT rows (ARBOR §4.1, App. B.2: the search-only subset of Tool-Star and STILL).

What the paper trains on: the examples of Tool-Star's released cold-start set that call only the search tool
(Python-tool examples removed), ~16K rows. The release (``dongguanting/Tool-Star-SFT-54K`` on the Hub, file
``final_sft_edition9_v2.json``, 53,971 rows) is one JSON array in LLaMA-Factory's *alpaca* layout:

    ==============  =========================================================  ==========================
    source field    what it holds                                               arbor's SFT row
    ==============  =========================================================  ==========================
    ``input``       the question                                                ``question``
    ``instruction`` Tool-Star's system / tool instructions                      dropped (the run's prompt)
    ``output``      the trajectory: reasoning, ``<search>q</search>``,           ``response`` (tags mapped)
                    ``<python>..</python>``, ``<result>..</result>``, and a
                    final ``<answer>..</answer>``
    ``answer`` /    the reference answer, where a release carries one           ``golds``
    ``golden_answers``
    ==============  =========================================================  ==========================

Conversations in the *sharegpt* / chat layout (``conversations: [{from, value}]`` or ``messages: [{role,
content}]``, the form STILL-style releases and LLaMA-Factory's tool data use) are read too: the first user turn is
the question, assistant turns are the trajectory, and a tool / observation / function turn is the output of the
search before it. STILL's long-thought release carries no search call, so the search-only filter keeps none of
its rows; rows of either layout that do search are kept (docs/sft.md, docs/decisions/the-cluster-path-a-user-walks.md).

The mapping (``convert_response``), pure: a row with a Python / code call is dropped; reasoning outside any tag
becomes ``<think>``; each search's output is re-wrapped as the protocol's loop wraps tool output (so it stays
loss-masked); the final answer is written as the protocol writes it (arbor: ``\\boxed{}`` inside ``<answer>``,
Search-R1: plain); the response must then pass the protocol's own format check. ``rollout.protocol=rubricem``
rows are staged from the flat form (``tasks.env.staging``). Every dropped row is counted with its reason.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arbor.format import ARBOR, TagProtocol, check_format, find_boxed, get_protocol
from arbor.jsonl import jsonl_rows
from arbor.tasks.env.staging import StagingError, stage_response


class ConvertSkip(ValueError):
    """A source row that has no faithful arbor form (the message is the reason, counted in the report)."""


class ConvertError(ValueError):
    """A source file that cannot be read at all (names the file, and the line or record)."""


CODE_TAGS = ("python", "code", "execute", "code_interpreter")
_TAG = re.compile(r"<(/?)(think|search|result|answer|information|tool_output|observation)>")
USER_ROLES = {"human", "user"}
ASSISTANT_ROLES = {"gpt", "assistant", "function_call"}
TOOL_ROLES = {"observation", "tool", "function", "ipython"}


@dataclass
class ConvertReport:
    """What ``convert_file`` did: the rows written and, per reason, the rows dropped (with the first few places)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def drop(self, where: str, reason: str) -> None:
        self.dropped[reason] += 1
        self.examples.setdefault(reason, [])
        if len(self.examples[reason]) < 3:
            self.examples[reason].append(where)

    def message(self) -> str:
        lines = [f"{len(self.rows)} rows kept, {sum(self.dropped.values())} dropped"]
        for reason, n in self.dropped.most_common():
            lines.append(f"  {n:>7} {reason}  (e.g. {', '.join(self.examples[reason])})")
        return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- reading
def read_records(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(place, record) of a JSON array (``.json``), JSON lines (``.jsonl``) or Parquet file; place is
    ``file:line`` or ``file#index``."""
    path = Path(path)
    if not path.is_file():
        raise ConvertError(f"{path}: no such file")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, rec in enumerate(pq.read_table(path).to_pylist()):
            yield f"{path}#{i}", rec
        return
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ConvertError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from e
        if not isinstance(data, list):
            raise ConvertError(f"{path}: expected a JSON array of records (Tool-Star's layout), got "
                               f"{type(data).__name__}")
        for i, rec in enumerate(data):
            if not isinstance(rec, dict):
                raise ConvertError(f"{path}#{i}: expected an object")
            yield f"{path}#{i}", rec
        return
    for lineno, rec in jsonl_rows(path, ConvertError):
        if not isinstance(rec, dict):
            raise ConvertError(f"{path}:{lineno}: expected an object")
        yield f"{path}:{lineno}", rec


def record_parts(rec: dict[str, Any]) -> tuple[str, str, list[str]]:
    """(question, trajectory text with tool outputs in ``<result>``, reference answers) of one source record."""
    golds = _golds(rec)
    turns = rec.get("conversations") or rec.get("messages")
    if isinstance(turns, list):  # sharegpt / chat layout
        question, parts = "", []
        for t in turns:
            role = str(t.get("from") or t.get("role") or "").lower()
            text = str(t.get("value") if "value" in t else t.get("content") or "")
            if role in USER_ROLES and not question:
                question = text
            elif role in ASSISTANT_ROLES and question:
                parts.append(text)
            elif role in TOOL_ROLES and question:
                parts.append(f"\n<result>\n{text.strip()}\n</result>\n")
        if not question.strip():
            raise ConvertSkip("no user turn (question)")
        return question.strip(), "".join(parts), golds
    if "output" in rec:  # alpaca layout (Tool-Star-SFT-54K)
        question = str(rec.get("input") or "").strip() or str(rec.get("instruction") or "").strip()
        if not question:
            raise ConvertSkip("empty input (question)")
        return question, str(rec.get("output") or ""), golds
    raise ConvertSkip("neither an alpaca record (input, output) nor a conversation (conversations / messages)")


def _golds(rec: dict[str, Any]) -> list[str]:
    for key in ("golden_answers", "answers", "answer", "gold", "reference"):
        value = rec.get(key)
        if isinstance(value, str) and value.strip():
            return [value.strip()]
        if isinstance(value, list) and value:
            return [str(v).strip() for v in value if str(v).strip()]
    return []


# ----------------------------------------------------------------------------------------------- mapping
def convert_response(text: str, protocol: TagProtocol = ARBOR) -> str:
    """A source trajectory in arbor's tags for ``protocol`` (flat ``arbor`` / ``search-r1``, or staged
    ``rubricem``); raises ``ConvertSkip`` with the reason when it has no faithful form."""
    if any(f"<{t}>" in text or f"```{t}" in text for t in CODE_TAGS):
        raise ConvertSkip("calls a Python / code tool")
    flat = _flat(text, ARBOR if protocol.staged else protocol)
    if protocol.staged:
        try:
            return stage_response(flat, ARBOR, protocol)
        except StagingError as e:
            raise ConvertSkip(f"no staged form: {e}") from e
    return flat


def _flat(text: str, protocol: TagProtocol) -> str:
    """Walk the source's tags in order: free text -> ``<think>``, searches kept, outputs re-wrapped, the answer
    rewritten in the protocol's form; then the protocol's own check."""
    out: list[str] = []
    thought: list[str] = []
    pos, searches, answer = 0, 0, None
    open_tag: tuple[str, int] | None = None

    def flush() -> None:
        body = "\n".join(t.strip() for t in thought if t.strip())  # the source's own line breaks kept
        if body:
            out.append(f"<think>{body}</think>")
        thought.clear()

    for m in _TAG.finditer(text):
        closing, tag = m.group(1) == "/", m.group(2)
        if open_tag is None:
            if closing:
                raise ConvertSkip(f"</{tag}> without its opening tag")
            if answer is not None:
                raise ConvertSkip("a block after the answer")
            thought.append(text[pos : m.start()])
            open_tag, pos = (tag, m.end()), m.end()
            continue
        if not closing or tag != open_tag[0]:
            raise ConvertSkip(f"<{tag}> inside <{open_tag[0]}>")
        body, pos = text[open_tag[1] : m.start()], m.end()
        open_tag = None
        if tag == "think":
            thought.append(body)
        elif tag == "search":
            if not body.strip():
                raise ConvertSkip("empty search query")
            flush()
            out.append(f"<search>{' '.join(body.split())}</search>")
            searches += 1
        elif tag in ("result", "information", "tool_output", "observation"):
            if not out or not out[-1].startswith("<search>") or "".join(thought).strip():
                raise ConvertSkip("a tool output not directly after its search")
            out.append(protocol.result_prefix + body.strip() + protocol.result_suffix)
        else:  # answer
            answer = _answer_text(body)
    if open_tag is not None:
        raise ConvertSkip(f"<{open_tag[0]}> never closed")
    if text[pos:].strip():
        if answer is not None:
            raise ConvertSkip("text after the answer")
        thought.append(text[pos:])
    if searches == 0:
        raise ConvertSkip("no search call")
    if answer is None:
        raise ConvertSkip("no final answer")
    flush()
    out.append(protocol.answer_block(answer))
    response = _join(out)
    fmt = check_format(response, truncated=False, protocol=protocol)
    if not fmt.valid:
        raise ConvertSkip(f"fails the {protocol.name} format check: {fmt.reason}")
    return response


def _answer_text(body: str) -> str:
    """The answer inside ``<answer>``: its one ``\\boxed{}`` when it has one, else the block's text."""
    try:
        boxed = find_boxed(body)
    except ValueError as e:
        raise ConvertSkip(f"answer: {e}") from e
    if len(boxed) > 1:
        raise ConvertSkip(f"{len(boxed)} \\boxed{{}} in the answer")
    answer = (boxed[0] if boxed else body).strip()
    if not answer:
        raise ConvertSkip("empty answer")
    return " ".join(answer.split())


def _join(blocks: list[str]) -> str:
    """Blocks one per line; a tool output carries its own newlines (it is appended as the loop appends it)."""
    text = ""
    for b in blocks:
        if text and not text.endswith("\n") and not b.startswith("\n"):
            text += "\n"
        text += b
    return text


# ----------------------------------------------------------------------------------------------- files
def convert_file(paths: list[str | Path], protocol: str = "arbor", limit: int | None = None) -> ConvertReport:
    """Every record of ``paths`` converted for ``protocol`` (see the module docstring); rows keep their source
    place as ``question_id``. A question seen before (same text) is dropped as a duplicate."""
    tags = get_protocol(protocol)
    report, seen = ConvertReport(), set()
    for path in paths:
        for where, rec in read_records(path):
            if limit is not None and len(report.rows) >= limit:
                return report
            try:
                question, text, golds = record_parts(rec)
                key = " ".join(question.lower().split())
                if key in seen:
                    raise ConvertSkip("duplicate question")
                response = convert_response(text, tags)
            except ConvertSkip as e:
                report.drop(where, str(e))
                continue
            seen.add(key)
            row: dict[str, Any] = {"question_id": where.rsplit("/", 1)[-1], "question": question, "response": response}
            if golds:
                row["golds"] = golds
            report.rows.append(row)
    return report
