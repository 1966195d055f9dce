"""How close legitimate judge answers come to the answer filter's thresholds.

    python bench/answer_filter.py

The legitimate answers are every text the offline judges write (the string constants of the methods' heuristics
and roles, ``tasks/methods/*/{heuristics,roles}.py``, and of the scripted OpenAI-compatible server,
``tests/openai_server.py``'s ``answer_for``). Each is held, as one field,
against every shipped prompt's template (stricter than in use: a text meets only its own role's prompt): printed
are the highest similarity to an instruction sentence (``llm.answers.near_copy``, rejected at ``NEAR_COPY``), the
texts the near-placeholder rule catches, and the texts ``find_problem`` rejects. Seconds on one core.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from arbor.llm import prompts  # noqa: E402
from arbor.llm.answers import (  # noqa: E402
    ECHO_MIN_WORDS,
    NEAR_COPY,
    _near_placeholder,
    _words,
    find_problem,
    near_copy,
    template_of,
)
from arbor.paths import PROJECT_ROOT  # noqa: E402
from arbor.tasks.methods import load_roles  # noqa: E402

SOURCES = sorted((ROOT / "tasks" / "methods").glob("*/heuristics.py")) + sorted(
    (ROOT / "tasks" / "methods").glob("*/roles.py")) + [ROOT / "tests" / "openai_server.py"]
SCRIPTED = "answer_for"  # the scripted server's answers; its other strings recognise prompts


def legitimate_texts() -> list[tuple[str, str]]:
    """(source file, text) for every string constant of two words or more (f-strings: their constant parts)."""
    out = []
    for path in SOURCES:
        tree: ast.AST = ast.parse(path.read_text(encoding="utf-8"))
        if path.name == "openai_server.py":
            tree = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == SCRIPTED)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(_words(node.value)) >= 2:
                if not set(node.value) & set("\n{}<>_=\\"):  # a docstring, prompt, key, tag or pattern: no answer
                    out.append((path.name, node.value.strip()))
    return sorted(set(out))


def main() -> None:
    load_roles()
    versions = sorted(v for v, p in prompts.PROMPT_FILES.items() if Path(p).is_relative_to(PROJECT_ROOT / "tasks"))
    templates = {v: template_of(v) for v in versions}
    texts = legitimate_texts()
    best: list[tuple[float, str, str]] = []
    for source, text in texts:
        words = _words(text)
        if len(words) >= ECHO_MIN_WORDS:
            best.append(max((near_copy(words, t.sentences), v, f"{source}: {text}") for v, t in templates.items()))
        for v, t in templates.items():
            if any(_near_placeholder(words, p) for p in t.placeholder_words):
                print(f"near placeholder ({v}): {source}: {text!r}")
            problem = find_problem({"x": text}, t, {"properties": {"x": {"type": "string"}}})
            if problem is not None and problem.reason != "same_text":
                print(f"rejected ({v}, {problem.reason}): {source}: {text!r}")
    best.sort(reverse=True)
    print(f"{len(texts)} texts, {len(best)} of {ECHO_MIN_WORDS}+ words, {len(templates)} prompts; "
          f"near-copy threshold {NEAR_COPY}; the closest:")
    for score, version, what in best[:8]:
        print(f"  {score:.3f}  {version:24s} {what[:110]}")


if __name__ == "__main__":
    main()
