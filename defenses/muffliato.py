"""MUFFLIATO (Cyffers, Even, Bellet, Massoulié, NeurIPS 2022) as the DPDL/PDSL baseline.

The DPDL paper (§VI-A): "MUFFLIATO adds Gaussian noises to the updated model parameters
without clipping, followed by multi-rounds gossip averaging based on the spectral gap". Per
round t, agent i with batch ξ^i_t (Muffliato-SGD: a local gradient step, then the Muffliato
noise-then-gossip averaging of the step's result):

    g_i   = (1/B) Σ_{b ∈ ξ^i_t} ∇ℓ(x^i_{t-1}; b)      (``enforce``: each ∇ℓ clipped to norm G)
    y^0_i = x^i_{t-1} − η g_i + z_i,    z_i ~ N(0, σ² s² I)
    y^1   = W y^0
    y^k   = ω W y^{k-1} + (1 − ω) y^{k-2}      k = 2..K  (Chebyshev; plain: y^k = W y^{k-1})
    x^i_t = y^K_i

with B the expected batch size, ω = 2(1 − √(γ(1 − γ/4)))/(1 − γ/2)² (the paper's
Algorithm 1 and the authors' code, ``gamma_tcheb``), γ the spectral gap of W. Both
recursions keep the agents' average.

Messages on i→j: gossip step k sends y^{k-1}_i. Step 1's message — the freshly noised model
y^0_i — is the registered kind ``model``; step k ≥ 2 is recorded under the kind ``model@k``
(e.g. ``model@2`` = y^1_i); these extra kinds are captured but are not attack targets.

Noise scale. The noise is calibrated to the sensitivity of the local gradient step: adding
or removing one example b of i's batch changes y^0_i by η∇ℓ(x; b)/B, of norm ≤ ηG/B when
every per-example gradient norm is ≤ G, so s = ηG/B (``calibration`` "add-remove", the
accountant's adjacency): the noise shrinks as 1/B, the local batch. This is the authors'
rule: their code (github.com/totilas/muffliato, ``private.py``, ``private_step_gd``) adds
``rng.normal(scale=sigma*.5)`` to the node's mean gradient before the step ("max
sensibility = .5"), on unit-norm features (``data.py``: ``Normalizer``; the logistic loss's
per-example gradient norm is then ≤ L = 1) split so every node holds m = 4 examples
(``train_size=.7755`` of the 20,640 houses is 16,006, ``gd.py``: 4,000 nodes): 0.5 = 2L/m,
the replace-one sensitivity of a mean over the local data (hard-coded: the script's
2,000-node run, m = 8, keeps 0.5), and its accounting (``ERsampled.py``, ``eps_random``)
gives a direct neighbour the local Gaussian bound α/(2σ²) (Rényi), i.e. multiplier σ over
that sensitivity. So the noise std is σ times the sensitivity of the local step, which falls
as 1/(the examples one step averages): the local dataset m in the code's full-batch GD, the
expected batch B here. ``calibration`` "replace-one" keeps the code's convention,
s = 2ηG/B; under add/remove adjacency its multiplier is then 2σ.

Privacy. Neither the paper nor the DPDL baseline clips: G is an assumed bound that nothing
enforces (the per-example gradient norms of the models here exceed G = 1 by an order of
magnitude at x_0), so one example can move y^0 arbitrarily far and ``privacy()`` is not
formal (ε = ∞, with the reason); its claim — what the paper's accounting gives a direct
neighbour: multiplier σ over s, one release per round — still sets σ from ``--epsilon``.
``enforce`` = True (not the paper's choice, which is False) clips every per-example gradient
at G before the mean, so the bound holds: y^0 is then a Gaussian mechanism of add/remove
sensitivity ηG/B, formal, with multiplier σs/(ηG/B). y^0 is the one release per round that
every neighbour sees; later gossip steps are post-processing.

Pairwise network DP (what an observer learns of a victim it may not hear directly), two
numbers per round. :func:`view_share` is the exact one: within a round everything the
observers hold is a linear function of the agents' noised y^0 with the gossip matrix public
and their own values and noise known, a Gaussian mechanism whose shift-over-noise ratio²
is S = ‖Proj_{row(N)} e_v‖² ≤ 1 (N the observed rows of the gossip polynomials on the
other agents' noise columns), stated as :attr:`Privacy.pairwise`. :func:`pairwise_share`
is the paper's Theorem 1, stated as :attr:`Privacy.pairwise_paper`; it sums each heard
message's share separately, which is below S wherever the observer can combine messages
(line 0 – 1 – 2, observer 0, K = 2: Theorem 1 gives 1/3, the exact view 1 — agent 0 solves
y^0_2 = 3y^1_1 − y^0_0 − y^0_1 from what it holds). Both are converted to ε by
:func:`privaudit.core.accounting.pairwise_epsilon`.

Choices the sources leave open, as parameters: ``lr`` η = 0.05; ``grad_bound`` G = 1.0;
``chebyshev`` = True (the paper's accelerated gossip); ``gossip_steps`` K = None, meaning
⌈ln N / √γ⌉ with Chebyshev and ⌈ln N / γ⌉ without (the gossip's mixing time to 1/N; the
paper takes K from the spectral gap; the constant 1 is this toolkit's choice); γ =
``privaudit.scenario.topology.spectral_gap(W)`` = 1 − max(|λ₂|, |λ_N|), which is the paper's λ_W
(smallest non-zero eigenvalue of I − W) when W has no large negative eigenvalue, capped at 1;
``calibration`` = "add-remove"; ``enforce`` = False.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor

from privaudit.core.context import Context, State
from privaudit.core.errors import PrivauditError
from privaudit.core.network import Network
from privaudit.core.observation import Observation
from privaudit.core.privacy import Privacy
from privaudit.core.recursion import Recursion, gossip_polynomials, muffliato
from privaudit.core.threat import View
from privaudit.defenses.base import (
    Defense,
    Params,
    check_choice,
    check_count,
    check_flag,
    check_non_negative,
    check_positive,
    mix,
    one_release_per_round,
    register,
)
from privaudit.scenario.topology import spectral_gap

CALIBRATIONS = {"add-remove": 1.0, "replace-one": 2.0}  # s in units of ηG/B


@dataclass
class MuffliatoParams(Params):
    gossip_steps: int | None = None  # K; None: ⌈ln N/√γ⌉ (Chebyshev) or ⌈ln N/γ⌉
    chebyshev: bool = True  # Chebyshev-accelerated gossip (the paper's)
    grad_bound: float = 1.0  # G: bound on per-example gradient norms (assumed unless enforce)
    calibration: str = "add-remove"  # s = ηG/B ("add-remove") or 2ηG/B ("replace-one")
    enforce: bool = False  # clip every per-example gradient at G (the paper does not)
    sigma: float = 0.0  # noise std is σ·s; set from --epsilon by the accountant

    def validate(self) -> None:
        super().validate()
        check_count("gossip_steps", self.gossip_steps, optional=True)
        check_flag("chebyshev", self.chebyshev)
        check_positive("grad_bound", self.grad_bound)
        check_choice("calibration", self.calibration, CALIBRATIONS)
        check_flag("enforce", self.enforce)
        check_non_negative("sigma", self.sigma)

    def sensitivity(self, batch_size: int) -> float:
        """s: ηG/B ("add-remove") or 2ηG/B ("replace-one"), B the expected batch size."""
        return CALIBRATIONS[self.calibration] * self.lr * self.grad_bound / batch_size

    def noise_std(self, batch_size: int) -> float:
        """Per-coordinate std of the noise on y^0: σ · s."""
        return self.sigma * self.sensitivity(batch_size)

    @property
    def multiplier(self) -> float:
        """σs / (ηG/B): the noise std over y^0's add/remove sensitivity (with ``enforce``)."""
        return self.sigma * CALIBRATIONS[self.calibration]


