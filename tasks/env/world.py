"""A synthetic multi-hop world a tiny policy can learn search on (issue 12 item 1; SFT data of item 2).

The world is generated from ``WorldConfig`` alone (seeded, no downloads, byte-identical for the same config):

- entities of four types with facts: a **person** (birthplace, birth year, role), a **city** (country, founding
  year), a **film** (director, producing company, release year), a **company** (founder, home city, founding year);
  countries are plain attribute values. Names are built from two short syllables (``ONSETS`` x ``CODAS``), each
  word two tokens of the tiny policy's tokenizer; a person has two such words, a company one and a suffix. Every
  name word is used once in the whole world, so a query that names an entity finds its passage.
- one passage per entity, titled by its name, stating its facts in one of two sentence templates, each value right
  after a word that occurs once in the passage (< 200 chars, so ``search.max_result_chars: 200`` never cuts a fact
  off); a thought restates a fact with that same word ("Tobara was directed by Kerar Silix.");
- questions of three kinds, each with its gold answer (verbatim in a gold passage) and gold search path:
  1-hop ("Who directed the film F?"), 2-hop bridge ("Where was the director of the film F born?") and comparison
  ("Which of A and B was founded earlier?").
- an entity split: each type's entities are divided into train and eval; relations never cross the split, so a
  ``world:eval`` question only involves entities (both hops) that no ``world:train`` question or SFT row mentions.

It is a data source (``tasks.env.sources``), ``SOURCE``, declared under the prefix ``world`` in pyproject.toml's
``arbor.sources`` entry points and found by the loaders like any user's source: ``data.train`` / ``data.eval``
``world:train`` | ``world:eval`` (``load_questions(spec, config=cfg)``), ``search.corpus: world:corpus``
(``world_corpus_path``: a JSONL corpus written once into ``{home}/world/``, content-addressed by the world's config)
and ``sft.data: world:train`` (``build_world_sft_data``: gold trajectories rendered with the real search backend, a
configurable share with one process flaw each). Its key (the ``world`` section and ``WORLD_VERSION``) joins the SFT
checkpoint's key whenever a spec names the world.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

from arbor.config import ArborConfig
from arbor.config.world import WorldConfig
from arbor.format import ARBOR, TagProtocol, get_protocol
from arbor.seeding import derive_seed
from arbor.tasks.env.sources import Source

WORLD_VERSION = 3  # part of every world key and world SFT key: bump it when the generator's output changes
WORLD_CORPUS = "world:corpus"  # search.corpus value: the world's passages
SPLITS = ("train", "eval")
KINDS = ("one_hop", "bridge", "comparison")
ENTITY_TYPES = ("person", "city", "film", "company")

# Name syllables. Every onset is a single word-start token ("ĠTob") of the tiny tokenizer and every coda a single
# continuation token, so "Tobara" is two tokens after a space; measured on the tiny-cpu tokenizer (decisions.md).
ONSETS = (
    "Bal", "Bav", "Bel", "Ber", "Bol", "Bos", "Bul", "Cal", "Cas", "Cav", "Cem", "Cob", "Col", "Cos", "Dal", "Dam",
    "Dav", "Del", "Der", "Des", "Dev", "Dil", "Dod", "Fal", "Fel", "Fer", "Gab", "Gal", "Gam", "Ger", "Gib", "Gil",
    "Hal", "Hav", "Hel", "Hol", "Hus", "Kam", "Kar", "Ker", "Kon", "Lan", "Lev", "Lim", "Lud", "Mal", "Mel", "Mer",
    "Mil", "Mor", "Mos", "Muk", "Mul", "Mun", "Nam", "Nav", "Nik", "Nin", "Nob", "Nov", "Pak", "Pal", "Pav", "Ped",
    "Pel", "Pol", "Rab", "Ram", "Rav", "Rel", "Ren", "Rom", "Rud", "Sab", "Sak", "Sal", "Sav", "Sel", "Ser", "Sil",
    "Sol", "Som", "Sul", "Tal", "Tam", "Tel", "Tem", "Ter", "Tob", "Tod", "Tun", "Val", "Vel", "Ven", "Ver", "Vik",
    "Vis", "Viv", "Vol",
)
CODAS = ("a", "an", "in", "on", "ia", "is", "us", "ar", "ix", "ina", "ith", "ak", "ik", "um", "o", "ara", "ira",
         "ory", "ado", "ura")
COMPANY_SUFFIXES = ("Group", "Studios", "Press", "Records", "Pictures", "Films", "Media")
ROLES = ("painter", "poet", "architect", "engineer", "historian", "singer", "writer", "actor", "teacher")
DIRECTOR_ROLE = "director"  # not "film director": "film" is the type word of film queries

# ------------------------------------------------------------------------------------------------ text templates

# A passage states every fact once, the value right after a word that occurs once in the passage ("directed by",
# "for", "released in"); a thought restates a fact with the same word before the value ("Tobara was directed by
# Kerar Silix."). Reading a fact is then copying what follows a word the policy has just written, which a two-layer
# model learns in minutes; with "The director of X is V." and four "is" per passage it did not (decisions.md).
PASSAGES = {
    "person": ("{name} is {a_role} from {city}, born in {year}.", "Born in {year}, {name} is {a_role} from {city}."),
    "city": ("{name} is a city within {country}, founded in {year}.",
             "Founded in {year}, {name} is a city within {country}."),
    "film": ("{name} is a film directed by {director} for {company}, released in {year}.",
             "Released in {year}, {name} is a film directed by {director} for {company}."),
    "company": ("{name} is a company at {city}, founded by {founder} in {year}.",
                "Founded by {founder} in {year}, {name} is a company at {city}."),
}
FACT_SENTENCES = {
    "person.born_in": "{n} is from {v}.", "person.year": "{n} was born in {v}.",
    "city.country": "{n} is within {v}.", "city.year": "{n} was founded in {v}.",
    "film.director": "{n} was directed by {v}.", "film.producer": "{n} was made for {v}.",
    "film.year": "{n} was released in {v}.", "company.founder": "{n} was founded by {v}.",
    "company.based_in": "{n} is at {v}.", "company.year": "{n} was founded in {v}.",
}
# How a question names its subject entity.
SUBJECT = {"person": "{n}", "city": "{n}", "film": "the film {n}", "company": "{n}"}
# Relations: (subject type, object type or "year" / "country"). Each has question templates ({x}: the subject as a
# noun phrase) and a "need" phrase used in thoughts ("the director of Tobara").
RELATIONS: dict[str, tuple[str, str]] = {
    "film.director": ("film", "person"), "film.producer": ("film", "company"), "film.year": ("film", "year"),
    "person.born_in": ("person", "city"), "person.year": ("person", "year"),
    "company.founder": ("company", "person"), "company.based_in": ("company", "city"),
    "company.year": ("company", "year"), "city.country": ("city", "country"), "city.year": ("city", "year"),
}
QUESTIONS = {
    "film.director": ("Who directed {x}?", "Who was the director of {x}?"),
    "film.producer": ("Which company produced {x}?", "What company made {x}?"),
    "film.year": ("In which year was {x} released?", "When did {x} come out?"),
    "person.born_in": ("Where was {x} born?", "In which city was {x} born?"),
    "person.year": ("In which year was {x} born?", "When was {x} born?"),
    "company.founder": ("Who founded {x}?", "Who was the founder of {x}?"),
    "company.based_in": ("In which city is {x} based?", "Where is {x} based?"),
    "company.year": ("When was {x} founded?", "In which year was {x} founded?"),
    "city.country": ("In which country is {x}?", "Which country is {x} in?"),
    "city.year": ("When was {x} founded?", "In which year was {x} founded?"),
}
NEEDS = {
    "film.director": "the director of {n}", "film.producer": "the company behind {n}",
    "film.year": "the release year of {n}", "person.born_in": "the birthplace of {n}",
    "person.year": "the birth year of {n}", "company.founder": "the founder of {n}",
    "company.based_in": "the home city of {n}", "company.year": "the founding year of {n}",
    "city.country": "the country of {n}", "city.year": "the founding year of {n}",
}
# First hop of a bridge question, as a noun phrase ({x}: the subject), and the second hops it can take.
BRIDGES = {
    "film.director": (("the director of {x}",), ("person.born_in", "person.year")),
    "film.producer": (("the company that produced {x}", "the producer of {x}"),
                      ("company.founder", "company.based_in", "company.year")),
    "company.founder": (("the founder of {x}",), ("person.born_in", "person.year")),
    "company.based_in": (("the home city of {x}",), ("city.country", "city.year")),
    "person.born_in": (("the birthplace of {x}",), ("city.country", "city.year")),
}
COMPARE = {
    ("film", "earlier"): ("Which film came out earlier, {a} or {b}?", "Which of the films {a} and {b} was released "
                          "first?"),
    ("film", "later"): ("Which film is more recent, {a} or {b}?", "Which of the films {a} and {b} came out later?"),
    ("person", "earlier"): ("Who was born earlier, {a} or {b}?", "Which of {a} and {b} was born first?"),
    ("person", "later"): ("Who was born later, {a} or {b}?", "Which of {a} and {b} is younger?"),
    ("company", "earlier"): ("Which of {a} and {b} was founded earlier?", "Which company is older, {a} or {b}?"),
    ("company", "later"): ("Which of {a} and {b} was founded later?", "Which company is younger, {a} or {b}?"),
    ("city", "earlier"): ("Which city was founded earlier, {a} or {b}?", "Which is the older city, {a} or {b}?"),
    ("city", "later"): ("Which city was founded later, {a} or {b}?", "Which is the younger city, {a} or {b}?"),
}
YEAR_NEED = {"person": "person.year", "city": "city.year", "film": "film.year", "company": "company.year"}
TYPE_WORD = {"person": "born", "city": "city", "film": "film", "company": "company"}

# SFT thoughts (short on purpose, as in tasks/env/sft_data.py).
_OPEN = ("I need {need}. Search {n}.", "First find {need}.", "Look up {n}.")
_NEXT = ("{fact} Now I need {need}.", "{fact} Next, search {n}.")
_COMPARE_NEXT = ("{fact} Now {n}.", "{fact} Next, search {n}.")
_FINAL = ("{fact}", "{fact} So the answer is {a}.")
_COMPARE_FINAL = ("{fact} {ya} is {dir} than {yb}, so the answer is {a}.", "{fact} {a} is {dir}.")
_GENERIC = {
    "film.director": "film director", "film.producer": "film production company", "film.year": "film release year",
    "person.born_in": "birthplace", "person.year": "birth year", "company.founder": "company founder",
    "company.based_in": "company headquarters", "company.year": "company founding year",
    "city.country": "city country", "city.year": "city founding year",
}
FLAW_NONE = "none"


class WorldError(ValueError):
    """A world config that cannot be generated (names the config keys) or a bad world request."""


# ------------------------------------------------------------------------------------------------ the world


@dataclass(frozen=True)
class Entity:
    """One entity: ``facts`` maps a relation (``film.director``) to another entity's id or a value (country)."""

    eid: str
    kind: str
    name: str
    split: str
    year: int
    facts: dict[str, str] = field(default_factory=dict)
    role: str = ""


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


