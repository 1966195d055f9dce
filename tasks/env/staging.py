"""Flat trajectories to RubricEM's stage scaffold: the pure conversion behind ``arbor-sft``.

A flat row (arbor's tags, docs/sft.md: ``<think>``, ``<search>``, ``<result>``, ``<answer>``) becomes a staged row
(``arbor.format.RUBRICEM``) by renaming, never by writing new text. The response falls into gaps at its searches::

    [<think>E</think>] <think>P</think>  <search>q1</search> <result>R1</result>
    [<think>E</think>] <think>S</think>  <search>q2</search> <result>R2</result>   (any number of these)
    [<think>E</think>] <think>V</think>  <answer>\\boxed{a}</answer>

In each gap the *last* reasoning block takes its stage's tag: P -> ``<structured_plan>`` (Plan), S ->
``<state_evaluation>`` (Research: it weighs the output just read and leads to the next search), V -> ``<review>``
(Review); earlier blocks E stay ``<think>``, the paper's exploratory thinking before each stage block (RubricEM
App. B.1). Queries, the answer block and free text are kept verbatim; each result is re-wrapped as the loop wraps
tool output (``result_block``: ``\\n<tool_output>\\n...\\n</tool_output>\\n``), so it stays loss-masked. This is
exactly the step / final blocks the synthesised staged rows use (``TagProtocol.step_block`` / ``final_block``): a
flat synthesised row stages to the staged row of the same seed.

A row that cannot be mapped raises ``StagingError`` with the reason: it fails arbor's format check, has no search
(Research is mandatory), no reasoning before the first search (no plan) or after the last result (no review), or
the staged text fails RUBRICEM's checker (e.g. its reasoning quotes a stage tag). Rows already staged and
reflection rows (``tasks.reflection``) are recognised by ``row_kind`` and left as they are.
"""

from __future__ import annotations

from typing import Any, Literal

from arbor.format import (
    ARBOR,
    RUBRICEM,
    TagProtocol,
    _blocks,  # the checker's own block parser: staging must cut a response exactly where the checker does
    check_format,
    reflection_blocks,
    result_block,
)

RowKind = Literal["flat", "staged", "reflection"]


class StagingError(ValueError):
    """A flat response that has no faithful staged form; the message says why."""


def row_kind(response: str, staged: TagProtocol = RUBRICEM) -> RowKind:
    """``reflection`` (a reflection request's answer: both reflection blocks, no ``<answer>``), ``staged`` (any tag
    only the staged protocol has: a stage block or its tool-output tag) or ``flat``."""
    if reflection_blocks(response) is not None and "<answer>" not in response:
        return "reflection"
    own = set(staged.stage_tags) | {staged.result_tag}
    if any(m.group(2) in own for m in staged.tag_re.finditer(response)):
        return "staged"
    return "flat"


def stage_response(response: str, flat: TagProtocol = ARBOR, staged: TagProtocol = RUBRICEM) -> str:
    """``response`` (valid under ``flat``) in ``staged``'s scaffold; raises ``StagingError`` when it has none."""
    fmt = check_format(response, truncated=False, protocol=flat)
    if not fmt.valid:
        raise StagingError(f"not a valid flat response: {fmt.reason}")
    blocks, _ = _blocks(response, flat)
    tags = [b[0] for b in blocks]
    if "search" not in tags:
        raise StagingError("no search: RubricEM's Research stage needs at least one")
    first, last_result = tags.index("search"), len(tags) - 1 - tags[::-1].index("result")

    def last_think(lo: int, hi: int) -> int | None:
        found = [i for i in range(lo, hi) if tags[i] == "think"]
        return found[-1] if found else None

    rename: dict[int, str] = {}
    plan = last_think(0, first)
    if plan is None:
        raise StagingError("no <think> before the first search to become the plan (<structured_plan>)")
    rename[plan] = "structured_plan"
    review = last_think(last_result + 1, len(tags) - 1)
    if review is None:
        raise StagingError("no <think> between the last result and the answer to become the <review>")
    rename[review] = "review"
    for i, tag in enumerate(tags[:last_result]):  # each result followed (after thinking) by another search
        if tag == "result":
            nxt = tags.index("search", i)
            if (j := last_think(i + 1, nxt)) is not None:
                rename[j] = "state_evaluation"
    forced = flat.force_answer_message.strip()[len(f"<{flat.result_tag}>"):-len(flat.result_close)].strip()
    parts: list[str] = []
    pos = 0
    for i, (tag, start, b0, b1, end) in enumerate(blocks):
        gap = response[pos:start]
        if tag == "result" or (i and tags[i - 1] == "result"):
            gap = "" if tag == "result" else gap.lstrip()  # the tool-output wrapper brings its own newlines
        parts.append(gap)
        if tag == "result":
            body = response[b0:b1]
            parts.append(staged.force_answer_message if body.strip() == forced else result_block(body, staged))
        elif i in rename:
            parts.append(f"<{rename[i]}>{response[b0:b1]}</{rename[i]}>")
        else:
            parts.append(response[start:end])
        pos = end
    tail = response[pos:]
    parts.append(tail.lstrip() if tags[-1] == "result" else tail)
    out = "".join(parts)
    fmt = check_format(out, truncated=False, protocol=staged)
    if not fmt.valid:
        raise StagingError(f"the staged response fails the {staged.name} format check: {fmt.reason}")
    return out


def stage_row(row: dict[str, Any], flat: TagProtocol = ARBOR, staged: TagProtocol = RUBRICEM) -> dict[str, Any]:
    """A flat row in the staged scaffold: its response staged, its own ``system`` prompt dropped (it taught the flat
    tags; the run's staged prompt applies), everything else kept. Raises ``StagingError``."""
    out = {k: v for k, v in row.items() if k != "system"}
    out["response"] = stage_response(row["response"], flat, staged)
    return out


__all__ = ["RowKind", "StagingError", "row_kind", "stage_response", "stage_row"]
