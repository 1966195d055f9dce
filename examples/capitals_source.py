"""A user's own data source (docs/plugins.md): questions and the corpus that answers them, under one prefix.

Declared in the user's package's pyproject.toml, it serves ``capitals:train`` / ``capitals:eval`` and
``capitals:corpus`` as the synthetic world serves ``world:*``:

    [project.entry-points."arbor.sources"]
    capitals = "examples.capitals_source:SOURCE"

    arbor train data.train=capitals:train data.eval=capitals:eval search.corpus=capitals:corpus
"""

from __future__ import annotations

import json
from pathlib import Path

from arbor.config import ArborConfig
from arbor.tasks.env.datasets import DatasetError, Question
from arbor.tasks.env.sources import Source

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima", "Norway": "Oslo",
            "Egypt": "Cairo"}
EVAL = ("Peru", "Egypt")  # held out


def questions(name: str, cfg: ArborConfig) -> list[Question]:
    if name not in ("train", "eval"):
        raise DatasetError(f"unknown split 'capitals:{name}' (known: capitals:train, capitals:eval)")
    return [Question(f"capitals-{c.lower()}", f"What is the capital of {c}?", [city], "capitals")
            for c, city in CAPITALS.items() if (c in EVAL) == (name == "eval")]


def corpus(name: str, cfg: ArborConfig, home: Path) -> Path:
    if name != "corpus":
        raise ValueError(f"search.corpus: unknown corpus 'capitals:{name}' (known: capitals:corpus)")
    path = Path(home) / "capitals" / "corpus.jsonl"  # the same rows every time: write once
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"id": c.lower(), "title": c, "text": f"The capital of {c} is {city}."})
                                + "\n" for c, city in CAPITALS.items()))
    return path


SOURCE = Source(questions=questions, corpus=corpus)
