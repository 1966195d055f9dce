"""RubricEM's reflection meta-policy and rubric bank (§3.4, App. D): the pure parts.

    reflection prompt   the backbone reads (question, one judged trajectory) and writes two blocks, D.6.1
    utility             u = 0.4 diagnosis + 0.3 specificity + 0.3 scope of the judge's grade, D.6.2
    best candidate      the highest-utility valid candidate enters the bank (D.4), replacing the question's old item
    retrieval           within-episode: the question's own item; cross-episode: the top-k items of *other*
                        questions by inner product of normalised question embeddings (D.5)
    injection           a ``<reference_examples>`` block before the question, one preamble per mode (D.6.3)
    curriculum          windows of 2K steps: K fresh batches (cross), then the same K replayed (within), D.3

The bank changes only through its ``rubric_bank`` event rows, so a resumed run rebuilds it (``RubricBank.from_events``).
Prompts and preambles are ours, written from the paper's description.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from arbor.format import (
    REFLECTION_TAGS,
    extract_answer,
    extract_searches,
    get_protocol,
    reflection_blocks,
)
from arbor.types import ReflectionGrade

Mode = Literal["cross", "within"]
REFLECTION_STOP = f"</{REFLECTION_TAGS[1]}>"
# reflection groups sit beside the task groups of a training batch: group id = REFLECTION_GROUP + source group
REFLECTION_GROUP = 1 << 20

REFLECTION_SYSTEM_PROMPT = (
    "You review a finished search-agent attempt so that the next attempt does better. You get the question and the "
    "attempt, which ends in a boxed answer. Do not answer the question again. Check the answer, find the two to "
    "four things that most decided how the attempt went, point to where they happen in the attempt, and turn them "
    "into guidance that holds for this question and for questions like it. Name the entities and searches "
    "involved; never write advice that fits any task. Write exactly two blocks:\n"
    "<reflection_rubrics>\nCritical requirement: ...\nAnalytical approach: ...\nCommunication: ...\n"
    "Pitfalls: ...\n</reflection_rubrics>\n"
    "<reflection_takeaways>\n1. ...\n(one to four short lessons, one per line)\n</reflection_takeaways>")


def reflection_message(question: str, trajectory_text: str) -> str:
    """The user message of a reflection request (D.6.1): the question, then the attempt as it was written."""
    return f"Question: {question.strip()}\n\nAttempt:\n{trajectory_text.strip()}\n\nWrite the two blocks."


def reflection_utility(grade: ReflectionGrade, weights: Sequence[float] = (0.4, 0.3, 0.3)) -> float:
    """u = w_d diagnosis + w_s specificity + w_c scope (D.6.2's weights 0.4 / 0.3 / 0.3)."""
    w_d, w_s, w_c = weights
    return w_d * grade.diagnosis + w_s * grade.specificity + w_c * grade.scope


def within_cross_utility(grade: ReflectionGrade) -> float:
    """u = (u_within + u_cross) / 2 (Alg. 1 lines 37-38). D.6.2's three dimensions split by whom the guidance
    serves: specificity asks about the next attempt at this question (u_within), scope about other questions
    (u_cross), and diagnosis underlies both: u_within = (diagnosis + specificity) / 2, u_cross = (diagnosis +
    scope) / 2, so u = diagnosis / 2 + specificity / 4 + scope / 4."""
    u_within = (grade.diagnosis + grade.specificity) / 2
    u_cross = (grade.diagnosis + grade.scope) / 2
    return (u_within + u_cross) / 2


def best_candidate(utilities: Sequence[float], valid: Sequence[bool]) -> int | None:
    """The index of the highest-utility valid candidate with u > 0 (the first on ties), or None (D.4: "only the
    highest-scored candidate with valid output format is accepted into the bank")."""
    best = None
    for i, (u, ok) in enumerate(zip(utilities, valid, strict=True)):
        if ok and u > 0 and (best is None or u > utilities[best]):
            best = i
    return best


# ------------------------------------------------------------------------------------------------ the bank
@dataclass(frozen=True)
class BankItem:
    """One accepted reflection: what the question taught (its two blocks), where it came from, its utility."""

    item_id: str
    question_id: str
    question: str
    rubrics: str
    takeaways: str
    step: int
    source_traj_id: str
    utility: float


def rank_related(query: Sequence[float], candidates: Sequence[tuple[str, Sequence[float]]],
                 k: int) -> list[tuple[str, float]]:
    """The ``k`` candidate ids with the largest inner product with ``query`` (vectors as given: normalise them to
    rank by cosine), largest first; equal scores keep the candidates' order."""
    scored = [(cid, float(sum(a * b for a, b in zip(query, vec, strict=True)))) for cid, vec in candidates]
    order = sorted(range(len(scored)), key=lambda i: (-scored[i][1], i))
    return [scored[i] for i in order[:k]]


def normalise(vec: Sequence[float]) -> list[float]:
    n = math.sqrt(sum(x * x for x in vec))
    return [x / n for x in vec] if n > 0 else [float(x) for x in vec]


class RubricBank:
    """The agent rubric bank: at most one item per question, the latest written (D.5), in write order."""

    def __init__(self) -> None:
        self.items: dict[str, BankItem] = {}  # question_id -> its item (dict order: write order of the current items)

    def write(self, item: BankItem, group: int) -> dict[str, Any]:
        """Add ``item``; an older item of the same question is replaced (D.5). The event row."""
        old = self.items.pop(item.question_id, None)
        self.items[item.question_id] = item
        return {**asdict(item), "group": group, "event": "replaced" if old else "written",
                "replaced_item_id": old.item_id if old else None}

    def within(self, question_id: str) -> BankItem | None:
        """Within-episode retrieval: the question's own item (exact match)."""
        return self.items.get(question_id)

    def cross(self, question_id: str, query_vec: Sequence[float], vecs: dict[str, Sequence[float]],
              k: int) -> list[tuple[BankItem, float]]:
        """Cross-episode retrieval: the ``k`` items of other questions nearest to ``query_vec`` (``vecs``: question
        id -> normalised embedding of that item's question)."""
        others = [(qid, vecs[qid]) for qid in self.items if qid != question_id]
        return [(self.items[qid], s) for qid, s in rank_related(query_vec, others, k)]

    @classmethod
    def from_events(cls, rows: Sequence[dict[str, Any]]) -> RubricBank:
        """Replay stored ``rubric_bank`` events in (step, order) order."""
        bank = cls()
        fields = BankItem.__dataclass_fields__
        for r in rows:
            bank.write(BankItem(**{k: r[k] for k in fields}), int(r["group"]))
        return bank


# ------------------------------------------------------------------------------------------------ injection
_WITHIN = "You tried this exact question before. Avoid what went wrong then and keep what worked:"
_CROSS = "Lessons from similar questions answered before. Adapt them to this question; do not copy them:"


def reference_block(mode: Mode, items: Sequence[BankItem]) -> str:
    """The ``<reference_examples>`` block of D.6.3 for the retrieved ``items`` ("" when none)."""
    if not items:
        return ""
    if mode == "within":
        it = items[0]
        body = f"{_WITHIN}\n{it.rubrics.strip()}\n{it.takeaways.strip()}"
    else:
        parts = [f"Similar question {i}: {it.question.strip()}\n{it.rubrics.strip()}\n{it.takeaways.strip()}"
                 for i, it in enumerate(items, 1)]
        body = _CROSS + "\n" + "\n".join(parts)
    return f"<reference_examples>\n{body}\n</reference_examples>"


def with_reference(question: str, block: str) -> str:
    """The user message the policy sees: the reference block, then the original question (D.6.3)."""
    return f"{block}\n\n{question.strip()}" if block else question


# ------------------------------------------------------------------------------------------------ curriculum
def windowed_batch(step: int, window: int) -> tuple[int, Mode]:
    """(fresh batch number, retrieval mode) of RL step ``step`` (1-based) under the windowed curriculum (D.3):
    in each window of 2K steps, steps 1..K draw fresh batches (cross-episode), steps K+1..2K replay them in order
    (within-episode). K = 3: steps 1..6 -> batches 1, 2, 3, 1, 2, 3; step 7 -> batch 4."""
    if step < 1 or window < 1:
        raise ValueError("windowed_batch needs step >= 1 and window >= 1")
    w, pos = divmod(step - 1, 2 * window)
    return w * window + pos % window + 1, "cross" if pos < window else "within"


# ------------------------------------------------------------------------------------------------ SFT rows
_QUESTION_WORDS = {"Who", "What", "Which", "When", "Where", "Why", "How", "In", "The", "A", "An", "Of", "On", "For"}


def gold_reflection(question: str, response: str, rng: random.Random, protocol: str = "arbor") -> str:
    """A reflection on a gold trajectory in D.6.1's two blocks, for SFT rows that teach the format:
    grounded in the question's capitalised names, the searches made and the answer given. Parts are left out at
    random, so that sampled reflections differ in how much they say and the judge's scores vary."""
    tags = get_protocol(protocol)
    queries = extract_searches(response, tags)
    answer = extract_answer(response, tags) or "the answer"
    found = (" ".join(w for w in m.split() if w not in _QUESTION_WORDS)
             for m in re.findall(r"\b[A-Z][\w'-]+(?:\s+[A-Z][\w'-]+)*", question))
    names = [n for n in dict.fromkeys(found) if n][:3]
    named = " and ".join(names) if names else "the entities the question names"
    first = f'"{queries[0]}"' if queries else "a query naming the subject"
    rubrics = [
        f"Critical requirement: the answer the evidence gives for {named}.",
        f"Analytical approach: search {first}, then the name that result gives.",
        "Communication: the answer alone in the box.",
        f"Pitfalls: stopping before the chain from {named} ends.",
    ]
    lessons = [
        f"Follow the chain from {named} to its end.",
        f"The searches {', '.join(repr(q) for q in queries[:2]) or first} found the evidence.",
        f"The answer {answer} came from the last result.",
        "Check that the last result names the entity asked about.",
    ]
    keep_r = sorted(rng.sample(range(4), rng.randint(2, 4)))
    keep_l = sorted(rng.sample(range(4), rng.randint(1, 4)))
    return (f"<{REFLECTION_TAGS[0]}>\n" + "\n".join(rubrics[i] for i in keep_r) + f"\n</{REFLECTION_TAGS[0]}>\n"
            f"<{REFLECTION_TAGS[1]}>\n" + "\n".join(f"{n}. {lessons[i]}" for n, i in enumerate(keep_l, 1))
            + f"\n</{REFLECTION_TAGS[1]}>")


def reflection_sft_rows(rows: Sequence[dict[str, Any]], share: float, seed: int,
                        protocol: str = "arbor") -> list[dict[str, Any]]:
    """RubricEM's SFT additions for a seeded ``share`` of the gold rows: a reflection row (the reflection
    request under ``REFLECTION_SYSTEM_PROMPT``, its gold reflection as the response), and a copy of the gold row
    whose question comes after a ``<reference_examples>`` block (D.6.3): its own gold reflection (within-episode)
    or two other questions' (cross-episode), alternately. A policy that never saw such a block in SFT writes
    reflections instead of its plan when one appears in its prompt."""
    rng = random.Random(seed)
    items = [BankItem(f"sft/{i}", str(r.get("question_id") or i), r["question"], *(reflection_blocks(
        gold_reflection(r["question"], r["response"], rng, protocol)) or ("", "")), 0, "", 1.0)
        for i, r in enumerate(rows)]
    reflections, references = [], []
    for i, r in enumerate(rows):
        if rng.random() >= share:
            continue
        reflections.append({"question_id": r.get("question_id"), "golds": r.get("golds", []),
                            "question": reflection_message(r["question"], r["response"]),
                            "system": REFLECTION_SYSTEM_PROMPT,
                            "response": gold_reflection(r["question"], r["response"], rng, protocol)})
        others = [j for j in range(len(rows)) if j != i]
        if len(references) % 2 == 0 or len(others) < 2:
            block = reference_block("within", [items[i]])
        else:
            block = reference_block("cross", [items[j] for j in rng.sample(others, 2)])
        references.append({**r, "question": with_reference(r["question"], block)})
    if any(reflection_blocks(r["response"]) is None for r in reflections):
        raise AssertionError("gold_reflection wrote a reflection without both blocks")
    return reflections + references


__all__ = ["REFLECTION_GROUP", "REFLECTION_STOP", "REFLECTION_SYSTEM_PROMPT", "BankItem", "Mode", "RubricBank",
           "best_candidate", "gold_reflection", "normalise", "rank_related", "reference_block",
           "reflection_message", "reflection_sft_rows", "reflection_utility", "windowed_batch", "with_reference",
           "within_cross_utility"]
