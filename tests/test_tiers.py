"""The test tiers stay honest (:mod:`tiers`): every ``slow`` entry names a test that exists,
and every package module a test imports is imported by a test file the fast tier runs."""

from __future__ import annotations

import ast
from pathlib import Path

from tiers import SLOW

TESTS = Path(__file__).resolve().parent


def functions(path: Path) -> set[str]:
    """The test functions defined at the top of ``path`` or in its classes."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            found.add(node.name)
    return found


def imported(path: Path) -> set[str]:
    """The privaudit modules ``path`` imports by name (``from privaudit.x import y`` counts
    ``privaudit.x`` and ``privaudit.x.y`` where that is a module)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("privaudit"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("privaudit"))
    return found


def test_every_slow_entry_names_a_test_that_exists():
    for entry in SLOW:
        file, _, name = entry.partition("::")
        assert (TESTS / file).is_file(), f"{entry}: no such test file"
        if name:
            assert name in functions(TESTS / file), f"{entry}: no such test"


def test_the_fast_tier_imports_every_module_the_tests_import():
    files = sorted(TESTS.glob("test_*.py"))
    fast = [f for f in files if any(f"{f.name}::{n}" not in SLOW for n in functions(f))]
    fast = [f for f in fast if f.name not in SLOW]
    assert len(fast) > len(files) // 2
    everywhere = set().union(*(imported(f) for f in files))
    in_fast = set().union(*(imported(f) for f in fast))
    missing = sorted(everywhere - in_fast)
    assert not missing, f"modules only slow test files import: {missing}"