@dataclass(frozen=True)
class World:
    entities: dict[str, Entity]
    passages: dict[str, str]  # entity id -> passage text
    countries: tuple[str, ...]

    def of(self, kind: str, split: str) -> list[Entity]:
        return [e for e in self.entities.values() if e.kind == kind and e.split == split]


def _template_words() -> set[str]:
    """Every lower-cased word of our templates: a name must not be one of them."""
    texts: list[str] = [*ROLES, DIRECTOR_ROLE, *COMPANY_SUFFIXES, *_GENERIC.values(), *TYPE_WORD.values()]
    texts += list(FACT_SENTENCES.values())
    for group in (PASSAGES, QUESTIONS, COMPARE):
        texts += [t for ts in group.values() for t in ts]
    texts += [*NEEDS.values(), *SUBJECT.values(), *(p for ps, _ in BRIDGES.values() for p in ps)]
    texts += [*_OPEN, *_NEXT, *_COMPARE_NEXT, *_FINAL, *_COMPARE_FINAL]
    return {w.lower() for t in texts for w in re.findall(r"[A-Za-z]+", t)}


def name_pool() -> list[str]:
    """All name words (onset + coda) that are not template words, in a fixed order."""
    banned = _template_words()
    return [w for w in dict.fromkeys(o + c for o in ONSETS for c in CODAS) if w.lower() not in banned]


