"""Layered imports (issue 13 item 4): every import in arbor's packages points to its own layer or one below.

    base         config, paths, seeds, record types, and the pure protocol every layer reads: the tag format,
                 the base reward, anchor selection, group statistics
    storage      Parquet stage store, DuckDB catalog, SQL
    judges       llm/: the OpenAI-compatible and rules judges, prompts
    environment  tasks/: search, datasets, agent loop, rollout engines, policy, losses, rubric memory, shaping
    methods      tasks/methods/, the stages (tasks/step.py, tasks/stages.py), the trainers (RL, SFT), preflight
    flows        flows/: Prefect flows
    cli          arbor/cli.py

Every import statement counts, a function-level one included (no dodging a cycle by importing late).
"""

from __future__ import annotations

import ast
from pathlib import Path

from arbor.paths import PROJECT_ROOT

PACKAGES = ("arbor", "storage", "llm", "tasks", "flows")
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("arbor.config", "arbor.paths", "arbor.seeding", "tasks.types", "tasks.format", "tasks.reward",
              "tasks.induction", "tasks.group_stats")),
    ("storage", ("storage",)),
    ("judges", ("llm",)),
    ("environment", ("tasks",)),
    ("methods", ("tasks.methods", "tasks.step", "tasks.stages", "tasks.train", "tasks.trainer_service", "tasks.sft",
                 "arbor.preflight")),
    ("flows", ("flows",)),
    ("cli", ("arbor",)),
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
    parts = path.relative_to(PROJECT_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def upward_imports() -> list[str]:
    found = []
    for pkg in PACKAGES:
        for path in sorted((PROJECT_ROOT / pkg).rglob("*.py")):
            me = module_name(path)
            mine = layer_of(me)
            assert mine is not None, me
            for target in imports(path):
                theirs = layer_of(target)
                if theirs is not None and theirs > mine:
                    found.append(f"{me} ({LAYERS[mine][0]}) imports {target} ({LAYERS[theirs][0]})")
    return found


def test_layer_of_by_hand() -> None:
    assert LAYERS[layer_of("tasks.format")][0] == "base"  # type: ignore[index]
    assert LAYERS[layer_of("tasks.memory")][0] == "environment"  # type: ignore[index]
    assert LAYERS[layer_of("tasks.methods.arbor")][0] == "methods"  # type: ignore[index]
    assert LAYERS[layer_of("arbor.cli")][0] == "cli"  # type: ignore[index]
    assert layer_of("torch") is None and layer_of("tasksx") is None


def test_imports_point_downward_only() -> None:
    bad = upward_imports()
    assert not bad, "imports against the layering:\n" + "\n".join(bad)
