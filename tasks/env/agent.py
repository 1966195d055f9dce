"""The search agent's protocol and its multi-turn loop as a pure state machine (paper §3.1, App. B.2, E.1).

An engine drives the loop::

    states = [loop.start(question, seed) for ...]
    while active := [s for s in states if not s.done]:
        requests = [loop.next_request(s) for s in active]        # context token ids + token budget + seed
        generations = engine_generates(requests)                  # one turn each; string stops kept in the output
        loop.advance(active, generations)                         # runs the searches, appends <result> blocks

Token-in / token-out: the context of turn t+1 is the context of turn t, plus the tokens sampled in turn t, plus the
tokenised ``<result>`` block (loss mask 0, log-prob 0). The conversation is never re-rendered or re-tokenised, so the
masks and rollout log-probs stay aligned with what the policy actually sampled.

Budgets (App. B.2): ``max_turns`` generations, ``max_searches`` executed searches (a search call beyond the budget
gets the configurable forced-finalisation message instead of results), ``max_response_tokens`` and
``max_context_tokens`` prompt + response tokens. ``response_budget`` says what the response budget bounds: "total",
the whole response with its search results; "per_call", each generation call (slime's ``--rollout-max-response-len``,
tool results not counted; the context budget then binds on everything). Running out of tokens or turns is a
truncation. Co-ReAct's step rubrics placed in the context (``place_guidance``) count against the context budget only;
its trajectory budget (``max_trajectory_tokens``, App. A) hands the agent over to an answer step: no search runs
once the trajectory holds that many tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from arbor.config.rollout import RolloutConfig
from arbor.config.search import SearchConfig
from arbor.format import (
    ANSWER_CLOSE,
    ARBOR,
    SEARCH_CLOSE,
    TagProtocol,
    get_protocol,
    pending_search,
    result_block,
    sanitize_tool_text,
)
from arbor.seeding import derive_seed

SYSTEM_PROMPT = ARBOR.system_prompt  # the built-in prompt of arbor's protocol (arbor.format)

FinishReason = Literal["answer", "length", "max_turns", "stop"]


class SearchLike(Protocol):
    def search(self, queries: list[str], k: int) -> list[list[Any]]: ...


# --------------------------------------------------------------------------------------------- prompt rendering


def render_prompt(tokenizer: Any, question: str, system_prompt: str = SYSTEM_PROMPT) -> str:
    """The chat-template rendering of (system prompt, question) with the assistant turn opened."""
    messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": question.strip()}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def build_prompt_ids(tokenizer: Any, question: str, system_prompt: str = SYSTEM_PROMPT) -> list[int]:
    """Prompt token ids via the tokenizer's own chat template (Qwen3's for Qwen3, ChatML-like for the tiny one)."""
    return list(tokenizer.encode(render_prompt(tokenizer, question, system_prompt), add_special_tokens=False))


def encode_text(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def tokenize_trajectory(tokenizer: Any, question: str, response_text: str, system_prompt: str | None = None,
                        protocol: TagProtocol = ARBOR) -> tuple[list[int], list[int], list[int]]:
    """(prompt_ids, response_ids, loss_mask) of a finished response, tokenised the way the loop builds it.

    Policy segments and observation blocks (arbor's ``\\n<result>...</result>\\n``) are tokenised separately and
    concatenated; observation tokens get loss mask 0. Used by SFT on tag-format trajectories.
    ``system_prompt`` None: the protocol's built-in prompt.
    """
    prompt_ids = build_prompt_ids(tokenizer, question, system_prompt or protocol.system_prompt)
    response_ids: list[int] = []
    loss_mask: list[int] = []
    for i, segment in enumerate(protocol.observation_re.split(response_text)):
        if not segment:
            continue
        ids = encode_text(tokenizer, segment)
        response_ids += ids
        loss_mask += [0 if i % 2 == 1 else 1] * len(ids)  # split() puts captured observations at odd indices
    return prompt_ids, response_ids, loss_mask


# --------------------------------------------------------------------------------------------- the state machine


@dataclass(frozen=True)
class Budgets:
    """Agent budgets (App. B.2: 12 turns, 10 searches, 8,192 response tokens, 36,864 context tokens)."""

    max_turns: int = 12
    max_searches: int = 10
    max_response_tokens: int = 8192
    max_context_tokens: int = 36864
    max_new_tokens_per_turn: int = 8192
    response_budget: Literal["total", "per_call"] = "total"  # what max_response_tokens bounds (RolloutConfig)
    top_k: int = 10
    max_result_chars: int | None = None
    force_answer_message: str = ARBOR.force_answer_message
    # Co-ReAct's trajectory budget (App. A: 6,000): once the trajectory (response tokens without placed guidance)
    # holds this many, the agent is handed over to an answer step (None: off; set for guided inference only)
    max_trajectory_tokens: int | None = None

    @classmethod
    def from_config(cls, rollout: RolloutConfig, search: SearchConfig) -> Budgets:
        protocol = get_protocol(rollout.protocol)
        return cls(max_turns=rollout.max_turns, max_searches=rollout.max_searches,
                   max_response_tokens=rollout.max_response_tokens, max_context_tokens=rollout.max_context_tokens,
                   max_new_tokens_per_turn=rollout.max_new_tokens_per_turn,
                   response_budget=rollout.response_budget, top_k=search.top_k,
                   max_result_chars=search.max_result_chars,
                   force_answer_message=rollout.force_answer_message or protocol.force_answer_message)


@dataclass
class GenRequest:
    """One turn to generate: continue ``context_ids`` for at most ``max_new_tokens``, sampling with ``seed``."""

    context_ids: list[int]
    max_new_tokens: int
    seed: int


@dataclass
class Generation:
    """What an engine returns for one turn: sampled ids (stop string included), their log-probs, why it stopped.

    ``finish_reason`` follows the OpenAI completions API: "stop" (a stop string or EOS) or "length" (max_tokens).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]


