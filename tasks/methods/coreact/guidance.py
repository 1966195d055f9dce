"""Co-ReAct guided inference: inject a step rubric, verify the proposed action, retry once (Kang et al., 2026, §3.3).

Before each tool-calling step (a turn whose search would still run: searches left, trajectory budget not spent;
``guidance.steps=every``: before every turn) a rubric source writes a step rubric for the branching point (question,
history so far); ``AgentLoop.place_guidance`` puts it where the turn reads it, loss-masked (inside the last
observation block, or in the user prompt before the first turn), so the protocol stays valid, training never fits
the rubric's tokens and they do not count against the response budget. The agent proposes an action; before a
proposed search runs, the judge's ``step_verify`` role checks it item by item, the score is
``coreact.verification_score`` and a score <= tau fails (a proposed answer is the answer step: not verified, unless
``steps=every``). A failed action is re-planned (up to ``max_retries``) with the same rubric, the unmet items and
the verifier's written feedback in context, and the re-planned action replaces it whatever its score. The answer
step (no search left, or the trajectory budget spent) gets no rubric.

At inference (``arbor eval`` with guidance, ``guided_inference``) the agent decodes greedily and the trajectory
budget (``guidance.trajectory_tokens``, App. A: 6,000) hands it over to the answer step; guided training rollouts
keep the rollout's temperature and budgets.

Sources (``guidance.source``):

- ``judge``: the judge endpoint's ``step_rubric`` role (the paper's prompt-only variant, §4.4);
- ``memory``: ARBOR's exported common pool (``arbor rubrics export``): the rubrics with the highest rho_r, or those
  sharing most words with the question and history, weighted by rho_r (our bridge between the two papers);
- ``generator``: a trained rubric generator (``arbor-guidance-train``) sampled at T = 0.7, top-p 0.95 (App. A).

A source or verifier call that fails leaves that step unguided or unverified (the action stands) and is recorded.
Every guided step is a ``guided_steps`` row: rubric, action, verification score, pass, retry and the retry's score.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from arbor.config.guidance import GuidanceConfig
from arbor.llm.text import compact_trajectory
from arbor.seeding import derive_seed
from arbor.storage.catalog import declare_tables
from arbor.tasks.env.agent import AgentState, Generation, GenRequest
from arbor.tasks.methods.coreact.equations import (
    parse_rubric,
    passes,
    render_rubric,
    verification_score,
    verifier_feedback,
)
from arbor.tasks.methods.coreact.roles import STEP_RUBRIC, STEP_VERIFY
from arbor.tasks.methods.coreact.tables import TABLES
from arbor.types import RubricItem, StepRubric, StepVerdict

GENERATOR_SYSTEM = (
    "You write a step rubric for a search agent. Read the question and what the agent has done so far, then list "
    "3 to 5 checks the agent's NEXT step should pass, one per line as '1. [weight] condition' (positive weights "
    "summing to 1; a negative weight marks a mistake to avoid), and end with one line 'Action: ...' recommending "
    "the next step.")


@dataclass(frozen=True)
class BranchPoint:
    """Where a step rubric is written: the question, the agent's history (its text so far) and its tool calls."""

    question: str
    history: str
    tool_calls: int


GUIDANCE_HEAD = "Step rubric for your next step:"


def strip_guidance(text: str, result_close: str) -> str:
    """The agent's history without the guidance placed in it (the rubric writer and verifier read what the agent
    did and saw, not the earlier rubrics)."""
    return re.sub(rf"\n*{re.escape(GUIDANCE_HEAD)}.*?(?={re.escape(result_close)})", "\n", text, flags=re.DOTALL)


