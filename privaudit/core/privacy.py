"""A message kind's privacy facts: what a correct DP analysis of it needs (mechanism, noise
multiplier, releases per round), beside what its paper claims."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Privacy:
    """The mechanism facts a correct DP analysis of one message kind needs, for one agent.

    Adjacency is add/remove one example of the agent's shard, and the batch is Poisson
    sampled at the agent's rate q = B/n_i (what :meth:`Context.sample` draws).
    ``noise_multiplier`` is the noise std of one release over its L2 sensitivity under that
    adjacency (opacus' convention: σ for a per-example clip C with std σC on the clipped
    sum; σ/2 for a flat clip of the batch aggregate, whose add/remove sensitivity is 2C);
    ``releases`` counts the noised releases of the same batch per round (fresh noise each)
    that this kind's messages are a function of. ``formal`` False: no finite ε, ``reason``
    says why. ``claimed_multiplier`` and ``claimed_releases`` are what the paper's (or a naive)
    accounting assumes — the ledger's "promise"; ``paper_epsilon(delta, impact)`` is the
    paper's own ε for one release (or round) where it states a σ(ε) rule, ``impact`` the
    canary's L2 change of the released vector, for rules stated in Δf.

    ``paper_claims`` False: the paper makes no DP claim for this algorithm; the claimed
    multiplier and releases are this tool's reading of how the papers that use it as a
    baseline count its releases — evidence against them refutes that reading, not a claim.

    ``per_release`` (with ``formal`` False): each release is a Gaussian mechanism of
    ``noise_multiplier`` *given the point it is evaluated at*, but that point is not a
    function of formal releases and public data alone — it carries private state that
    crossed the links un-noised (e.g. a neighbour's model that mixed in the agent's
    un-noised self-gradient). Changing one example then moves the evaluation point of every
    later release, so the releases do not compose into a run guarantee (ε = ∞ over the run,
    ``reason`` says why); only a release whose evaluation point is public — or an audit that
    fixes it (the white-box audit restores the state before the round) — has the
    one-release ε. The rule: a release is accounted over the run only if its evaluation
    point, mixing weights and noise scale are functions of formal releases and public data.

    ``pairwise`` (observers ↦ S ∈ [0, 1]): the exact pairwise network-DP share of one round
    (Cyffers et al., NeurIPS 2022, define the notion): everything the ``observers`` hold in a
    round, with and without one example of this agent, is a Gaussian mechanism whose
    privacy loss is N(μ²/2, μ²), μ² = S / z², z = ``noise_multiplier`` (S = 1: as much as
    one local release; agents far from the observers get S ≪ 1). ``pairwise_paper``: the
    share the paper's own theorem states (a Rényi bound α S/(2z²) at every order), reported
    beside it and never held to an audit, since it can be below the exact share. None: the
    defense states no such bound. Both are converted to ε by
    :func:`privaudit.core.accounting.pairwise_epsilon`.

    ``assumption`` (what, G): the claim rests on a hypothesis about the data that the user
    must ensure and this run does not enforce, one that bounds every per-example gradient
    norm by G (ConstD²P's bounded gradients, Muffliato's G-Lipschitz loss). A canary whose
    gradient norm exceeds G breaks the hypothesis, so evidence from it shows that the claim
    does not apply to this run, not that it is wrong; the claims ledger judges the claim on
    the canaries of norm ≤ G (:func:`privaudit.experiments.claims.claim_verdict`). None: the
    claim assumes nothing that the run leaves unenforced.
    """

    mechanism: str = "none"  # "gaussian" (data-independent std), "gaussian-adaptive", "laplace"
    noise_multiplier: float = 0.0
    releases: int = 0
    clip: float | None = None
    clip_unit: str | None = None  # "example" (per-example clip), "batch" (flat), None
    formal: bool = False
    per_release: bool = False
    reason: str = "no noise is added"
    claimed_multiplier: float = 0.0
    claimed_releases: int = 0
    paper: str = "no privacy claim"
    paper_claims: bool = True
    paper_epsilon: Callable[[float, float], float] | None = None
    caveats: tuple[str, ...] = ()
    pairwise: Callable[[Collection[int]], float] | None = None
    assumption: tuple[str, float] | None = None
    pairwise_paper: Callable[[Collection[int]], float] | None = None


def no_noise(who: str, why: str | None = "σ = 0") -> Privacy:
    """The facts of a kind whose messages carry no noise: no mechanism, no finite ε and no
    claim. The reason reads "``who`` adds no noise (``why``)", or "``who`` adds no noise to
    its messages" when ``why`` is None (a defense that never adds any)."""
    cause = "to its messages" if why is None else f"({why})"
    return Privacy(reason=f"{who} adds no noise {cause}")


def dwork_roth_epsilon(sigma: float, delta: float) -> float:
    """ε of the classical Gaussian-mechanism rule σ = √(2 ln(1.25/δ))/ε (Dwork & Roth 2014,
    Thm. A.1, valid only for ε < 1), solved for ε; ∞ without noise."""
    return math.sqrt(2 * math.log(1.25 / delta)) / sigma if sigma > 0 else math.inf


class Mechanism(Protocol):
    """What accounting reads of a defense (:class:`privaudit.defenses.Defense` implements it):
    its message ``kinds`` and the mechanism facts of each, per agent."""

    name: str
    kinds: dict[str, str]

    def privacy(self, p: Any, kind: str, W: Any, agent: int | None = None) -> Privacy: ...
