"""The agent's tag protocol and the strict format checker (paper §3.1, §4.1, App. C.1, E.1).

A response (everything the agent loop appended after the prompt) is a sequence of blocks::

    <think> reasoning </think>            optional, any number
    <search> query </search>              a tool call; generation stops at </search>
    <result> tool output </result>        appended by the agent loop (loss-masked), right after each search
    <answer> ... \\boxed{final} ... </answer>   exactly one, last; generation stops at </answer>

Free text between blocks is allowed. The strict checker (App. C.1: "a response is scored only if it produces a
non-empty prediction and terminates with the required final-answer format") refuses:

- a truncated response (token budget or turn budget spent);
- unpaired or unclosed tags, a closing tag without its opener, a tag opened inside another block (no nesting);
- a ``<result>`` not directly preceded by a ``<search>`` block, or a ``<search>`` not followed by its ``<result>``;
- an empty search query;
- zero or several ``<answer>`` blocks, or anything but whitespace after ``</answer>``;
- no ``\\boxed{...}`` in the answer, several of them, unbalanced braces, or an empty boxed answer.

``<think>`` at the start: Qwen3's chat template may put ``<think>`` in the *prompt* (the generation prompt ends with
``<think>\\n`` when thinking is forced), so the response then begins inside a think block. We accept a response
whose first protocol tag is ``</think>`` as closing that implicit block; we never *require* a think block.

``<result>`` bodies are opaque tool output: only ``</result>`` ends them. The agent loop must pass tool text through
``result_block`` (which removes protocol tags from it) so a web page cannot forge structure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"
ANSWER_CLOSE = "</answer>"
BOXED = "\\boxed{"


_TAG_RE = re.compile(r"<(/?)(think|search|result|answer)>")
# End-of-turn markers a decoder may leave after </answer>; tolerated (they are not content).
_TRAILING_EOS = ("<|im_end|>", "<|endoftext|>")


@dataclass(frozen=True)
class FormatResult:
    """Outcome of the strict checker. ``reason`` is "" when valid, else why it is not.

    ``answer`` is the boxed answer when one can be recovered (also for some invalid responses, so valid-only
    evaluation and diagnostics can see it); the base reward gates it by ``valid`` (eq. 4).
    """

    valid: bool
    reason: str
    answer: str | None


def find_boxed(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` in ``text``, with nested braces balanced.

    Raises ``ValueError`` when a ``\\boxed{`` is never closed.
    """
    out: list[str] = []
    i = text.find(BOXED)
    while i != -1:
        start = i + len(BOXED)
        depth, j = 1, start
        while j < len(text) and depth:
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
            j += 1
        if depth:
            raise ValueError("unbalanced braces in \\boxed{")
        out.append(text[start : j - 1])
        i = text.find(BOXED, j)
    return out


def _blocks(text: str) -> tuple[list[tuple[str, int, int, int, int]], str]:
    """Split ``text`` into protocol blocks: (tag, open_start, body_start, body_end, close_end).

    Returns the blocks and an error reason ("" when the tags pair up).
    """
    blocks: list[tuple[str, int, int, int, int]] = []
    pos = 0
    first = _TAG_RE.search(text)
    if first and first.group(1) == "/" and first.group(2) == "think":
        # implicit <think> opened by the chat template in the prompt
        blocks.append(("think", 0, 0, first.start(), first.end()))
        pos = first.end()
    while True:
        m = _TAG_RE.search(text, pos)
        if m is None:
            return blocks, ""
        closing, tag = m.group(1) == "/", m.group(2)
        if closing:
            return blocks, f"</{tag}> without an opening <{tag}>"
        if tag == "result":
            end = text.find(RESULT_CLOSE, m.end())
            if end == -1:
                return blocks, "unclosed <result>"
            blocks.append((tag, m.start(), m.end(), end, end + len(RESULT_CLOSE)))
            pos = end + len(RESULT_CLOSE)
            continue
        inner = _TAG_RE.search(text, m.end())
        if inner is None:
            return blocks, f"unclosed <{tag}>"
        if inner.group(1) != "/" or inner.group(2) != tag:
            shown = f"<{inner.group(1)}{inner.group(2)}>"
            if inner.group(1) == "/":
                return blocks, f"<{tag}> closed by {shown}"
            return blocks, f"{shown} nested inside <{tag}>"
        blocks.append((tag, m.start(), m.end(), inner.start(), inner.end()))
        pos = inner.end()


