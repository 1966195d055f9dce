"""Layered imports: every import in arbor's packages points to its own layer or one below.

    base         arbor/: config, paths, seeds, record types (arbor.types), and the pure protocol every layer
                 reads: the tag format (arbor.format), the base reward (arbor.reward), group statistics
    storage      Parquet stage store, DuckDB catalog, SQL
    judges       llm/: the judge machinery only (roles registry, the OpenAI-compatible and rules backends, prompt
                 files, structured outputs, cache, streaming, compaction); it imports nothing from tasks/
    environment  tasks/env/: search, datasets and sources, agent loop, rollout engines, policy loading; and the
                 shared pieces left in tasks/: the stage store (stages.py), shaping, reflection
    training     tasks/training/: the update a controller decides, losses, the trainers (RL, SFT) and the
                 trainer service, checkpoints, weight sync: pure update workers that know no method
    reporting    tasks/reporting/: evaluation, the run report, learning curves, trackers
    methods      tasks/methods/ (each method's package: ARBOR's memory and judging, ARCO's rubric model, ..., and
                 the judge roles it asks: prompts, schemas, parsers, offline heuristics),
                 the step's stages (tasks/step.py), preflight
    flows        flows/: Prefect flows
    cli          arbor/cli/

Every import statement counts, a function-level one included (no dodging a cycle by importing late).
"""

from __future__ import annotations

import ast
from pathlib import Path

from arbor.paths import PROJECT_ROOT

# source folder -> import name (pyproject.toml's package-dir: one ``arbor`` namespace)
PACKAGES = {"arbor": "arbor", "storage": "arbor.storage", "llm": "arbor.llm", "tasks": "arbor.tasks",
            "flows": "arbor.flows"}
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("arbor", "arbor.config", "arbor.paths", "arbor.seeding", "arbor.types", "arbor.format",
              "arbor.reward", "arbor.group_stats")),
    ("storage", ("arbor.storage",)),
    ("judges", ("arbor.llm",)),
    ("environment", ("arbor.tasks",)),
    ("training", ("arbor.tasks.training",)),
    ("reporting", ("arbor.tasks.reporting",)),
    ("methods", ("arbor.tasks.methods", "arbor.tasks.step", "arbor.preflight")),
    ("flows", ("arbor.flows",)),
    ("cli", ("arbor.cli",)),
]


def layer_of(module: str) -> int | None:
    """The layer of the longest matching prefix (None: not one of arbor's modules)."""
    best: tuple[int, int] | None = None
    for i, (_name, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return None if best is None else best[0]


def imports(path: Path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return out


def module_name(path: Path) -> str:
    folder, *parts = path.relative_to(PROJECT_ROOT).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join([PACKAGES[folder], *parts])


def upward_imports() -> list[str]:
    found = []
    for pkg in PACKAGES:  # source folders
        for path in sorted((PROJECT_ROOT / pkg).rglob("*.py")):
            me = module_name(path)
            mine = layer_of(me)
            assert mine is not None, me
            for target in imports(path):
                if target.split(".")[0] in PACKAGES and target.split(".")[0] != "arbor":
                    found.append(f"{me} imports {target} by its source folder: installed, only arbor.* exists")
                theirs = layer_of(target)
                if theirs is not None and theirs > mine:
                    found.append(f"{me} ({LAYERS[mine][0]}) imports {target} ({LAYERS[theirs][0]})")
    return found


def test_layer_of_by_hand() -> None:
    assert LAYERS[layer_of("arbor.format")][0] == "base"  # type: ignore[index]
    assert LAYERS[layer_of("arbor.tasks.env.world")][0] == "environment"  # type: ignore[index]
    assert LAYERS[layer_of("arbor.tasks.methods.arbor.memory")][0] == "methods"  # type: ignore[index]
    assert LAYERS[layer_of("arbor.tasks.training.losses")][0] == "training"  # type: ignore[index]
    assert LAYERS[layer_of("arbor.tasks.reporting.report")][0] == "reporting"  # type: ignore[index]
    assert LAYERS[layer_of("arbor.tasks.methods.arbor")][0] == "methods"  # type: ignore[index]
    assert LAYERS[layer_of("arbor.tasks.training.trainer_service")][0] == "training"  # type: ignore[index]
    assert LAYERS[layer_of("arbor.cli")][0] == "cli"  # type: ignore[index]
    assert layer_of("torch") is None and layer_of("tasks.format") is None  # source folder names are not modules


def test_imports_point_downward_only() -> None:
    bad = upward_imports()
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_the_judge_machinery_imports_no_task() -> None:
    """No module under llm/ imports arbor.tasks, a function-level import included (the roles it
    answers are declared by the methods, which import llm/, never the other way)."""
    bad = [f"{module_name(path)} imports {target}" for path in sorted((PROJECT_ROOT / "llm").rglob("*.py"))
           for target in imports(path) if target == "arbor.tasks" or target.startswith("arbor.tasks.")]
    assert not bad, "\n".join(bad)
