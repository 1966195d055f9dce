"""Shared pieces of the integration tests: tiny run settings, reading a run back, comparing two runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arbor.storage.parquet import read_table

JUDGE_KEY_ENV = "ARBOR_TEST_JUDGE_KEY"
JUDGE_KEY = "sk-test-secret-0123456789"


def tiny_overrides(start_checkpoint: Path, **extra: Any) -> dict[str, Any]:
    """Small enough for two cores: the tiny-cpu profile with 8 prompts x K=4 and two steps; one admitted draft
    triggers a consolidation (k_consol=1) so that step 2 already activates a common rubric."""
    o: dict[str, Any] = {
        "run.steps": 2,
        "run.sft_warm_start": False,
        "run.start_checkpoint": str(start_checkpoint),
        "rollout.batch_size": 8,
        "rollout.k": 4,
        "memory.k_consol": 1,
        "checkpoint.every": 1,
    }
    o.update(extra)
    return o


def sft_start(profile: str, fresh_home: Any) -> Path:
    """The SFT checkpoint of ``profile``, trained once under ``fresh_home()`` (a temporary directory), or kept between
    sessions under ARBOR_TEST_SFT_CACHE (developers only; checkpoints are content-addressed)."""
    import os

    from arbor.config import load_config
    from arbor.flows.sft import sft_checkpoint

    cache = os.environ.get("ARBOR_TEST_SFT_CACHE")
    home = Path(cache) if cache else fresh_home()
    old = os.environ.get("ARBOR_HOME")
    os.environ["ARBOR_HOME"] = str(home)
    try:
        return sft_checkpoint(load_config(profile), home)
    finally:
        if old is None:
            os.environ.pop("ARBOR_HOME", None)
        else:
            os.environ["ARBOR_HOME"] = old


def judge_server() -> Any:
    """The local OpenAI-compatible judge; its pairwise rule (fewer searches win) suits the tiny policy, whose
    memorised correct answers search less."""
    from openai_server import FaultPlan, OpenAIServer

    return OpenAIServer(FaultPlan(fewer_searches_win=True))


def openai_judge(base_url: str) -> dict[str, Any]:
    return {"judge.backend": "openai", "judge.base_url": base_url, "judge.api_key_env": JUDGE_KEY_ENV,
            "judge.model": "test-judge", "judge.max_retries": 2, "judge.backoff_base_s": 0.01}


def table(name: str, run_id: str, home: Path) -> list[dict[str, Any]]:
    return read_table(name, run_id=run_id, home=home).to_pylist()


def comparable_events(run_id: str, home: Path) -> list[tuple]:
    """rubric_events without the run id, in (step, seq) order."""
    rows = sorted(table("rubric_events", run_id, home), key=lambda e: (e["step"], e["seq"]))
    keys = [k for k in rows[0] if k != "run_id"] if rows else []
    return [tuple(_round(r[k]) for k in keys) for r in rows]


def shaped_rewards(run_id: str, home: Path) -> list[tuple[int, int, int, float]]:
    rows = table("trajectories", run_id, home)
    return sorted((r["step"], r["group"], r["sample"], round(r["shaped_reward"], 9)) for r in rows)


def _round(v: Any) -> Any:
    return round(v, 9) if isinstance(v, float) else v
