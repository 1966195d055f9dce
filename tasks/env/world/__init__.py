"""A synthetic multi-hop world a tiny policy can learn search on (SFT data of item 2).

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

The package follows those parts: the text templates (``templates.py``), the entities, passages and corpus
(``entities.py``), the questions (``questions.py``) and the SFT data (``sft.py``); this module is the source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arbor.config import ArborConfig
from arbor.tasks.env.sources import Source
from arbor.tasks.env.world.entities import WORLD_CORPUS, WORLD_VERSION, WorldError, world_corpus_path
from arbor.tasks.env.world.questions import load_world_questions
from arbor.tasks.env.world.sft import build_world_sft_data


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
