"""A run's identity is what determines its messages, not how far it is trained nor how its
settings are spelled (issue 45, items 5 and 7): a study that attacks later rounds trains the
same run further and reuses every cell already computed, with the same numbers; ``-p clip=1``
where 1 is the default is the same run; a damaged cached image file is recomputed, once."""

from __future__ import annotations

import json
import math
from pathlib import Path

import conftest
import pytest
import torch

from privaudit.api import sweeps
from privaudit.api.sweeps import Sweep, execute, plan, run_dir
from privaudit.cli import main
from privaudit.core.accounting import run_privacy
from privaudit.core.config import RunConfig, canonical
from privaudit.core.messages import CaptureSpec
from privaudit.sim.run import Run, run_key

# the smallest compare of tests/test_compare.py (B = 2: a victim's batch is rarely empty)
TINY = ["--agents", "3", "--victims", "2", "--iterations", "3", "--no-progress"]
TINY += ["--batch-size", "2", "--epsilons", "1"]


def _cells(out: Path) -> dict[str, tuple[int, dict]]:
    """Each cached cell's folder (relative to ``out``): its result's mtime and content."""
    return {
        str(p.parent.relative_to(out)): (p.stat().st_mtime_ns, json.loads(p.read_text()))
        for p in (out / "results").rglob("result.json")
    }


def _runs(out: Path) -> dict[str, int]:
    """The mtime of every file under ``out/runs`` (its locks left out)."""
    return {
        str(p): p.stat().st_mtime_ns
        for p in (out / "runs").rglob("*")
        if p.is_file() and not p.name.startswith(".")
    }


def _compare(out: Path, targets: str, rounds: str, *extra: str) -> int:
    return main(
        ["compare", "--targets", targets, "--rounds", rounds, *TINY, *extra, "--out", str(out)]
    )


def test_the_key_leaves_out_how_far_a_run_is_trained_unless_sigma_depends_on_it():
    nd = RunConfig(defense="nd", agents=3, rounds=2, epsilon=None)
    assert run_key(nd) == run_key(RunConfig(defense="nd", agents=3, rounds=9, epsilon=None))
    no_noise = RunConfig(defense="dpdl", agents=3, rounds=2, epsilon=None, sigma=0.0)
    assert run_key(no_noise) == run_key(RunConfig(**{**vars(no_noise), "rounds": 9}))
    # σ calibrated to ε over the rounds: a longer run has another σ, so other messages
    dp = RunConfig(defense="dpdl", agents=3, rounds=2, epsilon=1.0)
    assert run_key(dp) != run_key(RunConfig(**{**vars(dp), "rounds": 3}))
    # the defaults filled in, numbers in one spelling; another value is another run
    assert run_key(dp) == run_key(RunConfig(**{**vars(dp), "params": {"clip": 1}, "epsilon": 1}))
    assert run_key(dp) != run_key(RunConfig(**{**vars(dp), "params": {"clip": 2.0}}))
    assert canonical({"a": [1.0, 0.5, True, math.inf]}) == {"a": [1, 0.5, True, math.inf]}


def test_a_longer_run_resumes_the_shorter_one_with_the_same_messages(tmp_path):
    """nd, trained to round 2 and then asked for 3 in the same folder: resumed from its
    checkpoint (config.json says 3), its messages those of a run trained to 3 at once."""
    short = conftest.tiny("nd", rounds=2, checkpoint_every=1)
    Run.create(short, tmp_path / "r").train(capture=CaptureSpec.of(rounds=[1, 2]), progress=False)
    longer = Run.create(RunConfig(**{**vars(short), "rounds": 3}), tmp_path / "r")
    longer.train(capture=CaptureSpec.of(rounds=[3]), progress=False)
    assert Run.open(tmp_path / "r").cfg.rounds == 3
    straight = Run.create(RunConfig(**{**vars(short), "rounds": 3}), tmp_path / "s")
    straight.train(capture=CaptureSpec.of(rounds=[1, 2, 3]), progress=False)
    for t in (1, 2, 3):
        got, want = longer.dir.load_messages(t), straight.dir.load_messages(t)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    # asked for fewer rounds again: the same run, its later rounds kept
    again = Run.create(short, tmp_path / "r")
    assert again.cfg.rounds == 2 and 3 in again.dir.checkpoint_rounds()
    assert Run.open(tmp_path / "r").cfg.rounds == 3


