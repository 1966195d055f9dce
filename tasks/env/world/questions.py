"""The world's questions (kind-filtered splits and three hops): 1-hop, 2-hop
bridge and comparison questions of each split, each with its gold answer and gold search path, and 3-hop questions
asked only by name (``world:train-three_hop``), outside the default mix."""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from arbor.config.world import WorldConfig
from arbor.seeding import derive_seed
from arbor.tasks.env.world.entities import (
    KINDS,
    SPLITS,
    WORLD_VERSION,
    Entity,
    World,
    WorldError,
    build_world,
    fact,
)
from arbor.tasks.env.world.templates import BRIDGES, COMPARE, QUESTIONS, RELATIONS, SUBJECT

# Kinds outside the mix of ``world:<split>`` (no share in WorldConfig, so every existing world, question id and SFT
# row stays as it was): asked for by name, ``world:train-three_hop``.
NAMED_KINDS = ("three_hop",)


@dataclass(frozen=True)
class Hop:
    """One step of a gold search path: the query that names the entity, and its passage."""

    query: str
    doc_id: str
    title: str


@dataclass(frozen=True)
class WorldQuestion:
    """A world question with its gold answer and gold search path; ``relation`` names the template used."""

    question_id: str
    question: str
    answer: str
    kind: str
    relation: str
    split: str
    path: tuple[Hop, ...]

    def to_question(self) -> Any:
        from arbor.tasks.env.datasets import Question

        return Question(self.question_id, self.question, [self.answer], f"world:{self.kind}",
                        [h.doc_id for h in self.path], [h.title for h in self.path])


def kind_counts(n: int, cfg: WorldConfig) -> dict[str, int]:
    """Questions of each kind among ``n``: the shares, rounded by largest remainder so they sum to ``n``."""
    shares = {"one_hop": cfg.share_one_hop, "bridge": cfg.share_bridge, "comparison": cfg.share_comparison}
    raw = {k: s * n for k, s in shares.items()}
    out = {k: int(v) for k, v in raw.items()}
    for k in sorted(raw, key=lambda k: (out[k] - raw[k], KINDS.index(k)))[: n - sum(out.values())]:
        out[k] += 1
    return out


def _hop(e: Entity) -> Hop:
    return Hop(e.name, e.eid, e.name)


def _candidates(world: World, split: str, kind: str) -> dict[str, list[tuple]]:
    """Every distinct question of ``kind`` in ``split``, grouped by relation: (relation, entity, ...) tuples."""
    out: dict[str, list[tuple]] = {}
    if kind == "one_hop":
        for rel, (subj, _) in RELATIONS.items():
            out[rel] = [(rel, e) for e in world.of(subj, split)]
    elif kind == "bridge":
        for first, (_, seconds) in BRIDGES.items():
            subj = RELATIONS[first][0]
            for second in seconds:
                out[f"{first}>{second}"] = [(first, second, e) for e in world.of(subj, split)]
    elif kind == "three_hop":  # two bridge phrases nested: "the birthplace of the director of the film F"
        for first, (_, seconds) in BRIDGES.items():
            subj = RELATIONS[first][0]
            for second in seconds:
                for third in BRIDGES.get(second, ((), ()))[1]:
                    out[f"{first}>{second}>{third}"] = [(first, second, third, e) for e in world.of(subj, split)]
    else:
        for etype, direction in COMPARE:
            pairs = [(a, b) for a, b in combinations(world.of(etype, split), 2) if a.year != b.year]
            out[f"compare.{etype}.{direction}"] = [(etype, direction, a, b) for a, b in pairs]
    return out


def _draw(world: World, split: str, kind: str, n: int, rng: random.Random) -> list[tuple]:
    """Up to ``n`` distinct questions of ``kind``: each relation's candidates shuffled, the relations in a shuffled
    order, taken round-robin so that every relation gets its share."""
    groups = _candidates(world, split, kind)
    for items in groups.values():
        rng.shuffle(items)
    order = sorted(groups)
    rng.shuffle(order)
    picked: list[tuple] = []
    while len(picked) < n and any(groups.values()):
        for rel in order:
            if len(picked) < n and groups[rel]:
                picked.append(groups[rel].pop())
    return picked


