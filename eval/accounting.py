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

from privaudit.errors import PrivauditError

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
    with warnings.catch_warnings():  # the bisection's small-σ probes hit the last RDP order
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
    return float(acc.get_epsilon(delta=delta))
