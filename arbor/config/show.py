"""The resolved config as YAML, each value marked with where it came from.

``arbor config show --profile P key=value ...`` prints it; every run writes the same text to
``ARBOR_HOME/runs/<run_id>/config.yaml`` beside its artifacts. A value's source is ``override`` (``--set`` or a
``key=value`` argument), ``profile`` (the profile's YAML file) or ``default`` (the typed config's default).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from arbor.config import ArborConfig, _flatten, profile_path


def config_sources(profile: str, overrides: Mapping[str, Any] | None = None) -> dict[str, str]:
    """{dotted key: "profile" | "override"} for every key the profile file or an override sets (a key absent here
    is a default). An override of a whole mapping (``deviations``) marks its key."""
    data = yaml.safe_load(profile_path(profile).read_text()) or {}
    out = {k: "profile" for k, _ in _flatten(data)}
    out["run.profile"] = "profile"
    out.update({k: "override" for k in overrides or {}})
    return out


def _leaves(model: BaseModel, prefix: str = "") -> list[tuple[str, Any, bool]]:
    """(dotted key, JSON value, is_section) in declaration order."""
    out: list[tuple[str, Any, bool]] = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        key = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            out.append((key, None, True))
            out += _leaves(value, key + ".")
        else:
            out.append((key, json.loads(json.dumps(value, default=_plain)), False))
    return out


def _plain(v: Any) -> Any:
    return v.model_dump(mode="json") if isinstance(v, BaseModel) else str(v)


def render_config(cfg: ArborConfig, sources: Mapping[str, str]) -> str:
    """YAML of the whole config, one ``key: value  # source`` line per value; ``yaml.safe_load`` reads it back."""
    lines: list[str] = []
    for key, value, is_section in _leaves(cfg):
        depth = key.count(".")
        name = key.rsplit(".", 1)[-1]
        if is_section:
            lines.append(f"{'  ' * depth}{name}:")
            continue
        src = next((sources[k] for k in _prefixes(key) if k in sources), "default")
        lines.append(f"{'  ' * depth}{name}: {_yaml_value(value)}  # {src}")
    return "\n".join(lines) + "\n"


def _yaml_value(value: Any) -> str:
    """One-line YAML (flow style) that ``yaml.safe_load`` reads back to ``value`` (floats keep their dot; a string
    is JSON-quoted, which YAML reads as a double-quoted scalar, so newlines stay escapes)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).removesuffix("\n...\n").strip()


def _prefixes(key: str) -> list[str]:
    """``a.b.c`` -> [a.b.c, a.b, a]: a mapping set whole marks the values inside it."""
    parts = key.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def write_run_config(path: Path, cfg: ArborConfig, sources: Mapping[str, str]) -> Path:
    """Write ``render_config`` to ``path`` atomically (a crash leaves the old file or none, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".inprogress")
    tmp.write_text(render_config(cfg, sources))
    os.replace(tmp, path)
    return path


def read_sources(path: Path) -> dict[str, str]:
    """The {dotted key: source} marks of a file ``render_config`` wrote ({} when there is none)."""
    if not path.exists():
        return {}
    out: dict[str, str] = {}
    stack: list[str] = []
    for line in path.read_text().splitlines():
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name, _, rest = line.strip().partition(":")
        del stack[depth:]
        if rest.strip() == "":
            stack.append(name)
        elif "  # " in rest:
            out[".".join([*stack, name])] = rest.rsplit("  # ", 1)[1]
    return out
