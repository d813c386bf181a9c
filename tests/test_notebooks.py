"""The notebooks execute top to bottom, offline, on the bundled photos dataset and are stored
without outputs.

The tests run them in their small configuration (``PRIVAUDIT_SMALL=1``): the same cells and the
same calls as the full one, with fewer targets, agents, rounds and iterations. The full
configuration (the CLI's defaults; several minutes for ``membership`` and ``api_walkthrough``,
much longer for ``compare_defenses``, whose full frontier trains every defense at five ε) is
too long for the suite. Run a notebook in full, without ``PRIVAUDIT_SMALL``, with nbclient's
runner (the dev extra; outputs under ``notebooks/privaudit-out``, git-ignored)::

    jupyter-execute --timeout=-1 notebooks/compare_defenses.ipynb

or open it in Jupyter. ``PRIVAUDIT_DATA_ROOT=DIR``, a folder holding ``MNIST/``, switches
``compare_defenses`` to MNIST."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[dev]' (nbformat)")
nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[dev]' (nbclient)")
pytest.importorskip("ipykernel", reason="pip install -e '.[dev]' (ipykernel)")

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))


def test_the_notebooks_are_there():
    names = {"compare_defenses.ipynb", "api_walkthrough.ipynb", "membership.ipynb"}
    assert {p.name for p in NOTEBOOKS} >= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_notebooks_use_public_names(path):
    """A notebook is what a user copies: no private name of privaudit, nothing of the CLI."""
    nb = nbformat.read(path, as_version=4)
    bad = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("privaudit"):
                names = [a.name for a in node.names]
                parts = node.module.split(".") + names
                if "cli" in parts or any(p.startswith("_") for p in parts):
                    bad.append(f"from {node.module} import {', '.join(names)}")
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
                bad.append(ast.unparse(node))
    assert bad == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, tmp_path, monkeypatch):
    nb = nbformat.read(path, as_version=4)
    assert all(c.get("outputs", []) == [] for c in nb.cells if c.cell_type == "code"), (
        f"{path.name} is stored with outputs; clear them before committing"
    )
    monkeypatch.setenv("PRIVAUDIT_SMALL", "1")
    monkeypatch.delenv("PRIVAUDIT_DATA_ROOT", raising=False)  # offline: the bundled photos
    monkeypatch.setenv("PRIVAUDIT_COMPARE_DIR", str(tmp_path / "cmp"))
    monkeypatch.setenv("PRIVAUDIT_FRONTIER_DIR", str(tmp_path / "frontier"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, with the failing cell, on any error
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs)
    if path.stem == "membership":  # the non-private messages give their batches away
        assert "most exposed: dsgd (no noise)" in text
        # one ROC figure overlays the three runs (not a figure per run)
        assert sum("image/png" in o.get("data", {}) for o in outputs) == 1
        assert "dp-dpsgd σ = 2: membership advantage" in text
    elif path.stem == "compare_defenses":
        assert "most exposed at round 2:" in text
        assert (tmp_path / "cmp" / "summary.md").exists()
        frontier = (tmp_path / "frontier" / "frontier.md").read_text()
        assert "centralised DP-SGD (opacus)" in frontier and "`dp-dpsgd-half-model`" in frontier
        runs = [p for p in (tmp_path / "frontier" / "runs").iterdir() if p.is_dir()]
        assert runs and all('"dataset": "photos"' in (p / "config.json").read_text() for p in runs)
    else:
        assert "σ = " in text and "ε ≥ " in text and "PSNR" in text
    assert os.environ["PRIVAUDIT_SMALL"] == "1"
