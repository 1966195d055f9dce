"""What may change when a run is resumed (``arbor train --resume RUN --set key=value``).

A resumed run continues from its stored config. Keys that do not change what the run computes for the steps it
already has are *safe*: run length, eval cadence, judge endpoint and transport, concurrency, the judge cost cap and
checkpoint bookkeeping. They are applied and recorded (``runs.config_changes``). Any other key that would take a
new value is refused by name; an override equal to the stored value is not a change and is accepted.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from arbor.config import ArborConfig, ConfigError, _format_errors, apply_overrides
from arbor.config.judge import JudgeRoles

_ROLE_ENDPOINT = tuple(f"judge.roles.{r}.{k}" for r in JudgeRoles.model_fields for k in ("base_url", "api_key_env"))

SAFE_ON_RESUME: frozenset[str] = frozenset({
    "run.steps", "run.eval_every",                                        # run length, eval cadence
    "run.stream_judging",                                                 # same rows either way
    "judge.base_url", "judge.api_key_env", *_ROLE_ENDPOINT,               # judge endpoint
    "judge.timeout_s", "judge.max_retries", "judge.backoff_base_s", "judge.backoff_max_s",
    "judge.concurrency", "rollout.concurrency",                           # concurrency
    "judge.cost_cap_usd",                                                 # cost cap
    "judge.max_failed_share", "judge.warn_refused_share",                 # judge health thresholds
    "rollout.request_timeout_s", "cluster.startup_timeout_s",             # transport
    "judge.stall_s", "search.stall_s", "rollout.stall_s",                 # progress deadlines
    *(f"judge.roles.{r}.stall_s" for r in JudgeRoles.model_fields),
    "checkpoint.every", "checkpoint.keep_last",                           # bookkeeping (replay makes it exact)
    "checkpoint.async_save",                                              # when the same files are written
})


def _leaves(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict) and k not in {"deviations", "deepspeed"}:
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def amend_config(stored: ArborConfig, overrides: dict[str, Any] | list[str] | None
                 ) -> tuple[ArborConfig, dict[str, tuple[Any, Any]]]:
    """``stored`` with ``overrides`` applied: (new config, {key: (old, new)} of the keys that changed).

    Raises ``ConfigError`` naming every key that may not change on resume (or a bad key / value)."""
    before = stored.model_dump(mode="json")
    if not overrides:
        return stored, {}
    data = apply_overrides(stored.model_dump(mode="json"), overrides)
    try:
        cfg = ArborConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e)) from e
    old, new = _leaves(before), _leaves(cfg.model_dump(mode="json"))
    changes = {k: (old.get(k), new.get(k)) for k in new if old.get(k) != new.get(k)}
    refused = sorted(k for k in changes if k not in SAFE_ON_RESUME)
    if refused:
        shown = ", ".join(f"{k} ({changes[k][0]!r} -> {changes[k][1]!r})" for k in refused)
        raise ConfigError(f"cannot change {shown} when resuming run '{stored.run.run_id}': only run length, eval "
                          "cadence, judge endpoint, concurrency, cost cap and checkpointing may change; start a new "
                          "run for other settings")
    tc = cfg.train
    if "run.steps" in changes and (tc.lr_schedule != "constant" or tc.warmup_ratio > 0):
        raise ConfigError(f"cannot change run.steps when resuming run '{stored.run.run_id}': "
                          f"train.lr_schedule={tc.lr_schedule} / train.warmup_ratio={tc.warmup_ratio} lay the "
                          "learning-rate schedule over run.steps")
    if "run.steps" in changes and stored.run.overlap == "one-step":
        raise ConfigError(f"cannot change run.steps when resuming run '{stored.run.run_id}': under run.overlap="
                          "one-step the rollout after the last step would need the policy of two steps back, which "
                          "the run's last checkpoint has moved past")
    return cfg, changes
