"""DPDL (Yuan, Xiao, Wang, Li 2026) and its undefended "ND" baseline.

Equation numbers are the paper's. Per round t, agent i with its Poisson batch ξ^i_t of
expected size B (:mod:`privaudit.core.sampling`; Σ_b runs over its realised examples):

    (8)(9)   ĝ^{ji}_{t,b} = clip_C(∇F_i(x^j_{t-1}; ξ_b))   for j ∈ N_i ∪ {i}
    (10)     g̈^{ji}_t = (1/B)(Σ_b ĝ^{ji}_{t,b} + z^{ji}_t),  z ~ N(0, σ²C² I), fresh per (j,i)
    (14)     ĝ^{ii}_t = (1/B) Σ_b ĝ^{ii}_{t,b}              (un-noised, same batch)
    (15)(16) C^{ij}_t = 1/(1 + exp(S(g̈^{ij}_t, ĝ^{ii}_t))),  S = cosine similarity
    (17)     g̃^{ij}_t = g̈^{ij}_t/(√w_ij · N) + α w_ij C^{ij}_t ĝ^{ii}_t
    (18)     g̃^i_t = Σ_{j ∈ N_i ∪ {i}} g̃^{ij}_t
    (19)(20) ṽ^i_t = β v^i_{t-1} + g̃^i_t,   x̃^i_t = x^i_{t-1} − η ṽ^i_t
    (21)(22) v^i_t = Σ_j w_ij ṽ^j_t,         x^i_t = Σ_j w_ij x̃^j_t

Orientation (Definition 2, Sec. III-B, and (8), as in CGA): g^{ji} is i's data at j's
model, computed by i and sent to j; the ``cg`` message on link i→j is g̈^{ji}. Messages on
i→j per round: ``model`` x^i_{t-1}, ``cg`` g̈^{ji}_t, ``mm`` ṽ^i_t, ``half-model`` x̃^i_t.
Only ``cg`` is noised; ṽ and x̃ carry the clipped but un-noised ĝ^{ii} of (14) through (17)–(19),
and the paper's proof (Appendix A, (40)) counts the noise of the received cross-gradients,
drawn by the neighbours, as protecting it — an audit target.

Choices left open, as parameters (the defaults are not the paper's experimental values):
``momentum`` β = 0.5, ``calib_alpha`` α = 0.5, ``clip`` C = 1.0, ``cross_coef`` the
weight of a received cross-gradient ("sqrt": 1/(√w_ij N) as in (17); "w": w_ij;
"degree": 1/|N_i ∪ {i}|), the self-gradient ĝ^{ii} uses the same batch as g̈^{ii} (the
paper calls (14) "an independent calculation" without saying whether it draws a new
batch), v_0 = 0 and all agents start from the shared x_0.
ND is the same algorithm with no clipping and no noise (``clip=None, sigma=0``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from privaudit.core.context import Context, State
from privaudit.core.errors import PrivauditError
from privaudit.core.network import Network
from privaudit.core.observation import Observation
from privaudit.core.privacy import Privacy, no_noise
from privaudit.core.threat import View
from privaudit.defenses.base import (
    MODEL_KIND,
    CrossGradientDefense,
    Params,
    check_choice,
    check_fraction,
    check_non_negative,
    check_positive,
    degree,
    neighbours,
    register,
)

CROSS_COEFS = ("sqrt", "w", "degree")


@dataclass
class DPDLParams(Params):
    momentum: float = 0.5  # β in (19)
    calib_alpha: float = 0.5  # α in (17)
    clip: float | None = 1.0  # C in (9); None = no clipping (ND)
    sigma: float = 0.0  # σ in (10); set from --epsilon by the accountant
    cross_coef: str = "sqrt"  # weight of a received cross-gradient in (17)

    def validate(self) -> None:
        super().validate()
        check_fraction("momentum", self.momentum)
        check_non_negative("calib_alpha", self.calib_alpha)
        if self.clip is not None:
            check_positive("clip", self.clip)
        check_non_negative("sigma", self.sigma)
        if self.sigma > 0 and self.clip is None:
            raise PrivauditError("sigma > 0 needs a clip norm (set clip)")
        check_choice("cross_coef", self.cross_coef, CROSS_COEFS)


def calibration(received: Tensor, self_clean: Tensor) -> Tensor:
    """(15)(16): C = 1/(1 + exp(S(g̈, ĝ^{ii}))) = sigmoid(−cos), in [1/(1+e), e/(1+e)]."""
    return torch.sigmoid(-F.cosine_similarity(received, self_clean, dim=-1))


def calibration_rows(received: Tensor, self_clean: Tensor, rows: list[int]) -> Tensor:
    """``calibration(received, self_clean[rows])`` row by row: the same per-row values
    without its (rows, D) copies and temporaries (ResNet-18: 45 MB a row)."""
    if not rows:
        return received.new_zeros(0)
    pairs = enumerate(rows)
    return torch.cat([calibration(received[e : e + 1], self_clean[r : r + 1]) for e, r in pairs])


def _coef(kind: str, w: Tensor, n: int, deg: Tensor) -> Tensor:
    if kind == "sqrt":
        return 1.0 / (torch.sqrt(w) * n)
    if kind == "w":
        return w
    return 1.0 / deg


@register
class DPDL(CrossGradientDefense):
    name = "dpdl"
    kinds = {
        "model": MODEL_KIND,
        "cg": "g̈^{ji}: i's batch at j's model, per-example clip C + N(0,σ²C²) on the sum, /B",
        "mm": "ṽ_i = β v_i + g̃_i: the momentum, in the clear (holds the un-noised self-gradient)",
        "half-model": "x̃_i = x_i − η ṽ_i: the half-step model, in the clear",
    }
    Params = DPDLParams
    clip_unit = "example"

    def round(
        self,
        ctx: Context,
        p: DPDLParams,
        state: State,
        net: Network,
        batch: tuple[Tensor, Tensor],
    ) -> State:
        x, v = state["x"], state["v"]
        n = ctx.n
        w_in, w_self = net.w_in.to(x.dtype), net.w_self.to(x.dtype)
        deg = net.in_degree.to(x.dtype) + 1
        coef_in = _coef(p.cross_coef, w_in, n, net.at_receiver(deg))
        coef_self = _coef(p.cross_coef, w_self, n, deg)
        # x̃, ṽ into x, v when the state is Consumed: a chunk reads only its receivers' rows
        v_half, x_half = self.next_rows(state, x, v)
        # (8)–(10), (14): per-example clipped means ĝ for the self pairs and the in-edge
        # pairs of a chunk of receivers, g̈ = ĝ + z/B with fresh z per pair; link i→j carries
        # g̈^{ji}. Then each receiver's (15)–(18), in-edge by in-edge (no (in-edges, D) copy
        # of the receivers' rows nor of the weighted messages; the same per-row values,
        # summed in link order as index_add), and its half-step (19)(20)
        for chunk in self.cross_gradient_chunks(ctx, p, net, x, batch):
            rows, edges = chunk.rows, chunk.in_edges.tolist()
            local = chunk.receivers.tolist()  # each in-edge's receiver in the chunk
            own = range(chunk.self_clean.shape[0])
            c_in = calibration_rows(chunk.cg, chunk.self_clean, local)
            c_self = calibration_rows(chunk.self_noisy, chunk.self_clean, list(own))
            incoming = torch.zeros_like(chunk.self_noisy)
            for row, (e, d) in enumerate(zip(edges, local, strict=True)):
                incoming[d].add_(chunk.cg[row] * coef_in[e])
            g_tilde = chunk.self_noisy.mul_(coef_self[rows, None]).add_(incoming)
            del incoming
            weighted = w_in[chunk.in_edges] * c_in
            received = torch.zeros_like(c_self).index_add(0, chunk.receivers, weighted)
            calib = w_self[rows] * c_self + received
            g_tilde.add_(chunk.self_clean.mul_(p.calib_alpha * calib[:, None]))
            self.half_step_rows(p, x, v, g_tilde, rows, v_half, x_half)
            del chunk, g_tilde
        return self.mix_half(net, x_half, v_half)  # (21)(22)

    def privacy(self, p: DPDLParams, kind: str, W: Tensor, agent: int | None = None) -> Privacy:
        """``cg``: a Gaussian mechanism per neighbour and round (per-example clip C, std σC
        on the clipped sum, add/remove sensitivity C: multiplier σ) *given its evaluation
        point*, the receiver's model x_j — which from round 2 on has mixed in agent i's
        model and momentum, and through them i's clipped but un-noised ĝ^{ii}: one changed
        example moves x_j and with it every later cross-gradient, so the releases do not
        compose into a run guarantee (:attr:`Privacy.per_release`; ε = ∞ over the run, the
        one-release ε where x_j is fixed). Every other kind carries the un-noised ĝ^{ii}
        itself: no finite ε. σ is calibrated by the paper's count (one release per
        neighbour and round)."""
        if p.sigma <= 0 or p.clip is None:
            return no_noise(self.name, "σ = 0 or no clip")
        common: dict[str, Any] = dict(
            mechanism="gaussian",
            noise_multiplier=p.sigma,
            releases=degree(W, agent),
            clip=p.clip,
            clip_unit="example",
            claimed_multiplier=p.sigma,
            claimed_releases=degree(W, agent),
            paper="Theorem 1 (moments accountant, σ ≥ c₂·…/ε, one release per neighbour and "
            "round): its constants are not given, so no numeric claim beyond that count",
        )
        if kind == "cg":
            return Privacy(
                **common,
                formal=False,
                per_release=True,
                reason="each cross-gradient (per-example clip C + N(0, σ²C²) on the sum) is "
                "evaluated at the receiver's model x_j, which from round 2 on carries agent i's "
                "un-noised self-gradient ĝ^{ii} (through its model and momentum, eqs. 17–21): "
                "one example moves every later release's evaluation point, so the releases do "
                "not compose (one release at a fixed x_j is a Gaussian mechanism)",
                caveats=(
                    "mm, half-model and model carry the un-noised self-gradient ĝ^{ii}: the "
                    "run as a whole has no finite ε",
                ),
            )
        return Privacy(
            **common,
            formal=False,
            reason="an extra release per round that the paper does not count: the clipped, "
            "un-noised self-gradient ĝ^{ii} enters g̃^i with weight coef_ii + α Σ_j w_ij C^{ij} "
            "against only the self pair's noise coef_ii·σC/B (eqs. 14, 17–20; a global "
            "observer subtracts every other term), and the calibration weight C^{ij} is a "
            "function of the data whose effect does not shrink with B — no finite ε is claimed",
        )

    @staticmethod
    def _noise_unit(p: dict[str, Any], batch_size: int) -> float:
        """The std σC/B of one pair's z/B (0 without a clip)."""
        return p["sigma"] * p["clip"] / batch_size if p["clip"] is not None else 0.0

    def observe_cross_gradient(self, view: View, t: int, src: int, dst: int) -> Observation:
        """``cg`` is exactly the noised, per-example clipped batch-mean gradient of i's batch
        at the receiver's model. A coalition or global observer holding k copies (one per
        neighbour, same batch, fresh noise) averages them (:meth:`Defense.observe_cg`)."""
        p = view.public.params
        unit = self._noise_unit(p, view.public.batch_size)
        return self.observe_cg(
            view, t, src, dst, clip=p["clip"], noise_std=unit, meta={"exact": True}
        )

    def observe_update(self, view: View, kind: str, t: int, src: int, dst: int) -> Observation:
        """What each message is a function of (src = i, the victim):

        - ``mm``: g̃^i_t = ṽ^i_t − β v^i_{t-1}, v^i_{t-1} = Σ_j w_ij ṽ^j_{t-1} (21): exact when
          every neighbour's ṽ^j_{t-1} is seen, else the consecutive-round approximation for the
          unseen ones. Then every received cross-gradient the View holds (``cg`` j→i) is
          subtracted with its public coefficient (17); once all are (global), the remainder is
          (coef_ii + α Σ_j w_ij C^{ij}) ĝ^{ii} + coef_ii z^{ii}/B — the clipped self-gradient
          with only the self-pair's noise, scaled down by coef_ii ≈ 1/(√w_ii N) (17).
          The scale uses E[C] ≈ ½ (C ∈ [0.27, 0.73]); the cosine loss ignores it.
        - ``half-model``: ṽ^i_t = (x^i_{t-1} − x̃^i_t)/η exactly, then as ``mm``.
        """
        p = view.public.params
        clip, unit = p["clip"], self._noise_unit(p, view.public.batch_size)
        target, unseen = self.momentum_step(view, kind, t, src, dst, p["momentum"])
        W = view.public.W
        n, nbrs = W.shape[0], neighbours(W, src)
        deg = len(nbrs) + 1
        coef = {j: _coef(p["cross_coef"], W[src, j], n, deg) for j in [src, *nbrs]}
        removed = [j for j in nbrs if view.has(t, j, src, "cg")]
        for j in removed:
            target = target - float(coef[j]) * view.get(t, j, src, "cg")
        left = [j for j in nbrs if j not in removed]
        std = unit * math.sqrt(sum(float(coef[j]) ** 2 for j in [src, *left]))
        meta = {
            "exact": not unseen and not left,
            "scale_estimated": True,
            "removed_cg_from": removed,
        }
        if unseen:
            meta["approx"] = f"v_(t-1) mixes unseen momenta of agents {unseen}"
        if left:
            meta["mixed_with"] = f"cross-gradients of agents {left} (other data)"
        return self.make_observation(
            view,
            view.get(t, src, dst, "model"),
            target,
            scale=float(coef[src]) + p["calib_alpha"] * 0.5,
            clip=clip,
            noise_std=std,
            meta=meta,
        )


@register
class ND(DPDL):
    """The papers' undefended "ND" baseline: DPDL with no clipping and no noise."""

    name = "nd"
    kinds = {
        "model": MODEL_KIND,
        "cg": "g^{ji}: i's batch-mean gradient at j's model, no clipping, no noise",
        "mm": "ṽ_i = β v_i + g̃_i: the momentum, in the clear",
        "half-model": "x̃_i = x_i − η ṽ_i: the half-step model, in the clear",
    }

    @dataclass
    class Params(DPDLParams):
        clip: float | None = None
        sigma: float = 0.0

        def validate(self) -> None:
            super().validate()
            if self.sigma != 0 or self.clip is not None:
                raise PrivauditError("nd has no clipping and no noise; use --defense dpdl")
