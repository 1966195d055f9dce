"""Guided SFT rows: copies of gold rows that read Co-ReAct's placed step rubrics.

A policy SFT-trained on unguided trajectories has never seen text after the results of a ``<result>`` block, nor
after the question; guided inference puts the step rubric exactly there (``AgentLoop.place_guidance``), so the
guided turn starts from a context the policy has never been trained on. RubricEM's reference block had the same
problem and the same cure (``tasks.reflection.reflection_sft_rows``). ``sft.guided`` copies a seeded share of the
clean gold rows and places, before each turn that may still search, the rubric the ``rules`` writer gives at that
branching point (``heuristics.step_rubric``: no gold knowledge), in the words and place guided inference uses
(``guidance_text``: after the question, or inside the last observation before its closing tag). A share of the
guided steps (``retry_share``) shows the retry instead: the same rubric with the unmet items and the verifier's
feedback of a failed first attempt (a repeat of the previous query, read by ``heuristics.step_verify``), as §3.3's
one retry sees it. The gold action follows either way; the guidance is context, never a training target
(observations and the prompt are loss-masked).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from arbor.config.guidance import GuidanceConfig
from arbor.format import TagProtocol, sanitize_tool_text
from arbor.seeding import derive_seed
from arbor.tasks.methods.coreact import heuristics
from arbor.tasks.methods.coreact.equations import passes, verification_score
from arbor.tasks.methods.coreact.guidance import guidance_text, retry_text
from arbor.types import StepVerdict

RETRY_SHARE = 1 / 3  # guided steps (after the first search) shown as a retry with the verifier's feedback


def place_after_question(question: str, text: str) -> str:
    """The user message with guidance after the question (``place_guidance`` before the first turn)."""
    return f"{question}\n\n{text}"


def place_in_observation(block: str, text: str, protocol: TagProtocol) -> str:
    """An observation block with guidance before its closing tag (``place_guidance`` after a turn)."""
    close = block.rfind(protocol.result_close)
    return f"{block[:close].rstrip()}\n\n{text}\n{block[close:]}" if close != -1 else f"{block}{text}"


def guided_copy(question: str, response: str, protocol: TagProtocol, max_searches: int, guidance: GuidanceConfig,
                rng: random.Random, retry_share: float = RETRY_SHARE) -> tuple[str, str, list[bool]]:
    """(question, response, agrees) of one gold row with a rubric placed before each turn made while searches remain;
    ``agrees[j]``: whether the gold action of guided turn j passes its rubric (score > tau, ``step_verify``)."""
    segments = protocol.observation_re.split(response)  # policy turns at even indices, observations at odd
    turns = segments[0::2]
    asked = question  # the writer and the verifier read the question, never the guidance placed after it
    agrees: list[bool] = []
    for j, action in enumerate(turns):
        if j >= max_searches:  # no search left: the answer step gets no rubric
            break
        history = "".join(segments[: 2 * j])  # what the agent did and saw before turn j (no guidance in it)
        rubric = heuristics.step_rubric(asked, history, j, max_searches)
        verdict = heuristics.step_verify(history, action, rubric)
        weights = [it.weight for it in rubric.items]
        agrees.append(passes(verification_score(weights, verdict.satisfied), guidance.tau))
        text = guidance_text(rubric)
        if j > 0 and rng.random() < retry_share:
            failed = _failed_attempt(history, turns[j - 1], rubric, weights, guidance.tau)
            if failed is not None:
                text = retry_text(guidance, rubric, failed)
        text = sanitize_tool_text(text, protocol).strip()
        if j == 0:
            question = place_after_question(question, text)
        else:
            segments[2 * j - 1] = place_in_observation(segments[2 * j - 1], text, protocol)
    return question, "".join(segments), agrees


def _failed_attempt(history: str, previous: str, rubric: Any, weights: Sequence[float],
                    tau: float) -> StepVerdict | None:
    """The verifier's verdict on a first attempt that repeats the previous turn (its query again), when it fails."""
    verdict = heuristics.step_verify(history, previous, rubric)
    return None if passes(verification_score(list(weights), verdict.satisfied), tau) else verdict


def guided_sft_rows(rows: Sequence[dict[str, Any]], share: float, seed: int, protocol: TagProtocol,
                    max_searches: int, guidance: GuidanceConfig) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Guided copies of a seeded ``share`` of the clean gold rows (``flaw`` absent or ``none``; RubricEM's reflection
    and reference rows are left out), and their figures: rows copied, guided steps, and the share of guided steps whose
    gold action passes its rubric (where the writer and the gold path agree)."""
    rng = random.Random(derive_seed(seed, "coreact-guided-sft"))
    out: list[dict[str, Any]] = []
    agree: list[bool] = []
    seen: set[Any] = set()
    for r in rows:
        first = r.get("question_id") not in seen  # a later row of the same question: a reference-block copy
        seen.add(r.get("question_id"))
        if not first or r.get("system") or r.get("flaw", "none") != "none" or rng.random() >= share:
            continue
        question, response, agrees = guided_copy(r["question"], r["response"], protocol, max_searches, guidance, rng)
        if not agrees:
            continue
        out.append({**r, "question": question, "response": response, "guided": True})
        agree += agrees
    figures = {"rows": float(len(out)), "guided_steps": float(len(agree)),
               "gold_passes_rubric": sum(agree) / len(agree) if agree else float("nan")}
    return out, figures
