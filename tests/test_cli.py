"""The CLI end to end on a tiny configuration, and every bad input of the foundation issue."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from privaudit.cli import main

TINY = ["--agents", "3", "--batch-size", "1", "--no-progress", "--iterations", "4", "--no-lpips"]


def test_targets_lists_every_message(capsys):
    code, out, _ = run_cli(capsys, "targets", "--json")
    assert code == 0
    names = {row["target"] for row in json.loads(out)}
    assert {"dsgd-half-model", "nd-cg", "nd-mm", "dpdl-cg", "dpdl-mm", "dpdl-model"} <= names


def test_attack_end_to_end_writes_result_and_grid(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["--target", "dpdl-cg", "--round", "2", "--out", str(out), "--json", *TINY]
    args += ["--batch-size", "2"]  # Poisson: victim 0's batch of round 2 holds 2 images
    code, stdout, err = run_cli(capsys, "attack", *args)
    assert code == 0, err
    result = json.loads(stdout)
    assert result["batch_size"] == 2 and result["batch_sizes"] == [2]
    assert result == json.loads((out / "result.json").read_text()) | {"figure": result["figure"]}
    assert result["target"] == "dpdl-cg" and result["round"] == 2 and result["attack"] == "ig"
    # cg is evaluated at a model that carries un-noised state: no run guarantee, the
    # paper's count is the calibrated 1
    assert result["epsilon"] is None and "evaluated at" in result["epsilon_reason"]
    assert result["epsilon_claimed"] == pytest.approx(1.0, abs=0.02) and result["sigma"] > 0
    assert result["run_epsilon"] is None and "no formal guarantee" in result["run_epsilon_reason"]
    for k in ("mse", "psnr", "ssim", "lpips", "label_acc"):
        assert k in result["metrics"]
    assert result["metrics"]["lpips"] is None or result["metrics"]["lpips"] >= 0
    png = (out / "grid.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    # attacking again reuses the run and gives the same numbers
    code, stdout2, _ = run_cli(capsys, "attack", *args)
    assert json.loads(stdout2)["metrics"] == result["metrics"]


def test_attack_on_an_empty_batch_says_so(tmp_path, capsys):
    """B = 1: victim 0's Poisson batch of round 2 is empty; the CLI says there is nothing
    to reconstruct, writes result.json with null scores, and draws no grid."""
    out = tmp_path / "out"
    args = ["--target", "dpdl-cg", "--round", "2", "--out", str(out), *TINY]
    code, stdout, err = run_cli(capsys, "attack", *args)
    assert code == 0, err
    assert "batch is empty" in stdout and "nothing to reconstruct" in stdout
    result = json.loads((out / "result.json").read_text())
    assert result["batch_sizes"] == [0] and result["metrics"]["psnr"] is None
    assert not (out / "grid.png").exists()
    # under --json stdout is the JSON alone; the line goes to stderr, with where to look
    code, stdout, err = run_cli(capsys, "attack", *args, "--json")
    assert code == 0 and json.loads(stdout)["metrics"]["psnr"] is None
    assert "batch is empty" in err and (
        "recorded rounds where it is not" in err or "--round" in err
    )


def test_train_then_attack_an_existing_run(tmp_path, capsys):
    run = tmp_path / "run"
    code, out, err = run_cli(
        capsys,
        "train",
        "--defense",
        "nd",
        "--rounds",
        "3",
        "--agents",
        "3",
        "--out",
        str(run),
        "--no-progress",
    )
    assert code == 0, err and "test accuracy" in out
    code, out, err = run_cli(
        capsys,
        "attack",
        "--target",
        "nd-cg",
        "--round",
        "2",
        "--run",
        str(run),
        "--link",
        "1,2",
        "--out",
        str(tmp_path / "o"),
        "--no-progress",
        "--iterations",
        "3",
        "--no-lpips",
    )
    assert code == 0, err
    assert "PSNR" in out and "links [[1, 2]]" in out


def test_console_script_runs():
    """The console script of the install under test: the one beside this interpreter (a venv
    used without activating it leaves another ``privaudit`` first on PATH), else PATH's."""
    here = Path(sys.executable).with_name("privaudit")
    exe = str(here) if here.exists() else shutil.which("privaudit")
    cmd = [exe] if exe else [sys.executable, "-m", "privaudit.cli"]
    proc = subprocess.run([*cmd, "targets"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "dpdl-cg" in proc.stdout


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "nd"
    assert (
        main(
            [
                "train",
                "--defense",
                "nd",
                "--rounds",
                "2",
                "--agents",
                "3",
                "--out",
                str(path),
                "--no-progress",
            ]
        )
        == 0
    )
    return path


BAD = {
    "unknown target": (["attack", "--target", "nope-cg", "--round", "1"], "dpdl-cg"),
    "unknown defense": (["train", "--defense", "nope", "--out", "{tmp}/x"], "dpdl"),
    "unknown dataset": (
        ["train", "--defense", "nd", "--dataset", "imagenet", "--out", "{tmp}/x"],
        "photos",
    ),
    "unknown model": (["train", "--defense", "nd", "--model", "vgg", "--out", "{tmp}/x"], "lenet"),
    "bad memory budget": (
        ["train", "--defense", "nd", "--max-memory", "lots", "--out", "{tmp}/x"],
        "--max-memory must be a size",
    ),
    "unknown topology": (
        ["train", "--defense", "nd", "--topology", "hypercube", "--out", "{tmp}/x"],
        "ring",
    ),
    "unknown attack": (
        ["attack", "--target", "nd-cg", "--round", "1", "--attack", "magic", "--run", "{run}"],
        "ig",
    ),
    "round below 1": (["attack", "--target", "nd-cg", "--round", "0"], "--round"),
    "round beyond run": (
        ["attack", "--target", "nd-cg", "--round", "5", "--run", "{run}"],
        "train longer",
    ),
    "too few agents": (
        ["train", "--defense", "nd", "--agents", "1", "--out", "{tmp}/x"],
        "--agents",
    ),
    "epsilon not positive": (
        ["train", "--defense", "dpdl", "--epsilon", "0", "--out", "{tmp}/x"],
        "--epsilon",
    ),
    "delta outside (0,1)": (
        ["train", "--defense", "dpdl", "--delta", "1", "--out", "{tmp}/x"],
        "--delta",
    ),
    "missing run dir": (
        ["attack", "--target", "nd-cg", "--round", "1", "--run", "{tmp}/none"],
        "does not exist",
    ),
    "not a run dir": (
        ["attack", "--target", "nd-cg", "--round", "1", "--run", "{tmp}"],
        "not a privaudit run",
    ),
    "unreadable data root": (
        [
            "train",
            "--defense",
            "nd",
            "--dataset",
            "mnist",
            "--data-root",
            "{tmp}/nowhere",
            "--out",
            "{tmp}/x",
        ],
        "data-root",
    ),
    "target of another defense": (
        ["attack", "--target", "dpdl-cg", "--round", "1", "--run", "{run}"],
        "nd-*",
    ),
    "link not in graph": (
        ["attack", "--target", "nd-cg", "--round", "1", "--run", "{run}", "--link", "0,7"],
        "not a link",
    ),
    "malformed param": (
        ["train", "--defense", "nd", "-p", "momentum", "--out", "{tmp}/x"],
        "NAME=VALUE",
    ),
    "laplace scale not positive": (
        ["train", "--defense", "lppa", "-p", "beta=0", "--out", "{tmp}/x"],
        "beta",
    ),
    "gossip steps below 1": (
        ["train", "--defense", "muffliato", "-p", "gossip_steps=0", "--out", "{tmp}/x"],
        "gossip_steps",
    ),
    "shapley permutations below 1": (
        ["train", "--defense", "pdsl", "-p", "permutations=0", "--out", "{tmp}/x"],
        "permutations",
    ),
    "graph the defense cannot run on": (
        ["train", "--defense", "clipd2p", "--topology", "ring", "--out", "{tmp}/x"],
        "exponential",
    ),
    "unknown param": (["train", "--defense", "nd", "-p", "gamma=2", "--out", "{tmp}/x"], "valid:"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_gets_one_clear_line(case, tmp_path, small_run, capsys):
    argv, needle = BAD[case]
    argv = [a.format(tmp=tmp_path, run=small_run) for a in argv]
    code, out, err = run_cli(capsys, *argv, "--no-progress")
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("privaudit: error:") and needle in lines[0], lines[0]
    assert not (tmp_path / "x").exists()  # nothing half-written


def test_corrupt_run_files_are_reported_and_kept(tmp_path, small_run, capsys):
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    (run / "config.json").write_text("{not json")
    code, _, err = run_cli(capsys, "attack", "--target", "nd-cg", "--round", "1", "--run", str(run))
    assert code == 2 and "corrupt" in err and len(err.strip().splitlines()) == 1
    assert (run / "config.json").read_text() == "{not json"  # never overwritten

    run2 = tmp_path / "run2"
    shutil.copytree(small_run, run2)
    shutil.rmtree(run2 / "secrets", ignore_errors=True)
    shutil.rmtree(run2 / "messages", ignore_errors=True)
    ckpt = sorted((run2 / "checkpoints").glob("*.safetensors"))[-1]
    ckpt.write_bytes(b"\x80\x04 hostile pickle bytes")
    code, _, err = run_cli(
        capsys,
        "train",
        "--defense",
        "nd",
        "--rounds",
        "2",
        "--agents",
        "3",
        "--out",
        str(run2),
        "--no-progress",
    )
    assert code == 2 and "corrupt" in err and len(err.strip().splitlines()) == 1
    assert ckpt.read_bytes() == b"\x80\x04 hostile pickle bytes"


def test_train_json_reports_each_agents_accuracy(tmp_path, capsys):
    """``agent_test_accuracy[i]`` is agent i's own model on the test split, recomputed here
    through the model's own forward pass on the run's last checkpoint."""
    import torch

    from privaudit.sim.run import Run
    from privaudit.sim.rundir import RunDir

    run = tmp_path / "run"
    argv = ["train", "--defense", "dsgd", "--rounds", "20", "--agents", "4", "--out", str(run)]
    argv += ["--model", "cnn", "--lr", "0.1"]  # trains past chance, each agent differently
    code, out, err = run_cli(capsys, *argv, "--json", "--no-progress")
    assert code == 0, err
    doc = json.loads(out)
    got = doc["agent_test_accuracy"]
    r = Run.open(run)
    x = RunDir(run).load_checkpoint(20)["state.x"]
    mean = torch.tensor(r.data.mean).view(-1, 1, 1)
    std = torch.tensor(r.data.std).view(-1, 1, 1)
    images = (r.data.test_x - mean) / std

    def accuracy(flat: torch.Tensor) -> float:
        torch.nn.utils.vector_to_parameters(flat, r.ctx.model.parameters())
        with torch.no_grad():
            pred = r.ctx.model(images).argmax(1)
        return int((pred == r.data.test_y).sum()) / len(r.data.test_y)

    want = [accuracy(row) for row in x]
    assert len(got) == 4 and got == pytest.approx(want, abs=1e-9)
    assert len(set(want)) > 1  # distinct: the order of agents is checked too
    assert doc["test_accuracy"] == pytest.approx(accuracy(x.mean(0)), abs=1e-9)