def check_format(text: str, truncated: bool = False) -> FormatResult:
    """The strict format gate used by the base reward (eq. 4), evaluation (App. C.1) and the judges (App. E)."""
    answer = extract_answer(text)
    if truncated:
        return FormatResult(False, "truncated: the response hit the token or turn budget", answer)
    blocks, err = _blocks(text)
    if err:
        return FormatResult(False, err, answer)
    for i, (tag, start, b0, b1, end) in enumerate(blocks):
        if tag == "search":
            if not text[b0:b1].strip():
                return FormatResult(False, "empty search query", answer)
            nxt = blocks[i + 1] if i + 1 < len(blocks) else None
            if nxt is None or nxt[0] != "result" or text[end : nxt[1]].strip():
                return FormatResult(False, "<search> not followed by its <result>", answer)
        if tag == "result":
            prev = blocks[i - 1] if i else None
            if prev is None or prev[0] != "search" or text[prev[4] : start].strip():
                return FormatResult(False, "<result> not directly after a <search>", answer)
    answers = [b for b in blocks if b[0] == "answer"]
    if not answers:
        return FormatResult(False, "no <answer> block", answer)
    if len(answers) > 1:
        return FormatResult(False, f"{len(answers)} <answer> blocks (exactly one allowed)", answer)
    a = answers[0]
    if a is not blocks[-1]:
        return FormatResult(False, "<answer> is not the last block", answer)
    tail = text[a[4] :]
    for eos in _TRAILING_EOS:
        tail = tail.replace(eos, "")
    if tail.strip():
        return FormatResult(False, "text after </answer>", answer)
    try:
        boxed = find_boxed(text[a[2] : a[3]])
    except ValueError as e:
        return FormatResult(False, f"{e} in <answer>", answer)
    if not boxed:
        return FormatResult(False, "no \\boxed{} in <answer>", answer)
    if len(boxed) > 1:
        return FormatResult(False, f"{len(boxed)} \\boxed{{}} in <answer> (exactly one allowed)", answer)
    if not boxed[0].strip():
        return FormatResult(False, "empty \\boxed{} answer", answer)
    return FormatResult(True, "", boxed[0].strip())


def _bodies(text: str, tag: str) -> list[str]:
    """Bodies of closed ``tag`` blocks in order; results are opaque (best effort on malformed text)."""
    out: list[str] = []
    pos = 0
    while True:
        m = _TAG_RE.search(text, pos)
        if m is None:
            return out
        if m.group(1) == "/":
            pos = m.end()
            continue
        t = m.group(2)
        close = f"</{t}>"
        end = text.find(close, m.end())
        if end == -1:
            return out
        if t == tag:
            out.append(text[m.end() : end])
        pos = end + len(close)


def extract_searches(text: str) -> list[str]:
    """The search queries issued, in order (stripped)."""
    return [b.strip() for b in _bodies(text, "search")]


def extract_results(text: str) -> list[str]:
    """The tool results appended after each search, in order (stripped)."""
    return [b.strip() for b in _bodies(text, "result")]


def extract_answer(text: str) -> str | None:
    """The boxed answer of the last ``<answer>`` block (the last ``\\boxed{}`` in it), or None."""
    answers = _bodies(text, "answer")
    if not answers:
        return None
    try:
        boxed = find_boxed(answers[-1])
    except ValueError:
        return None
    return boxed[-1].strip() if boxed else None


def sanitize_tool_text(text: str) -> str:
    """Remove protocol tags from tool output so results cannot forge or close blocks."""
    return _TAG_RE.sub("", text)


def result_block(body: str) -> str:
    """The text the agent loop appends after a ``</search>``: ``\\n<result>\\n{body}\\n</result>\\n``."""
    return f"\n{RESULT_OPEN}\n{sanitize_tool_text(body).strip()}\n{RESULT_CLOSE}\n"


def pending_search(turn_text: str) -> str | None:
    """The query of a turn that stopped at ``</search>`` (text after its last ``<search>``), else None.

    The agent loop calls this on each generated turn to decide whether to run the tool; the strict checker judges
    the structure of the whole response later.
    """
    body = turn_text.rstrip()
    if not body.endswith(SEARCH_CLOSE):
        return None
    body = body[: -len(SEARCH_CLOSE)]
    start = body.rfind(SEARCH_OPEN)
    if start == -1:
        return None
    return body[start + len(SEARCH_OPEN) :].strip()
