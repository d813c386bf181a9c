"""Accountants: the registry of what turns a noise multiplier into ε — one file per built-in,
as opacus' ``accountants/``: :mod:`.base` (the contract and the registry), :mod:`.rdp`,
:mod:`.prv`.

One contract (opacus' ``IAccountant`` is the model, its ``register_accountant`` the
registry): an :class:`Accountant` answers ε of ``rounds`` compositions of the
Poisson-subsampled Gaussian mechanism at noise multiplier ``z`` and sample rate ``q``
(add/remove adjacency), or raises :class:`AccountantLimit` where it cannot answer in
bounded time and memory — then its ``fallback`` is asked. Add one with
:func:`register_accountant` (a plugin may); ``--accountant NAME`` picks it.

Every answer is checked where it is used, not only at the plugin loader's probe point:
privaudit asks an accountant through :func:`answer`, :func:`cost` and :func:`check_delta`,
which refuse an ε that is not a number ≥ 0 (NaN, negative; ∞ is "no bound" and stands) and
turn a plugin's exception into one line naming the accountant, its plugin, the call and the
exception (:mod:`privaudit.core.extensions`).

Built in: ``rdp`` (Rényi DP, Mironov 2017; opacus' RDP accountant) and ``prv`` (privacy
random variables, Gopi et al. 2021; opacus' PRV accountant, tighter, on a bounded grid).
"""

from privaudit.core.accountants.base import (
    ACCOUNTANTS,
    CANNOT_ANSWER,
    Accountant,
    AccountantLimit,
    accountant_help,
    answer,
    check_delta,
    cost,
    get_accountant,
    opacus_epsilon,
    quiet,
    register_accountant,
)
from privaudit.core.accountants.rdp import RDP  # registered first: the default

# isort: split
from privaudit.core.accountants.prv import PRV, PRV_MAX_POINTS, PRV_SEARCH_POINTS, prv_points

__all__ = [
    "ACCOUNTANTS",
    "CANNOT_ANSWER",
    "PRV",
    "PRV_MAX_POINTS",
    "PRV_SEARCH_POINTS",
    "RDP",
    "Accountant",
    "AccountantLimit",
    "accountant_help",
    "answer",
    "check_delta",
    "cost",
    "get_accountant",
    "opacus_epsilon",
    "prv_points",
    "quiet",
    "register_accountant",
]
