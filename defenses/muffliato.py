"""MUFFLIATO (Cyffers, Even, Bellet, Massoulié, NeurIPS 2022) as the DPDL/PDSL baseline.

The DPDL paper (``seeds/dpdl-paper.txt`` §VI-A): "MUFFLIATO adds Gaussian noises to the
updated model parameters without clipping, followed by multi-rounds gossip averaging based
on the spectral gap". Per round t, agent i with batch ξ^i_t (Muffliato-SGD: a local step,
then the Muffliato noise-then-gossip averaging of the step's result):

    y^0_i = x^i_{t-1} − η ∇F_i(x^i_{t-1}; ξ^i_t) + z_i,    z_i ~ N(0, σ² s² I)
    y^1   = W y^0
    y^k   = ω W y^{k-1} + (1 − ω) y^{k-2}      k = 2..K  (Chebyshev; plain: y^k = W y^{k-1})
    x^i_t = y^K_i

with ω = 2(1 − √(γ(1 − γ/4)))/(1 − γ/2)² (the paper's Algorithm 1 and the authors' code,
``gamma_tcheb``), γ the spectral gap of W. Both recursions keep the agents' average.

Messages on i→j: gossip step k sends y^{k-1}_i. Step 1's message — the freshly noised model
y^0_i — is the registered kind ``model``; step k ≥ 2 is recorded under the kind ``model@k``
(e.g. ``model@2`` = y^1_i); these extra kinds are captured but are not attack targets.

Privacy: σ (set from ``--epsilon``, one release per round: y^0 is what every neighbour sees
first) multiplies ``sensitivity`` s, by default η·G with G = ``grad_bound``. The paper's
version does **not clip**, so the guarantee holds only if every per-example gradient norm is
≤ G, which nothing enforces — implemented as written; the audit can show it. (If the bound
held, one example would move the batch-mean step by at most 2ηG/B, so η·G is conservative.)
The paper's own accounting is pairwise network DP with amplification by the later gossip
steps; the simulator's accountant instead treats y^0 as a local release.

Choices the sources leave open, as parameters: ``lr`` η = 0.05; ``grad_bound`` G = 1.0;
``chebyshev`` = True (the paper's accelerated gossip); ``gossip_steps`` K = None, meaning
⌈ln N / √γ⌉ with Chebyshev and ⌈ln N / γ⌉ without (the gossip's mixing time to 1/N; the
paper takes K from the spectral gap, its constant is not in our sources); γ =
``privaudit.topology.spectral_gap(W)`` = 1 − max(|λ₂|, |λ_N|), which is the paper's λ_W
(smallest non-zero eigenvalue of I − W) when W has no large negative eigenvalue, capped at 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

from privaudit.errors import PrivauditError
from privaudit.network import Network
from privaudit.observation import Observation
from privaudit.threat import View
from privaudit.topology import spectral_gap

from .base import Context, Defense, Privacy, State, mix, register


@dataclass
class MuffliatoParams:
    lr: float = 0.05  # η
    gossip_steps: int | None = None  # K; None: ⌈ln N/√γ⌉ (Chebyshev) or ⌈ln N/γ⌉
    chebyshev: bool = True  # Chebyshev-accelerated gossip (the paper's)
    grad_bound: float = 1.0  # G: assumed (not enforced) bound on per-example gradient norms
    sensitivity: float | None = None  # s; None: η·G
    sigma: float = 0.0  # noise std is σ·s; set from --epsilon by the accountant

    def validate(self) -> None:
        if not self.lr > 0:
            raise PrivauditError(f"lr must be > 0, got {self.lr}")
        k = self.gossip_steps
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise PrivauditError(f"gossip_steps (K) must be an integer ≥ 1, got {k!r}")
        if not isinstance(self.chebyshev, bool):
            raise PrivauditError(f"chebyshev must be true or false, got {self.chebyshev!r}")
        if not self.grad_bound > 0:
            raise PrivauditError(f"grad_bound must be > 0, got {self.grad_bound}")
        if self.sensitivity is not None and not self.sensitivity > 0:
            raise PrivauditError(f"sensitivity must be > 0, got {self.sensitivity}")
        if self.sigma < 0:
            raise PrivauditError(f"sigma must be ≥ 0, got {self.sigma}")

    @property
    def noise_std(self) -> float:
        """Per-coordinate std of the noise on y^0: σ · s."""
        s = self.lr * self.grad_bound if self.sensitivity is None else self.sensitivity
        return self.sigma * s


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
        y0 = x - p.lr * ctx.grads.mean(x, *batch)
        if p.noise_std > 0:
            y0 = y0 + ctx.gaussian(None, y0.shape[1]) * p.noise_std
        K = num_steps(p.gossip_steps, p.chebyshev, ctx.W)
        omega = chebyshev_omega(gap_of(ctx.W)) if p.chebyshev and K > 1 else None
        return {"x": gossip(net, y0, K, omega)}

    def releases_per_round(self, adj: Tensor) -> int:
        """y^0 is the one noised release per round; later gossip steps post-process it."""
        return 1

    def privacy(self, p: MuffliatoParams, kind: str, W: Tensor) -> Privacy:
        """Gaussian with std σs, s = ηG resting on an assumed, unenforced bound G."""
        if p.noise_std <= 0:
            return Privacy(reason=f"{self.name} adds no noise (σ = 0)")
        return Privacy(
            mechanism="gaussian",
            noise_multiplier=p.sigma,
            releases=1,
            formal=False,
            reason="no clipping: the sensitivity ηG rests on an assumed, unenforced bound ‖∇F‖ ≤ G",
            claimed_multiplier=p.sigma,
            paper="pairwise network DP with amplification by gossip (Cyffers et al. 2022); "
            "its constants are not in our sources",
        )

    def rounds_needed(self, kind: str, t: int, n: int) -> list[int]:
        return [t - 1, t] if t > 1 else [t]

    def observe(self, view: View, kind: str, t: int, src: int, dst: int) -> Observation:
        """(x^i_{t-1} − y^0_i)/η = ∇F_i(x^i_{t-1}) + N(0, (σs/η)²) at x^i_{t-1}, no clip.

        x^i_{t-1} = y^K_i of round t−1 = ω Σ_j w_ij y^{K-1}_j + (1 − ω) y^{K-2}_i (Chebyshev;
        plain gossip: ω = 1): exact at t = 1 (x_0 is public) and when the View holds every
        neighbour's last gossip message (a neighbour on a complete graph, global); unseen
        ones are replaced by y^{K-1}_i, the last value i sent on this link."""
        pub = view.public
        p = pub["params"]
        y0 = view.get(t, src, dst, "model")
        unseen: list[int] = []
        if t == 1:
            prev = pub["x0"].to(y0.dtype)
        else:
            K = num_steps(p["gossip_steps"], p["chebyshev"], pub["W"])
            own = view.get(t - 1, src, dst, step_kind(K))
            prev, unseen = mix(view, src, lambda j: view.sent(t - 1, j, step_kind(K)), own)
            if p["chebyshev"] and K > 1:
                omega = chebyshev_omega(gap_of(pub["W"]))
                prev = omega * prev + (1 - omega) * view.get(t - 1, src, dst, step_kind(K - 1))
        std = MuffliatoParams(**p).noise_std / p["lr"]
        meta = {"exact": not unseen}
        if unseen:
            meta["approx"] = f"x_(t-1) mixes unseen gossip values of agents {unseen}"
        return self.make_observation(view, prev, (prev - y0) / p["lr"], noise_std=std, meta=meta)
