"""Judge health from the call ledger: what became of a step's judge calls, per role, and when a role's
judge answered nothing at all.

Every ``judge_calls`` row ends in one of five outcomes (``call_outcome``):

- ``answered``: a reply that parsed and passed the answer filter, sent this step;
- ``cache_hit``: an answer from the response cache (or from an identical call in flight) — still an answer;
- ``failed``: no reply came back — a timeout, a stall, a refused connection, an error status after the retries
  (5xx, 429, 4xx), or anything a plug-in backend reports that is not a refusal;
- ``refused``: a reply came back and was no answer — it did not parse (``InvalidOutput``), was cut off
  (``Truncated``), or was hollow (``InvalidAnswer``: the template echoed, a loop); for the offline ``rules``
  backend, a request its heuristic cannot read (``Refusal``);
- ``skipped``: never sent (``CostCapExceeded``: the run's judge cost cap was reached).

A role whose calls of one step all failed (``judge.max_failed_share`` of them; default 1.0: all) ends the run before
the step commits (``check_outage``): a method without its judge is another method, and a run that went on would be
compared as if it had one. A role whose answers were refused above ``judge.warn_refused_share`` degrades the step,
visibly (``degraded_roles``). Pure functions over ledger rows; the SQL view ``judge_health`` computes the same
figures (tests/test_judge_health.py checks both against one hand-counted ledger).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REFUSED_ERRORS = {"InvalidAnswer": "hollow", "InvalidOutput": "unparseable", "Truncated": "truncated"}
SKIPPED_ERRORS = ("CostCapExceeded",)
DEFAULT_URL = "https://api.openai.com/v1"  # the OpenAI client's own default when no base_url is set

# the words of llm.answers.answer_problem's reasons -> a short name (when the rejection carries no ``reason``)
_REASON_WORDS = (("placeholder", "placeholder"), ("is empty", "empty"), ("copies the instructions", "echo"),
                 ("loop", "loop"), ("says the same", "repeat"))


def call_outcome(row: Mapping[str, Any]) -> str:
    """The outcome of one ``judge_calls`` row (module docstring)."""
    error = row.get("error")
    if error is None or error == "":
        return "cache_hit" if row.get("cache_hit") else "answered"
    kind = str(error).split(":", 1)[0]  # "InvalidOutput: not a permutation" (a plug-in's detail) is InvalidOutput
    if kind in REFUSED_ERRORS or row.get("backend") == "rules":
        return "refused"
    if kind in SKIPPED_ERRORS:
        return "skipped"
    return "failed"


def refusal_reason(row: Mapping[str, Any]) -> str:
    """Why a refused call was refused: its ``refusal`` (the filter's short reason), else its error's short name."""
    reason = row.get("refusal")
    if reason:
        return str(reason)
    error = str(row.get("error") or "")
    return REFUSED_ERRORS.get(error.split(":", 1)[0], error)


def short_reason(message: str) -> str:
    """A short name for an answer filter's reason sentence (``llm.answers.answer_problem``): ``placeholder``,
    ``empty``, ``echo``, ``loop``, ``repeat``, else ``hollow``."""
    text = message.lower()
    return next((name for words, name in _REASON_WORDS if words in text), "hollow")


@dataclass
class RoleHealth:
    """One role's calls of one step by outcome, its last transport error and its refusal reasons."""

    role: str
    counts: Counter[str] = field(default_factory=Counter)
    last_error: str | None = None
    reasons: Counter[str] = field(default_factory=Counter)

    @property
    def calls(self) -> int:
        return sum(self.counts.values())

    @property
    def sent(self) -> int:
        """Calls that asked the judge (answered, cached, failed or refused): the shares' denominator."""
        return self.calls - self.counts["skipped"]

    def share(self, outcome: str) -> float:
        return self.counts[outcome] / self.sent if self.sent else 0.0

    def top_reason(self) -> str | None:
        """The commonest refusal reason (ties: the first in alphabetical order)."""
        if not self.reasons:
            return None
        return min(self.reasons.items(), key=lambda kv: (-kv[1], kv[0]))[0]


def role_health(rows: Iterable[Mapping[str, Any]]) -> dict[str, RoleHealth]:
    """Per role (in first-seen order), the outcomes of ``rows`` (a step's ``judge_calls``)."""
    out: dict[str, RoleHealth] = {}
    for row in rows:
        role = str(row.get("role") or "?")
        h = out.setdefault(role, RoleHealth(role))
        outcome = call_outcome(row)
        h.counts[outcome] += 1
        if outcome == "failed":
            h.last_error = str(row["error"])
        elif outcome == "refused":
            h.reasons[refusal_reason(row)] += 1
    return out


def judged_groups(rows: Iterable[Mapping[str, Any]], groups: Iterable[int]) -> int:
    """How many of ``groups`` (the step's rollout groups) the judge answered about: at least one call with that
    ``group`` answered or cached (the share of the step's signal that a judge could shape)."""
    wanted = set(groups)
    return len({r["group"] for r in rows
                if r.get("group") in wanted and call_outcome(r) in ("answered", "cache_hit")})


def outage(health: Mapping[str, RoleHealth], max_failed_share: float) -> RoleHealth | None:
    """The first role whose failed share reached ``max_failed_share`` (at least one call failed), else None."""
    for h in health.values():
        if h.counts["failed"] and h.share("failed") >= max_failed_share:
            return h
    return None


def degraded_roles(health: Mapping[str, RoleHealth], warn_refused_share: float) -> list[RoleHealth]:
    """The roles whose refused share is above ``warn_refused_share``."""
    return [h for h in health.values() if h.counts["refused"] and h.share("refused") > warn_refused_share]


def public_url(url: str | None) -> str:
    """An endpoint as it may be shown: no user name or password, no query or fragment (a key can ride there)."""
    if not url:
        return DEFAULT_URL
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class JudgeUnreachable(RuntimeError):
    """A judge role answered none (or too few) of a step's calls: the step is not committed and the run ends,
    resumable once the judge is back."""

    def __init__(self, h: RoleHealth, url: str, step: int, stage: str) -> None:
        self.role, self.url, self.step, self.stage = h.role, url, step, stage
        self.last_error = h.last_error
        failed, sent = h.counts["failed"], h.sent
        what = f"all {sent}" if failed == sent else f"{failed} of {sent}"
        super().__init__(f"the judge of role {h.role!r} at {self.url} failed {what} of its calls at step {step} "
                         f"(stage {stage}), last error {h.last_error}; step {step} was not committed")


def check_outage(rows: Iterable[Mapping[str, Any]], max_failed_share: float, url_of: Callable[[str], str], step: int,
                 stage: str) -> None:
    """Raise ``JudgeUnreachable`` when a role of ``rows`` (the step's calls so far) failed ``max_failed_share`` of
    its calls; ``url_of(role)`` names the role's endpoint as it may be shown (``public_url``)."""
    down = outage(role_health(rows), max_failed_share)
    if down is not None:
        raise JudgeUnreachable(down, url_of(down.role), step, stage)
