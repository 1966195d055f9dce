"""Text helpers shared by the judges: trajectory parsing (App. E.1 tags), escaping, compaction."""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field

from arbor.format import _TRAILING_EOS, BOXED, PROTOCOLS, check_format
from arbor.reward import normalize_answer

__all__ = ["normalize_answer", "escape_block", "estimate_tokens", "parse_trajectory", "structure_valid",
           "compact_trajectory", "elision_marker", "min_judge_budget", "shared_budget", "WHOLE", "PROMPT_TAGS"]

# the block tags of every shipped protocol (arbor.format): arbor's, Search-R1's <information>, RubricEM's staged
# scaffold (<structured_plan>, <tool_output>, <state_evaluation>, <review>), read from the protocols themselves
_RESULT_TAGS = {p.result_tag for p in PROTOCOLS.values()}  # any protocol's tool output: a ``result`` segment
_BLOCK_TAGS = ("think", "search", *sorted(_RESULT_TAGS), "answer",
               *dict.fromkeys(t for p in PROTOCOLS.values() for t in p.stage_tags))
_BLOCK = re.compile(rf"<({'|'.join(_BLOCK_TAGS)})>(.*?)</\1>", re.S)
_BOXED = re.compile(r"\\boxed\{(.*)\}", re.S)

# The block tags of our own prompts. Trajectory text (and retrieved pages inside it) must never open or close them.
PROMPT_TAGS = (
    "question", "response_a", "response_b", "criterion", "trajectory", "ground_truth", "pair", "higher", "lower",
    "existing_rubrics", "rubric_items", "golden_answer", "predicted_answer", "candidates",
    "stage_rubrics", "evaluator_grades", "candidate",  # RubricEM roles (stage grading, reflection grading)
)
_PROMPT_TAG = re.compile(r"<(\s*/?\s*)(" + "|".join(PROMPT_TAGS) + r")\b", re.I)


def escape_block(text: str) -> str:
    """Neutralise any opening or closing tag of our prompt blocks: ``</response_a>`` -> ``&lt;/response_a>``.

    The agent's own tags (think / search / result / answer) stay readable; ``&`` is escaped first so the
    transformation is unambiguous.
    """
    text = text.replace("&", "&amp;")
    return _PROMPT_TAG.sub(lambda m: "&lt;" + m.group(1) + m.group(2), text)


def estimate_tokens(text: str) -> int:
    """Judge-side token estimate: ceil(chars / 4). We do not know the judge's tokenizer; this errs long for English."""
    return math.ceil(len(text) / 4)


@dataclass
class Segment:
    kind: str  # think | search | result | answer | structured_plan | state_evaluation | review | other
    text: str  # inner text (without the tags)


@dataclass
class Parsed:
    segments: list[Segment] = field(default_factory=list)

    def of(self, kind: str) -> list[str]:
        return [s.text for s in self.segments if s.kind == kind]

    @property
    def queries(self) -> list[str]:
        return [q.strip() for q in self.of("search")]

    @property
    def results(self) -> list[str]:
        return self.of("result")

    @property
    def answer(self) -> str | None:
        answers = self.of("answer")
        if not answers:
            return None
        m = _BOXED.search(answers[-1])
        return (m.group(1) if m else answers[-1]).strip()


def parse_trajectory(text: str) -> Parsed:
    """Split a trajectory into tagged blocks; text between (or after an unclosed tag) is an ``other`` segment.
    Every shipped protocol is read (arbor.format): Search-R1's ``<information>`` and RubricEM's ``<tool_output>``
    blocks are ``result`` segments, RubricEM's ``<structured_plan>``, ``<state_evaluation>`` and ``<review>`` keep
    their tag as their kind, and an answer without ``\\boxed{}`` is the answer block's text."""
    out = Parsed()
    pos = 0
    for m in _BLOCK.finditer(text):
        if m.start() > pos and text[pos : m.start()].strip():
            out.segments.append(Segment("other", text[pos : m.start()]))
        kind = "result" if m.group(1) in _RESULT_TAGS else m.group(1)
        out.segments.append(Segment(kind, m.group(2)))
        pos = m.end()
    if text[pos:].strip():
        out.segments.append(Segment("other", text[pos:]))
    return out


