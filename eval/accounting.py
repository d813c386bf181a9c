"""Privacy accounting with opacus (never hand-rolled): σ from ε and ε from σ.

Every ε the tool prints comes from here, and every one of them from a defense's mechanism
facts (:meth:`Defense.privacy`, a :class:`~privaudit.defenses.base.Privacy` per message
kind and agent): the run's σ calibration (:func:`calibrate`), the ε a run reports per
message kind and per agent (:func:`run_privacy`), and the audit's upper bounds
(:func:`account`).

The mechanism accounted: adjacency is adding or removing one example of an agent's shard;
agent i's batch is Poisson sampled, each of its n_i examples independently with
probability q_i = B/n_i (what the engine draws); one round releases that batch ``r`` times
(e.g. DPDL: one noised cross-gradient per neighbour), each a Gaussian mechanism with noise
multiplier z (noise std over add/remove sensitivity) and independent noise. The r releases
together are one Gaussian mechanism with multiplier z/√r (their joint sensitivity is √r
times one's), so a round is one sampled Gaussian mechanism at z/√r, and T rounds compose.
Each agent has its own ε (its own q_i and degree); the run's ε is the worst agent's.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from privaudit.errors import PrivauditError
from privaudit.sampling import rate

if TYPE_CHECKING:
    from torch import Tensor

    from privaudit.defenses.base import Defense, Privacy

ADJACENCY = "add/remove one example"
SAMPLING = "Poisson, q_i = B / n_i per agent"
ACCOUNTANTS = ("rdp", "prv")


def _check(epsilon: float | None, delta: float, sample_rate: float, rounds: int) -> None:
    if epsilon is not None and not epsilon > 0:
        raise PrivauditError(f"--epsilon must be > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise PrivauditError(f"--delta must be in (0, 1), got {delta}")
    if not 0 < sample_rate <= 1:
        raise PrivauditError(f"sample rate must be in (0, 1], got {sample_rate}")
    if rounds < 1:
        raise PrivauditError(f"rounds must be ≥ 1, got {rounds}")


def sigma_for_epsilon(
    epsilon: float,
    delta: float,
    sample_rate: float,
    rounds: int,
    releases_per_round: int = 1,
    accountant: str = "rdp",
) -> float:
    """Smallest noise multiplier σ (per release) giving (ε, δ)-DP over ``rounds`` rounds."""
    from opacus.accountants.utils import get_noise_multiplier

    _check(epsilon, delta, sample_rate, rounds)
    with warnings.catch_warnings(), np.errstate(divide="ignore"):  # PRV at q = 1: log(0)
        # the bisection's small-σ probes hit the last RDP order
        warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        sigma = get_noise_multiplier(
            target_epsilon=epsilon,
            target_delta=delta,
            sample_rate=sample_rate,
            steps=rounds,
            accountant=accountant,
            epsilon_tolerance=0.005,
        )
    return float(sigma) * math.sqrt(max(releases_per_round, 1))


def epsilon_for_sigma(
    sigma: float,
    delta: float,
    sample_rate: float,
    rounds: int,
    releases_per_round: int = 1,
    accountant: str = "rdp",
) -> float:
    """ε spent by ``rounds`` rounds at noise multiplier σ per release (∞ without noise)."""
    from opacus.accountants import create_accountant

    _check(None, delta, sample_rate, rounds)
    if sigma <= 0:
        return math.inf
    acc = create_accountant(accountant)
    acc.history = [(sigma / math.sqrt(max(releases_per_round, 1)), sample_rate, rounds)]
    with warnings.catch_warnings(), np.errstate(divide="ignore"):  # PRV at q = 1: log(0)
        warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        return float(acc.get_epsilon(delta=delta))


def release_epsilon(noise_multiplier: float, delta: float, accountant: str = "prv") -> float:
    """ε of one Gaussian release at ``noise_multiplier`` (std / sensitivity), sample rate 1:
    the building block every per-round count composes (PRV is tight here; RDP is not)."""
    return epsilon_for_sigma(noise_multiplier, delta, 1.0, 1, 1, accountant)


def kind_epsilon(
    privacy: Privacy,
    delta: float,
    sample_rate: float,
    rounds: int,
    accountant: str = "rdp",
    claimed: bool = False,
) -> float:
    """ε for one agent over ``rounds`` rounds of ``privacy.releases`` releases at rate q and
    the correct multiplier; ∞ without a formal guarantee. ``claimed``: the paper's promise
    instead (``claimed_multiplier``, ``claimed_releases``). PRV can fail far from its grid
    (tiny σ): then the RDP bound is returned."""
    if claimed:
        z, r = privacy.claimed_multiplier, privacy.claimed_releases
    else:
        z, r = (privacy.noise_multiplier, privacy.releases) if privacy.formal else (0.0, 0)
    if z <= 0 or r < 1:
        return math.inf
    try:
        return epsilon_for_sigma(z, delta, sample_rate, rounds, r, accountant)
    except (ValueError, RuntimeError, OverflowError):
        if accountant == "rdp":
            raise
        return epsilon_for_sigma(z, delta, sample_rate, rounds, r, "rdp")


def sample_rates(shard_sizes: Sequence[int], batch_size: int) -> list[float]:
    """Each agent's Poisson sampling rate q_i = min(1, B / n_i), as the engine draws it."""
    return [rate(batch_size, n) for n in shard_sizes]


