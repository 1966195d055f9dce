"""Co-ReAct's equations as pure functions (Kang et al., 2026: §3.1-3.3, App. A).

- Step rubric text: numbered lines ``1. [0.4] condition`` (3-5 of them, positive weights summing to about 1,
  negative weights for flaws) and one ``Action: ...`` line: ``render_rubric`` / ``parse_rubric``.
- Verification (§3.3): score = sum of the weights of the satisfied items / sum of the positive weights; a step
  passes when score > tau (0.5, strict). For a negative item "satisfied" means the flaw is present, so it subtracts.
- Generator reward (eq. 1-3): r_rank = (rho + 1) / 2 with rho the Spearman correlation of the rubric-induced ranking
  and the expert consensus; with ties, the Pearson correlation of tie-averaged ranks (what the authors' code computes
  through ``scipy.stats.spearmanr``); an undefined rho (a constant ranking) gives r_rank = 0.5.
  r = 0.75 r_rank + 0.15 r_atom + 0.10 r_fmt; r_fmt = 0.5 for 3-5 items + 0.5 when the positive weights sum to
  within 0.15 of 1; r_atom = share of atomic items; r = 0 when the 4-gram repetition rate exceeds 40%.
- Consensus (§3.1): the Borda count sums each candidate's rank positions over the judges (lower is better); a
  branching point needs at least two valid rankings.
- Slate selection (App. A): exact duplicates out, then k = 4 diverse actions by Maximum-Marginal-Relevance with BM25
  similarity on the tokenised action strings.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

from arbor.types import RubricItem, StepRubric

RANK_LABELS = ("X", "Y", "Z", "W", "V", "U", "T", "S")  # Co-ReAct §3.1: neutral names of the shown candidates
TAU = 0.5  # verification threshold (App. A)
REWARD_WEIGHTS = (0.75, 0.15, 0.10)  # (w_rank, w_atom, w_fmt), eq. 3 and App. A
REPETITION_LIMIT = 0.40  # the 4-gram repetition gate (App. A)

_ITEM_LINE = re.compile(r"^\s*(?:\d+\s*[.)]\s*)?\[\s*([-+]?\d*\.?\d+)\s*\]\s*(.+?)\s*$")
_ACTION_LINE = re.compile(r"^\s*(?:recommended\s+)?action\s*:\s*(.*?)\s*$", re.IGNORECASE)
_CONJUNCTION = re.compile(r"\b(?:and|or|as well as)\b|[;,]", re.IGNORECASE)


# ---- the step rubric as text ---------------------------------------------------------------------------------

def render_rubric(rubric: StepRubric) -> str:
    """The rubric as the agent reads it: numbered weighted items, then the recommended action."""
    lines = [f"{i}. [{item.weight:g}] {item.condition}" for i, item in enumerate(rubric.items, 1)]
    if rubric.action:
        lines.append(f"Action: {rubric.action}")
    return "\n".join(lines)


def parse_rubric(text: str) -> StepRubric:
    """Items and action from a generator's text; lines in neither form are ignored (the format reward sees the
    result: a text without items scores 0 on format and cannot rank anything)."""
    items: list[RubricItem] = []
    action = ""
    for line in text.splitlines():
        if m := _ITEM_LINE.match(line):
            items.append(RubricItem(max(-1.0, min(1.0, float(m.group(1)))), m.group(2)))
        elif (a := _ACTION_LINE.match(line)) and not action:
            action = a.group(1)
    return StepRubric(tuple(items), action)


# ---- verification (§3.3) -------------------------------------------------------------------------------------

def verification_score(weights: Sequence[float], satisfied: Sequence[bool]) -> float:
    """sum_{satisfied} w / sum_{w > 0} w (a satisfied negative item is a flaw present: it subtracts); 0 when the
    rubric has no positive weight."""
    if len(weights) != len(satisfied):
        raise ValueError(f"{len(weights)} weights but {len(satisfied)} verdicts")
    positive = sum(w for w in weights if w > 0)
    if positive <= 0:
        return 0.0
    return sum(w for w, s in zip(weights, satisfied, strict=True) if s) / positive


def passes(score: float, tau: float = TAU) -> bool:
    """A step passes verification when its score exceeds tau (strictly; scores are sums of weights, so a score
    equal to tau up to float rounding, like 0.3 + 0.2, does not pass)."""
    return score > tau + 1e-9


def verifier_feedback(rubric: StepRubric, satisfied: Sequence[bool]) -> list[str]:
    """The conditions that count against the action: unmet positive items and present flaws (negative items)."""
    return [it.condition for it, s in zip(rubric.items, satisfied, strict=True) if (it.weight > 0) != bool(s)]


# ---- generator reward (eq. 1-3) ------------------------------------------------------------------------------

def average_ranks(scores: Sequence[float], *, descending: bool) -> list[float]:
    """1-based ranks of ``scores`` with ties sharing their average rank (descending: the highest score ranks 1)."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i] if descending else scores[i])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + 1 + j + 1) / 2
        i = j + 1
    return ranks


