"""Versioned prompt files (``llm/prompts/<name>.v<N>.md``) and their rendering into chat messages (App. E).

A prompt file holds a ``=== system ===`` and a ``=== user ===`` section with ``{{placeholders}}``. Every value
that comes from data (question, trajectories, rubric text) is escaped with :func:`llm.text.escape_block` so it
cannot open or close the prompt's blocks, and substitution is a single pass (a value containing ``{{x}}`` is
never expanded). The prompt version (the file stem, e.g. ``pairwise.v1``) goes into the cache key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path

from arbor.llm.base import RANK_LABELS
from arbor.llm.text import compact_trajectory, escape_block, estimate_tokens
from arbor.tasks.induction import contrast_pairs, unlabeled_members
from arbor.types import Rubric, RubricDraft, RubricGrade, StageRubric, StepRubric, Trajectory

PROMPT_DIR = Path(__file__).resolve().parent / "prompts"
VERSIONS = {
    "induction": "induction.v1",
    "induction_unlabeled": "induction_unlabeled.v1",
    "consolidation": "consolidation.v1",
    "pairwise": "pairwise.v1",
    "accuracy": "accuracy.v2",
    "rar_rubrics": "rar_rubrics.v1",
    "rar_rate": "rar_rate.v1",
    "stage_rubrics": "stage_rubrics.v1",  # RubricEM App. C.2
    "stage_grades": "stage_grades.v1",  # RubricEM App. C.3
    "reflection_grades": "reflection_grades.v1",  # RubricEM App. D.6.2
    "step_labels": "step_labels.v1",  # ARCO's warm-up teacher
    "step_rubric": "step_rubric.v1",  # Co-ReAct §3.2 (prompt-only rubric writer)
    "step_verify": "step_verify.v1",  # Co-ReAct §3.3 verifier
    "rank_actions": "rank_actions.v2",  # Co-ReAct §3.1, App. A: rationale, then the ranking as the final answer
    "rank_actions_json": "rank_actions.v1",  # arbor's bare-JSON ranking (guidance.rank_judges[i].rationale=false)
}
STAGE_LABELS = {1: "Plan", 2: "Research", 3: "Review", 4: "Answer"}
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
Messages = list[dict[str, str]]


@cache
def load_prompt(version: str) -> tuple[str, str]:
    """(system, user) templates of one prompt version."""
    path = PROMPT_DIR / f"{version}.md"
    text = path.read_text(encoding="utf-8")
    m = re.fullmatch(r"=== system ===\n(.*?)\n=== user ===\n(.*)", text, re.S)
    if m is None:
        raise ValueError(f"{path}:1: a prompt file needs '=== system ===' then '=== user ===' sections")
    return m.group(1).rstrip("\n"), m.group(2).rstrip("\n")


def _fill(template: str, values: Mapping[str, str], version: str) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in values:
            raise KeyError(f"prompt {version}: no value for {{{{{m.group(1)}}}}}")
        return values[m.group(1)]

    return _PLACEHOLDER.sub(sub, template)


def render(version: str, **values: str) -> Messages:
    """Chat messages of a prompt version with *already escaped* values."""
    system, user = load_prompt(version)
    return [
        {"role": "system", "content": _fill(system, values, version)},
        {"role": "user", "content": _fill(user, values, version)},
    ]


def _golds(golds: Sequence[str] | None) -> str:
    return escape_block(" | ".join(golds)) if golds else "(not provided)"


def _traj(t: Trajectory, max_tokens: int) -> str:
    return escape_block(compact_trajectory(t.text, max_tokens))


def _rubric_list(rubrics: Sequence[Rubric | RubricDraft]) -> str:
    if not rubrics:
        return "(none)"
    return "\n".join(
        f"- {escape_block(r.title)}\n  DO: {escape_block(r.description)}\n  AVOID: {escape_block(r.counter_description)}"
        for r in rubrics
    )


def induction_messages(question: str, golds: Sequence[str] | None, trajectories: Sequence[Trajectory],
                       anchors: Mapping[str, object], existing: Sequence[Rubric | RubricDraft],
                       max_tokens: int) -> tuple[str, Messages]:
    """E.1 contrastive induction, or its unlabeled variant (App. A.1) when ``anchors['mode'] == 'unlabeled'``."""
    common = {"question": escape_block(question), "ground_truth": _golds(golds), "existing": _rubric_list(existing)}
    if anchors.get("mode") == "unlabeled":
        version = VERSIONS["induction_unlabeled"]
        members = unlabeled_members([t.format_valid for t in trajectories]) or list(range(len(trajectories)))
        blocks = [f'<trajectory index="{k + 1}">\n{_traj(trajectories[i], max_tokens)}\n</trajectory>'
                  for k, i in enumerate(members)]
        return version, render(version, trajectories="\n".join(blocks), **common)
    version = VERSIONS["induction"]
    pairs = contrast_pairs(dict(anchors))
    if not pairs or any(not isinstance(i, int) for p in pairs for i in p):
        raise ValueError(f"anchors {dict(anchors)}: no contrast pair to induce from")
    names = ["best vs worst", "best vs hard negative"] if len(pairs) == 2 else ["best vs hard negative"]
    blocks = [
        f'<pair index="{k + 1}" kind="{names[k]}">\n<higher>\n{_traj(trajectories[a], max_tokens)}\n</higher>\n'
        f"<lower>\n{_traj(trajectories[b], max_tokens)}\n</lower>\n</pair>"
        for k, (a, b) in enumerate(pairs)
    ]
    return version, render(version, pairs="\n".join(blocks), **common)


def consolidation_messages(candidates_by_query: Mapping[str, Sequence[Rubric | RubricDraft]],
                           existing: Sequence[Rubric | RubricDraft]) -> tuple[str, Messages]:
    """E.2: existing common standards with DO / AVOID, candidates grouped by the query they came from."""
    groups = [
        f"Query {i + 1}: {escape_block(q)}\n{_rubric_list(drafts)}"
        for i, (q, drafts) in enumerate(candidates_by_query.items())
    ]
    version = VERSIONS["consolidation"]
    return version, render(version, existing=_rubric_list(existing), candidates="\n".join(groups))


def pairwise_messages(question: str, shown_a: Trajectory, shown_b: Trajectory, rubric: Rubric | RubricDraft,
                      max_tokens: int) -> tuple[str, Messages]:
    """E.3: ``shown_a`` is whatever the caller decided to present as Response A (after any swap)."""
    version = VERSIONS["pairwise"]
    return version, render(
        version, question=escape_block(question), response_a=_traj(shown_a, max_tokens),
        response_b=_traj(shown_b, max_tokens), description=escape_block(rubric.description),
        counter_description=escape_block(rubric.counter_description),
    )


def accuracy_messages(question: str, golds: Sequence[str], prediction: str | None) -> tuple[str, Messages]:
    """E.4: any golden alias counts; the reply leads with the literal word Correct or Incorrect (v2: verdict first)."""
    version = VERSIONS["accuracy"]
    return version, render(version, question=escape_block(question), golds=_golds(golds),
                           prediction=escape_block(prediction or "(no answer)"))


def rar_rubrics_messages(question: str, golds: Sequence[str]) -> tuple[str, Messages]:
    """RaR baseline (C.3): 5-10 reference-conditioned items from the question and reference answer only."""
    version = VERSIONS["rar_rubrics"]
    return version, render(version, question=escape_block(question), golds=_golds(golds))


def rar_rate_messages(question: str, trajectory: Trajectory, items: Sequence[str], max_tokens: int
                      ) -> tuple[str, Messages]:
    """RaR baseline (C.3): one holistic 1-10 rating of a full trajectory under the query's items."""
    version = VERSIONS["rar_rate"]
    listed = "\n".join(f"{i + 1}. {escape_block(it)}" for i, it in enumerate(items))
    return version, render(version, question=escape_block(question), items=listed,
                           trajectory=_traj(trajectory, max_tokens))


