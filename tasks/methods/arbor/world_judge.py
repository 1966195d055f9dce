"""Two judges for ARBOR's roles beside ``rules``: ``world`` reads the synthetic world's facts, and
``random`` answers by seeded coin flips (the control that admission, eq. 2, must filter).

``world`` answers induction (E.1), consolidation (E.2) and pairwise (E.3) as a capable LLM judge would from its own
knowledge of the encyclopedia: it knows every entity and fact of the world (``tasks/env/world/``) and reads the
question and the trajectories' text, never the gold answer. Everything it reads goes through ``reader_view``, which
keeps the question, the trajectories' text, the anchor positions (which trajectory scored higher: ARBOR's induction
is contrastive by design, eq. 1) and the rubrics' features, and drops every field derived from the gold
(``golds``, ``em``, ``f1``, ``base_reward``) before any reader sees the request. From the question it finds the
entities the question names and, for a bridge phrase ("the director of the film F"), the bridge entity (the first
hop's fact); it never evaluates the relation the question asks for (the last hop), so it does not compute the
answer. Its rubrics are about process: the chain entities retrieved, the bridge entity found, an answer that a
retrieved passage of the answer-bearing entity states, thoughts that contradict the world, searches that retrieve
no needed entity (docs/decisions/world-and-random-judges-and-judge-signal-quality.md).

Both answer every other role (accuracy in evaluation, other methods' roles) as the ``rules`` judge does.
"""

from __future__ import annotations

import hashlib
import random
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from arbor.config.judge import JudgeConfig
from arbor.llm.base import CallContext, JudgeOutcome, Q, Refusal, Role, T, register_backend
from arbor.llm.rules import RulesJudge
from arbor.llm.text import parse_trajectory
from arbor.reward import normalize_answer
from arbor.seeding import derive_seed
from arbor.tasks.env.world.entities import Entity, World, build_world, fact
from arbor.tasks.env.world.templates import BRIDGES, FACT_SENTENCES, RELATIONS, SUBJECT
from arbor.tasks.methods.arbor.induction import contrast_pairs, unlabeled_members
from arbor.tasks.methods.arbor.roles import Consolidation, Induction, Pairwise
from arbor.types import RubricDraft

ARBOR_ROLES = ("induction", "consolidation", "pairwise")  # the roles these judges answer themselves
PROMPT_VERSION = {"world": "world.v1", "random": "random.v1"}


# ---- what the judges read: the only code that touches a request ---------------------------------------------------
@dataclass(frozen=True)
class PairwiseView:
    question: str
    text_a: str  # the trajectories' text, in the shown order
    text_b: str
    feature: str | None
    direction: int


@dataclass(frozen=True)
class InductionView:
    question: str
    texts: tuple[str, ...]
    format_valid: tuple[bool, ...]  # the format gate (arbor.format), read from the text alone
    anchors: tuple[tuple[str, Any], ...]  # eq. 1's mode and anchor positions: which trajectory scored higher
    covered: frozenset[str]  # features an existing common rubric reads


@dataclass(frozen=True)
class ConsolidationView:
    seen: tuple[tuple[str, tuple[tuple[str | None, int], ...]], ...]  # query -> its drafts' (feature, direction)
    covered: frozenset[tuple[str | None, int]]


View = PairwiseView | InductionView | ConsolidationView


def reader_view(request: Any) -> View:
    """The part of an ARBOR role request a judge may read: no gold answer, no outcome derived from it."""
    if isinstance(request, Pairwise):
        return PairwiseView(request.question, request.shown_a.text, request.shown_b.text, request.rubric.feature,
                            request.rubric.direction)
    if isinstance(request, Induction):
        covered = frozenset(r.feature for r in request.existing
                            if r.feature and getattr(r, "kind", "draft") == "common")
        return InductionView(request.question, tuple(t.text for t in request.trajectories),
                             tuple(bool(t.format_valid) for t in request.trajectories),
                             tuple(sorted(request.anchors.items())), covered)
    if isinstance(request, Consolidation):
        return ConsolidationView(
            tuple((q, tuple((d.feature, d.direction) for d in ds)) for q, ds in request.candidates_by_query.items()),
            frozenset((r.feature, r.direction) for r in request.existing if r.feature))
    raise TypeError(f"not an ARBOR role request: {type(request).__name__}")


