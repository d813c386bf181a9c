"""``benchmarks/audit.py``: it measures every kind whose one release is a Gaussian mechanism by
its defense's own facts, and nothing else, and its table holds the audit's own numbers; and
``benchmarks/audit_beyond.py``'s one-run and final-model rows are those audits'."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from audit import formal_kinds, main  # noqa: E402
from audit_beyond import main as beyond  # noqa: E402

from privaudit.sim.targets import all_targets  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_kinds_measured_are_the_formal_ones_of_every_defense():
    kinds = formal_kinds(agents=4, delta=1e-5)
    assert set(kinds) <= set(all_targets())
    assert {"dp-dpsgd-half-model", "clipd2p-half-model", "pdsl-cg"} <= set(kinds)
    assert "dpdl-cg" in kinds  # formal per release (a fixed evaluation point), not per run
    assert not {"nd-cg", "dsgd-half-model", "muffliato-model", "lppa-model"} & set(kinds)
    assert kinds["dp-dpsgd-half-model"] == ("dp-dpsgd", 1.0)  # z = σ: one Gaussian per round


def test_a_row_is_the_audit_of_one_release_at_the_target_epsilon(tmp_path, capsys):
    md = tmp_path / "audit.md"
    argv = ["--trials", "200", "--epsilons", "2", "--targets", "dp-dpsgd-half-model"]
    main([*argv, "--out", str(tmp_path / "out"), "--markdown", str(md)])
    (row,) = [line for line in md.read_text().splitlines() if line.startswith("| `")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    target, canary, eps, sigma, upper, trials, lo, ratio = cells[:8]
    assert (target, eps, trials) == ("`dp-dpsgd-half-model`", "2", "200")
    assert canary == "dirac 1"  # a Dirac of the per-example clip C = 1
    assert abs(float(upper) - 2) < 0.01  # σ calibrated so that one release has ε = 2
    assert 0 <= float(lo) <= float(upper) and abs(float(ratio) - float(lo) / float(upper)) < 0.01
    out = capsys.readouterr().out
    assert "dp-dpsgd-half-model" in out and "smallest lower-bound ratio" in out
    main([*argv, "--out", str(tmp_path / "out"), "--markdown", str(tmp_path / "again.md")])
    assert (tmp_path / "again.md").read_text() == md.read_text()  # resumed: the same table


def test_the_beyond_rows_are_the_one_run_and_final_model_audits(tmp_path, capsys):
    """``benchmarks/audit_beyond.py`` on small rows: the one-run row's bounds sit below the
    run's accounted ε = 4 and its ratios are theirs; the final-model row's observation μ is
    the exact one (a ring of 4, 2 rounds, every final model: the canary's shift whitened),
    which its trade-off band's lower bound does not exceed."""
    md = tmp_path / "beyond.md"
    argv = ["--one-run", "lenet:2000", "--final", "ring:0:600", "--out", str(tmp_path / "o")]
    beyond([*argv, "--markdown", str(md)])
    lines = md.read_text().splitlines()
    (one,) = [line for line in lines if line.startswith("| `lenet`")]
    (final,) = [line for line in lines if line.startswith("| ring, 0")]
    cells = [c.strip() for c in one.strip("|").split("|")]
    assert cells[1] == "2,000" and cells[3] == "4.00"
    for cell in cells[4:6]:  # Steinke's and the f-DP (ε, δ) bound: "lo (**ratio**)"
        lo, ratio = float(cell.split()[0]), float(cell.split("**")[1])
        assert 0 < lo <= 4.0 and abs(ratio - lo / 4.0) < 0.01
    cells = [c.strip() for c in final.strip("|").split("|")]
    assert cells[1] == "600" and cells[2] == "10.00"
    assert float(cells[4]) <= float(cells[3])  # the lower bound under the PRV ε it is held to
    band, observed, accounted = (float(v) for v in cells[8].split(" / "))
    assert band <= observed < accounted and abs(observed - 1.579) < 0.002
    assert cells[9] == "consistent"
    assert "final models of dp-dpsgd-half-model" in capsys.readouterr().out


def test_pooled_rows_and_the_kinds_that_refuse_pooling(tmp_path):
    """``--canaries 64``: the per-example kind's row is the pooled audit's (its canary column
    says so, its bound below the accounted ε); a flat batch clip is listed as not pooled."""
    md = tmp_path / "pooled.md"
    argv = ["--trials", "200", "--epsilons", "2", "--canaries", "64"]
    argv += ["--targets", "dp-dpsgd-half-model,pdsl-cg", "--out", str(tmp_path / "o")]
    main([*argv, "--markdown", str(md)])
    text = md.read_text()
    (row,) = [line for line in text.splitlines() if line.startswith("| `")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:3] == ["`dp-dpsgd-half-model`", "64 × dirac 1", "2"]
    assert 0.8 * float(cells[4]) < float(cells[6]) <= float(cells[4])  # pooled: near ε
    assert "Not pooled (a flat batch clip; one canary per trial only): `pdsl-cg`." in text
