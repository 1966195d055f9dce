"""SFT on tag-format JSONL with result blocks masked."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from arbor.config import load_config
from arbor.tasks.env.agent import tokenize_trajectory
from arbor.tasks.env.policy import build_tiny_policy
from arbor.tasks.env.sft_data import SFTDataError
from arbor.tasks.training.sft import batches, run_sft, sft_loss, tokenize_rows

ROWS = [
    {"question": "Who wrote Hamlet?", "golds": ["William Shakespeare"],
     "response": "<think>I should look it up.</think>\n<search>Hamlet author</search>\n<result>Hamlet is a tragedy "
                 "written by William Shakespeare.</result>\n<think>The passage says Shakespeare.</think>\n"
                 "<answer>\\boxed{William Shakespeare}</answer>"},
    {"question": "What is the capital of France?", "golds": ["Paris"],
     "response": "<think>Search for it.</think>\n<search>capital of France</search>\n<result>Paris is the capital "
                 "and largest city of France.</result>\n<think>Paris.</think>\n<answer>\\boxed{Paris}</answer>"},
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(home=tmp_path_factory.mktemp("home"))


def test_sft_loss_by_hand() -> None:
    # log-probs [-1, -2, -3] with the middle (result) token masked: -(-1 - 3) / 2 tokens = 2.0
    logp = torch.tensor([[-1.0, -2.0, -3.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    assert sft_loss(logp, mask, n_tokens=2).item() == pytest.approx(2.0)


def test_batches_cover_every_example_once() -> None:
    b = batches(10, 4, seed=0, epoch=0)
    assert [len(x) for x in b] == [4, 4, 2]
    assert sorted(i for x in b for i in x) == list(range(10))
    assert b != batches(10, 4, seed=0, epoch=1)  # reshuffled each epoch


def test_tokenize_rows_masks_results_and_truncates(tiny_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    ex, truncated = tokenize_rows(ROWS, tok, max_length=10_000)
    assert truncated == 0 and len(ex) == 2
    p, r, m = tokenize_trajectory(tok, ROWS[0]["question"], ROWS[0]["response"])
    assert ex[0].response_ids == r and ex[0].loss_mask == m
    result_ids = tok.encode("\n<result>Hamlet is a tragedy written by William Shakespeare.</result>\n",
                            add_special_tokens=False)
    assert m.count(0) == len(result_ids)  # exactly the result block is masked
    short, truncated = tokenize_rows(ROWS, tok, max_length=len(p) + 5)
    assert truncated == 2 and all(len(e.response_ids) <= 5 for e in short)


def test_sft_uses_the_runs_system_prompt(tiny_dir: Path) -> None:
    """SFT prompts are the RL rollouts' prompts: rollout.system_prompt, and the SFT key changes with it."""
    from arbor.flows.sft import sft_key
    from arbor.tasks.env.agent import build_prompt_ids

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    sp = "Search, then answer in \\boxed{}."
    (ex,), _ = tokenize_rows(ROWS[:1], tok, max_length=10_000, system_prompt=sp)
    assert ex.prompt_ids == build_prompt_ids(tok, ROWS[0]["question"], sp)
    (default,), _ = tokenize_rows(ROWS[:1], tok, max_length=10_000)
    assert default.prompt_ids == build_prompt_ids(tok, ROWS[0]["question"]) != ex.prompt_ids
    assert default.response_ids == ex.response_ids
    assert sft_key(load_config("tiny-cpu", {"rollout.system_prompt": sp})) != sft_key(load_config("tiny-cpu"))


def test_sft_lowers_the_loss_and_saves_a_loadable_checkpoint(tiny_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    cfg = load_config("tiny-cpu", {"sft.epochs": 8, "sft.batch_size": 2, "sft.lr": 1e-3})
    logged: list[dict[str, float]] = []
    summary = run_sft(cfg, tiny_dir, data, tmp_path / "out", home=tmp_path, log=logged.append)
    assert summary["updates"] == 8 and summary["epochs_done"] == 8 and not summary["stopped_early"]
    assert summary["last_loss"] < 0.75 * summary["first_loss"]
    # cosine with 10% warm-up over 8 updates: warm-up int(0.8) = 0 -> first lr = 1e-3, then decays toward 0
    assert logged[0]["lr"] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 1 / 8)))
    assert logged[-1]["lr"] < logged[0]["lr"]
    out = Path(summary["out"])
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    p, r, m = tokenize_trajectory(tok, ROWS[1]["question"], ROWS[1]["response"])
    ids = torch.tensor([p + r])
    base = AutoModelForCausalLM.from_pretrained(tiny_dir)

    def nll(mdl: torch.nn.Module) -> float:
        with torch.no_grad():
            logits = mdl(input_ids=ids).logits[0, len(p) - 1 : -1]
        lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r)[:, None])[:, 0]
        mask = torch.tensor(m, dtype=torch.float32)
        return float(-(lp * mask).sum() / mask.sum())

    assert nll(model) < nll(base)


