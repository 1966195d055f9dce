"""SFT data synthesised from the offline training questions with the real BM25 backend; a user's
flat JSONL staged for RubricEM's start, with reflection rows."""

from __future__ import annotations

import json
import re

import pytest

from arbor.config import load_config
from arbor.format import (
    ARBOR,
    RUBRICEM,
    check_format,
    extract_answer,
    extract_results,
    extract_searches,
    reflection_blocks,
    result_block,
)
from arbor.tasks.env.datasets import load_questions
from arbor.tasks.env.policy import train_tokenizer
from arbor.tasks.env.search import format_results, make_search
from arbor.tasks.env.sft_data import (
    SFTDataError,
    build_sft_data,
    read_sft_data,
    reflection_share,
    reflection_warning,
    synthesize,
    tokenize_sft_example,
    write_jsonl,
)
from arbor.tasks.env.staging import stage_response, stage_row
from arbor.tasks.reflection import REFLECTION_SYSTEM_PROMPT


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    cfg = load_config("tiny-cpu", {"sft.variants": 1})
    search = make_search(cfg.search, home=home)
    path = build_sft_data(cfg, home / "sft.jsonl", home=home, seed=0, search=search)
    return cfg, search, home, path


def test_variants_are_differently_seeded_responses_to_the_same_questions(setup):
    cfg, search, _, _ = setup
    qs = load_questions("offline:train")[:10]
    kw = dict(top_k=cfg.search.top_k, max_result_chars=cfg.search.max_result_chars, max_searches=3)
    one = synthesize(qs, search, seed=0, **kw)
    two = synthesize(qs, search, seed=0, variants=2, **kw)
    assert two[:10] == one  # the first variant is the plain seed
    assert [r["question_id"] for r in two[10:]] == [q.question_id for q in qs]
    assert [r["response"] for r in two[10:]] != [r["response"] for r in one]  # other templates / hops


def test_every_response_is_valid_and_grounded_in_real_search(setup):
    cfg, search, _, path = setup
    rows = read_sft_data(path)
    train = load_questions("offline:train")
    assert [r["question_id"] for r in rows] == [q.question_id for q in train]
    held_out = {q.question_id for q in load_questions("offline:eval")}
    assert not held_out & {r["question_id"] for r in rows}
    n_two_hop = 0
    for row, q in zip(rows, train, strict=True):
        fmt = check_format(row["response"], truncated=False)
        assert fmt.valid, (row["question_id"], fmt.reason)
        assert extract_answer(row["response"]) == q.golds[0] == fmt.answer and row["golds"] == q.golds
        queries, results = extract_searches(row["response"]), extract_results(row["response"])
        assert 1 <= len(queries) == len(results) <= cfg.rollout.max_searches
        for query in queries:  # each <result> block is exactly what the backend returns, formatted as the loop does
            block = result_block(format_results(search.search([query], cfg.search.top_k)[0],
                                                cfg.search.max_result_chars))
            assert block in row["response"]
        n_two_hop += len(queries) >= 2
    assert n_two_hop >= len(rows) // 3  # multi-hop questions get follow-up searches


def test_deterministic_given_seed(setup):
    cfg, search, _, _ = setup
    qs = load_questions("offline:train")[:20]
    kw = dict(top_k=cfg.search.top_k, max_result_chars=cfg.search.max_result_chars, max_searches=3)
    a, b = synthesize(qs, search, seed=0, **kw), synthesize(qs, search, seed=0, **kw)
    c = synthesize(qs, search, seed=1, **kw)
    assert a == b and a != c


def test_tokenisation_masks_exactly_the_result_blocks(setup):
    _, _, _, path = setup
    rows = read_sft_data(path)[:10]
    tok = train_tokenizer(vocab_size=800, texts=iter([r["response"] for r in rows]))
    for row in rows:
        prompt, resp, mask = tokenize_sft_example(tok, row)
        assert len(resp) == len(mask) and prompt
        assert tok.decode(resp, skip_special_tokens=False) == row["response"]
        masked = tok.decode([t for t, m in zip(resp, mask, strict=True) if m == 0], skip_special_tokens=False)
        blocks = extract_results(row["response"])
        assert masked == "".join(f"\n<result>\n{b}\n</result>\n" for b in blocks)


def test_read_sft_data_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "response": "r"}) + "\n" + "{not json\n")
    with pytest.raises(SFTDataError, match=r"bad.jsonl:2: not valid JSON"):
        read_sft_data(bad)
    bad.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(SFTDataError, match=r"bad.jsonl:1: 'response'"):
        read_sft_data(bad)


