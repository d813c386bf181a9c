"""The code base stays ruff-clean (ruff is in the dev extra)."""

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    shutil.which("ruff") is None, reason="ruff not installed (pip install -e .[dev])"
)
def test_ruff_clean():
    proc = subprocess.run(["ruff", "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _project_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / f for f in listed if f.endswith((".py", ".md", ".ipynb", ".toml"))]


def test_no_reference_to_files_users_do_not_have():
    """The project is complete on its own: no pointer to the developers' design notes or
    source papers folder."""
    pattern = re.compile(r"DESIGN\.md|\bseeds/|\bnotes/|\.\./shared")
    hits = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in _project_files()
        if p.exists() and p.name != "test_lint.py"
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


TIMING = re.compile(r"\d(\.\d+)? ?(ms|µs)\b|\d(\.\d+)?× (faster|slower)|\d+(\.\d+)? s on \d")


def test_docstrings_hold_no_measured_timings():
    """Docstrings say what and why; measurements live in benchmark output and the README."""
    hits = []
    for p in _project_files():
        if p.suffix != ".py" or not p.exists() or p.parts[len(ROOT.parts)] in ("tests",):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node) or ""
                if TIMING.search(doc):
                    hits.append(f"{p.relative_to(ROOT)}: {getattr(node, 'name', 'module')}")
    assert hits == []