def test_the_first_update_scores_packed_rows_as_each_sequence_alone(tiny_dir: Path, tmp_path: Path) -> None:
    """SFT cuts its batches with the RL trainer's packer: two short sequences share a row behind a long
    one's, and the first update's loss (every micro-batch scored before the step) equals the masked NLL of each
    sequence scored alone by the start model, over the batch's loss tokens. A row scored without its position ids
    (the short ones attending to each other) or a mask cut wrongly moves it."""
    from arbor.tasks.training.packing import pack_micro_batches, packing_mode

    long_row = {**ROWS[0], "response": "<think>" + "I should look it up carefully. " * 40 + "</think>\n"
                + ROWS[0]["response"]}
    rows = [long_row, ROWS[1], {**ROWS[1], "question": "Which city is the capital of France?"}]
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config("tiny-cpu", {"sft.epochs": 1, "sft.batch_size": 3, "sft.lr": 1e-3})
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    examples, _ = tokenize_rows(rows, tok, cfg.sft.max_length, cfg.rollout.system_prompt, cfg.rollout.protocol)
    base = AutoModelForCausalLM.from_pretrained(tiny_dir).float()
    lengths = [e.length for e in examples]
    assert packing_mode(base) == "packed"
    cut = pack_micro_batches(lengths, cfg.train.micro_batch_tokens, "packed")
    assert any(len(row) == 2 for mb in cut for row in mb), cut  # two sequences end to end in one row
    nll, n_tok = 0.0, 0
    for e in examples:
        with torch.no_grad():
            logits = base(input_ids=torch.tensor([e.prompt_ids + e.response_ids])).logits[0].float()
        lp = torch.log_softmax(logits[len(e.prompt_ids) - 1 : -1], -1)
        lp = lp.gather(-1, torch.tensor(e.response_ids)[:, None])[:, 0]
        mask = torch.tensor(e.loss_mask, dtype=torch.float32)
        nll -= float((lp * mask).sum())
        n_tok += int(mask.sum())
    summary = run_sft(cfg, tiny_dir, data, tmp_path / "out", home=tmp_path)
    assert summary["updates"] == 1
    assert summary["first_loss"] == pytest.approx(nll / n_tok, rel=1e-5)


def test_bad_jsonl_names_file_and_line(tiny_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps(ROWS[0]) + "\n" + '{"question": "q"}\n')
    with pytest.raises(SFTDataError, match=r"bad\.jsonl:2"):
        run_sft(load_config("tiny-cpu"), tiny_dir, data, tmp_path / "out", home=tmp_path)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_sft_teaches_the_tiny_policy_to_search(sft_policy: Path, tmp_path: Path) -> None:
    """Acceptance: the tiny-cpu SFT warm start (the session's ``sft_policy``: synthetic trajectories,
    ~2.5 minutes on two idle cores) raises the format-valid rate and the searches per trajectory on *held-out* questions by a
    clear margin, rollouts before and after with a fixed seed."""
    from arbor.tasks.env.datasets import load_questions
    from arbor.tasks.env.policy import load_policy
    from arbor.tasks.env.rollout import TransformersEngine
    from arbor.tasks.env.search import make_search

    cfg = load_config("tiny-cpu")
    search = make_search(cfg.search, home=tmp_path)
    held_out = load_questions("offline:eval")[:12]
    assert not {q.question_id for q in held_out} & {q.question_id for q in load_questions("offline:train")}

    def rollout_stats(path: Path | str) -> dict[str, float]:
        model, tok = load_policy(str(path))
        trajs = TransformersEngine(cfg, model, tok, search).generate_groups(held_out, 4, seed=1, step=0)
        n = len(trajs)
        return dict(format_valid=sum(t.format_valid for t in trajs) / n,
                    searches=sum(t.search_calls for t in trajs) / n,
                    f1=sum(t.f1 for t in trajs) / n)

    before = rollout_stats(build_tiny_policy(home=tmp_path))
    after = rollout_stats(sft_policy)
    summary = json.loads((sft_policy / "arbor_sft.json").read_text())
    print(f"before {before}\nafter {after}\nsft {summary}")
    assert summary["updates"] > 0 and not summary["stopped_early"]  # (its wall time is a benchmark figure)
    assert after["format_valid"] >= before["format_valid"] + 0.5
    assert after["searches"] >= before["searches"] + 1.0