def _make_question(world: World, kind: str, item: tuple, rng: random.Random, qid: str, split: str) -> WorldQuestion:
    if kind == "one_hop":
        rel, e = item
        text = rng.choice(QUESTIONS[rel]).format(x=SUBJECT[e.kind].format(n=e.name))
        return WorldQuestion(qid, text, fact(world, e, rel)[0], kind, rel, split, (_hop(e),))
    if kind == "bridge":
        first, second, e = item
        _, mid = fact(world, e, first)
        assert mid is not None
        phrase = rng.choice(BRIDGES[first][0]).format(x=SUBJECT[e.kind].format(n=e.name))
        text = rng.choice(QUESTIONS[second]).format(x=phrase)
        return WorldQuestion(qid, text, fact(world, mid, second)[0], kind, f"{first}>{second}", split,
                             (_hop(e), _hop(mid)))
    if kind == "three_hop":
        first, second, third, e = item
        _, mid = fact(world, e, first)
        assert mid is not None
        _, last = fact(world, mid, second)
        assert last is not None
        inner = rng.choice(BRIDGES[first][0]).format(x=SUBJECT[e.kind].format(n=e.name))
        outer = rng.choice(BRIDGES[second][0]).format(x=inner)
        text = rng.choice(QUESTIONS[third]).format(x=outer)
        return WorldQuestion(qid, text, fact(world, last, third)[0], kind, f"{first}>{second}>{third}", split,
                             (_hop(e), _hop(mid), _hop(last)))
    etype, direction, a, b = item
    if rng.random() < 0.5:
        a, b = b, a
    text = rng.choice(COMPARE[(etype, direction)]).format(a=a.name, b=b.name)
    winner = min((a, b), key=lambda x: x.year) if direction == "earlier" else max((a, b), key=lambda x: x.year)
    return WorldQuestion(qid, text, winner.name, kind, f"compare.{etype}.{direction}", split, (_hop(a), _hop(b)))


def world_questions(cfg: WorldConfig, split: str) -> list[WorldQuestion]:
    """The questions of ``world:<split>`` (``train_questions`` / ``eval_questions`` of them), cached.

    ``<split>-<kind>`` (``train-bridge``, ``eval-comparison``, ...) keeps one kind of the split's questions, same ids
    and order: a harder RL set from the same world and SFT start (the pre-registered setting).
    ``<split>-three_hop`` is a set of its own (``NAMED_KINDS``): up to ``train_questions`` / ``eval_questions``
    three-hop questions of the split's entities, ids ``world-<split>-3h-NNNN``."""
    base, dash, kind = split.partition("-")
    if base not in SPLITS or (dash and kind not in (*KINDS, *NAMED_KINDS)):
        known = ", ".join(f"world:{s}" for s in SPLITS) + ", " + ", ".join(
            f"world:{s}-{k}" for s in SPLITS for k in (*KINDS, *NAMED_KINDS))
        raise WorldError(f"unknown world split {split!r} (known: {known})")
    if kind in NAMED_KINDS:
        return list(_named_kind_questions(cfg.model_dump_json(), base, kind))
    qs = _world_questions(cfg.model_dump_json(), base)
    return [q for q in qs if q.kind == kind] if kind else list(qs)


@functools.lru_cache(maxsize=16)
def _world_questions(cfg_json: str, split: str) -> tuple[WorldQuestion, ...]:
    cfg = WorldConfig.model_validate_json(cfg_json)
    world = build_world(cfg)
    n = cfg.train_questions if split == "train" else cfg.eval_questions
    rng = random.Random(derive_seed(cfg.seed, "world-questions", WORLD_VERSION, split))
    picked: list[tuple[str, tuple]] = []
    for kind, want in kind_counts(n, cfg).items():
        drawn = _draw(world, split, kind, want, rng)
        if len(drawn) < want:
            key = "world.train_questions" if split == "train" else "world.eval_questions"
            raise WorldError(f"{key}={n}: {want} {kind} questions asked of the {split} split, which has only "
                             f"{len(drawn)} distinct ones (add entities or lower world.share_{kind})")
        picked += [(kind, item) for item in drawn]
    rng.shuffle(picked)
    return tuple(_make_question(world, kind, item, rng, f"world-{split}-{i:04d}", split)
                 for i, (kind, item) in enumerate(picked))


@functools.lru_cache(maxsize=16)
def _named_kind_questions(cfg_json: str, split: str, kind: str) -> tuple[WorldQuestion, ...]:
    """Up to the split's question count of ``kind``, round-robin over its relation chains, from a seed of its own."""
    cfg = WorldConfig.model_validate_json(cfg_json)
    world = build_world(cfg)
    n = cfg.train_questions if split == "train" else cfg.eval_questions
    rng = random.Random(derive_seed(cfg.seed, "world-questions", WORLD_VERSION, split, kind))
    picked = _draw(world, split, kind, n, rng)
    rng.shuffle(picked)
    tag = {"three_hop": "3h"}[kind]
    return tuple(_make_question(world, kind, item, rng, f"world-{split}-{tag}-{i:04d}", split)
                 for i, item in enumerate(picked))


def load_world_questions(split: str, cfg: WorldConfig | None = None) -> list[Any]:
    """``world:<split>`` as ``tasks.env.datasets.Question`` rows (gold passage ids in ``support``)."""
    return [q.to_question() for q in world_questions(cfg or WorldConfig(), split)]
