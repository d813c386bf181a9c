"""Cache entries (:mod:`privaudit.api.cache`) are read only when their files are what was
written and by the code running now: a damaged reference cache, a compare study whose plugin
was edited, and a changed privaudit are recomputed (one stderr line each, the numbers a fresh
computation's), and a Ray worker running other code than the driver refuses."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from conftest import tiny

from privaudit.api import cache
from privaudit.api.model_membership import MODELS, model_mia
from privaudit.cli import main
from privaudit.core.errors import PrivauditError
from privaudit.sim.run import Run

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "examples" / "plugin" / "privaudit_example" / "defense.py"
MIA = dict(attack="lira", references=2, victim=0, candidates=4, population=8, progress=False)


def _lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("cache: ")]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """A tiny dsgd run and its model-level LiRA (2 reference runs and the game's model,
    computed and cached under the run): the folder and the result."""
    folder = tmp_path_factory.mktemp("fresh") / "run"
    cfg = tiny("dsgd", rounds=3, batch_size=4, params={"lr": 0.1})
    result = model_mia(Run.create(cfg, folder), "dsgd-half-model", **MIA)
    assert result.details["references"]["trained"] and result.details["game"]["trained"]
    return cfg, folder, result


def _copy(fresh, tmp_path: Path) -> tuple[Run, Path, Path]:
    """The fresh run with its cache, copied; its reference and game entries' folders."""
    cfg, folder, result = fresh
    shutil.copytree(folder, tmp_path / "run")
    refs, game = (
        Path(result.details[k]["path"]).relative_to(folder) for k in ("references", "game")
    )
    return Run.create(cfg, tmp_path / "run"), tmp_path / "run" / refs, tmp_path / "run" / game


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "zeroed":  # the same size, every byte zero (its header too)
        path.write_bytes(bytes(len(data)))
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "garbled":  # the header intact, the tensors' bytes scrambled
        mid = len(data) // 2
        path.write_bytes(
            data[:mid] + bytes(b ^ 0x5A for b in data[mid : mid + 64]) + data[mid + 64 :]
        )
    elif how == "zeroed-models":  # the header and `inside` intact: the same shapes, zeros
        head = 8 + int.from_bytes(data[:8], "little")
        start, end = (head + o for o in json.loads(data[8:head])["models"]["data_offsets"])
        path.write_bytes(data[:start] + bytes(end - start) + data[end:])
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    "how, entry",
    [
        ("zeroed", "references"),
        ("zeroed-models", "references"),
        ("truncated", "references"),
        ("garbled", "references"),
        ("zeroed-models", "game"),
    ],
)
def test_a_damaged_reference_cache_is_recomputed_with_one_line(fresh, tmp_path, capsys, how, entry):
    """A reference (or game) cache file zeroed (whole, or its models only: same shapes),
    truncated or garbled is never read: the entry is recomputed, the AUC is the fresh
    run's, and one line on stderr names the folder and what is wrong."""
    run, refs, game = _copy(fresh, tmp_path)
    folder = refs if entry == "references" else game
    _damage(folder / MODELS, how)
    capsys.readouterr()
    again = model_mia(run, "dsgd-half-model", **MIA)
    lines = _lines(capsys.readouterr().err)
    assert len(lines) == 1 and str(folder) in lines[0], lines
    assert "does not match its SHA-256" in lines[0] or "bytes where" in lines[0]
    assert (
        again.details[entry]["trained"]
        and not again.details["game" if entry == "references" else "references"]["trained"]
    )
    assert again.auc == fresh[2].auc and again.details["scores"] == fresh[2].details["scores"]
    # the recomputed entry is whole again: a third call reads it, silently
    third = model_mia(run, "dsgd-half-model", **MIA)
    assert not third.details[entry]["trained"] and _lines(capsys.readouterr().err) == []


def test_another_code_identity_recomputes_every_entry(fresh, tmp_path, capsys, monkeypatch):
    """Entries written by another privaudit (its code identity, monkeypatched here) are
    recomputed, one line each naming both identities; so is a JSON entry."""
    run, refs, game = _copy(fresh, tmp_path)
    now = cache.code_identity()
    monkeypatch.setattr(cache, "code_identity", lambda: "privaudit 9.9 (source 0123), torch 0")
    capsys.readouterr()
    again = model_mia(run, "dsgd-half-model", **MIA)
    lines = _lines(capsys.readouterr().err)
    assert again.details["references"]["trained"] and again.details["game"]["trained"]
    assert len(lines) == 2 and all("privaudit 9.9 (source 0123)" in ln for ln in lines), lines
    assert all(now in ln and "code differs" in ln for ln in lines)
    assert again.details["scores"] == fresh[2].details["scores"]

    value = tmp_path / "value.json"
    cache.write_value(value, {"k": 1}, {"x": 1.5})
    assert cache.read_value(value, {"k": 1}) == {"x": 1.5}
    monkeypatch.setattr(cache, "code_identity", lambda: now)
    assert cache.read_value(value, {"k": 1}) is None and not value.exists()
    assert "privaudit 9.9" in capsys.readouterr().err