@dataclass
class TurnRecord:
    """One generation turn: where its policy tokens start in the response, how many, what ended it."""

    context_len: int  # len(prompt + response) sent to the engine for this turn
    n_tokens: int
    ended_by: str  # "search" | "answer" | "eos" | "length"
    query: str | None = None
    observation_tokens: int = 0


@dataclass
class AgentState:
    question_id: str
    question: str
    golds: list[str]
    prompt_ids: list[int]
    seed: int
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    search_queries: list[str] = field(default_factory=list)
    forced_final: int = 0  # search calls refused for budget (answered with the forced message)
    finish_reason: FinishReason | None = None
    started_at: float = field(default_factory=time.perf_counter)
    gen_seconds: float = 0.0
    user_text: str = ""  # the user message of the prompt, before any guidance (Co-ReAct)
    guidance_tokens: int = 0  # tokens of placed guidance inside response_ids (outside the response budget)
    _pending: str | None = None
    _bare_observation: str | None = None  # the last observation as appended, before guidance was placed in it
    _turn_guidance: int = 0  # of guidance_tokens, those inside the last observation (replaced on a retry)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def context_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def search_calls(self) -> int:
        return len(self.search_queries)

    @property
    def truncated(self) -> bool:
        return self.finish_reason in ("length", "max_turns")

    @property
    def trajectory_tokens(self) -> int:
        """The response's tokens without placed guidance: the agent's turns and the observations it received."""
        return len(self.response_ids) - self.guidance_tokens


