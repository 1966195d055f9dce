"""Training methods, one module each, found by name (``run.method``) or by import path (issue 13).

    arbor      tasks/methods/arbor.py      the paper: rubric memory, eq. 1-4
    grpo       tasks/methods/grpo.py       outcome reward only (the Method defaults)
    dapo       tasks/methods/dapo.py       clip-higher, dynamic sampling
    rar        tasks/methods/rar.py        query-specific RaR items, holistic rating (App. C.3)
    no-memory  tasks/methods/no_memory.py  ARBOR's drafts, used once and discarded (App. C.3)

A user's method is a subclass of ``tasks.methods.base.Method`` named by ``run.method: pkg.module:ClassName``
(docs/methods.md).
"""

from __future__ import annotations

import importlib
import re

from arbor.config import ArborConfig
from tasks.methods.arbor import Arbor
from tasks.methods.base import Method, RubricScores, StepResources
from tasks.methods.dapo import DAPO
from tasks.methods.grpo import GRPO
from tasks.methods.no_memory import NoMemory
from tasks.methods.rar import RaR

REGISTRY: dict[str, type[Method]] = {m.name: m for m in (Arbor, GRPO, DAPO, RaR, NoMemory)}
IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class MethodError(ValueError):
    """``run.method`` names no registered method and no importable Method class; the message says which."""


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: make a method available by its ``name`` (a plug-in package may call it on import)."""
    if not cls.name:
        raise MethodError(f"{cls.__qualname__}: a registered method needs a non-empty `name`")
    REGISTRY[cls.name] = cls
    return cls


def resolve_method(spec: str) -> type[Method]:
    """The method class ``spec`` names: a registered name, or ``pkg.module:ClassName`` (imported)."""
    if spec in REGISTRY:
        return REGISTRY[spec]
    if not IMPORT_PATH.match(spec):
        raise MethodError(f"run.method: unknown method {spec!r}; known: {', '.join(REGISTRY)}, "
                          "or a subclass of tasks.methods.base.Method as 'pkg.module:ClassName'")
    module, _, attr = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise MethodError(f"run.method: cannot import {spec!r}: {e}") from e
    if not (isinstance(obj, type) and issubclass(obj, Method)):
        raise MethodError(f"run.method: {spec!r} is not a subclass of tasks.methods.base.Method")
    return obj


def make_method(cfg: ArborConfig) -> Method:
    """The configured method (``run.method``), constructed with the run's config."""
    return resolve_method(cfg.run.method)(cfg)


__all__ = ["REGISTRY", "Method", "MethodError", "RubricScores", "StepResources", "make_method", "register",
           "resolve_method"]