def prefix_history(text: str, max_chars: int | None) -> str:
    """The history h_t a branching point carries (``guidance.max_history_chars``): the whole prefix (None, §3.1-3.3),
    or the prefix compacted to about ``max_chars`` characters by ``compact_trajectory``, which keeps every tag,
    query and answer and elides result bodies first (so earlier queries stay judgeable)."""
    return text if max_chars is None else compact_trajectory(text, max_chars // 4)


def branch_point(s: AgentState, max_chars: int | None, result_close: str = "</result>") -> BranchPoint:
    """The state's branching point: its history (guidance removed) as ``prefix_history`` gives it."""
    return BranchPoint(s.question, prefix_history(strip_guidance(s.text, result_close), max_chars), s.search_calls)


def guidance_text(rubric: StepRubric, feedback: Sequence[str] = (), note: str = "") -> str:
    """What the agent reads before its step: the rubric, and after a failed verification the unmet items
    (``feedback``) and the verifier's own written feedback (``note``, §3.3's per-criterion feedback)."""
    text = f"{GUIDANCE_HEAD}\n{render_rubric(rubric)}"
    note = " ".join(note.split())
    if feedback or note:
        text += "\nYour previous attempt at this step did not pass"
        text += (": " + "; ".join(feedback) + ".") if feedback else "."
        if note:
            text += f" Verifier's feedback: {note}" + ("" if note[-1] in ".!?" else ".")
        text += " Revise it."
    return text


def retry_text(cfg: GuidanceConfig, rubric: StepRubric, verdict: StepVerdict) -> str:
    """The guidance of a retry: the same rubric, the unmet items and (``retry_feedback=verifier``, the paper's) the
    verifier's written feedback."""
    note = verdict.feedback if cfg.retry_feedback == "verifier" else ""
    return guidance_text(rubric, verifier_feedback(rubric, verdict.satisfied), note)


@contextmanager
def guided_inference(engine: Any, cfg: GuidanceConfig) -> Iterator[float | None]:
    """Co-ReAct's inference settings on ``engine`` inside the block (App. A): the trajectory budget
    (``guidance.trajectory_tokens``) on its agent loop, restored after. Yields the agent's temperature
    (``guidance.agent_temperature``: 0, greedy; None: the caller's own)."""
    loop = engine.loop
    saved = loop.budgets
    loop.budgets = dataclasses.replace(saved, max_trajectory_tokens=cfg.trajectory_tokens)
    try:
        yield cfg.agent_temperature
    finally:
        loop.budgets = saved


def generator_user(point: BranchPoint) -> str:
    """The generator's user message for one branching point (its system message is ``GENERATOR_SYSTEM``)."""
    history = point.history.strip() or "(nothing yet)"
    return f"Question: {point.question.strip()}\n\nAgent so far:\n{history}\n\nSearches so far: {point.tool_calls}"


# ---- rubric sources ----------------------------------------------------------------------------------------------

Written = tuple[StepRubric | None, str | None]  # (rubric, error)


class RubricSource(Protocol):
    name: str

    def write(self, points: Sequence[BranchPoint], seeds: Sequence[int]) -> list[Written]: ...


class JudgeRubrics:
    """The judge's ``step_rubric`` role (prompt-only Co-ReAct)."""

    name = "judge"

    def __init__(self, judge: Any, max_tool_calls: int, ctx: Any = None) -> None:
        self.judge, self.max_tool_calls, self.ctx = judge, max_tool_calls, ctx

    def write(self, points: Sequence[BranchPoint], seeds: Sequence[int]) -> list[Written]:
        async def one(p: BranchPoint) -> Written:
            out = await self.judge.ask(STEP_RUBRIC, question=p.question, history=p.history, tool_calls=p.tool_calls,
                                       max_tool_calls=self.max_tool_calls, ctx=self.ctx)
            return (out.value, None) if out.value is not None else (None, out.error or "failed")

        return run_judge(self.judge, [one(p) for p in points])


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 2}


