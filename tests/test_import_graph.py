"""No import circle among arbor's modules: every import statement is an edge, a function-level
one included, so a late import does not hide a circle; tests/test_layers.py checks the layering, this the cycles."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

from test_layers import PACKAGES, module_name

from arbor.paths import PROJECT_ROOT


def module_files() -> dict[str, Path]:
    """Every arbor module (import name -> source file)."""
    return {module_name(p): p for folder in PACKAGES for p in sorted((PROJECT_ROOT / folder).rglob("*.py"))}


def imported_modules(path: Path, me: str, known: Iterable[str]) -> set[str]:
    """The arbor modules that ``path`` (module ``me``) imports: ``from X import Y`` is module ``X.Y`` when that is a
    module, else ``X``; relative imports are resolved from ``me``'s package."""
    known = set(known)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {m for m in out if m in known}


def import_graph() -> dict[str, set[str]]:
    """module -> the arbor modules it imports, without edges to its own ancestor packages (always imported first)."""
    files = module_files()
    return {me: {t for t in imported_modules(p, me, files) if t != me and not me.startswith(t + ".")}
            for me, p in files.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one node (or a self-loop): the import circles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_strongly_connected_by_hand() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}  # a -> b -> c -> a, and c -> d outside it
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set(), "c": {"a"}, "d": {"c"}}) == []


def test_imports_resolve_modules_and_skip_ancestors() -> None:
    graph = import_graph()
    assert "arbor.tasks.env.datasets" in graph["arbor.preflight.inputs"]  # a function-level import counts
    assert "arbor.config.base" in graph["arbor.plugins"]  # `from arbor.config.base import X`: the module
    assert not any(me.startswith(t + ".") for me, ts in graph.items() for t in ts)  # no edge to an ancestor


def test_no_import_circles() -> None:
    circles = strongly_connected(import_graph())
    assert not circles, "import circles (every import counts, function-level ones too):\n" + "\n".join(
        " <-> ".join(c) for c in circles)