def split_sizes(n: int, eval_share: float) -> tuple[int, int]:
    """(train, eval) entity counts of a type: eval = round(share * n)."""
    n_eval = round(eval_share * n)
    return n - n_eval, n_eval


def _check_capacity(cfg: WorldConfig) -> None:
    counts = {"people": cfg.people, "cities": cfg.cities, "films": cfg.films, "companies": cfg.companies}
    for key, n in counts.items():
        n_train, n_eval = split_sizes(n, cfg.eval_share)
        if min(n_train, n_eval) < 2:
            raise WorldError(f"world.{key}={n} with world.eval_share={cfg.eval_share}: each split needs at least 2 "
                             f"(got {n_train} train, {n_eval} eval)")
    need = 2 * cfg.people + cfg.cities + cfg.films + cfg.companies + cfg.countries
    have = len(name_pool())
    if need > have:
        raise WorldError(f"world.people (x2), world.cities, world.films, world.companies and world.countries need "
                         f"{need} distinct name words; the syllable pool has {have}")


def world_key(cfg: WorldConfig) -> str:
    """Content key of the entities and passages (what the corpus depends on)."""
    parts = [WORLD_VERSION, cfg.seed, cfg.people, cfg.cities, cfg.films, cfg.companies, cfg.countries, cfg.eval_share]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def build_world(cfg: WorldConfig) -> World:
    """The entities and passages of ``cfg`` (cached: pure function of the config)."""
    return _build_world(cfg.model_dump_json())


