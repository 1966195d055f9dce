"""A user's judge in one class (docs/plugins.md): the offline rules judge, but an answer that contains a gold
alias (or is contained in one) counts as correct, e.g. "Ada Lovelace" for the gold "Lovelace".

    arbor eval CHECKPOINT judge.backend=examples.lenient_judge:LenientJudge

Every role the judge plays (induction, consolidation, pairwise, accuracy, RaR) is a coroutine of
``arbor.llm.Judge``; a plug-in subclasses it, or one of the shipped judges and overrides what it changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from arbor.llm import CallContext, JudgeOutcome
from arbor.llm.rules import RulesJudge
from arbor.reward import normalize_answer


class LenientJudge(RulesJudge):
    backend = "lenient-rules"

    async def accuracy(self, question: str, golds: Sequence[str], prediction: str | None, *,
                       ctx: CallContext | None = None) -> JudgeOutcome[bool]:
        strict = await super().accuracy(question, golds, prediction, ctx=ctx)
        pred = normalize_answer(prediction or "")
        near = bool(pred) and any(g and (g in pred or pred in g) for g in map(normalize_answer, golds))
        return replace(strict, value=bool(strict.value) or near)
