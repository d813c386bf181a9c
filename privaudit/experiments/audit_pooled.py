"""The white-box audit with many canaries per trial (``--canaries K``).

A trial of the white-box audit re-runs one round and scores one observation, so its
Gaussian-DP bound is limited by the trials: the lower confidence limit on μ sits about
z·2/√n below it (``tests/test_audit_limit.py``: at 10,000 trials 0.87 and 0.93 of ε = 1 and
2 at best). Where one release is a Gaussian mechanism over per-example clipped gradients,
K Dirac canaries of norm C on K distinct coordinates are K examples of the same batch, each
in or out by its own fair coin, and each pair "canary k out / in" is a pair of adjacent
datasets (add/remove one example) whatever the other canaries do; with the mechanism's
isotropic noise their scores — each canary's coordinate of the observation — are K
independent Gaussian shifts per trial. Pooled (:func:`privaudit.eval.bounds.pooled_gdp_estimate`,
whose intervals are cluster-robust over trials, so a correlation between one trial's
scores costs power, not validity), n trials bound μ as nK single-canary trials would.

The bound is the larger of two, each at 1 − α/2: Clopper–Pearson on the first canary's
scores alone (one per trial: no assumption on the score distribution) and the pooled
Gaussian-DP estimate. Offered only where the single-canary audit's Gaussian-DP estimate is
(a Gaussian mechanism, an observation exactly affine in its noise) and the clip is per
example — canaries under one flat batch clip would share it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from privaudit.core import text
from privaudit.core.errors import PrivauditError
from privaudit.eval import bounds
from privaudit.experiments.audit_setting import Setting, audited, audited_message
from privaudit.experiments.audit_stats import check_trials, white_box_bounds
from privaudit.experiments.audit_trials import Rerun
from privaudit.experiments.canary_grads import Diracs
from privaudit.sim.plan import Adversary
from privaudit.sim.run import Run
from privaudit.sim.targets import Target

POOLED_TRIALS = 100  # fewest trials for the pooled estimate's normal intervals


def pooled(
    run: Run,
    target: str | Target,
    round: int = 1,
    trials: int = 2000,
    canaries: int = 256,
    confidence: float = 0.95,
    *,
    threat: str | None = None,
    link: tuple[int, int] | None = None,
    attackers: list[int] | None = None,
    victim: int | None = None,
    seed: int = 0,
    progress: bool = True,
    adversary: Adversary | None = None,
) -> dict[str, Any]:
    """The white-box audit of one release of round ``round`` with ``canaries`` Dirac
    canaries of norm C per trial (module docstring); the document
    :func:`~privaudit.experiments.audit.white_box` returns, its search one fixed candidate,
    ``statistic`` "pooled" and ``canary["count"]`` K. ``raw``: every (trial, canary) score,
    trial-major, ``candidate`` the canary's index."""
    adv = audited(adversary, threat, link, attackers, victim)
    delta = run.cfg.delta
    need = max(check_trials(trials, delta, confidence), POOLED_TRIALS)
    if trials < POOLED_TRIALS:
        raise PrivauditError(
            f"--canaries needs at least {POOLED_TRIALS} trials (its pooled estimate's normal "
            f"intervals), got {trials}; raise --trials"
        )
    tgt = Target.of(target)
    target = tgt.name
    s = audited_message(run, tgt, round, adv, 0, progress)
    D = run.ctx.spec.numel
    _check(s, target, canaries, D)
    rerun = Rerun(s, 0, seed, progress)
    if not rerun.exact:
        raise PrivauditError(
            f"{target}'s observation is not exactly its Gaussian release (an affine function of "
            "its noise), so its canaries' scores are not Gaussian shifts to pool; drop --canaries"
        )
    norm = float(s.privacy.clip)
    coords = torch.as_tensor(np.random.default_rng(seed + 2).choice(D, canaries, replace=False))
    t0 = time.perf_counter()
    # orientation and impact on an unscored pair of trials (the same noise, all in / none)
    every = Diracs(coords, norm, D)
    shift = (rerun(-2, every) - rerun(-2, None))[coords]
    if not bool((shift.abs() > 0).all()):
        raise PrivauditError(f"a Dirac canary in agent {s.src}'s batch does not reach {target}")
    sign = torch.sign(shift)
    coins = np.random.default_rng(seed + 1).random((trials, canaries)) < 0.5
    scores, interrupted = _score(rerun, every, coins, sign, progress)
    done = len(scores)
    if done < need:
        raise PrivauditError(
            f"interrupted after {done} trials, fewer than the {need} the bounds need; run the "
            "same command again"
        )
    coins = coins[:done]
    level = 1 - (1 - confidence) / 2  # two bounds, each at 1 − α/2 (Bonferroni)
    first = white_box_bounds(scores[:, 0], coins[:, 0], False, delta, level)
    gdp = {**bounds.pooled_gdp_estimate(scores, coins, delta, level), "confidence": level}
    lower = max(first["clopper_pearson"]["epsilon_lo"], gdp["epsilon_lo"])
    impact = float(shift.abs().mean())
    best = {"clopper_pearson": first["clopper_pearson"], "gdp": gdp, "epsilon_lo": lower}
    final = {**best, "trials": done}
    entry = {"kind": "dirac", "norm": norm, "impact": impact, "pilot": None, "final": final}
    return {
        **best,
        "confidence": confidence,
        "delta": delta,
        "tradeoff": first["tradeoff"],  # the first canary's, one score per trial
        "mode": "white-box",
        "target": target,
        "round": s.t,
        "span": 0,
        "trials": done,
        "interrupted": interrupted,
        "threat": s.threat.describe(),
        "victim": s.src,
        "receiver": s.dst,
        "beyond": False,
        "distance": s.distance,
        "attackers": sorted(s.threat.agents) if s.threat.uses_attackers else [],
        "copies": rerun.copies,
        "statistic": "pooled",
        "canary": {"kind": "dirac", "norm": norm, "impact": impact, "count": canaries},
        "search": {
            "candidates": [{**entry, "epsilon_lo": lower}],
            "pilot_trials": 0,
            "chosen": 0,
            "levels": {"pilot": None, "final": level},
        },
        "seconds": float(f"{time.perf_counter() - t0:.3f}"),
        "raw": {
            "coin": coins.reshape(-1),
            "candidate": np.tile(np.arange(canaries), done),
            "score": scores.reshape(-1),
        },
    }