def view_key(role: str, view: View) -> str:
    return hashlib.sha256(repr((role, view)).encode()).hexdigest()


# ---- the world as a reader knows it -------------------------------------------------------------------------------
_TITLE = re.compile(r"\(Title: ([^)]*)\)")


class WorldReader:
    """The world's entities by name, and what a question and a trajectory say about them."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.by_name = {e.name: e for e in world.entities.values()}
        names = sorted(self.by_name, key=len, reverse=True)
        self._names = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
        self.chain = lru_cache(maxsize=8192)(self._chain)
        # a thought restating a fact: "Tobara was directed by Kerar Silix." (FACT_SENTENCES)
        self._claims = [(rel, re.compile(re.escape(t).replace(r"\{n\}", r"(?P<n>.+?)").replace(r"\{v\}", r"(?P<v>[^.]+)")))
                        for rel, t in FACT_SENTENCES.items()]

    def named(self, text: str) -> list[Entity]:
        return [self.by_name[m] for m in dict.fromkeys(self._names.findall(text))]

    def _chain(self, question: str) -> tuple[tuple[Entity, ...], tuple[Entity, ...]]:
        """(the entities the question names, the bridge entities its bridge phrases lead to): the first hop read
        from the encyclopedia, never the relation asked of the last entity."""
        named = self.named(question)
        low = question.lower()
        bridges: list[Entity] = []
        # each entity with the noun phrase that names it in the question; a bridge phrase around that phrase leads
        # one hop further ("the birthplace of the director of the film F": F, then its director, then nothing more)
        frontier = [(e, SUBJECT[e.kind].format(n=e.name)) for e in named]
        while frontier:
            e, phrase = frontier.pop(0)
            for first, (phrases, _) in BRIDGES.items():
                if RELATIONS[first][0] != e.kind:
                    continue
                for p in phrases:
                    outer = p.format(x=phrase)
                    if outer.lower() in low:
                        mid = fact(self.world, e, first)[1]
                        if mid is not None and mid not in bridges:
                            bridges.append(mid)
                            frontier.append((mid, outer))
        return tuple(named), tuple(bridges)

    def values(self, e: Entity) -> set[str]:
        """Every fact value the entity's passage states."""
        return {fact(self.world, e, rel)[0] for rel, (subj, _) in RELATIONS.items() if subj == e.kind}

    def contradicted(self, sentence_text: str) -> int:
        """Fact restatements in ``sentence_text`` that the world contradicts (a known entity, a wrong value)."""
        bad = 0
        for sentence in re.split(r"(?<=\.)\s+", sentence_text):
            for rel, pattern in self._claims:
                m = pattern.fullmatch(sentence.strip())
                if not m or (e := self.by_name.get(m.group("n").strip())) is None or RELATIONS[rel][0] != e.kind:
                    continue
                bad += normalize_answer(m.group("v")) != normalize_answer(fact(self.world, e, rel)[0])
        return bad


def retrieved_titles(text: str) -> list[set[str]]:
    """The passage titles of each result block, in order."""
    return [set(_TITLE.findall(r)) for r in parse_trajectory(text).results]


# ---- process features: (reader, question, trajectory text) -> value -----------------------------------------------
def chain_coverage(rd: WorldReader, question: str, text: str) -> float:
    """Share of the question's chain entities (named and bridge) whose passage a search retrieved."""
    named, bridges = rd.chain(question)
    chain = {e.name for e in (*named, *bridges)}
    got = set().union(*retrieved_titles(text)) if retrieved_titles(text) else set()
    return len(chain & got) / len(chain) if chain else 0.0


