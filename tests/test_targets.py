"""Every registered target runs end to end: `privaudit attack --target T --round 3 --agents 4`."""

from __future__ import annotations

import json

import pytest

from privaudit.cli import main
from privaudit.defenses import DEFENSES
from privaudit.sim.targets import all_targets

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
