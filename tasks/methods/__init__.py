"""Training methods, one module or package each, found by name (``run.method``) or by import path.

    arbor      tasks/methods/arbor/        the paper: rubric memory, sparse pairwise judging, eq. 1-4
    grpo       tasks/methods/grpo.py       outcome reward only (the Method defaults)
    dapo       tasks/methods/dapo/         clip-higher, dynamic sampling, overlong punishment
    rar        tasks/methods/rar/          query-specific RaR items, holistic rating (App. C.3)
    no-memory  tasks/methods/no_memory.py  ARBOR's drafts, used once and discarded (App. C.3)
    ss-grpo    tasks/methods/ss_grpo/      RubricEM's stage-structured GRPO, a stagewise rubric judge
    rubricem   tasks/methods/rubricem/     ss-grpo plus the reflection meta-policy and the rubric bank
    arco       tasks/methods/arco/         a co-evolving rubric model turns the outcome into per-turn rewards

A method with mathematics, state or tables of its own is a package: ``method.py`` (the class), its
mathematics as pure functions, ``tables.py`` (its ``TableSet``) and ``sql/`` (its views). ``coreact/`` is Co-ReAct,
which is no training method but guided inference and a generator-training flow, packaged the same way.

A user's method is a subclass of ``arbor.tasks.methods.base.Method`` named by ``run.method: pkg.module:ClassName``
(docs/methods.md). This module imports no method (nor torch) until one is resolved, so that checking a config
(``arbor.preflight``) stays fast.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from arbor.config import ArborConfig
from arbor.plugins import IMPORT_PATH

if TYPE_CHECKING:
    from arbor.tasks.methods.base import Method

BUILTIN: dict[str, str] = {
    "arbor": "arbor.tasks.methods.arbor:Arbor",
    "grpo": "arbor.tasks.methods.grpo:GRPO",
    "dapo": "arbor.tasks.methods.dapo:DAPO",
    "rar": "arbor.tasks.methods.rar:RaR",
    "no-memory": "arbor.tasks.methods.no_memory:NoMemory",
    "ss-grpo": "arbor.tasks.methods.ss_grpo:SSGRPO",
    "rubricem": "arbor.tasks.methods.rubricem:RubricEM",
    "arco": "arbor.tasks.methods.arco:ARCO",
}
# Config values a built-in method cannot run without (its ``Method.requires``, repeated here so that checking a
# config imports no method; a test keeps the two equal).
BUILTIN_REQUIRES: dict[str, dict[str, object]] = {"ss-grpo": {"rollout.protocol": "rubricem"},
                                                  "rubricem": {"rollout.protocol": "rubricem"}}
# Config switches that only one built-in method's hooks read (the update names no method), so that
# turning one on under another method is refused rather than silently doing nothing; a subclass of the owner counts.
METHOD_SWITCHES: dict[str, str] = {"train.overlong_penalty": "dapo"}
# The modules that declare the built-in judge roles; each registers its roles with the judge (``arbor.llm.REGISTRY``)
# when imported. A flow gets a method's roles by resolving the method (its package imports them); an entry point that
# builds a judge for every role (bench/judge_roles.py, the judge tests) calls ``load_roles``.
ROLE_MODULES = ("arbor.tasks.methods.arbor.roles", "arbor.tasks.methods.rar.roles", "arbor.tasks.methods.ss_grpo.roles",
                "arbor.tasks.methods.rubricem.roles", "arbor.tasks.methods.arco.roles",
                "arbor.tasks.methods.coreact.roles", "arbor.tasks.reporting.accuracy")
# The modules that register judge backends by name (``arbor.llm.register_backend``): ARBOR's ``world`` and ``random``
# judges. A flow that builds a judge calls ``load_judges`` first, so ``judge.backend=world`` resolves
# whatever the method.
JUDGE_MODULES = ("arbor.tasks.methods.arbor.world_judge",)
REGISTRY: dict[str, type[Method]] = {}  # short names registered by plug-in packages (``register``)
# ``runs.method`` of the runs that trained no method: an evaluation (flows/evaluate.py) and Co-ReAct's generator
# training (flows/guidance.py), whose tables are Co-ReAct's, as are those of any run with guidance.mode on
NOT_METHODS = ("eval", "co-react-generator")
GUIDANCE_TABLES = "arbor.tasks.methods.coreact.tables"


class MethodError(ValueError):
    """``run.method`` names no registered method and no importable Method class; the message says which."""


def load_roles() -> None:
    """Register every built-in judge role (``ROLE_MODULES``)."""
    for module in ROLE_MODULES:
        importlib.import_module(module)


def load_judges() -> None:
    """Register the judge backends the methods define (``JUDGE_MODULES``)."""
    for module in JUDGE_MODULES:
        importlib.import_module(module)


def method_names() -> list[str]:
    return [*BUILTIN, *REGISTRY]


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: make a method available by its ``name`` (a plug-in package may call it on import)."""
    if not cls.name:
        raise MethodError(f"{cls.__qualname__}: a registered method needs a non-empty `name`")
    REGISTRY[cls.name] = cls
    return cls


