"""Issue finding, kept as a test: a white-box audit that scores one observation per trial
cannot reach 0.95 of a correct Gaussian release's ε at ε = 1 or 2 with 10,000 trials, and
only just can at ε = 4.

Even the ideal audit — scores that are exactly the likelihood-ratio statistic N(0, 1) without
the canary and N(μ, 1) with it, μ = 1/σ, and a bound that knows they are Gaussian — must
estimate μ from n trials: its lower confidence limit sits, in expectation, z·2/√n below μ
(the difference of two means of n/2 unit-variance scores; z = 1.645 at 95 %). At n = 10,000
that is 0.033 below μ = 0.27, 0.50 and 0.92 (ε = 1, 2, 4): 0.87, 0.93 and 0.96 of ε. The
audit's own bound on such scores (:func:`~privaudit.experiments.audit.white_box_bounds`)
spends half its α on Clopper–Pearson beside the Gaussian-DP estimate, and so sits a little
below that ceiling on average. The ceiling reaches 0.95 at 73,000 trials for ε = 1, 22,000
for ε = 2 and 7,000 for ε = 4.

So the goal needs more than one score per trial: K Dirac canaries per trial, each its own
example of a per-example clipped Gaussian release, are K independent Gaussian shifts, and
their pooled estimate (:func:`privaudit.eval.bounds.pooled_gdp_estimate`, ``--canaries K``)
bounds μ as nK trials would — at 10,000 trials of 256 canaries, above 0.95 of ε = 1, 2 and 4
(measured on the defenses' own code in ``benchmarks/audit.py --canaries``). Where canaries
cannot be pooled (a flat batch clip: they would share one clip) the one-score ceiling
stands; where the scores are not an exact Gaussian shift, only Clopper–Pearson applies,
whose ceiling at 10,000 trials is about half of ε (the last test)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from privaudit.core.accounting import release_epsilon, sigma_for_epsilon
from privaudit.eval import bounds
from privaudit.experiments.audit import white_box_bounds

DELTA, Z95 = 1e-5, 1.6449  # one-sided 95 %


def ceiling(mu: float, n: int) -> float:
    """ε of the best possible lower confidence limit on μ from n trials (half with the
    canary): μ − z·2/√n, read as a Gaussian release's ε."""
    lo = mu - Z95 * 2 / math.sqrt(n)
    return release_epsilon(1 / lo, DELTA) if lo > 0 else 0.0


def setting(epsilon: float) -> tuple[float, float]:
    sigma = sigma_for_epsilon(epsilon, DELTA, 1.0, 1, 1, "prv")
    eps = release_epsilon(sigma, DELTA)
    assert eps == pytest.approx(epsilon, rel=1e-2)  # σ calibrated by the accountant
    return 1 / sigma, eps


def audited(mu: float, n: int, seed: int) -> float:
    """The audit's ε lower bound on ideal Gaussian scores of n trials."""
    rng = np.random.default_rng(seed)
    coins = rng.random(n) < 0.5
    scores = rng.normal(size=n) + mu * coins
    return white_box_bounds(scores, coins, True, DELTA, 0.95)["epsilon_lo"]


@pytest.mark.parametrize("epsilon", [1.0, 2.0])
def test_no_single_score_audit_reaches_095_at_10k_trials(epsilon):
    mu, eps = setting(epsilon)
    assert ceiling(mu, 10_000) < 0.95 * eps
    need = next(n for n in range(10_000, 10**6, 1000) if ceiling(mu, n) >= 0.95 * eps)
    assert need == {1.0: 73_000, 2.0: 22_000}[epsilon]
    mean = np.mean([audited(mu, 10_000, seed) for seed in range(5)])
    assert 0.6 * eps < mean < 0.95 * eps


def test_at_epsilon_4_the_ceiling_is_just_above_095_and_the_audit_below_it():
    mu, eps = setting(4.0)
    assert 0.95 * eps <= ceiling(mu, 10_000) < 0.97 * eps
    mean = np.mean([audited(mu, 10_000, seed) for seed in range(5)])
    assert 0.85 * eps < mean <= ceiling(mu, 10_000)


@pytest.mark.parametrize("epsilon", [1.0, 2.0, 4.0])
def test_pooling_256_canaries_per_trial_reaches_095_at_10k_trials(epsilon):
    """Ideal scores of 256 independent canaries per trial, the pooled bound at the
    white-box audit's 1 − α/2: above 0.95 of ε on each of 3 seeds, never above ε."""
    mu, eps = setting(epsilon)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        coins = rng.random((10_000, 256)) < 0.5
        scores = rng.normal(size=coins.shape) + mu * coins
        lo = bounds.pooled_gdp_estimate(scores, coins, DELTA, 0.975)["epsilon_lo"]
        assert 0.95 * eps < lo <= eps


@pytest.mark.parametrize("epsilon", [1.0, 2.0, 4.0])
def test_no_clopper_pearson_bound_reaches_095_at_10k_trials(epsilon):
    """Where the scores are not an exact Gaussian shift (a flat batch clip's QP, a later
    round's post-processing), only a distribution-free bound applies. Even on Gaussian
    scores, and credited with its expected outcome — the true TPR at each threshold, the
    false positives it expects among 5,000 canary-free trials, Clopper–Pearson's 95 % upper
    limit on their rate — the best threshold reaches 0.45, 0.51 and 0.51 of ε = 1, 2, 4: the
    goal of 0.95 at 10,000 trials needs the Gaussian-DP estimate (pooled where it may be)."""
    mu, eps = setting(epsilon)
    n = 5000  # trials without the canary, as many with
    best = 0.0
    for t in np.linspace(0, 8, 801):
        fpr, tpr = stats.norm.sf(t), stats.norm.sf(t - mu)
        fp = int(round(fpr * n))
        fpr_hi = stats.beta.ppf(0.95, fp + 1, n - fp) if fp < n else 1.0
        if tpr > DELTA:
            best = max(best, math.log((tpr - DELTA) / fpr_hi))
    assert best < 0.55 * eps
