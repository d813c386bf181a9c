"""Empirical DP auditing of a target's own messages with canaries.

Two experiments, both on the defense's real round code, stepped by the engine's round loop
(:class:`privaudit.sim.loop.RoundLoop`, over a Network whose tap captures what it sends: a
copy of the run, :mod:`privaudit.sim.copies`), and scored on what the threat model's View
lets an adversary compute (``defense.observe``):

- **white box** (:func:`white_box`): the run is restored to the state before round ``t``
  and the victim's batch of round t is fixed. Each trial flips a fair coin: heads, a canary
  is added to the victim's batch as one extra example (add/remove adjacency, the
  convention of the accountant; the defense's own clip applies to it); tails, it is not.
  The round is re-run — the only randomness left is the defense's fresh noise — and the
  Observation's target is projected on the canary's mean shift (for a Gaussian channel with
  isotropic noise the projection on the shift is the likelihood-ratio statistic: the most
  powerful test, by Neyman–Pearson). Gradients are computed once and replayed (a call
  whose inputs equal the first trial's, as the fixed state and batch make them), and the
  round loop ends a trial's last round as soon as the messages the View needs have crossed
  the network, so thousands of trials are cheap. Bounds: Clopper–Pearson at a threshold
  chosen on held-out trials, and, where the Observation is exactly a Gaussian release
  (``meta["exact"]``), a Gaussian-DP estimate with a confidence interval
  (:mod:`privaudit.eval.bounds`); each at 1 − α/2, so the larger holds at 1 − α. The
  upper bound is the ε of the ``copies`` releases the Observation combines.
- **many canaries per trial** (``canaries`` K ≥ 2, :mod:`privaudit.experiments.audit_pooled`):
  where one release is a Gaussian mechanism over per-example clipped gradients and the
  Observation is exactly that release, K Dirac canaries of norm C on distinct coordinates,
  each in by its own coin, are K adjacent pairs per trial; their pooled Gaussian-DP
  estimate (cluster-robust over trials) beside Clopper–Pearson on the first canary alone
  bounds μ as nK one-canary trials would: at 10,000 trials, from at most 0.87 of ε = 1
  (one score per trial) to 0.98.
- **the canary search** (:func:`~privaudit.eval.canaries.candidates`): a canary that fits
  one mechanism is weak on another (a Dirac of norm C cannot show that a step forgot to
  clip), so the white-box audit tries K candidates — norms C, 100C, 10C, shapes Dirac,
  against the victim's clean batch gradient, and a real, mislabeled example whose gradient
  the defense computes and clips as any other. A pilot, the first ``PILOT`` of the trials
  dealt round-robin over the candidates, gives each a bound at 1 − α/(2K); the candidate
  with the largest is audited on the remaining, fresh trials at 1 − α/2. The K + 1 bounds
  hold together at 1 − α (Bonferroni), so their maximum — the reported bound — does too. A
  budget too small for K candidates keeps the first K' that it affords (a choice fixed
  before any trial).
- **span** (``span`` K ≥ 1): the canary joins round t's batch only, and the statistic is the
  projection of the stacked Observations of rounds t..t+K on their mean shift, measured by
  ``SHIFT_PAIRS`` paired trials (the same noise with and without the canary): the best
  linear statistic, where a defense's later releases depend on round t's data (DPDL's
  cross-gradients are evaluated at the receiver's model, which carries the victim's
  un-noised self-gradient). It is compared with the K + 1 releases composed (sample rate 1):
  a mechanism whose later releases are post-processing of public values plus fresh noise
  cannot exceed it. Only Clopper–Pearson applies (the stacked scores are no exact
  Gaussian shift).
- **beyond the neighbourhood** (``attackers`` that receive no copy of the ``victim``'s
  message, e.g. an agent d ≥ 2 hops away): the canary joins the victim's round-t batch as
  above, and the Observation is everything the coalition holds of rounds t..t+span: every
  message a member receives or sends (its own, whose noise it knows), raw payloads stacked.
  Gossip mixes every agent's noise into each message, so the projection on the mean shift
  is not the best linear test: the score is the whitened (generalised-least-squares) one,
  ⟨Σ⁺Δ, o⟩ (:func:`gls_direction`; Σ the noise covariance across the messages, measured
  on noise-only trials), which on a linear Gaussian view is the likelihood-ratio test. The
  canary's effect needs hops to arrive (D-PSGD: one per round, so span ≥ d − 1;
  Muffliato: K − 1 per round within the round's gossip), and an audit whose shift is zero
  everywhere is refused with the fix (raise ``span``). Upper bounds: the victim's releases
  of rounds t..t+span composed (everything the coalition holds is a function of them, of
  other agents' data and of fresh noise), and, where the defense states one
  (:attr:`Privacy.pairwise`, Muffliato), its pairwise network-DP bound over the same rounds
  from the exact view of what the coalition holds, with the paper's own number beside it
  (:func:`privaudit.core.accounting.pairwise_epsilon`). One round of a defense whose
  messages are linear in its updates (it states a recursion) makes the score exactly
  Gaussian, and the Gaussian-DP estimate applies beside Clopper–Pearson; otherwise
  Clopper–Pearson alone.
- **one run** (:func:`one_run`, Steinke, Nasr & Jagielski 2023): m Dirac canary gradients on
  distinct coordinates, each included with probability ½; an included canary joins the
  victim's batch in each round with the run's sampling rate q (Poisson, as accounted). One
  training run; each canary is scored by the sum over rounds of its coordinate of the
  observed target, and top/bottom guesses give the bound.
- **final models** (:mod:`privaudit.experiments.final_audit`): the adversary sees only the
  models after round T, the canary in every round (the hidden-state threat model).

The canary (Nasr et al. 2023, "Tight auditing"): a Dirac gradient whose norm is the clip C
for per-example clipping (its clipped contribution is C·e_k, the worst case); for a flat
clip of the batch mean it points against the victim's clean gradient with a norm that
dominates the batch (the clipped mean then swings from ≈ C·u to ≈ −C·u: sensitivity 2C);
without any clip its norm is ``canary_norm`` (default 1). A white-box canary's ``impact``
is measured, not assumed: the L2 change of the observed release between two trials on the
same noise, with and without it (C/B for a clipped Dirac, its full norm/B where nothing
clips); the paper rules stated in Δf are evaluated at it.

Where each part lives: this module is the entry point (:func:`audit`: an experiment, every
upper bound beside it and the verdicts) and re-exports what callers use of its parts; the
canary where the defense computes its gradients is :mod:`~privaudit.experiments.canary_grads`,
the audited message :mod:`~privaudit.experiments.audit_setting`, the trials (white box and
one run) :mod:`~privaudit.experiments.audit_trials`, the statistics (trial counts, the
search's plan, bounds, verdicts) :mod:`~privaudit.experiments.audit_stats`, and the result
:func:`audit` returns (:class:`~privaudit.experiments.audit_result.AuditResult`: what every
audit has as named fields, the document ``privaudit audit`` writes as ``to_dict()``)
:mod:`~privaudit.experiments.audit_result`.
"""

