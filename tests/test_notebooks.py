"""The notebooks execute top to bottom on a small configuration (``PRIVAUDIT_SMALL=1``), and
are stored without outputs."""

from __future__ import annotations

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
def test_notebook_executes(path, tmp_path, monkeypatch):
    nb = nbformat.read(path, as_version=4)
    assert all(c.get("outputs", []) == [] for c in nb.cells if c.cell_type == "code"), (
        f"{path.name} is stored with outputs; clear them before committing"
    )
    monkeypatch.setenv("PRIVAUDIT_SMALL", "1")
    monkeypatch.setenv("PRIVAUDIT_COMPARE_DIR", str(tmp_path / "cmp"))
    monkeypatch.setenv("PRIVAUDIT_FRONTIER_DIR", str(tmp_path / "frontier"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, with the failing cell, on any error
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    if path.stem == "membership":  # the non-private messages give their batches away
        assert "most exposed: dsgd (no noise)" in text
    elif path.stem == "compare_defenses":
        assert "most exposed at round 2:" in text
        assert (tmp_path / "cmp" / "summary.md").exists()
        frontier = (tmp_path / "frontier" / "frontier.md").read_text()
        assert "centralised DP-SGD (opacus)" in frontier and "`dp-dpsgd-half-model`" in frontier
    else:
        assert "σ = " in text and "ε ≥ " in text and "PSNR" in text
    assert os.environ["PRIVAUDIT_SMALL"] == "1"