class AgentLoop:
    """The multi-turn think / search / result / answer loop over token ids (no model inside: engines drive it)."""

    def __init__(self, tokenizer: Any, search: SearchLike | None, budgets: Budgets,
                 system_prompt: str | None = None,
                 format_results: Callable[[Sequence[Any], int | None], str] | None = None,
                 search_stop: str = SEARCH_CLOSE, answer_stop: str = ANSWER_CLOSE,
                 protocol: TagProtocol = ARBOR) -> None:
        self.tokenizer = tokenizer
        self.search = search
        self.budgets = budgets
        self.protocol = protocol
        self.system_prompt = system_prompt or protocol.system_prompt
        if format_results is None:
            from functools import partial

            from arbor.tasks.env.search import format_results as _fmt
            format_results = partial(_fmt, line=protocol.passage_line)
        self.format_results = format_results
        self.eos_ids = {t for t in (tokenizer.eos_token_id, tokenizer.pad_token_id) if t is not None}
        self.search_stop, self.answer_stop = search_stop, answer_stop
        self.stop_strings = [search_stop, answer_stop]

    # -- lifecycle

    def start(self, question_id: str, question: str, golds: Sequence[str], seed: int,
              reference: str = "") -> AgentState:
        """A new trajectory; ``reference`` (a block shown before the question, RubricEM D.6.3) is part of the prompt
        only: the state's ``question`` stays the original."""
        user = f"{reference}\n\n{question.strip()}" if reference else question
        s = AgentState(question_id, question, list(golds), build_prompt_ids(self.tokenizer, user, self.system_prompt),
                       seed, user_text=user)
        if self._room(s) <= 0:
            s.finish_reason = "length"  # the prompt alone fills the context
        return s

    def _room(self, s: AgentState) -> int:
        """Tokens the response may still grow by: the context budget (everything counted) and, when the response
        budget bounds the whole response (``total``), what it has left (placed guidance not counted)."""
        return self.room(len(s.prompt_ids) + len(s.response_ids), s.trajectory_tokens)

    def room(self, context_len: int, trajectory_tokens: int) -> int:
        """``_room`` of a trajectory whose context holds ``context_len`` tokens, ``trajectory_tokens`` of its
        response counted against the response budget."""
        b = self.budgets
        context_left = b.max_context_tokens - context_len
        if b.response_budget == "per_call":
            return context_left
        return min(b.max_response_tokens - trajectory_tokens, context_left)

    def turn_budget(self, context_len: int, trajectory_tokens: int) -> int:
        """max_new_tokens of a generation call from that point: the turn cap, the room left and, per call
        (slime's ``--rollout-max-response-len``), the response budget itself."""
        b = self.budgets
        cap = min(b.max_new_tokens_per_turn, b.max_response_tokens) if b.response_budget == "per_call" \
            else b.max_new_tokens_per_turn
        return min(cap, self.room(context_len, trajectory_tokens))

    def handed_over(self, s: AgentState) -> bool:
        """Whether the trajectory budget is spent (``max_trajectory_tokens``): the agent's next step is the answer."""
        b = self.budgets.max_trajectory_tokens
        return b is not None and s.trajectory_tokens >= b

    def may_search(self, s: AgentState) -> bool:
        """Whether a search the agent issues next would run (search and trajectory budgets left): a tool-calling
        step, not the answer step (Co-ReAct guides only the former by default)."""
        return not s.done and s.search_calls < self.budgets.max_searches and not self.handed_over(s)

    def next_request(self, s: AgentState) -> GenRequest:
        if s.done:
            raise ValueError(f"trajectory for {s.question_id} is finished ({s.finish_reason})")
        max_new = self.turn_budget(len(s.prompt_ids) + len(s.response_ids), s.trajectory_tokens)
        return GenRequest(s.context_ids, max_new, derive_seed(s.seed, "turn", len(s.turns)))

    def observe(self, s: AgentState, gen: Generation) -> str | None:
        """Append a generated turn (loss mask 1). Returns the search query to run, or None.

        Sets ``finish_reason`` when the turn answered, ended with EOS, or a budget ran out.
        """
        if len(gen.token_ids) != len(gen.logprobs):
            raise ValueError(f"engine returned {len(gen.token_ids)} tokens but {len(gen.logprobs)} log-probs")
        context_len = len(s.prompt_ids) + len(s.response_ids)
        ids = list(gen.token_ids)
        s.response_ids += ids
        s.loss_mask += [1] * len(ids)
        s.logprobs += [float(x) for x in gen.logprobs]
        text_ids = ids[:-1] if ids and ids[-1] in self.eos_ids else ids
        turn_text = self.tokenizer.decode(text_ids, skip_special_tokens=False)
        s.text_parts.append(turn_text)
        s.gen_seconds = time.perf_counter() - s.started_at

        ended_by, query = self._classify(turn_text, ids, gen.finish_reason)
        s.turns.append(TurnRecord(context_len, len(ids), ended_by, query))
        if ended_by == "answer":
            s.finish_reason = "answer"
        elif ended_by == "eos":
            s.finish_reason = "stop"
        elif ended_by == "length" or self._room(s) <= 0:
            s.finish_reason = "length"
        elif len(s.turns) >= self.budgets.max_turns:
            s.finish_reason = "max_turns"
        if s.done or query is None:
            return None
        if not query:  # "</search>" without a query: tell the agent, spend no search
            self._append_observation(s, result_block("Empty query: write the query between <search> and </search>.",
                                                     self.protocol))
            return None
        if s.search_calls >= self.budgets.max_searches or self.handed_over(s):
            # search or trajectory budget spent: forced finalisation (the answer step), no search
            s.forced_final += 1
            self._append_observation(s, self.budgets.force_answer_message)
            return None
        s._pending = query
        return query

    def is_search(self, turn_text: str) -> bool:
        """Whether a proposed turn calls the search tool (it stops at ``</search>`` before any ``</answer>``)."""
        return self._classify(turn_text, [], "stop")[0] == "search"

    def _classify(self, turn_text: str, ids: list[int], finish_reason: str) -> tuple[str, str | None]:
        i_answer, i_search = turn_text.find(self.answer_stop), turn_text.find(self.search_stop)
        if i_answer != -1 and (i_search == -1 or i_answer < i_search):
            return "answer", None
        if i_search != -1:
            query = pending_search(turn_text[: i_search + len(self.search_stop)])
            return "search", (query or "")
        if ids and ids[-1] in self.eos_ids:
            return "eos", None
        if finish_reason == "length":
            return "length", None
        return "eos", None  # "stop" without a stop string: the engine ended the turn (e.g. another stop id)

    def deliver(self, s: AgentState, hits: Sequence[Any]) -> None:
        """Append the tool-output block (arbor ``<result>``, Search-R1 ``<information>``) for the pending query
        (loss mask 0, log-prob 0)."""
        if s._pending is None:
            raise ValueError(f"no pending search for {s.question_id}")
        s.search_queries.append(s._pending)
        s._pending = None
        body = self.format_results(hits, self.budgets.max_result_chars)
        block = result_block(body, self.protocol)
        limit = self.budgets.max_trajectory_tokens
        if limit is not None and s.trajectory_tokens + len(encode_text(self.tokenizer, block)) >= limit:
            block = self._hand_over(block)  # the trajectory budget is spent with these results: answer next
        self._append_observation(s, block)

    def _hand_over(self, block: str) -> str:
        """The results block with the forced-finalisation message's text inside it, before the closing tag: the
        trajectory budget is spent and the next step is the answer (App. A)."""
        close = self.protocol.result_close
        note = self.budgets.force_answer_message.strip()
        opening = f"<{self.protocol.result_tag}>"
        note = note.removeprefix(opening).removesuffix(close).strip()
        at = block.rfind(close)
        return f"{block[:at].rstrip()}\n{note}\n{block[at:]}" if at != -1 else f"{block}{note}"

    def place_guidance(self, s: AgentState, text: str) -> None:
        """Put ``text`` where the next turn reads it, loss-masked (Co-ReAct's injected step rubric, §3.3): inside
        the last observation block, before its closing tag, or, before the first turn, after the question in the
        user prompt. Calling it again before the turn replaces the earlier guidance (a retry's rubric + feedback).
        Protocol tags are removed from ``text`` (a rubric cannot forge structure), so the response stays valid."""
        if s.done:
            raise ValueError(f"trajectory for {s.question_id} is finished ({s.finish_reason})")
        text = sanitize_tool_text(text, self.protocol).strip()
        if not s.turns:  # in the prompt: counts against the context budget only
            s.prompt_ids = build_prompt_ids(self.tokenizer, f"{s.user_text}\n\n{text}", self.system_prompt)
        else:
            bare, n = s._bare_observation, s.turns[-1].observation_tokens
            if bare is None or n == 0:
                raise ValueError(f"trajectory for {s.question_id}: turn {len(s.turns) - 1} has no observation to "
                                 f"carry guidance")
            del s.response_ids[-n:], s.loss_mask[-n:], s.logprobs[-n:]
            s.text_parts.pop()
            s.guidance_tokens -= s._turn_guidance  # the earlier guidance of this observation goes with it
            s._turn_guidance = 0
            close = bare.rfind(self.protocol.result_close)
            guided = f"{bare[:close].rstrip()}\n\n{text}\n{bare[close:]}" if close != -1 else f"{bare}{text}"
            self._append_observation(s, guided, bare=bare)
        if not s.done and self._room(s) <= 0:
            s.finish_reason = "length"  # the guidance filled the budget

    def _append_observation(self, s: AgentState, text: str, bare: str | None = None) -> None:
        """Append an observation block (loss mask 0); ``bare``: the block without guidance, when ``text`` has it
        (the guidance's tokens, the difference, count against the context budget but not the response budget)."""
        s._bare_observation = text if bare is None else bare
        ids = encode_text(self.tokenizer, text)
        extra = max(0, len(ids) - len(encode_text(self.tokenizer, bare))) if bare is not None else 0
        room = self.room(len(s.prompt_ids) + len(s.response_ids), s.trajectory_tokens - extra)
        if len(ids) >= room:  # the observation does not fit: fill the budget and stop (a truncation)
            ids = ids[: max(room, 0)]
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            s.finish_reason = "length"
            extra = min(extra, len(ids))
        s.response_ids += ids
        s.loss_mask += [0] * len(ids)
        s.logprobs += [0.0] * len(ids)
        s.text_parts.append(text)
        s.turns[-1].observation_tokens = len(ids)
        s.guidance_tokens += extra
        s._turn_guidance = extra

    def advance(self, states: Sequence[AgentState], generations: Sequence[Generation]) -> None:
        """Observe one turn for each state, run all their searches as one batch, append the results."""
        if len(states) != len(generations):
            raise ValueError(f"{len(states)} states but {len(generations)} generations")
        waiting = []
        for s, g in zip(states, generations, strict=True):
            q = self.observe(s, g)
            if q is not None:
                waiting.append((s, q))
        if waiting:
            if self.search is None:
                raise RuntimeError("the agent issued a search but the loop has no search backend")
            hits = self.search.search([q for _, q in waiting], self.budgets.top_k)
            for (s, _), h in zip(waiting, hits, strict=True):
                self.deliver(s, h)