def step_kind(k: int) -> str:
    """Kind of gossip step k's message (1-based): ``model``, then ``model@2``, …"""
    return "model" if k == 1 else f"model@{k}"


def gap_of(W: Tensor) -> float:
    """γ = 1 − max(|λ₂|, |λ_N|) of W, capped at 1; an error if gossip cannot mix."""
    gap = spectral_gap(W)
    if not gap > 1e-12:
        raise PrivauditError(
            "the mixing matrix has spectral gap 0 (disconnected or periodic graph), so "
            "gossip never averages; use a connected topology"
        )
    return min(gap, 1.0)


def chebyshev_omega(gap: float) -> float:
    """ω = 2(1 − √(γ(1 − γ/4)))/(1 − γ/2)² for spectral gap γ ∈ (0, 1]."""
    return 2 * (1 - math.sqrt(gap * (1 - gap / 4))) / (1 - gap / 2) ** 2


def num_steps(gossip_steps: int | None, chebyshev: bool, W: Tensor) -> int:
    """K as given, else ⌈ln N / √γ⌉ (Chebyshev) or ⌈ln N / γ⌉ (plain), at least 1."""
    if gossip_steps is not None:
        return gossip_steps
    gap = gap_of(W)
    rate = math.sqrt(gap) if chebyshev else gap
    return max(1, math.ceil(math.log(W.shape[0]) / rate))