class MemoryRubrics:
    """Step rubrics from an exported ARBOR common pool: ``memory_items`` rubrics, weights proportional to
    max(rho_r, 0.1) and summing to 1; ``top`` takes the highest rho_r (the same rubric every step), ``retrieve``
    those sharing most words with the question and history (ties: higher rho_r). No recommended action."""

    name = "memory"

    def __init__(self, pool: dict[str, Any], pick: str, n_items: int) -> None:
        rubrics = list(pool.get("rubrics") or [])
        if not rubrics:
            raise ValueError("guidance.memory_pool: the exported pool holds no rubrics")
        self.rubrics = sorted(rubrics, key=lambda r: -(r.get("rho_r") if r.get("rho_r") is not None else -1.0))
        self.pick, self.n_items = pick, n_items

    def _rubric(self, chosen: Sequence[dict[str, Any]]) -> StepRubric:
        raw = [max(float(r.get("rho_r") or 0.0), 0.1) for r in chosen]
        items = tuple(RubricItem(round(w / sum(raw), 3), str(r.get("description") or r.get("title")))
                      for w, r in zip(raw, chosen, strict=True))
        return StepRubric(items)

    def write(self, points: Sequence[BranchPoint], seeds: Sequence[int]) -> list[Written]:
        out: list[Written] = []
        for p in points:
            if self.pick == "top":
                chosen = self.rubrics[: self.n_items]
            else:
                ctx = _words(f"{p.question} {p.history}")
                scored = sorted(enumerate(self.rubrics),
                                key=lambda ir: (-len(ctx & _words(f"{ir[1].get('title')} {ir[1].get('description')}")),
                                                ir[0]))
                chosen = [r for _, r in scored[: self.n_items]]
            out.append((self._rubric(chosen), None))
        return out


class GeneratorRubrics:
    """A trained rubric generator (a causal LM checkpoint) sampled at T / top-p (App. A: 0.7 / 0.95)."""

    name = "generator"

    def __init__(self, model: Any, tokenizer: Any, *, temperature: float, top_p: float, max_tokens: int,
                 max_batch_rows: int = 64) -> None:
        from arbor.tasks.env.decoding import eos_token_ids

        self.model, self.tokenizer = model, tokenizer
        self.temperature, self.top_p, self.max_tokens = temperature, top_p, max_tokens
        self.eos_ids = eos_token_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else next(iter(self.eos_ids))
        self.max_batch_rows = max_batch_rows

    def requests(self, points: Sequence[BranchPoint], seeds: Sequence[int]) -> list[GenRequest]:
        """Prompts tokenised like SFT rows (``build_prompt_ids``), so the warm start trains on the same tokens."""
        from arbor.tasks.env.agent import build_prompt_ids

        return [GenRequest(build_prompt_ids(self.tokenizer, generator_user(p), GENERATOR_SYSTEM), self.max_tokens,
                           seed) for p, seed in zip(points, seeds, strict=True)]

    def sample(self, requests: Sequence[GenRequest]) -> list[Generation]:
        """One rubric per request, with the sampled tokens' log-probs (the GRPO trainer reuses them)."""
        from arbor.tasks.env.decoding import generate_turns

        out: list[Generation] = []
        for i in range(0, len(requests), self.max_batch_rows):
            out += generate_turns(self.model, requests[i:i + self.max_batch_rows], temperature=self.temperature,
                                  top_p=self.top_p, decode=self.decode, stop_strings=[], eos_ids=self.eos_ids,
                                  pad_id=self.pad_id)
        return out

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode([t for t in ids if t not in self.eos_ids], skip_special_tokens=False)

    def write(self, points: Sequence[BranchPoint], seeds: Sequence[int]) -> list[Written]:
        out: list[Written] = []
        for g in self.sample(self.requests(points, seeds)):
            rubric = parse_rubric(self.decode(g.token_ids))
            out.append((rubric, None) if rubric.items else (None, "no rubric items in the generator's text"))
        return out


def run_judge(judge: Any, coros: Sequence[Any]) -> list[Any]:
    """Gather judge coroutines on a fresh event loop; the judge's network clients are closed with it."""
    async def main() -> list[Any]:
        try:
            return list(await asyncio.gather(*coros))
        finally:
            await judge.aclose()

    return asyncio.run(main()) if coros else []


# ---- the inject / verify / retry loop ------------------------------------------------------------------------

@dataclass
class _Step:
    state: AgentState
    point: BranchPoint
    rubric: StepRubric | None
    rubric_error: str | None
    gen: Generation | None = None
    verdict: StepVerdict | None = None
    verify_error: str | None = None
    score: float | None = None
    attempts: int = 0


