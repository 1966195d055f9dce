"""A user's judge in one class (docs/plugins.md): the offline rules judge, but an answer that contains a gold
alias (or is contained in one) counts as correct, e.g. "Ada Lovelace" for the gold "Lovelace".

    arbor eval CHECKPOINT judge.backend=examples.lenient_judge:LenientJudge

Every role the judge plays (induction, consolidation, pairwise, accuracy, RaR, ...) goes through one coroutine,
``arbor.llm.Judge.ask(role, **request)``; a plug-in subclasses a shipped judge and changes the roles it wants.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from arbor.llm import CallContext, JudgeOutcome, Role
from arbor.llm.rules import RulesJudge
from arbor.reward import normalize_answer


class LenientJudge(RulesJudge):
    backend = "lenient-rules"

    async def ask(self, role: Role[Any, Any] | str, /, *, ctx: CallContext | None = None,
                  **fields: Any) -> JudgeOutcome[Any]:
        strict = await super().ask(role, ctx=ctx, **fields)
        if (role if isinstance(role, str) else role.name) != "accuracy":
            return strict
        prediction, golds = fields["prediction"], fields["golds"]
        pred = normalize_answer(prediction or "")
        near = bool(pred) and any(g and (g in pred or pred in g) for g in map(normalize_answer, golds))
        return replace(strict, value=bool(strict.value) or near)
