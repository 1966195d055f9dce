"""A test's assert must not pass because nothing ran: an assert under an ``if`` inside a loop is checked only for the
rows that reach it, so such a branch counts what it checked (an augmented assignment, asserted after the loop), or
the rows are selected first and asserted to exist (``rows = [...]; assert rows and all(...)``)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def skippable_asserts(source: str) -> list[int]:
    """Lines of ``if`` statements (no ``else``, no ``continue`` / ``break``) inside a ``for`` loop of a test function
    whose body asserts without counting."""
    lines: list[int] = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef) or not fn.name.startswith("test"):
            continue
        for loop in (n for n in ast.walk(fn) if isinstance(n, ast.For)):
            for node in ast.walk(loop):
                if not isinstance(node, ast.If) or node.orelse:
                    continue
                inside = [x for b in node.body for x in ast.walk(b)]
                if any(isinstance(x, ast.Assert) for x in inside) and not any(
                        isinstance(x, ast.Continue | ast.Break | ast.AugAssign) for x in inside):
                    lines.append(node.lineno)
    return sorted(set(lines))


def test_the_checker_finds_an_uncounted_branch_and_accepts_a_counted_one() -> None:
    bad = "def test_x(rows):\n    for r in rows:\n        if r.kind == 'a':\n            assert r.ok\n"
    counted = ("def test_x(rows):\n    n = 0\n    for r in rows:\n        if r.kind == 'a':\n            n += 1\n"
               "            assert r.ok\n    assert n\n")
    selected = "def test_x(rows):\n    a = [r for r in rows if r.kind == 'a']\n    assert a and all(r.ok for r in a)\n"
    assert skippable_asserts(bad) == [3] and skippable_asserts(counted) == [] and skippable_asserts(selected) == []


def test_no_test_asserts_only_on_rows_that_may_not_exist() -> None:
    found = {p.name: lines for p in sorted(TESTS.glob("test_*.py"))
             if (lines := skippable_asserts(p.read_text(encoding="utf-8")))}
    assert found == {}, f"asserts under an uncounted if in a loop (file: lines): {found}"
