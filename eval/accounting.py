"""Privacy accounting with opacus (never hand-rolled): σ from ε and ε from σ.

One round releases agent i's batch ``r`` times (e.g. DPDL: one noised cross-gradient per
neighbour), each a Gaussian mechanism on the same clipped sum with independent noise of
std σC. Their average is a sufficient statistic with std σC/√r, so the round is one
sampled Gaussian mechanism with noise multiplier σ/√r; T rounds compose. The batch is a
uniform draw of B of the agent's n_i examples, accounted as Poisson sampling at rate
q = B/n_i (the DPDL paper's own Lemma 1 assumes Poisson sampling too).
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import numpy as np

from privaudit.errors import PrivauditError

if TYPE_CHECKING:
    from privaudit.defenses.base import Privacy

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


def run_epsilon(
    privacy: Privacy,
    delta: float,
    sample_rate: float,
    rounds: int,
    accountant: str = "rdp",
    multiplier: float | None = None,
) -> float:
    """ε for one agent over ``rounds`` rounds of ``privacy.releases`` releases at rate q, at
    ``multiplier`` (default: the correct ``privacy.noise_multiplier``); ∞ without a formal
    guarantee. PRV can fail far from its grid (tiny σ): that is reported as ∞ only when the
    RDP bound is ∞ as well, otherwise the RDP value is returned."""
    z = privacy.noise_multiplier if multiplier is None else multiplier
    if (multiplier is None and not privacy.formal) or z <= 0 or privacy.releases < 1:
        return math.inf
    try:
        return epsilon_for_sigma(z, delta, sample_rate, rounds, privacy.releases, accountant)
    except (ValueError, RuntimeError, OverflowError):
        if accountant == "rdp":
            raise
        return epsilon_for_sigma(z, delta, sample_rate, rounds, privacy.releases, "rdp")


def account(
    privacy: Privacy, delta: float, sample_rate: float, rounds: int, accountant: str = "rdp"
) -> dict:
    """Every upper bound side by side, for one agent and one message kind:

    - ``release``: one release with the correct multiplier (PRV, sample rate 1) — what a
      single-round white-box audit is compared with;
    - ``release_claimed``: the same at the multiplier the run's own accounting assumes;
    - ``run`` / ``run_claimed``: over the whole run (``accountant``, rate q, every release);
    - ``paper``: the paper's own rule, filled in by the audit (it may need the canary's Δf).
    """
    correct = release_epsilon(privacy.noise_multiplier, delta) if privacy.formal else math.inf
    claimed = release_epsilon(privacy.claimed_multiplier, delta)
    return {
        "mechanism": privacy.mechanism,
        "formal": privacy.formal,
        "reason": privacy.reason,
        "noise_multiplier": privacy.noise_multiplier,
        "claimed_multiplier": privacy.claimed_multiplier,
        "releases_per_round": privacy.releases,
        "sample_rate": sample_rate,
        "rounds": rounds,
        "accountant": accountant,
        "release": correct,
        "release_claimed": claimed,
        "run": run_epsilon(privacy, delta, sample_rate, rounds, accountant),
        "run_claimed": run_epsilon(
            privacy, delta, sample_rate, rounds, accountant, privacy.claimed_multiplier
        ),
        "paper": privacy.paper,
        "caveats": list(privacy.caveats),
    }
