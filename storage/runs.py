"""The ``runs`` row of a run: read it without the flow machinery (the CLI checks runs before importing Prefect), take
a run by its id (``claim_run``: the one door, whichever way the id came), and record config changes applied on resume
(``runs.config_changes``)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from arbor.storage.lock import RunLocked, acquire, release
from arbor.storage.parquet import _check_name, read_stage, write_stage
from arbor.storage.schemas import SchemaError


class RunRefused(SchemaError):
    """A run id that names no run this process may take: two names for one run, a run that exists where a new one
    was asked for (or the reverse), a run another process writes."""


def check_run_id(run_id: str) -> str:
    """A run id becomes part of paths: refuse one that cannot (SchemaError naming the rule)."""
    return _check_name("run id", run_id)


def one_run_id(flag: str, given: str | None, configured: str | None) -> str | None:
    """The run a command names: ``given`` (by ``flag``: ``--run-id``, a flow's ``run_id``) or ``configured`` (the
    config's ``run.run_id``: ``--set``, a flow's overrides or the profile); both given and different: RunRefused."""
    if given is not None and configured is not None and given != configured:
        raise RunRefused(f"{flag} {given} and run.run_id={configured} name different runs; name the run once")
    return given if given is not None else configured


def claim_run(run_id: str, home: str | os.PathLike[str], *, exists: bool | None) -> dict[str, Any] | None:
    """Take a run by its id, the one door for every way an id arrives (a flag, ``--set run.run_id``, a profile, a
    flow's parameters, a resume): the id checked (it becomes part of paths), the run's lock taken (held by this
    process until ``storage.lock.release``) and its ``runs`` row read under it (None: a new run). ``exists``: True, the
    run must be stored (a resume); False, it must not be (a new run); None, either (a flow run again with the same
    id continues it). A refusal raises RunRefused (SchemaError for a malformed id) and gives the lock back."""
    check_run_id(run_id)
    try:
        acquire(run_id, home)
    except RunLocked as e:
        raise RunRefused(str(e)) from None
    try:
        row = run_row(run_id, home)
        if exists is False and row is not None:
            raise RunRefused(f"run '{run_id}' already exists in {home}: continue it with --resume {run_id}, or "
                             "name a new run")
        if exists is True and row is None:
            raise RunRefused(f"cannot resume run '{run_id}': no such run in {home} (`arbor runs` lists them)")
    except BaseException:
        release(run_id, home)
        raise
    return row


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
