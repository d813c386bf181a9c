"""``privaudit mia`` end to end: membership of a message's batch and its label counts, with
the DP region beside — non-private messages give their batch away, a correct Gaussian
mechanism stays inside its bound."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_cli

from privaudit.core.accounting import gdp_epsilon
from privaudit.eval.membership_scoring import auc

SMALL = ["--agents", "4", "--rounds", "4", "--batch-size", "16", "--messages", "3", "--round", "2"]
QUIET = ["--no-progress", "--json"]


def mia(capsys, tmp_path, *argv: str) -> dict:
    code, out, err = run_cli(capsys, "mia", *argv, *SMALL, *QUIET, "--out", str(tmp_path / "m"))
    assert code == 0, err
    return json.loads(out)


def test_non_private_cross_gradients_give_their_batch_away(tmp_path, capsys):
    """nd-cg: the receiver's model crosses in the clear, so each cross-gradient is exactly
    its batch's mean gradient; the joint scorer finds every member."""
    r = mia(capsys, tmp_path, "--target", "nd-cg")
    assert r["members"] > 20 and r["auc"] > 0.95, r["auc"]
    assert r["tpr_at_fpr"]["0.01"]["tpr"] > 0.5
    assert r["epsilon_release"] is None and r["violations"] == []  # no DP claim to check
    assert (tmp_path / "m" / "roc.png").exists() and (tmp_path / "m" / "result.json").exists()
    assert 0 <= r["label_counts_exact"] <= 1 and r["per_message"][0]["threat"].startswith("link")
    assert r["tradeoff"]["mu_lo"] > 1  # the trade-off band rules out every small μ
    assert (tmp_path / "m" / "tradeoff.png").exists() and (tmp_path / "m" / "tradeoff.pdf").exists()
    # the raw scores: the AUC recomputed from scores.csv is the one printed
    member, score = np.loadtxt(tmp_path / "m" / r["scores_file"], delimiter=",", skiprows=1).T
    assert member.sum() == r["members"] and len(member) == r["members"] + r["nonmembers"]
    assert auc(score[member == 1], score[member == 0]) == pytest.approx(r["auc"])


@pytest.mark.parametrize("sigma", ["1", "1000"])
def test_a_correct_mechanism_stays_inside_its_dp_bound(tmp_path, capsys, sigma):
    """dp-dpsgd's half-model under the global adversary (its observation is then exact): a
    per-example clipped Gaussian release with σ as stated. No ROC point lies above the
    region its one-release ε allows, and the ε lower bound stays below that ε; at σ = 1000
    the scores are at chance."""
    r = mia(
        capsys, tmp_path, "--target", "dp-dpsgd-half-model", "--sigma", sigma, "--threat", "global"
    )
    assert r["epsilon_release"] is not None and r["violations"] == []
    assert r["epsilon_lo"] <= r["epsilon_release"]
    # the trade-off band's μ: a Gaussian release of that μ stays within the release's ε
    assert gdp_epsilon(r["tradeoff"]["mu_lo"], r["delta"]) <= r["epsilon_release"]
    if sigma == "1000":
        assert abs(r["auc"] - 0.5) < 0.15


def test_bad_input_is_one_line(tmp_path, capsys):
    for argv, needle in (
        (["--target", "nd-cg", "--scorer", "magic"], "--scorer must be one of"),
        (["--target", "nd-cg", "--attack", "magic"], "--attack must be grad"),
        (["--target", "nd-cg", "--messages", "0"], "--messages"),
    ):
        code, _, err = run_cli(capsys, "mia", *argv, "--out", str(tmp_path / "x"))
        assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
        assert not (tmp_path / "x").exists()