def structure_valid(text: str) -> bool:
    """The strict format gate of the base reward (``arbor.format.check_format``) under any shipped protocol: the
    judges read arbor's tags and Search-R1's alike (a run writes one protocol, so the two never compete)."""
    return any(check_format(text, protocol=p).valid for p in PROTOCOLS.values())


# ---- compaction -------------------------------------------------------------------------------------

# the checker's tag pattern (arbor.format), with RubricEM's stage tags: the judge must see where each stage lies
_PROTOCOL_TAG = re.compile(r"<(/?)(think|search|result|answer|tool_output|structured_plan|state_evaluation|review)>")
_EOS = re.compile("|".join(re.escape(e) for e in _TRAILING_EOS))
_ANSWER_BRACE = re.compile(re.escape(BOXED) + r"|[{}]")
# elision order: result bodies first, then reasoning and stray text, queries and answers last. RubricEM's tool
# output is not opaque like <result> (a \boxed{ inside it stays kept, as in any non-result text); its plan, state
# evaluations and review are reasoning.
_TIER = {"result": 0, "tool_output": 0, "think": 1, "other": 1, "structured_plan": 1, "state_evaluation": 1,
         "review": 1, "search": 2, "answer": 2}
_N_TIERS = 3


def elision_marker(n_chars: int) -> str:
    """The visible stand-in for ``n_chars`` elided characters; it holds no tag, brace, ``<`` or ``&``."""
    return f"[... {math.ceil(n_chars / 4)} tokens elided ...]"


def min_judge_budget(max_response_tokens: int, max_result_blocks: int) -> int:
    """The smallest ``judge.max_judge_tokens`` under which compaction keeps every non-result character of a
    response whose non-result text is ``max_response_tokens`` estimated tokens: that text plus one worst-case
    (5-digit) elision marker per result block (docs/decisions/verdicts-and-compaction.md)."""
    marker = len(elision_marker(4 * 99_999))
    return max_response_tokens + math.ceil(max_result_blocks * marker / 4)


# a compaction budget no trajectory reaches: ``compact_trajectory(t, WHOLE) == t`` (``judge.max_judge_tokens: null``)
WHOLE = 1 << 40


def shared_budget(window: int, reply: int, own: int, texts: int) -> int:
    """Each compacted text's equal share of a judge's window: the window less
    the reply budget and the prompt's own words, split over the ``texts`` trajectories it shows (E.1: two contrast
    pairs, four slots; E.3: two responses). Every text compacted to it, the prompt fits."""
    return (window - reply - max(own, 0)) // max(1, texts)


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _skeleton(text: str) -> tuple[list[tuple[int, int]], list[int], list[str]]:
    """Spans that compaction must keep verbatim, and the block state (what body we are in) after every tag.

    Kept: every protocol tag (paired or not; RubricEM's stage tags included); outside result bodies every ``\\boxed{`` and end-of-turn marker
    (the checker ignores the latter after ``</answer>``, so cutting one would change its verdict); inside each
    ``<answer> ... </answer>`` region every ``\\boxed{``, every brace, and the whole content of each balanced
    ``\\boxed{...}``. Returns the merged spans, the end offsets of the tags and the state after each tag.
    """
    tags = list(_PROTOCOL_TAG.finditer(text))
    state = "think" if tags and tags[0].group(0) == "</think>" else "other"  # the template's implicit <think>
    ends, states = [0], [state]
    for m in tags:
        closing, name = m.group(1) == "/", m.group(2)
        if state == "result":  # result bodies are opaque: only </result> ends them (arbor.format)
            if closing and name == "result":
                state = "other"
        else:
            state = "other" if closing else name
        ends.append(m.end())
        states.append(state)
    spans = [m.span() for m in tags]
    for m in [*_EOS.finditer(text), *re.finditer(re.escape(BOXED), text)]:
        if states[bisect.bisect_right(ends, m.start()) - 1] != "result":
            spans.append(m.span())
    for m in re.finditer(re.escape("<answer>"), text):  # the regions arbor.format.extract_answer reads
        start, end = m.end(), text.find("</answer>", m.end())
        if end == -1:
            continue
        region = text[start:end]
        spans += [(start + b.start(), start + b.end()) for b in _ANSWER_BRACE.finditer(region)]
        i = region.find(BOXED)
        while i != -1:  # the final answer itself stays whole (same scan as arbor.format.find_boxed)
            depth, j = 1, i + len(BOXED)
            while j < len(region) and depth:
                depth += {"{": 1, "}": -1}.get(region[j], 0)
                j += 1
            if depth:
                break
            spans.append((start + i, start + j))
            i = region.find(BOXED, j)
    return _merge(spans), ends, states


