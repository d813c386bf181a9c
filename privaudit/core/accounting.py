"""Privacy accounting with opacus (never hand-rolled): σ from ε and ε from σ.

Every ε the tool prints comes from here, and every one of them from a defense's mechanism
facts (:meth:`Defense.privacy`, a :class:`~privaudit.core.privacy.Privacy` per message
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
import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from scipy import optimize, stats

from privaudit.core import limits
from privaudit.core.accountants import (
    CANNOT_ANSWER,
    Accountant,
    AccountantLimit,
    answer,
    cost,
    get_accountant,
)
from privaudit.core.errors import PrivauditError
from privaudit.core.extensions import blame, failure, is_built_in
from privaudit.core.sampling import rate

if TYPE_CHECKING:
    from torch import Tensor

    from privaudit.core.privacy import Mechanism, Privacy

ADJACENCY = "add/remove one example"
SAMPLING = "Poisson, q_i = B / n_i per agent"
# opacus' search tolerance on ε (absolute), and a bound on its bisection's steps: past it,
# the bracket's upper end (whose ε is at most the target) is returned
EPSILON_TOLERANCE = 0.005
MAX_BISECTIONS = 200
# a calibrated σ is refused when one round alone at it provably breaks (ε, δ) by more than
# this factor on δ (room for the floating point of the bound; a sound accountant is below 1)
SOUNDNESS_SLACK = 1.05


def _check(epsilon: float | None, delta: float, sample_rate: float, rounds: int) -> None:
    if epsilon is not None:
        limits.check_float("--epsilon", epsilon, *limits.EPSILON, hint="ε per agent")
    limits.check_delta(delta)
    limits.check_float("the sample rate", sample_rate, 0.0, 1.0, lo_open=True)
    limits.check_int("--rounds", rounds, 1, limits.MAX_ROUNDS)


def _epsilon(
    z: float, delta: float, sample_rate: float, rounds: int, accountant: str, fallback: bool
) -> float:
    """ε of ``rounds`` compositions of the Poisson-subsampled Gaussian at multiplier z > 0
    from the registered ``accountant``: ∞ where it overflows (z → 0). ``fallback``: where
    the accountant cannot answer, its ``fallback`` accountant's (PRV → RDP) instead."""
    z = min(z, limits.SIGMA_MAX)  # more noise only lowers ε: an upper bound for any larger z
    if z < limits.SIGMA_NEGLIGIBLE:  # ε beyond any float, and opacus would not finish
        return math.inf
    acc = get_accountant(accountant)
    try:
        eps = answer(acc, z, delta, sample_rate, rounds)  # checked: a number ≥ 0
        if not is_built_in("accountant", accountant, acc):  # and no less than one round's
            where = f"σ = {z:.4g}, δ = {delta:g}, q = {sample_rate:.3g}, {rounds} rounds"
            _check_sound(acc, z, eps, delta, sample_rate, f"answers ε = {eps:.4g} at {where}")
        return eps
    except CANNOT_ANSWER as e:
        if fallback and acc.fallback is not None:
            return _epsilon(z, delta, sample_rate, rounds, acc.fallback, fallback)
        if isinstance(e, AccountantLimit):  # its own line: it cannot answer here
            raise
        blamed = blame("accountant", accountant, acc, "epsilon()", e)  # a plugin's: one line
        if blamed is e:
            raise
        raise blamed from e


