"""What every defense provides, and the per-run context it computes in.

A defense is a small object with no per-run state of its own: ``init`` makes the agents'
stacked state, ``round`` advances it one round while talking through the Network, and
``observe`` turns an adversary's View into Observations (defense → messages → threat view →
observation → attack, README "What it does").

What several defenses share is written here once: the optional :class:`Params` base and
its ``check_*`` helpers, :func:`one_release_per_round` (the privacy facts of a batch released
once per round) and :class:`CrossGradientDefense` (the round and attack surface common to
DPDL, PDSL and DP-CGA).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from privaudit.core import limits
from privaudit.core.config import RunConfig
from privaudit.core.context import Consumed, Context, State
from privaudit.core.errors import NameTaken, PrivauditError
from privaudit.core.network import Network
from privaudit.core.observation import Observation
from privaudit.core.params import ParamSpec
from privaudit.core.privacy import Privacy, no_noise
from privaudit.core.recursion import Recursion
from privaudit.core.threat import View
from privaudit.grads import clip_rows, memory
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
    W = view.public.W
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


def incoming_slots(dst: Tensor, n: int) -> tuple[Tensor, int]:
    """Slot of each in-edge among its receiver's in-edges (0, 1, … in link order; ``dst``
    the receivers' local rows, of ``n`` held agents), and the largest in-degree."""
    count = [0] * n
    slots = []
    for j in dst.tolist():
        slots.append(count[j])
        count[j] += 1
    return torch.tensor(slots, dtype=torch.long, device=dst.device), max(count, default=0)


