"""Co-ReAct's ranking council (paper §3.1, App. A): J judges, each its own endpoint, key and model.

Pure config work, shared by preflight (a missing key is refused before the run row exists) and the
``arbor-guidance-train`` flow (which builds the judges)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from arbor.config import GuidanceConfig, JudgeConfig
    from arbor.config.guidance import RankJudgeConfig


def rank_judge_names(guidance: GuidanceConfig, judge: JudgeConfig) -> list[str]:
    """What each judge of ``guidance.rank_judges`` is stored under (``branch_points.judge_ranks``; it also seeds
    the judge's label shuffle): its ``name``, else its model (the judge's rank_actions role's when unset); offline
    (judge.backend=rules) ``rules-1``, ``rules-2``, ... (``rules`` alone). ValueError naming the key on a clash."""
    entries = guidance.rank_judges
    names = []
    for i, e in enumerate(entries):
        if e.name:
            names.append(e.name)
        elif judge.backend == "rules":
            names.append("rules" if len(entries) == 1 else f"rules-{i + 1}")
        else:
            names.append(str(e.model or judge.for_role("rank_actions")["model"]))
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise ValueError(f"guidance.rank_judges: more than one judge would be stored as {clash[0]!r}; give each a "
                         "distinct name (guidance.rank_judges[i].name) or model")
    return names


def rank_judge_config(judge_cfg: JudgeConfig, entry: RankJudgeConfig) -> JudgeConfig:
    """The judge config of one council member: the ``rank_actions`` role with the entry's set fields (model,
    base_url, api_key_env, temperature, max_tokens, prices) over it. The offline rules judge has no endpoint: its
    config is the judge's own."""
    if judge_cfg.backend == "rules":
        return judge_cfg
    from arbor.config.judge import JudgeRoleConfig

    over = {k: getattr(entry, k) for k in JudgeRoleConfig.model_fields if getattr(entry, k) is not None}
    role = judge_cfg.roles.rank_actions.model_copy(update=over)
    return judge_cfg.model_copy(update={"roles": judge_cfg.roles.model_copy(update={"rank_actions": role})})


def council_key_problems(guidance: GuidanceConfig, judge: JudgeConfig, env: Mapping[str, str]) -> list[str]:
    """One line per council member whose key variable is unset in ``env``, naming the config key that chose it
    (the entry's, the rank_actions role's or the judge's). The key itself is only ever read by the client."""
    out = []
    for i, (name, entry) in enumerate(zip(rank_judge_names(guidance, judge), guidance.rank_judges, strict=True)):
        jc = rank_judge_config(judge, entry)
        if jc.backend != "openai":
            continue
        var = str(jc.for_role("rank_actions")["api_key_env"])
        if not env.get(var):
            where = (f"guidance.rank_judges.{i}.api_key_env" if entry.api_key_env else
                     "judge.roles.rank_actions.api_key_env" if judge.roles.rank_actions.api_key_env
                     else "judge.api_key_env")
            out.append(f"{where}: environment variable {var!r} is not set (the key of rank judge {name!r}; the "
                       "paper's council needs one key per vendor, or set guidance.rank_judges)")
    return out
