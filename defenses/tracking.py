"""Gradient tracking: DSGT, LPPA (Miao et al., "Lossless Privacy-Preserving Aggregation for
Decentralized Federated Learning") and LPPA's DP baseline, as that paper defines it.

DSGT, Eqs. (2)–(3) of the paper (Koloskova et al. 2021; Pu & Nedić 2018 in experiments):

    (2)  θ_i^{t+1} = Σ_j w_ij θ_j^t − λ γ_i^t          (own, unmixed γ_i is subtracted)
    (3)  γ_i^{t+1} = Σ_j w_ij γ_j^t + ∇L(θ_i^{t+1}) − ∇L(θ_i^t),    γ_i^0 = ∇L(θ_i^0)

Simulator round t (1-based) is the paper's iteration t−1 plus the gradient that feeds it:
agent i draws batch ξ_t, computes g_t = ∇L(θ_i^{t−1}; ξ_t), forms
γ_i^{t−1} = Σ_j w_ij γ_j^{t−2} + g_t − g_{t−1} (round 1: γ_i^0 = g_1), sends ``model``
θ_i^{t−1} and ``gt`` γ_i^{t−1} to every neighbour, then steps (2) and mixes γ. So round t's
messages carry round t's batch, at the model sent in the same round. State: ``x`` θ^{t},
``gt`` the mixed Σ_j w_ij γ_j^{t−1}, ``g`` the last gradient g_t, ``t`` rounds done (and
``x_prev`` θ^{t−1} with ``old_grad="recompute"``). Invariant (W doubly stochastic):
mean_i γ_i^{t−1} = mean_i g_t, hence mean θ^t = mean θ^{t−1} − λ mean_i g_t.

LPPA (Algorithm 1): one extra noise exchange before the first DSGT step. Each directed
link i→l carries a share δ_li ~ Laplace(0, β) i.i.d. per coordinate (message ``noise``), and
    d_i = Σ_{l∈out(i)} δ_li − Σ_{j∈in(i)} δ_ij        ("sent − received", the equation's
    γ_i^0 = ∇L(θ_i^0) + d_i                            sign; the prose says the reverse)
after which LPPA *is* DSGT. Here the exchange happens in round 1, before round 1's ``gt``
message, and is tagged round 1 with kind ``noise`` so that it is captured like any message
(``reinject=True``: a fresh exchange every round, allowed by the paper, not its default).
Σ_i d_i = 0 exactly (Theorem 1), so the tracking invariant and the average-model update
are DSGT's; individual trajectories differ (the paper's "lossless", Theorem 1 and its proof
in Appendix B, shows only that the sums are preserved), and the offset decays as W^t d
(Appendix C), so late γ's are nearly clean.

DP-DSGT, LPPA's "DP method" baseline (Huang et al. 2024 as used in the paper's experiments):
"adds β = 0.025 noise into the gradient tracking variable before transmission", i.e. before
each ``gt`` transmission γ_i ← γ_i + ζ_i, ζ_i ~ Laplace(0, β) i.i.d. per coordinate, one draw
per agent and round, sent to every neighbour and kept in the agent's state (it enters its
own mix and its θ step). ``inject="init"`` adds it to γ^0 only (Theorem 3's analysis).
Noise accumulates in Σ_i γ_i (a random walk), which matches the paper's divergence report.

Privacy accounting. None of the three is Gaussian DP: ``privacy()`` is never formal, no σ is
resolved from ``--epsilon`` and the run reports ε = ∞, meaning "not formally bounded"
(for dp-dsgt: noised, but with no DP guarantee). The paper's own rule is
ε = Δf/β (Laplace mechanism), with Theorems 2/3 giving Δf/(√2 W^t β) for LPPA and
Δf/(W^t β) for DP; gradients are never clipped, so Δf is unbounded and the rule is a
heuristic gauge, not a guarantee: β is set directly and :func:`paper_budget` evaluates the
rule as written for a user-supplied Δf. The √2 is unsound as written (d_i sums 2k Laplace
terms, std 2√k β against √2 β for DP; and a neighbour knows 2 of them); implemented as is.

Choices the paper leaves open (Params): ``lr`` λ = 0.05 (paper: constant "decay step size"
0.05); ``old_grad`` the ∇L(θ_i^t) of (3): "cached" (the gradient computed last round, on
last round's batch; standard stochastic GT, keeps the invariant) or "recompute" (Algorithm
1 line 12: ∇L(θ_i^{t−2}; ξ_t), the previous model on the current batch); ``beta`` β = 0.025
(paper); LPPA ``reinject``; DP ``inject``. All agents start at the public shared x_0, one
local step per round (the paper's local epoch 1), W is the run's mixing matrix (the paper
uses Sinkhorn–Knopp on a complete graph).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from privaudit.core.context import Context, State
from privaudit.core.errors import PrivauditError
from privaudit.core.network import Network
from privaudit.core.observation import Observation
from privaudit.core.privacy import Privacy
from privaudit.core.recursion import Recursion, tracking
from privaudit.core.threat import View
from privaudit.defenses.base import (
    Defense,
    Params,
    check_choice,
    check_positive,
    mix,
    neighbours,
    register,
)

OLD_GRAD = ("cached", "recompute")
INJECT = ("every", "init")


def laplace(
    ctx: Context, beta: float, owner: Tensor | None, dim: int, dtype: torch.dtype = torch.float32
) -> Tensor:
    """i.i.d. Laplace(0, β) rows of length ``dim`` by the inverse CDF of u ~ U[−½, ½), row r
    from the generator of held agent ``owner[r]`` (None: row r is agent r's)."""

    def uniform(g: torch.Generator, c: int) -> Tensor:
        return torch.rand(c, dim, generator=g, device=ctx.device, dtype=dtype)

    u = ctx.draw(owner, uniform) - 0.5
    tail = (1 - 2 * u.abs()).clamp_min(torch.finfo(dtype).tiny)
    return -beta * torch.sign(u) * torch.log(tail)


def laplace_sum_std(beta: float, terms: int) -> float:
    """Std of a sum of ``terms`` independent Laplace(β) variables (each has variance 2β²)."""
    return beta * math.sqrt(2 * terms)


def paper_budget(
    sensitivity: Tensor | float, beta: Tensor | float, W: Tensor, t: int, lppa: bool
) -> Tensor:
    """The paper's per-client "privacy budget" at round t, as written (ε = Δf/β):
    Theorem 2 (LPPA) Δf / (√2 W^t β), Theorem 3 (DP) Δf / (W^t β), element-wise.

    A heuristic gauge, not a DP guarantee: Δf is never bounded (no clipping), there is no
    composition over rounds, and the √2 ignores the degree (see the module docstring)."""
    n = W.shape[0]
    b = torch.as_tensor(beta, dtype=torch.float64).expand(n)
    f = torch.as_tensor(sensitivity, dtype=torch.float64).expand(n)
    if not bool((b > 0).all()):
        raise PrivauditError("beta must be > 0")
    scale = torch.linalg.matrix_power(W.to(torch.float64), t) @ b
    return f / ((math.sqrt(2) if lppa else 1.0) * scale)


@dataclass
class DSGTParams(Params):
    """``lr`` is λ in (2), the paper's "decay step size" (constant)."""

    old_grad: str = "cached"  # ∇L(θ_i^t) in (3): "cached" or "recompute"

    def validate(self) -> None:
        super().validate()
        check_choice("old_grad", self.old_grad, OLD_GRAD)


@dataclass
class LPPAParams(DSGTParams):
    beta: float = 0.025  # Laplace scale β of each share δ_li (paper: 0.025)
    reinject: bool = False  # a fresh noise exchange every round (paper: init only)

    def validate(self) -> None:
        super().validate()
        check_positive("beta", self.beta)


@dataclass
class DPDSGTParams(DSGTParams):
    beta: float = 0.025  # Laplace scale β added to γ_i (paper: 0.025)
    inject: str = "every"  # "every" transmission (experiments) or "init" (Theorem 3)

    def validate(self) -> None:
        super().validate()
        check_positive("beta", self.beta)
        check_choice("inject", self.inject, INJECT)


@register
class DSGT(Defense):
    """Plain gradient tracking (Eqs. 2–3), no noise: γ^0 is the raw local gradient."""

    name = "dsgt"
    kinds = {
        "model": "θ_i^{t-1}, the model, in the clear",
        "gt": "γ_i^{t-1}, the gradient tracking variable (γ^0 = the raw gradient), in the clear",
    }
    Params = DSGTParams

    def init(self, ctx: Context, p: DSGTParams) -> State:
        x = super().init(ctx, p)["x"]
        zeros = torch.zeros_like(x)
        state = {"x": x, "gt": zeros, "g": zeros.clone(), "t": torch.tensor(0, device=x.device)}
        if p.old_grad == "recompute":
            state["x_prev"] = x.clone()
        return state

    def recursion(self, p: Any, W: Tensor, batch_size: int) -> Recursion | None:
        """Gradient tracking's linear structure with the cached old gradient
        (:func:`~privaudit.core.recursion.tracking`): θ and γ are gossiped linearly in every
        agent's gradients, so a coalition recovers agents beyond its neighbours. None for
        ``old_grad="recompute"`` and for the subclasses, whose added noise (LPPA's shares,
        DP-DSGT's Laplace) the recursion does not model."""
        if type(self) is not DSGT or p.old_grad != "cached":
            return None
        return tracking(W, p.lr)

    # -- what a subclass adds to γ before it is sent (round t) --------------------------
    def inject(self, ctx: Context, p: Any, net: Network, t: int, like: Tensor) -> Tensor | None:
        """What is added to γ_i^{t-1} (shaped like ``like``) right before it is sent."""
        return None

    def round(
        self,
        ctx: Context,
        p: Any,
        state: State,
        net: Network,
        batch: tuple[Tensor, Tensor],
    ) -> State:
        x, mixed, g_prev = state["x"], state["gt"], state["g"]
        xs, ys = batch
        n, t = x.shape[0], int(state["t"]) + 1  # held agents; this round's number
        if p.old_grad == "recompute" and t > 1:
            # Algorithm 1 line 12: both gradients of (3) on this round's batch
            pts = torch.cat([x, state["x_prev"]])
            both = ctx.grads.mean(pts, torch.cat([xs, xs]), torch.cat([ys, ys]))
            g, g_old = both[:n], both[n:]
        else:
            g = ctx.grads.mean(x, xs, ys)
            g_old = g_prev if t > 1 else torch.zeros_like(g)
        gamma = mixed + g - g_old  # (3); round 1: γ^0 = ∇L(θ^0)
        extra = self.inject(ctx, p, net, t, gamma)
        if extra is not None:
            gamma = gamma + extra
        x_new = net.gossip("model", x) - p.lr * gamma  # (2)
        out = {"x": x_new, "gt": net.gossip("gt", gamma), "g": g, "t": state["t"] + 1}
        if p.old_grad == "recompute":
            out["x_prev"] = x
        return out

    # -- attack surface -----------------------------------------------------------------
    def rounds_needed(self, kind: str, t: int, n: int) -> list[int]:
        rounds = [t - 1, t] if t > 1 else [t]
        return rounds + [t + 1] if kind == "model" else rounds

    def injection(self, view: View, t: int, src: int) -> tuple[Tensor | None, float, int]:
        """What was added to γ_src right before round ``t``'s transmission: the part the View
        knows (subtracted), the per-coordinate std of the rest, and how many Laplace terms
        that rest holds."""
        return None, 0.0, 0

    def observe(self, view: View, kind: str, t: int, src: int, dst: int) -> Observation:
        """W, λ, β and x_0 public; src = i, the victim.

        - ``gt``, t = 1: γ_i^0 = ∇L(x_0; ξ_1) + injection, at θ^0 = x_0 (sent the same round).
          Exact for dsgt; dp-dsgt adds fresh Laplace(β); lppa adds the fixed offset
          d_i = Σ sent − Σ received shares, of which every share the View holds (the link's
          two, a neighbour's two, all for a coalition holding i's neighbours or global) is
          subtracted — exact once all are known.
        - ``gt``, t > 1: the tracking difference (3)
          γ_i^{t−1} − Σ_j w_ij γ_j^{t−2} = ∇L(θ_i^{t−1}; ξ_t) − ∇L(θ_i^{t−2}; ξ_{t−1}),
          a two-batch Observation (``terms``: the second gradient at θ_i^{t−2}, coefficient
          −1, its own unknown batch; the same batch ξ_t with ``old_grad="recompute"``).
          LPPA's offset cancels exactly; exact when every neighbour's γ_j^{t−2} is seen (a
          neighbour on a complete graph, global), unseen ones replaced by γ_i^{t−2}.
        - ``model``: γ_i^{t−1} = (Σ_j w_ij θ_j^{t−1} − θ_i^t)/λ (2) (unseen θ_j replaced by θ_i),
          then as ``gt``; at t = 1 it is the t = 1 ``gt``.
        - ``noise`` (lppa): the shares reveal the offset; observed as ``gt``.
        - lppa, t = 1, offset not fully known: when the View holds every γ_j^0 and γ_i^1, the
          round-2 difference with the roles swapped (:meth:`_through_next_round`) — exact.

        ``noise_std`` is the std of the injected (Laplace, not Gaussian) noise left in it.
        """
        p = view.public.params
        theta = view.get(t, src, dst, "model")
        meta: dict[str, Any] = {}
        unseen: list[int] = []
        if kind == "model":
            nxt = view.get(t + 1, src, dst, "model")
            mixed, unseen = mix(view, src, lambda j: view.sent(t, j, "model"), theta)
            gamma = (mixed - nxt) / p["lr"]
        else:
            gamma = view.get(t, src, dst, "gt")
        known, std, left = self.injection(view, t, src)
        if known is not None:
            gamma = gamma - known
            meta["removed"] = "the noise shares the View holds"
        terms: list[tuple[Tensor, float, bool]] = []
        prev_own = view.sent(t - 1, src, "gt") if t > 1 else None
        if t > 1 and prev_own is not None:
            prev, missing = mix(view, src, lambda j: view.sent(t - 1, j, "gt"), prev_own)
            unseen += missing
            gamma = gamma - prev
            terms = [(view.get(t - 1, src, dst, "model"), -1.0, p["old_grad"] == "recompute")]
            meta["difference"] = "∇L(θ^{t-1}; ξ_t) − ∇L(θ^{t-2}; ξ_{t-1})"
            meta["term_rounds"] = [t if p["old_grad"] == "recompute" else t - 1]
        elif t > 1:
            meta["approx"] = "γ^{t-1} taken as one gradient (no γ^{t-2} seen)"
        if unseen:
            meta["approx"] = f"mixes unseen values of agents {sorted(set(unseen))}"
        offset = self.fixed_offset(t) and left > 0
        if offset:
            nxt = self._through_next_round(view, kind, t, src, dst)
            if nxt is not None:
                return nxt
            meta["offset"] = f"{left} unseen noise shares: a fixed offset, fading as W^t d"
        meta["exact"] = not unseen and not offset and not meta.get("approx")
        return self.make_observation(view, theta, gamma, noise_std=std, meta=meta, terms=terms)

    def _through_next_round(
        self, view: View, kind: str, t: int, src: int, dst: int
    ) -> Observation | None:
        """A fixed offset hides γ_i^{t−1} alone, not the next tracking difference: with every
        γ_j^{t−1} and γ_i^t seen (and no fresh injection in round t+1),
        Σ_j w_ij γ_j^{t−1} − γ_i^t = ∇L(θ_i^{t−1}; ξ_t) − ∇L(θ_i^t; ξ_{t+1}) (3) — the offset
        cancels, and batch ξ_t is slot 0 of an exact two-batch Observation. Needs the
        "cached" old gradient (with "recompute" round t+1 never touches ξ_t)."""
        p = view.public.params
        if kind == "model" or p["old_grad"] != "cached" or not view.has(t + 1, src, dst, "gt"):
            return None
        if self.injection(view, t + 1, src)[2]:
            return None
        own = view.get(t, src, dst, "gt")
        mixed, unseen = mix(view, src, lambda j: view.sent(t, j, "gt"), own)
        if unseen:
            return None
        meta = {
            "exact": True,
            "difference": "∇L(θ^{t-1}; ξ_t) − ∇L(θ^t; ξ_{t+1}), via round t+1 (offset cancels)",
            "term_rounds": [t + 1],
        }
        return self.make_observation(
            view,
            view.get(t, src, dst, "model"),
            mixed - view.get(t + 1, src, dst, "gt"),
            meta=meta,
            terms=[(view.get(t + 1, src, dst, "model"), -1.0, False)],
        )

    def fixed_offset(self, t: int) -> bool:
        """Whether round ``t``'s injection is a fixed offset rather than fresh noise."""
        return False


@register
class LPPA(DSGT):
    """DSGT with one Laplace noise-share exchange whose differences cancel over the graph."""

    name = "lppa"
    kinds = {
        "model": "θ_i^{t-1}, the model, in the clear",
        "gt": "γ_i^{t-1}; γ^0 = ∇L(θ^0) + Σ sent − Σ received noise shares, in the clear",
        "noise": "δ_li ~ Laplace(β): the share i sends to l, round 1 only (every round with "
        "reinject), in the clear",
    }
    Params = LPPAParams

    def inject(
        self, ctx: Context, p: LPPAParams, net: Network, t: int, like: Tensor
    ) -> Tensor | None:
        """Round 1 (every round with ``reinject``): send a share on every directed link,
        return d_i = Σ sent − Σ received."""
        if t > 1 and not p.reinject:
            return None
        out_src = net.links.out_src  # one share per out-edge, drawn by its sender
        noise = laplace(ctx, p.beta, out_src, like.shape[1], dtype=like.dtype)
        shares = net.send("noise", noise)
        return net.sum_outgoing(noise) - net.sum_incoming(shares)

    def privacy(self, p: LPPAParams, kind: str, W: Tensor, agent: int | None = None) -> Privacy:
        """No formal DP: shares cancel, gradients are unclipped, rounds never compose."""
        return Privacy(
            mechanism="laplace",
            formal=False,
            reason="the Laplace shares cancel over the graph (Σ_i d_i = 0) and fade as W^t d; "
            "gradients are never clipped (Δf unbounded); no composition over rounds",
            paper="Theorem 2: ε = Δf/(√2 (W^t β)_i) per round (a gauge, not a DP guarantee), "
            "evaluated at Δf = the canary's change of γ",
            paper_epsilon=lambda delta, impact: impact / (math.sqrt(2) * p.beta),
        )

    def rounds_needed(self, kind: str, t: int, n: int) -> list[int]:
        """As DSGT; round 1's γ^0 also takes round 2 (the difference that cancels the offset)."""
        kind = "gt" if kind == "noise" else kind
        return super().rounds_needed(kind, t, n) + ([2] if t == 1 and kind == "gt" else [])

    def injection(self, view: View, t: int, src: int) -> tuple[Tensor | None, float, int]:
        """d_i of round t's exchange (round 1; every round with ``reinject``): the shares the
        View holds are known (+ sent, − received); the other ones are Laplace(β) each."""
        p, W = view.public.params, view.public.W
        if t > 1 and not p["reinject"]:
            return None, 0.0, 0
        known, left = None, 0
        for j in neighbours(W, src):
            for a, b, sign in ((src, j, 1.0), (j, src, -1.0)):
                if view.has(t, a, b, "noise"):
                    share = sign * view.get(t, a, b, "noise")
                    known = share if known is None else known + share
                else:
                    left += 1
        return known, laplace_sum_std(p["beta"], left), left

    def fixed_offset(self, t: int) -> bool:
        return True


@register
class DPDSGT(DSGT):
    """LPPA's DP baseline: Laplace(β) added to γ_i before each transmission."""

    name = "dp-dsgt"
    kinds = {
        "model": "θ_i^{t-1}, the model (carries the noised γ through Eq. 2), in the clear",
        "gt": "γ_i^{t-1} + Laplace(β) per coordinate, added before transmission",
    }
    Params = DPDSGTParams

    def inject(
        self, ctx: Context, p: DPDSGTParams, net: Network, t: int, like: Tensor
    ) -> Tensor | None:
        if t > 1 and p.inject == "init":
            return None
        return laplace(ctx, p.beta, None, like.shape[1], dtype=like.dtype)

    def privacy(self, p: DPDSGTParams, kind: str, W: Tensor, agent: int | None = None) -> Privacy:
        """No formal DP: Laplace(β) on an unclipped gradient, no composition."""
        return Privacy(
            mechanism="laplace",
            formal=False,
            reason="gradients are never clipped (Δf unbounded), so Laplace(β) bounds nothing; "
            "no composition over rounds",
            paper="Theorem 3: ε = Δf/((W^t β)_i) per round, evaluated at Δf = the canary's "
            "change of γ",
            paper_epsilon=lambda delta, impact: impact / p.beta,
        )

    def injection(self, view: View, t: int, src: int) -> tuple[Tensor | None, float, int]:
        """Fresh Laplace(β) on γ_i before each transmission (round 1 only with "init")."""
        p = view.public.params
        if t > 1 and p["inject"] == "init":
            return None, 0.0, 0
        return None, laplace_sum_std(p["beta"], 1), 1