def test_the_sft_process_group_is_launched_over_the_nodes_gpus() -> None:
    """On the qwen3 layout the SFT runs under the deepspeed launcher on every GPU of the node (no
    rollout runs beside it), like the RL trainer; on CPU N gloo ranks under torchrun; one CPU rank trains in-process."""
    from arbor.tasks.training.sft import launch_command, launches_process_group

    cmd = launch_command(load_config("qwen3-8b"), ["--config", "c.json"], master_port=29999)
    assert cmd == ["deepspeed", "--include", "localhost:0,1,2,3,4,5,6,7", "--master_port", "29999",
                   "--no_local_rank", "--module", "arbor.tasks.training.sft", "--config", "c.json"]
    four = launch_command(load_config("qwen3-8b", {"sft.processes": 4}), [], master_port=1)
    assert four is not None and four[:3] == ["deepspeed", "--include", "localhost:0,1,2,3"]
    cpu = launch_command(load_config("tiny-cpu", {"sft.processes": 2}), ["--x"], python="py", master_port=7)
    assert cpu == ["py", "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                   "--master_port", "7", "-m", "arbor.tasks.training.sft", "--x"]
    assert launch_command(load_config("tiny-cpu"), []) is None
    for profile, o in [("qwen3-8b", {}), ("tiny-cpu", {"sft.processes": 2}), ("tiny-cpu", {}),
                       ("tiny-cpu", {"sft.processes": 1}), ("tiny-cpu", {"train.num_gpus": 2})]:
        cfg = load_config(profile, o)  # the flow's decision and the command agree
        assert launches_process_group(cfg) == (launch_command(cfg, [], master_port=1) is not None), (profile, o)


@pytest.mark.slow
def test_two_rank_sft_resumes_bit_identically_after_a_kill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2-rank DeepSpeed SFT on CPU (gloo, torchrun), killed after update 5 with its state kept at
    update 4, resumes from update 4 when run again and ends with the uninterrupted run's exact weights."""
    from safetensors.torch import load_file

    from arbor.flows.sft import SFTLaunchError, sft_checkpoint

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS * 4))  # 8 rows, batch 2: 4 updates an epoch
    overrides = {"sft.data": str(data), "sft.epochs": 2, "sft.batch_size": 2, "sft.processes": 2,
                 "sft.save_every": 2, "sft.lr": 1e-3}

    def sft(home: Path) -> Path:
        monkeypatch.setenv("ARBOR_HOME", str(home))
        return sft_checkpoint(load_config("tiny-cpu", overrides), home)

    whole = sft(tmp_path / "whole")
    monkeypatch.setenv("ARBOR_SFT_FAULT", "5")
    with pytest.raises(SFTLaunchError, match=r"(?s)exited with status [1-9].*resume.*exitcode\s*: 137"):
        sft(tmp_path / "killed")
    (state,) = (tmp_path / "killed" / "sft").glob(".state-*")
    assert json.loads((state / "sft_state.json").read_text())["update"] == 4
    assert not list((tmp_path / "killed" / "sft").glob("tiny-cpu-*"))  # no checkpoint that looks complete
    monkeypatch.delenv("ARBOR_SFT_FAULT")
    resumed = sft(tmp_path / "killed")
    made = json.loads((resumed / "arbor_sft.json").read_text())
    assert (made["world_size"], made["resumed_from"], made["updates"]) == (2, 4, 8)
    assert json.loads((whole / "arbor_sft.json").read_text())["resumed_from"] == 0
    a, b = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not state.exists()  # the checkpoint is in place: the kept state is gone
