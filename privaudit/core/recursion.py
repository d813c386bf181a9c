"""A defense's linear structure, stated once: the recursion its gossiped messages follow.

El Mrini, Cyffers & Bellet ("Privacy Attacks in Decentralized Learning", ICML 2024) observe
that in gossip averaging and decentralized gradient descent every message is a *known*
linear function — powers and products of the public gossip matrix W — of everyone's
private quantities (the initial values and every update). This module is the vocabulary
for that structure: a defense states it (:meth:`privaudit.defenses.base.Defense.recursion`),
the gossip algebra (:mod:`privaudit.attacks.gossip_algebra`) solves it.

A :class:`Recursion` has per-agent states s_t ∈ R^S (S = n·#components) driven by per-agent
inputs u_t ∈ R^P (P = n·#kinds),

    s_t = A_t s_{t-1} + B_t u_t,     t = 1, …, T,     s_0 the initial states,

with every coordinate of the d-dimensional payload following the same recursion (W acts on
agents, not on coordinates). Variables are keyed ``(kind, agent, round)``: ``(c + "0", k, 0)``
is component c of k's initial state, ``(g, k, t)`` k's round-t input of kind g.

Beyond the algebra, a recursion a defense returns says how it meets the run (the fields
``carries``, ``update``, ``point`` and ``facts``): which message kind carries which state
component (round t's message of that kind is s_t's component, one recursion step per
round), which input is the round's update an Observation targets, at which model that update
is evaluated (a linear functional of the states, so it can be estimated too), and the
Observation fields an update's Observation takes (``clip``).

Builders: :func:`averaging` (x^t = W x^{t-1}, El Mrini et al.'s first setting),
:func:`dpsgd` (this project's adapt-then-combine D-PSGD, ``dsgd`` and ``dp-dpsgd``),
:func:`tracking` (gradient tracking, ``dsgt``) and :func:`muffliato` (a local step, noise,
then K polynomial gossip steps, ``muffliato``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from privaudit.core.errors import PrivauditError

Key = tuple[str, int, int]  # (kind, agent, round) of one scalar-per-coordinate variable
StateKey = tuple[str, int, int]  # (component, agent, state index) of one state entry
Matrix = Any  # an (r, c) torch tensor, numpy array or scipy sparse matrix
Point = Callable[[int, int], dict[StateKey, float]]


@dataclass(frozen=True)
class Recursion:
    """A linear recursion s_t = A_t s_{t-1} + B_t u_t (t ≥ 1) on n agents.

    n:          agents.
    transition: t ↦ (A_t, B_t): A_t is (S × S), B_t is (S × P) or None (no input that round);
                S = n·len(state), P = n·len(inputs); state index c·n + k is component c of
                agent k, input index c·n + k is k's input of kind ``inputs[c]``.
    state:      component names of each agent's state (``("x",)``; ``("x", "v")`` for a
                momentum method). Component c's initial value is the variable
                ``(c + "0", k, 0)``.
    inputs:     input kinds (``("g",)``: the update; add ``"z"`` for noise).
    noise:      input kinds that are Gaussian noise, with their per-coordinate std: nuisance
                unknowns of known prior, not targets.
    public:     variable kinds every participant knows (``"x0"`` when the initial model is
                shared, as in every defense of this project); their value is the run's x_0.
    carries:    message kind → the state component it carries: agent k's round-t message of
                that kind is component c of k's state s_t (one recursion step per round).
    update:     the input kind an update's Observation targets (``("g", k, t)``: k's round-t
                batch-mean gradient).
    point:      (t, k) ↦ coefficients {(component, agent, state index): c} of the model at
                which k's round-t update is evaluated (an Observation's ``params``); None:
                the recursion does not say.
    facts:      further Observation fields of an update's Observation (``{"clip": C}`` when
                the update is a per-example clipped mean).
    """

    n: int
    transition: Callable[[int], tuple[Matrix, Matrix | None]]
    state: tuple[str, ...] = ("x",)
    inputs: tuple[str, ...] = ("g",)
    noise: Mapping[str, float] = field(default_factory=dict)
    public: frozenset[str] = frozenset()
    name: str = "recursion"
    carries: Mapping[str, str] = field(default_factory=dict)
    update: str = "g"
    point: Point | None = None
    facts: Mapping[str, Any] = field(default_factory=dict)

    @property
    def S(self) -> int:
        return self.n * len(self.state)

    @property
    def P(self) -> int:
        return self.n * len(self.inputs)

    def variables(self, rounds: int) -> list[Key]:
        """Every variable of ``rounds`` rounds, in unrolling order: the initial states, then
        round 1's inputs, round 2's, …"""
        keys = [(f"{c}0", k, 0) for c in self.state for k in range(self.n)]
        for t in range(1, rounds + 1):
            keys += [(c, k, t) for c in self.inputs for k in range(self.n)]
        return keys

    def component(self, name: str) -> int:
        if name not in self.state:
            raise PrivauditError(
                f"the {self.name} recursion has no state component {name!r}; "
                f"use one of: {', '.join(self.state)}"
            )
        return self.state.index(name)

    def step(self, t: int) -> tuple[sp.csr_matrix, sp.csr_matrix | None]:
        """(A_t, B_t) as float64 CSR matrices, shapes checked."""
        A, B = self.transition(t)
        A = as_csr(A)
        if A.shape != (self.S, self.S):
            raise PrivauditError(
                f"the {self.name} transition A_{t} has shape {A.shape}, expected "
                f"({self.S}, {self.S}); make it (n·#state, n·#state)"
            )
        if B is None:
            return A, None
        B = as_csr(B)
        if B.shape != (self.S, self.P):
            raise PrivauditError(
                f"the {self.name} transition B_{t} has shape {B.shape}, expected "
                f"({self.S}, {self.P}); make it (n·#state, n·#inputs)"
            )
        return A, B

    def shifted(self, start: int) -> Recursion:
        """The same recursion restarted after round ``start``: its state 0 is s_start (every
        agent's, private: nothing is public any more), its round t' is round start + t'. A
        window of rounds start..T is then unrolled without the rounds before it."""
        if start < 0:
            raise PrivauditError(f"a recursion cannot start at round {start}; use 0 or later")
        if start == 0:
            return self
        transition, point = self.transition, self.point

        def moved(t: int, k: int) -> dict[StateKey, float]:
            assert point is not None
            return {(c, j, s - start): v for (c, j, s), v in point(t + start, k).items()}

        return dataclasses.replace(
            self,
            transition=lambda t: transition(t + start),
            public=frozenset(),
            point=None if point is None else moved,
            name=f"{self.name} from round {start}",
        )

    def kind_of(self, component: str) -> str:
        """The message kind that carries state ``component`` (the first, if several do)."""
        for kind, c in self.carries.items():
            if c == component:
                return kind
        raise PrivauditError(
            f"no message of the {self.name} recursion carries its state component "
            f"{component!r}; name it in carries"
        )


def as_csr(m: Matrix) -> sp.csr_matrix:
    """``m`` (a torch tensor, numpy array or scipy sparse matrix) as a float64 CSR matrix."""
    if sp.issparse(m):
        return sp.csr_matrix(m, dtype=np.float64)
    if isinstance(m, Tensor):
        m = m.detach().cpu().to(torch.float64).numpy()
    return sp.csr_matrix(np.asarray(m, dtype=np.float64))


def mixing_matrix(W: Matrix) -> sp.csr_matrix:
    """The gossip matrix W as float64 CSR, refused unless square."""
    W = as_csr(W)
    if W.ndim != 2 or W.shape[0] != W.shape[1]:
        raise PrivauditError(
            f"the gossip matrix W must be square (got shape {W.shape}); build it with "
            "metropolis_hastings(adj)"
        )
    return W


def averaging(W: Matrix) -> Recursion:
    """Gossip averaging of private values: x^t = W x^{t-1}, x^0 private, no inputs — El Mrini
    et al.'s first setting. The message of round t + 1 is x^t (state index t)."""
    Wm = mixing_matrix(W)
    return Recursion(n=Wm.shape[0], transition=lambda t: (Wm, None), inputs=(), name="averaging")


def dpsgd(
    W: Matrix,
    lr: float,
    noise_std: float = 0.0,
    public_x0: bool = True,
    kind: str = "half-model",
    clip: float | None = None,
) -> Recursion:
    """This project's D-PSGD (``defenses/dsgd.py``, adapt-then-combine, Lian et al. 2017) as
    a recursion on the gossiped half-step x̃ (the ``kind`` message of round t is state t):

        x̃_1 = x_0 − η g_1,     x̃_t = W x̃_{t-1} − η g_t   (t ≥ 2),

    since x_{t-1} = W x̃_{t-1} and x̃_t = x_{t-1} − η ∇F(x_{t-1}); ``("g", k, t)`` is k's
    round-t batch gradient at x^k_{t-1} = Σ_j w_kj x̃^j_{t-1} (x_0 at t = 1: ``point``), the
    quantity ``DSGD.observe`` recovers from one message. ``noise_std`` > 0 adds an input
    ``z`` ~ N(0, noise_std²) per agent and round (x̃_t = … − η g_t + z_t: Gaussian noise on the
    gossiped model; DP-DPSGD's N(0, (σC/B)²) on ĝ is z = −η·that, std ησC/B).
    ``public_x0``: the shared initial model is known to everyone (``x0``). ``clip``: the
    update is a per-example clipped mean (an Observation's ``clip``)."""
    Wm = mixing_matrix(W)
    n = Wm.shape[0]
    eye = sp.identity(n, format="csr")
    noisy = noise_std > 0
    step = sp.hstack([-lr * eye, eye], format="csr") if noisy else -lr * eye
    Wd = Wm.toarray()

    def transition(t: int) -> tuple[sp.csr_matrix, sp.csr_matrix]:
        return (eye if t == 1 else Wm), step

    def point(t: int, k: int) -> dict[StateKey, float]:
        # x^k_{t-1} = Σ_j w_kj x̃^j_{t-1}; at t = 1 the same sum over s_0 = x_0 is x_0
        return {("x", j, t - 1): float(Wd[k, j]) for j in np.flatnonzero(Wd[k]).tolist()}

    return Recursion(
        n=n,
        transition=transition,
        inputs=("g", "z") if noisy else ("g",),
        noise={"z": float(noise_std)} if noisy else {},
        public=frozenset({"x0"}) if public_x0 else frozenset(),
        name="dpsgd",
        carries={kind: "x"},
        point=point,
        facts={} if clip is None else {"clip": float(clip)},
    )


def tracking(W: Matrix, lr: float) -> Recursion:
    """Gradient tracking as ``defenses/tracking.py``'s DSGT runs it (Pu & Nedić 2021;
    Koloskova et al. 2021), with the cached old gradient. Round t's messages are the model
    θ^{t-1} (``model``) and the tracking variable γ^{t-1} (``gt``), with g_t = ∇L(θ^{t-1};
    ξ_t):

        γ^{t-1} = W γ^{t-2} + g_t − g_{t-1}  (γ^0 = g_1),     θ^t = W θ^{t-1} − λ γ^{t-1}.

    State s_t = (x, c, h) per agent = (θ^{t-1}, γ^{t-1}, g_t), the messages of round t and the
    last gradient:

        x_1 = x_0,  c_1 = h_1 = g_1;     x_t = W x_{t-1} − λ c_{t-1},
        c_t = W c_{t-1} + g_t − h_{t-1},  h_t = g_t   (t ≥ 2).

    Two gossiped quantities carry one fresh unknown per agent and round, so a coalition can
    solve for agents beyond its neighbourhood (which D-PSGD's one message never allows)."""
    Wm = mixing_matrix(W)
    n = Wm.shape[0]
    eye = sp.identity(n, format="csr")
    zero = sp.csr_matrix((n, n))
    first = sp.bmat([[eye, zero, zero], [zero, zero, zero], [zero, zero, zero]], format="csr")
    later = sp.bmat([[Wm, -lr * eye, zero], [zero, Wm, -eye], [zero, zero, zero]], format="csr")
    B = sp.vstack([zero, eye, eye], format="csr")

    def point(t: int, k: int) -> dict[StateKey, float]:
        return {("x", k, t): 1.0}  # θ^{t-1}, sent in round t

    return Recursion(
        n=n,
        transition=lambda t: (first if t == 1 else later, B),
        state=("x", "c", "h"),
        public=frozenset({"x0"}),
        name="gradient tracking",
        carries={"model": "x", "gt": "c"},
        point=point,
    )


def gossip_polynomials(W: Matrix, steps: int, omega: float | None = None) -> list[np.ndarray]:
    """P_0(W), …, P_steps(W) (dense float64): the gossip polynomials of Muffliato's averaging
    (Cyffers et al., NeurIPS 2022, Algorithm 1): P_0 = I, P_1 = W and, with the Chebyshev
    weight ``omega`` ω, P_k = ω W P_{k-1} + (1 − ω) P_{k-2} (k ≥ 2); ``omega`` None is plain
    gossip, P_k = W^k. After k gossip steps from y^0 every agent holds y^k = P_k(W) y^0."""
    Wd = mixing_matrix(W).toarray()
    if steps < 0:
        raise PrivauditError(f"gossip steps must be ≥ 0, got {steps}")
    w = 1.0 if omega is None else float(omega)
    out = [np.eye(Wd.shape[0])]
    if steps >= 1:
        out.append(Wd.copy())
    for _ in range(2, steps + 1):
        out.append(w * (Wd @ out[-1]) + (1 - w) * out[-2])
    return out


def muffliato(
    W: Matrix,
    lr: float,
    steps: int,
    omega: float | None = None,
    noise_std: float = 0.0,
    clip: float | None = None,
) -> Recursion:
    """Muffliato-SGD as ``defenses/muffliato.py`` runs it (Cyffers et al., NeurIPS 2022): per
    round t a local step, Gaussian noise once, then K = ``steps`` gossip steps,

        y^0_t = x_{t-1} − η g_t + z_t,   y^k_t = P_k(W) y^0_t (k = 1..K−1),   x_t = y^K_t,

    with P_k the gossip polynomials (:func:`gossip_polynomials`; Chebyshev weight ``omega``,
    None: plain) and x_{t-1} = ω W y^{K-1}_{t-1} + (1 − ω) y^{K-2}_{t-1} (= W y^{K-1} for
    plain gossip or K = 1; x_0 at t = 1). Gossip step k sends y^{k-1}, so the state of
    round t holds the K messages of that round: component ``x`` is y^0 (the ``model``
    message, its initial state the public x_0) and ``y{k}`` is y^k (``model@{k+1}``):

        s_t = [P_0; …; P_{K-1}] (E_t s_{t-1} − η g_t + z_t),

    E_t s_{t-1} = x_{t-1}. ``("g", k, t)`` is k's round-t batch-mean gradient at x^k_{t-1}
    (``point``), per-example clipped at ``clip`` when given (``enforce``); ``noise_std`` > 0
    adds the input ``z`` ~ N(0, noise_std²) on y^0 (σs, Muffliato's noise), so a recovered
    g carries the error z/η, of std noise_std/η, as :meth:`Muffliato.observe` reports."""
    Wm = mixing_matrix(W)
    n = Wm.shape[0]
    if steps < 1:
        raise PrivauditError(f"Muffliato needs at least one gossip step, got {steps}")
    polys = gossip_polynomials(Wm, steps - 1, omega)
    stack = sp.csr_matrix(np.vstack(polys))  # (nK × n): y^k = P_k y^0
    eye = sp.identity(n, format="csr")
    zero = sp.csr_matrix((n, n))
    w = 1.0 if omega is None or steps == 1 else float(omega)
    state = ("x", *(f"y{k}" for k in range(1, steps)))
    first = sp.hstack([eye] + [zero] * (steps - 1), format="csr")
    if steps == 1:
        last = Wm
    else:  # x_{t-1} from the last two gossip values of round t − 1
        blocks = [zero] * steps
        blocks[-1] = w * Wm
        blocks[-2] = blocks[-2] + (1 - w) * eye
        last = sp.hstack(blocks, format="csr")
    noisy = noise_std > 0
    step = sp.hstack([-lr * eye, eye], format="csr") if noisy else -lr * eye
    A1, At, B = stack @ first, stack @ last, stack @ step
    Wd = Wm.toarray()

    def point(t: int, k: int) -> dict[StateKey, float]:
        if t == 1:
            return {("x", k, 0): 1.0}
        out: dict[StateKey, float] = {
            (state[-1], j, t - 1): w * float(Wd[k, j]) for j in np.flatnonzero(Wd[k]).tolist()
        }
        if steps > 1 and w != 1.0:
            key = (state[-2], k, t - 1)
            out[key] = out.get(key, 0.0) + (1 - w)
        return out

    return Recursion(
        n=n,
        transition=lambda t: (A1 if t == 1 else At, B),
        state=state,
        inputs=("g", "z") if noisy else ("g",),
        noise={"z": float(noise_std)} if noisy else {},
        public=frozenset({"x0"}),
        name="muffliato",
        carries={("model" if k == 0 else f"model@{k + 1}"): c for k, c in enumerate(state)},
        point=point,
        facts={} if clip is None else {"clip": float(clip)},
    )
