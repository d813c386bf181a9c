"""From audit outcomes to ε lower bounds: Clopper–Pearson, Gaussian DP, one-run.

Three estimators, each for a different experiment:

- :func:`clopper_pearson_epsilon`: a distinguishing test at one threshold, with exact
  binomial confidence bounds on its false-positive and false-negative rates, turned into ε
  by the hypothesis-testing view of (ε, δ)-DP (Kairouz, Oh & Viswanath 2015):
  TPR ≤ e^ε FPR + δ and TNR ≤ e^ε FNR + δ, so ε ≥ ln((TPR − δ)/FPR) and
  ε ≥ ln((TNR − δ)/FNR) (Jagielski, Ullman & Oprea 2020; Nasr et al. 2021).
- :func:`gdp_estimate`: for a Gaussian mechanism the score of a fixed canary direction is
  N(0, s²) without and N(Δ, s²) with the canary, i.e. μ-GDP with μ = Δ/s (Dong, Roth & Su
  2022); μ with a confidence interval, converted to ε at δ by their Cor. 2.13.
- :func:`one_run_epsilon`: Steinke, Nasr & Jagielski 2023, "Privacy Auditing with One (1)
  Training Run": m canaries included independently with probability ½, r guesses (top and
  bottom scores), v of them correct; the largest ε whose tail bound
  P[W ≥ v] ≤ β + 2mδ·α (their main theorem with δ > 0, computed as in their code) is still
  below 1 − confidence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from privaudit.core import limits
from privaudit.core.accounting import gdp_epsilon
from privaudit.core.errors import PrivauditError


def check_levels(confidence: float, delta: float) -> None:
    """One error line for a confidence outside (0, 1) or a δ outside [DELTA_MIN, 1)."""
    if not 0 < confidence < 1:
        raise PrivauditError(f"--confidence must be in (0, 1), got {confidence}")
    limits.check_delta(delta)


# -- Clopper–Pearson --------------------------------------------------------------------------
def cp_lower(k: int, n: int, alpha: float) -> float:
    """One-sided exact lower confidence bound (level 1 − α) on a binomial rate, k of n."""
    return 0.0 if k == 0 else float(stats.beta.ppf(alpha, k, n - k + 1))


def cp_upper(k: int, n: int, alpha: float) -> float:
    """One-sided exact upper confidence bound (level 1 − α) on a binomial rate, k of n."""
    return 1.0 if k == n else float(stats.beta.ppf(1 - alpha, k + 1, n - k))


def _eps(num: float, den: float) -> float:
    if num <= 0:
        return 0.0
    return math.inf if den <= 0 else max(0.0, math.log(num / den))


def clopper_pearson_epsilon(
    scores_in: np.ndarray,
    scores_out: np.ndarray,
    threshold: float,
    delta: float,
    confidence: float,
) -> float:
    """ε lower bound of the test "canary in iff score ≥ threshold", at ``confidence``.

    The two rates' bounds each take half of 1 − confidence (Bonferroni)."""
    check_levels(confidence, delta)
    alpha = (1 - confidence) / 2
    n_in, n_out = len(scores_in), len(scores_out)
    if n_in == 0 or n_out == 0:
        return 0.0
    tp = int((scores_in >= threshold).sum())
    fp = int((scores_out >= threshold).sum())
    tpr, fpr = cp_lower(tp, n_in, alpha), cp_upper(fp, n_out, alpha)
    tnr, fnr = cp_lower(n_out - fp, n_out, alpha), cp_upper(n_in - tp, n_in, alpha)
    return max(_eps(tpr - delta, fpr), _eps(tnr - delta, fnr))


def best_threshold(
    scores_in: np.ndarray, scores_out: np.ndarray, delta: float, confidence: float
) -> float:
    """The threshold (among the observed scores) whose Clopper–Pearson bound is largest on
    these scores; evaluate it on other trials, or the choice inflates the bound."""
    cand = np.unique(np.concatenate([scores_in, scores_out]))
    if len(cand) > 400:  # quantiles of the pooled scores: enough resolution, bounded cost
        cand = np.unique(np.quantile(cand, np.linspace(0, 1, 400)))
    best, arg = -1.0, float(cand[0])
    for thr in cand:
        e = clopper_pearson_epsilon(scores_in, scores_out, float(thr), delta, confidence)
        if e > best:
            best, arg = e, float(thr)
    return arg