def check_prefix_property(s: AgentState) -> None:
    """Assert token-in/token-out: every turn's context is a prefix of the final prompt + response.

    Each turn starts where the previous turn's tokens and observation end; masks and log-probs align with ids.
    """
    full = s.context_ids
    n = len(s.response_ids)
    if not (len(s.loss_mask) == n == len(s.logprobs)):
        raise AssertionError(f"lengths differ: ids {n}, mask {len(s.loss_mask)}, logprobs {len(s.logprobs)}")
    pos = len(s.prompt_ids)
    for t, turn in enumerate(s.turns):
        if turn.context_len != pos:
            raise AssertionError(f"turn {t} context has {turn.context_len} tokens, expected {pos}")
        r0 = pos - len(s.prompt_ids)
        if s.loss_mask[r0:r0 + turn.n_tokens] != [1] * turn.n_tokens:
            raise AssertionError(f"turn {t}: policy tokens not all in the loss")
        obs = s.loss_mask[r0 + turn.n_tokens:r0 + turn.n_tokens + turn.observation_tokens]
        if obs != [0] * turn.observation_tokens:
            raise AssertionError(f"turn {t}: observation tokens not masked")
        pos += turn.n_tokens + turn.observation_tokens
    if pos != len(full):
        raise AssertionError(f"turns cover {pos} tokens, trajectory has {len(full)}")
