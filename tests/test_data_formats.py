"""Data in the formats people have: field mapping with dotted paths, Search-R1 / FlashRAG rows,
verl's nested parquet, Hugging Face `save_to_disk` folders; a malformed row is named (file, line or row, field)
before anything starts. A flow step runs on JSONL, on verl rows in a save_to_disk folder and on FlashRAG JSONL in tests/test_flow_train.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from arbor.config import load_config
from arbor.tasks.env.datasets import (
    DatasetError,
    Fields,
    field_value,
    fields_of,
    load_questions,
    read_questions,
)

VERL = Fields(question="extra_info.question", answer="reward_model.ground_truth", id="extra_info.index")


def _verl_row(i: int, q: str, target: object) -> dict:
    return {"data_source": "nq", "prompt": [{"role": "user", "content": f"Answer: {q}"}], "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": target}},
            "extra_info": {"split": "train", "index": i, "question": q}}


def test_field_value_follows_dotted_paths() -> None:
    row = {"a": {"b": {"c": 3}}, "x": None}
    assert field_value(row, "a.b.c") == 3 and field_value(row, "x") is None
    assert field_value(row, "a.z") is field_value(row, "q") is field_value({"a": 1}, "a.b")  # the missing marker


def test_flashrag_jsonl_reads_golden_answers_and_ids(tmp_path: Path) -> None:
    f = tmp_path / "nq_test.jsonl"
    f.write_text(json.dumps({"id": "test_0", "question": "who sang it?", "golden_answers": ["Ann", "Ann Lee"]}) + "\n")
    [q] = read_questions(f)
    assert (q.question_id, q.question, q.golds) == ("test_0", "who sang it?", ["Ann", "Ann Lee"])


def test_verl_parquet_through_the_field_mapping(tmp_path: Path) -> None:
    f = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([_verl_row(0, "capital of France?", ["Paris"]),
                                         _verl_row(1, "capital of Peru?", ["Lima", "Lima, Peru"])]), f)
    qs = read_questions(f, fields=VERL)
    assert [(q.question_id, q.question, q.golds) for q in qs] == [
        ("0", "capital of France?", ["Paris"]), ("1", "capital of Peru?", ["Lima", "Lima, Peru"])]
    # the config keys carry the mapping
    cfg = load_config("tiny-cpu", {"data.question_field": "extra_info.question",
                                   "data.answer_field": "reward_model.ground_truth", "data.id_field": "extra_info.index"})
    assert fields_of(cfg.data) == VERL and load_questions(str(f), fields=fields_of(cfg.data)) == qs
    assert read_questions(f) == qs  # arbor's default fields find verl's (extra_info.question, ground_truth, index)
    f2 = tmp_path / "other.parquet"
    pq.write_table(pa.Table.from_pylist([{"data_source": "nq", "ability": "qa"}]), f2)
    with pytest.raises(DatasetError, match=r"other\.parquet: row 1: field 'question' must be a non-empty string "
                                           r"\(missing, and no 'extra_info\.question' or 'prompt' chat list either; "
                                           r"set data\.question_field\)"):
        read_questions(f2)  # no question anywhere: the field and the key are named
    with pytest.raises(DatasetError, match=r"row 1: field 'extra_info\.question' must be a non-empty string "
                                           r"\(missing; set data\.question_field\)"):
        read_questions(f2, fields=VERL)


def test_bad_nested_row_names_row_and_field(tmp_path: Path) -> None:
    f = tmp_path / "train.parquet"
    rows = [_verl_row(0, "a?", ["x"]), _verl_row(1, "b?", [])]
    pq.write_table(pa.Table.from_pylist(rows), f)
    with pytest.raises(DatasetError, match=r"train\.parquet: row 2: field 'reward_model\.ground_truth' must be"):
        read_questions(f, fields=VERL)
    j = tmp_path / "rows.jsonl"
    j.write_text(json.dumps(_verl_row(0, "a?", ["x"])) + "\n" + json.dumps({"extra_info": {"question": "b?"}}) + "\n")
    with pytest.raises(DatasetError, match=r"rows\.jsonl:2: field 'reward_model\.ground_truth' \(data\.answer_field\) "
                                           r"is missing"):
        read_questions(j, fields=VERL)


def test_hugging_face_save_to_disk_folders(tmp_path: Path) -> None:
    rows = [{"id": f"dev_{i}", "question": f"q{i}?", "golden_answers": [f"a{i}"]} for i in range(3)]
    one = tmp_path / "one"
    datasets.Dataset.from_list(rows).save_to_disk(str(one))
    assert [(q.question_id, q.golds) for q in read_questions(one)] == [(f"dev_{i}", [f"a{i}"]) for i in range(3)]
    assert load_questions(str(one)) == read_questions(one)
    both = tmp_path / "both"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows[:1])}
                         ).save_to_disk(str(both))
    with pytest.raises(DatasetError, match=r"a DatasetDict with splits \['train', 'test'\]; point data\.train / "
                                           r"data\.eval at one of them"):
        read_questions(both)
    assert len(read_questions(both / "test")) == 1
    bad = tmp_path / "bad"
    datasets.Dataset.from_list([{"question": "q?", "golden_answers": []}]).save_to_disk(str(bad))
    with pytest.raises(DatasetError, match=r"bad: row 1: field 'golden_answers' must be a non-empty"):
        read_questions(bad)
    with pytest.raises(DatasetError, match="not a Hugging Face save_to_disk dataset"):
        read_questions(tmp_path)  # a plain folder


def test_malformed_row_is_refused_by_the_cli_in_under_three_seconds(tmp_path: Path) -> None:
    f = tmp_path / "mine.jsonl"
    f.write_text(json.dumps({"question": "ok?", "answer": "x"}) + "\n" + json.dumps({"question": "no answer?"}) + "\n")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "arbor.cli", "train", "-p", "tiny-cpu", f"data.train={f}"],
                          capture_output=True, text=True, cwd=tmp_path, env={"ARBOR_HOME": str(tmp_path / "home"),
                                                                            "PATH": "/usr/bin:/bin"}, timeout=60)
    took = time.perf_counter() - t0
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and f"data.train: {f}:2: exactly one of 'answer', 'answers', 'golden_answers'" in lines[0]
    assert took < 3.0, took
    assert not (tmp_path / "home" / "runs").exists()