def max_cp_epsilon(n_in: int, n_out: int, delta: float, confidence: float) -> float:
    """The largest bound ``n_in``/``n_out`` evaluation trials can give (perfect separation)."""
    z_in, z_out = np.ones(n_in), np.zeros(n_out)
    return clopper_pearson_epsilon(z_in, z_out, 0.5, delta, confidence)


def trials_needed(delta: float, confidence: float, held_out: float = 0.5) -> int:
    """Fewest trials (half of them in, ``held_out`` of them evaluated) for any bound > 0."""
    check_levels(confidence, delta)
    n = 4
    while n < 1 << 30:
        m = max(1, int(n * held_out) // 2)
        if max_cp_epsilon(m, m, delta, confidence) > 0:
            return n
        n *= 2
    raise PrivauditError("no number of trials gives a bound at this confidence and δ")


# -- Gaussian DP --------------------------------------------------------------------------------
def gdp_estimate(
    scores_in: np.ndarray, scores_out: np.ndarray, delta: float, confidence: float
) -> dict[str, float]:
    """μ = (mean_in − mean_out)/s (s the pooled std) with lower and upper confidence
    bounds, each at ``confidence``: a one-sided t bound on the mean difference and a χ²
    bound on s, each at half of 1 − confidence (Bonferroni), μ_lo = Δ_lo/s_hi and
    μ_hi = Δ_hi/s_lo.
    Valid when both score distributions are Gaussian with one variance — exactly so for a
    Gaussian mechanism scored by a fixed projection."""
    check_levels(confidence, delta)
    a, b = np.asarray(scores_in, float), np.asarray(scores_out, float)
    n_a, n_b = len(a), len(b)
    if n_a < 3 or n_b < 3:
        raise PrivauditError("a Gaussian-DP estimate needs at least 3 trials with and without")
    diff = a.mean() - b.mean()
    df = n_a + n_b - 2
    s = math.sqrt(((n_a - 1) * a.var(ddof=1) + (n_b - 1) * b.var(ddof=1)) / df)
    alpha = (1 - confidence) / 2  # per component, one-sided for each end
    if s == 0:
        mu = math.inf if diff != 0 else 0.0
        eps = gdp_epsilon(mu, delta)
        return {
            "mu": mu,
            "mu_lo": mu,
            "mu_hi": mu,
            "diff": float(diff),
            "std": 0.0,
            "epsilon": eps,
            "epsilon_lo": eps,
            "epsilon_hi": eps,
        }
    half = stats.t.ppf(1 - alpha, df) * s * math.sqrt(1 / n_a + 1 / n_b)
    s_hi = s * math.sqrt(df / stats.chi2.ppf(alpha, df))
    s_lo = s * math.sqrt(df / stats.chi2.ppf(1 - alpha, df))
    mu = abs(diff) / s
    lo, hi = max(abs(diff) - half, 0.0) / s_hi, (abs(diff) + half) / s_lo
    return {
        "mu": mu,
        "mu_lo": lo,
        "mu_hi": hi,
        "diff": float(diff),
        "std": s,
        "epsilon": gdp_epsilon(mu, delta),
        "epsilon_lo": gdp_epsilon(lo, delta),
        "epsilon_hi": gdp_epsilon(hi, delta),
    }


# -- one run (Steinke, Nasr & Jagielski 2023) -------------------------------------------------
def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P[≥ v of r guesses correct] for an (ε, δ)-DP mechanism with m canaries: β + 2mδα,
    β = P[Binomial(r, e^ε/(1 + e^ε)) ≥ v], α = max_i P[v − i ≤ Binomial < v]/i."""
    if not 0 <= v <= r <= m:
        raise PrivauditError(f"need 0 ≤ correct ≤ guesses ≤ canaries, got {v}, {r}, {m}")
    q = 1.0 / (1.0 + math.exp(-epsilon))
    beta = float(stats.binom.sf(v - 1, r, q))
    alpha, acc = 0.0, 0.0
    pmf = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q) if v > 0 else np.array([])
    for i, p in enumerate(pmf, start=1):  # acc = P[v − i ≤ Binomial(r, q) < v]
        acc += float(p)
        alpha = max(alpha, acc / i)
    return min(1.0, beta + alpha * delta * 2 * m)


def one_run_epsilon(m: int, r: int, v: int, delta: float, p: float) -> float:
    """The largest ε the outcome (m, r, v) rejects at level ``p`` (bisection, as the paper)."""
    if r == 0 or one_run_p_value(m, r, v, 0.0, delta) >= p:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(m, r, v, hi, delta) < p:
        lo, hi = hi, hi * 2
        if hi > 1e4:
            return lo
    for _ in range(40):
        mid = (lo + hi) / 2
        if one_run_p_value(m, r, v, mid, delta) < p:
            lo = mid
        else:
            hi = mid
    return lo


def pooled_gdp_estimate(
    scores: np.ndarray, coins: np.ndarray, delta: float, confidence: float
) -> dict[str, float]:
    """μ of K canaries per trial, pooled: ``scores`` and ``coins`` are (n trials, K), canary
    k's score in trial i and whether it was in. Each canary's mean difference Δ_k (its own
    in/out means, so each coordinate's fixed offset cancels) over the pooled noise std s:
    μ = mean_k Δ_k / s, with μ_lo = Δ_lo/s_hi and μ_hi = Δ_hi/s_lo as
    :func:`gdp_estimate`, each end of each component at half of 1 − confidence. The
    intervals are the normal ones with the cluster-robust (sandwich) variance over trials —
    each trial's share of mean_k Δ_k and of s² summed over its K canaries, trials being
    independent — so they stay valid when the K scores of one trial are correlated; K
    independent ones shrink them by √K. With per-canary stds σ_k, mean_k Δ_k / RMS_k σ_k is
    at most max_k Δ_k/σ_k: the pooled μ never exceeds the most exposed canary's. Valid when
    each canary's scores are a Gaussian shift with one variance, in or out (a Gaussian
    mechanism with a per-example clip, each canary one example scored on its coordinate),
    and n is large enough for the normal intervals (≥ 100 trials)."""
    check_levels(confidence, delta)
    s, b = np.asarray(scores, float), np.asarray(coins, bool)
    if s.ndim != 2 or s.shape != b.shape:
        raise PrivauditError("scores and coins must be (trials, canaries) arrays of one shape")
    n, k = s.shape
    n_in, n_out = b.sum(0), n - b.sum(0)
    if n < 100 or n_in.min() < 3 or n_out.min() < 3:
        raise PrivauditError(
            "a pooled Gaussian-DP estimate needs at least 100 trials and 3 with and without "
            "each canary"
        )
    m_in = np.where(b, s, 0.0).sum(0) / n_in
    m_out = np.where(~b, s, 0.0).sum(0) / n_out
    r = s - np.where(b, m_in, m_out)
    diff = float((m_in - m_out).mean())
    df = n * k - 2 * k
    var = float((r**2).sum() / df)
    # each trial's share of diff − E diff and of var − σ²: sums of independent terms
    psi = (r * np.where(b, 1 / n_in, -1 / n_out)).sum(1) / k
    phi = (r**2 - var).sum(1) / df
    z = stats.norm.ppf(1 - (1 - confidence) / 2)  # one-sided, each end of each component
    fix = n / (n - 1)
    half, var_half = z * math.sqrt(fix * (psi**2).sum()), z * math.sqrt(fix * (phi**2).sum())
    std = math.sqrt(var)
    if std == 0:
        mu = math.inf if diff > 0 else 0.0
        lo = hi = mu
    else:
        mu = max(diff, 0.0) / std
        lo = max(diff - half, 0.0) / math.sqrt(var + var_half)
        hi = max(diff + half, 0.0) / math.sqrt(max(var - var_half, var * 1e-12))
    return {
        "mu": float(mu),
        "mu_lo": float(lo),
        "mu_hi": float(hi),
        "diff": diff,
        "std": std,
        "canaries": float(k),
        "epsilon": gdp_epsilon(mu, delta),
        "epsilon_lo": gdp_epsilon(lo, delta),
        "epsilon_hi": gdp_epsilon(hi, delta),
    }


def one_run_audit(
    scores: np.ndarray,
    included: np.ndarray,
    delta: float,
    confidence: float,
    guesses: Sequence[float] = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0),
) -> dict[str, float]:
    """Guess "in" for the k/2 highest and "out" for the k/2 lowest scores, for every
    fraction k/m in ``guesses``; the best bound, with the level split over the choices
    (Bonferroni), so picking the best k does not inflate it."""
    check_levels(confidence, delta)
    scores, included = np.asarray(scores, float), np.asarray(included, bool)
    m = len(scores)
    order = np.argsort(scores)
    p = (1 - confidence) / len(guesses)
    best = {"epsilon": 0.0, "guesses": 0, "correct": 0, "canaries": m}
    for frac in guesses:
        k = max(1, int(round(frac * m / 2)))
        k = min(k, m // 2)
        top, bottom = order[m - k :], order[:k]
        v = int(included[top].sum() + (~included[bottom]).sum())
        eps = one_run_epsilon(m, 2 * k, v, delta, p)
        if eps > best["epsilon"]:
            best = {"epsilon": eps, "guesses": 2 * k, "correct": v, "canaries": m}
    return best


# -- one run over pairs: each coin swaps one example (group privacy) --------------------------
def group_privacy(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """What (ε, δ)-DP for adding or removing one example gives datasets ``k`` changes apart:
    (kε, δ·Σ_{i<k} e^{iε}), by chaining the definition k times (Dwork & Roth 2014, Thm. 2.2
    for δ = 0; with δ, P[M(D₀) ∈ S] ≤ e^ε(e^ε P[M(D₂) ∈ S] + δ) + δ for k = 2). Replacing
    one example is k = 2: one removal and one addition."""
    if k < 1:
        raise PrivauditError(f"a group has at least one change, got k = {k}")
    if math.isinf(epsilon):
        return math.inf, 1.0
    # e^{iε} capped where δ·e^{iε} is past 1 for any δ ≥ DELTA_MIN (no overflow)
    return k * epsilon, min(1.0, delta * sum(math.exp(min(i * epsilon, 700.0)) for i in range(k)))


def one_run_group_epsilon(m: int, r: int, v: int, delta: float, p: float, group: int) -> float:
    """The largest ε (of one addition or removal) whose ``group``-fold guarantee
    (:func:`group_privacy`) the one-run outcome (m canaries, r guesses, v correct) rejects
    at level ``p``: :func:`one_run_p_value` at (kε, δ Σ e^{iε}) below ``p`` (bisection, as
    :func:`one_run_epsilon`, which is ``group = 1``)."""

    def rejects(eps: float) -> bool:
        e, d = group_privacy(eps, delta, group)
        return one_run_p_value(m, r, v, e, d) < p

    if r == 0 or not rejects(0.0):
        return 0.0
    lo, hi = 0.0, 1.0
    while rejects(hi):
        lo, hi = hi, hi * 2
        if hi > 1e4:
            return lo
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rejects(mid) else (lo, mid)
    return lo


def one_run_group_audit(
    scores: np.ndarray,
    included: np.ndarray,
    delta: float,
    confidence: float,
    group: int,
    guesses: Sequence[float] = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0),
) -> dict[str, float]:
    """The one-run audit (:func:`one_run_audit`) for canaries whose coin changes the input in
    ``group`` places (a coin that picks which of two examples is in swaps one: ``group``
    = 2), with signed scores: canary j is guessed "in" where its score is positive and "out"
    where negative, the r of largest |score| (zeros never), for r = each fraction of m in
    ``guesses``, the level split over them (Bonferroni); each outcome turned into an ε of
    one addition or removal by :func:`one_run_group_epsilon`."""
    check_levels(confidence, delta)
    scores, included = np.asarray(scores, float), np.asarray(included, bool)
    m = len(scores)
    order = np.argsort(-np.abs(scores), kind="stable")
    signed = int(np.count_nonzero(scores))
    p = (1 - confidence) / len(guesses)
    best = {"epsilon": 0.0, "guesses": 0, "correct": 0, "canaries": m}
    for frac in guesses:
        r = min(max(1, int(round(frac * m))), signed)
        if r == 0:
            continue
        top = order[:r]
        v = int(np.sum((scores[top] > 0) == included[top]))
        eps = one_run_group_epsilon(m, r, v, delta, p, group)
        if eps > best["epsilon"]:
            best = {"epsilon": eps, "guesses": r, "correct": v, "canaries": m}
    return best
