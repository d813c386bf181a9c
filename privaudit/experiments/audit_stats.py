"""The audits' statistics: how many trials, which bounds, what verdict.

- how many trials a bound needs (:func:`check_trials`), how many canary candidates a budget
  affords (:func:`search_size`) and how the search spends its trials (:class:`SearchPlan`:
  a pilot over K candidates at 1 − α/(2K), the chosen one's final phase at 1 − α/2, so
  that the K + 1 bounds hold together at 1 − α);
- the bounds of a set of scored trials (:func:`white_box_bounds`: Clopper–Pearson at a
  threshold chosen on held-out trials, the Gaussian-DP estimate where the scores are an
  exact Gaussian shift, the trade-off curve's band), used by the white-box and final-model
  audits;
- the whitened statistic over messages whose noise is correlated (:func:`gls_direction`);
- the verdict of a lower bound against an upper bound (:func:`verdict`).

Numerics on scores only: the trials that produce them are
:mod:`privaudit.experiments.audit_trials` and :mod:`privaudit.experiments.final_audit`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from privaudit.core.errors import PrivauditError
from privaudit.eval import bounds, fdp

LOOSE = 0.5  # a lower bound below LOOSE × the upper bound is "loose"
HELD_OUT = 0.5  # share of white-box trials kept to evaluate the threshold chosen on the rest
CURVE = 100  # thresholds of a white-box audit's trade-off curve (the band's Bonferroni split)
PILOT = 0.25  # share of white-box trials the canary search's pilot deals over its candidates


ONE_RUN_TESTS = 2  # the f-DP analysis's ε and its μ, on one run's canaries


def one_run_level(confidence: float) -> float:
    """The confidence of each of the one-run audit's :data:`ONE_RUN_TESTS` tests: 1 − α/2,
    so that the two hold together at ``confidence`` (Bonferroni)."""
    return 1 - (1 - confidence) / ONE_RUN_TESTS


def check_trials(
    trials: int,
    delta: float,
    confidence: float = 0.95,
    mode: str = "white-box",
    flag: str = "--trials",
    audit: str | None = None,
) -> int:
    """The fewest trials any bound needs — white box: Clopper–Pearson at 1 − α/2 on the
    held-out half; one run: canaries for the f-DP analysis's ε bound at its share of the
    level, :func:`one_run_level` — and the error for fewer
    ``trials``, naming the option ``flag`` and the ``audit`` (default: ``mode``'s)."""
    bounds.check_levels(confidence, delta)
    if mode == "white-box":
        need, what = bounds.trials_needed(delta, 1 - (1 - confidence) / 2, HELD_OUT), "trials"
    else:
        need = fdp.one_run_canaries_needed(delta, one_run_level(confidence))
        what = "canaries"
    if trials < need:
        raise PrivauditError(
            f"{flag} {trials} is too few for any bound at confidence {confidence} "
            f"(δ = {delta:g}); the {audit or mode} audit needs at least {need} {what}"
        )
    return need


def search_size(k: int, trials: int, delta: float, confidence: float) -> int:
    """How many of ``k`` candidates ``trials`` afford: the largest K whose pilot share gives
    every candidate the trials a bound at 1 − α/(2K) needs (Clopper–Pearson at half of that
    beside the Gaussian-DP estimate, :func:`check_trials`), and leaves the final phase the
    trials a bound at 1 − α/2 needs; 1 (no search: every trial on the first) otherwise."""
    alpha = 1 - confidence
    final = bounds.trials_needed(delta, 1 - alpha / 4, HELD_OUT)
    for m in range(k, 1, -1):
        pilot = int(trials * PILOT)
        each = bounds.trials_needed(delta, 1 - alpha / (4 * m), HELD_OUT)
        if pilot // m >= each and trials - pilot >= final:
            return m
    return 1


@dataclass(frozen=True)
class SearchPlan:
    """How the trials are spent: the first ``pilot`` dealt round-robin over ``k``
    candidates, each bound at ``levels[0]`` = 1 − α/(2k); the rest on the candidate with the
    pilot's largest bound, at ``levels[1]`` = 1 − α/2 (k = 1: no pilot, 1 − α)."""

    k: int
    pilot: int
    levels: tuple[float, float]
    gaussian: bool
    delta: float

    @classmethod
    def of(cls, k: int, trials: int, confidence: float, gaussian: bool, delta: float) -> SearchPlan:
        if k == 1:
            return cls(1, 0, (confidence, confidence), gaussian, delta)
        alpha = 1 - confidence
        return cls(k, int(trials * PILOT), (1 - alpha / (2 * k), 1 - alpha / 2), gaussian, delta)

    def bounds(
        self, scores: np.ndarray, coins: np.ndarray, who: np.ndarray, trials: range, level: float
    ) -> list[dict[str, Any] | None]:
        """Each candidate's bounds on its trials among ``trials`` (None with fewer than 3 with
        and 3 without the canary)."""
        idx = np.arange(trials.start, trials.stop)
        out: list[dict[str, Any] | None] = []
        for j in range(self.k):
            mine = idx[who[idx] == j]
            if coins[mine].sum() < 3 or (~coins[mine]).sum() < 3:
                out.append(None)
                continue
            b = white_box_bounds(scores[mine], coins[mine], self.gaussian, self.delta, level)
            out.append({**b, "trials": len(mine)})
        return out


def epsilon_lo_of(bound: dict[str, Any] | None) -> float:
    """A candidate's ε lower bound, or −1 where it has none (any bound then beats it)."""
    return -1.0 if bound is None else bound["epsilon_lo"]


def white_box_bounds(
    scores: np.ndarray, coins: np.ndarray, gaussian: bool, delta: float, confidence: float
) -> dict[str, Any]:
    """Clopper–Pearson (any channel) and, where the scores are a Gaussian shift (``gaussian``),
    the Gaussian-DP estimate; the larger lower bound holds at ``confidence``."""
    n = len(scores)
    # two bounds, each at 1 − α/2, so that the larger of them holds at 1 − α (Bonferroni)
    level = 1 - (1 - confidence) / 2 if gaussian else confidence
    cut = int(n * (1 - HELD_OUT))
    sel_in, sel_out = scores[:cut][coins[:cut]], scores[:cut][~coins[:cut]]
    sign = 1.0 if sel_in.mean() >= sel_out.mean() else -1.0
    thr = bounds.best_threshold(sign * sel_in, sign * sel_out, delta, level)
    ev_in, ev_out = sign * scores[cut:][coins[cut:]], sign * scores[cut:][~coins[cut:]]
    cp = bounds.clopper_pearson_epsilon(ev_in, ev_out, thr, delta, level)
    cap = bounds.max_cp_epsilon(len(ev_in), len(ev_out), delta, level)
    out: dict[str, Any] = {
        "clopper_pearson": {
            "epsilon_lo": cp,
            "threshold": thr,
            "capped": cp >= cap - 1e-9,
            "cap": cap,
            "evaluated": len(ev_in) + len(ev_out),
            "confidence": level,
        }
    }
    lower = cp
    if gaussian:
        g = bounds.gdp_estimate(scores[coins], scores[~coins], delta, level)
        out["gdp"] = {**{k: float(v) for k, v in g.items()}, "confidence": level}
        lower = max(lower, g["epsilon_lo"])
    out["epsilon_lo"] = lower
    out["confidence"] = confidence
    out["delta"] = delta
    # the trade-off curve of every trial's score with its band, and the μ it rules out:
    # reported beside the ε bound, at its own confidence (not part of epsilon_lo)
    curve = fdp.tradeoff_curve(sign * scores[coins], sign * scores[~coins], confidence, CURVE)
    out["tradeoff"] = {"mu_lo": fdp.mu_lower_bound(curve), "curve": curve}
    return out


def gls_direction(shift: Tensor, outs: list[Tensor], rows: int) -> Tensor:
    """The generalised-least-squares direction Σ⁺Δ for scoring a stack of ``rows`` messages
    of one size whose noise is correlated across messages (gossip mixes every agent's
    noise into each) and independent, with one covariance Σ (rows × rows), across
    coordinates: the score ⟨Σ⁺Δ, o⟩ is the likelihood-ratio statistic of a Gaussian shift
    Δ (Neyman–Pearson), where the plain projection ⟨Δ, o⟩ is not. Σ is estimated from the
    noise-only trials ``outs`` (coordinates centred over the trials, pooled), never from
    scored trials, so any error in it costs power, not validity. A part of the shift outside
    the noise's span (no noise there: eigenvalues below 1e-9 of the largest, or no noise at
    all) is noise-free, and the projection on that part separates perfectly: it is
    returned instead. Unit norm, flat."""
    o = torch.stack(outs).reshape(len(outs), rows, -1)
    c = o - o.mean(0)
    cov = torch.einsum("nrd,nsd->rs", c, c) / ((len(outs) - 1) * c.shape[2])
    evals, evecs = torch.linalg.eigh(cov)
    keep = evals > 1e-9 * float(evals.max()) if float(evals.max()) > 0 else evals < 0
    basis, delta = evecs[:, keep], shift.reshape(rows, -1)
    inside = basis.T @ delta
    free = delta - basis @ inside
    d = (
        free
        if float(free.norm()) > 1e-3 * float(delta.norm())
        else basis @ (inside / evals[keep, None])
    )
    d = d.reshape(-1)
    return d / d.norm() if float(d.norm()) > 0 else d


def verdict(lower: float, upper: float, slack: float = LOOSE) -> str:
    """``violated`` when the lower confidence bound exceeds the upper bound; ``loose`` when
    it is below ``slack`` × the upper bound; ``no guarantee`` when the upper bound is ∞."""
    if math.isinf(upper):
        return "no guarantee"
    if lower > upper:
        return "violated"
    return "loose" if lower < slack * upper else "consistent"
