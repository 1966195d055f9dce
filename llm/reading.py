"""What an offline heuristic reads from a question and a trajectory (the ``rules`` judge's shared vocabulary): the
question's entities, content tokens, capitalised names, the tool outputs, and the process features several methods'
heuristics share. Each reads tags (``llm.text.parse_trajectory``) and counts; none reads meaning. The heuristics
themselves live with their roles (``tasks/methods/<m>/``)."""

from __future__ import annotations

import re
from collections.abc import Callable

from arbor.format import PROTOCOLS
from arbor.llm.text import normalize_answer, parse_trajectory

STOP_WORDS = set(
    "a an the of in on at to for from by with and or is was were are be been who what which when where why how "
    "did does do same as that this it its their his her they he she than both first".split()
)
_QWORDS = {"were", "was", "is", "are", "who", "what", "which", "when", "where", "why", "how", "did", "does", "do",
           "in", "the"}


def question_entities(question: str) -> list[str]:
    """Capitalised word runs of the question (minus a leading question word), else its content words."""
    words = re.findall(r"[\w'’.-]+", question)
    runs: list[list[str]] = []
    cur: list[str] = []
    for i, w in enumerate(words):
        cap = (w[:1].isupper() or w[:1].isdigit()) and not (i == 0 and w.lower() in _QWORDS)
        if cap:
            cur.append(w)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    ents = [" ".join(r).strip(".") for r in runs]
    if not ents:
        ents = [w for w in words if w.lower() not in STOP_WORDS]
    return list(dict.fromkeys(e for e in ents if normalize_answer(e)))


def content_tokens(s: str) -> set[str]:
    return set(normalize_answer(s).split()) - STOP_WORDS


def repeated_query_share(text: str, question: str) -> float:
    """Share of queries that repeat an earlier query (after normalisation)."""
    qs = [normalize_answer(q) for q in parse_trajectory(text).queries]
    return (len(qs) - len(set(qs))) / len(qs) if qs else 0.0


def answer_in_evidence(text: str, question: str) -> float:
    """Share of the final answer's normalised tokens that occur in the retrieved results (0 without an answer)."""
    p = parse_trajectory(text)
    ans = normalize_answer(p.answer or "").split()
    if not ans:
        return 0.0
    evidence = set(" ".join(normalize_answer(r) for r in p.results).split())
    return sum(tok in evidence for tok in ans) / len(ans)


def searches_after_evidence(text: str, question: str) -> float:
    """Searches issued after the first result that already contains the final answer (0 if none contains it)."""
    p = parse_trajectory(text)
    ans = normalize_answer(p.answer or "")
    if not ans:
        return 0.0
    seen, after = False, 0
    for s in p.segments:
        if seen and s.kind == "search":
            after += 1
        if s.kind == "result" and re.search(rf"\b{re.escape(ans)}\b", normalize_answer(s.text)):
            seen = True
    return float(after)


Feature = Callable[[str, str], float]  # (trajectory text, question) -> a number


# the retrieved tool outputs, less a protocol's forced "search budget exhausted" message (no evidence)
FORCED = {parse_trajectory(p.force_answer_message).results[0].strip() for p in PROTOCOLS.values()
           if parse_trajectory(p.force_answer_message).results}
SENTENCE_END = ".!?:;*•-"  # a word after one of these (or after a line break) opens a sentence


def tool_outputs(text: str) -> list[str]:
    """The retrieved tool outputs, less a protocol's forced "search budget exhausted" message (no evidence)."""
    return [r for r in parse_trajectory(text).results if r.strip() not in FORCED]


def entity_tokens(question: str) -> list[set[str]]:
    return [t for t in (content_tokens(e) for e in question_entities(question)) if t]


def name_runs(text: str) -> list[str]:
    """Capitalised (or numeric) word runs of ``text``, broken by punctuation or a line break between words; a
    run that is one word opening a sentence (or the text) is left out, since that capital says nothing about a
    name ("Next, ...", "Both ...")."""
    runs: list[tuple[list[str], bool]] = []  # (words, opens a sentence)
    cur: list[str] = []
    pos = 0
    for m in re.finditer(r"[\w'’-]+", text):
        gap, w = text[pos : m.start()], m.group(0)
        pos = m.end()
        if cur and (gap.strip() or "\n" in gap):  # punctuation or a line break between two words ends a run
            cur = []
        if not (w[:1].isupper() or w[:1].isdigit()):
            cur = []
            continue
        if not cur:
            k = m.start() - 1
            while k >= 0 and text[k].isspace():
                k -= 1
            cur = []
            runs.append((cur, k < 0 or text[k] in SENTENCE_END or "\n" in text[k + 1 : m.start()]))
        cur.append(w)
    return [" ".join(words) for words, opens in runs if len(words) > 1 or not opens]


def contains_phrase(haystack: str, needle: str) -> bool:
    n = normalize_answer(needle)
    return bool(n) and re.search(rf"\b{re.escape(n)}\b", normalize_answer(haystack)) is not None