from __future__ import annotations

import math
from typing import Any

from privaudit.core.accounting import account, pairwise_epsilon
from privaudit.core.errors import PrivauditError
from privaudit.experiments.audit_pooled import pooled
from privaudit.experiments.audit_result import AuditResult
from privaudit.experiments.audit_setting import Setting, audited_message
from privaudit.experiments.audit_stats import (
    CURVE,
    HELD_OUT,
    LOOSE,
    PILOT,
    check_trials,
    gls_direction,
    search_size,
    verdict,
    white_box_bounds,
)
from privaudit.experiments.audit_trials import SHIFT_PAIRS, one_run, reseed, white_box
from privaudit.experiments.canary_grads import CanaryGrads, audit_batch
from privaudit.sim.run import Run
from privaudit.sim.targets import Target

__all__ = [
    "CURVE",
    "HELD_OUT",
    "LOOSE",
    "PILOT",
    "SHIFT_PAIRS",
    "AuditResult",
    "CanaryGrads",
    "Setting",
    "audit",
    "audit_batch",
    "audited_message",
    "check_trials",
    "gls_direction",
    "one_run",
    "reseed",
    "search_size",
    "verdict",
    "white_box",
    "white_box_bounds",
]


def audit(
    run: Run, target: str | Target, mode: str = "white-box", round: int = 1, **kw: Any
) -> AuditResult:
    """The audit of ``mode`` plus every upper bound and a verdict against each, as an
    :class:`AuditResult` (its ``to_dict()``: the document ``privaudit audit`` writes). A
    white-box audit's accountant bound is the ε of the releases its Observations combine
    (``copies``: one per observed round and copy, composed at sample rate 1: K + 1 releases
    for a span of K); the paper's Δf-rule, one round's, is evaluated at each candidate's own
    impact and the most severe comparison decides (:func:`white_box`'s bounds hold
    together)."""
    if mode not in ("white-box", "one-run"):
        raise PrivauditError(f"--mode must be white-box or one-run, got {mode!r}")
    tgt = Target.of(target)
    target = tgt.name  # the name, in what is written
    per_trial = kw.pop("canaries", None)
    if mode == "white-box" and per_trial is not None and per_trial > 1:
        for flag, key in (("--span", "span"), ("--canary-shape", "canary_shape")):
            if kw.pop(key, None):
                raise PrivauditError(f"{flag} is for one canary per trial; drop it or --canaries")
        if kw.pop("canary_norm", None) is not None:
            raise PrivauditError("--canaries K uses Dirac canaries of norm C; drop --canary-norm")
        res = pooled(run, tgt, round, canaries=per_trial, **kw)
    elif mode == "white-box":
        res = white_box(run, tgt, round, **kw)
    else:
        if per_trial is not None:
            raise PrivauditError("--canaries is for the white-box audit (one run: --trials)")
        for flag, key in (("--span", "span"), ("--canary-shape", "canary_shape")):
            if kw.pop(key, None):
                raise PrivauditError(f"{flag} is for the white-box audit; drop it or --mode")
        kw["canaries"] = kw.pop("trials", 1000)
        res = one_run(run, tgt, **kw)
    victim, delta = res["victim"], run.cfg.delta
    privacy = tgt.privacy(run, victim)
    q = run.resolved["agents"][victim]["sample_rate"]
    acc = account(privacy, delta, q, run.cfg.rounds, run.cfg.accountant, res.get("copies", 1))
    rule = privacy.paper_epsilon
    acc["paper_epsilon"] = rule(delta, res["canary"]["impact"]) if rule else None
    unit = "release" if mode == "white-box" else "run"
    uppers = {
        "accountant": acc[unit],
        "paper's count": acc[f"{unit}_claimed"],
    }
    observers = res.get("attackers", [])
    if privacy.pairwise is not None and mode == "white-box" and observers:
        # the pairwise network-DP bound towards the attackers over the rounds observed: the
        # exact view's, and the paper's theorem beside it (where it is below the exact one,
        # a linear attacker on what the attackers hold beats it)
        rounds = res["span"] + 1
        uppers["pairwise"] = pairwise_epsilon(privacy, observers, delta, rounds)
        acc["pairwise_share"] = float(privacy.pairwise(observers))
        if privacy.pairwise_paper is not None:
            paper = pairwise_epsilon(privacy, observers, delta, rounds, True, theorem=True)
            uppers["pairwise, paper's theorem"] = paper
            acc["pairwise_share_paper"] = float(privacy.pairwise_paper(observers))
            # the paper's number against the exact view's at the same (the paper's) σ
            acc["pairwise_beatable"] = paper < pairwise_epsilon(
                privacy, observers, delta, rounds, claimed=True
            )
    lower = res["epsilon_lo"]
    verdicts = {k: verdict(lower, u) for k, u in uppers.items()}
    if rule is not None and mode == "white-box" and not res["span"]:  # the rules are per round
        found = res["search"]["candidates"]
        for c in found:
            c["paper"] = rule(delta, c["impact"])
        lo, up = max(((max(c["epsilon_lo"], 0.0), c["paper"]) for c in found), key=_severity)
        uppers["paper"], verdicts["paper"] = up, verdict(lo, up)
    res["accounting"] = acc
    res["upper"] = uppers
    res["verdicts"] = verdicts
    if mode == "one-run":  # the f-DP μ test beside: violated when either says so
        res["mu"] = one_run_mu(res["one_run_fdp"]["mu_lo"], acc, res["level"])
    mu_violated = res.get("mu", {}).get("verdict") == "violated"
    res["verdict"] = "violated" if mu_violated else verdicts["accountant"]
    return AuditResult.from_dict(res)


