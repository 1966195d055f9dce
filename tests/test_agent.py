"""The agent loop as a state machine, driven by scripted generations (our code path; no model, no mock).

A real tokenizer (byte-level BPE trained here) and a real BM25 index over a small corpus file.
"""

from __future__ import annotations

import json

import pytest

from arbor.format import check_format, result_block
from arbor.tasks.env.agent import (
    SYSTEM_PROMPT,
    AgentLoop,
    Budgets,
    Generation,
    build_prompt_ids,
    check_prefix_property,
    encode_text,
    tokenize_trajectory,
)
from arbor.tasks.env.policy import train_tokenizer
from arbor.tasks.env.search import BM25Search, format_results

PASSAGES = [
    {"id": "p1", "title": "Ed Wood", "text": "Edward Davis Wood Jr. was an American filmmaker and actor."},
    {"id": "p2", "title": "Scott Derrickson", "text": "Scott Derrickson is an American director and screenwriter."},
    {"id": "p3", "title": "Tyler Bates", "text": "Tyler Bates is an American musician and film composer."},
    {"id": "p4", "title": "Doctor Strange", "text": "Doctor Strange is a 2016 film directed by Scott Derrickson."},
]
FORCE = "\n<result>No more searches. Answer now.</result>\n"


@pytest.fixture(scope="module")
def tok():
    texts = [SYSTEM_PROMPT, "<think>a</think><search>q</search>\n<result>\nDoc 1 (Title: t) x\n</result>\n"] * 20
    texts += [f"{p['title']} {p['text']}" for p in PASSAGES] * 20
    return train_tokenizer(vocab_size=600, texts=iter(texts))


