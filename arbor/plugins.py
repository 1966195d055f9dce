"""Plug-ins by import path: ``reward.fn``, ``search.backend`` and ``judge.backend`` accept
``pkg.module:Name`` beside the built-in names, as ``run.method`` does (docs/plugins.md).

A plug-in that fails to import, is missing, or has the wrong shape is refused before anything starts, by a
``PluginError`` that names the config key and what was expected.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
import threading
from typing import Any

from arbor.config.base import IMPORT_PATH_PATTERN

IMPORT_PATH = re.compile(IMPORT_PATH_PATTERN)


class PluginError(ValueError):
    """A plug-in that cannot be used; the message names the config key."""


def import_timeout_s() -> float:
    """How long a plug-in may take to import (``ARBOR_PLUGIN_IMPORT_TIMEOUT_S``, default 120 s)."""
    return float(os.environ.get("ARBOR_PLUGIN_IMPORT_TIMEOUT_S", "120"))


def import_bounded(module: str) -> Any:
    """``importlib.import_module`` in a daemon thread, given ``import_timeout_s()``: user code that hangs at import
    (a plug-in that slept at import hung ``arbor train``) raises ``TimeoutError`` instead, and a
    plug-in that raises anything at import (SystemExit included) raises it here."""
    if module in sys.modules:
        return sys.modules[module]
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["module"] = importlib.import_module(module)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = e

    worker = threading.Thread(target=run, name=f"import {module}", daemon=True)
    worker.start()
    worker.join(import_timeout_s())
    if worker.is_alive():
        raise TimeoutError(f"still importing after {import_timeout_s():g} s (ARBOR_PLUGIN_IMPORT_TIMEOUT_S)")
    if "error" in box:
        raise box["error"]
    return box["module"]


def is_import_path(spec: str | None) -> bool:
    return bool(spec) and IMPORT_PATH.match(spec or "") is not None


def load_plugin(spec: str, key: str, expected: str) -> Any:
    """The object ``pkg.module:Name`` names (importing the module), or ``PluginError`` naming ``key``."""
    if not is_import_path(spec):
        raise PluginError(f"{key}: {spec!r} is not an import path 'pkg.module:Name'; expected {expected}")
    module, _, attr = spec.partition(":")
    try:
        mod = import_bounded(module)
    except BaseException as e:  # noqa: BLE001 - any import failure of user code is reported the same way
        if isinstance(e, KeyboardInterrupt):
            raise
        raise PluginError(f"{key}: cannot import {module!r} ({type(e).__name__}: {e}); expected {expected}") from e
    if not hasattr(mod, attr):
        raise PluginError(f"{key}: module {module!r} has no {attr!r}; expected {expected}")
    return getattr(mod, attr)


def check_signature(obj: Any, key: str, spec: str, args: tuple[str, ...], expected: str) -> None:
    """Refuse a callable that cannot be called with ``args`` positionally (names are only for the message)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError) as e:
        raise PluginError(f"{key}: {spec} is not callable; expected {expected}") from e
    try:
        sig.bind(*args)
    except TypeError as e:
        raise PluginError(f"{key}: {spec}{sig} cannot be called as ({', '.join(args)}): {e}; "
                          f"expected {expected}") from e
