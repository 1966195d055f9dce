"""Issue 63 item 2: a two-step tiny-world ARBOR run completes with each of the new judge backends (``world``,
``random``), their calls in the ledger, every judge call answered (no error), and the rows every step stores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from flow_support import table

pytestmark = pytest.mark.slow

WORLD_SFT = {"sft.questions": 300, "sft.epochs": 1}  # the small tiny-world start of tests/test_flow_train.py


@pytest.mark.parametrize("backend", ["world", "random"])
def test_a_two_step_tiny_world_arbor_run_completes_with_the_judge(backend, sft_starts, prefect_harness,
                                                                  tmp_path: Path) -> None:
    from arbor.flows.train import arbor_train

    start = sft_starts("tiny-world", WORLD_SFT)
    home = tmp_path / "home"
    os.environ["ARBOR_HOME"] = str(home)
    arbor_train(profile="tiny-world", run_id=backend, overrides={
        **WORLD_SFT, "run.steps": 2, "run.sft_warm_start": False, "run.start_checkpoint": str(start),
        "rollout.batch_size": 8, "rollout.k": 4, "run.eval_every": None, "judge.backend": backend,
        "memory.k_consol": 1, "memory.consolidation_batch": "all", "run.method": "arbor"})
    steps = table("steps", backend, home)
    assert sorted(s["step"] for s in steps) == [1, 2]
    # this small start writes few format-valid groups, so a step may ask the judge nothing; whatever it asked was
    # answered by the configured backend without error, and its drafts read the world's features
    calls = table("judge_calls", backend, home)
    assert {c["backend"] for c in calls} <= {backend} and not [c for c in calls if c["error"]]
    drafts = [e for e in table("rubric_events", backend, home) if e["event"] == "induced"]
    if backend == "world":
        from arbor.tasks.methods.arbor.world_judge import WORLD_FEATURES
        assert {e["feature"] for e in drafts} <= set(WORLD_FEATURES)
