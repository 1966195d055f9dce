"""The common rubric pool as an artifact: export a run's pool for another run's warm start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arbor.paths import arbor_home
from arbor.tasks.methods.arbor import rebuild_memory
from arbor.tasks.stage_store import StageStore


def export_pool(run_id: str, home: Path | None = None, step: int | None = None) -> dict[str, Any]:
    """The run's common pool P after its last completed stage (or after step ``step``), rebuilt from its stored
    events. A pool can empty itself by retirement late in a run; ``step`` exports it as it stood earlier."""
    from arbor.flows.run_setup import stored_config

    home = home or arbor_home()
    cfg = stored_config(run_id, home)
    if cfg is None:
        raise ValueError(f"no run '{run_id}' in {home}")
    if step is not None and not 1 <= step <= cfg.run.steps:
        raise ValueError(f"step {step} is outside run '{run_id}' (steps 1..{cfg.run.steps})")
    data = rebuild_memory(cfg.memory, StageStore(run_id, home), step or cfg.run.steps).export_pool()
    data["source_run"] = run_id
    if step is not None:
        data["source_step"] = step
    return data