class CoReAct:
    """Runs agent states to the end under Co-ReAct guidance with any engine that has ``complete`` and ``loop``.

    ``records`` collects one ``guided_steps`` row per guided turn; ``columns`` is merged into each (split,
    run_index of an evaluation); drain with ``drain_records``."""

    def __init__(self, cfg: GuidanceConfig, source: RubricSource, judge: Any = None, *, ctx: Any = None) -> None:
        if cfg.verify and judge is None:
            raise ValueError("guidance.verify needs the judge's step_verify role")
        self.cfg, self.source, self.judge, self.ctx = cfg, source, judge, ctx
        self.records: list[dict[str, Any]] = []
        self.columns: dict[str, Any] = {}

    def inference(self, engine: Any) -> AbstractContextManager[float | None]:
        """Co-ReAct's inference settings on ``engine`` (``guided_inference``), for callers that get a guide and
        import no method (``tasks.reporting.evaluate``)."""
        return guided_inference(engine, self.cfg)

    def set_context(self, ctx: Any, **columns: Any) -> None:
        """The judge-ledger context of the calls to come (the source's too) and the columns of their records."""
        self.ctx, self.columns = ctx, columns
        if hasattr(self.source, "ctx"):
            self.source.ctx = ctx

    def drain_records(self) -> list[dict[str, Any]]:
        out, self.records = self.records, []
        return out

    def _verify(self, steps: Sequence[_Step], actions: Sequence[str]) -> None:
        async def one(st: _Step, action: str) -> tuple[StepVerdict | None, str | None]:
            assert st.rubric is not None
            out = await self.judge.ask(STEP_VERIFY, question=st.point.question, history=st.point.history,
                                       action=action, rubric=st.rubric, ctx=self.ctx)
            return (out.value, None) if out.value is not None else (None, out.error or "failed")

        for st, (verdict, err) in zip(steps, run_judge(self.judge, [one(st, a) for st, a in zip(steps, actions,
                                                                                                  strict=True)]),
                                      strict=True):
            st.verdict, st.verify_error = verdict, err
            st.score = (verification_score([it.weight for it in st.rubric.items], verdict.satisfied)  # type: ignore[union-attr]
                        if verdict is not None else None)

    def run(self, engine: Any, states: Sequence[AgentState], keys: Sequence[tuple[int, int]]) -> None:
        """Drive ``states`` (with their (group, sample) ``keys``) to the end, one guided turn per round."""
        loop = engine.loop
        key_of = {id(s): k for s, k in zip(states, keys, strict=True)}

        def decode(g: Generation) -> str:
            ids = [t for t in g.token_ids if t not in loop.eos_ids]
            return loop.tokenizer.decode(ids, skip_special_tokens=False)

        def generate(reqs: list[GenRequest]) -> list[Generation]:
            return engine.complete(reqs, temperature=engine.cfg.rollout.temperature, stop_strings=loop.stop_strings)

        every = self.cfg.steps == "every"

        def verified(st: _Step) -> bool:  # a proposed search (tool mode) or any action (every turn)
            assert st.gen is not None
            return every or loop.is_search(decode(st.gen))

        while active := [s for s in states if not s.done]:
            tool = [s for s in active if every or loop.may_search(s)]  # the answer step gets no rubric
            points = [branch_point(s, self.cfg.max_history_chars, loop.protocol.result_close) for s in tool]
            written = self.source.write(points, [derive_seed(s.seed, "rubric", len(s.turns)) for s in tool])
            by_state = {id(s): _Step(s, p, r, e) for s, p, (r, e) in zip(tool, points, written, strict=True)}
            steps = [by_state.get(id(s)) or _Step(s, BranchPoint(s.question, "", s.search_calls), None, None)
                     for s in active]
            for st in steps:
                if st.rubric is not None:
                    loop.place_guidance(st.state, guidance_text(st.rubric))
            steps = [st for st in steps if not st.state.done]
            if not steps:
                continue
            for st, g in zip(steps, generate([loop.next_request(st.state) for st in steps]), strict=True):
                st.gen, st.attempts = g, 1
            first = {id(st): (decode(st.gen), None, None) for st in steps}  # type: ignore[arg-type]
            if self.cfg.verify:
                checked = [st for st in steps if st.rubric is not None and verified(st)]
                self._verify(checked, [first[id(st)][0] for st in checked])
                first = {id(st): (first[id(st)][0], st.score, st.verify_error) for st in steps}
                for attempt in range(self.cfg.max_retries):
                    failed = [st for st in checked if st.score is not None and not passes(st.score, self.cfg.tau)
                              and st.attempts == attempt + 1 and not st.state.done]
                    for st in failed:
                        assert st.rubric is not None and st.verdict is not None
                        loop.place_guidance(st.state, retry_text(self.cfg, st.rubric, st.verdict))
                    failed = [st for st in failed if not st.state.done]
                    if not failed:
                        break
                    reqs = []
                    for st in failed:
                        r = loop.next_request(st.state)
                        reqs.append(GenRequest(r.context_ids, r.max_new_tokens,
                                               derive_seed(st.state.seed, "turn", len(st.state.turns), "retry",
                                                           attempt)))
                    for st, g in zip(failed, generate(reqs), strict=True):
                        st.gen, st.attempts = g, attempt + 2
                    for st in failed:  # a re-plan that answers is the answer step: it stands unverified
                        if not verified(st):
                            st.verdict, st.score, st.verify_error = None, None, None
                    again = [st for st in failed if verified(st)]
                    self._verify(again, [decode(st.gen) for st in again])  # type: ignore[arg-type]
            for st in steps:
                action0, score0, err0 = first[id(st)]
                group, sample = key_of[id(st.state)]
                retried = st.attempts > 1
                self.records.append({
                    **self.columns, "question_id": st.state.question_id, "group": group, "sample": sample,
                    "turn": len(st.state.turns), "source": self.source.name,
                    "rubric": render_rubric(st.rubric) if st.rubric is not None else None,
                    "n_items": len(st.rubric.items) if st.rubric is not None else 0,
                    "rubric_error": st.rubric_error, "action": action0, "verify_score": score0,
                    "passed": None if score0 is None else passes(score0, self.cfg.tau),
                    "retried": retried, "retry_action": decode(st.gen) if retried else None,  # type: ignore[arg-type]
                    "retry_score": st.score if retried else None,
                    "retry_passed": (None if st.score is None else passes(st.score, self.cfg.tau)) if retried else None,
                    "verify_error": err0 if not retried else (err0 or st.verify_error),
                })
            done = [st for st in steps if not st.state.done]
            loop.advance([st.state for st in done], [st.gen for st in done])  # type: ignore[misc]