# ------------------------------------------------------------------------------------------------ RubricEM's staged start


def test_synthesised_flat_rows_stage_into_the_staged_rows_of_the_same_seed(setup):
    """The conversion is the synthesiser's own staged form: a flat row staged equals the row written staged."""
    cfg, search, _, _ = setup
    qs = load_questions("offline:train")[:30]
    kw = dict(seed=0, top_k=cfg.search.top_k, max_result_chars=cfg.search.max_result_chars, max_searches=3)
    flat, staged = synthesize(qs, search, **kw), synthesize(qs, search, protocol=RUBRICEM, **kw)
    assert [stage_row(r) for r in flat] == staged
    assert any(len(extract_searches(r["response"])) >= 2 for r in flat)  # state evaluations are exercised too


def _rubricem_cfg(data, **extra):
    return load_config("qwen3-8b", {"rollout.protocol": "rubricem", "run.method": "rubricem", "sft.data": str(data),
                                    "sft.output": None, **extra})


def test_arbor_sft_stages_a_flat_jsonl_and_adds_reflection_rows_for_rubricem(setup, tmp_path, capsys):
    from arbor.flows.sft import sft_data_path, sft_key

    _, _, _, path = setup
    flat = read_sft_data(path)[:40]
    already = {**flat[0], "question_id": "already", "response": stage_response(flat[0]["response"])}
    no_plan = {**flat[1], "question_id": "no-plan", "response": flat[1]["response"].replace("<think>", "", 1)
               .replace("</think>", "", 1)}
    data = tmp_path / "toolstar_still_search.jsonl"
    write_jsonl(flat[:2] + [no_plan, already] + flat[2:], data)  # line 3: no reasoning before its first search
    cfg = _rubricem_cfg(data)
    out = sft_data_path(cfg, tmp_path / "home", sft_key(cfg))
    assert out != data and out.parent == tmp_path / "home" / "sft"
    assert f"{data}:3: no <think> before the first search" in capsys.readouterr().out
    rows = read_sft_data(out, "rubricem")
    gold = [r for r in rows if "system" not in r and "<reference_examples>" not in r["question"]]
    assert gold == [stage_row(r) for r in flat[:2]] + [already] + [stage_row(r) for r in flat[2:]]
    assert all(check_format(r["response"], protocol=RUBRICEM).valid for r in gold)
    reflections = [r for r in rows if r.get("system") == REFLECTION_SYSTEM_PROMPT]
    copies = [r for r in rows if "<reference_examples>" in r["question"]]
    assert 0 < len(reflections) == len(copies) and len(rows) == len(gold) + 2 * len(reflections)
    assert reflection_share(cfg.sft, cfg.rollout.protocol) == 0.25  # unset: RubricEM's share
    for r in reflections:
        assert reflection_blocks(r["response"]) is not None
        assert any(g["response"] in r["question"] for g in gold)  # a reflection on a staged trajectory
    assert all(check_format(r["response"], protocol=RUBRICEM).valid for r in copies)
    # the staged file is reused while the user's file is unchanged, rebuilt when it changes
    assert sft_data_path(cfg, tmp_path / "home", sft_key(cfg)) == out
    write_jsonl(flat[:10], data)
    assert sft_data_path(cfg, tmp_path / "home", sft_key(cfg)) != out
    # an arbor run trains the file as it is
    plain = load_config("qwen3-8b", {"sft.data": str(data)})
    assert sft_data_path(plain, tmp_path / "home", sft_key(plain)) == data
    assert reflection_share(plain.sft, plain.rollout.protocol) == 0


def test_a_file_with_no_stageable_row_is_refused_naming_file_and_line(tmp_path):
    from arbor.flows.sft import sft_data_path

    data = tmp_path / "bad.jsonl"
    write_jsonl([{"question": "q", "response": "<think>Easy.</think>\n<answer>\\boxed{Paris}</answer>"}], data)
    with pytest.raises(SFTDataError, match=r"bad.jsonl:1: no search: RubricEM's Research stage needs"):
        sft_data_path(_rubricem_cfg(data), tmp_path / "home", "k")


def test_rows_in_another_protocols_tags_are_refused_by_line(setup, tmp_path):
    _, _, _, path = setup
    rows = read_sft_data(path)[:3]
    data = tmp_path / "flat.jsonl"
    write_jsonl(rows, data)
    assert read_sft_data(data, "arbor") == rows
    with pytest.raises(SFTDataError, match=r"flat.jsonl:1: the response uses <result> .*arbor-sft stages"):
        read_sft_data(data, "rubricem")
    write_jsonl([stage_row(r) for r in rows], data)
    with pytest.raises(SFTDataError, match=r"flat.jsonl:1: the response uses <tool_output>"):
        read_sft_data(data, "arbor")