# ---- RubricEM roles ----------------------------------------------------------------------------------------------
def _stage_rubric_line(r: StageRubric) -> str:
    """``[Stage 2 Research | NEGATIVE | weight 2] Title: description`` (escaped)."""
    kind = "POSITIVE" if r.polarity >= 0 else "NEGATIVE"
    return (f"[Stage {r.stage} {STAGE_LABELS.get(r.stage, '?')} | {kind} | weight {r.weight}] "
            f"{escape_block(r.title)}: {escape_block(r.description)}")


def _existing_by_stage(existing: Sequence[StageRubric]) -> str:
    if not existing:
        return "(none)"
    lines = []
    for stage, label in STAGE_LABELS.items():
        mine = [r for r in existing if r.stage == stage]
        if mine:
            lines.append(f"Stage {stage} ({label}):")
            lines += [f"- {_stage_rubric_line(r)}" for r in mine]
    lines += [f"- {_stage_rubric_line(r)}" for r in existing if r.stage not in STAGE_LABELS]
    return "\n".join(lines)


def stage_rubrics_messages(question: str, golds: Sequence[str] | None, trajectories: Sequence[Trajectory],
                           existing: Sequence[StageRubric], max_tokens: int) -> tuple[str, Messages]:
    """RubricEM C.2: every trajectory of the group (numbered, each compacted to ``max_tokens``) and the question's
    current stage rubrics; the reply holds new positive / negative rubrics by stage."""
    version = VERSIONS["stage_rubrics"]
    blocks = [f'<trajectory index="{i + 1}">\n{_traj(t, max_tokens)}\n</trajectory>' for i, t in enumerate(trajectories)]
    return version, render(version, question=escape_block(question), ground_truth=_golds(golds),
                           trajectories="\n".join(blocks), existing=_existing_by_stage(existing))


