"""Gradient tracking: DSGT, LPPA (Miao et al., "Lossless Privacy-Preserving Aggregation for
Decentralized Federated Learning") and LPPA's DP baseline (``seeds/lppa-paper.txt``,
``notes/lppa.md``).

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
are DSGT's; individual trajectories differ (the paper's "lossless" means this much only,
notes §1.4), and the offset decays as W^t d (Appendix C), so late γ's are nearly clean.

DP-DSGT, LPPA's "DP method" baseline (Huang et al. 2024 as used in the paper's experiments):
"adds β = 0.025 noise into the gradient tracking variable before transmission", i.e. before
each ``gt`` transmission γ_i ← γ_i + ζ_i, ζ_i ~ Laplace(0, β) i.i.d. per coordinate, one draw
per agent and round, sent to every neighbour and kept in the agent's state (it enters its
own mix and its θ step). ``inject="init"`` adds it to γ^0 only (Theorem 3's analysis).
Noise accumulates in Σ_i γ_i (a random walk), which matches the paper's divergence report.

Privacy accounting. None of the three is Gaussian DP: ``releases_per_round`` is 0, no σ is
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

from privaudit.errors import PrivauditError
from privaudit.network import SimNetwork
from privaudit.observation import Observation
from privaudit.threat import View

from .base import Context, Defense, State, register

OLD_GRAD = ("cached", "recompute")
INJECT = ("every", "init")


def laplace(ctx: Context, beta: float, *shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """i.i.d. Laplace(0, β) by the inverse CDF of u ~ U[−½, ½) from ``ctx.generator``."""
    u = torch.rand(*shape, generator=ctx.generator, device=ctx.device, dtype=dtype) - 0.5
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
class DSGTParams:
    lr: float = 0.05  # λ in (2), the paper's "decay step size" (constant)
    old_grad: str = "cached"  # ∇L(θ_i^t) in (3): "cached" or "recompute"

    def validate(self) -> None:
        if not self.lr > 0:
            raise PrivauditError(f"lr must be > 0, got {self.lr}")
        if self.old_grad not in OLD_GRAD:
            raise PrivauditError(f"old_grad must be one of {', '.join(OLD_GRAD)}")


def _check_beta(beta: float) -> None:
    if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta > 0):
        raise PrivauditError(f"beta (the Laplace scale β) must be a finite number > 0, got {beta}")


@dataclass
class LPPAParams(DSGTParams):
    beta: float = 0.025  # Laplace scale β of each share δ_li (paper: 0.025)
    reinject: bool = False  # a fresh noise exchange every round (paper: init only)

    def validate(self) -> None:
        super().validate()
        _check_beta(self.beta)


@dataclass
class DPDSGTParams(DSGTParams):
    beta: float = 0.025  # Laplace scale β added to γ_i (paper: 0.025)
    inject: str = "every"  # "every" transmission (experiments) or "init" (Theorem 3)

    def validate(self) -> None:
        super().validate()
        _check_beta(self.beta)
        if self.inject not in INJECT:
            raise PrivauditError(f"inject must be one of {', '.join(INJECT)}")


def _degree(W: Tensor, i: int) -> int:
    """Number of neighbours of ``i`` (off-diagonal non-zeros of row i of W)."""
    row = W[i].clone()
    row[i] = 0
    return int((row > 0).sum())


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

    # -- what a subclass adds to γ before it is sent (round t) --------------------------
    def inject(self, ctx: Context, p: Any, net: SimNetwork, t: int, like: Tensor) -> Tensor | None:
        """What is added to γ_i^{t-1} (shaped like ``like``) right before it is sent."""
        return None

    def round(
        self,
        ctx: Context,
        p: Any,
        state: State,
        net: SimNetwork,
        batch: tuple[Tensor, Tensor],
    ) -> State:
        x, mixed, g_prev = state["x"], state["gt"], state["g"]
        xs, ys = batch
        n, t = ctx.n, int(state["t"]) + 1  # this round's number
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
        if kind == "model":
            return [t, t + 1]
        return [t] if t == 1 else [t - 1, t]

    def injected_std(self, p: dict[str, Any], W: Tensor, src: int, t: int, known: bool) -> float:
        """Per-coordinate std of the noise injected into γ_src in round ``t`` (``known``:
        after removing what the link itself carries)."""
        return 0.0

    def observe(self, view: View, kind: str, t: int, src: int, dst: int) -> Observation:
        """Under ``link`` (src ↔ dst; W, λ, β and x_0 public):

        - ``gt``, t = 1: γ_src^0 = ∇L(x_0; ξ_1) (+ the injected noise), at the model θ^0 = x_0
          sent in the same round. Exact for dsgt (the raw gradient); for dp-dsgt exact up to
          Laplace(β) noise; for lppa offset by d_src = Σ sent − Σ received (exact False).
        - ``gt``, t > 1: the tracking difference γ_src^{t−1} − Σ_j w_sj γ_j^{t−2}
          = ∇L(θ^{t−1}; ξ_t) − ∇L(θ^{t−2}; ξ_{t−1}) (+ noise injected in round t), at θ^{t−1}.
          LPPA's init-time offset cancels exactly here. Approximate: the link sees only
          γ_src and γ_dst, so every unseen neighbour's γ is replaced by γ_dst, and the
          previous gradient stays in the target.
        - ``model``: (Σ_j w_sj θ_j^{t−1} − θ_src^t)/λ = γ_src^{t−1} (Eq. 2), mix approximated
          as above; exact at t = 1 where every θ^0 = x_0, so it then equals the t = 1 ``gt``.
        - ``noise`` (lppa): as ``gt``, minus the link's own shares of round t (it sees δ in
          both directions: + the one src sent, − the one src received); what remains are
          the 2k − 2 shares of src's other links (exact when src has one neighbour). In
          rounds without an exchange (t > 1, no ``reinject``) it equals ``gt``.

        ``noise_std`` is the std of the injected (Laplace, not Gaussian) noise of that round.
        """
        p, W = view.public["params"], view.public["W"]
        theta = view.get(t, src, dst, "model")
        w_self = float(W[src, src])

        def mix(s: int, k: str) -> Tensor:
            return w_self * view.get(s, src, dst, k) + (1 - w_self) * view.get(s, dst, src, k)

        meta: dict[str, Any] = {}
        if kind == "model":
            target = (mix(t, "model") - view.get(t + 1, src, dst, "model")) / p["lr"]
            std = self.injected_std(p, W, src, t, known=False)
            exact = t == 1 and self._clean_at_one(std, known=False)
            meta["approx"] = "γ_src^{t-1} recovered from the model step; mix approximated"
        else:
            target = view.get(t, src, dst, "gt")
            if t > 1:
                target = target - mix(t - 1, "gt")
                meta["approx"] = "tracking difference; unseen neighbours' γ replaced by dst's"
            known = kind == "noise" and view.has(t, src, dst, "noise")
            if known:
                target = target - (view.get(t, src, dst, "noise") - view.get(t, dst, src, "noise"))
                meta["removed"] = "the link's own noise shares"
            elif kind == "noise":
                meta["removed"] = f"nothing: no noise shares cross the link in round {t}"
            std = self.injected_std(p, W, src, t, known=known)
            exact = t == 1 and self._clean_at_one(std, known)
        return self.make_observation(
            view, theta, target, noise_std=std, meta={"exact": exact, **meta}
        )

    def _clean_at_one(self, std: float, known: bool) -> bool:
        """Whether a round-1 observation is exact up to (zero-mean) noise of std ``std``."""
        return True


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
        self, ctx: Context, p: LPPAParams, net: SimNetwork, t: int, like: Tensor
    ) -> Tensor | None:
        """Round 1 (every round with ``reinject``): send a share on every directed link,
        return d_i = Σ sent − Σ received."""
        if t > 1 and not p.reinject:
            return None
        noise = laplace(ctx, p.beta, len(net.src), like.shape[1], dtype=like.dtype)
        shares = net.send("noise", noise)
        sent = torch.zeros_like(like).index_add(0, net.src, shares)
        return sent - net.sum_incoming(shares)

    def rounds_needed(self, kind: str, t: int, n: int) -> list[int]:
        return super().rounds_needed("gt" if kind == "noise" else kind, t, n)

    def injected_std(self, p: dict[str, Any], W: Tensor, src: int, t: int, known: bool) -> float:
        if t > 1 and not p["reinject"]:
            return 0.0
        terms = 2 * _degree(W, src) - (2 if known else 0)
        return laplace_sum_std(p["beta"], terms)

    def _clean_at_one(self, std: float, known: bool) -> bool:
        return std == 0.0  # the offset is fixed, not fresh noise: exact only if all removed

    def observe(self, view: View, kind: str, t: int, src: int, dst: int) -> Observation:
        obs = super().observe(view, kind, t, src, dst)
        if t == 1 and obs.noise_std > 0:
            obs.meta["offset"] = "d_src = Σ sent − Σ received noise shares (fixed, fades as W^t d)"
        return obs


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
        self, ctx: Context, p: DPDSGTParams, net: SimNetwork, t: int, like: Tensor
    ) -> Tensor | None:
        if t > 1 and p.inject == "init":
            return None
        return laplace(ctx, p.beta, *like.shape, dtype=like.dtype)

    def injected_std(self, p: dict[str, Any], W: Tensor, src: int, t: int, known: bool) -> float:
        if t > 1 and p["inject"] == "init":
            return 0.0
        return laplace_sum_std(p["beta"], 1)