def make_guide(cfg: Any, judge: Any, *, home: Any = None, ctx: Any = None) -> CoReAct | None:
    """The ``CoReAct`` driver of ``cfg.guidance`` (None when guidance.mode is off); errors name the key. With a
    workspace (``home``), Co-ReAct's tables are declared in it, since the guide's records are stored there."""
    g: GuidanceConfig = cfg.guidance
    if g.mode == "off":
        return None
    if home is not None:
        declare_tables(TABLES, home)
    source: RubricSource
    if g.source == "judge":
        source = JudgeRubrics(judge, cfg.rollout.max_searches, ctx)
    elif g.source == "memory":
        if not g.memory_pool:
            raise ValueError("guidance.memory_pool: source=memory needs an exported pool (arbor rubrics export RUN)")
        from arbor.tasks.methods.arbor.memory import load_pool_file

        source = MemoryRubrics(load_pool_file(g.memory_pool), g.memory_pick, g.memory_items)
    else:
        if not g.generator:
            raise ValueError("guidance.generator: source=generator needs a generator checkpoint")
        from arbor.tasks.env.policy import load_policy

        model, tok = load_policy(g.generator, cfg.policy.dtype, home=home)
        source = GeneratorRubrics(model, tok, temperature=g.generator_temperature, top_p=g.generator_top_p,
                                  max_tokens=g.max_rubric_tokens, max_batch_rows=cfg.rollout.max_batch_rows)
    return CoReAct(g, source, judge if g.verify else None, ctx=ctx)


def guidance_tag(g: GuidanceConfig) -> str:
    """What ``eval_results.guidance`` says of guided answers: ``co-react:<source>``, ``:inject`` without verification."""
    return f"co-react:{g.source}" + ("" if g.verify else ":inject")
