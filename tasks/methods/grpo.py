"""GRPO (DeepSeekMath §4.1.2; paper App. B.2): the outcome reward only, group-normalised, TIS-corrected loss.

Every hook of ``arbor.tasks.methods.base.Method`` is already GRPO: no judge work, no shaping (R_total = R_base), all
groups kept, the group advantage broadcast to every response token. The baseline of Table 1.
"""

from __future__ import annotations

from arbor.tasks.methods.base import Method


class GRPO(Method):
    name = "grpo"
