"""``rdp``: Rényi DP of the sampled Gaussian (Mironov 2017), opacus' RDP accountant."""

from __future__ import annotations

from privaudit.core.accountants.base import Accountant, opacus_epsilon, register_accountant


@register_accountant
class RDP(Accountant):
    """Rényi DP of the sampled Gaussian (Mironov 2017; Mironov, Talwar & Zhang 2019),
    converted to (ε, δ) at the best order — opacus' ``RDPAccountant``."""

    name = "rdp"
    summary = "Rényi DP, the default"

    def epsilon(self, z: float, delta: float, sample_rate: float, rounds: int) -> float:
        return opacus_epsilon("rdp", z, delta, sample_rate, rounds)
