"""The ``runs`` row of a run: read it without the flow machinery (the CLI checks runs before importing Prefect), and
record config changes applied on resume (``runs.config_changes``)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from arbor.storage.parquet import _check_name, read_stage, write_stage
from arbor.storage.schemas import SchemaError


def check_run_id(run_id: str) -> str:
    """A run id becomes part of paths: refuse one that cannot (SchemaError naming the rule)."""
    return _check_name("run id", run_id)


def run_row(run_id: str, home: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """The run's ``runs`` row (profile, method, config_json, ...), or None when there is no such run."""
    rows = read_stage("runs", run_id=check_run_id(run_id), step=0, stage="run", home=home)
    return rows[0] if rows else None


def record_config_changes(run_id: str, config_json: str, changes: dict[str, tuple[Any, Any]],
                          home: str | os.PathLike[str] | None = None) -> None:
    """Store the amended config of a resumed run and append ``changes`` ({key: (old, new)}) to its history."""
    row = run_row(run_id, home)
    if row is None:
        raise SchemaError(f"no run '{run_id}' to record config changes for")
    history = json.loads(row.get("config_changes") or "[]")
    at = time.time()
    history += [{"at": at, "key": k, "old": old, "new": new} for k, (old, new) in sorted(changes.items())]
    row.update(config_json=config_json, config_changes=json.dumps(history))
    write_stage("runs", [row], run_id=run_id, step=0, stage="run", home=home)
