"""DP-DPSGD: A(DP)²SGD (Xu, Zhang, Wang, TPAMI 2021) as the DPDL and PDSL papers run it.

Both papers describe the baseline in one sentence each (DPDL §VI-A,
"DP-DPSGD: … Gaussian mechanism is applied in decentralized parallel SGD [6] … each agent
perturbs its local gradient shared with its neighbors"; PDSL §VI):
D-PSGD (Lian et al. 2017) whose local gradient is noised before it leaves the agent. Per
round t, agent i with its Poisson batch ξ^i_t of expected size B (:mod:`privaudit.core.sampling`;
Σ_b runs over its realised examples), in adapt-then-combine form like ``dsgd``:

    ĝ^i_t = (1/B)(Σ_b clip_C(∇F_i(x^i_{t-1}; ξ_b)) + z^i_t),   z ~ N(0, σ²C² I)
    x̃^i_t = x^i_{t-1} − η ĝ^i_t,        x^i_t = Σ_j w_ij x̃^j_t

Only ``half-model`` (x̃^i_t) crosses a link; it carries the noised gradient once, the same
value to every neighbour, so ``releases_per_round`` is 1 and σ (set from ``--epsilon``) is
the noise multiplier of the clipped sum: the noise on the batch mean has std σC/B.

Choices the sources leave open, as parameters: ``clip`` C = 1.0 (per-example clipping —
A(DP)²SGD instead *assumes* ‖∇F‖ ≤ G and scales its noise by G; clipping makes that bound
hold), ``lr`` η = 0.05. The original is asynchronous (AD-PSGD: each worker averages with
one random neighbour); the DPDL/PDSL papers compare against the synchronous D-PSGD form,
implemented here with Metropolis–Hastings W. No momentum, all agents start from x_0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from privaudit.core.context import Context, State
from privaudit.core.network import Network
from privaudit.core.observation import Observation
from privaudit.core.privacy import Privacy
from privaudit.core.recursion import Recursion, dpsgd
from privaudit.core.threat import View
from privaudit.defenses.base import (
    Defense,
    Params,
    check_non_negative,
    check_positive,
    one_release_per_round,
    register,
)


@dataclass
class DPDPSGDParams(Params):
    clip: float = 1.0  # C, per-example
    sigma: float = 0.0  # noise multiplier; set from --epsilon by the accountant

    def validate(self) -> None:
        super().validate()
        check_positive("clip", self.clip)
        check_non_negative("sigma", self.sigma)


@register
class DPDPSGD(Defense):
    name = "dp-dpsgd"
    kinds = {
        "half-model": "x̃_i = x_i − η ĝ_i: half-step with a per-example clipped, noised gradient",
    }
    Params = DPDPSGDParams
    union_exact = True  # checked copy by copy in tests/test_mia_models.py

    def round(
        self,
        ctx: Context,
        p: DPDPSGDParams,
        state: State,
        net: Network,
        batch: tuple[Tensor, Tensor],
    ) -> State:
        x = state["x"]
        xs, ys = batch
        g = ctx.grads.clipped_mean(x, xs, ys, p.clip)
        if p.sigma > 0:
            g = g + ctx.gaussian(None, g.shape[1]) * (p.sigma * p.clip / ctx.batch_size)
        return {"x": net.gossip("half-model", x - p.lr * g)}

    def privacy(self, p: DPDPSGDParams, kind: str, W: Tensor, agent: int | None = None) -> Privacy:
        """One Gaussian release per round: per-example clip C, std σC on the clipped sum."""
        return one_release_per_round(
            self.name,
            p.sigma,
            p.sigma,
            paper="the DPDL and PDSL papers describe this A(DP)²SGD baseline in one sentence "
            "and state no σ(ε) rule for it; A(DP)²SGD's own analysis is not applied here",
            paper_claims=False,  # one release per round at σ: our reading, not a claim
            reason="per-example clip C + N(0, σ²C²) on the sum, one broadcast release per round",
            clip=(p.clip, "example"),
        )

    def rounds_needed(self, kind: str, t: int, n: int) -> list[int]:
        return [t - 1, t] if t > 1 else [t]

    def observe(self, view: View, kind: str, t: int, src: int, dst: int) -> Observation:
        """(x^i_{t-1} − x̃^i_t)/η = ĝ^i_t: the clipped mean plus N(0, (σC/B)²), at x^i_{t-1};
        x^i_{t-1} as for ``dsgd`` (exact at t = 1 or when every neighbour's x̃ is seen)."""
        p = view.public.params
        return self.observe_half_step(
            view,
            t,
            src,
            dst,
            clip=p["clip"],
            noise_std=p["sigma"] * p["clip"] / view.public.batch_size,
        )

    def recursion(self, p: Any, W: Tensor, batch_size: int) -> Recursion:
        """D-PSGD's recursion (:func:`~privaudit.core.recursion.dpsgd`) with ĝ_t = g_t + ζ_t:
        x̃_t = W x̃_{t-1} − η g_t − η ζ_t, ζ ~ N(0, (σC/B)²) per agent, round and coordinate,
        i.e. Gaussian noise of std ησC/B on each half-step; g_t is the per-example clipped
        batch mean (``clip`` C). Only ζ_v^t stays in a recovered g_v^t (the half-steps it is
        solved from are observed, their noise included), so its std is σC/B, as
        :meth:`observe` reports."""
        return dpsgd(W, p.lr, noise_std=p.lr * p.sigma * p.clip / batch_size, clip=p.clip)