def test_reflection_share_defaults_and_the_rubricem_warning(tmp_path):
    from arbor.flows.sft import sft_key

    data = tmp_path / "d.jsonl"
    unset, none = _rubricem_cfg(data), _rubricem_cfg(data, **{"sft.reflections": 0})
    assert (reflection_share(unset.sft, unset.rollout.protocol), reflection_share(none.sft, none.rollout.protocol)) == \
        (0.25, 0.0)
    assert reflection_warning(unset.run.method, unset.sft, unset.rollout.protocol) is None
    assert "sft.reflections=0 with run.method=rubricem" in reflection_warning(none.run.method, none.sft,
                                                                              none.rollout.protocol)
    assert sft_key(unset) != sft_key(none)
    assert sft_key(unset) == sft_key(_rubricem_cfg(data, **{"sft.reflections": 0.25}))
    arbor = load_config("tiny-cpu")  # keys of runs without reflections do not move
    assert reflection_share(arbor.sft, arbor.rollout.protocol) == 0
    assert sft_key(arbor) == sft_key(load_config("tiny-cpu", {"sft.reflections": 0}))


def test_a_fixed_sft_output_holding_a_flat_start_is_not_reused_for_rubricem(tmp_path):
    from arbor.flows.sft import sft_checkpoint

    out = tmp_path / "sft" / "qwen3-8b"
    out.mkdir(parents=True)
    (out / "arbor_sft.json").write_text(json.dumps({"key": "0123456789ab", "data": "flat.jsonl"}))  # no protocol: arbor
    cfg = _rubricem_cfg(tmp_path / "d.jsonl", **{"sft.output": str(out)})
    with pytest.raises(SFTDataError, match=r"holds an SFT start in protocol 'arbor', but rollout.protocol=rubricem"):
        sft_checkpoint(cfg, tmp_path)


def test_sft_guided_adds_guided_copies_and_keeps_the_keys_of_unguided_starts(setup, tmp_path, capsys):
    """``sft.guided``: the run's SFT file is the gold rows, then guided copies of a share of them
    (the rubric after the question and inside observations; the same gold responses otherwise); the key moves with
    the share and with the guidance settings the copies are written with, and stays where it was without them."""
    from arbor.flows.sft import sft_data_path, sft_key

    _, _, _, path = setup
    gold = read_sft_data(path)[:60]
    data = tmp_path / "mine.jsonl"
    write_jsonl(gold, data)
    plain = load_config("tiny-cpu", {"sft.data": str(data)})
    cfg = load_config("tiny-cpu", {"sft.data": str(data), "sft.guided": 0.5})
    out = sft_data_path(cfg, tmp_path / "home", sft_key(cfg))
    assert out.parent == tmp_path / "home" / "sft" and out.name.startswith(f"data-{sft_key(cfg)}-guided-")
    rows = read_sft_data(out, "arbor")
    copies = rows[len(gold):]
    assert rows[: len(gold)] == gold and 10 < len(copies) < 50
    assert f"{len(copies)} guided copies of 60 rows" in capsys.readouterr().out
    by_id = {r["question_id"]: r for r in gold}
    for c in copies:
        g = by_id[c["question_id"]]
        assert c["question"].startswith(g["question"] + "\n\nStep rubric for your next step:\n1. [")
        results = len(ARBOR.observation_re.findall(g["response"]))  # a rubric before each turn that may search
        assert c["response"].count("Step rubric for your next step:") == min(results, cfg.rollout.max_searches - 1)
        assert check_format(c["response"]).valid
        assert re.sub(r"\n\nStep rubric for your next step:.*?\n(?=</result>)", "\n", c["response"],
                      flags=re.DOTALL) == g["response"]  # the gold response around the placed rubrics
    assert sft_data_path(cfg, tmp_path / "home", sft_key(cfg)) == out  # reused
    write_jsonl(gold[:30], data)  # the user's file changed under the same name: written again
    again = sft_data_path(cfg, tmp_path / "home", sft_key(cfg))
    assert again != out and read_sft_data(again)[:30] == gold[:30] and len(read_sft_data(again)) < len(rows)
    assert sft_key(plain) == sft_key(load_config("tiny-cpu", {"sft.data": str(data), "sft.guided": 0}))
    assert len({sft_key(plain), sft_key(cfg), sft_key(load_config("tiny-cpu", {
        "sft.data": str(data), "sft.guided": 0.5, "guidance.tau": 0.7}))}) == 3