def spearman_rho(ranks_a: Sequence[float], ranks_b: Sequence[float]) -> float | None:
    """Spearman's rho of two rankings: the Pearson correlation of their (tie-averaged) ranks, which equals
    1 - 6 sum d^2 / (n (n^2 - 1)) without ties (eq. 2). None when undefined (fewer than two items, or a constant
    ranking)."""
    if len(ranks_a) != len(ranks_b):
        raise ValueError(f"rankings of {len(ranks_a)} and {len(ranks_b)} candidates")
    n = len(ranks_a)
    if n < 2:
        return None
    ma, mb = sum(ranks_a) / n, sum(ranks_b) / n
    da, db = [a - ma for a in ranks_a], [b - mb for b in ranks_b]
    va, vb = sum(x * x for x in da), sum(y * y for y in db)
    if va == 0 or vb == 0:
        return None
    return sum(x * y for x, y in zip(da, db, strict=True)) / math.sqrt(va * vb)


def rank_reward(ranks_a: Sequence[float], ranks_b: Sequence[float]) -> float:
    """Eq. 1: r_rank = (rho + 1) / 2; 0.5 (chance) when rho is undefined."""
    rho = spearman_rho(ranks_a, ranks_b)
    return 0.5 if rho is None else (rho + 1) / 2


def format_reward(weights: Sequence[float]) -> float:
    """r_fmt: 0.5 for 3-5 items + 0.5 when the positive weights sum to within 0.15 of 1 (0 without items)."""
    if not weights:
        return 0.0
    count = 0.5 if 3 <= len(weights) <= 5 else 0.0
    total = 0.5 if abs(sum(w for w in weights if w > 0) - 1.0) < 0.15 else 0.0
    return count + total


def is_atomic(condition: str) -> bool:
    """An item checks one thing: no conjunction ("and", "or", ";", ",") joins two requirements. A heuristic; the
    authors ask their evaluator LLM for the count (docs/decisions/coreact-rubric-guided-verified-steps.md)."""
    return _CONJUNCTION.search(condition) is None


def atomicity_reward(conditions: Sequence[str]) -> float:
    """r_atom: the share of atomic items (0 without items)."""
    return sum(is_atomic(c) for c in conditions) / len(conditions) if conditions else 0.0


def repetition_rate(text: str, n: int = 4) -> float:
    """1 - unique / total word n-grams (lower-cased ``\\w+`` words); 0 for a text shorter than n + 1 words."""
    words = re.findall(r"\w+", text.lower())
    if len(words) < n + 1:
        return 0.0
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams)


def generator_reward(r_rank: float, r_atom: float, r_fmt: float, *, repetition: float = 0.0,
                     weights: tuple[float, float, float] = REWARD_WEIGHTS,
                     repetition_limit: float = REPETITION_LIMIT) -> float:
    """Eq. 3 behind the repetition gate: w1 r_rank + w2 r_atom + w3 r_fmt, or 0 when repetition > the limit."""
    if repetition > repetition_limit:
        return 0.0
    w1, w2, w3 = weights
    return w1 * r_rank + w2 * r_atom + w3 * r_fmt


# ---- consensus and slates (§3.1, App. A) ---------------------------------------------------------------------

def borda(rankings: Sequence[Sequence[float]]) -> list[float]:
    """Borda count: each candidate's rank positions summed over the judges (lower is better)."""
    if not rankings:
        raise ValueError("no rankings to combine")
    n = len(rankings[0])
    if any(len(r) != n for r in rankings):
        raise ValueError("rankings of different lengths")
    return [sum(r[i] for r in rankings) for i in range(n)]


def consensus_ranks(rankings: Sequence[Sequence[float]]) -> list[float]:
    """The expert consensus sigma*: Borda sums turned into tie-averaged ranks (1 = best)."""
    return average_ranks(borda(rankings), descending=False)


