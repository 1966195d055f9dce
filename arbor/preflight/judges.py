"""The judges a run asks, checked before it starts: every endpoint answering, every role's key set, a window that
holds the trajectories a prompt shows, what Co-ReAct guidance and its ranking council need."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from arbor.config import ArborConfig, GuidanceConfig, JudgeConfig, RolloutConfig
from arbor.paths import resolve_home_path
from arbor.preflight.inputs import _model_available

if TYPE_CHECKING:
    from arbor.llm import Role


def judge_urls(judge: JudgeConfig, env: dict[str, str]) -> list[str]:
    """Every endpoint an openai judge sends to: ``judge.base_url`` (or the client's fallback) and each role's own
    ``judge.roles.<role>.base_url``, once each, in order."""
    if judge.backend != "openai":
        return []
    urls = [judge_endpoint(judge.base_url, env)]
    urls += [over.base_url for _, over in judge.roles if over.base_url]
    return list(dict.fromkeys(urls))


def _judge_role_problems(judge: JudgeConfig, env: dict[str, str], probes: dict[str, str | None]) -> list[str]:
    """Roles sent to an endpoint or with a key of their own (``judge.roles.<role>.base_url`` / ``api_key_env``,
    e.g. a profile's local verifier or teacher): the openai judge reads every role's key when it is built.
    ``probes``: ``endpoint_problems`` of ``judge_urls``."""
    if judge.backend != "openai":
        return []
    out: list[str] = []
    seen_urls = {judge_endpoint(judge.base_url, env)}
    for role, over in judge.roles:
        if over.api_key_env and over.api_key_env != judge.api_key_env and not env.get(over.api_key_env):
            out.append(f"judge.roles.{role}.api_key_env: environment variable {over.api_key_env} is not set")
        if over.base_url and over.base_url not in seen_urls:
            seen_urls.add(over.base_url)
            if problem := probes[over.base_url]:
                out.append(f"judge.roles.{role}.base_url: {problem} (start that role's server, or fix the URL)")
    return out


# what a judge prompt carries besides its template and its trajectories (the question, gold answers, the rubric or
# the memory's existing rubrics): unknown before the run, bounded generously for search QA
PROMPT_TEXT_ALLOWANCE = 2048


def judge_shares(judge: JudgeConfig, rollout: RolloutConfig, method: str) -> dict[str, tuple[int, int, int]]:
    """The judge prompts of ``method`` (``run.method``) that show trajectories (ARBOR: E.1's two contrast pairs,
    four slots, and A.1's unlabeled group of up to K; E.3's two responses; RaR: one), each as (trajectories shown,
    the equal share of ``judge.context_tokens`` each keeps when all are as long as they can be, the reply's tokens).
    Empty without a window. The prompt's own words are measured by rendering it with empty trajectories, plus
    ``PROMPT_TEXT_ALLOWANCE``."""
    # the roles whose prompts are sized (their packages load the method itself lazily: no torch here)
    from arbor.llm.text import WHOLE, shared_budget
    from arbor.tasks.methods.arbor.roles import INDUCTION, PAIRWISE
    from arbor.tasks.methods.rar.roles import RAR_RATE
    from arbor.types import Rubric, Trajectory

    window = judge.context_tokens
    if window is None:
        return {}
    k = rollout.k
    blank = [Trajectory("", 0, 0, i, "", "", [], format_valid=True) for i in range(k)]
    rubric = Rubric("", "", "", "")
    asks: dict[str, tuple[Role[Any, Any], int, dict[str, object]]] = {}
    if method == "arbor":
        contrast = {"mode": "contrast", "positive": 0, "worst": 1, "hard": 2}
        asks["pairwise"] = (PAIRWISE, 2, dict(question="", shown_a=blank[0], shown_b=blank[1], rubric=rubric))
        asks["induction"] = (INDUCTION, 4, dict(question="", golds=[""], trajectories=blank[:3],
                                                  anchors=contrast, existing=[]))
        asks["induction (unlabeled)"] = (INDUCTION, k, dict(question="", golds=[""], trajectories=blank,
                                                              anchors={"mode": "unlabeled"}, existing=[]))
    elif method == "rar":
        asks["rar_rate"] = (RAR_RATE, 1, dict(question="", trajectory=blank[0], items=[""]))
    out: dict[str, tuple[int, int, int]] = {}
    for label, (role, texts, fields) in asks.items():
        own = sum(len(m["content"]) for m in role.render(role.request(**fields), WHOLE)[1]) // 4
        reply = int(judge.for_role(role.name)["max_tokens"])  # type: ignore[call-overload]
        out[label] = (texts, shared_budget(window, reply, own + PROMPT_TEXT_ALLOWANCE, texts), reply)
    return out


def judge_window_problems(judge: JudgeConfig, rollout: RolloutConfig, method: str) -> list[str]:
    """``judge.max_judge_tokens: null`` (trajectories whole, App. E.1 / E.3): the window must at least hold every
    trajectory's own reasoning, queries and answer with its results elided (``llm.text.min_judge_budget``) when
    all that a prompt shows are as long as the rollout allows; otherwise the judge would be shown cut reasoning."""
    if judge.backend != "openai" or judge.max_judge_tokens is not None:
        return []
    from arbor.llm.text import min_judge_budget

    r = rollout
    need = min_judge_budget(r.max_response_tokens, max(r.max_searches, r.max_turns - 1))
    return [f"judge.context_tokens={judge.context_tokens}: {role} shows {texts} trajectories, ~{share} tokens "
            f"each once the prompt and the reply ({reply}) are set aside, less than the {need} that a whole "
            f"response's reasoning, queries and answer need with its results elided (rollout.max_response_tokens "
            f"{r.max_response_tokens}); use a judge with a larger window, or set a cap judge.max_judge_tokens to "
            "accept compaction past the results"
            for role, (texts, share, reply) in judge_shares(judge, rollout, method).items() if share < need]


def _teacher_problems(cfg: ArborConfig) -> list[str]:
    """ARCO's teacher warm-up calls the judge's ``step_labels`` role: a plug-in judge must take it (``answers``)."""
    from arbor.plugins import PluginError, is_import_path

    if cfg.run.method != "arco" or cfg.arco.warmup(cfg.run.steps) == 0 or not is_import_path(cfg.judge.backend):
        return []
    from arbor.llm import load_judge_plugin

    try:
        cls = load_judge_plugin(cfg.judge.backend)
    except PluginError:
        return []  # reported by _plugin_problems
    if not cls.takes("step_labels"):
        return [f"judge.backend: {cfg.judge.backend} has no step_labels role, which run.method=arco's teacher "
                "warm-up calls (implement it, or set arco.warmup_steps=0)"]
    return []


def guidance_problems(guidance: GuidanceConfig, judge: JudgeConfig) -> list[str]:
    """Co-ReAct guidance (guidance.mode=co-react): its rubric source must exist, and a plug-in judge must have the
    roles it calls (step_rubric for source=judge, step_verify to verify)."""
    from arbor.plugins import PluginError, is_import_path

    g = guidance
    if g.mode == "off":
        return []
    out = []
    if g.source == "memory" and not (g.memory_pool and resolve_home_path(g.memory_pool).is_file()):
        out.append(f"guidance.memory_pool: source=memory needs an exported pool file (arbor rubrics export RUN), "
                   f"got {g.memory_pool!r}")
    if g.source == "generator" and not (g.generator and (resolve_home_path(g.generator).exists()
                                                         or _model_available(g.generator))):
        out.append(f"guidance.generator: source=generator needs a generator checkpoint (arbor guidance-train), "
                   f"got {g.generator!r}")
    if is_import_path(judge.backend):
        from arbor.llm import load_judge_plugin

        try:
            cls = load_judge_plugin(judge.backend)
        except PluginError:
            return out  # reported by _plugin_problems
        needed = (["step_rubric"] if g.source == "judge" else []) + (["step_verify"] if g.verify else [])
        out += [f"judge.backend: {judge.backend} has no {role} role, which guidance.mode=co-react calls"
                for role in needed if not cls.takes(role)]
    return out


def council_problems(guidance: GuidanceConfig, judge: JudgeConfig, env: dict[str, str] | None = None) -> list[str]:
    """``arbor guidance-train``'s ranking council (Co-ReAct §3.1): distinct names, every member's key variable set
    and every member's endpoint answering, checked before the run row is written."""
    from arbor.tasks.methods.coreact.council import council_key_problems, rank_judge_config

    env = dict(os.environ) if env is None else env
    try:
        out = council_key_problems(guidance, judge, env)
    except ValueError as e:  # two members stored under one name
        return [str(e)]
    first: dict[str, str] = {}  # each endpoint once, named by the first member that uses it
    for i, entry in enumerate(guidance.rank_judges):
        jc = rank_judge_config(judge, entry)
        url = str(jc.for_role("rank_actions")["base_url"] or "") if jc.backend == "openai" else ""
        if url and url not in first:
            first[url] = f"guidance.rank_judges.{i}.base_url" if entry.base_url else "judge.base_url"
    for url, problem in endpoint_problems(first).items():
        if problem:
            out.append(f"{first[url]}: {problem} (start that judge's server, or fix the URL)")
    return out


# The OpenAI client's own endpoint when it is given none and OPENAI_BASE_URL is unset (openai 3.54,
# lib/_client_auth.py: ``base_url = os.environ.get("OPENAI_BASE_URL")``, then ``"https://api.openai.com/v1"``)
OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"


def judge_endpoint(base_url: str | None, env: dict[str, str]) -> str:
    """Where an openai judge with ``judge.base_url`` = ``base_url`` sends its requests: the URL when set, else
    what the OpenAI client itself falls back to (``OPENAI_BASE_URL``, then OpenAI's API)."""
    return base_url or env.get("OPENAI_BASE_URL") or OPENAI_DEFAULT_BASE_URL


def endpoint_problem(url: str, timeout_s: float = 5.0) -> str | None:
    """Why nothing can answer at ``url`` (no host and port, a name that does not resolve, a refused or timed-out
    TCP connection), or None. Only the connection is tried: what the server says is the judge's business (a dead judge
    endpoint once ran the flow for 36 s and ended in a traceback)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return f"{url} has no valid port"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url} is not an http(s) URL"
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return None
    except OSError as e:
        return f"nothing answers at {url} ({e.strerror or type(e).__name__})"


def endpoint_problems(urls: Iterable[str], timeout_s: float = 5.0) -> dict[str, str | None]:
    """``endpoint_problem`` of each URL, probed side by side: a check waits for its slowest endpoint, not for the
    sum of them (a profile names up to five, and an unreachable one costs the whole timeout)."""
    from concurrent.futures import ThreadPoolExecutor

    urls = list(dict.fromkeys(urls))
    if len(urls) < 2:
        return {url: endpoint_problem(url, timeout_s) for url in urls}
    with ThreadPoolExecutor(max_workers=len(urls), thread_name_prefix="arbor-probe") as pool:
        return dict(zip(urls, pool.map(lambda u: endpoint_problem(u, timeout_s), urls), strict=True))
