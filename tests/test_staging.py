"""Flat trajectories to RubricEM's stage scaffold: the pure conversion ``tasks.env.staging``."""

from __future__ import annotations

import pytest

from arbor.format import (
    ARBOR,
    RUBRICEM,
    STAGE_NAMES,
    check_format,
    extract_answer,
    extract_results,
    extract_searches,
    stage_spans,
)
from arbor.tasks.env.policy import train_tokenizer
from arbor.tasks.env.sft_data import tokenize_sft_example
from arbor.tasks.env.staging import StagingError, row_kind, stage_response, stage_row

# Tool-Star-like: exploratory thinking before a stage's reasoning, free text between blocks, two hops
FLAT = ("<think>Who directed Heat (1995)? Then where he was born.</think>\n"
        "<search>Heat 1995 film director</search>\n<result>\nDoc 1 (Title: Heat) Heat is a 1995 crime film "
        "directed by Michael Mann.\n</result>\n"
        "<think>So the director is Michael Mann.</think>\nNow the birthplace.\n"
        "<think>Search where Michael Mann was born.</think>\n"
        "<search>Michael Mann birthplace</search>\n<result>\nDoc 1 (Title: Michael Mann) Michael Mann was born "
        "in Chicago, Illinois.\n</result>\n"
        "<think>Double-check the name.</think>\n<think>Mann was born in Chicago.</think>\n"
        "<answer>The director's birthplace is \\boxed{Chicago}.</answer>")


def test_a_flat_row_stages_into_a_valid_staged_row_with_the_same_searches_results_and_answer() -> None:
    assert check_format(FLAT).valid and not check_format(FLAT, protocol=RUBRICEM).valid
    staged = stage_response(FLAT)
    fmt = check_format(staged, truncated=False, protocol=RUBRICEM)
    assert fmt.valid, fmt.reason
    assert extract_searches(staged, RUBRICEM) == extract_searches(FLAT) == ["Heat 1995 film director",
                                                                           "Michael Mann birthplace"]
    assert extract_results(staged, RUBRICEM) == extract_results(FLAT) and len(extract_results(FLAT)) == 2
    assert fmt.answer == extract_answer(FLAT) == "Chicago"
    assert "<answer>The director's birthplace is \\boxed{Chicago}.</answer>" in staged  # the answer block verbatim
    # the last reasoning of each gap takes its stage's tag; earlier reasoning stays <think>
    spans = dict(zip(STAGE_NAMES, (staged[a:b] for a, b in stage_spans(staged)), strict=True))
    assert spans["plan"] == "<structured_plan>Who directed Heat (1995)? Then where he was born.</structured_plan>"
    assert "<think>So the director is Michael Mann.</think>\nNow the birthplace.\n<state_evaluation>Search where " \
           "Michael Mann was born.</state_evaluation>\n<search>Michael Mann birthplace</search>" in spans["research"]
    assert spans["review"] == "<think>Double-check the name.</think>\n<review>Mann was born in Chicago.</review>\n"
    assert spans["answer"].startswith("<answer>")
    # no word is written or lost: only the tags change
    plain = lambda t: [w for w in t.replace("<", " <").replace(">", "> ").split() if not w.startswith("<")]  # noqa: E731
    assert plain(staged) == plain(FLAT)


def test_staged_tool_outputs_stay_loss_masked() -> None:
    staged = stage_response(FLAT)
    tok = train_tokenizer(vocab_size=400, texts=iter([FLAT, staged]))
    _, resp, mask = tokenize_sft_example(tok, {"question": "Where was the director of Heat born?",
                                               "response": staged}, protocol=RUBRICEM)
    assert tok.decode(resp, skip_special_tokens=False) == staged
    masked = tok.decode([t for t, m in zip(resp, mask, strict=True) if not m], skip_special_tokens=False)
    assert masked == "".join(f"\n<tool_output>\n{b}\n</tool_output>\n" for b in extract_results(FLAT))


def test_a_response_that_opens_inside_the_templates_think_block_and_the_forced_answer_message() -> None:
    flat = ("Plan: search the mill.</think>\n<search>Zorblat Mills founder</search>" + ARBOR.force_answer_message
            + "<think>No evidence; best guess.</think>\n<answer>\\boxed{Ada Zorblat}</answer>")
    staged = stage_response(flat)
    assert staged.startswith("<structured_plan>Plan: search the mill.</structured_plan>\n<search>")
    assert RUBRICEM.force_answer_message in staged and check_format(staged, protocol=RUBRICEM).valid


@pytest.mark.parametrize("response, reason", [
    ("<think>Easy.</think>\n<answer>\\boxed{Paris}</answer>", "no search"),
    ("<search>q</search>\n<result>\nr\n</result>\n<think>t</think>\n<answer>\\boxed{a}</answer>",
     "no <think> before the first search"),
    ("<think>p</think>\n<search>q</search>\n<result>\nr\n</result>\n<answer>\\boxed{a}</answer>",
     "no <think> between the last result and the answer"),
    ("<think>p</think>\n<search>q</search>", "not a valid flat response: <search> not followed by its <result>"),
    ("<think>p, as in <review></think>\n<search>q</search>\n<result>\nr\n</result>\n<think>t</think>\n"
     "<answer>\\boxed{a}</answer>", "fails the rubricem format check"),
])
def test_rows_without_a_faithful_staged_form_are_refused_with_the_reason(response: str, reason: str) -> None:
    with pytest.raises(StagingError, match=reason.replace("(", r"\(")):
        stage_response(response)


def test_row_kinds_and_stage_row() -> None:
    staged = stage_response(FLAT)
    assert (row_kind(FLAT), row_kind(staged)) == ("flat", "staged")
    assert row_kind("<reflection_rubrics>\nx\n</reflection_rubrics>\n<reflection_takeaways>\n1. y\n"
                    "</reflection_takeaways>") == "reflection"
    row = {"question_id": "q1", "question": "Where?", "golds": ["Chicago"], "system": "flat tags", "response": FLAT}
    assert stage_row(row) == {"question_id": "q1", "question": "Where?", "golds": ["Chicago"], "response": staged}
