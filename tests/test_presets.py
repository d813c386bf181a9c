"""Presets: an operating point is applied, an explicit flag overrides it, the run records it;
the validation split a search scores on never touches the test split."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
import torch

from privaudit.cli import main
from privaudit.cli.app import build_parser
from privaudit.cli.options import configured
from privaudit.core.config import RunConfig
from privaudit.core.errors import PrivauditError
from privaudit.scenario import presets
from privaudit.scenario.data import VALIDATION_FRACTION, evaluation_split, photos

POINT = presets.OperatingPoint(
    model="tanh-cnn",
    batch_size=16,
    rounds=123,
    dirichlet_alpha=50.0,
    params={"lr": 0.7, "clip": 2.0},
    searched="test point",
    epsilon=1.0,
)


@pytest.fixture
def point(monkeypatch) -> presets.OperatingPoint:
    """A known operating point for dpdl on photos (the shipped ones change with tuning)."""
    far = dataclasses.replace(POINT, rounds=999, epsilon=8.0)  # searched at ε = 8
    monkeypatch.setitem(presets.OPERATING_POINTS, ("dpdl", "photos"), (POINT, far))
    return POINT


def args(command: str, *argv: str) -> argparse.Namespace:
    extra = {"train": ["--defense", "dpdl", "--out", "x"]}.get(command, [])
    return build_parser().parse_args([command, *extra, *argv])


def test_train_gets_the_operating_point(point):
    cfg, line = configured(args("train"), "dpdl", None, preset="utility")
    assert (cfg.model, cfg.batch_size, cfg.rounds, cfg.dirichlet_alpha) == (
        "tanh-cnn",
        16,
        123,
        50.0,
    )
    assert cfg.params == {"lr": 0.7, "clip": 2.0} and cfg.preset == "utility"
    assert "utility preset" in line and "lr=0.7" in line and "batch_size=16" in line


def test_an_explicit_flag_wins_over_the_preset(point):
    a = args("train", "--lr", "0.1", "--batch-size", "4", "--rounds", "7", "-p", "momentum=0.9")
    cfg, _ = configured(a, "dpdl", a.rounds, preset="utility")
    assert cfg.batch_size == 4 and cfg.rounds == 7 and cfg.model == "tanh-cnn"
    assert cfg.params == {"lr": 0.1, "clip": 2.0, "momentum": 0.9}


def test_the_operating_point_of_the_model_asked_for(point, monkeypatch):
    """Several models per (defense, dataset): the first listed is the default, --model picks
    its own point, and a model without one falls back to the attack preset, saying so."""
    mlp = dataclasses.replace(POINT, model="mlp", rounds=77, params={"lr": 0.3})
    monkeypatch.setitem(presets.OPERATING_POINTS, ("dpdl", "photos"), (POINT, mlp))
    assert presets.operating_point("utility", "dpdl", "photos", 1.0) == POINT
    assert presets.operating_point("utility", "dpdl", "photos", 1.0, "mlp") == mlp
    assert presets.operating_point("utility", "dpdl", "photos", 1.0, "fedavg-cnn") is None
    a = args("train", "--model", "mlp", "--dataset", "photos")
    cfg, line = configured(a, "dpdl", None, preset="utility")
    assert (cfg.model, cfg.rounds, cfg.params) == ("mlp", 77, {"lr": 0.3})
    a = args("train", "--model", "fedavg-cnn", "--dataset", "photos")
    cfg, line = configured(a, "dpdl", None, preset="utility")
    assert cfg.model == "fedavg-cnn" and cfg.rounds == presets.ATTACK.rounds
    assert "no operating point for dpdl on photos with --model fedavg-cnn" in line


def test_attack_preset_is_the_inversion_setting(point):
    a = args("train", "--preset", "attack")
    cfg, line = configured(a, "dpdl", None, preset="utility")
    assert (cfg.model, cfg.batch_size, cfg.rounds) == ("lenet", 8, 200)
    assert cfg.params == {} and cfg.preset == "attack" and "attack preset" in line
    # the other commands default to it
    a = args("attack", "--target", "dpdl-cg", "--round", "3")
    cfg, _ = configured(a, "dpdl", 3)
    assert (cfg.model, cfg.batch_size, cfg.rounds, cfg.preset) == ("lenet", 8, 3, "attack")


def test_the_point_searched_at_the_nearest_epsilon_is_taken(point):
    pick = lambda eps: presets.operating_point("utility", "dpdl", "photos", eps).rounds  # noqa: E731
    assert pick(1.0) == 123 and pick(2.0) == 123 and pick(0.5) == 123
    assert pick(3.0) == 999 and pick(8.0) == 999 and pick(50.0) == 999
    assert pick(None) == 999  # --sigma: the largest searched ε
    cfg, _ = configured(args("train", "--epsilon", "4"), "dpdl", None, preset="utility")
    assert cfg.rounds == 999
    cfg, _ = configured(args("train", "--sigma", "2"), "dpdl", None, preset="utility")
    assert cfg.rounds == 999  # --sigma overrides the (default) ε: the largest searched ε


def test_no_operating_point_falls_back_and_says_so():
    base = RunConfig(defense="dpdl", dataset="cifar10")
    cfg, line = presets.apply(base, "utility", {"params": {}})
    assert cfg.model == presets.ATTACK.model and "no operating point for dpdl on cifar10" in line


def test_unknown_preset_is_one_line(capsys):
    assert main(["train", "--defense", "dpdl", "--out", "x", "--preset", "fast"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown preset 'fast'" in err and "utility" in err


def test_train_records_the_preset_in_the_run(point, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--defense", "dpdl", "--out", str(out), "--rounds", "2", "--agents", "3"]
    assert main([*argv, "--lr", "0.2", "--no-progress", "--json"]) == 0
    captured = capsys.readouterr()
    assert "utility preset" in captured.err  # stdout stays JSON
    json.loads(captured.out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["preset"] == "utility" and cfg["model"] == "tanh-cnn"
    assert cfg["batch_size"] == 16 and cfg["rounds"] == 2 and cfg["dirichlet_alpha"] == 50.0
    assert cfg["params"]["lr"] == 0.2 and cfg["params"]["clip"] == 2.0
    # the same run with the preset's values given explicitly resumes: the preset's name
    # is not part of the run's identity
    again = [*argv, "--preset", "attack", "--model", "tanh-cnn", "--batch-size", "16"]
    again += ["--dirichlet-alpha", "50", "--lr", "0.2", "--clip", "2", "--no-progress"]
    assert main(again) == 0, capsys.readouterr().err


def test_validation_split_is_carved_from_training_only():
    data = photos()
    val = evaluation_split(data, "validation", seed=0)
    n = len(data.train_y)
    assert len(val.test_y) == round(n * VALIDATION_FRACTION)
    assert len(val.train_y) + len(val.test_y) == n
    # every validation image is a training image, none is a test image, none is trained on
    flat = lambda x: {tuple(r.tolist()) for r in x.flatten(1)[:, ::97]}  # noqa: E731
    assert flat(val.test_x) <= flat(data.train_x)
    assert not flat(val.test_x) & flat(data.test_x)
    assert not flat(val.test_x) & flat(val.train_x)
    assert evaluation_split(data, "test", seed=0) is data
    other = evaluation_split(data, "validation", seed=1)
    assert not torch.equal(other.test_x, val.test_x)
    with pytest.raises(PrivauditError, match="unknown evaluation split"):
        evaluation_split(data, "train", seed=0)


def test_shipped_operating_points_are_valid_runs():
    """Every shipped point names a model, a defense and parameters the defense accepts."""
    from privaudit.core.context import params_of
    from privaudit.defenses import get_defense
    from privaudit.scenario.models import MODELS

    for (defense, dataset), points in presets.OPERATING_POINTS.items():
        assert points and len({(p.model, p.epsilon) for p in points}) == len(points)
        for p in points:
            assert p.model in MODELS and p.searched
            cfg = RunConfig(defense=defense, dataset=dataset)
            cfg = dataclasses.replace(cfg, **p.fields()).validate()
            params_of(get_defense(defense).Params, cfg.params)


def test_tune_scores_on_validation_and_resumes(tmp_path):
    """benchmarks/tune.py: every grid point × ε is a run evaluated on the validation split;
    the best is printed as an OperatingPoint; a second call reuses every finished point."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parents[1] / "benchmarks" / "tune.py"
    argv = [sys.executable, str(script), "--defense", "dp-dpsgd", "--dataset", "photos"]
    argv += ["--agents", "3", "--rounds", "2", "--batch-size", "4", "--grid", "lr=0.1,0.3"]
    argv += ["--epsilons", "8,inf", "--out", str(tmp_path)]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and {r["config"]["eval_split"] for r in rows} == {"validation"}
    assert {(r["point"]["lr"], r["epsilon"]) for r in rows} == {
        (lr, e) for lr in (0.1, 0.3) for e in (8.0, float("inf"))
    }
    assert all(r["sigma"] == 0 for r in rows if r["epsilon"] == float("inf"))
    assert "best: ('dp-dpsgd', 'photos'): OperatingPoint(model='tanh-cnn'" in first.stdout
    again = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "validation accuracy" not in again.stdout  # all reused
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 4