def not_pooled(privacy: Any) -> str | None:
    """Why a mechanism's facts rule its canaries out of pooling, in a few words, or None:
    they must be a Gaussian mechanism's, over a per-example clip (under a flat batch clip
    the canaries would share one clip)."""
    if privacy.mechanism != "gaussian":
        return f"a {privacy.mechanism} mechanism"
    if privacy.clip_unit != "example":
        return "a flat batch clip" if privacy.clip_unit == "batch" else "no per-example clip"
    return None


def _check(s: Setting, target: str, canaries: int, D: int) -> None:
    """Refuse what pooling does not fit: a mechanism other than a Gaussian one with a
    per-example clip observed directly, or more canaries than coordinates."""
    why = not_pooled(s.privacy) or ("an indirect observation" if s.beyond else None)
    if why is not None:
        raise PrivauditError(
            f"--canaries K > 1 pools Dirac canaries that are examples of one batch of a "
            f"Gaussian mechanism with a per-example clip, observed directly; {target} as "
            f"{s.threat.describe()} sees it is not ({why}); drop --canaries"
        )
    if not 2 <= canaries <= D:
        raise PrivauditError(f"--canaries must be in 2..{D} (this model's parameters)")


def _score(
    rerun: Rerun, every: Diracs, coins: np.ndarray, sign: torch.Tensor, progress: bool
) -> tuple[np.ndarray, bool]:
    """Trial i with the canaries of ``every`` whose ``coins[i]`` is set, each scored on its
    coordinate (oriented by ``sign``); the scores of the trials run and whether a Ctrl-C
    ended them early."""
    s = rerun.s
    out: list[np.ndarray] = []
    bar, task = text.progress(
        len(coins), f"audit {s.target.name} r{s.t}, {len(every.coords)} canaries", progress
    )
    interrupted = False
    with bar:
        try:
            for i, coin in enumerate(coins):
                obs = rerun(i, Diracs(every.coords[coin], every.norm, every.size))
                out.append((obs[every.coords] * sign).numpy())
                bar.advance(task)
        except KeyboardInterrupt:
            interrupted = True
    return np.asarray(out, dtype=float).reshape(len(out), len(every.coords)), interrupted
