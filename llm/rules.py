"""``rules`` judge backend: offline, deterministic, and a HEURISTIC, not a language model.

It exists so the whole pipeline runs offline and in CI with real statistics. It knows no role: it is the sum of
the roles' heuristics, each declared with its role by the method that asks it (``Role.heuristic``: ARBOR's
process features in ``tasks/methods/arbor/heuristics.py``, RubricEM's stage features, ARCO's step criteria,
Co-ReAct's step-rubric language, ...). Every heuristic reads tags and counts (``llm.reading``), never meaning: a
trajectory can game it, and its rubrics are only as good as its features.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from arbor.llm.base import CallContext, Judge, JudgeOutcome, Q, Refusal, Role, T

PROMPT_VERSION = "rules.v1"


def _key(role: str, *parts: Any) -> str:
    return hashlib.sha256(repr((PROMPT_VERSION, role, parts)).encode()).hexdigest()


class RulesJudge(Judge):
    """The offline backend: every role answered by its declared heuristic (``Role.heuristic``), one ledger row a
    call (model "rules", key: the role's ``identity``, no tokens, no cost)."""

    backend = "rules"

    async def _answer(self, role: Role[Q, T], request: Q, ctx: CallContext | None) -> JudgeOutcome[T]:
        t0 = time.perf_counter()
        key = _key(role.name, *role.identity(request))
        try:
            value, error = role.heuristic(request, self.cfg), None
        except Refusal as e:
            value, error = None, str(e)
        self._record(ctx, role=role.name, model="rules", prompt_version=PROMPT_VERSION, cache_key=key,
                     prompt_hash=key[:16], latency_s=time.perf_counter() - t0, prompt_tokens=0, completion_tokens=0,
                     cost_usd=0.0, cache_hit=False, attempts=1, error=error, attempt_errors=[error],
                     refusal=error)
        return JudgeOutcome(value, error, 1, False)