@functools.lru_cache(maxsize=8)
def _build_world(cfg_json: str) -> World:
    cfg = WorldConfig.model_validate_json(cfg_json)
    _check_capacity(cfg)
    rng = random.Random(derive_seed(cfg.seed, "world", WORLD_VERSION))
    words = name_pool()
    rng.shuffle(words)
    take = iter(words)
    countries = tuple(next(take) for _ in range(cfg.countries))
    ents: dict[str, Entity] = {}
    counter = {k: 0 for k in ENTITY_TYPES}

    def add(kind: str, name: str, split: str, year: int, facts: dict[str, str], role: str = "") -> Entity:
        eid = f"{kind}-{counter[kind]:04d}"
        counter[kind] += 1
        ents[eid] = Entity(eid, kind, name, split, year, facts, role)
        return ents[eid]

    sizes = {k: dict(zip(SPLITS, split_sizes(n, cfg.eval_share), strict=True)) for k, n in
             (("person", cfg.people), ("city", cfg.cities), ("film", cfg.films), ("company", cfg.companies))}
    for split in SPLITS:  # relations never cross the split
        cities = [add("city", next(take), split, rng.randint(700, 1890), {"city.country": rng.choice(countries)})
                  for _ in range(sizes["city"][split])]
        people = [add("person", f"{next(take)} {next(take)}", split, rng.randint(1880, 1960),
                      {"person.born_in": rng.choice(cities).eid}) for _ in range(sizes["person"][split])]
        companies = []
        for _ in range(sizes["company"][split]):
            founder = rng.choice(people)
            companies.append(add("company", f"{next(take)} {rng.choice(COMPANY_SUFFIXES)}", split,
                                 founder.year + rng.randint(22, 45),
                                 {"company.founder": founder.eid, "company.based_in": rng.choice(cities).eid}))
        directors: set[str] = set()
        for _ in range(sizes["film"][split]):
            director, company = rng.choice(people), rng.choice(companies)
            year = max(director.year + rng.randint(22, 50), company.year + rng.randint(1, 15))
            add("film", next(take), split, year, {"film.director": director.eid, "film.producer": company.eid})
            directors.add(director.eid)
        for p in people:
            role = DIRECTOR_ROLE if p.eid in directors else rng.choice(ROLES)
            ents[p.eid] = Entity(p.eid, p.kind, p.name, p.split, p.year, p.facts, role)
    passages = {eid: _passage(e, ents, rng) for eid, e in ents.items()}
    return World(ents, passages, countries)


