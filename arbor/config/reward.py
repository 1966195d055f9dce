"""The base reward (paper eq. 1 / 4): token F1 behind the format gate, or a user's function."""

from __future__ import annotations

from pydantic import Field

from arbor.config.base import IMPORT_PATH_PATTERN, Section


class RewardConfig(Section):
    fn: str | None = Field(None, pattern=IMPORT_PATH_PATTERN,
                           description="a base-reward plug-in 'pkg.module:fn', called as fn(trajectory, golds) -> "
                           "float (docs/plugins.md); None: token F1 behind the format gate (eq. 1)")
    format_gate: bool = Field(True, description="with reward.fn: a format-invalid trajectory gets -1 without asking "
                              "fn (arbor's gate); false: fn scores every trajectory, valid or not")
