"""The world itself: entities of four types with their facts, one passage each, the train / eval
entity split, and the world's passages as a BM25 corpus; a pure, cached function of ``WorldConfig``."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from arbor.config.world import WorldConfig
from arbor.seeding import derive_seed
from arbor.tasks.env.world.templates import (
    _COMPARE_FINAL,
    _COMPARE_NEXT,
    _FINAL,
    _GENERIC,
    _NEXT,
    _OPEN,
    BRIDGES,
    COMPARE,
    FACT_SENTENCES,
    NEEDS,
    PASSAGES,
    QUESTIONS,
    SUBJECT,
    TYPE_WORD,
)

WORLD_VERSION = 3  # part of every world key and world SFT key: bump it when the generator's output changes
WORLD_CORPUS = "world:corpus"  # search.corpus value: the world's passages
SPLITS = ("train", "eval")
KINDS = ("one_hop", "bridge", "comparison")
ENTITY_TYPES = ("person", "city", "film", "company")

# Name syllables. Every onset is a single word-start token ("ĠTob") of the tiny tokenizer and every coda a single
# continuation token, so "Tobara" is two tokens after a space; measured on the tiny-cpu tokenizer (docs/decisions/the-synthetic-world.md).
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