def _with_sigma(params: Any, sigma: float) -> Any:
    return dataclasses.replace(params, sigma=sigma)


def _has_sigma(params: Any) -> bool:
    return dataclasses.is_dataclass(params) and any(
        f.name == "sigma" for f in dataclasses.fields(params)
    )


def calibrate(
    defense: Defense,
    params: Any,
    W: Tensor,
    rates: Sequence[float],
    epsilon: float,
    delta: float,
    rounds: int,
    accountant: str = "rdp",
) -> float | None:
    """The smallest ``params.sigma`` for which every agent's ε is at most ``epsilon``: over
    the message kinds whose Privacy is formal (their largest ε), or, when none is, by the
    paper's claimed accounting (the run then reports ε = ∞ beside the claim). The noise
    multiplier is linear in σ, so σ = z / z(σ = 1) with z from opacus. None: this defense's
    σ is never set from ε (no kind has a Gaussian multiplier, formal or claimed)."""
    if not _has_sigma(params):
        return None
    unit = _with_sigma(params, 1.0)
    kinds = list(defense.kinds)
    per_agent = [[defense.privacy(unit, k, W, a) for k in kinds] for a in range(len(rates))]
    formal = any(pr.formal and pr.noise_multiplier > 0 for row in per_agent for pr in row)
    sigma, cache = 0.0, {}
    for q, row in zip(rates, per_agent, strict=True):
        for pr in row:
            if formal:
                z1, r = (pr.noise_multiplier, pr.releases) if pr.formal else (0.0, 0)
            else:
                z1, r = pr.claimed_multiplier, pr.claimed_releases
            if z1 <= 0 or r < 1:
                continue
            key = (q, r)
            if key not in cache:
                cache[key] = sigma_for_epsilon(epsilon, delta, q, rounds, r, accountant)
            sigma = max(sigma, cache[key] / z1)
    return sigma if sigma > 0 else None


