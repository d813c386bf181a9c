"""What every defense provides, and the per-run context it computes in.

A defense is a small object with no per-run state of its own: ``init`` makes the agents'
stacked state, ``round`` advances it one round while talking through the Network, and
``observe`` turns an adversary's View into Observations (defense → messages → threat view →
observation → attack, README "What it does").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from privaudit.core.context import Context, State
from privaudit.core.errors import NameTaken
from privaudit.core.network import Network
from privaudit.core.observation import Observation
from privaudit.core.params import ParamSpec
from privaudit.core.privacy import Privacy
from privaudit.core.threat import View
from privaudit.scenario.models import build_model


def neighbours(adj: Tensor, i: int) -> list[int]:
    """The agents j ≠ i with a non-zero entry in row i of ``adj`` (or of W)."""
    return [j for j in torch.nonzero(adj[i]).flatten().tolist() if j != i]


def mix(
    view: View, i: int, value: Callable[[int], Tensor | None], fallback: Tensor
) -> tuple[Tensor, list[int]]:
    """Σ_j w_ij value(j) over j ∈ N_i ∪ {i} (self first, then neighbours in order, as the
    simulator's gossip sums); an unseen value (None) is replaced by ``fallback``. Returns the
    sum and the agents that were unseen."""
    W = view.public["W"]
    unseen: list[int] = []
    out = None
    for j in [i, *neighbours(W, i)]:
        v = value(j)
        if v is None:
            unseen.append(j)
            v = fallback
        term = float(W[i, j]) * v
        out = term if out is None else out + term
    return out, unseen


def exchange_models(net: Network, x: Tensor) -> tuple[Tensor, Tensor]:
    """Every held agent sends its model to its neighbours (``model`` messages); returns the
    (model, data owner) pairs of the cross-gradient defenses: one self pair per held agent
    (at its own model), then one per out-edge i→j — i's batch at j's model, received on
    j→i. ``owner`` is the local row of the agent whose batch (and noise) each pair uses."""
    received = net.broadcast("model", x)
    models = torch.cat([x, net.on_reverse(received)])
    owner = torch.cat([torch.arange(x.shape[0], device=x.device), net.links.out_src])
    return models, owner


def degree(W: Tensor, agent: int | None = None) -> int:
    """Neighbours of ``agent`` (off-diagonal non-zeros of its row of W); the largest over
    all agents when ``agent`` is None (the worst agent)."""
    return max_degree(W) if agent is None else len(neighbours(W, agent))


def max_degree(W: Tensor) -> int:
    """Largest number of neighbours (off-diagonal non-zeros of a row of W)."""
    return int(((W != 0).sum(1) - (torch.diagonal(W) != 0).long()).max())


@functools.lru_cache(maxsize=16)
def _architecture(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The architecture an Observation names (its own parameter values are never used), built
    once per kind: audits observe thousands of trials."""
    return build_model(name, input_shape, num_classes)


DEFENSES: dict[str, Defense] = {}


def register(cls: type[Defense]) -> type[Defense]:
    """Class decorator: add one instance of ``cls`` to :data:`DEFENSES` under ``cls.name``,
    for the built-ins and for plugins (:mod:`privaudit.plugins`) alike. A name already
    taken is refused (:class:`~privaudit.core.errors.NameTaken`): nothing is silently replaced."""
    if cls.name in DEFENSES:
        raise NameTaken("defense", cls.name)
    DEFENSES[cls.name] = cls()
    return cls


class Defense:
    """Base class. Subclasses set ``name``, ``kinds`` (kind → one line), ``Params``, and are
    decorated with :func:`register`."""

    name: str = ""
    kinds: dict[str, str] = {}
    Params: type = object
    topology: str | None = None  # the graph a defense needs, used when --topology is not given

    # -- training -----------------------------------------------------------------
    def init(self, ctx: Context, p: Any) -> State:
        """State tensors hold one row per held agent (dim 0), or are 0-dim and shared."""
        return {"x": ctx.x0.expand(ctx.n_held, -1).clone()}

    def round(
        self, ctx: Context, p: Any, state: State, net: Network, batch: tuple[Tensor, Tensor]
    ) -> State:
        raise NotImplementedError

    def holdout_size(self, p: Any) -> int:
        """Examples per agent to hold out of training as a validation split (``ctx.holdout``)."""
        return 0

    def public_validation_size(self, p: Any, test_size: int) -> int:
        """Examples of the test split (of ``test_size``) drawn once as a public validation set
        shared by every agent (``ctx.val_x``/``ctx.val_y``), left out of test accuracy."""
        return 0

    # -- privacy ------------------------------------------------------------------
    def privacy(self, p: Any, kind: str, W: Tensor, agent: int | None = None) -> Privacy:
        """The facts a correct accounting of ``kind`` messages needs, for ``agent``'s data
        (None: the worst agent); ``W`` is the mixing matrix. The one source of every ε the
        tool prints: the run's σ calibration, its reported ε, the audit's upper bounds and
        the claims ledger all read it (:mod:`privaudit.core.accounting`)."""
        return Privacy(reason=f"{self.name} adds no noise to its messages")

    # -- attack surface -------------------------------------------------------------
    def rounds_needed(self, kind: str, t: int, n: int) -> list[int]:
        """Rounds whose messages ``observe`` needs for the ``kind`` message of round ``t``
        in a run of ``n`` agents."""
        return [t]

    def receivers(self, kind: str, t: int, src: int, adj: Tensor) -> list[int]:
        """The agents ``src``'s ``kind`` message of round ``t`` goes to (default: every
        neighbour; time-varying graphs override)."""
        return neighbours(adj, src)

    def observe(self, view: View, kind: str, t: int, src: int, dst: int) -> Observation:
        """The Observation of ``src``'s ``kind`` message to ``dst`` in round ``t``, removing
        everything the View makes known (richer threat models see more links)."""
        raise NotImplementedError

    # -- shared helpers ---------------------------------------------------------------
    def observe_cg(
        self, view: View, t: int, src: int, dst: int, noise_std: float = 0.0, **kw: Any
    ) -> Observation:
        """A cross-gradient src→dst: src's batch at dst's model, which crosses the reverse
        link in the clear in the same round (``model`` message dst→src).

        Repeated releases: src sends a copy of the same batch, with fresh noise, to every
        neighbour j (at j's model). When the View holds k > 1 copies (a coalition, a global
        observer) they are averaged — noise std / √k — at the mean of the receivers' models:
        exact when those models are equal (round 1, or consensus), else an approximation."""
        meta = kw.pop("meta", {})
        copies = [
            (view.get(t, j, src, "model"), view.get(t, src, j, "cg"))
            for j in neighbours(view.public["W"], src)
            if view.has(t, src, j, "cg") and view.has(t, j, src, "model")
        ]
        if len(copies) <= 1:
            params, target = view.get(t, dst, src, "model"), view.get(t, src, dst, "cg")
            return self.make_observation(view, params, target, noise_std=noise_std, meta=meta, **kw)
        models = torch.stack([m for m, _ in copies])
        same = bool((models == models[0]).all())
        meta = {**meta, "copies": len(copies), "exact": meta.get("exact", True) and same}
        if not same:
            meta["approx"] = "copies averaged at the mean of the receivers' models"
        return self.make_observation(
            view,
            models.mean(0),
            torch.stack([g for _, g in copies]).mean(0),
            noise_std=noise_std / math.sqrt(len(copies)),
            meta=meta,
            **kw,
        )

    def observe_batch_clip_cg(self, view: View, t: int, src: int, dst: int) -> Observation:
        """A cross-gradient whose batch mean is clipped to C as a whole, plus N(0, σ²C²)
        (PDSL, DP-CGA): the clip factor min(1, C/‖ḡ‖) is one unknown scalar (``scale`` 1 is
        reported, ``meta["batch_clip"]`` = C); otherwise as :meth:`observe_cg`."""
        p = view.public["params"]
        meta = {"exact": True, "batch_clip": p["clip"], "scale_estimated": True}
        return self.observe_cg(view, t, src, dst, noise_std=p["sigma"] * p["clip"], meta=meta)

    def observe_half_step(
        self, view: View, t: int, src: int, dst: int, kind: str = "half-model", **kw: Any
    ) -> Observation:
        """(x^i_{t-1} − x̃^i_t)/η at x^i_{t-1} for a gossiped half-step x̃ (D-PSGD-style):
        x^i_{t-1} = Σ_j w_ij x̃^j_{t-1} (the previous round's gossip), exact when the View
        holds every neighbour's x̃^j_{t-1} (x_0 at t = 1), else unseen ones are replaced by
        x̃^i_{t-1}, src's own (the link's approximation)."""
        lr = view.public["params"]["lr"]
        half = view.get(t, src, dst, kind)
        if t == 1:
            prev, unseen = view.public["x0"].to(half.dtype), []
        else:
            own = view.get(t - 1, src, dst, kind)
            prev, unseen = mix(view, src, lambda j: view.sent(t - 1, j, kind), own)
        meta = {"exact": not unseen, **kw.pop("meta", {})}
        if unseen:
            meta["approx"] = f"x_(t-1) mixes unseen half-models of agents {unseen}"
        return self.make_observation(view, prev, (prev - half) / lr, meta=meta, **kw)

    def observe_model_step(self, view: View, t: int, src: int, dst: int) -> Observation:
        """(x^i_{t-1} − x^i_t)/η at x^i_{t-1}, from two consecutive ``model`` messages; mixing
        and momentum are ignored (an approximation)."""
        x_prev = view.get(t, src, dst, "model")
        target = (x_prev - view.get(t + 1, src, dst, "model")) / view.public["params"]["lr"]
        return self.make_observation(view, x_prev, target, meta={"exact": False})

    @staticmethod
    def momentum_step(
        view: View, kind: str, t: int, src: int, dst: int, beta: float, mixed: bool = True
    ) -> tuple[Tensor, list[int]]:
        """ṽ^i_t − β v^i_{t-1}: the momentum's new term g̃^i_t, and the agents whose ṽ the
        View lacked. ṽ is the ``mm`` message, or (x_{s-1} − x̃_s)/η from the ``model`` and
        ``half-model`` messages. ``mixed``: v^i_{t-1} = Σ_j w_ij ṽ^j_{t-1} (the momentum is
        gossiped, DPDL (21), PDSL) — exact when every neighbour's ṽ^j_{t-1} is seen, unseen
        ones replaced by ṽ^i_{t-1} (the paper's consecutive-round approximation); else
        v^i_{t-1} = ṽ^i_{t-1} (a local momentum, exact)."""
        lr = view.public["params"]["lr"]

        def v(s: int, j: int) -> Tensor | None:
            if kind == "mm":
                return view.sent(s, j, "mm")
            x, h = view.sent(s, j, "model"), view.sent(s, j, "half-model")
            return None if x is None or h is None else (x - h) / lr

        def own(s: int) -> Tensor:
            if kind == "mm":
                return view.get(s, src, dst, "mm")
            return (view.get(s, src, dst, "model") - view.get(s, src, dst, "half-model")) / lr

        cur = own(t)
        if t == 1:
            return cur, []
        if not mixed:
            return cur - beta * own(t - 1), []
        prev, unseen = mix(view, src, lambda j: v(t - 1, j), own(t - 1))
        return cur - beta * prev, unseen

    @staticmethod
    def make_observation(view: View, params: Tensor, target: Tensor, **kw: Any) -> Observation:
        """An Observation of the public model at flat ``params`` with flat ``target``;
        ``terms`` (if given) hold flat parameter vectors, see :class:`Observation`."""
        pub = view.public
        model = _architecture(pub["model"], tuple(pub["input_shape"]), pub["num_classes"])
        spec = ParamSpec.of(model)
        meta = {"threat": view.threat, **kw.pop("meta", {})}
        terms = [(spec.unflatten(x.float()), c, same) for x, c, same in kw.pop("terms", [])]
        return Observation(
            model=model,
            params=spec.unflatten(params.float()),
            target=spec.unflatten(target.float()),
            batch_size=pub["batch_size"],
            input_shape=tuple(pub["input_shape"]),
            num_classes=pub["num_classes"],
            mean=tuple(pub["mean"]),
            std=tuple(pub["std"]),
            meta=meta,
            terms=terms,
            **kw,
        )
