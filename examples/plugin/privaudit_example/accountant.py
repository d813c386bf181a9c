"""``advanced``: an accountant as a privaudit plugin (docs/extending.md).

Subsampling amplification and the advanced composition theorem, the textbook bound that
predates RDP — valid, and much looser than ``rdp`` or ``prv``; a plugin to compare against.

For T rounds of the Poisson-subsampled Gaussian at multiplier z and rate q, with δ split as
δ/2 for the composition and δ/(2T) per round: one round is (ε₁, δ/(2T))-DP with
ε₁ = log(1 + q(e^{ε₀} − 1)) (amplification by subsampling, Balle et al. 2018, Thm. 9) where
ε₀ is the ε of one Gaussian release at δ₀ = δ/(2Tq) (privaudit's own one-release ε); T rounds
are (ε, δ)-DP with ε = √(2T log(2/δ)) ε₁ + T ε₁ (e^{ε₁} − 1) (Dwork, Rothblum & Vadhan 2010,
Thm. III.3).
"""

from __future__ import annotations

import math

from privaudit.core.accountants import Accountant, register_accountant
from privaudit.core.accounting import release_epsilon


@register_accountant
class Advanced(Accountant):
    name = "advanced"
    summary = "subsampling + advanced composition, loose"

    def epsilon(self, z: float, delta: float, sample_rate: float, rounds: int) -> float:
        q, T = sample_rate, rounds
        eps0 = release_epsilon(z, min(delta / (2 * T * q), 0.5), "rdp")
        if math.isinf(eps0):
            return math.inf
        eps1 = math.log1p(q * math.expm1(eps0))
        return math.sqrt(2 * T * math.log(2 / delta)) * eps1 + T * eps1 * math.expm1(eps1)
