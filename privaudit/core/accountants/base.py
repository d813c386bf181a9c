"""The accountant contract and its registry (:class:`Accountant`,
:func:`register_accountant`, :data:`ACCOUNTANTS`), the checked calls privaudit makes through
(:func:`answer`, :func:`cost`, :func:`check_delta`) and opacus' ε for the built-ins
(:func:`opacus_epsilon`). The package docstring says what an accountant answers."""

from __future__ import annotations

import contextlib
import math
import numbers
import warnings
from collections.abc import Iterator
from typing import ClassVar, TypeVar

import numpy as np

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