def _passage(e: Entity, ents: dict[str, Entity], rng: random.Random) -> str:
    def name(rel: str) -> str:
        return ents[e.facts[rel]].name

    if e.kind == "person":
        values = {"city": name("person.born_in"), "a_role": ("an " if e.role[0] in "aeiou" else "a ") + e.role}
    elif e.kind == "city":
        values = {"country": e.facts["city.country"]}
    elif e.kind == "film":
        values = {"director": name("film.director"), "company": name("film.producer")}
    else:
        values = {"founder": name("company.founder"), "city": name("company.based_in")}
    return rng.choice(PASSAGES[e.kind]).format(name=e.name, year=e.year, **values)


def fact_sentence(rel: str, name: str, value: str) -> str:
    """One fact as a thought restates it, with the passage's word before the value: "Tobara was directed by V." """
    return FACT_SENTENCES[rel].format(n=name, v=value)


def fact(world: World, e: Entity, rel: str) -> tuple[str, Entity | None]:
    """(the value as written in the passage, the entity it names or None) of relation ``rel`` of ``e``."""
    if rel.endswith(".year"):
        return str(e.year), None
    target = e.facts[rel]
    if target in world.entities:
        return world.entities[target].name, world.entities[target]
    return target, None


# ------------------------------------------------------------------------------------------------ corpus


def corpus_rows(cfg: WorldConfig) -> list[dict[str, str]]:
    """The world's passages as BM25 corpus rows ``{id, title, text, type, split}``, in a fixed order."""
    world = build_world(cfg)
    return [{"id": e.eid, "title": e.name, "text": world.passages[e.eid], "type": e.kind, "split": e.split}
            for e in world.entities.values()]


def world_corpus_path(cfg: WorldConfig, home: str | Path) -> Path:
    """``{home}/world/corpus-<world key>.jsonl``, written once (atomically) when missing."""
    path = Path(home) / "world" / f"corpus-{world_key(cfg)}.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in corpus_rows(cfg)), encoding="utf-8")
        os.replace(tmp, path)
    return path


# ------------------------------------------------------------------------------------------------ questions


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
    else:
        for etype, direction in COMPARE:
            pairs = [(a, b) for a, b in combinations(world.of(etype, split), 2) if a.year != b.year]
            out[f"compare.{etype}.{direction}"] = [(etype, direction, a, b) for a, b in pairs]
    return out


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
    etype, direction, a, b = item
    if rng.random() < 0.5:
        a, b = b, a
    text = rng.choice(COMPARE[(etype, direction)]).format(a=a.name, b=b.name)
    winner = min((a, b), key=lambda x: x.year) if direction == "earlier" else max((a, b), key=lambda x: x.year)
    return WorldQuestion(qid, text, winner.name, kind, f"compare.{etype}.{direction}", split, (_hop(a), _hop(b)))


