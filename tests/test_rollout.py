"""Rollout engines: transformers (in-process) and openai (real HTTP to a local vLLM-field server) agree.

The policy is a micro Qwen3 model trained here for a few seconds on tag-format trajectories built with the real
BM25 backend, so that greedy and sampled rollouts really search, read results and answer over several turns.
"""

from __future__ import annotations

import random

import httpx
import pytest
import torch

from arbor.config import load_config
from arbor.format import result_block
from arbor.tasks.env.agent import check_prefix_property
from arbor.tasks.env.datasets import load_questions
from arbor.tasks.env.policy import TinyPolicyConfig, build_tiny_model, train_tokenizer
from arbor.tasks.env.rollout import OpenAIEngine, RolloutError, TransformersEngine, make_engine
from arbor.tasks.env.search import format_results, make_search
from arbor.tasks.env.sft_data import tokenize_sft_example
from tests.completions_server import CompletionsServer

SP = "Search, then answer."
OVERRIDES = {"search.top_k": 1, "search.max_result_chars": 60, "rollout.system_prompt": SP,
             "rollout.temperature": 0.0, "rollout.max_new_tokens_per_turn": 48, "rollout.max_response_tokens": 400,
             "rollout.max_turns": 4, "rollout.max_searches": 2, "rollout.concurrency": 8}


