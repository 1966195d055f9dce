"""Chat templates, stop tokens and loss masks, token by token, for each template family arbor runs.

Three families: the tiny policy's ChatML (``<think>`` a special token), SmolLM2-135M-Instruct's own tokenizer and
template from the shipped GGUF (``<think>`` plain text, EOS = pad = ``<|im_end|>``), and a Qwen3-style template with
the ``enable_thinking`` switch (an empty think block in the generation prompt when it is off). For each, the SFT
tokenisation of a finished trajectory, the agent loop's token-in/token-out ids and the trainer's loss positions must
agree exactly, and only the policy's own tokens may be in the loss.
"""

from __future__ import annotations

from typing import Any

import pytest

from arbor.config import load_config
from arbor.format import result_block
from arbor.tasks.env.agent import (
    AgentLoop,
    Budgets,
    Generation,
    build_prompt_ids,
    encode_text,
    tokenize_trajectory,
)
from arbor.tasks.env.policy import (
    PolicyLoadError,
    configure_chat_template,
    shipped_gguf,
    train_tokenizer,
)
from arbor.tasks.training.packing import make_micro

SYSTEM = "Answer by searching."
QUESTION = "Who directed Doctor Strange?"
TURNS = ["<think>Find the film.</think>\n<search>Doctor Strange film</search>",
         "<think>It says Scott Derrickson.</think>\n<answer>\\boxed{Scott Derrickson}</answer>"]
PASSAGE = "Doc 1 (Title: Doctor Strange) Doctor Strange is a 2016 film directed by Scott Derrickson."
OBSERVATION = result_block(PASSAGE)

# The behaviour of Qwen3's template that matters to arbor, written here: ChatML turns, and with enable_thinking
# false the generation prompt carries an empty think block that the policy never writes.
QWEN3_STYLE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


class _OneHit:
    """A search backend with one passage (the loop only needs ``search``)."""

    def search(self, queries: list[str], k: int) -> list[list[Any]]:
        from arbor.tasks.env.search import SearchHit

        return [[SearchHit(doc_id="p1", title="Doctor Strange", text=PASSAGE.split(") ", 1)[1], score=1.0)]
                for _ in queries]


def _tiny() -> Any:
    texts = [SYSTEM, QUESTION, *TURNS, OBSERVATION] * 30
    return train_tokenizer(vocab_size=700, texts=iter(texts))


def _smollm2() -> Any:
    from transformers import AutoTokenizer

    gguf = shipped_gguf("smollm2")
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def _qwen3(thinking: bool) -> Any:
    return configure_chat_template(_tiny(), QWEN3_STYLE, {"enable_thinking": thinking})


FAMILIES = {"tiny": _tiny, "smollm2": _smollm2, "qwen3-no-think": lambda: _qwen3(False),
            "qwen3-think": lambda: _qwen3(True)}
ASSISTANT_OPEN = {"tiny": "<|im_start|>assistant\n", "smollm2": "<|im_start|>assistant\n",
                  "qwen3-no-think": "<|im_start|>assistant\n<think>\n\n</think>\n\n",
                  "qwen3-think": "<|im_start|>assistant\n"}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> tuple[str, Any]:
    return request.param, FAMILIES[request.param]()


def _episode(tok: Any) -> Any:
    budgets = Budgets(max_turns=4, max_searches=2, max_response_tokens=2000, max_context_tokens=4000,
                      max_new_tokens_per_turn=200, top_k=1)
    loop = AgentLoop(tok, _OneHit(), budgets, system_prompt=SYSTEM)
    s = loop.start("q", QUESTION, ["Scott Derrickson"], seed=1)
    for turn in TURNS:
        ids = encode_text(tok, turn)
        loop.advance([s], [Generation(ids, [-0.25] * len(ids), "stop")])
    return s


def test_prompt_is_the_templates_rendering_with_the_assistant_turn_open(family) -> None:
    name, tok = family
    ids = build_prompt_ids(tok, QUESTION, SYSTEM)
    text = tok.decode(ids, skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\n" + SYSTEM + "<|im_end|>\n<|im_start|>user\n" + QUESTION)
    assert text.endswith(ASSISTANT_OPEN[name])
    # the ids are the tokenizer's own rendering (no BOS or other token added by encode)
    rendered = tok.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
                                       tokenize=False, add_generation_prompt=True)
    assert ids == tok.encode(rendered, add_special_tokens=False)


