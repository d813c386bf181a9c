"""Every registered target runs end to end: `privaudit attack --target T --round 3 --agents 4`."""

from __future__ import annotations

import json

import pytest
from conftest import tiny

from privaudit.api.pipeline import observe
from privaudit.cli import main
from privaudit.core.config import RunConfig
from privaudit.defenses import DEFENSES
from privaudit.experiments.audit import audited_message
from privaudit.sim.run import Run
from privaudit.sim.targets import Target, all_targets

FAST = ["--batch-size", "4", "--iterations", "2", "--no-lpips", "--no-progress", "--json"]


@pytest.mark.parametrize("target", sorted(all_targets()))
def test_attack_runs_for_every_target(target, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(
        ["attack", "--target", target, "--round", "3", "--agents", "4", "--out", str(out), *FAST]
    )
    stdout, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(stdout)
    assert result["target"] == target and result["round"] == 3
    (size,) = result["batch_sizes"]  # the victim's realised (Poisson) batch
    if size == 0:  # nothing to reconstruct: no scores, no grid
        assert result["metrics"]["psnr"] is None and not (out / "grid.png").exists()
    else:
        assert result["metrics"]["psnr"] is not None and (out / "grid.png").exists()


def test_every_defense_registers_described_targets():
    targets = all_targets()
    for name, defense in DEFENSES.items():
        assert defense.kinds, name
        for kind, text in defense.kinds.items():
            assert f"{name}-{kind}" in targets and len(text) > 10


@pytest.mark.parametrize("target", sorted(all_targets()))
def test_attack_and_audit_pick_the_same_message_adversary_and_run(target, tmp_path):
    """The planner's defaults, one answer for both commands: the attack's observation and the
    audit's setting name the same victim, receiver and adversary for every target, and both
    commands train runs of the same length (one rule, ``Target.rounds_to_train``)."""
    tgt = Target.parse(target)
    t = 2
    run = Run.create(tiny(tgt.defense.name, rounds=max(tgt.rounds_needed(t, 4))), tmp_path / "r")
    (obs,) = observe(run, target, t, progress=False)
    s = audited_message(run, target, t)
    assert (obs.meta["src"], obs.meta["dst"]) == (s.src, s.dst)
    assert obs.meta["threat"] == s.threat.describe()
    assert obs.meta["src"] == 0  # the first agent that is not an attacker
    assert tgt.rounds_to_train(t, 4) == max(max(tgt.rounds_needed(t, 4)), RunConfig().rounds)