def check_method(spec: str) -> None:
    """Raise ``MethodError`` unless ``spec`` resolves; a built-in name is known without importing anything."""
    if spec not in BUILTIN:
        resolve_method(spec)


def requirement_problems(cfg: ArborConfig) -> list[str]:
    """One line per config value the configured method requires and ``cfg`` does not have (``Method.requires``)."""
    spec = cfg.run.method
    needs = BUILTIN_REQUIRES.get(spec) if spec in BUILTIN else dict(resolve_method(spec).requires)
    out = []
    for key, want in (needs or {}).items():
        have: object = cfg
        for part in key.split("."):
            have = getattr(have, part)
        if have != want:
            out.append(f"{key}: run.method={spec} needs {key}={want} (got {have!r})")
    for key, owner in METHOD_SWITCHES.items():
        section, _, name = key.partition(".")
        if getattr(getattr(cfg, section), name) and spec != owner and (
                spec in BUILTIN or not issubclass(resolve_method(spec), resolve_method(owner))):
            out.append(f"{key}: only run.method={owner} (or a subclass) reads it; run.method={spec} would ignore it")
    return out


def resolve_method(spec: str) -> type[Method]:
    """The method class ``spec`` names: a built-in or registered name, or ``pkg.module:ClassName`` (imported)."""
    if spec in REGISTRY:
        return REGISTRY[spec]
    target = BUILTIN.get(spec, spec)
    if not IMPORT_PATH.match(target):
        raise MethodError(f"run.method: unknown method {spec!r}; known: {', '.join(method_names())}, "
                          "or a subclass of arbor.tasks.methods.base.Method as 'pkg.module:ClassName'")
    from arbor.plugins import import_bounded

    module, _, attr = target.partition(":")
    try:  # a built-in is ours; a user's module may fail at import in any way, or hang
        obj = getattr(importlib.import_module(module) if spec in BUILTIN else import_bounded(module), attr)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - any failure of user code at import is reported the same way
        raise MethodError(f"run.method: cannot import {spec!r} ({type(e).__name__}: {e})") from e
    from arbor.tasks.methods.base import Method  # the interface imports torch: only once a method is needed

    if not (isinstance(obj, type) and issubclass(obj, Method)):
        raise MethodError(f"run.method: {spec!r} is not a subclass of arbor.tasks.methods.base.Method")
    return obj


def load_run_tables(row: Mapping[str, Any]) -> None:
    """Make a stored run's tables known to this process (``storage.schemas``), from its ``runs`` row: its method's
    (``runs.method``: a name or ``pkg.module:ClassName``, whose class registers them when defined) and Co-ReAct's
    when the run was guided or trained its generator. ``MethodError`` when the method cannot be imported here."""
    try:
        stored = json.loads(row.get("config_json") or "{}")
    except ValueError:
        stored = {}
    spec = row.get("method") or (stored.get("run") or {}).get("method") or "arbor"
    if spec not in NOT_METHODS:
        resolve_method(spec)
    if spec == "co-react-generator" or (stored.get("guidance") or {}).get("mode", "off") != "off":
        importlib.import_module(GUIDANCE_TABLES)


def make_method(cfg: ArborConfig) -> Method:
    """The configured method (``run.method``), constructed with the run's config."""
    return resolve_method(cfg.run.method)(cfg)


__all__ = ["BUILTIN", "BUILTIN_REQUIRES", "METHOD_SWITCHES", "REGISTRY", "MethodError", "check_method", "load_run_tables",
           "make_method", "method_names", "register", "requirement_problems", "resolve_method"]
