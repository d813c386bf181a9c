"""Every JSON privaudit writes is strict (RFC 8259: no ``Infinity`` or ``NaN`` literals), in
one convention (:mod:`privaudit.core.files`): a non-finite float is the string "inf", "-inf"
or "nan", and privaudit's readers of its own files map it back to the float."""

from __future__ import annotations

import ast
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli, tiny

from privaudit.api import cache
from privaudit.core.files import digest, dumps_strict, loads_strict
from privaudit.sim.run import Run
from privaudit.sim.rundir import RunDir

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("privaudit", "attacks", "defenses", "eval")  # pyproject.toml's package-dir
ENCODER = ROOT / "privaudit" / "core" / "files.py"


def strict(text: str) -> object:
    """``text`` parsed by a parser that refuses ``Infinity``, ``-Infinity`` and ``NaN``."""

    def refuse(name: str) -> object:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_floats_travel_as_strings_and_come_back():
    doc = {
        "inf": math.inf,
        "neg": -math.inf,
        "nan": math.nan,
        "array": np.array([1.5, np.inf]),
        "tensor": torch.tensor([-math.inf]),
        "nested": [(2.0, np.float64(math.inf))],
    }
    text = dumps_strict(doc)
    raw = strict(text)
    assert raw["inf"] == "inf" and raw["neg"] == "-inf" and raw["nan"] == "nan"
    back = loads_strict(text)
    assert back["inf"] == math.inf and back["neg"] == -math.inf and math.isnan(back["nan"])
    assert back["array"] == [1.5, math.inf] and back["tensor"] == [-math.inf]
    assert back["nested"] == [[2.0, math.inf]]
    # a file an older privaudit wrote with Python's literals still reads
    assert loads_strict('{"e": Infinity, "n": -Infinity}') == {"e": math.inf, "n": -math.inf}


def test_content_keys_of_finite_values_are_what_they_were():
    """A cache key is SHA-256 of the canonical text; for finite values it is the text
    json.dumps(sort_keys=True) always wrote, so no cached cell or run changes its key."""
    obj = {"b": [1, 2.5, None, "x", (3, 4)], "a": {"z": True, "y": 1e-5}}
    text = json.dumps(obj, sort_keys=True)
    assert digest(obj) == hashlib.sha256(text.encode()).hexdigest()[:10]
    assert digest({"e": math.inf}) == digest({"e": "inf"})  # ∞ keyed as its string, as before


def test_run_with_no_guarantee_writes_strict_config_and_reads_inf(tmp_path):
    """dsgd adds no noise: ε = ∞ per agent and over the run, written "inf" in config.json
    (and nothing non-standard in the manifest), read back as float("inf")."""
    run = Run.create(tiny("dsgd"), tmp_path / "run")
    assert run.resolved["epsilon"] == math.inf
    raw = strict((tmp_path / "run" / "config.json").read_text())
    assert raw["resolved"]["epsilon"] == "inf"
    assert raw["resolved"]["agents"][0]["epsilon"] == "inf"
    strict((tmp_path / "run" / "manifest.json").read_text())
    cfg, resolved = RunDir(tmp_path / "run").read_config()
    assert cfg.defense == "dsgd" and resolved["epsilon"] == math.inf
    assert all(a["epsilon"] == math.inf for a in resolved["agents"])
    assert Run.open(tmp_path / "run").resolved["epsilon"] == math.inf


def test_audit_of_an_unbounded_target_is_strict_on_disk_and_on_stdout(tmp_path, capsys):
    out = tmp_path / "a"
    argv = ["audit", "--target", "dsgd-half-model", "--trials", "64", "--out", str(out)]
    argv += ["--agents", "4", "--rounds", "3", "--batch-size", "2", "--no-progress", "--json"]
    code, stdout, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert strict(stdout)["upper"]["accountant"] == "inf"
    text = (out / "audit.json").read_text()
    assert strict(text)["upper"]["accountant"] == "inf"
    doc = loads_strict(text)
    assert doc["upper"]["accountant"] == math.inf and doc["accounting"]["run"] == math.inf
    strict((out / "run" / "config.json").read_text())


def test_cached_values_are_strict_and_read_back(tmp_path):
    """A cached result (a compare cell's row, an accuracy) with ε = ∞ and an undefined AUC."""
    path = tmp_path / "value.json"
    cache.write_value(path, {"cell": 1}, {"epsilon": math.inf, "auc": math.nan, "psnr": 12.5})
    strict(path.read_text())
    got = cache.read_value(path, {"cell": 1})
    assert got["epsilon"] == math.inf and math.isnan(got["auc"]) and got["psnr"] == 12.5


def _json_writes(tree: ast.AST) -> list[ast.Call]:
    """The calls of ``json.dump`` / ``json.dumps`` (or the names imported from json)."""
    imported = {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "json"
        for a in node.names
        if a.name in ("dump", "dumps")
    }
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and f.attr in ("dump", "dumps")
            and isinstance(f.value, ast.Name)
            and f.value.id == "json"
        ) or (isinstance(f, ast.Name) and f.id in imported):
            calls.append(node)
    return calls


def _strict_call(call: ast.Call) -> bool:
    return any(
        k.arg == "allow_nan" and isinstance(k.value, ast.Constant) and k.value.value is False
        for k in call.keywords
    )


@pytest.mark.parametrize("package", PACKAGES)
def test_no_json_write_bypasses_the_strict_encoder(package):
    """Every JSON file and ``--json`` output goes through privaudit.core.files (dumps_strict,
    write_json); a json.dump(s) anywhere else must at least refuse non-finite floats."""
    bad = [
        f"{path.relative_to(ROOT)}:{call.lineno}"
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != ENCODER
        for call in _json_writes(ast.parse(path.read_text()))
        if not _strict_call(call)
    ]
    assert bad == [], "use privaudit.core.files.dumps_strict (or write_json) at " + ", ".join(bad)
