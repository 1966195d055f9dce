"""The resolved config with each value's source: `arbor config show`, `key=value` arguments, and
the file every run writes beside its artifacts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from arbor.cli import app
from arbor.config import ArborConfig, load_config
from arbor.config.show import config_sources, read_sources, render_config, write_run_config


@pytest.mark.parametrize("profile", ["tiny-world", "tiny-cpu", "qwen3-8b"])
def test_rendered_yaml_reads_back_to_the_same_config(profile: str) -> None:
    # a float YAML 1.1 would read as a string without its dot (1e-06), a string with newlines, a whole mapping
    overrides = {"train.lr": 1e-6, "deviations": {"train.lr": "a tiny step"}, "rollout.force_answer_message": "a\nb"}
    cfg = load_config(profile, overrides)
    text = render_config(cfg, config_sources(profile, overrides))
    assert ArborConfig.model_validate(yaml.safe_load(text)) == cfg
    assert all(line.count("  # ") >= 1 or line.endswith(":") for line in text.splitlines())


def test_each_value_is_marked_with_its_source() -> None:
    text = render_config(load_config("tiny-world", {"run.steps": 3}), config_sources("tiny-world", {"run.steps": 3}))
    lines = text.splitlines()
    assert "  steps: 3  # override" in lines  # run.steps: profile says 10, the override wins
    assert "  batch_size: 16  # profile" in lines  # rollout.batch_size from configs/tiny-world.yaml
    assert "  temperature: 0.7  # default" in lines  # rollout.temperature: the typed default
    assert "  profile: \"tiny-world\"  # profile" in lines
    # the same key name in two sections keeps its own source: sft.lr (profile) vs train.lr (profile) vs kl_coef
    assert "  kl_coef: 0.0  # default" in lines


def test_marks_survive_a_write_and_read(tmp_path: Path) -> None:
    sources = config_sources("tiny-world", {"train.lr": 1e-3})
    path = write_run_config(tmp_path / "runs" / "r" / "config.yaml", load_config("tiny-world", {"train.lr": 1e-3}),
                            sources)
    back = read_sources(path)
    assert back["train.lr"] == "override" and back["sft.lr"] == "profile" and back["train.kl_coef"] == "default"
    assert not list(path.parent.glob("*.inprogress"))
    assert read_sources(tmp_path / "none.yaml") == {}


def test_config_show_takes_key_value_arguments_beside_set() -> None:
    out = CliRunner().invoke(app, ["config", "show", "-p", "tiny-world", "train.lr=1e-3", "--set", "run.steps=3"])
    assert out.exit_code == 0, out.output
    assert "  lr: 0.001  # override" in out.output and "  steps: 3  # override" in out.output
    bad = CliRunner().invoke(app, ["config", "show", "-p", "tiny-world", "train.nope=1"])
    assert bad.exit_code == 2 and "unknown config key 'train.nope'" in bad.output
    loose = CliRunner().invoke(app, ["config", "show", "oops"])
    assert loose.exit_code == 2 and "'oops' is not of the form key=value" in loose.output


def test_train_refuses_a_bad_positional_override_before_anything_starts(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ARBOR_HOME", str(tmp_path))
    out = CliRunner().invoke(app, ["train", "-p", "tiny-world", "run.stepz=3"])
    assert out.exit_code == 2 and "unknown config key 'run.stepz'" in out.output
    assert not (tmp_path / "runs").exists()
