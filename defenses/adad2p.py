"""AdaD²P and its fixed-noise counterparts ConstD²P and ClipD²P (an anonymous
submission; its Algorithm 1 and Propositions 1–2).

Stochastic Gradient Push (Assran et al. 2019) with Gaussian noise on the local gradient.
Agent i holds the push-sum numerator x_i, the scalar weight w_i (x_i⁰ = x_0, w_i⁰ = 1) and
the de-biased point z_i = x_i / w_i. Round t (the paper's iteration k = t − 1), Algorithm 1:

    g_i = ∇f_i(z_i^k; ξ_i^k)                              (line 4: at z, not at x)
    (3)  N_i^k ~ N(0, σ² S_i² I):  S_i = ‖g_i‖ (adad2p), G (constd2p), C with g clipped to C
         (clipd2p; the paper gives Algorithms 2, 3 only in its appendix, not in the main
         text: this is our reading of Remark 1, "fixed l_2 sensitivity" from G and from C)
    (4)  x_i^{k+½} = x_i^k − γ (g_i + N_i^k)
    send (x_i^{k+½}, w_i^k) to the out-neighbour (line 7)
    x_i^{k+1} = Σ_j P^k_ij x_j^{k+½},  w_i^{k+1} = Σ_j P^k_ij w_j^k     (lines 9, 10)
    z_i^{k+1} = x_i^{k+1} / w_i^{k+1}                                   (line 11)

Messages on link i→j in the rounds it is active: ``half-model`` x_i^{k+½} (noised) and
``weight`` w_i^k (in the clear).

Graph (the paper's Appendix C is missing; SGP's definition). A time-varying directed
exponential graph: the hops are every 2^j < N (L = ⌈log₂ N⌉ of them, SGP's
2^0 … 2^⌊log₂(N−1)⌋; for N = 20 that is 1, 2, 4, 8, 16), and in round t every agent i sends to
the one peer (i + 2^((t−1) mod L)) mod N and keeps the share ``keep`` of its own pair
(SGP's UniformMixing with one peer: ½). P^k = keep·I + (1 − keep)·Π_hop is column stochastic
(A1) and — the hop being shared — also row stochastic, so w ≡ 1 and z = x on this graph:
the weight message leaks nothing. The defense ignores the run's mixing matrix W;
it runs only where ``--topology exponential`` builds the undirected union of these links (a
graph equal to it, e.g. ``complete`` for N ≤ 4, is accepted), and any other graph is a
:class:`PrivauditError`. A link eavesdropper sees i→j only in the rounds whose hop is
(j − i) mod N, one round in L.

Choices the paper leaves open, as parameters: ``lr`` γ = 0.05 (paper: 0.05 ResNet-18 /
CIFAR-10, 0.03 MNIST); ``keep`` = 0.5; ``prescale`` = False sends x^{k+½}, w^k as line 7
writes them (True: SGP's code, the sender pre-scales both by its out-share 1 − keep);
``unit`` = "example": the paper samples one example per round (B = 1); with a batch of B
the noise is drawn for the sum of B per-example gradients with per-example sensitivity S
(S = max_b ‖g_{i,b}‖ for adad2p, G, or C with per-example clipping) and divided by B, so
the noise std on the batch-mean gradient is σS/B (DP-SGD's convention, the one the
accountant assumes); "batch" applies (3) verbatim to the batch-mean gradient ḡ: std σ‖ḡ‖,
σG, σC with ḡ clipped to C. The two agree for B = 1.

Privacy. σ multiplies the per-example sensitivity S. The paper's Prop. 2 / eq. (5) gives
σ = c₂√(K log(1/δ))/(Jε) with c₁, c₂ never stated, so σ is not derived from it. Each agent
releases its batch once per round (to one peer); ``privacy()`` states the noise std over the
released gradient's sensitivity for adding or removing one example (sums normalised by the
expected batch size B):
- clipd2p: per-example clip C, std σC/B on the mean, sensitivity C/B: multiplier σ (unit
  "batch": the flat clip of the mean has sensitivity 2C against std σC: σ/2). Formal; σ comes
  from ``--epsilon`` via the run's accountant.
- constd2p: the same accounting with G, which holds only if every per-example gradient norm
  is ≤ G (Assumption 6). The paper assumes it and never clips (``enforce`` = False, its
  choice), and nothing else bounds the gradients, so one example can move the release
  arbitrarily far: not formal, the run reports ε = ∞ with that reason, and the paper's claim
  (multiplier σ, one release per round) only sets σ from ``--epsilon``. ``enforce`` = True
  clips every per-example gradient at G (unit "batch": the batch mean, flat) before the
  noise, so the bound holds and the release is formal with clipd2p's multiplier (σ; σ/2).
- adad2p: the noise scale σ‖g‖ is a function of the private data (no clipping, no bound).
  The Gaussian-mechanism argument Prop. 2 borrows from Abadi et al. needs a
  data-independent sensitivity, so the paper's (ε, δ) claim is uncertified; the message
  norm ‖g + N‖ ≈ ‖g‖√(1 + σ²d) even reveals ‖g‖. We implement the algorithm as written but
  claim no ε: ``privacy()`` is not formal and claims no multiplier, so the run reports
  ε = ∞, and σ is the Params field ``sigma`` (default 0.02, in both of the paper's grids:
  CIFAR-10 {0.001 … 0.04}, MNIST {0.02, 0.05}); ``--epsilon``/``--sigma`` do not set it, use
  ``-p sigma=…``.
Defaults G = 3.5 and C = 1 are the paper's MNIST values (CIFAR-10: G = 8.5, C ∈ {2, 3, 5}).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from privaudit.core.context import Context, State
from privaudit.core.errors import PrivauditError, Unobservable
from privaudit.core.network import Network
from privaudit.core.observation import Observation
from privaudit.core.privacy import Privacy, dwork_roth_epsilon
from privaudit.core.threat import Public, View
from privaudit.defenses.base import (
    Defense,
    Params,
    check_choice,
    check_flag,
    check_fraction,
    check_non_negative,
    check_positive,
    one_release_per_round,
    register,
)
from privaudit.grads import clip_rows
from privaudit.scenario.topology import TOPOLOGIES, exponential

UNITS = ("example", "batch")
WEIGHT_KIND = "w_i^k: the push-sum weight, in the clear (≡ 1 on this graph)"


PROP1 = (
    "Prop. 1, the classical Gaussian mechanism σ = √(2 ln(1.25/δ))/ε per release (valid for "
    "ε < 1); Prop. 2's run-level rule has constants c₁, c₂ never stated"
)


def hops(n: int) -> list[int]:
    """The hop cycle: every power of two below N, ascending (SGP's peer list)."""
    return [1 << j for j in range(max(n - 1, 1).bit_length())]


def hop(n: int, t: int) -> int:
    """The hop every agent uses in round ``t`` (rounds start at 1)."""
    h = hops(n)
    return h[(t - 1) % len(h)]


def peers(n: int, t: int) -> list[int]:
    """``peers(n, t)[i]``: the one agent i sends to in round ``t``."""
    return [(i + hop(n, t)) % n for i in range(n)]


def active_rounds(n: int, src: int, dst: int) -> tuple[int, int] | None:
    """``(first, period)``: src→dst carries messages in rounds first, first + period, …
    (None: never)."""
    h = hops(n)
    d = (dst - src) % n
    return (h.index(d) + 1, len(h)) if d in h else None


def push_sum(
    net: Network,
    x_half: Tensor,
    w: Tensor,
    peer: Tensor,
    keep: float | Tensor,
    prescale: bool,
) -> tuple[Tensor, Tensor]:
    """Send (x^{k+½}, w^k) from each agent i to ``peer[i]`` and mix with P^k (lines 7–10).

    ``peer`` (N,) covers every agent of the run; ``x_half`` (k, D) and ``w`` (k, 1) are the
    held agents' rows; ``keep`` a scalar or per-agent (N, 1) over all N agents (then P^k is
    only column stochastic); returns the held agents' (x^{k+1}, w^{k+1})."""
    edges = [(i, int(peer[i])) for i in range(len(peer))]
    links = net.links_of(edges)

    def at(rows: Tensor, k: float | Tensor) -> float | Tensor:
        return k[rows] if isinstance(k, Tensor) else k

    share = 1.0 - keep
    out = at(net.held, share) if prescale else 1.0
    rx = net.send("half-model", net.from_sender(out * x_half, edges), edges=edges)
    rw = net.send("weight", net.from_sender(out * w, edges), edges=edges)
    inc = 1.0 if prescale else at(links.in_src, share)  # the sender's share
    own = at(net.held, keep)
    x_new = own * x_half + net.sum_incoming(inc * rx, edges)
    w_new = own * w + net.sum_incoming(inc * rw, edges)
    return x_new, w_new


def _graph_name(adj: Tensor) -> str:
    n = adj.shape[0]
    for name, build in TOPOLOGIES.items():
        try:
            if torch.equal(build(n), adj):
                return name
        except PrivauditError:
            continue
    return "a custom graph"


@dataclass
class D2PParams(Params):
    keep: float = 0.5  # P^k_ii: the share of (x, w) an agent keeps; 1 − keep goes to its peer
    unit: str = "example"  # sensitivity unit with a batch: "example" (σS/B) or "batch"
    prescale: bool = False  # messages pre-scaled by the out-share (SGP code) or raw (line 7)
    sigma: float = 0.0  # σ in (3)

    def validate(self) -> None:
        super().validate()
        check_fraction("keep", self.keep, zero=False)
        check_choice("unit", self.unit, UNITS)
        check_flag("prescale", self.prescale)
        check_non_negative("sigma", self.sigma)


class _D2P(Defense):
    """Shared SGP machinery; subclasses supply the noised gradient and its leak."""

    topology = "exponential"  # its own time-varying directed exponential graph

    Params = D2PParams

    def _check_graph(self, adj: Tensor) -> None:
        """An error unless the off-diagonal support of ``adj`` (the graph, or its mixing
        matrix W) is the exponential graph."""
        adj = adj.to("cpu") != 0
        adj.fill_diagonal_(False)
        if not torch.equal(adj, exponential(adj.shape[0])):
            raise PrivauditError(
                f"{self.name} runs on its own time-varying directed exponential graph and "
                f"needs --topology exponential, but this run's graph is {_graph_name(adj)}"
            )

    # -- training -----------------------------------------------------------------
    def init(self, ctx: Context, p: D2PParams) -> State:
        self._check_graph(ctx.adj)
        x = super().init(ctx, p)["x"]
        return {"x": x, "w": torch.ones(ctx.n_held, 1, dtype=x.dtype, device=x.device)}

    def gradient(
        self, ctx: Context, p: Any, z: Tensor, xs: Tensor, ys: Tensor
    ) -> tuple[Tensor, Tensor]:
        """(released gradient g_i (N, D), noise std per agent (N,)) at the points ``z``."""
        raise NotImplementedError

    @staticmethod
    def bounded_gradient(
        ctx: Context, p: Any, z: Tensor, xs: Tensor, ys: Tensor, bound: float, clipped: bool
    ) -> tuple[Tensor, Tensor]:
        """For a bound S on the gradient norms (constd2p's G, clipd2p's C): the batch-mean
        gradient — ``unit`` "example": of per-example gradients clipped at S when
        ``clipped``, noise std σS/B; "batch": the mean, flat-clipped at S when ``clipped``,
        noise std σS."""
        if p.unit == "batch":
            g, m = ctx.grads.mean(z, xs, ys), 1
            if clipped:
                g = clip_rows(g, bound)
        else:
            g, m = ctx.grads.clipped_mean(z, xs, ys, bound if clipped else None), ctx.batch_size
        return g, torch.full((z.shape[0],), p.sigma * bound / m, dtype=g.dtype, device=g.device)

    def round(
        self,
        ctx: Context,
        p: D2PParams,
        state: State,
        net: Network,
        batch: tuple[Tensor, Tensor],
    ) -> State:
        x, w = state["x"], state["w"]
        g, std = self.gradient(ctx, p, x / w, *batch)  # line 4: at the de-biased z
        if p.sigma > 0:  # (3)
            g = g + ctx.gaussian(None, g.shape[1]) * std[:, None]
        x_half = x - p.lr * g  # (4)
        peer = torch.tensor(peers(ctx.n, net.round), dtype=torch.long, device=x.device)
        x_new, w_new = push_sum(net, x_half, w, peer, p.keep, p.prescale)
        return {"x": x_new, "w": w_new}

    # -- privacy ------------------------------------------------------------------
    def _gaussian(
        self,
        p: Any,
        kind: str,
        W: Tensor,
        bound: tuple[str, float],
        enforced: bool,
        unenforced: str,
        assumed: str = "",
    ) -> Privacy:
        """One Gaussian release per round (the half-step model, to one peer), for the bound
        ``bound`` = (its symbol, S): std σS/B on the mean of per-example gradients of norm
        ≤ S (``unit`` "example": add/remove sensitivity S/B, multiplier σ), or σS on the
        batch mean flat-clipped to S (``unit`` "batch": sensitivity 2S, multiplier σ/2).
        Formal only when a clip ``enforced`` the bound (else ``unenforced`` is the reason,
        and the claim rests on the hypothesis ``assumed``, which bounds every per-example
        gradient norm by S: :attr:`Privacy.assumption`); the paper's claim is multiplier σ,
        one release per round, either way. ``W`` must be the exponential graph's (the run
        refuses any other before it starts). A ``weight`` target is observed with the
        half-step model it travels with: the same facts."""
        self._check_graph(W)
        sym, S = bound
        batch = p.unit == "batch"
        caveats: tuple[str, ...] = ()
        if not enforced:
            reason = unenforced
        elif batch:
            reason = (
                f"batch mean clipped to {sym} + N(0, σ²{sym}²): add/remove sensitivity 2{sym}, "
                "one release per round to one peer"
            )
            caveats = (f"flat batch clipping has add/remove sensitivity 2{sym}",)
        else:
            reason = (
                f"per-example clip {sym} + N(0, σ²{sym}²) on the sum, normalised by B: one "
                "release per round to one peer"
            )
        return one_release_per_round(
            self.name,
            p.sigma,
            p.sigma / 2 if batch else p.sigma,
            paper=PROP1,
            reason=reason,
            clip=(S, p.unit) if enforced else None,
            paper_epsilon=self._prop1(p),
            caveats=caveats,
            assumption=None if enforced else (assumed, S),
        )

    @staticmethod
    def _prop1(p: Any) -> Callable[[float, float], float]:
        """Prop. 1's ε(δ) for one release at σ (the paper's claim, whatever the sensitivity)."""
        return lambda delta, impact: dwork_roth_epsilon(p.sigma, delta)

    # -- attack surface -------------------------------------------------------------
    def rounds_needed(self, kind: str, t: int, n: int) -> list[int]:
        """Round t, the previous message on the same link t − L (L = ⌈log₂ N⌉ hops), and
        round t − 1 (the pairs that formed x_src^k)."""
        return sorted({r for r in (t - len(hops(n)), t - 1, t) if r >= 1})

    def receivers(self, kind: str, t: int, src: int, adj: Tensor) -> list[int]:
        """One peer per round on the time-varying graph."""
        return [peers(adj.shape[0], t)[src]]

    def observe(self, view: View, kind: str, t: int, src: int, dst: int) -> Observation:
        """Under ``link`` (src ↔ dst), from the pair (x_src^{k+½}, w_src^k) of round t:

        target = (x̂ − x_src^{k+½})/γ = g_src + N_src at params x̂ / w_src^k, where x̂ is
        x_src^k: exact at t = 1 (x_0 is public, w⁰ = 1); later the link has not carried
        x_src^k (src's state after mixing), so x̂ is src's previous half-step model on this
        link (round t − L), or x_0 when t ≤ L. ``weight`` w_src^k is data-independent
        (≡ 1 here): alone it leaks nothing, so its observation is that of the pair it
        travels with. Asking for a round in which src→dst is idle is an error that names
        the rounds it is active.

        A coalition or global observer that holds round t − 1's two pairs into src's state
        — the one src sent (x_src^{k−½} to its peer) and the one it received from its
        in-peer — rebuilds x_src^k = keep·x_src^{k−½} + (1 − keep)·x_in^{k−½} (lines 9–10)
        exactly, so the target is the noised gradient exactly, at the de-biased
        z = x_src^k / w_src^k."""
        if kind not in self.kinds:
            raise PrivauditError(f"{self.name} has no {kind!r} message; kinds: {list(self.kinds)}")
        pub = view.public
        p, n = pub.params, int(pub.n)
        self._check_active(n, t, src, dst)
        div = (1.0 - p["keep"]) if p["prescale"] else 1.0
        x_half = view.get(t, src, dst, "half-model") / div
        w = float(view.get(t, src, dst, "weight").reshape(-1)[0]) / div
        period = len(hops(n))
        exact = self._state(view, t, src, div, p)
        if t == 1:
            x_hat, proxy = pub.x0, "x0 (exact)"
        elif exact is not None:
            x_hat, proxy = exact, "x_src^k from round t-1's pairs (exact)"
        elif t - period >= 1:
            x_hat, proxy = view.get(t - period, src, dst, "half-model") / div, f"round {t - period}"
        else:
            x_hat, proxy = pub.x0, "x0"
        x_hat = x_hat.to(x_half.dtype)
        target = (x_hat - x_half) / p["lr"]
        leak = self.leak(pub, target)
        meta = {
            "exact": t == 1 or exact is not None,
            "params_from": proxy,
            "via": "half-model",
            **leak.pop("meta"),
        }
        return self.make_observation(view, x_hat / w, target, meta=meta, **leak)

    @staticmethod
    def _state(view: View, t: int, src: int, div: float, p: dict[str, Any]) -> Tensor | None:
        """x_src^k from round t − 1's two pairs into src, or None if the View lacks one."""
        if t == 1:
            return None
        n = view.public.W.shape[0]
        before = peers(n, t - 1)
        came_from = before.index(src)
        if not (
            view.has(t - 1, src, before[src], "half-model")
            and view.has(t - 1, came_from, src, "half-model")
        ):
            return None
        own = view.get(t - 1, src, before[src], "half-model") / div
        got = view.get(t - 1, came_from, src, "half-model") / div
        keep = p["keep"]
        return keep * own + (1.0 - keep) * got

    def leak(self, public: Public, target: Tensor) -> dict[str, Any]:
        """Observation fields ``clip``, ``noise_std`` and ``meta`` of a target g + N."""
        raise NotImplementedError

    @staticmethod
    def bounded_leak(public: Public, bound: float, clipped: bool) -> dict[str, Any]:
        """:meth:`leak` of a :meth:`bounded_gradient`: std σS/B with per-example clip S
        (``unit`` "example", when ``clipped``), or σS on a mean flat-clipped at S."""
        p = public.params
        if p["unit"] == "example":
            std = p["sigma"] * bound / public.batch_size
            return {"clip": bound if clipped else None, "noise_std": std, "meta": {}}
        meta = {"batch_clip": bound, "scale_estimated": True} if clipped else {}
        return {"clip": None, "noise_std": p["sigma"] * bound, "meta": meta}

    def _check_active(self, n: int, t: int, src: int, dst: int) -> None:
        act = active_rounds(n, src, dst)
        now = (src + hop(n, t)) % n
        fix = f"in round {t} agent {src} sends to {now} (--link {src},{now})"
        if act is None:
            raise Unobservable(
                f"{self.name}: link {src}->{dst} never carries a message on the time-varying "
                f"exponential graph over {n} agents (hops {hops(n)}); {fix}"
            )
        first, period = act
        if (t - first) % period:
            rounds = ", ".join(str(first + period * m) for m in range(3))
            raise Unobservable(
                f"{self.name}: link {src}->{dst} carries no message in round {t}; it does in "
                f"rounds {rounds}, … (every {period} from {first}); {fix}"
            )


@dataclass
class AdaD2PParams(D2PParams):
    sigma: float = 0.02  # σ in (3); the paper's σ, never set from --epsilon (no formal DP)


@register
class AdaD2P(_D2P):
    """AdaD²P (Algorithm 1): noise N(0, σ²‖g‖² I), σ a parameter (no DP accounting)."""

    name = "adad2p"
    kinds = {
        "half-model": "x_i^{k+½} = x_i − γ(g_i + N), N ~ N(0, σ²‖g_i‖²): one peer per round",
        "weight": WEIGHT_KIND,
    }
    Params = AdaD2PParams

    def gradient(
        self, ctx: Context, p: AdaD2PParams, z: Tensor, xs: Tensor, ys: Tensor
    ) -> tuple[Tensor, Tensor]:
        if p.unit == "batch":
            g = ctx.grads.mean(z, xs, ys)
            return g, p.sigma * g.norm(dim=-1)
        per = ctx.grads.per_example(z, xs, ys)  # (N, B, D)
        B = ctx.batch_size
        return per.sum(1) / B, p.sigma * per.norm(dim=-1).amax(1) / B

    def privacy(self, p: AdaD2PParams, kind: str, W: Tensor, agent: int | None = None) -> Privacy:
        """No formal DP and no claimed multiplier (so σ is never set from ε): the noise std
        σ‖g‖ is a function of the private data."""
        self._check_graph(W)
        return one_release_per_round(
            self.name,
            p.sigma,
            p.sigma,
            paper=PROP1,
            reason="the noise std σ‖g‖ is a function of the private data (no clip, no "
            "data-independent sensitivity), so Prop. 2's Gaussian-mechanism argument fails",
            mechanism="gaussian-adaptive",
            claimed_multiplier=0.0,
            paper_epsilon=self._prop1(p),
        )

    def leak(self, public: Public, target: Tensor) -> dict[str, Any]:
        """The noise std σS/B (σ‖ḡ‖ for unit "batch") is data-dependent; estimated from
        ‖target‖² = ‖ḡ‖² + D·std², taking ‖ḡ‖ = S (exact for B = 1)."""
        p = public.params
        m = public.batch_size if p["unit"] == "example" else 1
        sigma = p["sigma"]
        std = 0.0
        if sigma > 0:
            std = float(target.norm()) / math.sqrt(target.numel() + (m / sigma) ** 2)
        return {"clip": None, "noise_std": std, "meta": {"noise_std_estimated": True}}


@dataclass
class ConstD2PParams(D2PParams):
    G: float = 3.5  # per-example gradient-norm bound (Assumption 6); paper: 3.5 MNIST, 8.5 CIFAR
    enforce: bool = False  # clip at G so the bound holds (the paper assumes it, never clips)

    def validate(self) -> None:
        super().validate()
        check_positive("G", self.G)
        check_flag("enforce", self.enforce)


@register
class ConstD2P(_D2P):
    """ConstD²P (the paper's Algorithm 2, in its appendix; here as Remark 1 and Assumption 6
    describe it): noise N(0, σ²G² I), G assumed — or, with ``enforce``, made to hold by
    clipping at G."""

    name = "constd2p"
    kinds = {
        "half-model": "x_i^{k+½} = x_i − γ(g_i + N), N ~ N(0, σ²G²), G assumed: one peer/round",
        "weight": WEIGHT_KIND,
    }
    Params = ConstD2PParams

    def gradient(
        self, ctx: Context, p: ConstD2PParams, z: Tensor, xs: Tensor, ys: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The batch-mean gradient (``enforce``: of per-example gradients clipped at G, or
        for ``unit`` "batch" the mean flat-clipped at G) and the noise std σG/B (σG)."""
        return self.bounded_gradient(ctx, p, z, xs, ys, p.G, p.enforce)

    def privacy(self, p: ConstD2PParams, kind: str, W: Tensor, agent: int | None = None) -> Privacy:
        """Gaussian with std σG (σG/B on the mean): formal only with ``enforce``; otherwise
        G bounds the gradients by assumption alone."""
        return self._gaussian(
            p,
            kind,
            W,
            ("G", p.G),
            p.enforce,
            "assumes every per-example gradient norm ≤ G (Assumption 6) but never clips: one "
            "example can move the gradient arbitrarily far (enforce=true clips at G)",
            "bounded gradients: every per-example gradient norm ≤ G (Assumption 6)",
        )

    def leak(self, public: Public, target: Tensor) -> dict[str, Any]:
        p = public.params
        return self.bounded_leak(public, p["G"], bool(p.get("enforce", False)))


@dataclass
class ClipD2PParams(D2PParams):
    clip: float = 1.0  # C; paper: 1 on MNIST, {2, 3, 5} on CIFAR-10

    def validate(self) -> None:
        super().validate()
        check_positive("clip", self.clip)


@register
class ClipD2P(_D2P):
    """ClipD²P (the paper's Algorithm 3, in its appendix; here as Remark 1 describes it):
    clip to C, noise N(0, σ²C² I)."""

    name = "clipd2p"
    kinds = {
        "half-model": "x_i^{k+½} = x_i − γ(clip_C(g_i) + N), N ~ N(0, σ²C²): one peer/round",
        "weight": WEIGHT_KIND,
    }
    Params = ClipD2PParams

    def gradient(
        self, ctx: Context, p: ClipD2PParams, z: Tensor, xs: Tensor, ys: Tensor
    ) -> tuple[Tensor, Tensor]:
        return self.bounded_gradient(ctx, p, z, xs, ys, p.clip, True)

    def privacy(self, p: ClipD2PParams, kind: str, W: Tensor, agent: int | None = None) -> Privacy:
        """One Gaussian release per round: clip C, std σC on the sum (``unit`` "example":
        multiplier σ) or σC on the flat-clipped mean (``unit`` "batch": sensitivity 2C,
        multiplier σ/2)."""
        return self._gaussian(p, kind, W, ("C", p.clip), True, "")

    def leak(self, public: Public, target: Tensor) -> dict[str, Any]:
        return self.bounded_leak(public, public.params["clip"], True)
