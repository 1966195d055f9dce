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

Protocols: the grammar above is arbor's (the paper's). ``SEARCH_R1`` is Search-R1's
(Jin et al., 2025): tool output between ``<information>`` and ``</information>`` (wrapped in blank lines, as its
agent loop appends it) and the answer as the plain text of ``<answer> ... </answer>``, no ``\\boxed{}``. The same
checker serves both: every function here takes ``protocol`` (default ``ARBOR``).

``RUBRICEM`` is RubricEM's stage scaffold (its §3.2, App. B.1) in arbor's grammar: ``<structured_plan>``
(Plan), searches with ``<tool_output>`` results and ``<state_evaluation>`` after each (Research), ``<review>``
(Review), then the boxed ``<answer>`` (Answer); ``stage_order_error`` adds the scaffold's order rules and
``stage_spans`` cuts a response into the four stages SS-GRPO credits. The paper's ``<call_tool name=...>`` is
our ``<search>`` (one tool), and the sub-blocks it asks for inside the plan and review are free text here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
ANSWER_CLOSE = "</answer>"
BOXED = "\\boxed{"

# End-of-turn markers a decoder may leave after </answer>; tolerated (they are not content).
_TRAILING_EOS = ("<|im_end|>", "<|endoftext|>")


@dataclass(frozen=True)
class TagProtocol:
    """An agent tag protocol: the tool-output tag, how the loop wraps tool text, how the answer is written, the
    built-in system prompt and the message that replaces a search over budget. ``<think>``, ``<search>`` and
    ``<answer>`` are common to the shipped protocols, so the loop's stop strings are too."""

    name: str
    result_tag: str  # the block the agent loop appends tool output in
    result_prefix: str  # text before the tool output (opening tag included) ...
    result_suffix: str  # ... and after it (closing tag included)
    boxed: bool  # the answer is the one \boxed{} inside <answer> (arbor) or the block's plain text (Search-R1)
    system_prompt: str
    force_answer_message: str  # appended instead of results when the search budget is spent
    passage_line: str  # one retrieved passage in the tool output: {i} {title} {text}
    stage_tags: tuple[str, ...] = ()  # extra block tags of a staged scaffold (RubricEM: plan, evaluation, review)

    @cached_property  # compiled once per protocol: the checker and extractors search with it per trajectory
    def tag_re(self) -> re.Pattern[str]:
        extra = "".join(f"|{t}" for t in self.stage_tags)
        return re.compile(rf"<(/?)(think|search|{self.result_tag}|answer{extra})>")

    @property
    def staged(self) -> bool:
        """Whether responses follow the Plan / Research / Review / Answer scaffold (``stage_order_error``)."""
        return bool(self.stage_tags)

    @property
    def result_close(self) -> str:
        return f"</{self.result_tag}>"

    @cached_property
    def observation_re(self) -> re.Pattern[str]:
        """An observation block exactly as the loop appends it (results, the forced message), captured."""
        lead = "\n" * (len(self.result_prefix) - len(self.result_prefix.lstrip("\n")))
        trail = "\n" * (len(self.result_suffix) - len(self.result_suffix.rstrip("\n")))
        return re.compile("(" + re.escape(lead + f"<{self.result_tag}>") + ".*?"
                          + re.escape(f"</{self.result_tag}>" + trail) + ")", re.DOTALL)

    def answer_block(self, answer: str) -> str:
        """The final answer as this protocol writes it (SFT rows)."""
        return f"<answer>\\boxed{{{answer}}}</answer>" if self.boxed else f"<answer> {answer.strip()} </answer>"

    def step_block(self, i: int, thought: str, query: str) -> str:
        """Gold search step ``i`` of an SFT row: ``<think>T</think>`` then the search; in a staged protocol the
        first thought is the Plan (``<structured_plan>``) and later ones are state evaluations of the last output."""
        if not self.staged:
            return f"<think>{thought}</think>\n<search>{query}</search>"
        tag = "structured_plan" if i == 0 else "state_evaluation"
        return f"<{tag}>{thought}</{tag}>\n<search>{query}</search>"

    def final_block(self, thought: str, answer: str) -> str:
        """The closing thought and the answer of an SFT row (staged: the thought is the Review)."""
        tag = "review" if self.staged else "think"
        return f"<{tag}>{thought}</{tag}>\n{self.answer_block(answer)}"


