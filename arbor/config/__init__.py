"""One typed config for a run: sections with the paper's defaults, YAML profiles, ``--set key=value`` overrides.

Unknown keys and bad values are refused by their dotted name before anything runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from arbor.config.arco import ArcoConfig
from arbor.config.base import SECRET_ERROR, Section
from arbor.config.cluster import ClusterConfig
from arbor.config.data import DataConfig
from arbor.config.guidance import GuidanceConfig
from arbor.config.judge import JudgeConfig
from arbor.config.memory import MemoryConfig
from arbor.config.reward import RewardConfig
from arbor.config.rollout import PolicyConfig, RolloutConfig
from arbor.config.rubricem import RubricEMConfig
from arbor.config.run import EvalConfig, RunConfig
from arbor.config.search import SearchConfig
from arbor.config.tracking import TrackingConfig
from arbor.config.train import CheckpointConfig, SFTConfig, TrainConfig
from arbor.config.world import WorldConfig
from arbor.paths import CONFIGS_DIR

__all__ = [
    "ArborConfig", "ConfigError", "load_config", "apply_overrides", "DataConfig", "PolicyConfig", "RolloutConfig",
    "SearchConfig", "JudgeConfig", "MemoryConfig", "RunConfig", "EvalConfig", "TrainConfig", "CheckpointConfig",
    "SFTConfig", "ClusterConfig", "config_keys", "WorldConfig", "RewardConfig", "TrackingConfig", "RubricEMConfig", "ArcoConfig",
    "GuidanceConfig",
]


class ConfigError(ValueError):
    """An invalid config: the message names the offending key."""


class ArborConfig(Section):
    run: RunConfig = Field(default_factory=RunConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    world: WorldConfig = Field(default_factory=WorldConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    rubricem: RubricEMConfig = Field(default_factory=RubricEMConfig)
    arco: ArcoConfig = Field(default_factory=ArcoConfig)
    guidance: GuidanceConfig = Field(default_factory=GuidanceConfig)
    deviations: dict[str, str] = Field(default_factory=dict, description="departures from the paper, with reasons "
                                       "(keys must be config keys; stored with the run's config)")

    @model_validator(mode="after")
    def _cross_checks(self) -> ArborConfig:
        """Constraints between sections, each message naming every key involved."""
        if self.rollout.top_p < 1.0 and self.train.tis_cap is not None:
            raise ValueError(
                f"rollout.top_p={self.rollout.top_p} with train.tis_cap={self.train.tis_cap}: the trainer cannot "
                "reproduce a top-p-truncated sampling distribution, so the TIS weights would be wrong; "
                "set rollout.top_p=1 or train.tis_cap=null")
        m, k = self.memory, self.rollout.k
        reach = 0.25 if m.variance == "population" else 0.25 * k / (k - 1)  # scores in [0, 1], half at 0, half at 1
        if m.delta_v > reach:
            raise ValueError(
                f"memory.delta_v={m.delta_v:g} is above {reach:g}, the most a {m.variance} within-group variance of "
                f"rubric scores in [0, 1] can reach (memory.variance={m.variance}, rollout.k={k}), so no rubric would "
                "ever pass; set memory.delta_v at most that")
        unknown = sorted(k for k in self.deviations if k not in config_keys())
        if unknown:
            raise ValueError(f"deviations: {', '.join(unknown)} not a config key (a deviation names the key it "
                             "departs on)")
        return self

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)


def config_keys(model: type[BaseModel] | None = None, prefix: str = "") -> list[str]:
    """Every dotted config key (sections included), in declaration order: ``run``, ``run.steps``, ..."""
    out: list[str] = []
    for name, f in (model or ArborConfig).model_fields.items():
        out.append(prefix + name)
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
            out += config_keys(f.annotation, f"{prefix}{name}.")
    return out


def _format_errors(err: ValidationError, prefix: str = "") -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        msg = str(e["msg"]).removeprefix("Value error, ")
        if key and isinstance(e.get("input"), str | int | float | bool) and e["type"] != SECRET_ERROR:
            msg += f" (got {e['input']!r})"
        lines.append(f"{prefix}{key}: {msg}" if key else f"{prefix}{msg}")
    return "; ".join(lines)


def _parse_value(raw: str) -> Any:
    """``--set`` values are YAML scalars/lists (``0.1``, ``true``, ``[a, b]``, ``null``); anything else is a string."""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def apply_overrides(
    data: dict[str, Any], overrides: list[str] | list[tuple[str, Any]] | dict[str, Any]
) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides to a raw config dict, refusing unknown keys by name.

    Overrides are ``"key=value"`` strings (values parsed as YAML), ``(key, value)`` pairs or a dict.
    """
    if isinstance(overrides, dict):
        items = list(overrides.items())
    else:
        items = [_split(o) if isinstance(o, str) else o for o in overrides]
    for dotted, value in items:
        parts = dotted.split(".")
        node: Any = ArborConfig
        target = data
        for i, part in enumerate(parts):
            fields = getattr(node, "model_fields", None)
            if fields is None or part not in fields:
                where = ".".join(parts[: i + 1])
                known = ", ".join(sorted(fields)) if fields else "(not a section)"
                raise ConfigError(f"unknown config key '{where}' (known here: {known})")
            ann = fields[part].annotation
            if i == len(parts) - 1:
                target[part] = _parse_value(value) if isinstance(value, str) else value
            else:
                target = target.setdefault(part, {})
                node = ann
    return data


def _split(item: str) -> tuple[str, str]:
    if "=" not in item:
        raise ConfigError(f"override '{item}' is not of the form key=value")
    key, value = item.split("=", 1)
    return key.strip(), value


def profile_path(profile: str) -> Path:
    p = Path(profile)
    if p.suffix in {".yaml", ".yml"} and p.exists():
        return p
    path = CONFIGS_DIR / f"{profile}.yaml"
    if not path.exists():
        known = ", ".join(sorted(q.stem for q in CONFIGS_DIR.glob("*.yaml")))
        raise ConfigError(f"unknown profile '{profile}' (known: {known})")
    return path


def load_config(profile: str = "tiny-cpu", overrides: list[str] | dict[str, Any] | None = None) -> ArborConfig:
    """Load ``configs/<profile>.yaml``, apply overrides, validate. Errors name the key."""
    path = profile_path(profile)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a profile must be a mapping of sections")
    data.setdefault("run", {})["profile"] = path.stem
    try:
        apply_overrides({}, list(_flatten(data)))  # refuse unknown keys in the file by name, too
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
    if overrides:
        data = apply_overrides(data, overrides)
    try:
        return ArborConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e)) from e


def _flatten(d: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and k not in {"deviations", "deepspeed", "chat_template_kwargs"} and not prefix.endswith("deepspeed."):
            out.extend(_flatten(v, key + "."))
        else:
            out.append((key, v))
    return out
