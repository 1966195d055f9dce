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