def stage_grades_messages(question: str, golds: Sequence[str] | None, trajectory: Trajectory,
                          rubrics: Sequence[StageRubric], max_tokens: int) -> tuple[str, Messages]:
    """RubricEM C.3: one trajectory and its question's rubrics, numbered from 1 in the caller's order (the reply's
    indices refer to these numbers)."""
    version = VERSIONS["stage_grades"]
    listed = "\n".join(f"{i + 1}. {_stage_rubric_line(r)}" for i, r in enumerate(rubrics))
    return version, render(version, question=escape_block(question), ground_truth=_golds(golds),
                           trajectory=_traj(trajectory, max_tokens), rubrics=listed)


def _grade_meaning(r: StageRubric, score: int) -> str:
    if r.polarity >= 0:
        return {2: "quality fully shown", 1: "quality partly shown", 0: "quality absent"}.get(score, "?")
    return {2: "flaw fully present", 1: "flaw partly present", 0: "flaw avoided"}.get(score, "?")


def reflection_grades_messages(question: str, golds: Sequence[str] | None, trajectory: Trajectory,
                               graded: Sequence[tuple[StageRubric, RubricGrade]], candidates: Sequence[str],
                               max_tokens: int) -> tuple[str, Messages]:
    """RubricEM D.6.2: the graded trajectory with the evaluator's grades and justifications (privileged context),
    then the reflection candidates, numbered from 1 in the caller's order (each compacted to ``max_tokens``)."""
    version = VERSIONS["reflection_grades"]
    grades = "\n".join(
        f"{i + 1}. {_stage_rubric_line(r)}\n   score {g.score} ({_grade_meaning(r, g.score)}): "
        f"{escape_block(g.justification) or '(no justification)'}"
        for i, (r, g) in enumerate(graded)) or "(none)"
    blocks = [f'<candidate index="{i + 1}">\n{escape_block(compact_trajectory(c, max_tokens))}\n</candidate>'
              for i, c in enumerate(candidates)]
    return version, render(version, question=escape_block(question), ground_truth=_golds(golds),
                           trajectory=_traj(trajectory, max_tokens), grades=grades, candidates="\n".join(blocks))


def step_labels_messages(question: str, golds: Sequence[str] | None, trajectory: Trajectory,
                         steps: Sequence[tuple[str, str]], k: int, max_tokens: int) -> tuple[str, Messages]:
    """ARCO's teacher: the whole trajectory's steps, numbered from 1 (each action with the result after it), the
    outcome reward, and how many criteria to write per step."""
    version = VERSIONS["step_labels"]
    listed = "\n".join(f"Step {i + 1}:\n  action: {escape_block(compact_trajectory(a, max_tokens // 2))}\n"
                       f"  result: {escape_block(compact_trajectory(o, max_tokens // 2)) or '(none)'}"
                       for i, (a, o) in enumerate(steps))
    return version, render(version, question=escape_block(question), ground_truth=_golds(golds),
                           steps=listed, n_steps=str(len(steps)), k=str(k),
                           outcome=f"{trajectory.base_reward:.3f}")



# ---- Co-ReAct roles (its §3.1-3.3) -------------------------------------------------------------------------------
def _history(history: str, max_tokens: int) -> str:
    return escape_block(compact_trajectory(history, max_tokens)) if history.strip() else "(nothing yet)"


def _action(action: str, max_tokens: int) -> str:
    return escape_block(compact_trajectory(action, max_tokens)) or "(empty)"


def _phase(tool_calls: int, max_tool_calls: int) -> str:
    """Early (no search yet), late (at most one search left) or middle: the rubric writer's phase hint."""
    if tool_calls <= 0:
        return "early - no search yet: the next action searches, broadly; do not recommend answering."
    if tool_calls >= max_tool_calls - 1:
        return "late - at most one search left: answer if the evidence so far suffices."
    return "middle - searches remain: target the most important fact still missing."