def one_round_delta(z: float, epsilon: float, sample_rate: float) -> float:
    """A lower bound on the δ at ``epsilon`` of *any* run whose rounds are Poisson-sampled
    Gaussian releases at multiplier ``z`` and rate q: one round alone (composition only
    adds to it). Its privacy loss against the neighbour without the example is exactly
    q·δ_G(ε') with e^ε' = 1 + (e^ε − 1)/q and δ_G the Gaussian mechanism's profile at
    μ = 1/z (:func:`gdp_delta`; Balle, Barthe & Gaboardi 2018's amplification identity). An
    accountant whose (ε, δ) at z is below it understates ε."""
    q = sample_rate
    if math.isinf(epsilon):  # no bound claimed: nothing to contradict
        return 0.0
    if q >= 1:
        shifted = epsilon
    else:  # ε' = ε + log(1 + (q − 1)e^−ε) − log q, without overflowing e^ε
        shifted = epsilon + math.log1p((q - 1) * math.exp(-epsilon)) - math.log(q)
    return q * max(gdp_delta(shifted, 1.0 / z), 0.0)


def _check_sound(
    acc: Accountant, z: float, epsilon: float, delta: float, sample_rate: float, said: str
) -> None:
    """Refuse an (ε, δ) at multiplier ``z`` (per round) and rate q that even one round
    breaks (:func:`one_round_delta`): the accountant ``said`` (its answer, or the σ its
    answers calibrated) an ε below the true one. A plugin's every answer is checked so (an
    accountant answering 0 would report any run perfectly private), and every calibrated σ
    (its answers would calibrate σ ≈ 1e-59: no noise)."""
    lower = one_round_delta(z, epsilon, sample_rate)
    if lower > delta * SOUNDNESS_SLACK:
        raise failure(
            "accountant",
            acc.name,
            acc,
            "epsilon()",
            f"{said}, where one round alone is not ({epsilon:.4g}, {delta:g})-DP (its δ at "
            f"ε = {epsilon:.4g} is at least {lower:.3g}): that ε is below the true one",
            "return an upper bound on ε from epsilon() (docs/extending.md), or use "
            "--accountant rdp",
        )


def sigma_for_epsilon(
    epsilon: float,
    delta: float,
    sample_rate: float,
    rounds: int,
    releases_per_round: int = 1,
    accountant: str = "rdp",
) -> float:
    """Smallest noise multiplier σ (per release) giving (ε, δ)-DP over ``rounds`` rounds.

    opacus' own search (``get_noise_multiplier``: double σ from 20 until ε ≤ target, then
    bisect to within 0.005 of it), bounded: the target must be reachable at
    σ = :data:`~privaudit.core.limits.SIGMA_MAX` (else one error naming the floor and the fix),
    the bisection takes at most :data:`MAX_BISECTIONS` steps, and a probe the accountant
    cannot answer counts as not private enough. The σ found is checked sound: one round
    alone at it must be (ε, δ)-DP (:func:`one_round_delta`), else one line naming the
    accountant."""
    _check(epsilon, delta, sample_rate, rounds)
    acc = get_accountant(accountant)
    setting = (
        f"δ = {delta:g}, sample rate {sample_rate:.3g}, {rounds} rounds, "
        f"{max(releases_per_round, 1)} release(s) per round"
    )
    failed: list[str] = []
    spent = [0.0]  # what this search has cost (PRV: grid points evaluated)

    def eps_at(z: float) -> float:
        spent[0] += cost(acc, min(z, limits.SIGMA_MAX), delta, sample_rate, rounds)
        if spent[0] > acc.search_budget:
            raise PrivauditError(
                f"the {accountant} accountant's search for the σ of ε = {epsilon:g} "
                f"({setting}) would spend over its budget of {acc.search_budget:.3g}; "
                f"use --accountant {acc.fallback or 'rdp'}"
            )
        try:
            return _epsilon(z, delta, sample_rate, rounds, accountant, fallback=False)
        except CANNOT_ANSWER as e:
            failed[:] = [str(e)]
            return math.inf

    floor = eps_at(limits.SIGMA_MAX)
    if not floor <= epsilon:
        if failed:
            raise PrivauditError(
                f"the {accountant} accountant cannot reach ε = {epsilon:g} ({setting}): {failed[0]}"
            )
        raise PrivauditError(
            f"ε = {epsilon:g} is out of reach of the {accountant} accountant ({setting}): even "
            f"σ = {limits.SIGMA_MAX:g} gives ε = {floor:.3g}; raise --epsilon or --delta"
            + ("" if acc.fallback else ", or use a tighter --accountant (e.g. prv)")
        )
    sigma_low, sigma_high, eps_high = 0, 10, math.inf
    while eps_high > epsilon:  # ends by σ = 2^17·10 > SIGMA_MAX, where ε ≤ the floor
        sigma_high = 2 * sigma_high
        eps_high = eps_at(sigma_high)
    for _ in range(MAX_BISECTIONS):
        if epsilon - eps_high <= EPSILON_TOLERANCE:
            break
        sigma = (sigma_low + sigma_high) / 2
        eps = eps_at(sigma)
        if eps < epsilon:
            sigma_high, eps_high = sigma, eps
        else:
            sigma_low = sigma
    said = f"answers calibrate σ = {sigma_high:.3g} per round for ε = {epsilon:g} ({setting})"
    _check_sound(acc, sigma_high, epsilon, delta, sample_rate, said)
    return float(sigma_high) * math.sqrt(max(releases_per_round, 1))