def bridge_retrieved(rd: WorldReader, question: str, text: str) -> float:
    """Share of the bridge entities whose passage was retrieved (1 when the question has no bridge)."""
    _, bridges = rd.chain(question)
    if not bridges:
        return 1.0
    got = set().union(*retrieved_titles(text)) if retrieved_titles(text) else set()
    return sum(e.name in got for e in bridges) / len(bridges)


def answer_supported(rd: WorldReader, question: str, text: str) -> float:
    """1 when the final answer is a value that a retrieved passage of the answer-bearing entity states (the last
    bridge entity of a bridge or three-hop question, else the named ones; a choice between named entities may name
    one)."""
    answer = parse_trajectory(text).answer
    if not answer:
        return 0.0
    named, bridges = rd.chain(question)
    got = set().union(*retrieved_titles(text)) if retrieved_titles(text) else set()
    values: set[str] = set()
    for e in bridges[-1:] or named:  # the last bridge holds the answer (a three-hop question's second)
        if e.name in got:
            values |= rd.values(e)
            if not bridges and len(named) >= 2:
                values.add(e.name)
    return float(normalize_answer(answer) in {normalize_answer(v) for v in values})


def contradictions(rd: WorldReader, question: str, text: str) -> float:
    """Fact restatements in the trajectory's own words (thoughts, answer; not queries or results) the world
    contradicts."""
    return float(sum(rd.contradicted(s.text) for s in parse_trajectory(text).segments
                     if s.kind not in ("result", "search")))


def wasted_searches(rd: WorldReader, question: str, text: str) -> float:
    """Searches whose results brought no chain entity not already retrieved."""
    named, bridges = rd.chain(question)
    chain = {e.name for e in (*named, *bridges)}
    seen: set[str] = set()
    wasted = 0
    for titles in retrieved_titles(text):
        new = (titles & chain) - seen
        wasted += not new
        seen |= new
    return float(wasted)


WorldFeature = Callable[[WorldReader, str, str], float]
# name -> (function, scale of a difference, prior direction for unlabeled groups)
WORLD_FEATURES: dict[str, tuple[WorldFeature, float, int]] = {
    "chain_coverage": (chain_coverage, 1.0, +1),
    "bridge_retrieved": (bridge_retrieved, 1.0, +1),
    "answer_supported": (answer_supported, 1.0, +1),
    "contradictions": (contradictions, 1.0, -1),
    "wasted_searches": (wasted_searches, 2.0, -1),
}

# (feature, direction) -> (title, high-scoring description, low-scoring description)
_TEXT: dict[tuple[str, int], tuple[str, str, str]] = {
    ("chain_coverage", 1): (
        "Retrieve Every Entity the Question Hinges On",
        "Searches until the passage of every entity on the question's chain (named or reached through a hop) is "
        "among the results.", "Answers with entities of the question's chain never retrieved."),
    ("chain_coverage", -1): (
        "Answer From Partial Retrieval", "Answers before retrieving every entity of the chain.",
        "Retrieves every entity of the chain."),
    ("bridge_retrieved", 1): (
        "Resolve the Bridge Entity", "Identifies the intermediate entity of a multi-hop question and retrieves its "
        "own passage before answering.", "Stops at the first hop, never retrieving the intermediate entity's passage."),
    ("bridge_retrieved", -1): (
        "Skip the Intermediate Hop", "Answers without retrieving the intermediate entity.",
        "Retrieves the intermediate entity."),
    ("answer_supported", 1): (
        "Answer Stated by the Retrieved Evidence", "Gives a final answer that a retrieved passage of the entity the "
        "question asks about states as a fact.", "Gives a final answer that no retrieved passage of that entity "
        "states."),
    ("answer_supported", -1): (
        "Answer Beyond the Evidence", "Answers with something the retrieved passages do not state.",
        "Answers with a fact the retrieved passages state."),
    ("contradictions", -1): (
        "Restate Facts Faithfully", "Restates retrieved facts in its reasoning exactly as the passages give them.",
        "Asserts facts about entities that the passages (and the world) contradict."),
    ("contradictions", 1): (
        "Speculative Restatement", "Asserts facts beyond or against the passages.",
        "Restates facts as the passages give them."),
    ("wasted_searches", -1): (
        "Every Search Retrieves a Needed Entity", "Aims each query so that its results bring a new entity the "
        "question needs.", "Issues searches whose results bring no entity the question needs."),
    ("wasted_searches", 1): (
        "Broad Exploration", "Explores with searches beyond the question's entities.",
        "Searches only for the entities the question needs."),
}


