"""verl's data as it is: a parquet written the way verl's Search-R1 preprocessing writes it
(``examples/data_preprocess/preprocess_search_r1_dataset.py``: ``prompt`` = system + user chat messages,
``reward_model = {"style": "rule", "ground_truth": {"target": [...]}}``, ``extra_info = {"index", "question",
"split", "need_tools_kwargs", "tools_kwargs"}``) and the older Search-R1 layout (``prompt`` = one user message, no
``extra_info.question``) load with arbor's default fields through the train flow's own call, and a malformed row is
named by file and row."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from arbor.config import ConfigError, load_config
from arbor.preflight import check
from arbor.tasks.env.datasets import (
    DatasetError,
    Fields,
    field_value,
    fields_of,
    load_questions,
    read_questions,
)

PREFIX = "Answer the question below; search when you lack knowledge and answer inside <answer></answer>. Question: "
SYSTEM = "You are a helpful assistant."
QA = [("who wrote the book hamlet?", ["William Shakespeare", "Shakespeare"]),
      ("capital city of peru?", ["Lima"]),
      ("when did the berlin wall fall?", ["1989", "9 November 1989"])]


def _verl_row(i: int, question: str, golds: object, split: str = "train") -> dict:
    """One row as verl's Search-R1 script writes it (its nested columns and their order)."""
    gt = {"target": golds}
    return {
        "data_source": "searchR1_nq",
        "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PREFIX + question}],
        "ability": "fact-reasoning",
        "reward_model": {"ground_truth": gt, "style": "rule"},
        "extra_info": {"index": i, "need_tools_kwargs": True, "question": question, "split": split,
                       "tools_kwargs": {"search": {"create_kwargs": {"ground_truth": gt, "question": question,
                                                                     "data_source": "searchR1_nq"}}}},
        "metadata": None,
    }


def _train_flow_questions(data: str, **over: str) -> list:
    """The question pool exactly as flows.run_setup.open_run loads ``data.train``."""
    cfg = load_config("tiny-cpu", {"data.train": data, **over})
    return load_questions(cfg.data.train, size=cfg.data.train_size, seed=cfg.run.seed, config=cfg,
                          fields=fields_of(cfg.data))


def test_verl_search_r1_parquet_loads_as_written(tmp_path: Path) -> None:
    f = tmp_path / "train.parquet"
    table = pa.Table.from_pylist([_verl_row(i, q, a) for i, (q, a) in enumerate(QA)])
    assert pa.types.is_list(table.schema.field("prompt").type)  # nested columns, as pandas' to_parquet writes them
    assert pa.types.is_struct(table.schema.field("reward_model").type)
    pq.write_table(table, f)
    qs = _train_flow_questions(str(f))
    # extra_info.question (the bare question) wins over the prompt (instructions + question); ids: extra_info.index
    assert [(q.question_id, q.question, q.golds) for q in qs] == [(str(i), q, a) for i, (q, a) in enumerate(QA)]
    # verl's data.prompt_key=prompt: the last user message, instructions and all
    by_prompt = _train_flow_questions(str(f), **{"data.question_field": "prompt"})
    assert [q.question for q in by_prompt] == [PREFIX.strip() + " " + q for q, _ in QA]
    # field paths with [i] and numeric steps reach the same message; [0] is the system message
    assert [q.question for q in _train_flow_questions(str(f), **{"data.question_field": "prompt[-1].content"})] == \
        [q.question for q in by_prompt] == \
        [q.question for q in _train_flow_questions(str(f), **{"data.question_field": "prompt.1.content"})]
    with pytest.raises(DatasetError, match=r"train\.parquet: row 1: field 'prompt\[0\]' is a chat list with no user "
                                           r"message \(roles: system\)"):
        _train_flow_questions(str(f), **{"data.question_field": "prompt[0]"})
    # preflight reads it with the same default mapping: nothing to complain about
    assert check(load_config("tiny-cpu", {"data.train": str(f)}), gpu_count=0, env={}) == []