def world_questions(cfg: WorldConfig, split: str) -> list[WorldQuestion]:
    """The questions of ``world:<split>`` (``train_questions`` / ``eval_questions`` of them), cached.

    ``<split>-<kind>`` (``train-bridge``, ``eval-comparison``, ...) keeps one kind of the split's questions, same ids
    and order: a harder RL set from the same world and SFT start (issue 63's pre-registered setting)."""
    base, dash, kind = split.partition("-")
    if base not in SPLITS or (dash and kind not in KINDS):
        known = ", ".join(f"world:{s}" for s in SPLITS) + ", " + ", ".join(f"world:{s}-{k}" for s in SPLITS for k in KINDS)
        raise WorldError(f"unknown world split {split!r} (known: {known})")
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
        groups = _candidates(world, split, kind)
        for items in groups.values():
            rng.shuffle(items)
        available = sum(len(v) for v in groups.values())
        if want > available:
            key = "world.train_questions" if split == "train" else "world.eval_questions"
            raise WorldError(f"{key}={n}: {want} {kind} questions asked of the {split} split, which has only "
                             f"{available} distinct ones (add entities or lower world.share_{kind})")
        order = sorted(groups)
        rng.shuffle(order)
        taken = 0
        while taken < want:  # round-robin over relations, so every relation gets its share
            for rel in order:
                if taken < want and groups[rel]:
                    picked.append((kind, groups[rel].pop()))
                    taken += 1
    rng.shuffle(picked)
    return tuple(_make_question(world, kind, item, rng, f"world-{split}-{i:04d}", split)
                 for i, (kind, item) in enumerate(picked))


def load_world_questions(split: str, cfg: WorldConfig | None = None) -> list[Any]:
    """``world:<split>`` as ``tasks.env.datasets.Question`` rows (gold passage ids in ``support``)."""
    return [q.to_question() for q in world_questions(cfg or WorldConfig(), split)]


# ------------------------------------------------------------------------------------------------ SFT trajectories


def _query(e: Entity, rng: random.Random, plain: bool = False) -> str:
    """A query that names the entity: its name, sometimes with its type word (never when ``plain``: a comparison's
    first query, whose type word would also match the other entity's passage and show it early)."""
    return e.name if plain or rng.random() < 0.7 else f"{e.name} {TYPE_WORD[e.kind]}"


def plan_steps(q: WorldQuestion, world: World, rng: random.Random) -> tuple[list[tuple[str, str]], str]:
    """The clean gold process: ([(thought, query), ...] one per search, final thought)."""
    ents = [world.entities[h.doc_id] for h in q.path]
    if q.kind == "comparison":
        etype = ents[0].kind
        need = NEEDS[YEAR_NEED[etype]]
        a, b = ents
        steps = [(rng.choice(_OPEN).format(need=need.format(n=a.name), n=a.name), _query(a, rng, plain=True))]
        fact_a = fact_sentence(YEAR_NEED[etype], a.name, str(a.year))
        steps.append((rng.choice(_COMPARE_NEXT).format(fact=fact_a, n=b.name), _query(b, rng)))
        direction = q.relation.rsplit(".", 1)[1]
        winner, other = (a, b) if q.answer == a.name else (b, a)
        fact_b = fact_sentence(YEAR_NEED[etype], b.name, str(b.year))
        final = rng.choice(_COMPARE_FINAL).format(fact=fact_b, ya=winner.year, yb=other.year, dir=direction,
                                                  a=winner.name)
        return steps, final
    rels = q.relation.split(">")
    first = ents[0]
    steps = [(rng.choice(_OPEN).format(need=NEEDS[rels[0]].format(n=first.name), n=first.name), _query(first, rng))]
    if q.kind == "bridge":
        mid = ents[1]
        fact1 = fact_sentence(rels[0], first.name, mid.name)
        steps.append((rng.choice(_NEXT).format(fact=fact1, need=NEEDS[rels[1]].format(n=mid.name), n=mid.name),
                      _query(mid, rng)))
    last = ents[-1]
    fact_last = fact_sentence(rels[-1], last.name, q.answer)
    return steps, rng.choice(_FINAL).format(fact=fact_last, a=q.answer)