def _draft(feature: str, direction: int, observed: str | None = None) -> RubricDraft:
    title, desc, counter = _TEXT[(feature, direction)]
    return RubricDraft(title, f"{desc} (here: {observed})" if observed else desc, counter, feature=feature,
                       direction=direction)


def world_value(rd: WorldReader, feature: str, question: str, text: str) -> float:
    return WORLD_FEATURES[feature][0](rd, question, text)


def world_pairwise(rd: WorldReader, v: PairwiseView, tolerance: float) -> str:
    """E.3 under a world rubric: direction * (f(A) - f(B)) decides beyond the tolerance (on the feature's scale)."""
    if v.feature not in WORLD_FEATURES or v.direction not in (1, -1):
        raise Refusal("RubricWithoutFeature")
    scale = WORLD_FEATURES[v.feature][1]
    fa, fb = (world_value(rd, v.feature, v.question, t) for t in (v.text_a, v.text_b))
    if abs(fa - fb) / scale <= tolerance:
        return "TIE"
    return "A" if v.direction * (fa - fb) > 0 else "B"


def world_induce(rd: WorldReader, v: InductionView, tolerance: float) -> list[RubricDraft]:
    """E.1: the (at most 3) world features on which the higher anchor beats the lower in both contrast pairs
    beyond the tolerance, same direction; unlabeled (A.1): features that spread the format-valid members, with
    their prior direction. Features an existing common rubric reads are skipped."""
    anchors = dict(v.anchors)
    scored: list[tuple[float, str, int, str]] = []
    for name, (_, scale, prior) in WORLD_FEATURES.items():
        if name in v.covered:
            continue
        if anchors.get("mode") == "unlabeled":
            members = unlabeled_members(list(v.format_valid)) or range(len(v.texts))
            vals = [world_value(rd, name, v.question, v.texts[i]) for i in members]
            if (max(vals) - min(vals)) / scale > tolerance:
                scored.append(((max(vals) - min(vals)) / scale, name, prior, f"{min(vals):g}-{max(vals):g}"))
            continue
        pairs = [(world_value(rd, name, v.question, v.texts[a]), world_value(rd, name, v.question, v.texts[b]))
                 for a, b in contrast_pairs(anchors)]
        deltas = [(hi - lo) / scale for hi, lo in pairs]
        if deltas and (all(d > tolerance for d in deltas) or all(d < -tolerance for d in deltas)):
            obs = "; ".join(f"{hi:g} vs {lo:g}" for hi, lo in pairs)
            scored.append((min(abs(d) for d in deltas), name, 1 if deltas[0] > 0 else -1, f"{name} {obs}"))
    scored.sort(key=lambda s: (-s[0], s[1]))
    return [_draft(name, d, obs) for _, name, d, obs in scored[:3]]


def world_consolidate(v: ConsolidationView) -> list[RubricDraft]:
    """E.2: a (feature, direction) drafted for >= 2 distinct queries becomes a common standard (at most 2, most
    widely seen first) unless an existing common rubric has it."""
    seen: dict[tuple[str, int], set[str]] = {}
    for query, pairs in v.seen:
        for f, d in pairs:
            if f in WORLD_FEATURES and (f, d) in _TEXT:
                seen.setdefault((f, d), set()).add(query)
    ranked = sorted(((len(qs), f, d) for (f, d), qs in seen.items() if len(qs) >= 2 and (f, d) not in v.covered),
                    key=lambda x: (-x[0], x[1], x[2]))
    return [_draft(f, d) for _, f, d in ranked[:2]]


