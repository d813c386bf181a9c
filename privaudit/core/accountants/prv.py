"""``prv``: privacy random variables (Gopi, Lee & Wutschitz 2021), opacus' PRV accountant,
asked only where its grid is bounded."""

from __future__ import annotations

import functools
import math

import numpy as np

from privaudit.core import limits
from privaudit.core.accountants.base import (
    Accountant,
    AccountantLimit,
    opacus_epsilon,
    quiet,
    register_accountant,
)
from privaudit.core.errors import PrivauditError

# The PRV accountant discretises the privacy loss on a grid whose size grows with √T and as
# σ shrinks (Gopi et al. 2021, opacus' domain rule); its time and memory (a few hundred bytes
# per point) grow linearly with the grid. Past this size (about 1 GB) it is not asked.
PRV_MAX_POINTS = 2**21
# what one search for σ may spend on PRV grids in all (16 grids of the largest size; 2,000
# rounds at q = 0.01 and ε = 8 spend 6e6)
PRV_SEARCH_POINTS = 2**25


@functools.lru_cache(maxsize=256)
def prv_points(z: float, delta: float, sample_rate: float, rounds: int) -> float:
    """The size of the grid opacus' PRV accountant would discretise on (its own rule)."""
    from opacus.accountants.analysis.prv import PoissonSubsampledGaussianPRV
    from opacus.accountants.analysis.prv import compute_safe_domain_size as safe_size

    eps_error, delta_error = 0.01, delta / 1000  # opacus' defaults in get_epsilon
    try:
        with quiet():
            half = safe_size(
                prvs=[PoissonSubsampledGaussianPRV(sample_rate, z)],
                max_self_compositions=[rounds],
                eps_error=eps_error,
                delta_error=delta_error,
            )
    except (ValueError, OverflowError, ZeroDivisionError):
        return math.inf
    mesh = eps_error / math.sqrt(rounds * math.log(12 / delta_error) / 2)
    return 2 * half / mesh


@register_accountant
class PRV(Accountant):
    """Numerical composition of privacy random variables (Gopi, Lee & Wutschitz 2021) —
    opacus' ``PRVAccountant``, tighter than RDP; asked only where its grid stays under
    :data:`PRV_MAX_POINTS` and resolves δ, else :class:`AccountantLimit` (and RDP answers)."""

    name = "prv"
    summary = "privacy random variables, tighter"
    fallback = "rdp"
    search_budget = PRV_SEARCH_POINTS

    def check(self, delta: float) -> None:
        if delta < limits.PRV_MIN_DELTA:
            raise PrivauditError(
                f"--delta {delta:g} is below what the prv accountant resolves "
                f"({limits.PRV_MIN_DELTA:g}: floating-point error dominates); "
                "use --accountant rdp or a larger --delta"
            )

    def cost(self, z: float, delta: float, sample_rate: float, rounds: int) -> float:
        return min(prv_points(z, delta, sample_rate, rounds), PRV_MAX_POINTS)

    def epsilon(self, z: float, delta: float, sample_rate: float, rounds: int) -> float:
        points = prv_points(z, delta, sample_rate, rounds)
        where = f"σ = {z:.3g}, q = {sample_rate:.3g}, {rounds} rounds"
        if not points <= PRV_MAX_POINTS:
            raise AccountantLimit(
                f"the prv accountant would need a grid of {points:.3g} points ({where}), over "
                f"its limit of {PRV_MAX_POINTS}; use --accountant rdp"
            )
        if float(np.finfo(np.longdouble).eps) * points > delta * 0.999:
            raise AccountantLimit(
                f"δ = {delta:g} is too small for the prv accountant's grid ({where}); "
                "use --accountant rdp or a larger --delta"
            )
        try:
            return opacus_epsilon("prv", z, delta, sample_rate, rounds)
        except (ValueError, RuntimeError, MemoryError) as e:  # far from its grid
            raise AccountantLimit(
                f"the prv accountant cannot compute ε at {where}, δ = {delta:g} ({e}); "
                "use --accountant rdp"
            ) from None
