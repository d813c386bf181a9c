"""f-DP: trade-off functions, the one-run f-DP audit and empirical trade-off curves.

A mechanism is f-DP (Dong, Roth & Su 2022, Def. 2.3) when every test between the outputs on
two adjacent inputs has a type II error β ≥ f(α) at type I error α. Two families matter
here:

- μ-GDP, f = G_μ(α) = Φ(Φ⁻¹(1 − α) − μ): the exact trade-off of a Gaussian mechanism whose
  shift over its noise std is μ (their Def. 2.6);
- (ε, δ)-DP, f = f_{ε,δ}(α) = max(0, 1 − δ − e^ε α, e^{−ε}(1 − δ − α)) (their Prop. 2.5,
  after Kairouz, Oh & Viswanath 2015): what an (ε, δ) accountant claims.

Both are handled through the *blow-up* B(x) = 1 − f(x), the most a test can detect at
false-positive rate x, and its inverse (:class:`Tradeoff`).

- :func:`one_run_rejects` / :func:`one_run_fdp_audit`: Mahloujifar, Melis & Chaudhuri,
  "Auditing f-Differential Privacy in One Run" (2024; their reconstruction analysis with
  its cap). m canaries, each included with probability ½, k guesses, v correct. Under f-DP
  the chance of v correct is bounded by propagating, from the v-th correct guess down, the
  most probability a correct guess (r) and a wrong one (h) can carry: starting from
  r = τ·v/m and h = τ·(k − v)/m for the level τ, each step raises h to B⁻¹(r) (a guess
  cannot be right more often than f allows given how often it is wrong) and r by
  i/(k − i) of that rise (1 ≤ i < v), capped at 1; the outcome is unlikely at level τ — the
  claim f is rejected — when r + h exceeds k/m. The same canaries give Steinke et al.'s
  bound (:func:`privaudit.eval.bounds.one_run_audit`); the f-DP analysis uses the whole
  trade-off curve instead of its two (ε, δ) lines and is tighter.
- :func:`tradeoff_curve` / :func:`mu_lower_bound`: the empirical trade-off of a score (FPR
  against FNR at every threshold) with one-sided Clopper–Pearson bounds, and the μ no
  μ-GDP mechanism can have given it: a test with α ≤ α_hi and β ≤ β_hi at once rules out
  every μ < Φ⁻¹(1 − α_hi) + Φ⁻¹(1 − β_hi), since G_μ(α_hi) ≤ β ≤ β_hi. The level is split
  over the thresholds examined (Bonferroni).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
from scipy import stats

from privaudit.core.accounting import gdp_epsilon
from privaudit.core.errors import PrivauditError

from .bounds import check_levels
from .style import save, style_axes

__all__ = [
    "Tradeoff",
    "gaussian",
    "eps_delta",
    "one_run_rejects",
    "largest_rejected",
    "one_run_canaries_needed",
    "one_run_fdp_audit",
    "tradeoff_curve",
    "mu_lower_bound",
    "gdp_mu",
    "plot_tradeoff",
]

# fractions of the canaries guessed: Steinke et al.'s (bounds.one_run_audit) and two finer
# ones, where this test is most powerful with many canaries (on Gaussian scores of ε = 4
# and 200,000 canaries its ε bound peaks at 0.8–1 % guessed: 0.65 of ε, against 0.62)
GUESSES = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
_NORMAL = NormalDist()
SEARCH_STEPS = 40  # bisection steps of a largest rejected parameter
PARAMETER_MAX = 1e4  # past this the outcome rejects every claim the search can state


@dataclass(frozen=True)
class Tradeoff:
    """A trade-off function f through its blow-up's inverse B⁻¹(y) = inf{x : 1 − f(x) ≥ y}
    (``blow_up_inverse``), with a name for output."""

    name: str
    blow_up_inverse: Callable[[float], float]

    def __call__(self, alpha: float) -> float:
        """f(α) by inverting ``blow_up_inverse`` (bisection; tests and plots only)."""
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.blow_up_inverse(mid) <= alpha else (lo, mid)
        return 1.0 - lo


def gaussian(mu: float) -> Tradeoff:
    """G_μ: B(x) = Φ(Φ⁻¹(x) + μ), so B⁻¹(y) = Φ(Φ⁻¹(y) − μ) (Dong, Roth & Su, Def. 2.6)."""
    if not mu >= 0:
        raise PrivauditError(f"μ must be ≥ 0, got {mu}")

    def inverse(y: float) -> float:  # NormalDist: scalar calls 50× faster than scipy's
        if y <= 0.0 or y >= 1.0:
            return min(max(y, 0.0), 1.0)
        return _NORMAL.cdf(_NORMAL.inv_cdf(y) - mu)

    return Tradeoff(f"{mu:.3g}-GDP", inverse)


def eps_delta(epsilon: float, delta: float) -> Tradeoff:
    """f_{ε,δ}: B(x) = min(1, δ + e^ε x, 1 − e^{−ε}(1 − δ − x)), the least of increasing
    lines, so B⁻¹(y) is the largest of their inverses: max(0, (y − δ)e^{−ε},
    1 − δ − e^ε(1 − y)) (Dong, Roth & Su, Prop. 2.5)."""
    if not (epsilon >= 0 and 0 <= delta < 1):
        raise PrivauditError(f"need ε ≥ 0 and 0 ≤ δ < 1, got ({epsilon}, {delta})")
    e = math.exp(min(epsilon, 700.0))

    def inverse(y: float) -> float:
        return max(0.0, (y - delta) / e, 1.0 - delta - e * (1.0 - y))

    return Tradeoff(f"({epsilon:.3g}, {delta:g})-DP", inverse)


def one_run_rejects(m: int, k: int, v: int, f: Tradeoff, level: float) -> bool:
    """Whether v correct of k guesses on m canaries rejects "the mechanism is f-DP" at
    ``level`` (Mahloujifar et al.'s reconstruction analysis with its cap; module docstring)."""
    if not 0 <= v <= k <= m:
        raise PrivauditError(f"need 0 ≤ correct ≤ guesses ≤ canaries, got {v}, {k}, {m}")
    if k == 0:
        return False
    r, h = level * v / m, level * (k - v) / m
    for i in range(v - 1, -1, -1):
        h_new = max(h, f.blow_up_inverse(r))
        if h_new == h:  # neither moves again
            break
        r, h = min(r + i / (k - i) * (h_new - h), 1.0), h_new
    return r + h > k / m


def largest_rejected(
    m: int, k: int, v: int, family: Callable[[float], Tradeoff], level: float
) -> float:
    """The largest parameter p ≥ 0 (μ or ε) of ``family`` whose claim the outcome (m, k, v)
    rejects at ``level``, claims being weaker as p grows (bisection; 0 where even p = 0
    stands)."""

    def rejects(p: float) -> bool:
        return one_run_rejects(m, k, v, family(p), level)

    if not rejects(0.0):
        return 0.0
    lo, hi = 0.0, 1.0
    while rejects(hi):
        lo, hi = hi, hi * 2
        if hi > PARAMETER_MAX:
            return lo
    for _ in range(SEARCH_STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rejects(mid) else (lo, mid)
    return lo


def one_run_canaries_needed(delta: float, confidence: float) -> int:
    """The fewest canaries for which guessing every one right gives
    :func:`one_run_fdp_audit` an (ε, δ) bound above 0 at ``confidence``."""
    check_levels(confidence, delta)
    level = (1 - confidence) / len(GUESSES)
    m = 2
    while m < 1 << 20:
        if largest_rejected(m, m, m, functools.partial(eps_delta, delta=delta), level) > 0:
            return m
        m *= 2
    raise PrivauditError("no number of canaries gives a bound at this confidence and δ")


def one_run_fdp_audit(
    scores: Sequence[float],
    included: Sequence[bool],
    delta: float,
    confidence: float,
    guesses: Sequence[float] = GUESSES,
) -> dict[str, float]:
    """The one-run f-DP audit of m canaries (scores, coins): "in" for the k/2 highest scores
    and "out" for the k/2 lowest, for every fraction k/m in ``guesses`` (the level split
    over them, as :func:`privaudit.eval.bounds.one_run_audit`), each outcome tested against
    two families:

    - ``mu_lo``: the largest μ whose μ-GDP the outcome rejects (the mechanism is not μ-GDP
      for any μ ≤ it), and ``epsilon_gdp``, the ε at δ of that μ — the (ε, δ) the Gaussian
      mechanism of that μ would have, comparable with an accountant's ε only where the
      mechanism is exactly Gaussian;
    - ``epsilon_lo``: the largest ε whose (ε, δ)-DP the outcome rejects: the mechanism is not
      (ε, δ)-DP, whatever it is — the number to compare with an (ε, δ) accountant.
    """
    check_levels(confidence, delta)
    s, inc = np.asarray(scores, float), np.asarray(included, bool)
    if s.shape != inc.shape or s.ndim != 1:
        raise PrivauditError("scores and included must be 1-d arrays of one length")
    m = len(s)
    order = np.argsort(s, kind="stable")
    level = (1 - confidence) / len(guesses)
    best: dict[str, float] = {"canaries": m, "mu_lo": 0.0, "epsilon_lo": 0.0}
    for frac in guesses:
        half = min(max(1, int(round(frac * m / 2))), m // 2)
        top, bottom = order[m - half :], order[:half]
        k, v = 2 * half, int(inc[top].sum() + (~inc[bottom]).sum())
        mu = largest_rejected(m, k, v, gaussian, level)
        eps = largest_rejected(m, k, v, functools.partial(eps_delta, delta=delta), level)
        if mu > best["mu_lo"]:
            best.update(mu_lo=mu, mu_guesses=k, mu_correct=v)
        if eps > best["epsilon_lo"]:
            best.update(epsilon_lo=eps, guesses=k, correct=v)
    best["epsilon_gdp"] = gdp_epsilon(best["mu_lo"], delta)
    return best


def _cp_upper(k: np.ndarray, n: int, alpha: float) -> np.ndarray:
    """:func:`privaudit.eval.bounds.cp_upper` of every count in ``k`` at once."""
    with np.errstate(invalid="ignore"):
        return np.where(k >= n, 1.0, stats.beta.ppf(1 - alpha, k + 1, np.maximum(n - k, 1)))


def tradeoff_curve(
    scores_in: Sequence[float],
    scores_out: Sequence[float],
    confidence: float = 0.95,
    points: int | None = None,
) -> dict[str, Any]:
    """The empirical trade-off of "member iff score ≥ t": FPR α and FNR β at every threshold
    t — every score and +∞, or (``points``) the pooled scores' ``points`` quantiles and +∞,
    chosen without looking at which score is which — with one-sided Clopper–Pearson upper
    bounds at ``confidence`` split over the thresholds (Bonferroni, both rates of every
    threshold), so the whole band holds at once. Fewer thresholds: a tighter band."""
    a, b = np.sort(np.asarray(scores_in, float)), np.sort(np.asarray(scores_out, float))
    if a.size == 0 or b.size == 0:
        raise PrivauditError("a trade-off curve needs scores with and without the canary")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise PrivauditError("scores must be finite")
    pooled = np.concatenate([a, b])
    if points is None:
        cuts = np.unique(pooled)
    else:
        cuts = np.unique(np.quantile(pooled, np.linspace(0, 1, max(points, 2))))
    thresholds = np.concatenate([cuts, [math.inf]])
    fp = b.size - np.searchsorted(b, thresholds, side="left")  # out-scores ≥ t
    fn = np.searchsorted(a, thresholds, side="left")  # in-scores < t
    split = (1 - confidence) / (2 * len(thresholds))
    return {
        "threshold": thresholds.tolist(),
        "fpr": (fp / b.size).tolist(),
        "fnr": (fn / a.size).tolist(),
        "fpr_hi": _cp_upper(fp, b.size, split).tolist(),
        "fnr_hi": _cp_upper(fn, a.size, split).tolist(),
        "confidence": confidence,
    }


def mu_lower_bound(curve: dict[str, Any]) -> float:
    """The largest μ every μ-GDP mechanism is ruled out below, from a :func:`tradeoff_curve`
    band: max over thresholds of Φ⁻¹(1 − α_hi) + Φ⁻¹(1 − β_hi), floored at 0."""
    a_hi, b_hi = np.asarray(curve["fpr_hi"]), np.asarray(curve["fnr_hi"])
    with np.errstate(divide="ignore", invalid="ignore"):
        mu = stats.norm.isf(a_hi) + stats.norm.isf(b_hi)
    mu = mu[np.isfinite(mu)]
    return float(max(0.0, mu.max())) if mu.size else 0.0


def gdp_mu(epsilon: float, delta: float) -> float:
    """The μ whose μ-GDP is exactly (ε, δ)-DP at this δ (inverting
    :func:`privaudit.core.accounting.gdp_epsilon`): a Gaussian release's μ from its exact ε."""
    if not epsilon > 0:
        return 0.0
    if math.isinf(epsilon):
        return math.inf
    hi = 1.0
    while gdp_epsilon(hi, delta) < epsilon:
        hi *= 2
    lo = 0.0
    for _ in range(SEARCH_STEPS + 20):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gdp_epsilon(mid, delta) < epsilon else (lo, mid)
    return (lo + hi) / 2


def plot_tradeoff(
    curve: dict[str, Any],
    path: str | os.PathLike[str],
    mu: float | None = None,
    title: str = "trade-off",
) -> Path:
    """The empirical trade-off curve (FNR against FPR, log–log) with its Clopper–Pearson band
    (the upper bounds of both rates), the curve G_μ of the μ the band rules out
    (:func:`mu_lower_bound`) and, given ``mu``, the accounted G_μ: a test below it does
    better than the guarantee allows. 300-dpi PNG at ``path`` and PDF beside it."""
    from matplotlib.figure import Figure

    fpr, fnr = np.asarray(curve["fpr"]), np.asarray(curve["fnr"])
    floor = 0.5 / max(len(fpr), 2)  # zero rates drawn here: no place on a log axis
    fig = Figure(figsize=(4.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    grid = np.geomspace(floor, 1, 200)
    bound = mu_lower_bound(curve)
    for m, style, name in ((bound, ":", "ruled out"), (mu, "--", "accounted")):
        if m is not None:
            g = stats.norm.cdf(stats.norm.isf(grid) - m)
            ax.plot(
                grid, np.maximum(g, floor), "k", ls=style, lw=1, label=f"{name}: G_μ, μ = {m:.3g}"
            )
    x, y = np.maximum(fpr, floor), np.maximum(fnr, floor)
    ax.plot(x, y, color="#0072B2", lw=1.3, label="measured")
    ax.fill_between(
        x,
        y,
        np.maximum(np.asarray(curve["fnr_hi"]), floor),
        color="#0072B2",
        alpha=0.15,
        lw=0,
        label=f"{100 * curve['confidence']:g} % band",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("false-positive rate α")
    ax.set_ylabel("false-negative rate β")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=6.5, loc="lower left")
    style_axes(ax)
    save(fig, path)
    return Path(path)
