"""Co-ReAct's offline heuristics (the ``rules`` judge's answers to its roles, its §3.1-3.3): step rubrics written and
checked in a small machine-checkable language (``STEP_CONDITIONS``): ``step_rubric`` asks for a search of a question
entity nobody has searched yet, then for one bridge hop, then for an answer naming the latest result's first new
name; ``step_verify`` reads those items back from the proposed action; ``rank_actions`` sums ARCO's
``step_criteria`` scores of each candidate. Features, not understanding."""

from __future__ import annotations

import re
from collections.abc import Sequence

from arbor.llm.reading import (
    contains_phrase,
    content_tokens,
    entity_tokens,
    name_runs,
    question_entities,
    tool_outputs,
)
from arbor.llm.text import normalize_answer, parse_trajectory
from arbor.tasks.methods.arco.roles import step_criteria
from arbor.tasks.methods.coreact.equations import RANK_LABELS
from arbor.types import RubricItem, StepRubric, StepVerdict

_BRIDGE = re.compile(r"\bof the\b", re.I)
_DOC_HEADER = re.compile(r"Doc \d+\s*\(Title:[^)]*\)")
# the rules backend's step-rubric language: "kind" or "kind: argument"; anything else is read as free text
STEP_CONDITIONS = ("searches", "answers", "query names: <entity>", "query is new", "query repeats",
                   "answer names: <text>")


def step_condition_met(condition: str, action: str, earlier_queries: Sequence[str]) -> bool:
    """Whether ``action`` meets one ``STEP_CONDITIONS`` item (for ``query repeats``: whether the flaw is there).
    ``query names: X``: every content token of X is in one of the action's queries; ``query is new``: the action
    searches and none of its queries repeats an earlier one (normalised); ``answer names: X``: the answer holds X
    as whole words. A condition in no known form: all its content tokens of 3+ characters occur in the action."""
    kind, _, arg = condition.partition(":")
    kind, arg = kind.strip().lower(), arg.strip()
    p = parse_trajectory(action)
    seen = {normalize_answer(q) for q in earlier_queries}
    repeats = [normalize_answer(q) in seen for q in p.queries]
    if kind == "searches" and not arg:
        return bool(p.queries)
    if kind == "answers" and not arg:
        return bool(normalize_answer(p.answer or ""))
    if kind == "query names" and content_tokens(arg):
        return any(content_tokens(arg) <= content_tokens(q) for q in p.queries)
    if kind == "query is new" and not arg:
        return bool(repeats) and not any(repeats)
    if kind == "query repeats" and not arg:
        return any(repeats)
    if kind == "answer names" and arg:
        return contains_phrase(p.answer or "", arg)
    words = set(normalize_answer(re.sub(r"<[^>]*>", " ", action)).split())  # the action's text without its tags
    return {t for t in content_tokens(condition) if len(t) >= 3} <= words


def step_rubric(question: str, history: str, tool_calls: int, max_tool_calls: int) -> StepRubric:
    """The rubric writer as a HEURISTIC, in ``STEP_CONDITIONS`` (no gold knowledge): while searches remain,
    (1) a search naming the first question entity no earlier query names, else (2) on a bridge question
    ("... of the ...", one hop per "of the") a search naming the first new name of the latest result;
    else (3) an answer naming the latest result's first new name (or just an answer), with a -0.2 item
    against a repeated query while searches remain. Positive weights sum to 1."""
    queries = parse_trajectory(history).queries
    results = tool_outputs(history)
    searches_left = max(tool_calls, len(queries)) < max_tool_calls
    ent_union = set().union(*entity_tokens(question))

    def queried(name: str) -> bool:
        return any(content_tokens(name) <= content_tokens(q) for q in queries)

    latest = _DOC_HEADER.sub(" ", results[-1]) if results else ""  # "Doc 1 (Title: X)" is not a name
    new_names = [n for n in name_runs(latest)
                 if content_tokens(n) and not content_tokens(n) <= ent_union and not queried(n)]
    unsearched = [e for e in question_entities(question) if content_tokens(e) and not queried(e)]
    bridge_hops = sum(not (content_tokens(q) & ent_union) for q in queries)
    target = None
    if searches_left and unsearched:
        target = unsearched[0]
    elif searches_left and new_names and bridge_hops < len(_BRIDGE.findall(question)):
        target = new_names[0]
    if target is not None:
        items = (RubricItem(0.6, f"query names: {target}"), RubricItem(0.2, "searches"),
                 RubricItem(0.2, "query is new"))  # an off-target search scores 0.4: it fails tau = 0.5
        return StepRubric(items, f"search for {target}")
    items = ((RubricItem(0.6, "answers"), RubricItem(0.4, f"answer names: {new_names[0]}")) if new_names
             else (RubricItem(1.0, "answers"),))
    if searches_left:
        items += (RubricItem(-0.2, "query repeats"),)
    return StepRubric(items, f"answer with {new_names[0]}" if new_names else "answer from the evidence")


def step_verify(history: str, action: str, rubric: StepRubric) -> StepVerdict:
    """The verifier as a HEURISTIC: each item read from the action (``step_condition_met``; a negative item's
    verdict is whether its flaw is present); feedback "Unmet: ..." lists the positive items not met and the
    negative ones present, "" when none."""
    earlier = parse_trajectory(history).queries
    met = tuple(step_condition_met(it.condition, action, earlier) for it in rubric.items)
    unmet = [it.condition for it, m in zip(rubric.items, met, strict=True) if m != (it.weight >= 0)]
    return StepVerdict(met, f"Unmet: {'; '.join(unmet)}" if unmet else "")


def rank_actions(question: str, golds: Sequence[str] | None, history: str, shown: Sequence[str]) -> list[str]:
    """The expert ranking as a HEURISTIC: each candidate's ARCO ``step_criteria`` scores summed (no result
    yet), best first, as the shown labels; ties keep the shown order. An answer is judged against the golds when
    they are shown (``guidance.rank_golds``, arbor's); without them (Co-ReAct §3.1: no answer key) by the evidence
    so far: +1 when a result in the history holds it, -1 when none does."""
    earlier = parse_trajectory(history).queries
    evidence = tool_outputs(history)

    def total(action: str) -> float:
        crit = step_criteria(question, golds or [], action, "", earlier)
        answer = parse_trajectory(action).answer
        if not golds and answer is not None:
            crit[0] = ("The answer is held by a result so far",
                       1.0 if any(contains_phrase(r, answer) for r in evidence) else -1.0)
        return sum(v for _, v in crit)

    score = [total(a) for a in shown]
    best_first = sorted(range(len(shown)), key=lambda j: -score[j])
    return [RANK_LABELS[j] for j in best_first]