def test_sft_rows_mask_the_tool_output_token_by_token(family) -> None:
    _, tok = family
    prompt, resp, mask = tokenize_trajectory(tok, QUESTION, TURNS[0] + OBSERVATION + TURNS[1], SYSTEM)
    assert prompt == build_prompt_ids(tok, QUESTION, SYSTEM)
    assert len(resp) == len(mask)
    runs: list[tuple[int, list[int]]] = []  # maximal runs of equal mask
    for t, m in zip(resp, mask, strict=True):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(t)
        else:
            runs.append((m, [t]))
    assert [m for m, _ in runs] == [1, 0, 1]
    assert [tok.decode(ids, skip_special_tokens=False) for _, ids in runs] == [TURNS[0], OBSERVATION, TURNS[1]]
    # no end-of-turn token is trained: the response ends at the protocol's answer close, where the loop stops
    assert tok.decode(resp[-3:], skip_special_tokens=False).endswith("</answer>")
    assert tok.eos_token_id not in resp


def test_rollout_ids_and_masks_equal_the_sft_tokenisation(family) -> None:
    """Token-in/token-out: what the loop sampled plus the observation it appended is exactly the SFT row."""
    _, tok = family
    s = _episode(tok)
    assert s.finish_reason == "answer"
    assert s.text == TURNS[0] + OBSERVATION + TURNS[1]
    assert tokenize_trajectory(tok, QUESTION, s.text, SYSTEM) == (s.prompt_ids, s.response_ids, s.loss_mask)
    assert [lp for lp, m in zip(s.logprobs, s.loss_mask, strict=True) if m == 0] == [0.0] * s.loss_mask.count(0)


def test_eos_ends_the_turn_is_trained_and_kept_out_of_the_text(family) -> None:
    """A turn that ends with the tokenizer's EOS (SmolLM2: also its pad token) stops the trajectory; the EOS is a
    sampled token, so it is in the loss and at its loss position in the trainer's micro-batch."""
    _, tok = family
    loop = AgentLoop(tok, _OneHit(), Budgets(max_new_tokens_per_turn=50), system_prompt=SYSTEM)
    s = loop.start("q", QUESTION, ["x"], seed=0)
    ids = encode_text(tok, "I do not know.") + [tok.eos_token_id]
    loop.advance([s], [Generation(ids, [-1.0] * len(ids), "stop")])
    assert s.finish_reason == "stop" and s.text == "I do not know."
    assert s.response_ids[-1] == tok.eos_token_id and s.loss_mask[-1] == 1
    # two rows of different lengths: the shorter is right-padded with the pad id, which never becomes a target
    other = _episode(tok)
    m = make_micro([s.prompt_ids, other.prompt_ids], [s.response_ids, other.response_ids],
                   [s.loss_mask, other.loss_mask])
    n_loss = sum(s.loss_mask) + sum(other.loss_mask)
    assert len(m.targets) == n_loss
    row0 = m.targets[m.rows == 0].tolist()
    assert row0 == [t for t, k in zip(s.response_ids, s.loss_mask, strict=True) if k]
    assert row0[-1] == tok.eos_token_id
    # every loss position predicts the next token of its own sequence
    seq = s.prompt_ids + s.response_ids
    assert [seq[c + 1] for c in m.cols[m.rows == 0].tolist()] == row0


def test_smollm2_special_tokens() -> None:
    """SmolLM2's tags are plain text (several tokens), its EOS is <|im_end|> and doubles as pad."""
    tok = _smollm2()
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == tok.eos_token_id
    assert len(encode_text(tok, "<think>")) > 1 and len(encode_text(tok, "</search>")) > 1
    loop = AgentLoop(tok, None, Budgets())
    assert tok.eos_token_id in loop.eos_ids


def test_qwen3_thinking_switch_is_explicit_and_idempotent() -> None:
    tok = _qwen3(False)
    once = tok.chat_template
    configure_chat_template(tok, None, {"enable_thinking": False})
    assert tok.chat_template == once  # applied twice: still one setting
    configure_chat_template(tok, None, {"enable_thinking": True})
    assert build_prompt_ids(tok, QUESTION, SYSTEM) == build_prompt_ids(_qwen3(True), QUESTION, SYSTEM)
    bare = _tiny()
    bare.chat_template = None
    with pytest.raises(PolicyLoadError, match="chat_template_kwargs"):
        configure_chat_template(bare, None, {"enable_thinking": False})


def test_qwen3_profiles_state_the_thinking_switch() -> None:
    for size in ("4b", "8b", "14b"):
        cfg = load_config(f"qwen3-{size}")
        assert cfg.policy.chat_template_kwargs == {"enable_thinking": True}, size
