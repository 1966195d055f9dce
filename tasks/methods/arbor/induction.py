"""Contrastive anchor selection for local rubric induction (paper §3.2, eq. 1, Appendix A.1, E.1).

    tau+        = argmax_{tau in G_q, format-valid} F1(tau)               (positive anchor)
    tau-_worst  = argmin_{tau in G_q, F1(tau) < F1(tau+)} F1(tau)          (worst-case negative)
    tau-_hard   = argmax_{tau in G_q, F1(tau) < F1(tau+)} F1(tau)          (hard negative, strictly below tau+)

Positives come from the format-valid trajectories only (E.1: a format-invalid response "must not be treated as a
high-quality positive example"); negatives from ALL trajectories, a format-invalid one's F1 gated to 0 (E.1: it "may
be used as [a] low-quality anchor"). Ties (within 1e-9) go to the shortest response, then the lowest index (A.1),
whatever the validity. Induction is skipped with fewer than two format-valid trajectories (A.1). See
docs/decisions/anchors-and-retirement.md.

Modes:
  contrast     two pairs (tau+, tau-_worst) and (tau+, tau-_hard), hard != worst;
  single_pair  one pair (tau+, tau-_hard): hard and worst resolve to the same trajectory (one trajectory below
               tau+, or all below it share one F1 so the same tie-break picks the same one; in particular when
               every trajectory below tau+ is format-invalid);
  unlabeled    all trajectories share one intermediate F1 (0 < F1 < 1; so all are format-valid, an invalid one
               being gated to 0): they are sent without labels (``unlabeled_members``); positive/worst/hard None;
  skip         no trajectory below tau+ with F1(tau+) 1 or 0 (all-correct / all-wrong), or fewer than two
               format-valid trajectories.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from arbor.group_stats import EPS


def _pick(cands: list[int], f1: Sequence[float], lengths: Sequence[int], best: str) -> int:
    """argmax (best='max') or argmin of F1 over ``cands``; ties within EPS: shortest response, then index."""
    target = max(f1[i] for i in cands) if best == "max" else min(f1[i] for i in cands)
    tied = [i for i in cands if abs(f1[i] - target) <= EPS]
    return min(tied, key=lambda i: (lengths[i], i))


def gate_f1(f1: Sequence[float], format_valid: Sequence[bool]) -> list[float]:
    """F1 with format-invalid trajectories set to 0 (the strict format gate, E.1 / App. C.1)."""
    return [float(y) if ok else 0.0 for y, ok in zip(f1, format_valid, strict=True)]


def select_anchors(f1: Sequence[float], lengths: Sequence[int], format_valid: Sequence[bool]) -> dict[str, Any]:
    """Eq. 1 with the A.1 corner cases; tau+ format-valid, negatives from all (invalid: F1 0).

    Returns {"mode", "positive", "worst", "hard"} (indices or None).
    """
    if not (len(f1) == len(lengths) == len(format_valid)):
        raise ValueError(
            f"select_anchors: lengths differ (f1={len(f1)}, lengths={len(lengths)}, format_valid={len(format_valid)})"
        )
    skip: dict[str, Any] = {"mode": "skip", "positive": None, "worst": None, "hard": None}
    valid = [i for i, ok in enumerate(format_valid) if ok]
    if len(valid) < 2:
        return skip
    gated = gate_f1(f1, format_valid)
    pos = _pick(valid, gated, lengths, "max")
    below = [i for i in range(len(gated)) if gated[i] < gated[pos] - EPS]
    if not below:
        # Every trajectory shares F1(tau+): all-correct / all-wrong -> skip; intermediate -> unlabeled (A.1).
        if gated[pos] >= 1.0 - EPS or gated[pos] <= EPS:
            return skip
        return {"mode": "unlabeled", "positive": None, "worst": None, "hard": None}
    hard = _pick(below, gated, lengths, "max")
    worst = _pick(below, gated, lengths, "min")
    mode = "single_pair" if hard == worst else "contrast"
    return {"mode": mode, "positive": pos, "worst": worst, "hard": hard}


def unlabeled_members(format_valid: Sequence[bool]) -> list[int]:
    """Trajectories sent without labels in ``unlabeled`` mode: every format-valid one, in index order (in that
    mode every trajectory is format-valid, see ``select_anchors``)."""
    return [i for i, ok in enumerate(format_valid) if ok]


def contrast_pairs(anchors: dict[str, Any]) -> list[tuple[int, int]]:
    """The (higher, lower) pairs sent to the induction judge: (tau+, tau-_worst) then (tau+, tau-_hard)."""
    mode = anchors["mode"]
    if mode == "contrast":
        return [(anchors["positive"], anchors["worst"]), (anchors["positive"], anchors["hard"])]
    if mode == "single_pair":
        return [(anchors["positive"], anchors["hard"])]
    return []
