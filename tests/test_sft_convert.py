"""The paper's SFT sources to arbor's rows: Tool-Star's alpaca layout and conversation files,
search-only, tags mapped per protocol, every kept row format-checked, every dropped row counted with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arbor.cli import app
from arbor.format import PROTOCOLS, check_format, get_protocol
from arbor.paths import PROJECT_ROOT
from arbor.tasks.env.sft_convert import (
    ConvertError,
    ConvertSkip,
    convert_file,
    convert_response,
    read_records,
)

SAMPLES = [PROJECT_ROOT / "data" / "sft" / "sample_toolstar.json",
           PROJECT_ROOT / "data" / "sft" / "sample_conversations.jsonl"]


def test_the_shipped_samples_convert_with_every_drop_explained() -> None:
    report = convert_file(SAMPLES, "arbor")
    assert [r["question"] for r in report.rows] == [
        "Which river flows through the city where the Eiffel Tower stands?",
        "In what year was the author of 'The Old Man and the Sea' born?",
        "What is the capital of the country where the Danube's delta lies?"]
    assert dict(report.dropped) == {"calls a Python / code tool": 2, "no search call": 2, "duplicate question": 1,
                                    "no final answer": 1}
    first = report.rows[0]
    assert first["golds"] == ["Seine"] and first["question_id"] == "sample_toolstar.json#0"
    assert first["response"] == (
        "<think>The Eiffel Tower is in Paris; I should confirm which river runs through Paris.</think>\n"
        "<search>river through Paris</search>\n<result>\nThe Seine is a river in northern France. It flows through "
        "Paris before reaching the English Channel at Le Havre.\n</result>\n"
        "<think>The passage says the Seine flows through Paris.</think>\n<answer>\\boxed{the Seine}</answer>")
    # untagged reasoning became <think>, a bare answer was boxed
    second = report.rows[1]["response"]
    assert second.startswith("<think>First I need the author of the novella, then the birth year.</think>\n<search>")
    assert second.endswith("<think>He was born in 1899.</think>\n<answer>\\boxed{1899}</answer>")
    assert "sample_toolstar.json#2" in report.message()


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_each_protocol_gets_rows_its_own_checker_accepts(protocol: str) -> None:
    tags = get_protocol(protocol)
    rows = convert_file(SAMPLES, protocol).rows
    assert len(rows) == 3
    for row in rows:
        fmt = check_format(row["response"], protocol=tags)
        assert fmt.valid, (protocol, fmt.reason)
        assert f"<{tags.result_tag}>" in row["response"]
        others = {p.result_tag for p in PROTOCOLS.values()} - {tags.result_tag}
        assert not any(f"<{t}>" in row["response"] for t in others)
    if tags.staged:  # RubricEM: the plan opens, the review closes
        assert rows[0]["response"].startswith("<structured_plan>")
        assert "<review>The passage says the Seine flows through Paris.</review>" in rows[0]["response"]
    if not tags.boxed:
        assert rows[0]["response"].endswith("<answer> the Seine </answer>")


def test_converted_rows_train_with_their_tool_output_masked(tmp_path: Path) -> None:
    """What `arbor sft convert` writes is what arbor-sft reads: the run's reader accepts it, and the tokens of each
    search's output carry no loss."""
    from arbor.tasks.env.policy import build_tiny_policy, load_tokenizer
    from arbor.tasks.env.sft_data import read_sft_data
    from arbor.tasks.training.sft import tokenize_rows

    out = tmp_path / "rows.jsonl"
    res = CliRunner().invoke(app, ["sft", "convert", *map(str, SAMPLES), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "3 rows kept, 6 dropped" in res.output and "wrote 3 rows" in res.output
    rows = read_sft_data(out, "arbor")
    tok = load_tokenizer(build_tiny_policy(home=tmp_path), None)
    (ex, *_), _ = tokenize_rows(rows[:1], tok, max_length=4096)
    masked = tok.decode([t for t, m in zip(ex.response_ids, ex.loss_mask, strict=True) if m == 0])
    assert "The Seine is a river in northern France" in masked and "<search>" not in masked
    again = CliRunner().invoke(app, ["sft", "convert", str(SAMPLES[0]), "--out", str(out)])
    assert again.exit_code == 2 and "already exists" in again.output


@pytest.mark.parametrize(("text", "reason"), [
    ("<search>q</search>\n<think>x</think>\n<result>r</result>\n<answer>a</answer>", "not directly after its search"),
    ("<think>a <search>q</search></think><answer>a</answer>", "<search> inside <think>"),
    ("<search>q</search><result>r</result><answer>\\boxed{a} or \\boxed{b}</answer>", "2 \\boxed{}"),
    ("<search>q</search><result>r</result><answer>a</answer> and more", "text after the answer"),
    ("<search> </search><result>r</result><answer>a</answer>", "empty search query"),
    ("I think so.\n```python\nprint(1)\n```\n<search>q</search><result>r</result><answer>a</answer>", "Python"),
])
def test_rows_without_a_faithful_form_are_skipped_with_the_reason(text: str, reason: str) -> None:
    with pytest.raises(ConvertSkip, match=reason.replace("\\", "\\\\").replace("{", "\\{").replace("}", "\\}")):
        convert_response(text)


def test_an_unreadable_source_names_its_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": "q", "output": "o"}\n{"input": \n')
    with pytest.raises(ConvertError, match=r"bad\.jsonl:2: not valid JSON"):
        list(read_records(bad))
    obj = tmp_path / "obj.json"
    obj.write_text(json.dumps({"input": "q"}))
    with pytest.raises(ConvertError, match="expected a JSON array"):
        list(read_records(obj))
    res = CliRunner().invoke(app, ["sft", "convert", str(bad), "--out", str(tmp_path / "o.jsonl")])
    assert res.exit_code == 2 and "bad.jsonl:2" in res.output and not (tmp_path / "o.jsonl").exists()
