"""Durations as a person reads them in a progress line."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """A short human duration: ``42 s``, ``3 min``, ``1 h 05 min``."""
    s = max(0, round(seconds))
    if s < 90:
        return f"{s} s"
    if s < 3600:
        return f"{round(s / 60)} min"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"
