"""Versioned prompt files and their rendering into chat messages (App. E): the machinery every judge role uses.

A method keeps its prompt files next to its roles (``tasks/methods/<m>/prompts/<name>.v<N>.md``) and registers the
folder with :func:`register_prompts` when its roles are declared; a version (the file stem, e.g. ``pairwise.v1``)
names one file, and goes into the cache key. A prompt file holds a ``=== system ===`` and a ``=== user ===``
section with ``{{placeholders}}``. Every value that comes from data (question, trajectories, rubric text) is escaped
with :func:`llm.text.escape_block` so it cannot open or close the prompt's blocks, and substitution is a single pass
(a value containing ``{{x}}`` is never expanded).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path

from arbor.llm.text import compact_trajectory, escape_block, estimate_tokens
from arbor.types import Trajectory

PROMPT_FILES: dict[str, Path] = {}  # prompt version -> its file, filled by register_prompts
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
Messages = list[dict[str, str]]


def register_prompts(folder: Path | str) -> None:
    """Make every prompt file ``<name>.v<N>.md`` of ``folder`` (a method's ``prompts/``) loadable by its version.
    A version already registered from another file is a ValueError (two methods cannot share a name)."""
    for path in sorted(Path(folder).glob("*.md")):
        known = PROMPT_FILES.get(path.stem)
        if known is not None and known.resolve() != path.resolve():
            raise ValueError(f"prompt version {path.stem!r}: both {known} and {path}")
        PROMPT_FILES[path.stem] = path


def prompt_file(version: str) -> Path:
    """The file of a registered prompt version (KeyError naming the registered ones)."""
    try:
        return PROMPT_FILES[version]
    except KeyError:
        raise KeyError(f"no prompt file {version!r}; registered: {', '.join(sorted(PROMPT_FILES))}") from None


@cache
def load_prompt(version: str) -> tuple[str, str]:
    """(system, user) templates of one prompt version."""
    path = prompt_file(version)
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


def golds_block(golds: Sequence[str] | None) -> str:
    """The reference answers as one escaped line (``(not provided)`` without them)."""
    return escape_block(" | ".join(golds)) if golds else "(not provided)"


def trajectory_block(t: Trajectory, max_tokens: int) -> str:
    """A trajectory's text compacted to ``max_tokens`` and escaped."""
    return escape_block(compact_trajectory(t.text, max_tokens))


RETRY_REPLY_CHARS = 1500  # how much of an unusable reply a retry shows back to the judge


def retry_messages(messages: Messages, reply: str, problem: str, truncated: bool) -> Messages:
    """A retry that is not a copy of the failed call: the original conversation, the judge's
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