def cfg_with(**kw):
    ov = dict(OVERRIDES)
    ov.update({k.replace("__", "."): v for k, v in kw.items()})
    return load_config("tiny-cpu", ov)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """A 2-layer model: one thread is as fast as two and far more robust on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """(model, tokenizer, search): a 2-layer Qwen3 trained ~100 steps on scripted search-then-answer responses."""
    home = tmp_path_factory.mktemp("home")
    cfg = cfg_with()
    search = make_search(cfg.search, home=home)
    rows = []
    for q in load_questions("offline:train")[:64]:
        response = ""
        for j in range(1 + len(q.question) % 2):  # one or two searches
            query = ["first entity", "second entity"][j]
            hits = search.search([query], 1)[0]
            response += f"<think>search</think>\n<search>{query}</search>" + result_block(format_results(hits, 60))
        rows.append({"question": q.question, "response": response + "<answer>\\boxed{yes}</answer>"})
    tok = train_tokenizer(vocab_size=512, texts=iter([SP] * 5 + [r["question"] + " " + r["response"] for r in rows]))
    model = build_tiny_model(TinyPolicyConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                              num_attention_heads=2, num_key_value_heads=1, head_dim=32), tok)
    examples = [tokenize_sft_example(tok, r, SP) for r in rows]
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rng = random.Random(0)
    for _ in range(100):
        batch = rng.sample(examples, 8)
        width = max(len(p) + len(r) for p, r, _ in batch)
        ids = torch.full((8, width), tok.pad_token_id)
        labels = torch.full((8, width), -100)
        att = torch.zeros((8, width), dtype=torch.long)
        for i, (p, r, m) in enumerate(batch):
            seq = p + r
            ids[i, : len(seq)] = torch.tensor(seq)
            att[i, : len(seq)] = 1
            labels[i, len(p) : len(seq)] = torch.tensor([t if keep else -100 for t, keep in zip(r, m, strict=True)])
        loss = model(input_ids=ids, attention_mask=att, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return model, tok, search


@pytest.fixture(scope="module")
def questions():
    return load_questions("offline:eval")[:4]


def teacher_forced_logprobs(model, traj, temperature: float) -> list[float]:
    """log pi(token | prefix) of every response token, recomputed in one forward pass (T=0 -> raw logits)."""
    ids = torch.tensor([traj.prompt_ids + traj.response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(traj.prompt_ids) - 1 : -1].float()
    if temperature > 0:
        logits = logits / temperature
    lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(traj.response_ids)[:, None])[:, 0]
    return lp.tolist()


def test_transformers_engine_greedy_multi_turn(env, questions):
    model, tok, search = env
    engine = TransformersEngine(cfg_with(), model, tok, search)
    trajs = engine.generate_groups(questions, k=2, seed=0, step=3, run_id="r")
    assert [(t.group, t.sample) for t in trajs] == [(g, i) for g in range(4) for i in range(2)]
    assert all(t.step == 3 and t.run_id == "r" and t.policy_version == 0 for t in trajs)
    assert max(t.turns for t in trajs) >= 2 and sum(t.search_calls for t in trajs) >= 4
    for t in trajs:
        assert t.question_id == questions[t.group].question_id
        # greedy: both samples of a group are identical
        twin = trajs[t.group * 2 + (1 - t.sample)]
        assert t.response_ids == twin.response_ids
        # scored by arbor.reward: R_base = F1 if format-valid else -1 (eq. 4)
        assert t.base_reward == (t.f1 if t.format_valid else -1.0)
        # rollout log-probs of the policy tokens equal a teacher-forced recompute (KV cache + padding are right);
        # result tokens carry log-prob 0 and mask 0
        ref = teacher_forced_logprobs(model, t, 0.0)
        for lp, r, m in zip(t.rollout_logprobs, ref, t.loss_mask, strict=True):
            assert (abs(lp - r) < 1e-4) if m else lp == 0.0
        assert t.text == tok.decode(t.response_ids, skip_special_tokens=False).removesuffix("<|im_end|>")
    assert any(t.format_valid and t.finish_reason == "answer" for t in trajs)


def test_sampling_is_seeded_and_independent_of_batch(env, questions):
    model, tok, search = env
    engine = TransformersEngine(cfg_with(rollout__temperature=1.0), model, tok, search)
    a = engine.generate_groups(questions, k=3, seed=11, step=0)
    b = engine.generate_groups(questions, k=3, seed=11, step=0)
    c = engine.generate_groups(questions, k=3, seed=12, step=0)
    assert [t.response_ids for t in a] == [t.response_ids for t in b]
    assert [t.response_ids for t in a] != [t.response_ids for t in c]
    alone = engine.generate_groups(questions[:1], k=3, seed=11, step=0)  # group 0 in a batch of its own
    assert [t.response_ids for t in alone] == [t.response_ids for t in a[:3]]
    for t in a:  # log-probs of the sampling distribution actually used: log_softmax(logits / T)
        ref = teacher_forced_logprobs(model, t, 1.0)
        assert all(abs(x - y) < 1e-4 for x, y, m in zip(t.rollout_logprobs, ref, t.loss_mask, strict=True) if m)
        check_prefix_property_of(t)


def check_prefix_property_of(t) -> None:
    assert len(t.response_ids) == len(t.loss_mask) == len(t.rollout_logprobs)
    assert all(lp == 0.0 for lp, m in zip(t.rollout_logprobs, t.loss_mask, strict=True) if m == 0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_openai_engine_matches_transformers_engine(env, questions, temperature):
    model, tok, search = env
    cfg = cfg_with(rollout__temperature=temperature, rollout__engine="openai")
    local = TransformersEngine(cfg, model, tok, search).generate_groups(questions, k=2, seed=5, step=1)
    with CompletionsServer(model, tok, served_model="micro") as srv:
        engine = OpenAIEngine(cfg, tok, search, base_url=srv.base_url, served_model="micro")
        remote = engine.generate_groups(questions, k=2, seed=5, step=1)
        sent = [r["prompt"] for r in srv.requests]
    fields = ("prompt_ids", "response_ids", "loss_mask", "text", "turns", "search_calls", "search_queries",
              "finish_reason", "format_valid", "answer", "base_reward", "group", "sample")
    for x, y in zip(local, remote, strict=True):
        assert {f: getattr(x, f) for f in fields} == {f: getattr(y, f) for f in fields}
        assert all(abs(p - q) < 1e-4 for p, q in zip(x.rollout_logprobs, y.rollout_logprobs, strict=True))
    assert max(t.turns for t in remote) >= 2
    # every request the server received is a turn: a prefix of one trajectory's prompt + response
    assert len(sent) == sum(t.turns for t in remote)
    fulls = [t.prompt_ids + t.response_ids for t in remote]
    assert all(any(f[: len(p)] == p for f in fulls) for p in sent)


def test_agent_state_prefix_property_on_generated(env, questions):
    model, tok, search = env
    engine = TransformersEngine(cfg_with(rollout__temperature=1.0), model, tok, search)
    states = engine._start_states(questions, 2, seed=1, step=0)
    engine.run_states(states)
    for s in states:
        check_prefix_property(s)


def test_completions_server_refuses_wrong_requests(env):
    model, tok, _ = env
    good = {"model": "micro", "prompt": [1, 5, 7], "max_tokens": 4, "temperature": 0.0, "logprobs": 1,
            "stop": ["</search>"], "include_stop_str_in_output": True, "return_tokens_as_token_ids": True,
            "return_token_ids": True, "skip_special_tokens": False, "seed": 3, "n": 1}
    with CompletionsServer(model, tok, served_model="micro") as srv:
        url = srv.base_url + "/completions"
        r = httpx.post(url, json=good)
        assert r.status_code == 200
        choice = r.json()["choices"][0]
        assert len(choice["token_ids"]) == len(choice["logprobs"]["token_logprobs"]) <= 4
        assert all(t.startswith("token_id:") for t in choice["logprobs"]["tokens"])
        for bad, why in [({**good, "max_new_tokens": 4}, "unknown field"),  # misnamed (HF name, not vLLM's)
                         ({**good, "stop_strings": ["x"]}, "unknown field"),
                         ({k: v for k, v in good.items() if k != "model"}, "missing field 'model'"),
                         ({k: v for k, v in good.items() if k != "prompt"}, "prompt"),
                         ({**good, "model": "other"}, "does not exist"),
                         ({**good, "prompt": [[1, 2]]}, "token ids"),
                         ({**good, "logprobs": True}, "logprobs")]:
            r = httpx.post(url, json=bad)
            assert r.status_code == 400 and why in r.json()["error"]["message"], (bad, r.text)
        # without return_tokens_as_token_ids the tokens are strings, which our client refuses loudly
        plain = httpx.post(url, json={**good, "return_tokens_as_token_ids": False, "return_token_ids": False}).json()
        with pytest.raises(RolloutError, match="malformed"):
            OpenAIEngine.parse_choice(plain, "test")


def test_weight_sync_changes_policy_and_version(env, questions):
    model, tok, search = env
    import copy

    engine = TransformersEngine(cfg_with(), copy.deepcopy(model), tok, search)
    before = engine.generate_groups(questions[:2], k=1, seed=0, step=0)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    sd["model.norm.weight"] = -sd["model.norm.weight"]  # a different policy
    engine.load_state_dict(sd, version=7)
    after = engine.generate_groups(questions[:2], k=1, seed=0, step=0)
    assert all(t.policy_version == 7 for t in after) and all(t.policy_version == 0 for t in before)
    assert [t.response_ids for t in before] != [t.response_ids for t in after]
    with pytest.raises(RolloutError, match="missing"):
        engine.load_state_dict({"model.norm.weight": sd["model.norm.weight"]}, version=8)


def test_make_engine_openai_needs_url(env, tmp_path):
    _, tok, search = env
    with pytest.raises(RolloutError, match="rollout.base_url"):
        make_engine(cfg_with(rollout__engine="openai"), None, tok, search=search, home=tmp_path)
    eng = make_engine(cfg_with(rollout__engine="openai", rollout__base_url="http://127.0.0.1:1/v1"), None, tok,
                      search=search, home=tmp_path)
    assert isinstance(eng, OpenAIEngine) and eng.url == "http://127.0.0.1:1/v1/completions"


def test_cache_reuse_across_turns_equals_reprefill(env, questions):
    """Keeping each row's KV cache across turns gives the trajectories of re-prefilling every turn."""
    model, tok, search = env
    engine = TransformersEngine(cfg_with(rollout__temperature=1.0), model, tok, search)
    kept = engine._start_states(questions, 3, seed=4, step=2)
    fresh = engine._start_states(questions, 3, seed=4, step=2)
    engine.run_states(kept, reuse_cache=True)
    engine.run_states(fresh, reuse_cache=False)
    assert max(len(s.turns) for s in kept) >= 2
    for a, b in zip(kept, fresh, strict=True):
        assert a.response_ids == b.response_ids and a.loss_mask == b.loss_mask and a.text == b.text
        assert all(abs(x - y) < 1e-4 for x, y in zip(a.logprobs, b.logprobs, strict=True))
        check_prefix_property(a)