def test_search_r1_original_layout_and_ground_truth_shapes(tmp_path: Path) -> None:
    """Search-R1's own scripts: one user message, extra_info without the question; ground_truth as a mapping, a
    plain string or a list (written with polars this time: large lists, nested structs)."""
    rows = [{"data_source": "nq", "prompt": [{"role": "user", "content": PREFIX + q}], "ability": "fact-reasoning",
             "reward_model": {"style": "rule", "ground_truth": {"target": a}},
             "extra_info": {"split": "train", "index": 10 + i}} for i, (q, a) in enumerate(QA)]
    f = tmp_path / "nq_search.parquet"
    pl.DataFrame(rows).write_parquet(f)
    qs = _train_flow_questions(str(f))
    assert [(q.question_id, q.question, q.golds) for q in qs] == [
        (str(10 + i), PREFIX.strip() + " " + q, a) for i, (q, a) in enumerate(QA)]
    plain = tmp_path / "gsm.parquet"
    pl.DataFrame([{"prompt": [{"role": "user", "content": "2+2?"}], "reward_model": {"style": "rule",
                                                                                 "ground_truth": "4"}}]).write_parquet(plain)
    [q] = _train_flow_questions(str(plain))
    assert (q.question_id, q.question, q.golds) == ("gsm-1", "2+2?", ["4"])  # no id field: file stem and row
    listed = tmp_path / "listed.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": [{"role": "user", "content": "colours of the flag?"}],
                                          "reward_model": {"ground_truth": ["red", "white"]}}]), listed)
    assert _train_flow_questions(str(listed))[0].golds == ["red", "white"]
    # a row's own answer field wins over verl's ground truth (Search-R1's merged data keeps golden_answers too)
    both = tmp_path / "both.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "q?", "golden_answers": ["g"], "id": "train_0",
                                          "reward_model": {"ground_truth": {"target": ["other"]}}}]), both)
    assert [(q.question_id, q.golds) for q in _train_flow_questions(str(both))] == [("train_0", ["g"])]


def test_field_paths_with_positions() -> None:
    row = {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], "a": {"0": "key"}}
    assert field_value(row, "prompt[1].content") == field_value(row, "prompt.1.content") == \
        field_value(row, "prompt[-1].content") == "u"
    assert field_value(row, "a.0") == "key"  # a mapping's key "0", not a position
    missing = field_value(row, "nope")
    assert field_value(row, "prompt[2].content") is missing and field_value(row, "prompt[-3]") is missing
    assert field_value(row, "prompt.content") is missing  # a list has no key
    with pytest.raises(DatasetError, match=r"malformed field path 'prompt\[x\]'"):
        field_value(row, "prompt[x]")
    with pytest.raises(ConfigError, match=r"data\.question_field: malformed field path 'prompt\.\.content'"):
        load_config("tiny-cpu", {"data.question_field": "prompt..content"})


def test_malformed_verl_rows_name_file_and_row(tmp_path: Path) -> None:
    rows = [_verl_row(i, q, a) for i, (q, a) in enumerate(QA)]
    rows[2]["reward_model"]["ground_truth"] = {"target": []}  # row 3: no answer
    f = tmp_path / "bad_train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), f)
    with pytest.raises(DatasetError) as e:
        _train_flow_questions(str(f))
    assert f"{f}: row 3: field 'reward_model.ground_truth' must be a non-empty string or a non-empty list" in str(e.value)
    # preflight names the key, the file and the row before anything starts
    missing = check(load_config("tiny-cpu", {"data.train": str(f)}), gpu_count=0, env={})
    assert missing == [f"data.train: {e.value}"]
    # a chat prompt with no user message and no extra_info.question: row 2 named, with the roles it has
    chat = [{"prompt": [{"role": "user", "content": "fine?"}], "reward_model": {"ground_truth": "yes"}},
            {"prompt": [{"role": "system", "content": "only a system message"}], "reward_model": {"ground_truth": "x"}}]
    g = tmp_path / "no_user.parquet"
    pq.write_table(pa.Table.from_pylist(chat), g)
    with pytest.raises(DatasetError, match=rf"{g}: row 2: field 'prompt' is a chat list with no user message "
                                           r"\(roles: system\)"):
        read_questions(g)
    # verl's index repeated (two splits' files concatenated): the duplicate and where ids came from are named
    dup = tmp_path / "dup.parquet"
    pq.write_table(pa.Table.from_pylist([_verl_row(0, "a?", ["x"]), _verl_row(0, "b?", ["y"], "test")]), dup)
    with pytest.raises(DatasetError, match=r"duplicate question id '0' \(records 1 and 2; ids from the first of "
                                           r"question_id, id, extra_info\.index a row has: set data\.id_field"):
        read_questions(dup)
    assert [q.question_id for q in read_questions(dup, fields=Fields(id="extra_info.split"))] == ["train", "test"]
