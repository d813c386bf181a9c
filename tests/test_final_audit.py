"""The final-model audit (privaudit/experiments/final_audit.py): a Dirac gradient canary in
the victim's update in every round, and an adversary who sees only the final models. A
correct mechanism stays within its unamplified accounting while the audit has power, the
planted under-noised plugin is caught, and the bounds of the observers follow what post-
processing guarantees, at the exact μ a linear defense on empty batches has."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny

from privaudit.core.accounting import release_epsilon
from privaudit.core.errors import PrivauditError
from privaudit.experiments.final_audit import final_model_audit
from privaudit.plugins import load_plugins
from privaudit.sim.run import Run

PLUGIN = Path(__file__).resolve().parents[1] / "examples/plugin/privaudit_example/defense.py"
TARGET = "dp-dpsgd-half-model"
SIGMA, ROUNDS, TRIALS = 1.0, 2, 300
EVERY = [0, 1, 2, 3]  # tiny()'s 4 agents on a ring
SEEDS = (0, 1, 2)
pytestmark = pytest.mark.usefixtures("one_thread")  # a trial is many tiny ops: 1 is best


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    cfg = tiny("dp-dpsgd", epsilon=None, sigma=SIGMA, rounds=ROUNDS)
    return Run.create(cfg, tmp_path_factory.mktemp("final") / "run")


@pytest.fixture(scope="module")
def audits(run) -> dict[int, dict]:
    """The whole coalition's final models on empty batches, one audit per seed."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {
            s: final_model_audit(
                run,
                TARGET,
                TRIALS,
                observer="coalition",
                attackers=EVERY,
                batches="empty",
                seed=s,
                progress=False,
            )
            for s in SEEDS
        }
    finally:
        torch.set_num_threads(threads)


def exact_mu(W: np.ndarray, victim: int, weights: np.ndarray | None) -> float:
    """μ of D-PSGD's final models on empty batches, x^T = −η Σ_s W^s (c e_v + ζ_s) + const
    (s = 1..T): the canary's shift over the noise, whitened over the stacked models
    (``weights`` None) or along ``weights`` (the average), in units of the noise std σC/B."""
    powers = [np.linalg.matrix_power(W, s) for s in range(1, ROUNDS + 1)]
    shift = sum(P[:, victim] for P in powers)
    cov = sum(P @ P.T for P in powers)
    if weights is None:
        return float(np.sqrt(shift @ np.linalg.solve(cov, shift))) / SIGMA
    return float(weights @ shift / np.sqrt(weights @ cov @ weights)) / SIGMA


def test_a_correct_mechanism_is_never_violated_and_the_audit_has_power(audits) -> None:
    for seed, res in audits.items():
        assert res["verdict"] != "violated" and res["mu"]["verdict"] != "violated", seed
        assert 0 < res["epsilon_lo"] <= res["upper"]["accountant"], seed
        assert res["exact"] and "gdp" in res  # linear recursion, empty batches: Gaussian
        assert res["statistic"] == "whitened" and res["distance"] == 0
    # the canary joins every round: the T releases at sample rate 1 are what is audited;
    # the run's own ε, amplified at its rate q ≪ 1, is stated beside and far below
    acc = res["accounting"]
    unamplified = release_epsilon(SIGMA / math.sqrt(ROUNDS), 1e-5)
    assert res["upper"]["accountant"] == pytest.approx(unamplified)
    assert acc["mu"] == pytest.approx(math.sqrt(ROUNDS) / SIGMA)
    assert acc["sample_rate"] < 0.1 and acc["run"] < unamplified / 2


def test_the_average_of_models_is_no_stronger_than_the_whole_coalition(run, audits) -> None:
    """The average is a function of the stacked models, so it can reveal no more (post-
    processing); each estimate's interval holds the exact μ of its observation."""
    avg = final_model_audit(
        run, TARGET, TRIALS, observer="average", batches="empty", progress=False
    )
    whole = audits[0]
    assert avg["victim"] == whole["victim"] == 0
    W = run.ctx.W.cpu().double().numpy()
    mu_avg, mu_whole = exact_mu(W, 0, np.full(4, 0.25)), exact_mu(W, 0, None)
    assert mu_avg < 0.7 * mu_whole  # mixing dilutes: the theory's gap the test relies on
    for res, mu in ((avg, mu_avg), (whole, mu_whole)):
        assert res["gdp"]["mu_lo"] <= mu <= res["gdp"]["mu_hi"], (res["observer"], mu)
    assert avg["epsilon_lo"] <= whole["epsilon_lo"]
    assert avg["statistic"] == "projection"


def test_the_final_models_catch_the_halved_noise(tmp_path, registries) -> None:
    """cta-dpsgd-halfnoise adds σC/2 where its privacy() states σC. It states no recursion,
    so its scores are not taken as Gaussian: the trade-off band's μ, valid for any scores,
    rules out the √T/σ-GDP its accounting promises."""
    load_plugins([PLUGIN])
    cfg = tiny("cta-dpsgd-halfnoise", epsilon=None, sigma=SIGMA, rounds=ROUNDS)
    twin = Run.create(cfg, tmp_path / "twin")
    res = final_model_audit(
        twin,
        "cta-dpsgd-halfnoise-model",
        600,
        observer="coalition",
        attackers=EVERY,
        batches="empty",
        progress=False,
    )
    assert not res["exact"] and "gdp" not in res
    assert res["mu"]["upper"] == pytest.approx(math.sqrt(ROUNDS) / SIGMA)
    assert res["mu"]["lower"] > res["mu"]["upper"]
    assert res["verdict"] == "violated"


def test_observers_are_checked_before_any_trial(run, tmp_path) -> None:
    with pytest.raises(PrivauditError, match="drop --attacker"):
        final_model_audit(run, TARGET, 64, observer="average", attackers=[1], progress=False)
    with pytest.raises(PrivauditError, match="--observer coalition for several"):
        final_model_audit(run, TARGET, 64, observer="agent", attackers=[1, 2], progress=False)
    with pytest.raises(PrivauditError, match="--observer must be one of"):
        final_model_audit(run, TARGET, 64, observer="everyone", progress=False)
    one = Run.create(tiny("dp-dpsgd", epsilon=None, sigma=SIGMA, rounds=1), tmp_path / "one")
    # agent 2 is 2 hops from agent 0: one round of D-PSGD carries the canary 1 hop
    with pytest.raises(PrivauditError, match="does not reach agent 2.s final model by round 1"):
        final_model_audit(one, TARGET, 64, attackers=[2], victim=0, batches="empty", progress=False)


def test_the_command_line_runs_it_and_refuses_what_it_cannot_use(tmp_path, capsys) -> None:
    """``privaudit audit --observe final``: the report names the observer, the bounds and
    the unamplified mechanism; flags of the message audits are refused in one line."""
    from privaudit.cli.app import main

    argv = ["audit", "--target", "dp-dpsgd-half-model", "--observe", "final", "--agents", "4"]
    argv += ["--sigma", "1", "--rounds", "2", "--batches", "empty", "--no-progress"]
    assert main([*argv, "--trials", "200", "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "final-model audit · 2 rounds" in out and "composed at sample rate 1" in out
    assert "verdict: " in out and (tmp_path / "a" / "scores.csv").is_file()
    for extra in (["--span", "1"], ["--mode", "one-run"]):
        assert main([*argv, *extra, "--out", str(tmp_path / "b")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("privaudit: error: ") and "\n" not in err
    assert main(argv[:3] + ["--observer", "average", "--out", str(tmp_path / "c")]) == 2
    assert "--observe final" in capsys.readouterr().err
