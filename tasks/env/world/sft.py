"""SFT data from the world: gold trajectories rendered with the real search backend, a configurable
share with one process flaw each (``sft.data: world:train``)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from arbor.config.world import WorldConfig
from arbor.format import ARBOR, TagProtocol, get_protocol
from arbor.seeding import derive_seed
from arbor.tasks.env.world.entities import WORLD_CORPUS, Entity, World, WorldError, build_world, fact_sentence
from arbor.tasks.env.world.questions import WorldQuestion, world_questions
from arbor.tasks.env.world.templates import (
    _COMPARE_FINAL,
    _COMPARE_NEXT,
    _FINAL,
    _GENERIC,
    _NEXT,
    _OPEN,
    NEEDS,
    TYPE_WORD,
    YEAR_NEED,
)

FLAW_NONE = "none"


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
    for i in range(1, len(ents)):  # a bridge's middle entity; both of a three-hop question's
        prev, mid = ents[i - 1], ents[i]
        fact_i = fact_sentence(rels[i - 1], prev.name, mid.name)
        steps.append((rng.choice(_NEXT).format(fact=fact_i, need=NEEDS[rels[i]].format(n=mid.name), n=mid.name),
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
                             "searches (comparison / bridge with a flaw: 3; three-hop: 3, with a flaw 4)")
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
