"""Functions take what they use: a function that reads one or two config sections takes those
sections (``RolloutConfig``, ``JudgeConfig``, ...) or their values, not the whole ``ArborConfig``. The whole config
is taken only where a function reads many sections or hands the config on whole; each such place is listed here with
its reason, so a new one is a decision made in review rather than a habit."""

from __future__ import annotations

import ast

from arbor.paths import PROJECT_ROOT

FOLDERS = ("arbor", "llm", "tasks", "flows", "storage")

# "file::Qualified.name": why it takes the whole config
WHOLE_CONFIG: dict[str, str] = {
    # the config's own tools: they read or write the config as one document
    "arbor/config/resume.py::amend_config": "checks a resumed run's overrides against the stored config as a whole",
    "arbor/config/show.py::render_config": "prints every section with each value's source",
    "arbor/config/show.py::write_run_config": "writes every section beside the run's artifacts",
    # preflight: the composition root of the checks, and the checks that read three sections or more
    "arbor/preflight/__init__.py::check": "the composition root of every check (eleven sections)",
    "arbor/preflight/__init__.py::require": "check's raising form",
    "arbor/preflight/__init__.py::require_council": "council_problems' raising form, named by run.profile",
    "arbor/preflight/inputs.py::_file_inputs": "every input file of six sections",
    "arbor/preflight/__init__.py::_plugin_problems": "the plug-ins of five sections",
    "arbor/preflight/judges.py::_teacher_problems": "ARCO's warm-up: arco, judge and run",
    "arbor/preflight/inputs.py::_embedder_problems": "the embedder by method: memory, rubricem and run",
    "arbor/preflight/serving.py::store_port_problems": "every endpoint's port against the transfer store: five sections",
    # the run's dependencies: every endpoint of the judge, its roles, the council, search and rollout
    "flows/run_life.py::dependency_endpoints": "the URLs of judge, guidance, search and rollout",
    "flows/run_life.py::watch_dependencies": "hands the config to dependency_endpoints",
    "flows/run_life.py::recorded_run": "a command's run life: hands the config to watch_dependencies",
    # the environment: data sources and engines receive the run's config and hand it on
    "tasks/env/datasets.py::load_questions": "handed to a registered source (plug-in interface: Source.questions)",
    "tasks/env/search.py::corpus_path": "handed to a registered source (plug-in interface: Source.corpus)",
    "tasks/env/search.py::make_search": "handed to corpus_path's source",
    "tasks/env/world/__init__.py::_corpus": "the Source.corpus interface: a plug-in source reads its own section",
    "tasks/env/world/__init__.py::_sft_key": "the Source.key interface: a plug-in source reads its own section",
    "tasks/env/serving.py::vllm_serve_spec": "cluster, policy, rollout and run",
    "tasks/env/rollout.py::make_engine": "the engine factory: policy, rollout and search, and the engine",
    "tasks/env/rollout_driver.py::EngineBase.__init__": "the engine holds rollout, search and reward (sampling_temperature "
    "swaps its config for evaluation)",
    "tasks/env/rollout.py::TransformersEngine.__init__": "hands it to EngineBase",
    "tasks/env/rollout.py::OpenAIEngine.__init__": "hands it to EngineBase",
    # methods: a method reads run plus its own sections, and hands the config to its stages
    "tasks/methods/__init__.py::make_method": "the method constructor's caller",
    "tasks/methods/__init__.py::requirement_problems": "hands it to the method's requirement hook",
    "tasks/methods/base.py::Method.__init__": "a method constructor",
    "tasks/methods/arbor/method.py::Arbor.__init__": "a method constructor",
    "tasks/methods/arco/method.py::ARCO.__init__": "a method constructor",
    "tasks/methods/arco/rubric_model.py::RubricModelTrainer.__init__": "arco, policy, run and train; hands it to "
    "the rubric model's trainer",
    "tasks/methods/ss_grpo/method.py::SSGRPO.__init__": "a method constructor",
    "tasks/methods/coreact/generator.py::generator_config": "derives the generator's whole config from the run's",
    # training: the trainers and the SFT launch read many sections and write the config for the process group
    "tasks/training/sft.py::run_sft": "policy, rollout, run, sft and train",
    "tasks/training/sft.py::dist_timeout_s": "cluster, sft and train (the SFT launch)",
    "tasks/training/sft.py::init_group": "dist_timeout_s's caller (the SFT launch)",
    "tasks/training/sft.py::launches_process_group": "cluster, sft and train (the SFT launch)",
    "tasks/training/sft.py::launch_command": "cluster, sft and train (the SFT launch)",
    "tasks/training/train.py::Trainer.__init__": "checkpoint, policy, rollout, run and train",
    "tasks/training/trainer_service.py::TrainerService.__init__": "writes the whole config for the process group",
    "tasks/training/trainer_service.py::RemoteTrainer.__init__": "hands it to TrainerService",
    # flows: the composition roots
    "flows/sft.py::sft_key": "the SFT start's key: seven sections",
    "flows/sft.py::sft_data_path": "data, rollout, run and sft, and the data source",
    "flows/sft.py::gold_data_path": "rollout, run and sft, and hands it to the data source (Source.sft_data)",
    "flows/sft.py::sft_checkpoint": "the SFT flow's root",
    "flows/sft.py::launch_sft": "writes the whole config for the SFT process group",
    "flows/run_setup.py::start_checkpoint": "policy, rollout and run, and hands it to the SFT flow",
    "flows/run_setup.py::open_run": "the training flow's root (nine sections)",
    "flows/run_setup.py::make_trainer": "hands it to the trainer",
    "flows/run_setup.py::resolved_overrides": "reads back any dotted key a retried flow run was given",
}


def whole_config_functions() -> set[str]:
    """Every function in arbor's packages with a parameter annotated ``ArborConfig``, as "file::Qualified.name"."""
    found: set[str] = set()

    def walk(node: ast.AST, rel: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, rel, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                if any(
                    p.annotation is not None and "ArborConfig" in ast.unparse(p.annotation)
                    for p in a.posonlyargs + a.args + a.kwonlyargs
                ):
                    found.add(f"{rel}::{prefix}{child.name}")
                walk(child, rel, f"{prefix}{child.name}.")

    for folder in FOLDERS:
        for path in sorted((PROJECT_ROOT / folder).rglob("*.py")):
            walk(ast.parse(path.read_text()), path.relative_to(PROJECT_ROOT).as_posix(), "")
    return found


def test_the_whole_config_is_taken_only_where_listed() -> None:
    found = whole_config_functions()
    assert sorted(found - WHOLE_CONFIG.keys()) == [], (
        "take the sections read, or list the function with a reason"
    )
    assert sorted(WHOLE_CONFIG.keys() - found) == [], (
        "listed but no longer takes the whole config: drop the entry"
    )


def test_the_walk_finds_a_method_and_a_function() -> None:
    found = whole_config_functions()
    assert "tasks/training/train.py::Trainer.__init__" in found and "flows/run_setup.py::open_run" in found
    assert "arbor/preflight/serving.py::weight_sync_plan" not in found  # takes cluster and rollout
    assert len(found) == len(WHOLE_CONFIG) == 49
