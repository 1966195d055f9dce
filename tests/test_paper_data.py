"""Each paper profile trains and evaluates on its paper's question sets, never silently on the 129
shipped ``offline:*`` questions; a set that cannot be loaded here is refused by preflight in one line, naming the
set and how to give it, with nothing written under ARBOR_HOME."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants

from arbor.config import load_config
from arbor.config.show import config_sources, render_config
from arbor.preflight import check
from arbor.tasks.env.datasets import fields_of, load_questions, split_spec

ARBOR = ("qwen3-4b", "qwen3-8b", "qwen3-14b")
DR_TULU = "hf:rl-research/dr-tulu-rl-data:train"
ARPO_FOUR = ["bench:bamboogle", "bench:hotpotqa", "bench:musique", "bench:2wiki"]

# profile -> (data.train, data.eval as a list, data.train_size), each against its paper
PAPER_SETS = {
    # ARBOR §4.1: "RL training uses 2K QA examples randomly sampled from the ARPO Deep Reasoning Tasks"; B.1: the
    # ARPO test splits of Bamboogle, HotpotQA, MuSiQue and 2WikiMultiHopQA (Table 1's column order)
    **{p: ("arpo:train2k", ARPO_FOUR, None) for p in ARBOR},
    # RubricEM F.1.2: "the same DR. Tulu RL dataset (r1-research/dr-tulu-rl-data) ... ~4.9K ... queries";
    # F.2.2: 2WikiMultihopQA is the one of its benchmarks arbor ships
    "qwen3-8b-rubricem": (DR_TULU, ["bench:2wiki"], None),
    # Co-ReAct §4.1 / App. A: branching points "from the DR-Tulu training queries"; its DRB and SQA-CS-V2 are not
    # shipped, the four ARPO splits stand in (deviations)
    "qwen3-8b-coreact": (DR_TULU, ARPO_FOUR, None),
    # ARCO (review: HotpotQA, 2WikiMultiHopQA, MuSiQue; the authors' code: 2,000 HotpotQA training questions)
    "qwen3-4b-arco": ("hf:hotpotqa/hotpot_qa/distractor:train", ["bench:hotpotqa", "bench:2wiki", "bench:musique"],
                      2000),
}


@pytest.mark.parametrize("profile", sorted(PAPER_SETS))
def test_paper_profiles_name_their_papers_sets(profile: str) -> None:
    cfg = load_config(profile)
    train, evals, size = PAPER_SETS[profile]
    assert (cfg.data.train, cfg.data.eval_sets(), cfg.data.train_size) == (train, evals, size)
    assert not any(s.startswith("offline:") for s in (cfg.data.train, *cfg.data.eval_sets()))
    # `arbor eval`'s default sets are the in-run ones, benchmark by benchmark
    assert [split_spec(s) for s in cfg.eval.splits] == evals
    # a set that is not the paper's own is a stated deviation
    if profile not in ARBOR:
        assert "data.eval" in cfg.deviations


def test_arbor_sets_have_the_papers_sizes() -> None:
    """§4.1: 2K training questions; B.1: 200 / 200 / 200 / 125 test questions."""
    cfg = load_config("qwen3-8b")
    assert len(load_questions(cfg.data.train, size=cfg.data.train_size, seed=cfg.run.seed, config=cfg)) == 2000
    assert {s: len(load_questions(s)) for s in cfg.data.eval_sets()} == {
        "bench:bamboogle": 125, "bench:hotpotqa": 200, "bench:musique": 200, "bench:2wiki": 200}


def _dr_tulu_rows() -> list[dict]:
    """Rows laid out as DR Tulu's RL queries: the query as one user turn, rubrics as a JSON string."""
    qs = ["What are the trade-offs of solid-state batteries for grid storage?",
          "How has CRISPR base editing been used in clinical trials so far?"]
    return [{"messages": [{"role": "user", "content": q}],
             "ground_truth": json.dumps({"query": q, "rubrics": [{"description": "cites trials", "weight": 1}]}),
             "dataset": "rl-rag/openscholar"} for q in qs]


