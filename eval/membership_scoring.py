"""Membership inference, scored: ROC curves, TPR at low FPR, the ROC region (ε, δ)-DP allows,
ε lower bounds from member/non-member scores, and the model-level scorers (LOSS, LiRA, RMIA)
as pure functions of per-candidate statistics.

Every function takes membership *scores*, higher = more likely a member: ``scores_in`` of
candidates that were members, ``scores_out`` of candidates that were not. Where a result is a
statistical claim (a confidence interval, a violation, an ε lower bound) it assumes what a DP
audit assumes: the scores are independent trials, each candidate's membership decided
independently of everything else. Many candidates scored against *one* message or model
are not independent trials; for those, use the one-run analysis (Steinke, Nasr & Jagielski
2023), which holds under any dependence between the scores and needs only independent fair
coins: ``method="one-run"`` of :func:`epsilon_lower_bound` where each candidate's membership
was its own coin, :func:`pair_audit` (``method="pairs"``) where a coin picked which of two
candidates is in.

The region (ε, δ)-DP allows (Kairouz, Oh & Viswanath 2015, Thm. 2.1; the hypothesis-testing
view of Wasserman & Zhou 2010): every test of "member" against "not a member" has

    TPR ≤ e^ε · FPR + δ   and   TPR ≤ 1 − e^{−ε} · (1 − δ − FPR),

equivalently FPR + e^ε·FNR ≥ 1 − δ and e^ε·FPR + FNR ≥ 1 − δ. On a log–log ROC the first
bound is the line TPR = e^ε FPR (+ δ): at low FPR a DP mechanism keeps TPR within a factor
e^ε of FPR, which is why MIAs are read at low FPR (Carlini et al. 2022).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats
from scipy.special import logsumexp

from privaudit.core.errors import PrivauditError
from privaudit.eval.bounds import (
    best_threshold,
    check_levels,
    clopper_pearson_epsilon,
    cp_lower,
    cp_upper,
    one_run_audit,
    one_run_group_audit,
)
from privaudit.eval.style import eps_text, num, save, series_style, style_axes

__all__ = [
    "OperatingPoint",
    "Violation",
    "auc",
    "dp_roc_bound",
    "epsilon_lower_bound",
    "lira_offline",
    "lira_online",
    "logit_confidence",
    "loss_score",
    "pair_audit",
    "plot_roc",
    "roc_bound_label",
    "rmia",
    "roc",
    "tpr_at_fpr",
    "violations",
]


def _scores(a: Any, name: str) -> np.ndarray:
    """``a`` as a finite 1-d float64 array (torch tensors included)."""
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    out = np.asarray(a, dtype=np.float64)
    if out.ndim != 1:
        raise PrivauditError(f"{name} must be one score per candidate (1-d), got {out.shape}")
    if not np.isfinite(out).all():
        raise PrivauditError(
            f"{name} holds NaN or ±inf scores; give every candidate a finite score (map ±inf "
            "to a large finite value of the same sign)"
        )
    return out


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise PrivauditError(f"confidence must be in (0, 1), got {confidence}")


def _pair(scores_in: Any, scores_out: Any) -> tuple[np.ndarray, np.ndarray]:
    a, b = _scores(scores_in, "scores_in"), _scores(scores_out, "scores_out")
    if len(a) == 0 or len(b) == 0:
        raise PrivauditError(
            f"need members and non-members to score, got {len(a)} and {len(b)}; pass both"
        )
    return a, b


# -- ROC ---------------------------------------------------------------------------------------
def roc(scores_in: Any, scores_out: Any) -> tuple[np.ndarray, np.ndarray]:
    """The empirical ROC of the tests "member iff score ≥ t" over every threshold t: arrays
    (fpr, tpr), increasing, from (0, 0) (t above every score) to (1, 1). Tied scores move
    both rates in one step (a diagonal segment)."""
    a, b = _pair(scores_in, scores_out)
    thresholds = np.unique(np.concatenate([a, b]))[::-1]
    a_sorted, b_sorted = np.sort(a), np.sort(b)
    tp = len(a) - np.searchsorted(a_sorted, thresholds, side="left")
    fp = len(b) - np.searchsorted(b_sorted, thresholds, side="left")
    tpr = np.concatenate([[0.0], tp / len(a)])
    fpr = np.concatenate([[0.0], fp / len(b)])
    return fpr, tpr


def auc(scores_in: Any, scores_out: Any) -> float:
    """Area under :func:`roc`: P[score_in > score_out] + ½ P[tie] (Mann–Whitney)."""
    fpr, tpr = roc(scores_in, scores_out)
    return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))


@dataclass(frozen=True)
class OperatingPoint:
    """One test "member iff score ≥ threshold": its empirical rates and a two-sided
    Clopper–Pearson interval [tpr_lo, tpr_hi] on its TPR at ``confidence``.

    ``resolution``: 1/n for n non-members, the smallest nonzero FPR the sample can measure;
    ``resolved``: whether the FPR asked for is at least that. Below it the threshold only sits
    above every non-member: the true FPR is not measured (it may be several times 1/n), and
    the TPR is that of another operating point — so it is reported, never printed as a TPR at
    the FPR asked for."""

    threshold: float
    fpr: float
    tpr: float
    tpr_lo: float
    tpr_hi: float
    confidence: float
    resolution: float
    resolved: bool


def tpr_at_fpr(
    scores_in: Any, scores_out: Any, fpr: float, confidence: float = 0.95
) -> OperatingPoint:
    """TPR of the lowest threshold whose empirical FPR on ``scores_out`` is at most ``fpr``
    (the metric of Carlini et al. 2022, "Membership Inference Attacks From First
    Principles"), with an exact two-sided Clopper–Pearson interval on the TPR. The threshold
    is chosen from the non-members only, so given it the members' hits are binomial and the
    interval holds at ``confidence``. With n non-members an FPR below 1/n means no false
    positive at all (the threshold sits above every non-member): the point says it is not
    ``resolved``."""
    _check_confidence(confidence)
    if not 0 <= fpr <= 1:
        raise PrivauditError(f"fpr must be in [0, 1], got {fpr}")
    a, b = _pair(scores_in, scores_out)
    allowed = int(math.floor(fpr * len(b) + 1e-9))  # false positives allowed
    desc = np.sort(b)[::-1]
    if allowed >= len(b):
        thr = -math.inf
    else:
        # "≥ t" admits every score ≥ t: just above the (allowed+1)-th largest non-member
        thr = float(np.nextafter(desc[allowed], math.inf))
    tp = int((a >= thr).sum())
    fp = int((b >= thr).sum())
    alpha = (1 - confidence) / 2
    return OperatingPoint(
        threshold=thr,
        fpr=fp / len(b),
        tpr=tp / len(a),
        tpr_lo=cp_lower(tp, len(a), alpha),
        tpr_hi=cp_upper(tp, len(a), alpha),
        confidence=confidence,
        resolution=1 / len(b),
        resolved=allowed >= 1,
    )


# -- what DP allows ----------------------------------------------------------------------------
def dp_roc_bound(fpr: Any, epsilon: float, delta: float) -> np.ndarray:
    """The largest TPR any test can reach at FPR ``fpr`` against an (ε, δ)-DP mechanism:
    min(e^ε·FPR + δ, 1 − e^{−ε}(1 − δ − FPR)), clipped to [0, 1] (Kairouz, Oh & Viswanath
    2015, Thm. 2.1). ε = ∞ allows TPR = 1 everywhere."""
    if not epsilon >= 0 or not 0 <= delta <= 1:
        raise PrivauditError(f"need ε ≥ 0 and δ in [0, 1], got ε = {epsilon}, δ = {delta}")
    f = np.asarray(fpr, dtype=np.float64)
    if math.isinf(epsilon):
        return np.ones_like(f)
    first = math.exp(epsilon) * f + delta
    second = 1 - math.exp(-epsilon) * (1 - delta - f)
    return np.clip(np.minimum(first, second), 0.0, 1.0)


@dataclass(frozen=True)
class Violation:
    """A test "member iff score > threshold" whose Clopper–Pearson lower bound on TPR lies
    above the DP bound at the Clopper–Pearson upper bound on its FPR."""

    threshold: float
    fpr: float
    tpr: float
    fpr_hi: float
    tpr_lo: float
    bound: float  # dp_roc_bound(fpr_hi)


def _fp_grid(n_out: int) -> list[int]:
    """False-positive counts 0, 1, 2, 4, … from the top and n_out − 1, n_out − 2, n_out − 4,
    … from the bottom: dense at both ends of the ROC, where the DP bound is tightest, and
    O(log n) of them, so the union bound over them costs little."""
    counts = {0}
    k = 1
    while k < n_out:
        counts.update({k, n_out - k})
        k *= 2
    return sorted(c for c in counts if 0 <= c < n_out)


def violations(
    scores_in: Any,
    scores_out: Any,
    epsilon: float,
    delta: float,
    confidence: float = 0.95,
) -> list[Violation]:
    """The ROC points that refute (ε, δ)-DP at ``confidence``.

    The tests examined are "member iff score > t_j" with t_j the (j + 1)-th largest
    non-member score, for the K false-positive counts j of :func:`_fp_grid` (the thresholds
    depend on the non-members alone). Each test gets a Clopper–Pearson upper bound on its
    FPR and lower bound on its TPR, each at level α/(2K) with α = 1 − confidence; a test is
    reported when TPR_lo > dp_roc_bound(FPR_hi). If the mechanism is (ε, δ)-DP every true
    point lies under the bound, and the bound increases with FPR, so a point is reported
    only if one of the 2K bounds fails: probability ≤ α (union bound). The FPR bound is
    exact at an order statistic: the true FPR of "score > (j + 1)-th largest of n" is
    Beta(j + 1, n − j), whose upper quantile is exactly ``cp_upper(j, n, ·)`` (conservative
    with ties). Needs the scores to be independent trials (module docstring)."""
    _check_confidence(confidence)
    a, b = _pair(scores_in, scores_out)
    desc = np.sort(b)[::-1]
    grid = _fp_grid(len(b))
    alpha = (1 - confidence) / (2 * len(grid))
    out: list[Violation] = []
    for thr in dict.fromkeys(float(desc[j]) for j in grid):  # tied thresholds: one test
        tp, fp = int((a > thr).sum()), int((b > thr).sum())
        fpr_hi, tpr_lo = cp_upper(fp, len(b), alpha), cp_lower(tp, len(a), alpha)
        bound = float(dp_roc_bound(fpr_hi, epsilon, delta))
        if tpr_lo > bound:
            out.append(Violation(thr, fp / len(b), tp / len(a), fpr_hi, tpr_lo, bound))
    return out


def epsilon_lower_bound(
    scores_in: Any,
    scores_out: Any,
    delta: float,
    confidence: float = 0.95,
    *,
    method: str = "split",
    seed: int = 0,
) -> float:
    """An ε lower bound from member and non-member scores: ε ≥ it unless an event of
    probability ≤ 1 − ``confidence`` happened.

    ``split`` (independent trials): as the white-box canary audit (:mod:`privaudit.eval.
    audit`). The scores are shuffled (``seed``, independently of their values) and cut in
    two halves; the threshold is chosen on the first half (:func:`~privaudit.eval.bounds.
    best_threshold`) and only the second half is counted, with exact Clopper–Pearson bounds
    on its FPR and FNR turned into ε by TPR ≤ e^ε FPR + δ and TNR ≤ e^ε FNR + δ
    (:func:`~privaudit.eval.bounds.clopper_pearson_epsilon`). Choosing the threshold on the
    counted scores would inflate the bound; the halves avoid it without a union bound.

    ``one-run`` (one message or model, many candidates): Steinke, Nasr & Jagielski 2023,
    :func:`~privaudit.eval.bounds.one_run_audit` on the pooled scores, with the members as
    the included canaries. Valid only when each candidate's membership was decided by its
    own fair coin, independently of the others.

    ``pairs`` (one message or model, a fair coin per member/non-member pair): the bound of
    :func:`pair_audit`, ``scores_in[j]`` and ``scores_out[j]`` being pair j's member and
    non-member.
    """
    check_levels(confidence, delta)
    if method == "pairs":
        return pair_audit(scores_in, scores_out, delta, confidence, seed=seed)["epsilon"]
    a, b = _pair(scores_in, scores_out)
    if method == "one-run":
        scores = np.concatenate([a, b])
        included = np.concatenate([np.ones(len(a), bool), np.zeros(len(b), bool)])
        return float(one_run_audit(scores, included, delta, confidence)["epsilon"])
    if method != "split":
        raise PrivauditError(f"unknown method {method!r}; choose one of: one-run, pairs, split")
    rng = np.random.default_rng(seed)
    a, b = rng.permutation(a), rng.permutation(b)
    ha, hb = len(a) // 2, len(b) // 2
    if ha == 0 or hb == 0 or len(a) - ha == 0 or len(b) - hb == 0:
        return 0.0
    thr = best_threshold(a[:ha], b[:hb], delta, confidence)
    return float(clopper_pearson_epsilon(a[ha:], b[hb:], thr, delta, confidence))


def pair_audit(
    scores_in: Any,
    scores_out: Any,
    delta: float,
    confidence: float = 0.95,
    *,
    seed: int = 0,
) -> dict[str, float]:
    """An ε lower bound (of adding or removing one example) from member/non-member pairs
    whose scores may depend on each other in any way (one message, one model, one run).

    ``scores_in[j]`` and ``scores_out[j]`` are pair j's member and non-member, where a fair
    coin, given the pair and independently of the other pairs' coins, decided which of the
    two is the member: the model-level game (:mod:`privaudit.api.model_membership`) flips it; in
    a message's Poisson batch matched with as many non-members drawn at random from the rest
    of the shard, every way of picking one per pair is equally likely (the batch's
    probability depends on its size alone).

    The one-run analysis of Steinke, Nasr & Jagielski 2023 ("Privacy Auditing with One (1)
    Training Run", Thm. 3.1 and its δ > 0 form): canary j is pair j in an order drawn by a
    fair coin (``seed``, independent of the scores), S_j whether its first is the member,
    its score first − second (:func:`~privaudit.eval.bounds.one_run_group_audit` guesses the
    most extreme). Flipping S_j swaps one example for another: two changes, so a mechanism
    (ε, δ)-DP for one addition or removal is (2ε, (1 + e^ε)δ)-DP in each coin
    (:func:`~privaudit.eval.bounds.group_privacy`), and the bound is on that ε. The theorem
    asks nothing of the scores' joint law, only of the coins: independent fair coins.

    Returns ``epsilon``, ``pairs`` (the independent coins it rests on), ``guesses`` and
    ``correct``."""
    check_levels(confidence, delta)
    a, b = _scores(scores_in, "scores_in"), _scores(scores_out, "scores_out")
    if len(a) != len(b):
        raise PrivauditError(
            f"pairs need one member and one non-member each, got {len(a)} members and "
            f"{len(b)} non-members; pass scores_in[j], scores_out[j] of pair j"
        )
    first_in = np.random.default_rng(seed).random(len(a)) < 0.5
    diff = np.where(first_in, a - b, b - a)
    res = one_run_group_audit(diff, first_in, delta, confidence, group=2)
    return {
        "epsilon": float(res["epsilon"]),
        "pairs": len(a),
        "guesses": int(res["guesses"]),
        "correct": int(res["correct"]),
    }


# -- model-level scorers -----------------------------------------------------------------------
def logit_confidence(logits: Any, labels: Any) -> np.ndarray:
    """φ = log(p_y / (1 − p_y)) of the softmax probability p_y of each example's label,
    computed stably as z_y − log Σ_{j≠y} e^{z_j} (Carlini et al. 2022, §IV.C: the logit
    scaling that makes the confidence of a model over training runs close to Gaussian).
    ``logits`` (n, K) with K ≥ 2, ``labels`` (n,)."""
    if hasattr(logits, "detach"):
        logits = logits.detach().cpu().numpy()
    if hasattr(labels, "detach"):
        labels = labels.detach().cpu().numpy()
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels)
    if z.ndim != 2 or z.shape[1] < 2 or y.shape != (z.shape[0],):
        raise PrivauditError(
            f"logit_confidence needs logits (n, K ≥ 2) and labels (n,), got {z.shape} and {y.shape}"
        )
    rows = np.arange(len(y))
    zy = z[rows, y]
    others = z.copy()
    others[rows, y] = -np.inf
    return zy - logsumexp(others, axis=1)


def loss_score(losses: Any) -> np.ndarray:
    """The LOSS attack (Yeom, Giacomelli, Fredrikson & Jha 2018, "Privacy Risk in Machine
    Learning"): a model fits its training examples better, so score = −loss."""
    return -_scores(losses, "losses")


def _fit(conf: Any, name: str, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    c = np.asarray(conf.detach().cpu().numpy() if hasattr(conf, "detach") else conf, float)
    if c.ndim != 2 or c.shape[0] != n:
        raise PrivauditError(
            f"{name} must be (n, k): k reference-model confidences per candidate (NaN where "
            f"a model has none), got {c.shape} for n = {n}"
        )
    count = np.sum(~np.isnan(c), axis=1)
    if (count < 1).any():
        raise PrivauditError(f"{name}: every candidate needs at least one reference confidence")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.nanmean(c, axis=1), np.nanvar(c, axis=1), count


def _variance(var: np.ndarray, count: np.ndarray, global_variance: bool) -> np.ndarray:
    """Per-candidate variance, or (``global_variance``, or fewer than 2 samples) the mean of
    the per-candidate ones that have 2 or more; floored so a constant fit does not divide by
    zero."""
    ok = count >= 2
    pooled = float(np.mean(var[ok])) if ok.any() else 1.0
    out = np.full_like(var, pooled) if global_variance else np.where(ok, var, pooled)
    return np.maximum(out, 1e-12 * max(pooled, 1e-300))


def lira_online(
    target_conf: Any, in_confs: Any, out_confs: Any, *, global_variance: bool = False
) -> np.ndarray:
    """LiRA, online (Carlini, Chien, Nasr, Song, Terzis & Tramèr 2022, "Membership Inference
    Attacks From First Principles", Alg. 1): per candidate, Gaussians fit to the
    logit-scaled confidences φ (:func:`logit_confidence`) of reference models trained with
    it (``in_confs``) and without it (``out_confs``), and the log-likelihood ratio

        log Λ = log N(φ; μ_in, σ_in²) − log N(φ; μ_out, σ_out²).

    ``target_conf`` (n,); ``in_confs`` (n, k_in) and ``out_confs`` (n, k_out), NaN where a
    reference model has no value for a candidate. ``global_variance``: one σ² per side
    pooled over candidates, the paper's choice with few reference models."""
    phi = _scores(target_conf, "target_conf")
    mu_in, var_in, n_in = _fit(in_confs, "in_confs", len(phi))
    mu_out, var_out, n_out = _fit(out_confs, "out_confs", len(phi))
    var_in = _variance(var_in, n_in, global_variance)
    var_out = _variance(var_out, n_out, global_variance)
    return stats.norm.logpdf(phi, mu_in, np.sqrt(var_in)) - stats.norm.logpdf(
        phi, mu_out, np.sqrt(var_out)
    )


def lira_offline(target_conf: Any, out_confs: Any, *, global_variance: bool = False) -> np.ndarray:
    """LiRA, offline (Carlini et al. 2022, §VI.C): only reference models trained without the
    candidate; a one-sided test of φ against N(μ_out, σ_out²). The paper's score is
    Λ = Pr[Z < φ] = Φ((φ − μ_out)/σ_out); this returns z = (φ − μ_out)/σ_out, which ranks
    exactly as Λ without saturating at 1. Shapes as :func:`lira_online`."""
    phi = _scores(target_conf, "target_conf")
    mu, var, count = _fit(out_confs, "out_confs", len(phi))
    return (phi - mu) / np.sqrt(_variance(var, count, global_variance))


def _probs(p: Any, name: str, ndim: int) -> np.ndarray:
    a = np.asarray(p.detach().cpu().numpy() if hasattr(p, "detach") else p, float)
    if a.ndim != ndim:
        raise PrivauditError(f"{name} must have {ndim} dimension(s), got shape {a.shape}")
    if not ((a >= 0) & (a <= 1)).all():
        raise PrivauditError(f"{name} must be probabilities in [0, 1] (softmax of the label)")
    return a


def rmia(
    target_probs_x: Any,
    ref_probs_x: Any,
    target_probs_z: Any,
    ref_probs_z: Any,
    gamma: float = 1.0,
    a: float | None = None,
) -> np.ndarray:
    """RMIA (Zarifzadeh, Liu, Cheng & Shokri 2024, "Low-Cost High-Power Membership Inference
    Attacks", Eqs. 3–5): the likelihood ratio of each candidate x against population
    samples z,

        LR(x, z) = (Pr(x|θ) / Pr(x)) / (Pr(z|θ) / Pr(z)),
        score(x) = fraction of the z with LR(x, z) ≥ γ,

    where Pr(·|θ) is the target model's probability of the true label and Pr(·) its mean
    over reference models. Online (``a`` None): the reference models include ones trained
    on x, Pr(x) = mean(ref_probs_x). Offline (``a`` in [0, 1]): only models trained without
    x, and the paper's approximation Pr(x) = ½((1 + a) · mean_out(x) + (1 − a)) of the
    in-and-out mean, applied to x and z alike.

    ``target_probs_x`` (n,), ``ref_probs_x`` (n, k), ``target_probs_z`` (m,),
    ``ref_probs_z`` (m, k); probabilities in [0, 1]. The paper picks γ and a per setting;
    γ = 1 compares the two ratios as they are."""
    if a is not None and not 0 <= a <= 1:
        raise PrivauditError(f"RMIA's offline a must be in [0, 1], got {a}")
    if not gamma > 0:
        raise PrivauditError(f"RMIA's γ must be positive, got {gamma}")
    px, rx = _probs(target_probs_x, "target_probs_x", 1), _probs(ref_probs_x, "ref_probs_x", 2)
    pz, rz = _probs(target_probs_z, "target_probs_z", 1), _probs(ref_probs_z, "ref_probs_z", 2)
    if rx.shape[0] != len(px) or rz.shape[0] != len(pz) or len(pz) == 0:
        raise PrivauditError(
            "RMIA needs ref_probs_x (n, k) for n candidates and ref_probs_z (m, k) for m ≥ 1 "
            f"population samples, got {rx.shape} for n = {len(px)} and {rz.shape} for m = "
            f"{len(pz)}"
        )

    def marginal(ref: np.ndarray) -> np.ndarray:
        mean = ref.mean(axis=1)
        return mean if a is None else 0.5 * ((1 + a) * mean + (1 - a))

    tiny = np.finfo(np.float64).tiny
    ratio_x = px / np.maximum(marginal(rx), tiny)
    ratio_z = np.sort(pz / np.maximum(marginal(rz), tiny))
    # LR(x, z) ≥ γ  ⇔  ratio_z ≤ ratio_x / γ
    return np.searchsorted(ratio_z, ratio_x / gamma, side="right") / len(ratio_z)


# -- figure ------------------------------------------------------------------------------------
def roc_bound_label(epsilon: float, delta: float) -> str:
    """The guarantee in a legend, to 3 significant digits: ``(ε = 3.67, δ = 1e-05)-DP``."""
    return f"({eps_text(epsilon)}, δ = {num(delta, 2)})-DP"


def plot_roc(
    curves: Mapping[str, tuple[Any, Any]],
    path: str | os.PathLike[str],
    bound: tuple[float, float] | None = None,
    title: str = "membership inference",
) -> Path:
    """Log–log ROC curves, one per name in ``curves`` (``(fpr, tpr)`` as from :func:`roc`),
    overlaid on one axes in the figure style's colours, with the chance diagonal and, given
    ``bound`` = (ε, δ), the edge of the region (ε, δ)-DP allows (:func:`dp_roc_bound`),
    dashed, and the area beyond it shaded: a curve there is more than the guarantee
    permits. Zero rates have no place on a log axis: they are drawn at half the smallest
    positive FPR of any curve (1e-5 if none has one). Written as a 300 dpi PNG at ``path``
    and as PDF beside it (:func:`privaudit.eval.style.save`); returns ``path``. ``title``
    names the threat, target and rounds (:func:`privaudit.eval.style.title`)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    if not curves:
        raise PrivauditError("plot_roc needs at least one curve; pass {name: (fpr, tpr)}")
    data = {}
    positive = []
    for name, (f, t) in curves.items():
        f, t = np.asarray(f, float), np.asarray(t, float)
        if f.shape != t.shape or f.ndim != 1:
            raise PrivauditError(f"curve {name!r}: fpr and tpr must be 1-d arrays of one length")
        data[name] = (f, t)
        positive += [f[f > 0].min()] if (f > 0).any() else []
    floor = 0.5 * min(positive) if positive else 1e-5
    fig = Figure(figsize=(4.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    grid = np.geomspace(floor, 1, 200)
    ax.plot(grid, grid, color="0.6", lw=0.8, ls=":", label="chance")
    if bound is not None:
        eps, delta = bound
        edge = np.maximum(dp_roc_bound(grid, eps, delta), floor)
        dp = roc_bound_label(eps, delta)
        ax.plot(grid, edge, color="k", ls="--", lw=1, label=f"edge of the region {dp} allows")
        ax.fill_between(
            grid, edge, 1.05, color="#D55E00", alpha=0.12, lw=0, label=f"beyond it: refutes {dp}"
        )
    style = series_style(list(data))
    for name, (f, t) in data.items():
        color, _ = style[name]
        ax.plot(np.maximum(f, floor), np.maximum(t, floor), lw=1.3, color=color, label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):  # decades only: minor labels collide on a short range
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(floor, 1)
    ax.set_ylim(floor, 1.05)
    ax.set_xlabel("false-positive rate", fontsize=7.5)
    ax.set_ylabel("true-positive rate", fontsize=7.5)
    ax.set_title(title, fontsize=7.5)
    ax.legend(fontsize=6.5, loc="lower right", framealpha=0.9, edgecolor="0.8")
    style_axes(ax)
    path = Path(path)
    save(fig, path)
    return path
