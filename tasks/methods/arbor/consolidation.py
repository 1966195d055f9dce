"""Consolidation and capacity (paper §3.3): every K_consol admitted drafts, the consolidation judge's new common
rubrics enter P unless an embedding de-duplicates them; a full pool replaces its weakest matured rubric."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from arbor.tasks.methods.arbor.records import Records
from arbor.tasks.methods.arbor.state import _CONSOLIDATE, DraftEntry, MemoryState
from arbor.types import Rubric, RubricDraft


def rubric_text(r: Rubric | RubricDraft) -> str:
    """Text embedded for de-duplication: title and high-scoring description."""
    return f"{r.title}: {r.description}"


Embed = Callable[[list[str]], Any]  # texts -> array-like (n, dim)


def _normalise(x: Any) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 2:
        a = a.reshape(len(a), -1)
    norms = np.linalg.norm(a, axis=1, keepdims=True)
    return a / np.where(norms == 0, 1.0, norms)


class ConsolidationMixin(MemoryState):
    """Step call 5: ``consolidate`` while ``consolidation_due()``, on ``consolidation_batch()``."""

    def consolidation_due(self) -> bool:
        """|D| has reached K_consol (§3.3): a consolidation call is due."""
        return not self.cfg.frozen and len(self.D) >= self.cfg.k_consol

    def consolidation_batch(self) -> list[DraftEntry]:
        """The drafts the next consolidation call digests (§3.3: it fires when |D| reaches K_consol, so one call sees
        K_consol drafts): the oldest ``k_consol`` in admission order; ``memory.consolidation_batch=all``: all of D."""
        return list(self.D) if self.cfg.consolidation_batch == "all" else self.D[: self.cfg.k_consol]

    def candidates_by_query(self, drafts: Sequence[DraftEntry] | None = None) -> dict[str, list[Rubric]]:
        """``drafts`` (default: all of D) grouped by query of origin (question text), in admission order (the
        consolidation prompt, E.2)."""
        out: dict[str, list[Rubric]] = {}
        for d in self.D if drafts is None else drafts:
            out.setdefault(d.question or "", []).append(d.rubric)
        return out

    def consolidate(self, step: int, new_commons: Sequence[RubricDraft], embed: Embed) -> Records:
        """Write the consolidation judge's new common rubrics into P (de-dup, capacity), keep lineage; the drafts of
        ``consolidation_batch()`` (the ones the judge was shown) leave D (§3.3). May repeat within a step while
        ``consolidation_due()``."""
        self._enter(step, _CONSOLIDATE)
        if self.cfg.frozen:
            raise RuntimeError("RubricMemory.consolidate: the memory is frozen (memory.frozen=true)")
        if not self.consolidation_due():
            raise RuntimeError(f"RubricMemory.consolidate: not due (|D| = {len(self.D)} < k_consol)")
        rec = Records()
        drafts = self.consolidation_batch()
        existing = list(self.P.values())
        texts = [rubric_text(r) for r in existing] + [rubric_text(c) for c in new_commons]
        vecs = _normalise(embed(texts)) if new_commons else np.zeros((len(texts), 1))
        if len(vecs) != len(texts):
            raise ValueError(f"consolidate: the embedder (memory.embedder) returned {len(vecs)} vectors "
                             f"for {len(texts)} texts")
        old_ids, old_vecs = [r.rubric_id for r in existing], vecs[: len(existing)]
        kept_ids: list[str] = []
        kept_vecs: list[np.ndarray] = []
        for i, c in enumerate(new_commons):
            new = Rubric(f"c{step}.{self._commons + i}", c.title, c.description, c.counter_description, "common", c.feature, c.direction)
            v = vecs[len(existing) + i]
            ids = old_ids + kept_ids
            sims = [float(v @ w) for w in list(old_vecs) + kept_vecs]
            best = int(np.argmax(sims)) if sims else -1
            sim = sims[best] if sims else None
            if sim is not None and sim >= self.cfg.dedup_threshold:
                self._emit(rec, self._event(step, "duplicate", new, other_rubric_id=ids[best], similarity=sim,
                                            reason="cosine >= dedup_threshold"))
                continue
            if len(self.P) >= self.cfg.pool_max:
                unit = self.cfg.count_activations
                matured = [r for r in self.P if self.stats[r].activations(unit) >= self.cfg.maturity]
                if not matured:
                    self._emit(rec, self._event(step, "dropped", new, similarity=sim,
                                                reason=f"pool full and no rubric has {self.cfg.maturity} "
                                                       f"activations{' (steps)' if unit == 'step' else ''}"))
                    continue
                victim = min(matured, key=lambda r: (self.stats[r].mean_variance, self.stats[r].birth))
                self._emit(rec, self._event(step, "replaced", self.P[victim], other_rubric_id=new.rubric_id,
                                            reason="lowest mean within-group variance among matured",
                                            **self._stat_cols(victim)))
            self._emit(rec, self._event(step, "consolidated", new, similarity=sim,
                                        reason=f"from {len(drafts)} drafts"))
            kept_ids.append(new.rubric_id)
            kept_vecs.append(v)
            for d in drafts:
                rec.sources.append({"step": step, "common_rubric_id": new.rubric_id,
                                    "draft_rubric_id": d.rubric.rubric_id, "draft_step": d.step, "group": d.group,
                                    "question_id": d.question_id, "question": d.question})
        self._commons += len(new_commons)
        for d in drafts:  # the batch leaves D: each of its drafts as "consolidated"
            self._emit(rec, self._event(step, "consolidated", d.rubric, group=d.group,
                                        reason=f"consumed by consolidation at step {step}"))
        return rec
