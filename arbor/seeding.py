"""Deterministic randomness (docs/architecture.md): every random choice is derived from (seed, step, group, purpose, ...).

A resumed run re-derives the same seeds, so it reproduces the uninterrupted run bit for bit.
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any parts, e.g. ``derive_seed(cfg.seed, step, group, "rollout")``.

    Stable across processes and Python versions (blake2b of the parts' ``repr``), unlike ``hash()``.
    """
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") & ((1 << 63) - 1)


def coin(*parts: object) -> bool:
    """A deterministic fair coin (used e.g. to swap which trajectory the judge sees as "A")."""
    return derive_seed(*parts, "coin") & 1 == 1
