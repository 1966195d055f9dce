"""Judge health in a step's console summary: one line per judge role whenever a call of the step failed
or was refused, the groups the judge answered about, and a WARNING for a role whose answers were mostly refused.
The figures are ``llm.health``'s, from the step's ``judge_calls`` rows; the ``steps`` row and the ``judge_health``
view hold the same."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from arbor.llm.health import RoleHealth, degraded_roles, role_health


def role_line(h: RoleHealth) -> str:
    """``judge    rar_rubrics 8 calls: 3 answered, 5 refused (hollow)``: the outcomes a role's calls came to
    (zero counts left out, answered always shown), the last error after the failed, the commonest reason after
    the refused."""
    c = h.counts
    parts = [f"{c['answered']} answered"]
    if c["cache_hit"]:
        parts.append(f"{c['cache_hit']} cached")
    if c["failed"]:
        parts.append(f"{c['failed']} failed ({h.last_error})")
    if c["refused"]:
        parts.append(f"{c['refused']} refused ({h.top_reason()})")
    if c["skipped"]:
        parts.append(f"{c['skipped']} skipped (cost cap)")
    return f"  {'judge':<8} {h.role} {h.calls} calls: " + ", ".join(parts)


def health_lines(calls: Sequence[Mapping[str, Any]], n_groups: int, judged: int) -> list[str]:
    """The step's judge-health lines: nothing when every call was answered (or skipped under the cost cap); else
    one ``role_line`` per role that had a failed or refused call, then the groups the judge answered about."""
    health = role_health(calls)
    troubled = [h for h in health.values() if h.counts["failed"] or h.counts["refused"]]
    if not troubled:
        return []
    return [*(role_line(h) for h in troubled), f"  {'judge':<8} groups judged {judged}/{n_groups}"]


def refusal_warnings(calls: Sequence[Mapping[str, Any]], warn_refused_share: float) -> list[str]:
    """``WARNING judge role ...``: one line per role whose refused share passed ``judge.warn_refused_share``
    (the step is marked degraded), naming the commonest refusal reason."""
    out = []
    for h in degraded_roles(role_health(calls), warn_refused_share):
        reason = h.top_reason()
        out.append(f"WARNING judge role {h.role}: {h.counts['refused']} of {h.sent} calls refused "
                   f"({h.share('refused'):.0%} > {warn_refused_share:.0%}), commonest reason {reason} "
                   f"({h.reasons[reason]}); the step is marked degraded")  # type: ignore[index]
    return out
