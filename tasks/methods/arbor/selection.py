"""Active selection (paper §3.4): the common rubrics that judge a step's groups, the strongest by rho_r plus the
least recently used among the next strongest."""

from __future__ import annotations

from arbor.tasks.methods.arbor.records import Records
from arbor.tasks.methods.arbor.state import _SELECT, MemoryState
from arbor.types import Rubric


class SelectionMixin(MemoryState):
    """Step call 1: ``select_active`` (and ``peek_active``, its look without choosing)."""

    def _strength(self, rid: str) -> tuple[int, float, int]:
        rho = self.stats[rid].rho
        return (1, 0.0, self.stats[rid].birth) if rho is None else (0, -rho, self.stats[rid].birth)

    def select_active(self, step: int) -> tuple[list[Rubric], Records]:
        """Exactly min(n_active, |P|) rubrics: the highest rho_r, plus the least recently used among the next
        strongest (rotation_pool of them; ties: higher rho_r, then older). Undefined rho_r ranks last."""
        self._enter(step, _SELECT)
        rec = Records()
        chosen = self._choose_active()
        for rid, why in chosen:
            self._emit(rec, self._event(step, "activated", self.P[rid], reason=why, **self._stat_cols(rid)))
        return [self.P[rid] for rid, _ in chosen], rec

    def peek_active(self) -> list[Rubric]:
        """The rubrics ``select_active`` would choose now, without choosing them (no event, no state change):
        streamed judging scores a group with them before the score stage runs."""
        return [self.P[rid] for rid, _ in self._choose_active()]

    def _choose_active(self) -> list[tuple[str, str]]:
        m = min(self.cfg.n_active, len(self.P))
        if m == 0:
            return []
        ranked = sorted(self.P, key=self._strength)
        rest = ranked[1:]
        width = len(rest) if self.cfg.rotation_pool is None else max(self.cfg.rotation_pool, m - 1)
        lru = sorted(rest[:width], key=lambda r: (-1 if self.stats[r].last_used is None else self.stats[r].last_used,
                                                  self._strength(r)))[: m - 1]
        return [(ranked[0], "top rho_r")] + [(r, "lru") for r in lru]
