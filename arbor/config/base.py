"""Base class for config sections: typed, strict (unknown keys refused by name), validated on assignment."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


IMPORT_PATH_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"  # a plug-in: 'pkg.module:Name' (arbor.plugins)


def builtin_or_plugin(value: str, builtins: tuple[str, ...]) -> str:
    """``value`` if it is one of ``builtins`` or a plug-in import path (issue 14); ``ValueError`` otherwise."""
    if value not in builtins and not re.match(IMPORT_PATH_PATTERN, value):
        raise ValueError(f"expected one of {', '.join(builtins)} or a plug-in 'pkg.module:Class'")
    return value