def test_extending_rounds_reuses_every_cell_it_computed(tmp_path, capsys):
    """``--rounds 1`` then ``--rounds 1,2`` into one folder: nd's run is trained further and
    its round-1 cell is kept as it was; dpdl's σ is calibrated to ε over the rounds trained,
    so its longer run is another one: recomputed, and one line says why."""
    out = tmp_path / "cmp"
    assert _compare(out, "nd-cg,dpdl-cg", "1") == 0
    before = _cells(out)
    nd_runs = sorted((out / "runs").glob("nd-*[!n]"))
    capsys.readouterr()
    assert _compare(out, "nd-cg,dpdl-cg", "1,2") == 0
    err = capsys.readouterr().err
    after = _cells(out)
    kept = [k for k in before if k.startswith("results/nd-cg/")]
    assert len(kept) == 1 and all(after[k] == before[k] for k in kept)  # mtime and numbers
    assert sorted((out / "runs").glob("nd-*[!n]")) == nd_runs  # the same run, trained on
    assert len([k for k in after if k.startswith("results/nd-cg/r2-")]) == 1
    assert len(err.splitlines()) == 1 and "σ is calibrated to ε over the rounds" in err, err


def test_under_a_horizon_every_cell_is_reused_and_its_epsilon_is_spent_to_its_round(tmp_path):
    """σ calibrated over a fixed horizon: attacked rounds only choose where to look, so a
    noised defense's cells are reused too; each cell's ε is what was spent up to its
    round at that σ, and over the horizon the ε asked."""
    base = RunConfig(agents=3, batch_size=2)
    sweep = Sweep(["dp-dpsgd-half-model"], [1], [1.0], [0], base, victims=1, iterations=3)
    sweep.horizon = 4
    out = tmp_path / "h"
    first = execute(sweep, out, progress=False)
    before = _cells(out)
    sweep.rounds = [1, 2]
    rows = execute(sweep, out, progress=False)
    after = _cells(out)
    assert len(before) == 1 and all(after[k] == before[k] for k in before) and len(after) == 2
    assert rows[0]["metrics"] == first[0]["metrics"] and rows[0]["epsilon"] == first[0]["epsilon"]
    runs, _ = plan(sweep)
    (cfg,) = runs.values()
    run = Run.create(cfg, run_dir(out, cfg))
    rates = [a["sample_rate"] for a in run.resolved["agents"]]

    def spent(rounds: int) -> float:
        W = run.ctx.W.cpu()
        acc = run_privacy(run.defense, run.params, W, rates, cfg.delta, rounds, cfg.accountant)
        return acc["kinds"]["half-model"]["epsilon"]

    assert [r["epsilon"] for r in rows] == [spent(1), spent(2)]
    assert spent(1) < spent(2) < spent(4) == pytest.approx(1.0, rel=0.02)
    assert len(list((out / "runs").glob("*.producer.json"))) == 1  # one run, trained to 2


def test_passing_a_default_explicitly_hits_the_cache(tmp_path):
    out = tmp_path / "p"
    assert _compare(out, "dpdl-cg", "1") == 0
    before = _cells(out) | _runs(out)
    assert _compare(out, "dpdl-cg", "1", "-p", "clip=1", "-p", "momentum=0.5") == 0
    assert _cells(out) | _runs(out) == before  # nothing trained, attacked or rewritten


def test_a_truncated_image_file_is_recomputed_once(tmp_path, capsys, monkeypatch):
    """A cell whose recon.safetensors was truncated is discarded and computed again on the
    next run (one line); the run after that reads it, silently: no loop."""
    out = tmp_path / "t"
    assert _compare(out, "nd-cg", "1") == 0
    (cell,) = (out / "results").rglob("recon.safetensors")
    cell.write_bytes(cell.read_bytes()[:100])
    calls = []
    real = sweeps.attack_cell
    monkeypatch.setattr(sweeps, "attack_cell", lambda *a: calls.append(1) or real(*a))
    capsys.readouterr()
    assert _compare(out, "nd-cg", "1") == 0
    err = capsys.readouterr().err
    assert calls == [1] and err.count("\n") == 1 and "recon.safetensors has 100 bytes" in err
    assert _compare(out, "nd-cg", "1") == 0
    assert calls == [1] and capsys.readouterr().err == ""