ARBOR = TagProtocol(
    name="arbor", result_tag="result", result_prefix="\n<result>\n", result_suffix="\n</result>\n", boxed=True,
    system_prompt=(
        "You are a research assistant that answers questions using a Wikipedia search tool.\n"
        "Work in steps. Reason privately between <think> and </think>. "
        "To look something up, write a short query between <search> and </search> and stop; the tool's top "
        "passages will then be shown to you between <result> and </result>. You may search several times, one "
        "query per search, refining the query when the passages do not contain what you need.\n"
        "When the evidence is enough, write your final answer once, between <answer> and </answer>, with the "
        "answer itself inside \\boxed{}, for example <answer>\\boxed{Paris}</answer>. The boxed answer should be "
        "short: a name, a date, a number or a brief phrase."),
    force_answer_message=("\n<result>Search budget exhausted. Answer now using the evidence above, "
                          "as <answer>\\boxed{...}</answer>.</result>\n"),
    passage_line="Doc {i} (Title: {title}) {text}",
)
SEARCH_R1 = TagProtocol(
    name="search-r1", result_tag="information", result_prefix="\n\n<information>",
    result_suffix="</information>\n\n", boxed=False,
    system_prompt=(
        "Answer the question. Each time you receive new information, reason about it first between <think> and "
        "</think>. If you are missing knowledge, call the search engine by writing a query between <search> and "
        "</search>; its top results will be returned between <information> and </information>. You may search "
        "as many times as you need. When no further knowledge is needed, give the answer between <answer> and "
        "</answer> without explanation, for example <answer> Paris </answer>."),
    force_answer_message=("\n\n<information>Search budget exhausted. Answer now from the information above, "
                          "between <answer> and </answer>.</information>\n\n"),
    passage_line="Doc {i}(Title: {title}) {text}",
)
RUBRICEM = TagProtocol(
    name="rubricem", result_tag="tool_output", result_prefix="\n<tool_output>\n", result_suffix="\n</tool_output>\n",
    boxed=True, stage_tags=("structured_plan", "state_evaluation", "review"),
    system_prompt=(
        "You are a research assistant that answers questions with a Wikipedia search tool, in four stages.\n"
        "Plan: first write <structured_plan> ... </structured_plan>: what the question asks, the facts a correct "
        "answer needs (your own checklist), and the order in which you will look them up.\n"
        "Research: then search, one short query between <search> and </search>, and stop; the tool's passages "
        "come back between <tool_output> and </tool_output>. After each output, weigh it against your checklist "
        "in <state_evaluation> ... </state_evaluation> and either search again (revising the plan if needed) or "
        "move on. Always search at least once before answering.\n"
        "Review: when the evidence is enough, write <review> ... </review>: which checklist facts the passages "
        "confirmed, and the answer they support.\n"
        "Answer: finally write the answer once, between <answer> and </answer>, inside \\boxed{}, for example "
        "<answer>\\boxed{Paris}</answer>. You may think between <think> and </think> at any point."),
    force_answer_message=("\n<tool_output>Search budget exhausted. Review the evidence above and answer now, "
                          "as <review>...</review><answer>\\boxed{...}</answer>.</tool_output>\n"),
    passage_line="Doc {i} (Title: {title}) {text}",
)
PROTOCOLS: dict[str, TagProtocol] = {p.name: p for p in (ARBOR, SEARCH_R1, RUBRICEM)}


def get_protocol(name: str) -> TagProtocol:
    """The shipped protocol called ``name`` (``rollout.protocol``)."""
    if name not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}; shipped: {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]


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