@pytest.fixture(scope="module")
def search(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    path = d / "corpus.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    return BM25Search(path, cache_dir=d / "bm25")


def gen(tok, text: str, lp: float = -0.5, finish: str = "stop") -> Generation:
    ids = encode_text(tok, text)
    return Generation(ids, [lp] * len(ids), finish)  # type: ignore[arg-type]


def budgets(**kw) -> Budgets:
    base = dict(max_turns=6, max_searches=2, max_response_tokens=4000, max_context_tokens=8000,
                max_new_tokens_per_turn=300, top_k=2, max_result_chars=40, force_answer_message=FORCE)
    base.update(kw)
    return Budgets(**base)


def test_scripted_episode_turns_masks_and_search_budget(tok, search):
    loop = AgentLoop(tok, search, budgets())
    s = loop.start("q1", "Who directed Doctor Strange?", ["Scott Derrickson"], seed=7)
    assert s.prompt_ids == build_prompt_ids(tok, "Who directed Doctor Strange?")
    script = [
        "<think>Find the film.</think>\n<search>Doctor Strange film</search>",
        "<search>Scott Derrickson</search>",
        "<search>Tyler Bates</search>",  # third search: budget of 2 spent -> forced message, no search
        "<think>Done.</think>\n<answer>\\boxed{Scott Derrickson}</answer>",
    ]
    requests = []
    for turn in script:
        req = loop.next_request(s)
        requests.append(req)
        loop.advance([s], [gen(tok, turn)])
    assert s.done and s.finish_reason == "answer" and not s.truncated
    assert [t.ended_by for t in s.turns] == ["search", "search", "search", "answer"]
    assert s.search_queries == ["Doctor Strange film", "Scott Derrickson"]  # the third was refused
    assert s.forced_final == 1

    hits1 = search.search(["Doctor Strange film"], 2)[0]
    hits2 = search.search(["Scott Derrickson"], 2)[0]
    obs = [result_block(format_results(hits1, 40)), result_block(format_results(hits2, 40)), FORCE]
    expected_text = script[0] + obs[0] + script[1] + obs[1] + script[2] + obs[2] + script[3]
    assert s.text == expected_text
    assert check_format(s.text, s.truncated).valid

    # exact token layout: policy turn (mask 1, its log-probs) then observation (mask 0, log-prob 0)
    ids, mask, lps = [], [], []
    for i, turn in enumerate(script):
        t = encode_text(tok, turn)
        ids += t
        mask += [1] * len(t)
        lps += [-0.5] * len(t)
        if i < 3:
            o = encode_text(tok, obs[i])
            ids += o
            mask += [0] * len(o)
            lps += [0.0] * len(o)
    assert s.response_ids == ids and s.loss_mask == mask and s.logprobs == lps

    # token-in/token-out: each request's context is the previous context + sampled tokens + observation
    for a, b in zip(requests, requests[1:], strict=False):
        assert b.context_ids[: len(a.context_ids)] == a.context_ids
    assert requests[0].context_ids == s.prompt_ids
    assert len({r.seed for r in requests}) == 4  # a fresh, derived seed per turn
    check_prefix_property(s)

    # the SFT tokenisation of the finished text reproduces the loop's ids and mask exactly
    p, r, m = tokenize_trajectory(tok, s.question, s.text)
    assert (p, r, m) == (s.prompt_ids, s.response_ids, s.loss_mask)


def test_turn_budget_ends_with_max_turns(tok, search):
    loop = AgentLoop(tok, search, budgets(max_turns=2, max_searches=10))
    s = loop.start("q", "Who is Ed Wood?", ["filmmaker"], seed=0)
    loop.advance([s], [gen(tok, "<search>Ed Wood</search>")])
    assert not s.done and s.search_calls == 1
    loop.advance([s], [gen(tok, "<search>Ed Wood actor</search>")])
    # the second turn was the last: no search is run for it and the trajectory is a truncation
    assert s.finish_reason == "max_turns" and s.truncated and s.search_calls == 1
    assert s.text.endswith("</search>")
    assert not check_format(s.text, s.truncated).valid
    with pytest.raises(ValueError, match="finished"):
        loop.next_request(s)


def test_response_budget_truncates_observation_and_request_budget(tok, search):
    first = "<search>Ed Wood</search>"
    n_first = len(encode_text(tok, first))
    loop = AgentLoop(tok, search, budgets(max_response_tokens=n_first + 5, max_new_tokens_per_turn=1000))
    s = loop.start("q", "Who is Ed Wood?", ["filmmaker"], seed=0)
    assert loop.next_request(s).max_new_tokens == n_first + 5  # the response budget caps the turn
    loop.advance([s], [gen(tok, first)])
    # the result block does not fit: 5 of its tokens are appended (masked) and the trajectory is truncated
    assert s.finish_reason == "length" and len(s.response_ids) == n_first + 5
    assert s.loss_mask == [1] * n_first + [0] * 5
    check_prefix_property(s)


def test_context_budget_caps_the_turn(tok, search):
    loop = AgentLoop(tok, search, budgets(max_context_tokens=10_000, max_new_tokens_per_turn=50))
    s = loop.start("q", "Who is Ed Wood?", ["filmmaker"], seed=0)
    assert loop.next_request(s).max_new_tokens == 50
    tight = AgentLoop(tok, search, budgets(max_context_tokens=len(s.prompt_ids) + 7))
    s2 = tight.start("q", "Who is Ed Wood?", ["filmmaker"], seed=0)
    assert tight.next_request(s2).max_new_tokens == 7
    too_long = AgentLoop(tok, search, budgets(max_context_tokens=len(s.prompt_ids)))
    assert too_long.start("q", "Who is Ed Wood?", ["x"], seed=0).finish_reason == "length"


def test_eos_and_length_finishes(tok, search):
    loop = AgentLoop(tok, search, budgets())
    s = loop.start("q", "Who?", ["x"], seed=0)
    ids = encode_text(tok, "<think>hmm</think>") + [tok.eos_token_id]
    loop.advance([s], [Generation(ids, [-1.0] * len(ids), "stop")])
    assert s.finish_reason == "stop" and s.text == "<think>hmm</think>"  # EOS kept as a token, not in the text
    assert s.response_ids[-1] == tok.eos_token_id and s.loss_mask[-1] == 1

    s = loop.start("q", "Who?", ["x"], seed=0)
    loop.advance([s], [gen(tok, "<think>rambling on", finish="length")])
    assert s.finish_reason == "length" and s.truncated


def test_empty_query_spends_no_search(tok, search):
    loop = AgentLoop(tok, search, budgets())
    s = loop.start("q", "Who?", ["x"], seed=0)
    loop.advance([s], [gen(tok, "<search> </search>")])
    assert not s.done and s.search_calls == 0 and "Empty query" in s.text
    check_prefix_property(s)


def test_batched_advance_runs_searches_together(tok, search):
    loop = AgentLoop(tok, search, budgets())
    states = [loop.start(f"q{i}", "Who?", ["x"], seed=i) for i in range(3)]
    loop.advance(states, [gen(tok, "<search>Ed Wood</search>"), gen(tok, "<answer>\\boxed{x}</answer>"),
                          gen(tok, "<search>Tyler Bates</search>")])
    assert [s.done for s in states] == [False, True, False]
    assert states[0].search_queries == ["Ed Wood"] and states[2].search_queries == ["Tyler Bates"]
    assert "Title: Tyler Bates" in states[2].text and "Title: Tyler Bates" not in states[0].text.split("</search>")[0]
    with pytest.raises(ValueError, match="2 log-probs"):
        loop.observe(states[0], Generation([1, 2, 3], [0.0, 0.0], "stop"))


def test_tokenize_trajectory_masks_only_result_blocks(tok):
    text = ("<think>x</think>\n<search>Ed Wood</search>\n<result>\nDoc 1 (Title: Ed Wood) a film maker\n</result>\n"
            "<answer>\\boxed{Ed}</answer>")
    prompt, resp, mask = tokenize_trajectory(tok, "Who?", text)
    assert prompt == build_prompt_ids(tok, "Who?")
    assert tok.decode(resp, skip_special_tokens=False) == text
    masked = tok.decode([t for t, m in zip(resp, mask, strict=True) if m == 0])
    assert masked == "\n<result>\nDoc 1 (Title: Ed Wood) a film maker\n</result>\n"


def test_prompt_uses_chat_template(tok):
    ids = build_prompt_ids(tok, "  Who?  ")
    text = tok.decode(ids, skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>user\nWho?<|im_end|>\n"
                                                                      "<|im_start|>assistant\n")


# ---- what the response budget bounds (App. B.2 as slime reads it) ------------------------------

SEARCH_THEN_ANSWER = ["<think>Find it.</think>\n<search>Doctor Strange film</search>",
                      "<search>Scott Derrickson</search>",
                      "<think>Done.</think>\n<answer>\\boxed{Scott Derrickson}</answer>"]


def test_per_call_budget_leaves_search_results_outside_the_response_budget(tok, search):
    """Results larger than the response budget: "total" (arbor's old reading) truncates the trajectory at the first
    result block, format-invalid; "per_call" (slime's --rollout-max-response-len) caps each call and continues."""
    turn = max(len(encode_text(tok, t)) for t in SEARCH_THEN_ANSWER)
    block = len(encode_text(tok, result_block(format_results(search.search(["Doctor Strange film"], 2)[0], None))))
    assert block > turn + 5  # a result block alone is over the response budget below
    kw = dict(max_response_tokens=turn + 5, max_new_tokens_per_turn=1000, max_result_chars=None, max_searches=5)

    old = AgentLoop(tok, search, budgets(**kw, response_budget="total"))
    s = old.start("q", "Who directed Doctor Strange?", ["Scott Derrickson"], seed=0)
    old.advance([s], [gen(tok, SEARCH_THEN_ANSWER[0])])
    assert s.finish_reason == "length" and len(s.response_ids) == turn + 5
    assert not check_format(s.text, s.truncated).valid

    loop = AgentLoop(tok, search, budgets(**kw, response_budget="per_call"))
    s = loop.start("q", "Who directed Doctor Strange?", ["Scott Derrickson"], seed=0)
    for t in SEARCH_THEN_ANSWER:
        assert loop.next_request(s).max_new_tokens == turn + 5  # min(per turn 1000, per call, context left)
        loop.advance([s], [gen(tok, t)])
    assert s.finish_reason == "answer" and s.search_calls == 2
    assert len(s.response_ids) > 2 * block > kw["max_response_tokens"]
    assert s.turns[0].observation_tokens == block and s.turns[1].observation_tokens > 0  # whole, untrimmed
    assert check_format(s.text, s.truncated).valid
    check_prefix_property(s)


def test_per_call_context_budget_caps_the_turn_and_trims_the_result(tok, search):
    """Under "per_call" the context budget binds on prompt + everything: a turn gets min(per call, context left),
    and a result block that would overflow the context is trimmed to fill it, ending the trajectory "length"
    (slime's examples/retool/generate_with_retool.py)."""
    first, second = SEARCH_THEN_ANSWER[0], SEARCH_THEN_ANSWER[1]
    n1, n2 = len(encode_text(tok, first)), len(encode_text(tok, second))
    probe = AgentLoop(tok, search, budgets(max_result_chars=None, response_budget="per_call"))
    s = probe.start("q", "Who directed Doctor Strange?", ["Scott Derrickson"], seed=0)
    probe.advance([s], [gen(tok, first)])
    after_first = len(s.context_ids)  # prompt + first turn + its whole result block
    context = after_first + n2 + 3  # room for the second turn and 3 tokens of its result block
    per_call = max(n1, n2 + 3) + 1
    loop = AgentLoop(tok, search, budgets(max_result_chars=None, max_response_tokens=per_call,
                                          max_new_tokens_per_turn=1000, max_context_tokens=context,
                                          response_budget="per_call"))
    s = loop.start("q", "Who directed Doctor Strange?", ["Scott Derrickson"], seed=0)
    assert loop.next_request(s).max_new_tokens == per_call
    loop.advance([s], [gen(tok, first)])
    assert not s.done and len(s.context_ids) == after_first > len(s.prompt_ids) + per_call  # results uncounted
    assert loop.next_request(s).max_new_tokens == n2 + 3 < per_call  # the context left
    loop.advance([s], [gen(tok, second)])
    assert s.finish_reason == "length" and s.turns[-1].observation_tokens == 3
    assert len(s.context_ids) == context and s.loss_mask[-3:] == [0, 0, 0]
    check_prefix_property(s)


def test_paper_profiles_read_the_response_budget_as_slime_does():
    """ARBOR's qwen3-* profiles: B.2's 8,192 per generation call and 36,864 on everything; the tiny and smol
    profiles keep the whole-response reading they ran with."""
    from arbor.config import load_config

    for p in ("qwen3-4b", "qwen3-8b", "qwen3-14b"):
        r = load_config(p).rollout
        assert (r.response_budget, r.max_response_tokens, r.max_context_tokens) == ("per_call", 8192, 36864), p
        assert Budgets.from_config(r, load_config(p).search).response_budget == "per_call"
    for p in ("tiny-cpu", "tiny-world", "smol-world"):
        assert load_config(p).rollout.response_budget == "total", p
    assert load_config("qwen3-8b", {"rollout.response_budget": "total"}).rollout.response_budget == "total"