def one_run_mu(lower: float, acc: dict[str, Any], confidence: float) -> dict[str, Any]:
    """The one-run audit's μ test: the μ its canaries' outcome rejects (the f-DP analysis,
    at ``confidence``, its share of the audit's) against the run's accounted μ = √(T·r)/z,
    where every release of the victim is a formal Gaussian one at multiplier z: T rounds of
    r releases composed (Dong, Roth & Su 2022, Cor. 3.3); Poisson sampling at q < 1 only
    raises the trade-off curve, so it bounds a sampled run too. ``upper`` None (and no
    verdict) where a release is not such a Gaussian."""
    z = acc["noise_multiplier"]
    gaussian = acc["formal"] and acc["mechanism"] == "gaussian" and z > 0
    up = math.sqrt(acc["rounds"] * acc["releases_per_round"]) / z if gaussian else None
    return {
        "lower": lower,
        "upper": up,
        "confidence": confidence,
        "verdict": None if up is None else verdict(lower, up),
    }


def _severity(pair: tuple[float, float]) -> float:
    """How far a lower bound goes toward its upper bound: their ratio (∞ past a 0 bound)."""
    lo, up = pair
    if math.isinf(up):
        return 0.0
    return lo / up if up > 0 else (math.inf if lo > 0 else 0.0)
