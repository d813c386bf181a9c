"""f-DP: the trade-off functions from their definitions, the one-run f-DP audit (Mahloujifar,
Melis & Chaudhuri 2024) never flags a correct mechanism and catches an under-noised one,
and the empirical trade-off band's μ lower bound holds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from privaudit.core.accounting import gdp_epsilon
from privaudit.core.errors import PrivauditError
from privaudit.eval import bounds, fdp

DELTA = 1e-5


@pytest.mark.parametrize("mu", [0.0, 0.5, 2.0])
def test_gaussian_tradeoff_is_g_mu(mu):
    f = fdp.gaussian(mu)
    for a in (0.01, 0.2, 0.5, 0.9):
        assert f(a) == pytest.approx(stats.norm.cdf(stats.norm.ppf(1 - a) - mu), abs=1e-9)


@pytest.mark.parametrize("eps, delta", [(0.0, 0.0), (1.0, 0.0), (2.0, 0.01)])
def test_eps_delta_tradeoff_is_the_two_lines(eps, delta):
    f = fdp.eps_delta(eps, delta)
    for a in (0.0, 0.05, 0.3, 0.7, 1.0):
        want = max(0.0, 1 - delta - math.exp(eps) * a, math.exp(-eps) * (1 - delta - a))
        assert f(a) == pytest.approx(want, abs=1e-9)


def _gaussian_canaries(mu: float, m: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    included = rng.random(m) < 0.5
    return rng.normal(size=m) + mu * included, included


def test_a_gaussian_mechanism_is_never_flagged_and_fdp_is_tighter_than_steinke():
    """μ = 1 (ε = 4.38 at δ = 1e-5) over 60 seeds of 600 canaries: the μ bound and both ε
    bounds stay below the truth every time (at 95 % a failure would be allowed 3 times),
    and the f-DP analysis of a Gaussian claim is tighter than Steinke et al.'s on average."""
    mu, got = 1.0, []
    for seed in range(60):
        s, inc = _gaussian_canaries(mu, 600, seed)
        r = fdp.one_run_fdp_audit(s, inc, DELTA, 0.95)
        got.append((r["mu_lo"], r["epsilon_lo"], r["epsilon_gdp"]))
        got[-1] += (bounds.one_run_audit(s, inc, DELTA, 0.95)["epsilon"],)
    a = np.array(got)
    assert (a[:, 0] <= mu).all() and (a[:, 1] <= gdp_epsilon(mu, DELTA)).all()
    assert a[:, 2].mean() > 1.2 * a[:, 3].mean() > 0


def test_randomized_response_is_not_flagged_at_its_exact_epsilon():
    """Randomized response answers the coin truly with probability e^ε/(1 + e^ε): exactly
    ε-DP, the (ε, 0) line attained — the edge a loose analysis would cross."""
    eps, flagged = 2.0, 0
    for seed in range(60):
        rng = np.random.default_rng(seed)
        inc = rng.random(400) < 0.5
        truthful = rng.random(400) < math.exp(eps) / (1 + math.exp(eps))
        scores = np.where(truthful == inc, 1.0, -1.0) + 1e-6 * rng.random(400)
        flagged += fdp.one_run_fdp_audit(scores, inc, DELTA, 0.95)["epsilon_lo"] > eps
    assert flagged <= 3


def test_an_under_noised_mechanism_is_caught():
    """Claimed μ = 0.5 (its σ four times the real one's): the outcome of μ = 2 rejects it."""
    s, inc = _gaussian_canaries(2.0, 1000, 0)
    r = fdp.one_run_fdp_audit(s, inc, DELTA, 0.95)
    assert r["mu_lo"] > 0.5 and r["mu_guesses"] > 0
    assert r["epsilon_lo"] > gdp_epsilon(0.5, DELTA)


def test_rejection_is_monotone_and_chance_rejects_nothing():
    m, k, v = 1000, 200, 180
    mus = [0.0, 0.5, 1.0, 2.0, 4.0]
    rej = [fdp.one_run_rejects(m, k, v, fdp.gaussian(mu), 0.05) for mu in mus]
    assert rej == sorted(rej, reverse=True) and rej[0] and not rej[-1]
    assert not fdp.one_run_rejects(m, k, k // 2, fdp.gaussian(0.0), 0.05)
    with pytest.raises(PrivauditError, match="correct ≤ guesses"):
        fdp.one_run_rejects(10, 20, 5, fdp.gaussian(1.0), 0.05)


def test_tradeoff_band_and_its_mu_lower_bound():
    """Over 40 seeds of 2,000 + 2,000 Gaussian scores with shift μ = 1.5 the μ lower bound
    stays below μ, and comes within half of it; the band holds the true curve."""
    mu, lows = 1.5, []
    for seed in range(40):
        rng = np.random.default_rng(seed)
        c = fdp.tradeoff_curve(rng.normal(mu, size=2000), rng.normal(size=2000), 0.95)
        lows.append(fdp.mu_lower_bound(c))
    assert max(lows) <= mu and np.mean(lows) > mu / 2
    a, b_hi = np.array(c["fpr_hi"]), np.array(c["fnr_hi"])
    inside = np.array(c["fnr"]) <= b_hi
    assert inside.all() and (a >= np.array(c["fpr"])).all()
    with pytest.raises(PrivauditError, match="with and without"):
        fdp.tradeoff_curve([], [0.0])


def test_gdp_mu_inverts_gdp_epsilon_and_the_figure_is_written(tmp_path):
    for mu in (0.3, 1.0, 2.5):
        assert fdp.gdp_mu(gdp_epsilon(mu, DELTA), DELTA) == pytest.approx(mu, rel=1e-6)
    rng = np.random.default_rng(0)
    c = fdp.tradeoff_curve(rng.normal(1.0, size=300), rng.normal(size=300), 0.95, points=50)
    assert len(c["threshold"]) == 51
    fdp.plot_tradeoff(c, tmp_path / "t.png", mu=1.0, title="test")
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG" and (tmp_path / "t.pdf").exists()
