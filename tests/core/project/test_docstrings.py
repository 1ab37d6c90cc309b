"""The suite reads as its own documentation: every test module says what it covers, and every
test says, in its docstring, the behaviour it pins down (read with ``ast``, nothing imported)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]


def _test_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def test_every_test_module_has_a_docstring() -> None:
    """Each tests/**/test_*.py opens with a docstring."""
    missing = [str(p.relative_to(TESTS)) for p in _test_files() if not ast.get_docstring(ast.parse(p.read_text()))]
    assert len(_test_files()) > 30 and missing == []


def test_every_test_has_a_docstring() -> None:
    """Each test function (and test method) has a docstring saying what it checks."""
    missing = []
    for path in _test_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                if not ast.get_docstring(node):
                    missing.append(f"{path.relative_to(TESTS)}:{node.lineno} {node.name}")
    assert missing == []
