"""The judge machinery (paper App. E): ``make_judge(cfg, home=...)`` returns an ``openai`` or ``rules`` judge, and
``judge.ask(role, **request)`` asks it one of the roles the methods declare (``tasks/methods/<m>/roles.py``).

See ``llm/README.md`` for roles, prompt files, the cache and the call ledger. Nothing here imports ``tasks``.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from arbor.config.judge import JUDGE_BACKENDS, JudgeConfig
from arbor.llm.base import (
    BACKENDS,
    JUDGE_CALL_COLUMNS,
    REGISTRY,
    CallContext,
    Judge,
    JudgeOutcome,
    Refusal,
    Role,
    register,
    register_backend,
    role_of,
)
from arbor.paths import arbor_home
from arbor.plugins import PluginError, load_plugin

__all__ = ["make_judge", "Judge", "JudgeOutcome", "CallContext", "JUDGE_CALL_COLUMNS", "REGISTRY", "Refusal", "Role",
           "register", "role_of", "BACKENDS", "register_backend"]


def make_judge(cfg: JudgeConfig, *, home: Path | str | None = None, config: Any = None) -> Judge:
    """The configured judge backend; the response cache lives in ``{home}/cache/judge`` (home: ``arbor_home()``).

    A backend registered by name (``BACKENDS``: a package's ``register_backend``) is built with the run's whole
    ``config`` too (``ArborConfig``; the ``world`` judge reads its ``world`` section, ``random`` its seed)."""
    root = Path(home) if home is not None else arbor_home()
    if cfg.backend == "openai":
        from arbor.llm.openai_backend import OpenAIJudge

        return OpenAIJudge(cfg, home=root)
    if cfg.backend == "rules":
        from arbor.llm.rules import RulesJudge

        return RulesJudge(cfg, home=root)
    if cfg.backend in BACKENDS:
        return BACKENDS[cfg.backend](cfg, home=root, config=config)  # type: ignore[call-arg]
    if cfg.backend in JUDGE_BACKENDS:
        raise PluginError(f"judge.backend={cfg.backend}: no backend of that name is registered in this process; "
                          "its package registers it on import (arbor.tasks.methods.load_judges())")
    return load_judge_plugin(cfg.backend)(cfg, home=root)


JUDGE_PLUGIN_SHAPE = "a subclass of arbor.llm.Judge, built as Class(judge_config, home=path) (docs/plugins.md)"


def load_judge_plugin(spec: str) -> type[Judge]:
    """The ``judge.backend`` plug-in class, checked (``PluginError`` naming ``judge.backend``)."""
    cls = load_plugin(spec, "judge.backend", JUDGE_PLUGIN_SHAPE)
    if not (isinstance(cls, type) and issubclass(cls, Judge)):
        raise PluginError(f"judge.backend: {spec} is not a subclass of arbor.llm.Judge; expected {JUDGE_PLUGIN_SHAPE}")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise PluginError(f"judge.backend: {spec} leaves abstract methods unimplemented ({missing}); "
                          f"expected {JUDGE_PLUGIN_SHAPE}")
    return cls
