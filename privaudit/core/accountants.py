"""Accountants: the registry of what turns a noise multiplier into ε.

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

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import warnings
from collections.abc import Iterator
from typing import ClassVar, TypeVar

import numpy as np

from privaudit.core import limits
from privaudit.core.errors import NameTaken, PrivauditError
from privaudit.core.extensions import calling, failure


class AccountantLimit(PrivauditError):
    """A question the accountant cannot answer in bounded time and memory."""


class Accountant:
    """ε of T compositions of the Poisson-subsampled Gaussian mechanism.

    Contract of a subclass: ``name`` (what ``--accountant`` takes) and ``summary`` (one
    line for ``--help``); :meth:`epsilon` for a multiplier ``z > 0`` — an upper bound on
    the true ε, ∞ where it overflows, :class:`AccountantLimit` where it cannot answer;
    optionally :meth:`check` (refuse a δ it cannot resolve, before any training),
    :meth:`cost` with ``search_budget`` (what one σ search may spend), and ``fallback``
    (the accountant asked when this one raises :class:`AccountantLimit`)."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    fallback: ClassVar[str | None] = None
    search_budget: ClassVar[float] = math.inf

    def epsilon(self, z: float, delta: float, sample_rate: float, rounds: int) -> float:
        raise NotImplementedError

    def check(self, delta: float) -> None:
        """Refuse, with one line, a δ this accountant cannot resolve."""

    def cost(self, z: float, delta: float, sample_rate: float, rounds: int) -> float:
        """What one :meth:`epsilon` costs, in the units of ``search_budget``."""
        return 0.0


ACCOUNTANTS: dict[str, Accountant] = {}
A = TypeVar("A", bound=type[Accountant])


def register_accountant(cls: A) -> A:
    """Class decorator: register an :class:`Accountant` subclass under its ``name``."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise PrivauditError(
            f"accountant {cls.__name__} needs a name (a class attribute, a word like 'rdp')"
        )
    if name in ACCOUNTANTS and type(ACCOUNTANTS[name]) is not cls:
        raise NameTaken("accountant", name)
    ACCOUNTANTS[name] = cls()
    return cls


def get_accountant(name: str) -> Accountant:
    """The registered accountant ``name``, or one line listing those that are."""
    if name not in ACCOUNTANTS:
        raise PrivauditError(f"--accountant must be one of {', '.join(ACCOUNTANTS)}, got {name!r}")
    return ACCOUNTANTS[name]


# what an accountant raises where it cannot answer (PRV far from its grid: tiny σ, huge T):
# the caller asks the fallback accountant, or counts the probe as not private enough
CANNOT_ANSWER = (AccountantLimit, ValueError, RuntimeError, OverflowError, MemoryError)
EPSILON_FIX = (
    "return a float ε ≥ 0 from epsilon(z, delta, sample_rate, rounds) (math.inf: no bound)"
)


def _at(z: float, delta: float, sample_rate: float, rounds: int) -> str:
    return f"σ = {z:.4g}, δ = {delta:g}, q = {sample_rate:.3g}, {rounds} rounds"


def answer(acc: Accountant, z: float, delta: float, sample_rate: float, rounds: int) -> float:
    """``acc.epsilon(z, δ, q, T)``, checked at this call: an ε that is not a number ≥ 0 (NaN,
    negative, a string) is one line naming the accountant, its plugin and the point asked
    (never clamped: a negative ε read as 0 would report a run as perfectly private); a
    plugin's exception is one line too, except the :data:`CANNOT_ANSWER` ones, which the
    caller handles (the fallback accountant)."""
    with calling("accountant", acc.name, acc, "epsilon()", passes=CANNOT_ANSWER):
        eps = acc.epsilon(z, delta, sample_rate, rounds)
    if (
        isinstance(eps, bool | np.bool_)
        or not isinstance(eps, numbers.Real)
        or math.isnan(eps)
        or eps < 0
    ):
        raise failure(
            "accountant",
            acc.name,
            acc,
            "epsilon()",
            f"answered ε = {eps!r} at {_at(z, delta, sample_rate, rounds)}",
            EPSILON_FIX,
        )
    return float(eps)


def cost(acc: Accountant, z: float, delta: float, sample_rate: float, rounds: int) -> float:
    """``acc.cost(…)``, checked: a number ≥ 0 (NaN or a negative cost would let a search
    spend without bound), a plugin's exception one line naming it."""
    with calling("accountant", acc.name, acc, "cost()"):
        spent = acc.cost(z, delta, sample_rate, rounds)
    if isinstance(spent, bool | np.bool_) or not isinstance(spent, numbers.Real) or not spent >= 0:
        raise failure(
            "accountant",
            acc.name,
            acc,
            "cost()",
            f"answered {spent!r} at {_at(z, delta, sample_rate, rounds)}",
            "return a number ≥ 0 from cost() (the units of search_budget), or leave it out",
        )
    return float(spent)


def check_delta(acc: Accountant, delta: float) -> None:
    """``acc.check(δ)``: its own refusal (a PrivauditError) stands; any other exception of a
    plugin is one line naming it."""
    with calling("accountant", acc.name, acc, "check()"):
        acc.check(delta)


def accountant_help() -> str:
    """``--accountant``'s help: every registered accountant, the default first."""
    return " | ".join(f"{n} ({a.summary})" if a.summary else n for n, a in ACCOUNTANTS.items())


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """opacus' warnings off: an RDP optimum at the first or last order (huge or tiny σ), PRV's
    log(0) at q = 1 and its NaN tails far from the grid (the result is checked instead)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.filterwarnings("ignore", message="Optimal order is the")
        yield


def opacus_epsilon(name: str, z: float, delta: float, sample_rate: float, rounds: int) -> float:
    """ε from opacus' accountant ``name`` for T compositions at (z, q); ∞ on overflow."""
    from opacus.accountants import create_accountant

    acc = create_accountant(name)
    acc.history = [(z, sample_rate, rounds)]
    with quiet():
        try:
            eps = float(acc.get_epsilon(delta=delta))
        except (OverflowError, ZeroDivisionError):
            return math.inf
    return max(eps, 0.0) if not math.isnan(eps) else math.inf  # PRV's rounding can dip < 0


@register_accountant
class RDP(Accountant):
    """Rényi DP of the sampled Gaussian (Mironov 2017; Mironov, Talwar & Zhang 2019),
    converted to (ε, δ) at the best order — opacus' ``RDPAccountant``."""

    name = "rdp"
    summary = "Rényi DP, the default"

    def epsilon(self, z: float, delta: float, sample_rate: float, rounds: int) -> float:
        return opacus_epsilon("rdp", z, delta, sample_rate, rounds)


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