def run_privacy(
    defense: Defense,
    params: Any,
    W: Tensor,
    rates: Sequence[float],
    delta: float,
    rounds: int,
    accountant: str = "rdp",
) -> dict[str, Any]:
    """What a run reports: ε per message kind (worst agent), per agent (worst kind), the run's
    ε (the worst agent's, over the formal kinds; ∞ when none is formal) and the paper's
    claimed ε beside it, with the adjacency and the sampling stated."""
    kinds: dict[str, Any] = {}
    agents = [{"agent": a, "sample_rate": q, "epsilon": 0.0} for a, q in enumerate(rates)]
    eps_cache: dict = {}

    def eps(pr: Privacy, q: float, claimed: bool) -> float:
        key = (
            pr.noise_multiplier,
            pr.releases,
            pr.formal,
            pr.claimed_multiplier,
            pr.claimed_releases,
            q,
            claimed,
        )
        if key not in eps_cache:
            eps_cache[key] = kind_epsilon(pr, delta, q, rounds, accountant, claimed)
        return eps_cache[key]

    formal_any = False
    for k in defense.kinds:
        worst, claim, first = 0.0, 0.0, None
        for a, q in enumerate(rates):
            pr = defense.privacy(params, k, W, a)
            first = first or pr
            e = eps(pr, q, False)
            worst, claim = max(worst, e), max(claim, eps(pr, q, True))
            if pr.formal and math.isfinite(e):
                agents[a]["epsilon"] = max(agents[a]["epsilon"], e)
        formal_any |= first.formal
        kinds[k] = {
            "mechanism": first.mechanism,
            "epsilon": worst,
            "formal": first.formal,
            "reason": first.reason,
            "noise_multiplier": first.noise_multiplier,
            "releases_per_round": first.releases,
            "epsilon_claimed": claim,
        }
    if not formal_any:
        for row in agents:
            row["epsilon"] = math.inf
    formal_eps = [v["epsilon"] for v in kinds.values() if v["formal"]]
    claims = [v["epsilon_claimed"] for v in kinds.values()]
    informal = [v["reason"] for v in kinds.values() if not v["formal"]]
    return {
        "epsilon": max(formal_eps) if formal_eps else math.inf,
        "epsilon_reason": None if formal_eps else (informal[0] if informal else None),
        "epsilon_claimed": max(claims) if claims else math.inf,
        "delta": delta,
        "adjacency": ADJACENCY,
        "sampling": SAMPLING,
        "accountant": accountant,
        "kinds": kinds,
        "agents": agents,
    }


def account(
    privacy: Privacy,
    delta: float,
    sample_rate: float,
    rounds: int,
    accountant: str = "rdp",
    copies: int = 1,
) -> dict:
    """Every upper bound side by side, for one agent and one message kind:

    - ``release``: the ``copies`` releases one Observation combines (one Gaussian at
      multiplier z/√copies; PRV, sample rate 1) — what a single-round white-box audit of
      that Observation is compared with;
    - ``release_claimed``: the same at the paper's claimed multiplier;
    - ``run`` / ``run_claimed``: over the whole run (``accountant``, rate q, every release);
    - ``paper``: the paper's own rule, filled in by the audit (it may need the canary's Δf).
    """
    k = max(copies, 1)
    if privacy.formal:
        correct = release_epsilon(privacy.noise_multiplier / math.sqrt(k), delta)
    else:
        correct = math.inf
    claimed = release_epsilon(privacy.claimed_multiplier / math.sqrt(k), delta)
    return {
        "mechanism": privacy.mechanism,
        "formal": privacy.formal,
        "reason": privacy.reason,
        "adjacency": ADJACENCY,
        "noise_multiplier": privacy.noise_multiplier,
        "claimed_multiplier": privacy.claimed_multiplier,
        "releases_per_round": privacy.releases,
        "claimed_releases_per_round": privacy.claimed_releases,
        "copies": k,
        "sample_rate": sample_rate,
        "rounds": rounds,
        "accountant": accountant,
        "release": correct,
        "release_claimed": claimed,
        "run": kind_epsilon(privacy, delta, sample_rate, rounds, accountant),
        "run_claimed": kind_epsilon(privacy, delta, sample_rate, rounds, accountant, True),
        "paper": privacy.paper,
        "caveats": list(privacy.caveats),
    }


def noised(defense: Defense, params: Any, W: Tensor) -> bool:
    """Whether ``params.sigma`` scales a Gaussian noise multiplier of some message kind
    (formal or only claimed), i.e. whether ``--epsilon``/``--sigma`` set it."""
    if not _has_sigma(params):
        return False
    unit = _with_sigma(params, 1.0)
    for k in defense.kinds:
        pr = defense.privacy(unit, k, W)
        if (pr.formal and pr.noise_multiplier > 0) or pr.claimed_multiplier > 0:
            return True
    return False