def epsilon_for_sigma(
    sigma: float,
    delta: float,
    sample_rate: float,
    rounds: int,
    releases_per_round: int = 1,
    accountant: str = "rdp",
    fallback: bool = False,
) -> float:
    """ε spent by ``rounds`` rounds at noise multiplier σ per release (∞ without noise, and
    where the accountant overflows as σ → 0). A σ beyond
    :data:`~privaudit.core.limits.SIGMA_MAX` is accounted at that bound (an upper bound on ε).
    ``fallback``: where the accountant cannot answer, ask its fallback (PRV → RDP)."""
    _check(None, delta, sample_rate, rounds)
    get_accountant(accountant)
    if isinstance(sigma, bool) or not isinstance(sigma, numbers.Real) or math.isnan(sigma):
        raise PrivauditError(f"the noise multiplier must be a number ≥ 0, got {sigma!r}")
    if sigma <= 0:
        return math.inf
    z = sigma / math.sqrt(max(releases_per_round, 1))
    return _epsilon(z, delta, sample_rate, rounds, accountant, fallback)


def release_epsilon(noise_multiplier: float, delta: float, accountant: str = "prv") -> float:
    """ε of one Gaussian release at ``noise_multiplier`` (std / sensitivity), sample rate 1:
    the building block every per-round count composes (PRV is tight here; RDP is not). As
    :func:`kind_epsilon`, PRV's failure far from its grid returns the RDP bound."""
    return epsilon_for_sigma(noise_multiplier, delta, 1.0, 1, 1, accountant, fallback=True)


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
    return epsilon_for_sigma(z, delta, sample_rate, rounds, r, accountant, fallback=True)


