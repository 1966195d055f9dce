"""SFT data for the tiny CPU policy, synthesised from the offline training questions.

The paper warm-starts RL with SFT on the search-only subsets of Tool-Star and STILL (App. B.2). Offline, we write
trajectories in the same tag format from the offline *training* questions' gold supporting paragraphs::

    <think> what to look for </think>
    <search> a real query </search>                       <- the real search backend is queried
    <result> the backend's top-k passages </result>        <- formatted exactly as the agent loop does
    [ <think> what is still missing </think> <search> second hop </search> <result> ... </result> ]
    <think> the evidence </think>
    <answer>\\boxed{gold answer}</answer>

Queries: the question itself first (BM25 finds a gold paragraph in its top 10 for ~97% of them), then the title of
each supporting paragraph that the results did not show yet (up to ``max_searches``). Every response passes
``arbor.format.check_format``. Deterministic given (seed, question id): templates are chosen by ``derive_seed``.
JSONL rows: ``{question_id, question, golds, response}``.

A user's own JSONL (docs/sft.md) is read as it is, except under a staged protocol (``rollout.protocol=rubricem``):
``build_user_sft_data`` then stages its flat rows (``tasks.env.staging``), drops and reports by line the rows that
cannot be staged, and adds RubricEM's reflection rows (``sft.reflections``, ``reflection_share``) as the
synthesised sources do.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arbor.format import (
    ARBOR,
    PROTOCOLS,
    TagProtocol,
    check_format,
    get_protocol,
    result_block,
)
from arbor.seeding import derive_seed
from arbor.tasks.env.agent import tokenize_trajectory

if TYPE_CHECKING:
    from arbor.config import SFTConfig

# Thoughts are short on purpose: a ~5M-parameter policy learns the *protocol* (think, search, read, answer) from a
# few hundred examples in minutes on a CPU; long free-text thoughts would spend its capacity on copying prose.
_OPEN_THOUGHTS = (
    "I should search for the question.",
    "Let me search first.",
    "I need evidence. Search the question.",
)
_MISSING_THOUGHTS = (
    "I still need {t}.",
    "Next, search {t}.",
    "Check {t} too.",
)
_FINAL_THOUGHTS = (
    "The evidence answers it.",
    "I found the answer.",
    "I can answer now.",
)
_SENT_RE = re.compile(r"(?<=[.!?])\s+")


class SFTDataError(ValueError):
    """A bad SFT data file or row; the message names the file and line."""


def _evidence(hits: Sequence[Any], answer: str, shown_chars: int | None, max_chars: int = 200) -> str | None:
    """The first sentence of the passages *as shown to the agent* that contains the answer (case-insensitive)."""
    needle = answer.lower()
    for h in hits:
        for sent in _SENT_RE.split(" ".join(h.text.split())[:shown_chars]):
            if needle in sent.lower():
                return sent[:max_chars].strip()
    return None


def _clean_query(text: str) -> str:
    return " ".join(text.replace("<", " ").replace(">", " ").split()).rstrip("?").strip()


def synthesize_response(question: Any, search: Any, *, seed: int, top_k: int, max_result_chars: int | None,
                        max_searches: int = 3, format_results: Any = None, protocol: TagProtocol = ARBOR) -> str:
    """One tag-format response for ``question`` (a ``tasks.env.datasets.Question`` with ``support_titles``), written in
    ``protocol``."""
    if format_results is None:
        from functools import partial

        from arbor.tasks.env.search import format_results as _fmt
        format_results = partial(_fmt, line=protocol.passage_line)
    rng = random.Random(derive_seed(seed, "sft", question.question_id))
    answer = question.golds[0]
    parts: list[str] = []
    titles = list(dict.fromkeys(question.support_titles))
    seen: set[str] = set()
    all_hits: list[Any] = []
    query = _clean_query(question.question)
    thought = rng.choice(_OPEN_THOUGHTS)
    for n in range(max(1, max_searches)):
        parts.append(protocol.step_block(n, thought, query))
        hits = search.search([query], top_k)[0]
        all_hits += hits
        seen.update(h.title for h in hits)
        parts.append(result_block(format_results(hits, max_result_chars), protocol))
        missing = [t for t in titles if t not in seen]
        if not missing or n + 1 >= max_searches or _evidence(all_hits, answer, max_result_chars) and rng.random() < 0.5:
            break
        query = _clean_query(missing[0])
        thought = rng.choice(_MISSING_THOUGHTS).format(t=missing[0])
    evidence = _evidence(all_hits, answer, max_result_chars)
    final = rng.choice(_FINAL_THOUGHTS) if evidence else _FINAL_THOUGHTS[2]
    parts.append(protocol.final_block(final.format(e=evidence, a=answer), answer))
    return "".join(parts)


def synthesize(questions: Sequence[Any], search: Any, *, seed: int, top_k: int, max_result_chars: int | None,
               max_searches: int = 3, variants: int = 1, protocol: TagProtocol = ARBOR) -> list[dict[str, Any]]:
    """Rows ``{question_id, question, golds, response}`` (``variants`` differently-seeded responses per question);
    raises if a response fails the strict format checker of ``protocol``."""
    rows = []
    for v in range(variants):
        seed_v = seed if v == 0 else derive_seed(seed, "variant", v)
        for q in questions:
            response = synthesize_response(q, search, seed=seed_v, top_k=top_k, max_result_chars=max_result_chars,
                                           max_searches=max_searches, protocol=protocol)
            rows.append(_checked_row(q, response, protocol))
    return rows


def _checked_row(q: Any, response: str, protocol: TagProtocol = ARBOR) -> dict[str, Any]:
    fmt = check_format(response, truncated=False, protocol=protocol)
    if not fmt.valid:
        raise SFTDataError(f"synthesised response for {q.question_id} fails the format check: {fmt.reason}")
    return {"question_id": q.question_id, "question": q.question, "golds": list(q.golds), "response": response}


def write_jsonl(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write rows to ``path`` atomically (temporary name, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


def build_sft_data(cfg: Any, out_path: str | Path, *, home: str | Path, spec: str = "offline:train",
                   seed: int = 0, search: Any = None, questions: Sequence[Any] | None = None) -> Path:
    """Synthesise SFT data for ``questions`` (default: the split ``spec``) with the run's search backend and
    budgets; write JSONL to ``out_path``."""
    from arbor.tasks.env.datasets import load_questions

    if search is None:
        from arbor.tasks.env.search import make_search
        search = make_search(cfg.search, home=home, config=cfg)
    rows = synthesize(questions if questions is not None else load_questions(spec), search, seed=seed, top_k=cfg.search.top_k,
                      max_result_chars=cfg.search.max_result_chars, max_searches=max(1, cfg.rollout.max_searches),
                      variants=cfg.sft.variants, protocol=get_protocol(cfg.rollout.protocol))
    if share := reflection_share(cfg.sft, cfg.rollout.protocol):
        from arbor.tasks.reflection import reflection_sft_rows
        rows += reflection_sft_rows(rows, share, seed, cfg.rollout.protocol)
    return write_jsonl(rows, out_path)


# RubricEM's start: a quarter of the gold rows get a reflection row and a reference-block copy. The share the
# measured RubricEM start uses (bench/learning.py, docs/decisions/rubricem-and-ss-grpo-learning-under-the-papers-rule.md); without the copies the policy wrote
# reflections instead of its plan once its own reflection appeared in the prompt (train format-valid 0.00).
RUBRICEM_REFLECTIONS = 0.25


def reflection_share(sft: SFTConfig, protocol: str) -> float:
    """The run's ``sft.reflections``: as set, else ``RUBRICEM_REFLECTIONS`` under a staged ``protocol``
    (``rollout.protocol``), else 0."""
    if sft.reflections is not None:
        return float(sft.reflections)
    return RUBRICEM_REFLECTIONS if get_protocol(protocol).staged else 0.0


def reflection_warning(method: str, sft: SFTConfig, protocol: str) -> str | None:
    """Why an SFT start will not suit ``method`` (``run.method``) rubricem (None when it will): no reflection
    rows."""
    if method == "rubricem" and not reflection_share(sft, protocol):
        return ("sft.reflections=0 with run.method=rubricem: the start never sees a reflection request or a "
                "<reference_examples> block, so its reflections are invalid and its plans derail once the bank "
                f"injects one (docs/sft.md); leave sft.reflections unset ({RUBRICEM_REFLECTIONS}) or set a share")
    return None


def read_sft_data(path: str | Path, protocol: str | None = None) -> list[dict[str, Any]]:
    """Read and validate SFT JSONL rows (any source in our tag format); errors name the file and line. With
    ``protocol`` (the run's ``rollout.protocol``), a gold row written in another protocol's tool-output tags is
    refused too: its tool output would not be loss-masked."""
    numbered = read_numbered(path)
    if protocol is not None:
        tags = get_protocol(protocol)
        for lineno, row in numbered:
            text = row["response"]
            if f"<{tags.result_tag}>" in text:
                continue
            other = [p for p in PROTOCOLS.values() if f"<{p.result_tag}>" in text]
            if other:
                hint = " (arbor-sft stages a flat file itself, docs/sft.md)" if tags.staged else ""
                raise SFTDataError(f"{path}:{lineno}: the response uses <{other[0].result_tag}> ({other[0].name}'s "
                                   f"tool output), but rollout.protocol={protocol} wraps it in "
                                   f"<{tags.result_tag}>{hint}")
    return [row for _, row in numbered]


def read_numbered(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """``read_sft_data``'s rows with their line numbers (1-based), for messages that name the line."""
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SFTDataError(f"{where}: not valid JSON ({e.msg})") from e
            if not isinstance(row, dict):
                raise SFTDataError(f"{where}: expected an object")
            for key in ("question", "response"):
                if not isinstance(row.get(key), str) or not row[key].strip():
                    raise SFTDataError(f"{where}: '{key}' must be a non-empty string")
            if "system" in row and not (isinstance(row["system"], str) and row["system"].strip()):
                raise SFTDataError(f"{where}: 'system' (the row's own system prompt) must be a non-empty string")
            rows.append((lineno, row))
    return rows


@dataclass
class StagingReport:
    """What ``stage_sft_rows`` did to a file's rows: ``rows`` in file order, the counts and the dropped lines."""

    source: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    staged: int = 0  # flat rows converted
    kept: int = 0  # rows already staged
    reflections: int = 0  # the file's own reflection rows (kept)
    dropped: list[tuple[int, str]] = field(default_factory=list)  # (line, reason)

    def message(self, shown: int = 10) -> str:
        lines = [f"{self.source}: {self.staged} flat rows staged, {self.kept} already staged, {self.reflections} "
                 f"reflection rows; {len(self.dropped)} rows dropped"]
        lines += [f"  {self.source}:{n}: {why}" for n, why in self.dropped[:shown]]
        if len(self.dropped) > shown:
            lines.append(f"  ... and {len(self.dropped) - shown} more")
        return "\n".join(lines)


def stage_sft_rows(numbered: Sequence[tuple[int, dict[str, Any]]], source: str | Path,
                   protocol: TagProtocol) -> StagingReport:
    """The rows of ``source`` in the staged ``protocol`` (``tasks.env.staging``): flat rows converted, staged rows
    checked, reflection rows kept; a row that cannot be staged (or a staged row that fails the checker) is dropped
    and reported by line."""
    from arbor.tasks.env.staging import StagingError, row_kind, stage_row

    report = StagingReport(str(source))
    for lineno, row in numbered:
        kind = row_kind(row["response"], protocol)
        if kind == "reflection":
            report.reflections += 1
            report.rows.append(row)
        elif kind == "staged":
            fmt = check_format(row["response"], truncated=False, protocol=protocol)
            if fmt.valid:
                report.kept += 1
                report.rows.append(row)
            else:
                report.dropped.append((lineno, f"staged row fails the {protocol.name} format check: {fmt.reason}"))
        else:
            try:
                report.rows.append(stage_row(row, ARBOR, protocol))
                report.staged += 1
            except StagingError as e:
                report.dropped.append((lineno, str(e)))
    return report


def build_user_sft_data(sft: SFTConfig, protocol_name: str, source: str | Path, out_path: str | Path, *,
                        seed: int = 0) -> Path:
    """``sft.data`` = a user's JSONL under a staged protocol (``protocol_name``: ``rollout.protocol``) or with
    reflection rows: the file's rows staged (``stage_sft_rows``; flat rows in arbor's tags), then reflection rows and
    reference-block copies for a share ``reflection_share`` of its gold rows unless the file brings reflection rows
    of its own; JSONL at
    ``out_path``. Prints what was staged and dropped; raises when no row is left."""
    from arbor.tasks.env.staging import row_kind
    from arbor.tasks.reflection import reflection_sft_rows

    protocol = get_protocol(protocol_name)
    numbered = read_numbered(source)
    if protocol.staged:
        report = stage_sft_rows(numbered, source, protocol)
        print(report.message(), flush=True)
        if not report.staged + report.kept:
            raise SFTDataError(f"{source}: no row could be staged for rollout.protocol={protocol.name} "
                               f"(docs/sft.md, RubricEM's staged start)\n{report.message()}")
        rows, own_reflections = report.rows, report.reflections
    else:
        rows = [row for _, row in numbered]
        own_reflections = sum(row_kind(r["response"]) == "reflection" for r in rows)
    share = reflection_share(sft, protocol_name)
    if share and not own_reflections:
        gold = [r for r in rows if "<reference_examples>" not in r["question"]]
        rows = rows + reflection_sft_rows(gold, share, seed, protocol.name)
    return write_jsonl(rows, out_path)


def tokenize_sft_example(tokenizer: Any, row: dict[str, Any], system_prompt: str | None = None,
                         protocol: TagProtocol = ARBOR) -> tuple[list[int], list[int], list[int]]:
    """(prompt_ids, response_ids, loss_mask) of one SFT row, tokenised as the agent loop would (results masked)."""
    return tokenize_trajectory(tokenizer, row["question"], row["response"], row.get("system") or system_prompt,
                               protocol)