def per_receiver(
    received: Tensor,
    into: Tensor,
    w_in: Tensor,
    like: Tensor,
    own: Tensor | None = None,
    w_own: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The rows ``received`` per in-edge, laid out per receiver i for an aggregate over i's
    players: ``(rows (k, m, D), weights (k, m) float64, real (k, m) bool)``, with k, D,
    dtype and device those of ``like`` (k, D). Row e of ``received`` (weight ``w_in[e]``)
    goes to receiver ``into[e]`` (a row of ``like``), in-edges in link order; slot 0 holds
    ``own`` (i's own row, weight ``w_own[i]``) when given. Padding slots are zero and not
    real."""
    k, first = like.shape[0], int(own is not None)
    slot, most = incoming_slots(into, k)
    slot, m = slot + first, most + first
    rows = like.new_zeros(k, m, like.shape[1])
    weights = torch.zeros(k, m, dtype=torch.float64, device=like.device)
    real = torch.zeros(k, m, dtype=torch.bool, device=like.device)
    rows[into, slot], weights[into, slot], real[into, slot] = received, w_in.double(), True
    if own is not None and w_own is not None:
        rows[:, 0], weights[:, 0], real[:, 0] = own, w_own.double(), True
    return rows, weights, real


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


# -- parameters ---------------------------------------------------------------------------
def check_positive(name: str, value: Any) -> None:
    """``value`` is a finite number > 0 (a step size, a clip norm, a scale)."""
    limits.check_float(name, value, 0, lo_open=True)


def check_non_negative(name: str, value: Any) -> None:
    """``value`` is a finite number ≥ 0 (a noise multiplier, a weight, a tolerance)."""
    limits.check_float(name, value, 0)


def check_fraction(name: str, value: Any, zero: bool = True) -> None:
    """``value`` is in [0, 1) (``zero``: a momentum) or in (0, 1) (a share)."""
    limits.check_float(name, value, 0, 1, lo_open=not zero, hi_open=True)


def check_count(name: str, value: Any, optional: bool = False) -> None:
    """``value`` is an integer ≥ 1 (None passes when ``optional``)."""
    if not (optional and value is None):
        limits.check_int(name, value, 1)


def check_choice(name: str, value: Any, choices: Collection[str]) -> None:
    """``value`` is one of ``choices`` (a tuple, or a dict's keys)."""
    if value not in choices:
        raise PrivauditError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def check_flag(name: str, value: Any) -> None:
    """``value`` is a bool (a JSON true or false, never 0 or 1)."""
    if not isinstance(value, bool):
        raise PrivauditError(f"{name} must be true or false, got {value!r}")


@dataclass
class Params:
    """An optional base for a defense's ``Params``: the step size every built-in takes and
    its check. A subclass adds its own fields, each with a default, after ``lr`` (and may
    re-declare ``lr`` with another default); its ``validate`` calls ``super().validate()``
    and the ``check_*`` helpers above, so each check and its message are written once. A
    plain dataclass with its own ``validate`` (or none) serves as well (a plugin's)."""

    lr: float = 0.05  # the step size: η, γ or λ in the papers, in (0, limits.LR_MAX]

    def validate(self) -> None:
        limits.check_step_size("lr", self.lr)


# -- the registry -------------------------------------------------------------------------
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
    # its round reads the graph only through the Network's links and W's rows (never N or
    # W's spectrum), so K runs simulate exactly as one run on the disjoint union of K copies
    # of the graph (privaudit.api.model_membership batches reference runs that way)
    union_exact: bool = False

    def topology_for(self, topology: str | None) -> str:
        """The graph a run of this defense trains on: ``topology`` when one is asked for
        (None: not asked), else the defense's own (the push-sum defenses need theirs), else
        the default graph."""
        return topology or self.topology or RunConfig.topology

    # -- training -----------------------------------------------------------------
    def init(self, ctx: Context, p: Any) -> State:
        """State tensors hold one row per held agent (dim 0), or are 0-dim and shared."""
        return {"x": ctx.x0.expand(ctx.n_held, -1).clone()}

    def round(
        self, ctx: Context, p: Any, state: State, net: Network, batch: tuple[Tensor, Tensor]
    ) -> State:
        """One round over ``net`` on the held agents' ``batch``: the next state. ``state`` is
        the previous round's; when it is a :class:`~privaudit.core.context.Consumed`, its
        caller never reads it again and the round may write the next state into its tensors."""
        raise NotImplementedError

    def round_bytes(self, ctx: Context, state: State) -> int:
        """The least memory a round needs beyond ``state`` (the pre-flight check of
        :meth:`privaudit.sim.run.Run.train`): by default the next state, as large as this
        one. A defense whose round needs more than that at any budget adds it."""
        return sum(v.numel() * v.element_size() for v in state.values())

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
        return no_noise(self.name, None)

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

    def recursion(self, p: Any, W: Tensor, batch_size: int) -> Recursion | None:
        """The defense's linear structure, stated once (El Mrini, Cyffers & Bellet, ICML
        2024): its gossiped messages as a :class:`~privaudit.core.recursion.Recursion`
        s_t = A_t s_{t-1} + B_t u_t over everyone's initial states and per-round updates,
        with the message kinds that carry the state, the update an Observation targets and
        the model it is evaluated at. ``W`` is the mixing matrix, ``batch_size`` the expected
        batch size B (a noise std on a batch mean is σC/B). The gossip algebra
        (:func:`privaudit.api.gossip.observe_beyond`) solves it for a coalition's victims at
        any distance. None (the default): not expressible as one (cross-gradients at
        neighbours' models, push-sum weights, a non-linear step)."""
        return None

    # -- shared helpers ---------------------------------------------------------------
    def observe_cg(
        self, view: View, t: int, src: int, dst: int, noise_std: float = 0.0, **kw: Any
    ) -> Observation:
        """A cross-gradient src→dst: src's batch at dst's model, which crosses the reverse
        link in the clear in the same round (``model`` message dst→src).

        Repeated releases: src sends a copy of the same batch, with fresh noise, to every
        neighbour j (at j's model). When the View holds more copies (a coalition, a global
        observer), those evaluated at the same model as dst's are averaged — noise std /
        √k, still exact; copies at other models are left out (``meta["left_out"]``): averaging
        them at a mean model would trade exactness for noise, and a stronger observer must
        never observe less than one link (before consensus, or without noise, it would)."""
        meta = kw.pop("meta", {})
        params = view.get(t, dst, src, "model")
        seen = [
            j
            for j in neighbours(view.public.W, src)
            if view.has(t, src, j, "cg") and view.has(t, j, src, "model")
        ]
        same = [j for j in seen if j == dst or torch.equal(view.get(t, j, src, "model"), params)]
        if len(seen) > len(same):
            meta = {**meta, "left_out": f"{len(seen) - len(same)} copies at other models"}
        if len(same) > 1:
            meta = {**meta, "copies": len(same)}
        copies = [view.get(t, src, j, "cg") for j in same] or [view.get(t, src, dst, "cg")]
        return self.make_observation(
            view,
            params,
            torch.stack(copies).mean(0),
            noise_std=noise_std / math.sqrt(len(copies)),
            meta=meta,
            **kw,
        )

    def observe_batch_clip_cg(self, view: View, t: int, src: int, dst: int) -> Observation:
        """A cross-gradient whose batch mean is clipped to C as a whole, plus N(0, σ²C²)
        (PDSL, DP-CGA): the clip factor min(1, C/‖ḡ‖) is one unknown scalar (``scale`` 1 is
        reported, ``meta["batch_clip"]`` = C); otherwise as :meth:`observe_cg`."""
        p = view.public.params
        meta = {"exact": True, "batch_clip": p["clip"], "scale_estimated": True}
        return self.observe_cg(view, t, src, dst, noise_std=p["sigma"] * p["clip"], meta=meta)

    def observe_half_step(
        self, view: View, t: int, src: int, dst: int, kind: str = "half-model", **kw: Any
    ) -> Observation:
        """(x^i_{t-1} − x̃^i_t)/η at x^i_{t-1} for a gossiped half-step x̃ (D-PSGD-style):
        x^i_{t-1} = Σ_j w_ij x̃^j_{t-1} (the previous round's gossip), exact when the View
        holds every neighbour's x̃^j_{t-1} (x_0 at t = 1), else unseen ones are replaced by
        x̃^i_{t-1}, src's own (the link's approximation)."""
        lr = view.public.params["lr"]
        half = view.get(t, src, dst, kind)
        if t == 1:
            prev, unseen = view.public.x0.to(half.dtype), []
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
        target = (x_prev - view.get(t + 1, src, dst, "model")) / view.public.params["lr"]
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
        lr = view.public.params["lr"]

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
        model = _architecture(pub.model, tuple(pub.input_shape), pub.num_classes)
        spec = ParamSpec.of(model)
        meta = {"threat": view.threat, **kw.pop("meta", {})}
        terms = [(spec.unflatten(x.float()), c, same) for x, c, same in kw.pop("terms", [])]
        return Observation(
            model=model,
            params=spec.unflatten(params.float()),
            target=spec.unflatten(target.float()),
            batch_size=pub.batch_size,
            input_shape=tuple(pub.input_shape),
            num_classes=pub.num_classes,
            mean=tuple(pub.mean),
            std=tuple(pub.std),
            meta=meta,
            terms=terms,
            **kw,
        )


def one_release_per_round(
    name: str,
    sigma: float,
    multiplier: float,
    paper: str,
    reason: str,
    clip: tuple[float, str] | None = None,
    **facts: Any,
) -> Privacy:
    """The facts of a kind whose messages carry the agent's batch once per round with fresh
    noise (the same release to every neighbour, or to one peer): none when σ = 0
    (:func:`~privaudit.core.privacy.no_noise`), else a Gaussian mechanism of noise
    multiplier ``multiplier``, formal exactly when ``clip`` = (C, unit) — "example" or
    "batch" — bounds its sensitivity (else ``reason`` says why there is no finite ε). The
    claim is the paper's σ, one release per round; ``facts`` set other :class:`Privacy`
    fields (``caveats``, ``paper_epsilon``) or replace those defaults."""
    if sigma <= 0:
        return no_noise(name)
    bound, unit = clip if clip is not None else (None, None)
    defaults: dict[str, Any] = dict(
        mechanism="gaussian",
        noise_multiplier=multiplier,
        releases=1,
        clip=bound,
        clip_unit=unit,
        formal=clip is not None,
        reason=reason,
        claimed_multiplier=sigma,
        claimed_releases=1,
        paper=paper,
    )
    return Privacy(**{**defaults, **facts})


# the ``model`` message of the cross-gradient defenses
MODEL_KIND = "x_i, the model at the start of the round, in the clear"


def max_in_degree(adj: Tensor) -> int:
    """The largest number of in-edges of an agent (off-diagonal non-zeros of a column)."""
    return int((adj != 0).fill_diagonal_(False).sum(0).max()) if adj.numel() else 0


def receiver_rows(adj: Tensor) -> int:
    """Rows of D floats a chunk of :meth:`CrossGradientDefense.cross_gradient_chunks` holds
    per receiver of the largest in-degree d: its d + 1 pairs' models and gradients, its
    noised self row, its aggregate and one noise row."""
    return 2 * (max_in_degree(adj) + 1) + 3


@dataclass
class PairChunk:
    """One chunk of :meth:`CrossGradientDefense.cross_gradient_chunks`: the held receivers
    ``rows`` (local rows, ascending), their self pairs' clean and noised rows, and the
    ``cg`` rows received on ``in_edges`` (indices into the in-edges, link order), each by
    the receiver ``receivers`` (its row among ``rows``: 0 is ``rows.start``)."""

    rows: slice
    self_clean: Tensor
    self_noisy: Tensor
    cg: Tensor
    in_edges: Tensor
    receivers: Tensor


class CrossGradientDefense(Defense):
    """What the cross-gradient defenses share (DPDL, PDSL, DP-CGA; CGA's scheme, Esfandiari
    et al. 2021). In round t agent i sends its model x^i_{t-1} to its neighbours
    (``model``), computes the clipped, noised gradient of its batch at its own model and at
    each neighbour's — one pair per (model, data owner), fresh noise per pair — and sends
    neighbour j the one at x^j (``cg``: first index the data owner, as in DPDL's (8)). It
    aggregates its own and the received ones into a direction g̃^i (each paper's way, cited
    in its module) and takes a heavy-ball half-step, gossiping x̃ (``half-model``):

        ṽ^i_t = β v^i_{t-1} + g̃^i_t,    x̃^i_t = x^i_{t-1} − η ṽ^i_t,    x^i_t = Σ_j w_ij x̃^j_t

    with v^i_t = Σ_j w_ij ṽ^j_t (``mm``) when the momentum is mixed, else v^i_t = ṽ^i_t.
    Params have ``lr`` η, ``momentum`` β, ``clip`` C and ``sigma`` σ."""

    clip_unit = "batch"  # "example": per-example clip, std σC/B (DPDL); "batch": flat, σC
    momentum_key = "v"  # the state key of the momentum v^i
    mixed_momentum = True  # v gossiped as ``mm`` (DPDL (21), PDSL (24)) or kept local (CGA)

    def init(self, ctx: Context, p: Any) -> State:
        """x_0 and v_0 = 0 for every agent."""
        x = super().init(ctx, p)["x"]
        return {"x": x, self.momentum_key: torch.zeros_like(x)}

    def cross_gradient_chunks(
        self,
        ctx: Context,
        p: Any,
        net: Network,
        x: Tensor,
        batch: tuple[Tensor, Tensor],
    ) -> Iterator[PairChunk]:
        """The round's first half, :meth:`receivers_per_chunk` receivers at a time: ``model``
        out, then for each chunk of held agents R the pairs at their models — R's self pairs
        (agent r's batch at its own model) and the in-edge pairs (i's batch at r's model, for
        each link i→r) — each pair's clipped batch-mean gradient ``clean``, ``noisy`` =
        ``clean`` plus N(0, σ²C²) on the sum (/B on the mean, ``clip_unit`` "example") or on
        the flat-clipped mean ("batch"), drawn per pair from its data owner's generator
        (:meth:`Context.gaussian_rows`: the same numbers in any chunking), and the in-edge
        pairs sent as ``cg``.

        Memory: besides the state only one chunk's pairs (their models and gradients) and
        the noise rows drawn and not yet used are alive, so the round's working memory is
        set by the chunk, not by the number of agents. Chunks of fewer than all receivers
        need a process holding every agent (:attr:`Network.holds_all`; a sent subset of
        links is then a complete send); under torch.distributed a rank holds one agent and
        sends all its pairs at once."""
        xs, ys = batch
        k, dim = x.shape
        chunk = self.receivers_per_chunk(ctx, net, x) if net.holds_all else k
        source, model_of = net.pair_models("model", x)
        links = net.links
        owner = torch.cat([torch.arange(k, device=x.device), links.out_src])
        receiver = torch.cat([torch.arange(k, device=x.device), links.out_dst])
        noise = ctx.gaussian_rows(owner, dim) if p.sigma > 0 else None
        example = self.clip_unit == "example"
        if noise is not None:
            scale = p.sigma * p.clip / ctx.batch_size if example else p.sigma * p.clip
        for r0 in range(0, k, chunk):
            r1 = min(k, r0 + chunk)
            if chunk >= k:
                edges, into = None, torch.arange(len(links.in_edges), device=x.device)
                pairs = torch.arange(len(owner), device=x.device)
            else:  # every agent held: out-edges, in-edges and links are one list
                into = ((receiver[k:] >= r0) & (receiver[k:] < r1)).nonzero().flatten()
                edges = [links.edges[e] for e in into.tolist()]
                pairs = torch.cat([torch.arange(r0, r1, device=x.device), k + into])
            models = source.index_select(0, model_of[pairs])
            if example:
                clean = ctx.grads.clipped_mean(models, xs, ys, p.clip, owner[pairs])
            else:
                mine = owner[pairs]
                clean = clip_rows(ctx.grads.mean(models, xs[mine], ys[mine]), p.clip)
            del models
            own = r1 - r0
            self_clean = clean[:own]
            self_noisy = self_clean.clone()
            if noise is not None:
                for row, pair in enumerate(pairs.tolist()):
                    z = noise.take(pair)
                    into_row = self_noisy[row] if row < own else clean[row]
                    if example:  # clean + scale·z, as torch.add(clean, z, alpha=scale)
                        torch.add(clean[row], z, alpha=scale, out=into_row)
                    else:  # clean + z·σC
                        torch.add(clean[row], z.mul_(scale), out=into_row)
                    del z
            cg = net.send("cg", clean[own:], edges=edges)
            local = links.in_dst[into] - r0
            yield PairChunk(slice(r0, r1), self_clean, self_noisy, cg, into, local)
            del clean, self_clean, self_noisy, cg, local
            if chunk < k:
                memory.release(x.device)

    def receivers_per_chunk(self, ctx: Context, net: Network, x: Tensor) -> int:
        """How many receivers' pairs :meth:`cross_gradient_chunks` computes at once: as many
        as fit in half the gradient engine's budget (``--max-memory``, else half of what is
        free: :func:`privaudit.grads.memory.budget`) at :meth:`rows_per_receiver` rows of D
        floats each, and at least one."""
        limit = memory.budget(ctx.grads.max_memory, x.device)
        each = self.rows_per_receiver(ctx.adj) * x.shape[1] * x.element_size()
        return max(1, memory.fitting(None if limit is None else limit // 2, 0, each, x.shape[0]))

    def round_bytes(self, ctx: Context, state: State) -> int:
        """One receiver's rows (:meth:`rows_per_receiver`): a chunk of one receiver is the least
        a round can take. The next state takes no more: the simulator hands the round its
        state :class:`~privaudit.core.context.Consumed`, and x̃ and ṽ are written into x and
        v and mixed there in place into the next x and v."""
        x = state["x"]
        return self.rows_per_receiver(ctx.adj) * x.shape[1] * x.element_size()

    def rows_per_receiver(self, adj: Tensor) -> int:
        """Rows of D floats a receiver's share of a chunk holds (:func:`receiver_rows`; a
        round whose aggregate takes more per receiver adds it)."""
        return receiver_rows(adj)

    @staticmethod
    def next_rows(state: State, x: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Where the round's ṽ and x̃ go: ``v`` and ``x`` themselves when ``state`` is
        :class:`~privaudit.core.context.Consumed`, else new tensors."""
        if isinstance(state, Consumed):
            return v, x
        return torch.empty_like(v), torch.empty_like(x)

    @staticmethod
    def half_step_rows(
        p: Any, x: Tensor, v: Tensor, g: Tensor, rows: slice, v_half: Tensor, x_half: Tensor
    ) -> None:
        """ṽ = βv + g̃ and x̃ = x − ηṽ for the agents ``rows`` (``g``: their g̃ rows), written
        into those rows of ``v_half`` and ``x_half``, which may be ``v`` and ``x`` themselves
        (one temporary, ηṽ of the rows)."""
        out_v, out_x = v_half[rows], x_half[rows]
        torch.mul(v[rows], p.momentum, out=out_v).add_(g)  # βv + g
        torch.sub(x[rows], out_v * p.lr, out=out_x)  # x − ηṽ

    def mix_half(self, net: Network, x_half: Tensor, v_half: Tensor) -> State:
        """x̃ gossiped (``half-model``), then ṽ (``mm``) when the momentum is mixed, each in
        place (:meth:`Network.gossip_`): x̃ and ṽ become the next x and v, and no further
        (k, D) result is allocated."""
        x_new = net.gossip_("half-model", x_half)
        v_new = net.gossip_("mm", v_half) if self.mixed_momentum else v_half
        return {"x": x_new, self.momentum_key: v_new}

    def rounds_needed(self, kind: str, t: int, n: int) -> list[int]:
        """``cg``: its own round; ``model``: x_{t-1} and x_t (sent in t + 1); the momentum
        kinds: rounds t − 1 and t (v^i_{t-1} is removed)."""
        if kind == "cg":
            return [t]
        if kind == "model":
            return [t, t + 1]
        return [t - 1, t] if t > 1 else [t]

    def observe(self, view: View, kind: str, t: int, src: int, dst: int) -> Observation:
        """``cg``: the receiver's model x^dst_{t-1} crosses the reverse link in the clear, so
        the message is src's clipped batch-mean gradient there plus its noise
        (:meth:`observe_cross_gradient`). ``model``: (x^i_{t-1} − x^i_t)/η at x^i_{t-1},
        mixing and momentum ignored. ``mm`` and ``half-model``: :meth:`observe_update`."""
        if kind == "cg":
            return self.observe_cross_gradient(view, t, src, dst)
        if kind == "model":
            return self.observe_model_step(view, t, src, dst)
        return self.observe_update(view, kind, t, src, dst)

    def observe_cross_gradient(self, view: View, t: int, src: int, dst: int) -> Observation:
        """A flat-clipped cross-gradient (:meth:`Defense.observe_batch_clip_cg`)."""
        return self.observe_batch_clip_cg(view, t, src, dst)

    def observe_update(self, view: View, kind: str, t: int, src: int, dst: int) -> Observation:
        """The Observation of an ``mm`` or ``half-model`` message: the paper's aggregate."""
        raise NotImplementedError