# ---- the backends -------------------------------------------------------------------------------------------------
class _ArborRolesJudge(RulesJudge):
    """ARBOR's three roles answered by ``answer_view`` from ``reader_view(request)``; every other role by rules."""

    def __init__(self, cfg: JudgeConfig, *, home: Any, config: Any = None) -> None:
        super().__init__(cfg, home=home)
        self.views: deque[View] = deque(maxlen=4096)  # the latest views read (what tests check for gold)

    def answer_view(self, role: str, view: View) -> Any:
        raise NotImplementedError

    async def _answer(self, role: Role[Q, T], request: Q, ctx: CallContext | None) -> JudgeOutcome[T]:
        if role.name not in ARBOR_ROLES:
            return await super()._answer(role, request, ctx)
        t0 = time.perf_counter()
        view = reader_view(request)
        self.views.append(view)
        key = view_key(role.name, view)
        try:
            value, error = self.answer_view(role.name, view), None
        except Refusal as e:
            value, error = None, str(e)
        self._record(ctx, role=role.name, model=self.backend, prompt_version=PROMPT_VERSION[self.backend],
                     cache_key=key, prompt_hash=key[:16], latency_s=time.perf_counter() - t0, prompt_tokens=0,
                     completion_tokens=0, cost_usd=0.0, cache_hit=False, attempts=1, error=error,
                     attempt_errors=[error])
        return JudgeOutcome(value, error, 1, False)


@register_backend
class WorldJudge(_ArborRolesJudge):
    """``judge.backend=world``: ARBOR's roles from the synthetic world's facts (module docstring)."""

    backend = "world"

    def __init__(self, cfg: JudgeConfig, *, home: Any, config: Any = None) -> None:
        super().__init__(cfg, home=home)
        train = getattr(getattr(config, "data", None), "train", "")
        if config is None or not str(train).startswith("world:"):
            raise ValueError(f"judge.backend=world reads the synthetic world's facts: it needs data.train=world:... "
                             f"(got {train or 'no run config'})")
        self.reader = WorldReader(build_world(config.world))

    def answer_view(self, role: str, view: View) -> Any:
        if isinstance(view, PairwiseView):
            return world_pairwise(self.reader, view, self.cfg.rules_tolerance)
        if isinstance(view, InductionView):
            return world_induce(self.reader, view, self.cfg.rules_tolerance)
        return world_consolidate(view)


RANDOM_TIE_SHARE = 0.2  # the random judge's pairwise ties; A and B share the rest equally


@register_backend
class RandomJudge(_ArborRolesJudge):
    """``judge.backend=random``: schema-valid answers drawn from ``derive_seed(run.seed, role, the view's hash)``,
    so a resumed run (same seed, same calls) gets the same answers."""

    backend = "random"

    def __init__(self, cfg: JudgeConfig, *, home: Any, config: Any = None) -> None:
        super().__init__(cfg, home=home)
        self.seed = int(config.run.seed) if config is not None else 0

    def answer_view(self, role: str, view: View) -> Any:
        rng = random.Random(derive_seed(self.seed, "random-judge", role, view_key(role, view)))
        if isinstance(view, PairwiseView):
            u = rng.random()
            return "TIE" if u < RANDOM_TIE_SHARE else ("A" if u < (1 + RANDOM_TIE_SHARE) / 2 else "B")
        if isinstance(view, InductionView):
            return [_draft(f, d) for f, d in rng.sample(sorted(_TEXT), rng.randint(0, 3))]
        offered = sorted({(f, d) for _, pairs in view.seen for f, d in pairs if (f, d) in _TEXT})
        return [_draft(f, d) for f, d in rng.sample(offered, rng.randint(0, min(2, len(offered))))]

