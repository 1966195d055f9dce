"""Base reward: SQuAD answer normalisation, exact match, token F1 and the format gate (paper §3.4 eq. 4, §4.1).

    R_base_i = F1_i   if trajectory i is format-valid
             = -1     otherwise                                   (eq. 4)

The minus sign of the penalty is lost in the text extraction of the paper; its prose ("preserving the format
penalty imposed by R_base") confirms it. EM and F1 are gated to 0 for invalid trajectories (App. C.1: "all official
metrics are set to zero").
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from arbor.config.reward import RewardConfig
from arbor.format import ARBOR, TagProtocol, check_format
from arbor.plugins import PluginError, check_signature, load_plugin
from arbor.types import Trajectory

FORMAT_PENALTY = -1.0

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """SQuAD v1.1 normalisation: lower case, drop punctuation and articles (a, an, the), squeeze whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _as_list(golds: str | Sequence[str]) -> list[str]:
    return [golds] if isinstance(golds, str) else [g for g in golds if isinstance(g, str)]


def _f1_one(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
    if not p or not g:
        return float(p == g)
    common = sum((Counter(p) & Counter(g)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def token_f1(pred: str | None, golds: str | Sequence[str]) -> float:
    """SQuAD token-level F1 of ``pred`` against the best gold alias (0 when there is no prediction)."""
    if pred is None:
        return 0.0
    return max((_f1_one(pred, g) for g in _as_list(golds)), default=0.0)


def exact_match(pred: str | None, golds: str | Sequence[str]) -> float:
    """1.0 when the normalised prediction equals some normalised gold alias, else 0.0."""
    if pred is None:
        return 0.0
    p = normalize_answer(pred)
    return float(any(p == normalize_answer(g) for g in _as_list(golds)))


@dataclass(frozen=True)
class RewardResult:
    format_valid: bool
    format_reason: str
    answer: str | None
    em: float
    f1: float
    base_reward: float


def base_reward(text: str, golds: str | Sequence[str], truncated: bool = False,
                protocol: TagProtocol = ARBOR) -> RewardResult:
    """R_base (eq. 4) with its parts: F1 when format-valid else -1; EM/F1 gated to 0 when invalid."""
    fmt = check_format(text, truncated, protocol)
    if not fmt.valid:
        return RewardResult(False, fmt.reason, fmt.answer, 0.0, 0.0, FORMAT_PENALTY)
    em, f1 = exact_match(fmt.answer, golds), token_f1(fmt.answer, golds)
    return RewardResult(True, "", fmt.answer, em, f1, f1)


RewardFn = Callable[[Trajectory, list[str]], float]
REWARD_FN_SHAPE = "a function fn(trajectory, golds) -> float (docs/plugins.md)"


def load_reward_fn(cfg: RewardConfig) -> RewardFn | None:
    """The ``reward.fn`` plug-in, checked (``PluginError`` naming ``reward.fn``); None for arbor's F1."""
    if cfg.fn is None:
        return None
    fn = load_plugin(cfg.fn, "reward.fn", REWARD_FN_SHAPE)
    check_signature(fn, "reward.fn", cfg.fn, ("trajectory", "golds"), REWARD_FN_SHAPE)
    return fn


def score_trajectory(traj: Trajectory, truncated: bool, reward_fn: RewardFn | None = None,
                     format_gate: bool = True, protocol: TagProtocol = ARBOR) -> Trajectory:
    """Fill ``format_valid, format_reason, answer, em, f1, base_reward`` of ``traj`` (in place; returned).

    With ``reward_fn`` its value is the base reward; behind ``format_gate`` a format-invalid trajectory keeps -1
    and the function is not asked. EM and F1 stay arbor's either way (they are what evaluation reports)."""
    r = base_reward(traj.text, traj.golds, truncated, protocol)
    traj.format_valid, traj.format_reason, traj.answer = r.format_valid, r.format_reason, r.answer
    traj.em, traj.f1, traj.base_reward = r.em, r.f1, r.base_reward
    if reward_fn is not None and (r.format_valid or not format_gate):
        value = reward_fn(traj, list(traj.golds))
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise PluginError(f"reward.fn returned {value!r} for trajectory {traj.traj_id}; expected a finite number")
        traj.base_reward = float(value)
    return traj