def test_an_edited_json_entry_is_not_read(tmp_path, capsys):
    value = tmp_path / "v.json"
    cache.write_value(value, {"k": 1}, {"auc": 0.47, "eps": float("inf")})
    assert cache.read_value(value, {"k": 1}) == {"auc": 0.47, "eps": float("inf")}
    assert cache.read_value(value, {"k": 2}) is None  # another key: another computation
    assert "its key differs" in capsys.readouterr().err
    cache.write_value(value, {"k": 1}, {"auc": 0.47})
    doc = json.loads(value.read_text())
    doc["value"]["auc"] = 0.5
    value.write_text(json.dumps(doc))
    assert cache.read_value(value, {"k": 1}) is None
    assert "does not match its SHA-256" in capsys.readouterr().err
    value.write_bytes(b"\0" * 64)
    assert cache.read_value(value, {"k": 1}) is None
    assert "not JSON" in capsys.readouterr().err


def test_a_worker_running_other_code_refuses_with_both_versions():
    """What each study task checks first (on Ray, in its worker): the driver's producer."""
    cache.require(cache.producer())
    other = {"code": "privaudit 0.0.9 (source abcd), torch 1.0", "plugins": {}}
    with pytest.raises(PrivauditError) as e:
        cache.require(other)
    line = str(e.value)
    assert "\n" not in line and "privaudit 0.0.9 (source abcd)" in line
    assert cache.code_identity() in line and "same privaudit" in line
    plugin = {"m": {"file": "/x/defense.py", "sha256": "00"}}
    with pytest.raises(PrivauditError, match="plugin /x/defense.py is loaded on the driver"):
        cache.require({**cache.producer(), "plugins": plugin})


def _compare(plugin: Path, out: Path) -> list[dict[str, str]]:
    argv = ["--plugin", str(plugin), "compare", "--targets", "cta-dpsgd-model", "--rounds", "1"]
    argv += ["--epsilons", "1", "--agents", "3", "--victims", "2", "--batch-size", "2"]
    argv += ["--iterations", "3", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    return [
        {k: row[k] for k in ("psnr", "ssim", "mse", "test_acc")}
        for row in csv.DictReader((out / "cells.csv").open())
    ]


def test_compare_recomputes_what_an_edited_plugin_produced(tmp_path, capsys, registries):
    """A plugin defense's noise is removed between two studies into one --out: the second
    retrains the run and attacks it again (one line per entry, naming the plugin), and its
    numbers are those of a fresh folder, not the first study's. A cell's images or the run's
    accuracy damaged afterwards are recomputed too."""
    plugin = tmp_path / "plugin" / "defense.py"
    plugin.parent.mkdir()
    source = PLUGIN.read_text()
    assert source.count("noise_scale = 1.0") == 1
    plugin.write_text(source)
    out = tmp_path / "study"
    noised = _compare(plugin, out)
    capsys.readouterr()

    plugin.write_text(source.replace("noise_scale = 1.0", "noise_scale = 0.0"))
    registries()  # a new process would load the edited file: here, load it afresh
    again = _compare(plugin, out)
    lines = _lines(capsys.readouterr().err)
    assert lines and all(f"plugin {plugin} has another source now than then" in ln for ln in lines)
    cell = next((out / "results" / "cta-dpsgd-model").iterdir())
    assert any(str(cell) in ln for ln in lines) and any("/runs/cta-dpsgd-" in ln for ln in lines)
    assert again == _compare(plugin, tmp_path / "fresh") and again != noised
    capsys.readouterr()

    _damage(cell / "recon.safetensors", "zeroed")
    accuracy = next((out / "runs").glob("*.accuracy.json"))
    accuracy.write_bytes(bytes(accuracy.stat().st_size))
    assert _compare(plugin, out) == again
    lines = _lines(capsys.readouterr().err)
    assert len(lines) == 2, lines
    assert any(str(cell) in ln and "does not match its SHA-256" in ln for ln in lines)
    assert any(str(accuracy) in ln and "not JSON" in ln for ln in lines)