def _blocks(text: str, protocol: TagProtocol = ARBOR) -> tuple[list[tuple[str, int, int, int, int]], str]:
    """Split ``text`` into protocol blocks: (tag, open_start, body_start, body_end, close_end).

    Returns the blocks and an error reason ("" when the tags pair up). Tool-output blocks are reported as
    ``"result"`` whatever the protocol calls them.
    """
    tag_re, result_tag, result_close = protocol.tag_re, protocol.result_tag, protocol.result_close
    blocks: list[tuple[str, int, int, int, int]] = []
    pos = 0
    first = tag_re.search(text)
    if first and first.group(1) == "/" and first.group(2) == "think":
        # implicit <think> opened by the chat template in the prompt
        blocks.append(("think", 0, 0, first.start(), first.end()))
        pos = first.end()
    while True:
        m = tag_re.search(text, pos)
        if m is None:
            return blocks, ""
        closing, tag = m.group(1) == "/", m.group(2)
        if closing:
            return blocks, f"</{tag}> without an opening <{tag}>"
        if tag == result_tag:
            end = text.find(result_close, m.end())
            if end == -1:
                return blocks, f"unclosed <{result_tag}>"
            blocks.append(("result", m.start(), m.end(), end, end + len(result_close)))
            pos = end + len(result_close)
            continue
        inner = tag_re.search(text, m.end())
        if inner is None:
            return blocks, f"unclosed <{tag}>"
        if inner.group(1) != "/" or inner.group(2) != tag:
            shown = f"<{inner.group(1)}{inner.group(2)}>"
            if inner.group(1) == "/":
                return blocks, f"<{tag}> closed by {shown}"
            return blocks, f"{shown} nested inside <{tag}>"
        blocks.append((tag, m.start(), m.end(), inner.start(), inner.end()))
        pos = inner.end()


def check_format(text: str, truncated: bool = False, protocol: TagProtocol = ARBOR) -> FormatResult:
    """The strict format gate used by the base reward (eq. 4), evaluation (App. C.1) and the judges (App. E)."""
    answer = extract_answer(text, protocol)
    if truncated:
        return FormatResult(False, "truncated: the response hit the token or turn budget", answer)
    blocks, err = _blocks(text, protocol)
    if err:
        return FormatResult(False, err, answer)
    res = f"<{protocol.result_tag}>"
    for i, (tag, start, b0, b1, end) in enumerate(blocks):
        if tag == "search":
            if not text[b0:b1].strip():
                return FormatResult(False, "empty search query", answer)
            nxt = blocks[i + 1] if i + 1 < len(blocks) else None
            if nxt is None or nxt[0] != "result" or text[end : nxt[1]].strip():
                return FormatResult(False, f"<search> not followed by its {res}", answer)
        if tag == "result":
            prev = blocks[i - 1] if i else None
            if prev is None or prev[0] != "search" or text[prev[4] : start].strip():
                return FormatResult(False, f"{res} not directly after a <search>", answer)
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
    if protocol.staged and (err := stage_order_error([b[0] for b in blocks])):
        return FormatResult(False, err, answer)
    if not protocol.boxed:  # Search-R1: the block's text is the answer
        plain = text[a[2] : a[3]].strip()
        return FormatResult(True, "", plain) if plain else FormatResult(False, "empty <answer>", answer)
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


def stage_order_error(tags: list[str]) -> str:
    """The scaffold rules of a staged protocol (RubricEM §3.2, App. B.1) over a response's block tags, "" when
    they hold: Plan first (``<structured_plan>`` before any search), at least one search, ``<state_evaluation>``
    only right after a tool output, plan revisions only during Research, and exactly one ``<review>`` right
    before the ``<answer>`` (``<think>`` blocks may sit anywhere)."""
    seq = [t for t in tags if t != "think"]
    if not seq or seq[0] != "structured_plan":
        return "a staged response must open with <structured_plan> (the Plan stage)"
    if "search" not in seq:
        return "no search before the answer (the Research stage is mandatory)"
    n_review = seq.count("review")
    if n_review != 1:
        return "no <review> before the <answer>" if not n_review else f"{n_review} <review> blocks (exactly one allowed)"
    if seq[-2] != "review":
        return "<review> must come right before the <answer>"
    for prev, tag in zip(seq, seq[1:], strict=False):
        if tag == "state_evaluation" and prev != "result":
            return "<state_evaluation> not right after a tool output"
    return ""


STAGE_NAMES = ("plan", "research", "review", "answer")


