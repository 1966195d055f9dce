"""The typed config: paper defaults, profiles, and overrides refused by name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from arbor.config import ArborConfig, ConfigError, load_config
from arbor.config.judge import JudgeRoles
from arbor.paths import CONFIGS_DIR
from arbor.seeding import coin, derive_seed


def test_table4_defaults() -> None:
    m = ArborConfig().memory
    assert (m.lambda_, m.k_consol, m.delta_v, m.rho_min, m.kappa, m.alpha) == (0.1, 8, 0.05, 0.0, 5, 0.25)
    assert (m.pool_max, m.n_active, m.dedup_threshold, m.maturity) == (6, 2, 0.9, 3)


def test_overrides_typed_and_nested() -> None:
    cfg = load_config("tiny-cpu", ["memory.lambda_=0.2", "judge.backend=openai", "search.top_k=5"])
    assert cfg.memory.lambda_ == 0.2 and cfg.judge.backend == "openai" and cfg.search.top_k == 5
    assert cfg.run.profile == "tiny-cpu"


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("memory.lamda=1", "memory.lamda"),
        ("nosuch.x=1", "nosuch"),
        ("memory.kappa=abc", "memory.kappa"),
        ("judge.backend=foo", "judge.backend"),
        ("memory.delta_v=-1", "memory.delta_v"),
        ("rollout.k", "rollout.k"),
    ],
)
def test_bad_override_named(override: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config("tiny-cpu", [override])


def test_unknown_key_in_profile_file_named(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("memory:\n  kapa: 3\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*memory\.kapa"):
        load_config(str(p))


def test_unknown_profile_lists_known() -> None:
    with pytest.raises(ConfigError, match="tiny-cpu"):
        load_config("no-such-profile")


def test_seeds_stable_and_distinct() -> None:
    assert derive_seed(0, 1, 2, "rollout") == derive_seed(0, 1, 2, "rollout")
    assert derive_seed(0, 1, 2, "rollout") != derive_seed(0, 1, 3, "rollout")
    flips = [coin(7, 0, g, "c0.0", e) for g in range(20) for e in range(11)]
    assert 0.35 < sum(flips) / len(flips) < 0.65  # a fair coin over 220 draws


# ---- ranges, cross-key checks, resume rules, file paths, dead keys ---------------------------------

@pytest.mark.parametrize(
    "override",
    ["rollout.k=1", "train.lr=0", "train.lr=-1e-6", "sft.lr=0", "train.eps_clip_low=0", "train.eps_clip_high=1",
     "train.dapo_eps_clip_high=1.2", "train.warmup_ratio=1", "sft.warmup_ratio=-0.1", "train.tis_cap=0.5",
     "rollout.top_p=0", "rollout.top_p=1.5", "train.betas=[0.9, 1.0]", "judge.max_tokens=0", "search.timeout_s=0",
     "train.kl_coef=-0.1", "sft.zero_stage=4", "judge.price_in_per_mtok=-1"],
)
def test_values_out_of_their_domain_are_refused_by_name(override: str) -> None:
    key = override.split("=", 1)[0]
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config("tiny-cpu", [override])


def test_domain_boundaries_that_are_valid_load() -> None:
    cfg = load_config("tiny-cpu", ["rollout.k=2", "train.warmup_ratio=0", "train.tis_cap=1", "rollout.top_p=1",
                                   "train.eps_clip_high=0.99", "train.grad_clip=0"])
    assert (cfg.rollout.k, cfg.train.warmup_ratio, cfg.train.tis_cap, cfg.train.grad_clip) == (2, 0.0, 1.0, 0.0)


def test_top_p_with_tis_is_refused_naming_both_keys() -> None:
    with pytest.raises(ConfigError) as err:
        load_config("tiny-cpu", ["rollout.top_p=0.9"])
    assert "rollout.top_p" in str(err.value) and "train.tis_cap" in str(err.value)
    assert load_config("tiny-cpu", ["rollout.top_p=0.9", "train.tis_cap=null"]).rollout.top_p == 0.9


@pytest.mark.parametrize("profile", sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml")))
def test_rl_profiles_sample_untruncated_with_tis(profile: str) -> None:
    cfg = load_config(profile)
    assert cfg.rollout.top_p == 1.0 and cfg.train.tis_cap is not None


def test_deviations_must_name_config_keys(tmp_path: Path) -> None:
    p = tmp_path / "dev.yaml"
    p.write_text("deviations:\n  rollout.kk: 'typo'\n  run.steps: 'fine'\n")
    with pytest.raises(ConfigError, match=r"deviations: rollout\.kk"):
        load_config(str(p))


def _stored(**sets: object) -> ArborConfig:
    cfg = load_config("tiny-cpu", dict(sets))
    cfg.run.run_id = "r1"
    return cfg


def test_resume_applies_safe_keys_and_reports_changes() -> None:
    from arbor.config.resume import amend_config

    cfg, changes = amend_config(_stored(), ["run.steps=9", "judge.base_url=http://127.0.0.1:9/v1",
                                            "judge.cost_cap_usd=2.5", "rollout.k=8"])  # k unchanged: not a change
    assert (cfg.run.steps, cfg.judge.base_url, cfg.judge.cost_cap_usd) == (9, "http://127.0.0.1:9/v1", 2.5)
    assert changes == {"run.steps": (5, 9), "judge.base_url": (None, "http://127.0.0.1:9/v1"),
                       "judge.cost_cap_usd": (None, 2.5)}
    assert cfg.run.run_id == "r1"


@pytest.mark.parametrize("override", ["rollout.k=4", "memory.lambda_=0.3", "judge.model=other", "run.seed=1",
                                      "train.lr=2e-5"])
def test_resume_refuses_other_changes_by_name(override: str) -> None:
    from arbor.config.resume import amend_config

    with pytest.raises(ConfigError, match=re.escape(override.split("=")[0]) + ".*resuming run 'r1'"):
        amend_config(_stored(), [override])


def test_resume_refuses_new_length_when_the_lr_schedule_depends_on_it() -> None:
    from arbor.config.resume import SAFE_ON_RESUME, amend_config

    with pytest.raises(ConfigError, match=r"run\.steps.*train\.lr_schedule=cosine"):
        amend_config(_stored(**{"train.lr_schedule": "cosine"}), ["run.steps=10"])
    assert "checkpoint.every" in SAFE_ON_RESUME and "rollout.k" not in SAFE_ON_RESUME


def test_set_paths_resolve_from_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from arbor.config.inputs import resolve_override_paths

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.json").write_text("{}")
    (tmp_path / "qs.jsonl").write_text("")
    (tmp_path / "ckpt").mkdir()
    out = resolve_override_paths({"train.deepspeed_config": "ds.json", "data.train": "qs.jsonl",
                                  "data.eval": "offline:eval", "run.start_checkpoint": "ckpt",
                                  "sft.output": "sft/mine", "policy.model": "Qwen/Qwen3-8B", "rollout.k": "4"})
    assert load_config("tiny-cpu", out).train.deepspeed_config == str(tmp_path / "ds.json")
    assert yaml.safe_load(out["data.train"]) == str(tmp_path / "qs.jsonl")
    assert yaml.safe_load(out["run.start_checkpoint"]) == str(tmp_path / "ckpt")
    # named sets, hub ids and ARBOR_HOME-relative outputs are kept as given
    assert (out["data.eval"], out["policy.model"], out["sft.output"], out["rollout.k"]) == (
        "offline:eval", "Qwen/Qwen3-8B", "sft/mine", "4")
    with pytest.raises(ConfigError, match=r"train\.deepspeed_config: no such file " + re.escape(str(tmp_path))):
        resolve_override_paths({"train.deepspeed_config": "configs/deepspeed/qwen3-8b.json"})  # not the root
    with pytest.raises(ConfigError, match=r"memory\.init_from: no such file"):
        resolve_override_paths({"memory.init_from": "pool.json"})


# Keys read only through a mechanism a grep cannot see, with the reason. Anything else unused is a dead key.
ALLOWED_UNUSED = {
    "deviations": "documentation of departures from the paper: checked against the config keys (arbor/config) and "
                  "stored with each run's config (runs.config_json)",
}
SOURCE_DIRS = ("arbor", "flows", "tasks", "storage", "llm", "bench")


def _fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, type[BaseModel]]]:
    out = []
    for name, f in model.model_fields.items():
        out.append((prefix + name, name, model))
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
            out += _fields(f.annotation, f"{prefix}{name}.")
    return out


def test_no_dead_config_keys() -> None:
    """Every config field is read somewhere in the code: as an attribute (``.dapo_oversample``) or by name from
    ``JudgeConfig.for_role`` (``rc["max_tokens"]``); judge roles are selected by their name (``"pairwise"``).
    The definitions and validators in arbor/config do not count. A name shared by two sections (``train.lr`` /
    ``sft.lr``) passes when either is read: those were reviewed by hand."""
    root = Path(__file__).resolve().parent.parent
    src = "\n".join(p.read_text() for d in SOURCE_DIRS for p in (root / d).rglob("*.py")
                    if (root / "arbor" / "config") not in p.parents)
    dead = []
    for dotted, name, owner in _fields(ArborConfig):
        n = re.escape(name)
        used = re.search(rf"\.{n}\b", src) or re.search(rf"\[[\"']{n}[\"']\]", src)
        if owner is JudgeRoles:
            used = used or re.search(rf"[\"']{n}[\"']", src)
        if not used and dotted not in ALLOWED_UNUSED:
            dead.append(dotted)
    assert not dead, f"config keys nothing reads (wire them or remove them): {', '.join(dead)}"