def add_flaw(steps: list[tuple[str, str]], q: WorldQuestion, world: World, flaw: str) -> list[tuple[str, str]]:
    """``steps`` with one process flaw a rubric can see (the answer stays right):

    - ``repeated_query``: the first query is issued twice in a row;
    - ``search_after_answer``: one more search after every gold passage has been shown;
    - ``generic_query``: a first query that names no entity (then the gold path).
    """
    if flaw == "repeated_query":
        return [steps[0], ("Search that again.", steps[0][1]), *steps[1:]]
    if flaw == "search_after_answer":
        names = [h.title for h in q.path]
        if q.kind == "comparison":
            query = f"{names[0]} {names[1]}"
        elif q.answer in {e.name for e in world.entities.values()} and q.answer not in names:
            query = q.answer
        else:
            query = f"{names[-1]} {q.answer}"
        return [*steps, ("Let me double-check.", query)]
    if flaw == "generic_query":
        first = q.relation.split(">")[0]
        generic = _GENERIC.get(first) or " ".join(first.split(".")[1:])  # compare.film.earlier -> "film earlier"
        thought, query = steps[0]
        return [("Search the topic first.", generic), (f"Too broad. {thought}", query), *steps[1:]]
    raise WorldError(f"unknown flaw {flaw!r}")


def render_response(q: WorldQuestion, steps: Sequence[tuple[str, str]], final: str, search: Any, *, top_k: int,
                    max_result_chars: int | None, protocol: TagProtocol = ARBOR) -> tuple[str, bool]:
    """(the response text, whether every gold passage was shown): each query goes to the real search backend and its
    hits are rendered exactly as the agent loop renders them, in ``protocol``."""
    from arbor.format import result_block
    from arbor.tasks.env.search import format_results

    parts: list[str] = []
    shown: set[str] = set()
    for i, (thought, query) in enumerate(steps):
        hits = search.search([query], top_k)[0]
        shown.update(h.doc_id for h in hits)
        parts.append(protocol.step_block(i, thought, query))
        parts.append(result_block(format_results(hits, max_result_chars, protocol.passage_line), protocol))
    # " Name" inside the box: the answer's name in the same tokens as in the passages ("ĠSav ith"), not re-spelled
    # after the brace ("S av ith"), which a tiny policy cannot learn for unseen names (normalisation drops the space)
    answer = f" {q.answer}" if protocol.boxed else q.answer  # Search-R1 writes "<answer> X </answer>" anyway
    parts.append(protocol.final_block(final, answer))
    return "".join(parts), all(h.doc_id in shown for h in q.path)


def flaw_plan(n_rows: int, cfg: WorldConfig, seed: int) -> list[str]:
    """The flaw of each of ``n_rows`` SFT rows: round(share * n) flawed rows (seeded), kinds in equal numbers."""
    n_flawed = round(cfg.sft_flaw_share * n_rows)
    rng = random.Random(derive_seed(seed, "world-sft-flaws", n_rows))
    rows = rng.sample(range(n_rows), n_flawed)
    out = [FLAW_NONE] * n_rows
    kinds = list(cfg.sft_flaw_kinds)
    for j, i in enumerate(rows):
        out[i] = kinds[j % len(kinds)]
    return out