def stage_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the four stages of a staged response (RubricEM App. C.3's boundaries):

        Plan      start .. end of the first </structured_plan>
        Research  .. the Review stage's start (every search / tool output / state evaluation)
        Review    the last <think> before <review> (when nothing but it lies between them) .. <answer>
        Answer    <answer> .. end of text

    Best effort on a malformed response: a missing stage is an empty span at its place, spans stay in order and
    tile the text."""
    n = len(text)
    close = text.find("</structured_plan>")
    p_end = close + len("</structured_plan>") if close != -1 else 0
    a_start = text.rfind("<answer>")
    a_start = n if a_start < p_end else a_start
    r_start = text.rfind("<review>", p_end, a_start)
    if r_start == -1:
        r_start = a_start
    else:
        t = text.rfind("<think>", p_end, r_start)
        t_close = text.find("</think>", t, r_start) if t != -1 else -1
        if t_close != -1 and not text[t_close + len("</think>") : r_start].strip():
            r_start = t
    return [(0, p_end), (p_end, r_start), (r_start, a_start), (a_start, n)]


def token_starts(decode: Callable[[list[int]], str], ids: Sequence[int], char_starts: Sequence[int]) -> list[int]:
    """For each character offset, the first token whose decoded prefix reaches it: the smallest j with
    ``len(decode(ids[:j])) >= c`` (binary search; offsets must be non-decreasing). Maps stage boundaries found in
    a response's text onto its token ids (the loop's text is the decode of its ids)."""
    out: list[int] = []
    lo_bound = 0
    for c in char_starts:
        lo, hi = lo_bound, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if len(decode(list(ids[:mid]))) >= c:
                hi = mid
            else:
                lo = mid + 1
        out.append(lo)
        lo_bound = lo
    return out


def _bodies(text: str, tag: str, protocol: TagProtocol = ARBOR) -> list[str]:
    """Bodies of closed ``tag`` blocks in order; results are opaque (best effort on malformed text)."""
    tag_re = protocol.tag_re
    out: list[str] = []
    pos = 0
    while True:
        m = tag_re.search(text, pos)
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


def extract_searches(text: str, protocol: TagProtocol = ARBOR) -> list[str]:
    """The search queries issued, in order (stripped)."""
    return [b.strip() for b in _bodies(text, "search", protocol)]


def extract_results(text: str, protocol: TagProtocol = ARBOR) -> list[str]:
    """The tool results appended after each search, in order (stripped)."""
    return [b.strip() for b in _bodies(text, protocol.result_tag, protocol)]


def extract_answer(text: str, protocol: TagProtocol = ARBOR) -> str | None:
    """The answer of the last ``<answer>`` block, or None: its last ``\\boxed{}`` (arbor), its stripped text
    (Search-R1, None when empty)."""
    answers = _bodies(text, "answer", protocol)
    if not answers:
        return None
    if not protocol.boxed:
        return answers[-1].strip() or None
    try:
        boxed = find_boxed(answers[-1])
    except ValueError:
        return None
    return boxed[-1].strip() if boxed else None


def sanitize_tool_text(text: str, protocol: TagProtocol = ARBOR) -> str:
    """Remove protocol tags from tool output so results cannot forge or close blocks."""
    return protocol.tag_re.sub("", text)


def result_block(body: str, protocol: TagProtocol = ARBOR) -> str:
    """The text the agent loop appends after a ``</search>``: arbor's ``\\n<result>\\n{body}\\n</result>\\n``,
    Search-R1's ``\\n\\n<information>{body}</information>\\n\\n``."""
    return f"{protocol.result_prefix}{sanitize_tool_text(body, protocol).strip()}{protocol.result_suffix}"


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


# ---- reflections (RubricEM App. D.6.1) ---------------------------------------------------------------------------
REFLECTION_TAGS = ("reflection_rubrics", "reflection_takeaways")


def reflection_blocks(candidate: str) -> tuple[str, str] | None:
    """The bodies of a reflection's ``<reflection_rubrics>`` and ``<reflection_takeaways>`` blocks (D.6.1), or None
    when either is missing or empty (the candidate is then invalid: it cannot enter the bank)."""
    bodies = []
    for tag in REFLECTION_TAGS:
        m = re.search(rf"<{tag}>(.*?)</{tag}>", candidate, re.S)
        if m is None or not m.group(1).strip():
            return None
        bodies.append(m.group(1))
    return bodies[0], bodies[1]


def turn_spans(loss_mask: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of every maximal run of loss-mask-1 tokens: the policy's turns, in order."""
    spans: list[tuple[int, int]] = []
    start: int | None = None
    for j, m in enumerate(loss_mask):
        if m and start is None:
            start = j
        elif not m and start is not None:
            spans.append((start, j))
            start = None
    if start is not None:
        spans.append((start, len(loss_mask)))
    return spans