def gossip(net: Network, y0: Tensor, steps: int, omega: float | None) -> Tensor:
    """``steps`` gossip steps from y^0 (Chebyshev with ``omega``, plain if None); step k
    sends the value it mixes under :func:`step_kind` (k)."""
    prev, cur = y0, net.gossip(step_kind(1), y0)
    for k in range(2, steps + 1):
        mixed = net.gossip(step_kind(k), cur)
        nxt = mixed if omega is None else omega * mixed + (1 - omega) * prev
        prev, cur = cur, nxt
    return cur


def _members(W: np.ndarray, victim: int, observers: Collection[int]) -> list[int]:
    """The sorted observers, checked: agents of W, not the victim."""
    n = W.shape[0]
    members = sorted({int(a) for a in observers})
    if not members or not all(0 <= a < n for a in members):
        raise PrivauditError(f"observers must be agents in 0..{n - 1}, got {members}")
    if victim in members:
        raise PrivauditError(f"agent {victim} is one of the observers; choose another victim")
    return members


def _heard(W: np.ndarray, members: list[int]) -> list[int]:
    """The agents outside ``members`` that some member hears (a non-zero weight), once each."""
    return sorted({w for m in members for w in np.flatnonzero(W[m]).tolist() if w not in members})


def view_share(
    W: Tensor, steps: int, omega: float | None, victim: int, observers: Collection[int]
) -> float:
    """S_{v→A}: the exact share of one round's Gaussian view of the ``observers`` A.

    Within a round every agent's y^0_j = m_j + z_j, z_j ~ N(0, σ²s² I) independent, and
    gossip step k sends y^{k-1}_w = Σ_j P_{k-1}(W)_{wj} y^0_j on w's links. A holds the
    rows P_k(W)_w, k = 0..K−1, of every agent w outside A that a member hears, its own y^0
    and noise (so the columns of A's agents drop out: their noise is known), and the gossip
    matrix. Adding one example of v shifts y^0_v by Δ (‖Δ‖ ≤ the sensitivity), i.e. the
    observed vector by Δ·a_v, a_v the v-column of N, N the observed rows on the columns of
    the agents outside A. The view is a Gaussian mechanism, so its privacy loss is exactly
    Gaussian with μ² = (‖Δ‖/σs)² · a_vᵀ(NNᵀ)⁺a_v, and

        S = a_vᵀ (N Nᵀ)⁺ a_v = ‖Proj_{row(N)} e_v‖² ∈ [0, 1]

    (e_v's share in the span of what A observes; the likelihood-ratio test is the
    generalised-least-squares statistic a_vᵀ(NNᵀ)⁺o). S = 1 when A can solve the gossip
    equations for y^0_v (a neighbour always can: it hears y^0_v itself), so the local
    bound always caps it; S = 0 when nothing of v reaches A within the round. A member's
    own later gossip values are functions of what it hears and its own y^0, so they add
    nothing. Rank: singular values above 1e-10 of the largest."""
    Wd = torch.as_tensor(W).detach().cpu().to(torch.float64).numpy()
    members = _members(Wd, victim, observers)
    heard = _heard(Wd, members)
    if not heard:
        return 0.0
    others = [j for j in range(Wd.shape[0]) if j not in members]
    N = np.concatenate([P[heard][:, others] for P in gossip_polynomials(Wd, steps - 1, omega)])
    _, sv, vt = np.linalg.svd(N, full_matrices=False)
    basis = vt[sv > 1e-10 * sv[0]] if sv.size and sv[0] > 0 else vt[:0]
    share = float((basis[:, others.index(victim)] ** 2).sum())
    return min(max(share, 0.0), 1.0)