def test_evaluation_temperature_is_scoped_to_its_block(env, questions):
    """eval.temperature 0: greedy inside the block (seeds do not matter), the rollout temperature after it."""
    from arbor.tasks.env.rollout import sampling_temperature

    model, tok, search = env
    engine = TransformersEngine(cfg_with(rollout__temperature=3.0), model, tok, search)
    sampled = [t.response_ids for t in engine.generate_groups(questions, k=1, seed=11, step=0)]
    with sampling_temperature(engine, 0.0):
        g1 = [t.response_ids for t in engine.generate_groups(questions, k=1, seed=11, step=0)]
        g2 = [t.response_ids for t in engine.generate_groups(questions, k=1, seed=12, step=0)]
    greedy = TransformersEngine(cfg_with(), model, tok, search).generate_groups(questions, k=1, seed=0, step=0)
    assert g1 == g2 == [t.response_ids for t in greedy]
    assert engine.cfg.rollout.temperature == 3.0
    assert [t.response_ids for t in engine.generate_groups(questions, k=1, seed=11, step=0)] == sampled
    assert sampled != g1  # T = 3 sampling differs from greedy (this policy is peaked)


def test_both_engines_read_the_response_budget_per_call(env, questions):
    """With ``rollout.response_budget=per_call`` (slime's --rollout-max-response-len) both engines
    cap each call at max_response_tokens and leave search results outside it, so trajectories that "total" cuts
    at their first result block go on to answer; the openai engine sends exactly those caps as max_tokens."""
    model, tok, search = env
    budget = 48  # one turn's worth: a turn plus its result block is over it
    runs = {}
    for mode in ("total", "per_call"):
        cfg = cfg_with(rollout__max_response_tokens=budget, rollout__response_budget=mode, rollout__engine="openai")
        local = TransformersEngine(cfg, model, tok, search).generate_groups(questions, k=1, seed=5, step=1)
        with CompletionsServer(model, tok, served_model="micro") as srv:
            remote = OpenAIEngine(cfg, tok, search, base_url=srv.base_url, served_model="micro").generate_groups(
                questions, k=1, seed=5, step=1)
            sent = list(srv.requests)
        assert [(t.response_ids, t.finish_reason) for t in local] == [(t.response_ids, t.finish_reason)
                                                                        for t in remote]
        assert all(r["max_tokens"] <= budget for r in sent)
        runs[mode] = (remote, sent)
    total, _ = runs["total"]
    assert all(len(t.response_ids) <= budget for t in total)
    assert all(t.finish_reason == "length" and not t.format_valid for t in total if t.search_calls)
    per_call, sent = runs["per_call"]
    assert any(len(t.response_ids) > budget and t.finish_reason == "answer" and t.format_valid for t in per_call)
    cut = [i for i, t in enumerate(total) if t.finish_reason == "length"]
    assert cut and all(per_call[i].finish_reason == "answer" and per_call[i].format_valid for i in cut)
    assert all(r["max_tokens"] == budget for r in sent)  # the context (2,048) never binds here