def test_dr_tulu_rows_load_through_the_profiles_field_mapping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real ``datasets`` save_to_disk folder and Parquet file of DR Tulu's layout, read with the profile's own
    mapping (question from ``messages``; no answer key), and the same Parquet file as the Hub split from a cache."""
    import datasets

    rows = _dr_tulu_rows()
    ds = datasets.Dataset.from_list(rows)
    ds.save_to_disk(str(tmp_path / "saved"))
    parquet = tmp_path / "train-00000-of-00001.parquet"
    ds.to_parquet(str(parquet))
    want = [(r["messages"][0]["content"], []) for r in rows]
    for profile in ("qwen3-8b-rubricem", "qwen3-8b-coreact"):
        for path in (tmp_path / "saved", parquet):
            cfg = load_config(profile, {"data.train": str(path)})
            qs = load_questions(cfg.data.train, config=cfg, fields=fields_of(cfg.data))
            assert [(q.question, q.golds) for q in qs] == want
    # the profile's own spec, from a Hugging Face cache laid out as the Hub names the split (offline)
    cache = tmp_path / "hf" / "hub"
    snap = cache / "datasets--rl-research--dr-tulu-rl-data" / "snapshots" / ("c" * 40)
    (snap / "data").mkdir(parents=True)
    (snap / "data" / parquet.name).write_bytes(parquet.read_bytes())
    (cache / "datasets--rl-research--dr-tulu-rl-data" / "refs").mkdir()
    (cache / "datasets--rl-research--dr-tulu-rl-data" / "refs" / "main").write_text("c" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_config("qwen3-8b-rubricem")
    qs = load_questions(cfg.data.train, config=cfg, fields=fields_of(cfg.data))
    assert [(q.question, q.golds) for q in qs] == want
    assert not [p for p in check(cfg, gpu_count=8, env={}) if p.startswith("data.")]
    # without the mapping the rows are refused, naming the field to set (never read as something else)
    from arbor.tasks.env.datasets import DatasetError

    with pytest.raises(DatasetError, match="set data.question_field"):
        load_questions(str(parquet))


def test_uncached_paper_data_is_refused_in_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    """`arbor train -p qwen3-8b-rubricem` on an offline node without DR Tulu's queries: one line naming the set, the
    download, and the file alternative; ARBOR_HOME untouched."""
    home = tmp_path / "home"
    env = {"ARBOR_HOME": str(home), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
           "HF_HUB_CACHE": str(tmp_path / "empty-cache")}
    proc = subprocess.run([sys.executable, "-m", "arbor.cli", "train", "-p", "qwen3-8b-rubricem"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr
    [line] = [x for x in proc.stderr.splitlines() if x.strip()]
    assert line.startswith("error: profile 'qwen3-8b-rubricem' cannot start here: ")
    assert (f"data.train: {DR_TULU}: the Hub is offline here (HF_HUB_OFFLINE=1) and it is not in the Hugging Face "
            f"cache {tmp_path / 'empty-cache'}") in line
    assert "`hf download rl-research/dr-tulu-rl-data --repo-type dataset`" in line
    assert "data.train=path/to/questions.jsonl" in line
    assert not home.exists() or not any(home.iterdir())


def test_arco_uncached_hotpotqa_is_named_by_preflight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_config("qwen3-4b-arco")
    [msg] = [p for p in check(cfg, gpu_count=8, env={}) if p.startswith("data.")]
    assert msg.startswith("data.train: hf:hotpotqa/hotpot_qa/distractor:train: the Hub is offline here")


def test_start_line_states_a_train_size_larger_than_the_set() -> None:
    """ARCO asks for 2,000 questions: on a smaller set the start line says all of it is used (never silent)."""
    from arbor.flows.run_setup import data_line

    cfg = load_config("qwen3-4b-arco", {"data.train": "offline:train"})
    n = len(load_questions(cfg.data.train, size=cfg.data.train_size, seed=cfg.run.seed, config=cfg))
    assert n == 129
    assert data_line(cfg.data, cfg.run.eval_every, n) == (
        "data: trains on offline:train (129 questions; data.train_size=2000 asks for more than it holds: all 129 "
        "are used); evaluates on bench:hotpotqa, bench:2wiki, bench:musique by `arbor eval` (no in-run evaluation: "
        "run.eval_every unset)")
    cfg = load_config("qwen3-8b", {"run.eval_every": "10"})
    assert data_line(cfg.data, cfg.run.eval_every, 2000) == ("data: trains on arpo:train2k (2000 questions); evaluates on bench:bamboogle, "
                                    "bench:hotpotqa, bench:musique, bench:2wiki every 10 steps")


def test_runs_row_names_the_sets(arbor_home: Path) -> None:
    from arbor.flows.run_setup import prepare_run
    from arbor.storage.parquet import read_stage

    cfg = prepare_run("tiny-cpu", {"data.eval": "[bench:hotpotqa, bench:2wiki]"}, None, False, arbor_home)
    [row] = read_stage("runs", run_id=cfg.run.run_id, step=0, stage="run", home=arbor_home)
    assert (row["train_set"], row["eval_sets"]) == ("offline:train", ["bench:hotpotqa", "bench:2wiki"])


def test_config_show_marks_the_data_keys() -> None:
    text = render_config(load_config("qwen3-8b"), config_sources("qwen3-8b"))
    assert 'train: "arpo:train2k"  # profile' in text
    assert "eval: ['bench:bamboogle', 'bench:hotpotqa', 'bench:musique', 'bench:2wiki']  # profile" in text
    text = render_config(load_config("qwen3-8b-rubricem"), config_sources("qwen3-8b-rubricem"))
    assert f'train: "{DR_TULU}"  # profile' in text and 'question_field: "messages"  # profile' in text


def test_single_eval_set_keeps_its_form() -> None:
    """The tiny and smol profiles keep one string: the same one set, reported under the same name as before."""
    from arbor.preflight.inputs import data_sets

    for profile, spec in (("tiny-cpu", "offline:eval"), ("tiny-world", "world:eval"), ("smol-world", "world:eval")):
        cfg = load_config(profile, {"run.eval_every": "5"})
        assert cfg.data.eval == spec and cfg.data.eval_sets() == [spec]
        assert data_sets(cfg.data, cfg.run) == [("data.train", cfg.data.train), ("data.eval", spec)]
    with pytest.raises(Exception, match="named twice"):
        load_config("tiny-cpu", {"data.eval": "[bench:2wiki, bench:2wiki]"})


def test_the_cpu_profiles_keep_their_sft_keys() -> None:
    """An SFT start's key hashes ``data``; the field added for DR Tulu's rows must not re-key every start (the
    records' and the benches' starts stay found), while turning it off re-keys. Keys move only on purpose: SFT on
    the RL trainer's packer re-keyed every start once (tiny-world's was 9878cb976951)."""
    from arbor.flows.sft import sft_key

    cfg = load_config("tiny-world")
    before = cfg.data.model_dump(mode="json", exclude={"require_answers"})
    assert "require_answers" not in before and sft_key(cfg) != sft_key(load_config("tiny-world", {"data.require_answers": False}))
    # the start of docs/results.md's tiny-world table; a WORLD_VERSION bump moves it
    assert sft_key(cfg) == "4315b03ad0a9"
    # and the other CPU profiles' (fields added since to sections the key hashes, e.g. search.stall_s, are left out)
    assert (sft_key(load_config("tiny-cpu")), sft_key(load_config("smol-world"))) == ("61362d23a600", "e35092214596")