def step_rubric_messages(question: str, history: str, tool_calls: int, max_tool_calls: int,
                         max_tokens: int) -> tuple[str, Messages]:
    """Co-ReAct §3.2: the question, the agent's history so far (compacted to ``max_tokens``), the searches made
    out of the budget and the phase they imply."""
    version = VERSIONS["step_rubric"]
    return version, render(version, question=escape_block(question), history=_history(history, max_tokens),
                           tool_calls=str(tool_calls), max_tool_calls=str(max_tool_calls),
                           phase=_phase(tool_calls, max_tool_calls))


def step_verify_messages(question: str, history: str, action: str, rubric: StepRubric,
                         max_tokens: int) -> tuple[str, Messages]:
    """Co-ReAct §3.3: the history, the proposed action and the rubric's items numbered from 1 in rubric order
    (``1. [0.4] condition``; the reply's verdicts follow these numbers)."""
    version = VERSIONS["step_verify"]
    items = "\n".join(f"{i + 1}. [{it.weight:g}] {escape_block(it.condition)}" for i, it in enumerate(rubric.items))
    return version, render(version, question=escape_block(question), history=_history(history, max_tokens),
                           action=_action(action, max_tokens // 2), items=items, n_items=str(len(rubric.items)))


def rank_actions_messages(question: str, golds: Sequence[str] | None, history: str, shown: Sequence[str],
                          max_tokens: int, rationale: bool = True) -> tuple[str, Messages]:
    """Co-ReAct §3.1: the history and the candidates in shown order, ``shown[j]`` under ``RANK_LABELS[j]`` (each
    compacted to ``max_tokens // 2``). ``rationale`` (App. A): the judge reasons first and ends with a "Final
    answer:" holding the ranking (v2); otherwise it replies with the JSON ranking only (v1)."""
    version = VERSIONS["rank_actions" if rationale else "rank_actions_json"]
    labels = RANK_LABELS[: len(shown)]
    blocks = [f'<candidate label="{lab}">\n{_action(a, max_tokens // 2)}\n</candidate>'
              for lab, a in zip(labels, shown, strict=True)]
    return version, render(version, question=escape_block(question), ground_truth=_golds(golds),
                           history=_history(history, max_tokens), candidates="\n".join(blocks),
                           labels=", ".join(labels))


RETRY_REPLY_CHARS = 1500  # how much of an unusable reply a retry shows back to the judge


def retry_messages(messages: Messages, reply: str, problem: str, truncated: bool) -> Messages:
    """A retry that is not a copy of the failed call (issue 31 item 2): the original conversation, the judge's
    unusable reply (cut to ``RETRY_REPLY_CHARS``) and what was wrong with it. Always built from the original
    messages, so a third attempt shows the second reply only. The cache key stays the original call's."""
    shown = reply if len(reply) <= RETRY_REPLY_CHARS else reply[:RETRY_REPLY_CHARS] + " [...]"
    if truncated:
        note = ("Your reply reached the length limit before it was complete, so it cannot be used. Answer again, "
                "shorter: only what the instructions ask for, in their format, with one short sentence wherever "
                "they ask for text.")
    else:
        note = (f"Your reply cannot be used: {problem}. Answer again with only what the instructions ask for, in "
                "exactly their format, and nothing else.")
    return [*messages, {"role": "assistant", "content": shown or "(empty)"}, {"role": "user", "content": note}]


REQUEST_TOKENS_PER_TIMEOUT = 2048  # judge.timeout_s covers a request of this many tokens in and out
MIN_TEXT_TOKENS = 128  # below this a compacted trajectory is its skeleton only


def message_tokens(messages: Messages) -> int:
    """A request's prompt size as compaction counts it (``llm.text.estimate_tokens``: chars / 4)."""
    return sum(estimate_tokens(m["content"]) for m in messages)


def request_timeout(timeout_s: float, messages: Messages, max_tokens: int) -> float:
    """The timeout of one request: ``timeout_s`` up to ``REQUEST_TOKENS_PER_TIMEOUT`` tokens in and out
    (prompt ~4 characters a token), growing linearly past it (prefill and decode both scale with length)."""
    tokens = sum(len(m["content"]) for m in messages) / 4 + max_tokens
    return timeout_s * max(1.0, tokens / REQUEST_TOKENS_PER_TIMEOUT)
