"""A user's judging method in one file: a judge role of its own and a stage that asks it.

GRPO plus an evidence check: an answer the agent's own retrieved results support is worth a little more than one
they do not (a guess that happens to match the gold earns the same exact-match reward as a grounded answer).

    rollout ─► evidence ─► shape ─► train

    evidence    for each trajectory that gave an answer, the judge role ``evidence_check`` is asked whether one of
                its retrieved results supports that answer ({"supported": bool, "quote": str}); one row per
                trajectory in the table ``evidence_checks`` (declared below, with the view ``evidence_by_step``),
                the calls in ``judge_calls``
    shape       R_total = R_base + b_i, b_i = BETA * (s_i - mean_j s_j) over the group, s_i = 1 for a supported
                answer (``evidence_bonus``: centred like eq. 3; like eq. 4 a format-invalid response is unshaped)

The role is declared once, here: its request, reply schema and parser, prompt (``prompts/evidence_check.v1.md``)
and the offline ``rules`` judge's heuristic (supported when the answer's words occur in a result). Nothing in arbor
knows it; the OpenAI-compatible backend renders, sends and parses it like any shipped role.

    arbor train --set run.method=examples.evidence_check:EvidenceCheckGRPO
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pyarrow as pa

from arbor.llm import CallContext, JudgeOutcome, Role, register
from arbor.llm import prompts as prompt_files
from arbor.llm.base import Messages
from arbor.llm.parse import SENTENCE, Strict, parse_json, sent_cap
from arbor.llm.reading import contains_phrase
from arbor.llm.text import escape_block, parse_trajectory
from arbor.storage.schemas import BOOL, I64, STR, TableSet, col, key
from arbor.tasks.methods.base import ROLLOUT, SHAPE, TRAIN, Rows, Stage, StageHook, StepResources
from arbor.tasks.methods.grpo import GRPO
from arbor.tasks.stage_store import fault_point
from arbor.types import Trajectory

HERE = Path(__file__).parent
BETA = 0.1  # the bonus scale: a supported answer in a group where half are supported gains BETA / 2
VERSION = "evidence_check.v1"  # the prompt file's stem; it is part of every call's cache key
prompt_files.register_prompts(HERE / "prompts")


# ---- the judge role: request, reply schema, prompt, parser, offline heuristic ------------------------------------
@dataclass(frozen=True)
class EvidenceRequest:
    question: str
    answer: str
    trajectory: Trajectory


class Evidence(Strict):
    """The reply (and the value the role answers with, from either backend)."""

    supported: bool
    quote: str = sent_cap(SENTENCE)


def evidence_messages(q: EvidenceRequest, budget: int) -> tuple[str, Messages]:
    """The prompt, with the trajectory compacted to ``budget`` tokens (results are elided first)."""
    return VERSION, prompt_files.render(
        VERSION,
        question=escape_block(q.question),
        answer=escape_block(q.answer),
        trajectory=prompt_files.trajectory_block(q.trajectory, budget),
    )


def supporting_quote(results: Sequence[str], answer: str) -> str | None:
    """The first sentence of a retrieved result that contains the answer's words as a phrase (a whole result when
    no single sentence does); None when no result contains them."""
    for r in results:
        if contains_phrase(r, answer):
            sentences = re.split(r"(?<=[.!?])\s+", r.strip())
            return next((s for s in sentences if contains_phrase(s, answer)), r.strip())[:SENTENCE]
    return None


def evidence_heuristic(q: EvidenceRequest) -> Evidence:
    """The rules judge's answer: supported when some result of the trajectory contains the answer. It reads words,
    not meaning: a result that names the answer while saying something else about it still counts."""
    quote = supporting_quote(parse_trajectory(q.trajectory.text).results, q.answer)
    return Evidence(supported=quote is not None, quote=quote or "")


EVIDENCE_CHECK: Role[EvidenceRequest, Evidence] = register(
    Role(
        name="evidence_check",
        request=EvidenceRequest,
        render=evidence_messages,
        parse=lambda text, q: parse_json(text, Evidence),  # type: ignore[arg-type,return-value]
        schema=Evidence,
        heuristic=lambda q, cfg: evidence_heuristic(q),
        identity=lambda q: (q.question, q.answer, q.trajectory.text),
        texts=lambda q: 1,  # one compactable text (the trajectory) shares the judge's window
    )
)


# ---- the equation -------------------------------------------------------------------------------------------------
def evidence_bonus(
    supported: Sequence[bool | None], format_valid: Sequence[bool], beta: float = BETA
) -> list[float]:
    """b_i = beta * (s_i - mean_j s_j) over one group, s_i = 1 for a supported answer and 0 otherwise (no answer,
    unsupported, or a failed call); a format-invalid response gets 0, as in eq. 4. Centring (eq. 3) makes a group
    whose answers are all supported, or none, unshaped."""
    s = [1.0 if v else 0.0 for v in supported]
    m = sum(s) / len(s) if s else 0.0
    return [beta * (x - m) if ok else 0.0 for x, ok in zip(s, format_valid, strict=True)]


# ---- what the method stores -----------------------------------------------------------------------------------------
EVIDENCE_CHECKS = pa.schema(
    [
        key("run_id"),
        key("step", I64),
        key("traj_id"),
        col("group", I64),
        col("sample", I64),
        col("question_id", STR),
        col("answer", STR),
        col("asked", BOOL),
        col("supported", BOOL),
        col("quote", STR),
        col("judge_error", STR),
    ]
)


# ---- the method ---------------------------------------------------------------------------------------------------
class EvidenceCheckGRPO(GRPO):
    name = "grpo-evidence"
    tables = TableSet(
        owner="grpo-evidence",
        schemas={"evidence_checks": EVIDENCE_CHECKS},
        views=(HERE / "evidence_by_step.sql",),
    )
    stages: ClassVar[tuple[Stage, ...]] = (
        ROLLOUT,
        Stage("evidence", ("evidence_checks", "judge_calls")),
        SHAPE,
        TRAIN,
    )

    def stage_hooks(self) -> dict[str, StageHook]:
        return {"evidence": self.evidence, "shape": self.shape}

    def evidence(self, run: StepResources, step: int, trajs: list[Trajectory]) -> dict[str, Rows]:
        """One verdict per answered trajectory. Groups are asked one after another, each group's calls at once:
        a SIGKILL drill stops between them, with the first group's answers already in the judge's cache."""
        groups = run.groups(trajs)

        async def ask(t: Trajectory) -> JudgeOutcome[Evidence] | None:
            if not t.answer:
                return None  # nothing to check: no call
            return await run.judge.ask(
                EVIDENCE_CHECK,
                question=t.question,
                answer=t.answer,
                trajectory=t,
                ctx=CallContext(run.run_id, step, "evidence", t.group),
            )

        async def ask_all() -> list[list[JudgeOutcome[Evidence] | None]]:
            out = []
            for n, g in enumerate(groups):
                if n == 1:
                    fault_point(step, "evidence", "mid")  # SIGKILL drills stop here
                out.append(await asyncio.gather(*[ask(t) for t in g]))
            return out

        rows: Rows = []
        for g, got in zip(groups, run.run_async(ask_all()), strict=True):
            for t, o in zip(g, got, strict=True):
                v = o.value if o is not None else None
                rows.append(
                    {
                        "step": step,
                        "traj_id": t.traj_id,
                        "group": t.group,
                        "sample": t.sample,
                        "question_id": t.question_id,
                        "answer": t.answer,
                        "asked": o is not None,
                        "supported": None if v is None else v.supported,
                        "quote": None if v is None else v.quote,
                        "judge_error": None if o is None else o.error,
                    }
                )
        return {"evidence_checks": rows, "judge_calls": run.judge_rows()}

    def shape(self, run: StepResources, step: int, trajs: list[Trajectory]) -> dict[str, Rows]:
        """GRPO's shaping (R_total = R_base), plus each group's ``evidence_bonus`` from the stored verdicts."""
        stored = run.store.load(step, "evidence", ("evidence_checks",))["evidence_checks"]
        supported = {r["traj_id"]: r["supported"] for r in stored}
        out = super().shape(run, step, trajs)
        rows: Rows = []
        for g in run.groups(trajs):
            bonus = evidence_bonus([supported[t.traj_id] for t in g], [t.format_valid for t in g])
            for t, b in zip(g, bonus, strict=True):
                t.shaped_reward = (t.base_reward if t.shaped_reward is None else t.shaped_reward) + b
                rows.append(t.to_row())
        return {**out, "trajectories": rows}