def gdp_delta(epsilon: float, mu: float) -> float:
    """δ(ε) of μ-GDP: Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Dong, Roth & Su, Cor. 2.13),
    with the second term in log space so that large μ does not overflow."""
    if mu <= 0:
        return 0.0
    first = stats.norm.cdf(-epsilon / mu + mu / 2)
    second = math.exp(epsilon + stats.norm.logcdf(-epsilon / mu - mu / 2))
    return float(first - second)


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest ε with δ(ε) ≤ δ for μ-GDP (0 for μ ≤ 0, ∞ for μ = ∞): the exact
    (ε, δ) of a Gaussian mechanism whose shift over noise std is μ."""
    if not mu > 0:
        return 0.0
    if math.isinf(mu):
        return math.inf
    if gdp_delta(0.0, mu) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while gdp_delta(hi, mu) > delta:
        hi *= 2
    return float(optimize.brentq(lambda e: gdp_delta(e, mu) - delta, 0.0, hi, xtol=1e-10))


def pairwise_epsilon(
    privacy: Privacy,
    observers: Sequence[int],
    delta: float,
    rounds: int = 1,
    claimed: bool = False,
    theorem: bool = False,
) -> float:
    """ε of this agent towards the ``observers`` over ``rounds`` rounds, from its pairwise
    share (:attr:`Privacy.pairwise`). One round's view is a Gaussian mechanism with
    μ = √S/z (z the noise multiplier), so ``rounds`` rounds, each such a view given the
    ones before (the composition the paper uses), are μ = √(rounds·S)/z Gaussian DP,
    converted exactly (:func:`gdp_epsilon`). S ≤ 1, so it never exceeds the same rounds'
    local bound at sample rate 1. ∞ without a formal guarantee (or no pairwise share), 0
    when S = 0 (nothing of the agent reaches the observers in a round).

    ``claimed``: at the paper's multiplier instead of the correct one (finite without a
    formal guarantee). ``theorem``: the paper's own theorem instead of the exact view — its
    share (:attr:`Privacy.pairwise_paper`) as a Rényi bound α·rounds·S/(2z²) at every
    order, converted by opacus' RDP conversion (what opacus' RDP accountant computes for
    ``rounds`` Gaussian releases at multiplier z/√S, sample rate 1)."""
    share_of = privacy.pairwise_paper if theorem else privacy.pairwise
    if share_of is None:
        return math.inf
    if claimed:
        z = privacy.claimed_multiplier
    else:
        z = privacy.noise_multiplier if privacy.formal else 0.0
    if z <= 0:
        return math.inf
    share = float(share_of(observers))
    if share <= 0:
        return 0.0
    if theorem:
        return epsilon_for_sigma(z / math.sqrt(share), delta, 1.0, rounds, 1, "rdp")
    return gdp_epsilon(math.sqrt(rounds * share) / z, delta)


def sample_rates(shard_sizes: Sequence[int], batch_size: int) -> list[float]:
    """Each agent's Poisson sampling rate q_i = min(1, B / n_i), as the engine draws it."""
    return [rate(batch_size, n) for n in shard_sizes]


def _with_sigma(params: Any, sigma: float) -> Any:
    return dataclasses.replace(params, sigma=sigma)


def _has_sigma(params: Any) -> bool:
    return dataclasses.is_dataclass(params) and any(
        f.name == "sigma" for f in dataclasses.fields(params)
    )


def calibration_basis(
    defense: Mechanism, params: Any, W: Tensor, claimed: bool = False
) -> tuple[list[str], str]:
    """Which kinds :func:`calibrate` sets σ on, and by what count: the formal kinds with a
    Gaussian multiplier ("formal accounting"), or — when no kind is formal, or ``claimed`` —
    every kind the paper claims a multiplier for ("the paper's count"). Empty: σ is never
    set from ε."""
    if not _has_sigma(params):
        return [], "none"
    unit = _with_sigma(params, 1.0)
    facts = {k: defense.privacy(unit, k, W) for k in defense.kinds}
    formal = [k for k, pr in facts.items() if pr.formal and pr.noise_multiplier > 0]
    if formal and not claimed:
        return formal, "formal accounting"
    return [k for k, pr in facts.items() if pr.claimed_multiplier > 0], "the paper's count"