def _bm25_matrix(docs: Sequence[list[str]], k1: float = 1.5, b: float = 0.75) -> list[list[float]]:
    """BM25 score of document j for the query made of document i's tokens, normalised by i's self-score."""
    n = len(docs)
    avg = sum(len(d) for d in docs) / n if n else 0.0
    df = Counter(t for d in docs for t in set(d))
    idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}
    tfs = [Counter(d) for d in docs]

    def score(q: list[str], j: int) -> float:
        tf, dl = tfs[j], len(docs[j])
        return sum(idf[t] * tf[t] * (k1 + 1) / (tf[t] + k1 * (1 - b + b * dl / (avg or 1))) for t in set(q) if t in tf)

    raw = [[score(docs[i], j) for j in range(n)] for i in range(n)]
    return [[raw[i][j] / raw[i][i] if raw[i][i] > 0 else 0.0 for j in range(n)] for i in range(n)]


def select_diverse(actions: Sequence[str], k: int = 4, lam: float = 0.5) -> list[int]:
    """Indices of at most ``k`` diverse actions (App. A): exact duplicates (after whitespace normalisation) out,
    then Maximum-Marginal-Relevance over BM25 similarity of the tokenised actions. Relevance is the action's mean
    similarity to the whole pool (a typical action), diversity its maximum similarity to those already chosen:
    pick argmax lam * relevance - (1 - lam) * max_sim; the first pick is the most typical action."""
    seen: dict[str, int] = {}
    for i, a in enumerate(actions):
        seen.setdefault(" ".join(a.split()), i)
    pool = list(seen.values())
    if len(pool) <= k:
        return pool
    docs = [re.findall(r"\w+", actions[i].lower()) for i in pool]
    sim = _bm25_matrix(docs)
    relevance = [sum(row) / len(row) for row in sim]
    chosen: list[int] = []
    while len(chosen) < k:
        best, best_val = -1, -math.inf
        for j in range(len(pool)):
            if j in chosen:
                continue
            div = max((max(sim[j][c], sim[c][j]) for c in chosen), default=0.0)
            val = lam * relevance[j] - (1 - lam) * div
            if val > best_val:
                best, best_val = j, val
        chosen.append(best)
    return sorted(pool[j] for j in chosen)


def rubric_reward(rubric: StepRubric, rubric_text: str, candidate_scores: Sequence[float] | None,
                  consensus: Sequence[float]) -> dict[str, float]:
    """Eq. 1-3 for one sampled rubric: the ranking its verification scores induce over the slate (highest score
    ranks first, ties averaged) against the consensus ranks, its atomicity and format, and the 4-gram gate on its
    text. A rubric without items, or whose scores could not be read, ranks nothing: r_rank = 0.5 (a failed
    verification then takes its group's mean instead: ``guidance_train.neutral_rank``)."""
    if rubric.items and candidate_scores is not None:
        r_rank = rank_reward(average_ranks(candidate_scores, descending=True), consensus)
    else:
        r_rank = 0.5
    r_atom = atomicity_reward([it.condition for it in rubric.items])
    r_fmt = format_reward([it.weight for it in rubric.items])
    rep = repetition_rate(rubric_text)
    return {"r_rank": r_rank, "r_atom": r_atom, "r_fmt": r_fmt, "repetition": rep,
            "reward": generator_reward(r_rank, r_atom, r_fmt, repetition=rep)}


def unshuffle_ranking(best_first_labels: Sequence[str], order: Sequence[int]) -> list[int]:
    """Map a ranking of the *shown* candidates back to the caller's order (Co-ReAct §3.1's random relabelling).

    Candidate ``order[j]`` was shown at position j under ``RANK_LABELS[j]``; ``best_first_labels`` is the judge's
    full ranking of those labels, best first. Returns ``ranks`` with ``ranks[i]`` the rank (1 = best) of the
    caller's candidate i. ValueError unless ``order`` is a permutation of range(n) and the ranking holds each of
    the n shown labels exactly once."""
    n = len(order)
    if sorted(order) != list(range(n)) or n > len(RANK_LABELS):
        raise ValueError(f"order {list(order)} is not a permutation of range({n}) (at most {len(RANK_LABELS)})")
    labels = RANK_LABELS[:n]
    if sorted(best_first_labels) != sorted(labels):
        raise ValueError(f"ranking {list(best_first_labels)} is not a permutation of {list(labels)}")
    ranks = [0] * n
    for position, label in enumerate(best_first_labels, start=1):
        ranks[order[labels.index(label)]] = position
    return ranks