def pairwise_share(
    W: Tensor,
    steps: int,
    omega: float | None,
    victim: int,
    observers: Collection[int],
    *,
    senders: str = "heard",
) -> float:
    """S_{v→A}: the pairwise network-DP share of Muffliato's averaging (Cyffers, Even, Bellet
    & Massoulié, NeurIPS 2022, Theorem 1, pairwise Rényi DP; here as the authors state it
    for gossip with polynomials P_k): after K gossip steps from y^0 = x + N(0, σ²I), agent v
    is (α, α Δ² S/(2σ²))-pairwise network DP towards u with

        S = Σ_{k=0}^{K-1} Σ_{w ∈ N_u} (P_k(W))_{wv}² / ‖(P_k(W))_w‖²,

    N_u the agents u hears (step k+1 sends y^k_w = (P_k(W) y^0)_w, whose v-coefficient over
    its noise std is the k-th term). S = 1 + … for a neighbour (the k = 0 term is y^0_v
    itself), S ≪ 1 for a far agent. Multiplied by (σ/Δ)⁻² = z⁻² it is one round's Rényi
    bound; rounds compose additively (the paper's Muffliato-GD/SGD accounting).

    It treats each heard message on its own, so an observer that combines them (and
    subtracts its own known values) learns more: :func:`view_share` is the exact share,
    which a linear attacker reaches, and it exceeds this one on small graphs (line of 3,
    observer 0, victim 2, K = 2: 1/3 here, 1 exactly). privaudit reports this number as the
    paper's, beside the exact one, never as a bound it holds the audit to.

    The choices the theorem leaves open, as parameters: the polynomials are the ones the
    run gossips with (``omega``: Chebyshev; None: P_k = W^k, the plain form); a coalition
    A of several ``observers`` (not in the paper, which is pairwise) sums over the distinct
    agents it hears, ``senders`` = "heard": N(A) ∖ A (its members' own values are functions
    of what they hear and their own data); ``senders`` = "all-copies" counts a sender once
    per member that hears it (looser)."""
    if senders not in ("heard", "all-copies"):
        raise PrivauditError(f"senders must be 'heard' or 'all-copies', got {senders!r}")
    Wd = torch.as_tensor(W).detach().cpu().to(torch.float64).numpy()
    members = _members(Wd, victim, observers)
    if senders == "heard":
        heard = _heard(Wd, members)
    else:
        heard = [w for m in members for w in np.flatnonzero(Wd[m]).tolist() if w not in members]
    share = 0.0
    for P in gossip_polynomials(Wd, steps - 1, omega):
        rows = P[heard]
        share += float(((rows[:, victim] ** 2) / (rows**2).sum(1)).sum()) if heard else 0.0
    return share


