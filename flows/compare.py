"""``arbor compare``: the paper's comparisons (Tables 1, 2, 7) on the same data and seeds.

Every method runs the same profile, seed, batches and overrides; only ``run.method`` differs. Each run ends with a
held-out evaluation (``run.eval_every`` = the last step), and the table reads everything back through SQL, with the
trajectories each method rolled out per step beside it (``rollouts_per_step``: DAPO's own refill samples more).

The baselines run as ARBOR's paper ran them (``PAPER_BASELINES``) unless ``--set`` says otherwise:
DAPO drops outcome-homogeneous groups without refill or clip-higher (§4.1, B.2), RaR adds its centred rating with
lambda alone (App. C.3). ``arbor train`` keeps each method's own default (the tiny profiles' rows unchanged).
"""

from __future__ import annotations

import time
from typing import Any

from arbor.paths import arbor_home

# ARBOR's comparison (Tables 1, 7): its DAPO (§4.1: "discards outcome-homogeneous query-groups from policy
# updates", under B.2's symmetric clip) and its RaR-style (C.3: "the same shaping coefficient as ARBOR")
PAPER_BASELINES: dict[str, Any] = {"train.dapo_variant": "arbor-paper", "memory.rar_attenuate": False}


class CompareError(ValueError):
    """Bad ``arbor compare`` input (methods), named."""


def plan_compare(methods: list[str], profile: str = "tiny-cpu", overrides: dict[str, Any] | None = None
                 ) -> dict[str, dict[str, Any]]:
    """Each method's overrides (``PAPER_BASELINES`` under the caller's), every method's config validated and
    preflighted before any run starts.

    Raises ``CompareError``, ``ConfigError`` or ``PreflightError`` (each naming the method, key or file)."""
    from arbor.config import ConfigError, load_config
    from arbor.preflight import require
    from arbor.tasks.methods import MethodError, check_method, method_names

    if not methods:
        raise CompareError(f"--methods: give at least one of {', '.join(method_names())}")
    unknown = []
    for m in methods:
        try:
            check_method(m)
        except MethodError as e:
            if ":" in m:  # an import path that failed: its own reason (No module named ..., not a Method, ...)
                raise CompareError(f"--methods: {e}") from e
            unknown.append(m)
    if unknown:
        raise CompareError(f"--methods: unknown method(s) {', '.join(unknown)}; known: {', '.join(method_names())}, "
                           "or a Method subclass as 'pkg.module:ClassName'")
    base = load_config(profile, overrides)
    plan: dict[str, dict[str, Any]] = {}
    for m in dict.fromkeys(methods):
        sets: dict[str, Any] = {**PAPER_BASELINES, **(overrides or {}), "run.method": m}
        if base.run.eval_every is None and base.run.steps:
            sets["run.eval_every"] = base.run.steps
        try:
            require(load_config(profile, sets))
        except ConfigError as e:
            raise ConfigError(f"method {m}: {e}") from e
        plan[m] = sets
    return plan


def run_compare(methods: list[str], profile: str = "tiny-cpu", overrides: dict[str, Any] | None = None,
                prefix: str | None = None) -> tuple[list[str], str]:
    """Train one run per method (same seed and data), then the comparison table; (run ids, table text)."""
    import secrets

    from arbor.flows.train import arbor_train
    from arbor.storage.sql import query, render, sql_file

    plan = plan_compare(methods, profile, overrides)
    prefix = prefix or f"compare-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    run_ids = [arbor_train(profile=profile, overrides=sets, run_id=f"{prefix}-{m}") for m, sets in plan.items()]
    table = render(query(sql_file("compare_runs"), {"run_ids": run_ids}, home=arbor_home()))
    return run_ids, table
