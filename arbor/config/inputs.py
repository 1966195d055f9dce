"""File-valued ``--set`` overrides, resolved against the user's working directory when the CLI starts.

A path typed on the command line means what it means in the user's shell, so the CLI makes it absolute before the
run starts (and stores it so in the run's config: a resume from elsewhere, or a Prefect worker in another directory,
reads the same file). Profile files keep their documented anchors (see ``configs/qwen3-8b.yaml``):

- input files that must exist (``train.deepspeed_config``, ``memory.init_from``, ``train.hostfile``): a relative
  ``--set`` value is read from the current directory; a missing file is refused naming key and file.
- question sets / corpora (``data.train``, ``data.eval``, ``sft.data``, ``search.corpus``): a named set
  (``offline:train``, ``synth:train``, ...) is kept; a file is read from the current directory and must exist.
- local-or-id values (``run.start_checkpoint``, ``policy.model``, ``policy.tiny_path``): made absolute when the path
  exists under the current directory; otherwise kept as given, i.e. a hub id (``policy.model``) or a path under
  ``ARBOR_HOME`` (``run.start_checkpoint``, as in the profiles: ``sft/qwen3-8b``; see ``resolve_home_path``).
- ``checkpoint.dir`` (an output directory) is made absolute from the current directory.
- ``sft.output`` stays relative to ``ARBOR_HOME`` by design (the profiles' SFT output is found there).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from arbor.config import ConfigError, _parse_value

MUST_EXIST = ("train.deepspeed_config", "memory.init_from", "train.hostfile")
DATA_SPECS = ("data.train", "data.eval", "sft.data", "search.corpus")
LOCAL_OR_ID = ("run.start_checkpoint", "policy.model", "policy.tiny_path")
OUTPUT_DIRS = ("checkpoint.dir",)
_NAMED = re.compile(r"^[a-z][a-z0-9_-]*:[^/\\]")  # offline:train, synth:offline-train, bench:hotpotqa


def is_named_set(value: str) -> bool:
    """``kind:name`` (a shipped or synthesised question set), not a file path."""
    return bool(_NAMED.match(value))


def resolve_override_paths(overrides: dict[str, Any], cwd: Path | None = None) -> dict[str, Any]:
    """``overrides`` with every relative file value made absolute from ``cwd`` (default: the current directory).

    Raises ``ConfigError`` naming the key and the file when a required file does not exist."""
    cwd = (cwd or Path.cwd()).resolve()
    out = dict(overrides)
    for key, raw in overrides.items():
        value = _parse_value(raw) if isinstance(raw, str) else raw
        if key in DATA_SPECS and isinstance(value, list) and all(isinstance(v, str) and v for v in value):
            # several sets (data.eval: [bench:hotpotqa, my/dev.jsonl]): each as a single one would be
            out[key] = json.dumps([json.loads(resolve_override_paths({key: v}, cwd)[key]) if not is_named_set(v)
                                   else v for v in value])
            continue
        if not isinstance(value, str) or not value:
            continue
        path = Path(value).expanduser()
        full = path if path.is_absolute() else cwd / path
        if key in MUST_EXIST or (key in DATA_SPECS and not is_named_set(value)):
            if not full.exists():
                where = "" if path.is_absolute() else f" (relative paths in --set are read from {cwd})"
                raise ConfigError(f"{key}: no such file {full}{where}")
        elif key in LOCAL_OR_ID:
            if path.is_absolute() or not full.exists():
                continue
        elif key not in OUTPUT_DIRS:
            continue
        out[key] = json.dumps(str(full.resolve()))  # a quoted YAML scalar: the path is never re-parsed as YAML
    return out


# Input paths a run reads after it starts. A Prefect process worker runs each flow in a temporary directory, so a
# relative path given to a deployment (the profile's `sft.data: data/sft/...`, an override) cannot mean the
# worker's current directory: it is read from the current directory when it is there (the CLI's case), else from
# ARBOR_HOME (the workspace the worker is given), and otherwise refused before the run, naming the places looked.
WORKSPACE_INPUTS = ("sft.data", "memory.init_from", "train.hostfile", "data.train", "data.eval", "search.corpus",
                    "cluster.vllm_executable")
SHIPPED_INPUTS = ("data.train", "data.eval", "search.corpus")  # also found under the project root (shipped data)


def _get(cfg: Any, key: str) -> Any:
    section, _, name = key.partition(".")
    return getattr(getattr(cfg, section), name)


def is_relative_input(key: str, value: Any) -> bool:
    """A relative file path (not a named set, not a bare command name on PATH)."""
    if not isinstance(value, str) or not value or is_named_set(value) or Path(value).expanduser().is_absolute():
        return False
    return key != "cluster.vllm_executable" or "/" in value  # `vllm` alone is looked up on PATH


def input_places(key: str, cwd: Path | None = None, home: Path | None = None) -> list[Path]:
    """Where a relative ``key`` path is looked for, in order: the current directory, ARBOR_HOME, and for shipped
    question sets and corpora the project root."""
    from arbor.paths import PROJECT_ROOT, arbor_home

    places = [(cwd or Path.cwd()).resolve(), (home or arbor_home()).resolve()]
    if key in SHIPPED_INPUTS:
        places.insert(1, PROJECT_ROOT)
    return list(dict.fromkeys(places))


def find_input(key: str, value: str, cwd: Path | None = None, home: Path | None = None) -> Path | None:
    """The file a relative input ``value`` names (``input_places``), or None when it is in none of them."""
    for place in input_places(key, cwd, home):
        if (place / value).exists():
            return place / value
    return None


def missing_input_message(key: str, value: str, cwd: Path | None = None, home: Path | None = None) -> str:
    """One line: the key, the value, every place looked, and what to give instead."""
    from arbor.paths import PROJECT_ROOT

    where = " and ".join(str(p) for p in input_places(key, cwd, home))
    hint = "put it under ARBOR_HOME or give its absolute path (a Prefect worker runs each flow in a temporary directory)"
    if (PROJECT_ROOT / value).exists():  # e.g. `make vllm-env` ran in the checkout
        hint = f"give its absolute path, {PROJECT_ROOT / value} (a Prefect worker runs each flow in a temporary directory)"
    return f"{key}: no such file {value} (looked in {where}): {hint}"


def resolve_workspace_inputs(cfg: Any, cwd: Path | None = None, home: Path | None = None) -> dict[str, str]:
    """Make each relative input path of ``cfg`` that is not in the current directory but is under ARBOR_HOME
    absolute, in place (what the current directory or the project root holds is read as before); the keys changed
    and their new values. Missing files are left for preflight to refuse (``missing_input_message``)."""
    from arbor.paths import PROJECT_ROOT

    cwd = (cwd or Path.cwd()).resolve()
    changed: dict[str, str] = {}

    def resolved(key: str, value: Any) -> Any:
        if not is_relative_input(key, value) or (cwd / value).exists():
            return value
        if key in SHIPPED_INPUTS and (PROJECT_ROOT / value).exists():
            return value
        found = find_input(key, value, cwd, home)
        return value if found is None else str(found)

    for key in WORKSPACE_INPUTS:
        value = _get(cfg, key)
        # data.eval may list several sets: each is resolved as a single one would be
        new = [resolved(key, v) for v in value] if isinstance(value, list) else resolved(key, value)
        if new != value:
            section, _, name = key.partition(".")
            setattr(getattr(cfg, section), name, new)
            changed[key] = new if isinstance(new, str) else json.dumps(new)
    return changed


def workspace_inputs(cfg: Any) -> None:
    """``resolve_workspace_inputs`` for a flow about to start, each change printed (a flow logs its prints)."""
    for key, path in resolve_workspace_inputs(cfg).items():
        print(f"{key}: not in the current directory, read from ARBOR_HOME: {path}", flush=True)