@register
class Muffliato(Defense):
    name = "muffliato"
    kinds = {
        "model": "y⁰_i = x_i − η∇F_i(x_i) + N(0, σ²s²): the noised model, first of K gossip "
        "steps (steps k ≥ 2 are recorded as model@k)",
    }
    Params = MuffliatoParams

    def round(
        self,
        ctx: Context,
        p: MuffliatoParams,
        state: State,
        net: Network,
        batch: tuple[Tensor, Tensor],
    ) -> State:
        x = state["x"]
        if p.enforce:  # per-example clip at G: the bound the noise scale assumes holds
            g = ctx.grads.clipped_mean(x, *batch, p.grad_bound)
        else:
            g = ctx.grads.mean(x, *batch)
        y0 = x - p.lr * g
        std = p.noise_std(ctx.batch_size)
        if std > 0:
            y0 = y0 + ctx.gaussian(None, y0.shape[1]) * std
        K = num_steps(p.gossip_steps, p.chebyshev, ctx.W)
        omega = chebyshev_omega(gap_of(ctx.W)) if p.chebyshev and K > 1 else None
        return {"x": gossip(net, y0, K, omega)}

    def privacy(
        self, p: MuffliatoParams, kind: str, W: Tensor, agent: int | None = None
    ) -> Privacy:
        """y^0: one Gaussian release per round (every later gossip step post-processes it),
        std σs over the add/remove sensitivity ηG/B of the local step — formal only with
        ``enforce`` (per-example clip at G); without it G is assumed, nothing bounds it."""
        if p.enforce:
            clip, assumption = (p.grad_bound, "example"), None
            reason = (
                "per-example clip G, then N(0, σ²s²) on y⁰ = x − η·(clipped sum)/B: add/remove "
                "sensitivity ηG/B, one release per round"
            )
        else:
            clip = None
            assumption = ("G-Lipschitz loss: every per-example gradient norm ≤ G", p.grad_bound)
            reason = (
                "no clipping: the sensitivity ηG/B rests on a bound ‖∇ℓ‖ ≤ G on every "
                "per-example gradient that nothing enforces, so one example can move y⁰ "
                "arbitrarily far (enforce=true clips at G)"
            )
        paper = (
            "pairwise network DP (Rényi) with amplification by gossip for non-neighbours; a "
            "direct neighbour gets the local Gaussian bound at multiplier σ over the step's "
            "sensitivity, one release per round (authors' code: ERsampled.eps_random)"
        )
        shares = {}
        if agent is not None:
            K = num_steps(p.gossip_steps, p.chebyshev, W)
            omega = chebyshev_omega(gap_of(W)) if p.chebyshev and K > 1 else None
            shares = {
                "pairwise": partial(view_share, W, K, omega, agent),
                "pairwise_paper": partial(pairwise_share, W, K, omega, agent),
            }
        return one_release_per_round(
            self.name,
            p.sigma,
            p.multiplier,
            paper=paper,
            reason=reason,
            clip=clip,
            assumption=assumption,
            **shares,
        )

    def rounds_needed(self, kind: str, t: int, n: int) -> list[int]:
        return [t - 1, t] if t > 1 else [t]

    def observe(self, view: View, kind: str, t: int, src: int, dst: int) -> Observation:
        """(x^i_{t-1} − y^0_i)/η = ∇F_i(x^i_{t-1}) + N(0, (σs/η)²) at x^i_{t-1}; the
        per-example clip is G with ``enforce``, else none.

        x^i_{t-1} = y^K_i of round t−1 = ω Σ_j w_ij y^{K-1}_j + (1 − ω) y^{K-2}_i (Chebyshev;
        plain gossip: ω = 1): exact at t = 1 (x_0 is public) and when the View holds every
        neighbour's last gossip message (a neighbour on a complete graph, global); unseen
        ones are replaced by y^{K-1}_i, the last value i sent on this link."""
        pub = view.public
        p = pub.params
        y0 = view.get(t, src, dst, "model")
        unseen: list[int] = []
        if t == 1:
            prev = pub.x0.to(y0.dtype)
        else:
            K = num_steps(p["gossip_steps"], p["chebyshev"], pub.W)
            own = view.get(t - 1, src, dst, step_kind(K))
            prev, unseen = mix(view, src, lambda j: view.sent(t - 1, j, step_kind(K)), own)
            if p["chebyshev"] and K > 1:
                omega = chebyshev_omega(gap_of(pub.W))
                prev = omega * prev + (1 - omega) * view.get(t - 1, src, dst, step_kind(K - 1))
        std = MuffliatoParams(**p).noise_std(pub.batch_size) / p["lr"]
        clip = p["grad_bound"] if p["enforce"] else None
        meta = {"exact": not unseen}
        if unseen:
            meta["approx"] = f"x_(t-1) mixes unseen gossip values of agents {unseen}"
        target = (prev - y0) / p["lr"]
        return self.make_observation(view, prev, target, clip=clip, noise_std=std, meta=meta)

    def recursion(self, p: Any, W: Tensor, batch_size: int) -> Recursion:
        """The local step, the noise once, then the K gossip steps as a polynomial in W
        (:func:`~privaudit.core.recursion.muffliato`): y^k_t = P_k(W)(x_{t-1} − η g_t + z_t),
        z ~ N(0, (σs)²) per agent, round and coordinate, every y^{k-1} (``model@k``) a
        message. A coalition hearing agent j's K gossip values hears combinations of the
        y^0 of every agent within K − 1 hops of j, so it reaches past its neighbours; a
        recovered g_v^t keeps z_v^t/η (std σs/η, as :meth:`observe` reports)."""
        K = num_steps(p.gossip_steps, p.chebyshev, W)
        omega = chebyshev_omega(gap_of(W)) if p.chebyshev and K > 1 else None
        clip = p.grad_bound if p.enforce else None
        return muffliato(W, p.lr, K, omega, noise_std=p.noise_std(batch_size), clip=clip)