def synthesize_world(questions: Sequence[WorldQuestion], search: Any, cfg: WorldConfig, *, seed: int, top_k: int,
                     max_result_chars: int | None, max_searches: int, variants: int = 1,
                     protocol: TagProtocol = ARBOR) -> list[dict[str, Any]]:
    """SFT rows ``{question_id, question, golds, response, kind, flaw, grounded}`` (``variants`` differently-seeded
    responses per question); every response passes ``arbor.format.check_format``."""
    from arbor.format import check_format
    from arbor.tasks.env.sft_data import SFTDataError

    world = build_world(cfg)
    items = [(v, q) for v in range(variants) for q in questions]
    flaws = flaw_plan(len(items), cfg, seed)
    rows = []
    for (v, q), flaw in zip(items, flaws, strict=True):
        rng = random.Random(derive_seed(seed, "world-sft", q.question_id, v))
        steps, final = plan_steps(q, world, rng)
        if flaw != FLAW_NONE:
            steps = add_flaw(steps, q, world, flaw)
        if len(steps) > max_searches:
            raise WorldError(f"rollout.max_searches={max_searches}: a world SFT trajectory needs {len(steps)} "
                             "searches (comparison / bridge with a flaw: 3)")
        response, grounded = render_response(q, steps, final, search, top_k=top_k, max_result_chars=max_result_chars,
                                             protocol=protocol)
        fmt = check_format(response, truncated=False, protocol=protocol)
        if not fmt.valid:
            raise SFTDataError(f"world SFT response for {q.question_id} fails the format check: {fmt.reason}")
        rows.append({"question_id": q.question_id, "question": q.question, "golds": [q.answer], "response": response,
                     "kind": q.kind, "flaw": flaw, "grounded": grounded})
    return rows


def build_world_sft_data(cfg: Any, out_path: str | Path, *, home: str | Path, search: Any = None,
                         split: str = "train") -> Path:
    """``sft.data: world:train`` (or one kind, ``world:train-one_hop``): gold trajectories for the first
    ``sft.questions`` world training questions (``sft.variants`` each), searched with the run's backend over the
    world corpus; JSONL at ``out_path``."""
    from arbor.tasks.env.search import make_search
    from arbor.tasks.env.sft_data import SFTDataError, reflection_share, write_jsonl

    if split.partition("-")[0] != "train":  # world:train or one kind of it (world:train-one_hop)
        raise SFTDataError(f"sft.data: world:{split} — SFT data come from world:train only (world:eval is held out)")
    if cfg.search.backend != "bm25" or cfg.search.corpus != WORLD_CORPUS:
        raise SFTDataError(f"sft.data=world:train needs search.backend=bm25 and search.corpus={WORLD_CORPUS} (got "
                           f"{cfg.search.backend}, {cfg.search.corpus}): the results must come from the world")
    if search is None:
        search = make_search(cfg.search, home=home, config=cfg)
    questions = world_questions(cfg.world, split)[: cfg.sft.questions or None]
    rows = synthesize_world(questions, search, cfg.world, seed=cfg.run.seed, top_k=cfg.search.top_k,
                            max_result_chars=cfg.search.max_result_chars,
                            max_searches=max(1, cfg.rollout.max_searches), variants=cfg.sft.variants,
                            protocol=get_protocol(cfg.rollout.protocol))
    # sft.reflections, or RubricEM's default share under the staged protocol
    if share := reflection_share(cfg.sft, cfg.rollout.protocol):
        from arbor.tasks.reflection import reflection_sft_rows
        rows += reflection_sft_rows(rows, share, cfg.run.seed, cfg.rollout.protocol)
    return write_jsonl(rows, out_path)


# ------------------------------------------------------------------------------------------------ the source


def _corpus(name: str, cfg: ArborConfig, home: Path) -> Path:
    if f"world:{name}" != WORLD_CORPUS:
        raise WorldError(f"search.corpus: unknown world corpus 'world:{name}' (known: {WORLD_CORPUS})")
    return world_corpus_path(cfg.world, home)


def _sft_key(cfg: ArborConfig) -> dict[str, Any]:
    return {**cfg.world.model_dump(mode="json"), "generator": WORLD_VERSION}


SOURCE = Source(  # pyproject.toml: [project.entry-points."arbor.sources"] world = "arbor.tasks.env.world:SOURCE"
    questions=lambda name, cfg: load_world_questions(name, cfg.world),
    corpus=_corpus,
    sft_data=lambda name, cfg, out, home: build_world_sft_data(cfg, out, home=home, split=name),
    key=_sft_key,
)