def _cost(length: int, cap: int) -> tuple[int, int]:
    """(kept chars, output chars) of a body of ``length`` chars allowed ``cap`` chars besides its marker."""
    if length <= cap + len(elision_marker(max(length - cap, 0))):
        return length, length  # eliding would not make it shorter
    return cap, cap + len(elision_marker(length - cap))


def _fill(lengths: list[int], room: int) -> int:
    """Water-filling: the largest per-body cap whose total output fits ``room`` chars (0 if none does)."""
    lo, hi = 0, max(lengths, default=0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(_cost(n, mid)[1] for n in lengths) <= room:
            lo = mid
        else:
            hi = mid - 1
    return lo


def compact_trajectory(text: str, max_tokens: int) -> str:
    """Fit a trajectory into ``max_tokens`` (``estimate_tokens``, chars / 4) before judging (App. E).

    1. Under budget: unchanged.
    2. The *skeleton* is never touched: every protocol tag, paired or not, in order (so an unclosed, stray,
       nested or misplaced tag still shows), the answer's ``\\boxed{...}`` and braces, end-of-turn markers
       after the answer. Only the text runs between skeleton pieces are cut; whitespace-only runs stay as they
       are (free text between blocks is legal, text between ``</search>`` and ``<result>`` is not), so
       ``arbor.format.check_format`` gives the compacted text the same verdict, reason and answer.
    3. A cut run keeps its head and tail around ``[... N tokens elided ...]``. Runs are cut tier by tier:
       result bodies first, then reasoning and stray text, then queries and answer text; a tier is touched only
       once every run of the tiers before it is down to its marker. Inside a tier the room is water-filled (short
       runs stay whole, long ones share the rest equally).
    4. If even the skeleton with every run elided is over budget, that is what the judge gets.
    """
    if estimate_tokens(text) <= max_tokens:
        return text
    spans, ends, states = _skeleton(text)
    runs: list[tuple[int, int, int]] = []  # (start, end, tier) of every cuttable text run
    pos = 0
    for a, b in [*spans, (len(text), len(text))]:
        if a > pos and text[pos:a].strip():
            runs.append((pos, a, _TIER[states[bisect.bisect_right(ends, pos) - 1]]))
        pos = max(pos, b)
    fixed = len(text) - sum(b - a for a, b, _ in runs)
    by_tier = [[i for i, r in enumerate(runs) if r[2] == t] for t in range(_N_TIERS)]
    lengths = [b - a for a, b, _ in runs]
    caps: dict[int, int] = {}
    spent = 0  # output chars of the tiers already cut
    for t in range(_N_TIERS):
        later = sum(lengths[i] for u in range(t + 1, _N_TIERS) for i in by_tier[u])
        room = max_tokens * 4 - fixed - spent - later
        mine = [lengths[i] for i in by_tier[t]]
        if sum(mine) <= room:
            break
        cap = _fill(mine, room)
        caps.update({i: cap for i in by_tier[t]})
        out_chars = sum(_cost(n, cap)[1] for n in mine)
        if out_chars <= room:
            break
        spent += out_chars
    parts: list[str] = []
    pos = 0
    for i, (a, b, _) in enumerate(runs):
        parts.append(text[pos:a])
        kept = _cost(b - a, caps[i])[0] if i in caps else b - a
        if kept == b - a:
            parts.append(text[a:b])
        else:
            head = (kept + 1) // 2
            parts.append(text[a : a + head] + elision_marker(b - a - kept) + text[b - (kept - head) : b])
        pos = b
    parts.append(text[pos:])
    return "".join(parts)
