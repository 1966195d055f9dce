"""Named data sources as plug-ins: a spec ``<prefix>:<name>`` in ``data.train`` / ``data.eval``,
``search.corpus`` or ``sft.data`` reaches the source registered under ``<prefix>``.

A source is a ``Source``: up to four functions, each optional, that get the spec's name part and the run's config.
Sources are found by prefix among the Python entry points of group ``arbor.sources`` (an installed package declares
``[project.entry-points."arbor.sources"] mydata = "mypkg.module:SOURCE"``), or registered in the process with
``register_source``. arbor's own synthetic world is found the same way (its entry point is in pyproject.toml); the
loaders (``tasks.env.datasets.load_questions``, ``tasks.env.search.make_search``, ``flows.sft``) name no source.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import distributions
from pathlib import Path
from typing import Any

from arbor.config import ArborConfig
from arbor.plugins import PluginError, load_plugin

GROUP = "arbor.sources"  # the entry-point group
SOURCE_SHAPE = ("an arbor.tasks.env.sources.Source(questions=, corpus=, sft_data=, key=) instance, declared as "
                f"'pkg.module:NAME' in the entry-point group {GROUP} (docs/plugins.md)")


@dataclass(frozen=True)
class Source:
    """What a source serves; a part left ``None`` is refused by name when a spec asks for it.

    - ``questions(name, config) -> list[Question]``: ``data.train`` / ``data.eval`` / ``arbor eval --split``
    - ``corpus(name, config, home) -> Path``: ``search.corpus`` (a JSONL / Parquet corpus file for BM25)
    - ``sft_data(name, config, out, home) -> Path``: ``sft.data`` (SFT JSONL written at ``out``)
    - ``key(config) -> dict``: what the source's data depend on, added to the SFT checkpoint's key when a spec
      uses the source
    """

    questions: Callable[[str, ArborConfig], list[Any]] | None = None
    corpus: Callable[[str, ArborConfig, Path], Path] | None = None
    sft_data: Callable[[str, ArborConfig, Path, Path], Path] | None = None
    key: Callable[[ArborConfig], dict[str, Any]] | None = None


_loaded: dict[str, Source] = {}  # prefix -> source: registered in the process, or loaded from its entry point


@functools.cache
def _declared() -> dict[str, str]:
    """prefix -> 'pkg.module:NAME' of every entry point in ``GROUP``. Every copy of a distribution's metadata is
    read, not only the first on ``sys.path`` (what ``entry_points`` does): a stale ``*.egg-info`` in a checkout's
    root, on the path whenever the root is, would otherwise hide the installed declaration."""
    return {ep.name: ep.value for dist in reversed(list(distributions())) for ep in dist.entry_points
            if ep.group == GROUP}


def register_source(prefix: str, source: Source) -> None:
    """Serve ``<prefix>:<name>`` specs from ``source`` in this process (over an entry point of that name)."""
    _loaded[prefix] = source


def source_names() -> list[str]:
    """The known prefixes, sorted."""
    return sorted({*_declared(), *_loaded})


def find_source(prefix: str) -> Source | None:
    """The source registered under ``prefix`` (importing its module once), or None."""
    if prefix not in _loaded and prefix in _declared():
        key = f"{GROUP} entry point {prefix!r}"
        source = load_plugin(_declared()[prefix], key, SOURCE_SHAPE)
        if not isinstance(source, Source):
            raise PluginError(f"{key}: {_declared()[prefix]} is a {type(source).__name__}; expected {SOURCE_SHAPE}")
        _loaded[prefix] = source
    return _loaded.get(prefix)


def spec_source(spec: str) -> tuple[Source, str] | None:
    """``(source, name)`` for a spec ``<prefix>:<name>`` whose prefix is a known source, else None."""
    prefix, _, name = spec.partition(":")
    source = find_source(prefix) if name else None
    return None if source is None else (source, name)


def known_sources() -> str:
    """The known prefixes for an error message."""
    return ", ".join(f"{p}:..." for p in source_names()) or f"none: no entry point in {GROUP} (reinstall arbor)"
