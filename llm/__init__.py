"""Judge backends (paper App. E): ``make_judge(cfg, home=...)`` returns an ``openai`` or ``rules`` judge.

See ``llm/README.md`` for the roles, the prompt files, the cache and the call ledger.
"""

from __future__ import annotations

from pathlib import Path

from arbor.config.judge import JudgeConfig
from arbor.llm.base import JUDGE_CALL_COLUMNS, ROLES, CallContext, Judge, JudgeOutcome, Winner, unswap
from arbor.paths import arbor_home

__all__ = ["make_judge", "Judge", "JudgeOutcome", "CallContext", "Winner", "unswap", "ROLES", "JUDGE_CALL_COLUMNS"]


def make_judge(cfg: JudgeConfig, *, home: Path | str | None = None) -> Judge:
    """The configured judge backend; the response cache lives in ``{home}/cache/judge`` (home: ``arbor_home()``)."""
    root = Path(home) if home is not None else arbor_home()
    if cfg.backend == "openai":
        from arbor.llm.openai_backend import OpenAIJudge

        return OpenAIJudge(cfg, home=root)
    from arbor.llm.rules import RulesJudge

    return RulesJudge(cfg, home=root)