def calibrate(
    defense: Mechanism,
    params: Any,
    W: Tensor,
    rates: Sequence[float],
    epsilon: float,
    delta: float,
    rounds: int,
    accountant: str = "rdp",
    claimed: bool = False,
) -> float | None:
    """The smallest ``params.sigma`` for which every agent's ε is at most ``epsilon`` on the
    kinds of :func:`calibration_basis`: the formal kinds (their largest ε), or, when none is,
    by the paper's claimed accounting (the run then reports ε = ∞ beside the claim). The
    noise multiplier is linear in σ, so σ = z / z(σ = 1) with z from opacus. None: this
    defense's σ is never set from ε (no kind has a Gaussian multiplier, formal or claimed).
    ``claimed``: the σ the paper's own count would choose (its claimed multiplier and
    releases for every kind), to train a paper's setting as the paper would."""
    kinds, basis = calibration_basis(defense, params, W, claimed)
    if not kinds:
        return None
    unit = _with_sigma(params, 1.0)
    sigma, cache = 0.0, {}
    for a, q in enumerate(rates):
        for k in kinds:
            pr = defense.privacy(unit, k, W, a)
            if basis == "formal accounting":
                z1, r = pr.noise_multiplier, pr.releases
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
    defense: Mechanism,
    params: Any,
    W: Tensor,
    rates: Sequence[float],
    delta: float,
    rounds: int,
    accountant: str = "rdp",
) -> dict[str, Any]:
    """What a run reports, with the adjacency and the sampling stated:

    - ``kinds``: ε per message kind (worst agent; ∞ with the reason where the kind has no
      formal guarantee) beside the paper's claimed ε;
    - ``epsilon``: the guarantee of *everything the run puts on the wire* — the worst
      agent's ε over every kind when every kind is formal, else ∞ with ``epsilon_reason``
      naming the kinds without one (a number over the formal kinds alone would read as a
      promise the run does not make); ``formal_kinds`` and ``epsilon_formal_kinds`` give
      what the formal kinds alone would have, ``epsilon_claimed`` the paper's count;
    - ``agents``: each agent's Poisson rate and ε in the same two readings."""
    kinds: dict[str, Any] = {}
    agents = [
        {"agent": a, "sample_rate": q, "epsilon": 0.0, "epsilon_formal_kinds": 0.0}
        for a, q in enumerate(rates)
    ]
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

    for k in defense.kinds:
        worst, claim, first = 0.0, 0.0, None
        for a, q in enumerate(rates):
            pr = defense.privacy(params, k, W, a)
            first = first or pr
            e = eps(pr, q, False)
            worst, claim = max(worst, e), max(claim, eps(pr, q, True))
            agents[a]["epsilon"] = max(agents[a]["epsilon"], e)
            if pr.formal:
                agents[a]["epsilon_formal_kinds"] = max(agents[a]["epsilon_formal_kinds"], e)
        kinds[k] = {
            "mechanism": first.mechanism,
            "epsilon": worst,
            "formal": first.formal,
            "per_release": first.per_release,
            # one message at a fixed evaluation point (sample rate 1), where only that holds
            "epsilon_one_release": (
                release_epsilon(first.noise_multiplier, delta) if first.per_release else None
            ),
            "reason": first.reason,
            "noise_multiplier": first.noise_multiplier,
            "releases_per_round": first.releases,
            "epsilon_claimed": claim,
        }
    formal = [k for k, v in kinds.items() if v["formal"]]
    informal = [k for k, v in kinds.items() if not v["formal"]]
    if not formal:
        for row in agents:
            row["epsilon_formal_kinds"] = math.inf
    claims = [v["epsilon_claimed"] for v in kinds.values()]
    reason = None
    if informal:
        names = ", ".join(informal)
        verb = "crosses" if len(informal) == 1 else "cross"
        reason = f"{names} {verb} the links with no formal guarantee"  # why: each kind's
    return {
        "epsilon": max(row["epsilon"] for row in agents) if agents else math.inf,
        "epsilon_reason": reason,
        "formal_kinds": formal,
        "epsilon_formal_kinds": (max(kinds[k]["epsilon"] for k in formal) if formal else math.inf),
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
    if privacy.formal or privacy.per_release:  # one release at a fixed evaluation point
        correct = release_epsilon(privacy.noise_multiplier / math.sqrt(k), delta)
    else:
        correct = math.inf
    claimed = release_epsilon(privacy.claimed_multiplier / math.sqrt(k), delta)
    return {
        "mechanism": privacy.mechanism,
        "formal": privacy.formal,
        "per_release": privacy.per_release,
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


def noised(defense: Mechanism, params: Any, W: Tensor) -> bool:
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
