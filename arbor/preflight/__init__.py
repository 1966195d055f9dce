"""Fail at once, saying what is missing, when a profile is started where something it needs is not there.

A qwen3 profile needs: the policy weights (a local path, or a Hub id: downloaded at run time unless the environment
keeps the Hub offline with HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE, when it must already be in the local Hugging Face
cache), enough GPUs for rollouts + training, a judge endpoint and
its API key variable (and those of roles with an endpoint or key of their own), the search backend's endpoint / key,
vLLM when the flow manages `vllm serve`, the embedding model its method loads, and a start checkpoint trained in the
run's own tag protocol. A question set on the Hub (``data.train`` / ``data.eval`` = ``hf:...``) is checked the same
way, and read with the field mapping when it is cached.
"""

from __future__ import annotations

import os
import shutil

from arbor.config import ArborConfig
from arbor.config.inputs import find_input, is_named_set, is_relative_input, missing_input_message
from arbor.paths import resolve_home_path, vllm_command
from arbor.preflight.inputs import (
    _embedder_problems,
    _file_inputs,
    _hub_data_problems,
    _model_problem,
    start_protocol_problems,
)
from arbor.preflight.judges import (
    _judge_role_problems,
    _teacher_problems,
    council_problems,
    endpoint_problems,
    guidance_problems,
    judge_endpoint,
    judge_urls,
    judge_window_problems,
)
from arbor.preflight.serving import (
    _gpu_count,
    store_port_problems,
    vllm_missing_message,
    vllm_version_problems,
    weight_sync_problems,
)


class PreflightError(RuntimeError):
    """Something a profile needs is missing; the message lists every missing thing."""


def _plugin_problems(cfg: ArborConfig) -> list[str]:
    """Import and shape-check every plug-in the config names; nothing is imported otherwise."""
    from arbor.plugins import PluginError, is_import_path

    out: list[str] = []
    checks = []
    if cfg.reward.fn:
        from arbor.reward import load_reward_fn

        checks.append(lambda: load_reward_fn(cfg.reward))
    if is_import_path(cfg.search.backend):
        from arbor.tasks.env.search import load_search_plugin

        checks.append(lambda: load_search_plugin(cfg.search.backend))
    if is_import_path(cfg.judge.backend):
        from arbor.llm import load_judge_plugin

        checks.append(lambda: load_judge_plugin(cfg.judge.backend))
    named = [s for s in (cfg.data.train, *cfg.data.eval_sets(), cfg.search.corpus, cfg.sft.data)
             if s and is_named_set(s)]
    if named:  # a data source's module (tasks.env.sources), imported as the run will
        from arbor.tasks.env.sources import find_source

        checks += [lambda s=s: find_source(s.removeprefix("synth:").partition(":")[0]) for s in named]
    for load in checks:
        try:
            load()
        except PluginError as e:
            out.append(str(e))
    return out


def check(cfg: ArborConfig, *, gpu_count: int | None = None, env: dict[str, str] | None = None) -> list[str]:
    """Everything missing for ``cfg`` on this machine (empty list: good to go)."""
    env = dict(os.environ) if env is None else env
    missing: list[str] = _file_inputs(cfg)
    from arbor.tasks.methods import (  # only when a run is checked: the CLI's refusals stay fast
        MethodError,
        check_method,
        requirement_problems,
    )

    try:
        check_method(cfg.run.method)
        missing += requirement_problems(cfg)
    except MethodError as e:
        missing.append(str(e))
    missing += _plugin_problems(cfg)
    missing += _teacher_problems(cfg)
    missing += guidance_problems(cfg.guidance, cfg.judge)
    if problem := _model_problem(cfg.policy.model, "policy.model"):
        missing.append(f"{problem} (or --set policy.model=/path/to/the/model)")
    missing += _hub_data_problems(cfg.data, cfg.run)
    start = cfg.run.start_checkpoint
    if start and not cfg.run.sft_warm_start and not resolve_home_path(start).exists():
        missing.append(f"run.start_checkpoint: '{start}' does not exist, not as {resolve_home_path(start)} either "
                       "(relative paths are under ARBOR_HOME; run arbor-sft first, or set run.sft_warm_start)")
    missing += start_protocol_problems(cfg.run, cfg.sft, cfg.rollout.protocol)
    missing += _embedder_problems(cfg)
    need = len(set(cfg.cluster.rollout_gpus) | set(cfg.cluster.train_gpus))
    have = (_gpu_count() if gpu_count is None else gpu_count) if need else 0  # torch only when GPUs are needed
    gpus_missing = bool(need and have < need and not cfg.train.hostfile)
    if gpus_missing:
        missing.append(
            f"cluster: the profile places rollouts on GPUs {cfg.cluster.rollout_gpus} and training on "
            f"{cfg.cluster.train_gpus} ({need} GPUs) but this machine has {have}"
        )
    probes = endpoint_problems(judge_urls(cfg.judge, env))  # every judge endpoint at once
    if cfg.judge.backend == "openai":
        url = judge_endpoint(cfg.judge.base_url, env)
        if problem := probes[url]:
            unset = "" if cfg.judge.base_url else (" (judge.base_url is unset: OPENAI_BASE_URL, else the OpenAI "
                                                   "client's default)")
            missing.append(f"judge.base_url: {problem}{unset} (start the judge's server, e.g. `arbor judge serve`, "
                           "or fix the URL)")
        if not env.get(cfg.judge.api_key_env):
            missing.append(f"judge.api_key_env: environment variable {cfg.judge.api_key_env} is not set")
    missing += _judge_role_problems(cfg.judge, env, probes)
    missing += judge_window_problems(cfg.judge, cfg.rollout, cfg.run.method)
    if cfg.search.backend == "http" and not cfg.search.url:
        missing.append("search.url: the http search backend needs a retriever URL (Search-R1 /retrieve)")
    if cfg.search.backend == "web":
        if not cfg.search.url:
            missing.append("search.url: the web search backend needs an API endpoint URL")
        if not env.get(cfg.search.api_key_env):
            missing.append(f"search.api_key_env: environment variable {cfg.search.api_key_env} is not set")
    if cfg.rollout.engine == "openai":
        vllm = cfg.cluster.vllm_executable
        if is_relative_input("cluster.vllm_executable", vllm):  # a path: the cwd's, else ARBOR_HOME's
            vllm = str(find_input("cluster.vllm_executable", vllm) or vllm)
        vllm = vllm_command(vllm)  # `vllm` off PATH: the checkout's .venv-vllm, as the flow starts it
        if cfg.cluster.manage_vllm and shutil.which(vllm) is None:
            if is_relative_input("cluster.vllm_executable", vllm):
                missing.append(missing_input_message("cluster.vllm_executable", vllm) + " (make vllm-env prints it)")
            elif vllm == "vllm":
                missing.append(vllm_missing_message())
            else:
                missing.append(f"cluster.vllm_executable: the flow manages `vllm serve` but {vllm!r} "
                               "is not an executable here (make vllm-env, docs/gpu.md)")
        elif cfg.cluster.manage_vllm:
            missing += vllm_version_problems(vllm, cpu=not cfg.cluster.rollout_gpus, weight_sync=cfg.cluster.weight_sync,
                                             gpus_missing=gpus_missing)
        missing += weight_sync_problems(cfg.cluster)
        missing += store_port_problems(cfg)
        if not cfg.cluster.manage_vllm and not cfg.rollout.base_url:
            missing.append("rollout.base_url: an external completions server URL is needed when cluster.manage_vllm=false")
    return missing


def require(cfg: ArborConfig, **kw: object) -> None:
    """Raise ``PreflightError`` listing every missing thing (one line: items separated by "; ")."""
    missing = check(cfg, **kw)  # type: ignore[arg-type]
    if missing:
        raise PreflightError(f"profile '{cfg.run.profile}' cannot start here: {'; '.join(missing)}")


def require_council(cfg: ArborConfig, env: dict[str, str] | None = None) -> None:
    """Raise ``PreflightError`` listing every council problem (``council_problems``)."""
    if problems := council_problems(cfg.guidance, cfg.judge, env):
        raise PreflightError(f"profile '{cfg.run.profile}': the ranking council cannot start: {'; '.join(problems)}")
