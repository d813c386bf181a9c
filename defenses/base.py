"""What every defense provides, and the per-run context it computes in.

A defense is a small object with no per-run state of its own: ``init`` makes the agents'
stacked state, ``round`` advances it one round while talking through the Network, and
``observe`` turns an adversary's View into Observations (DESIGN.md, "The flow").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from privaudit.errors import PrivauditError
from privaudit.grads import PairGrads
from privaudit.models import build_model
from privaudit.network import SimNetwork
from privaudit.observation import Observation
from privaudit.params import ParamSpec
from privaudit.threat import View

State = dict[str, Tensor]


@dataclass
class Context:
    """Everything a round computes with: model, data shards, graph, randomness."""

    model: nn.Module
    spec: ParamSpec
    grads: PairGrads
    x0: Tensor  # shared initial model (D,) — public
    train_x: Tensor  # (n, C, H, W), normalised
    train_y: Tensor
    parts: list[Tensor]  # agent i's indices into train_x
    adj: Tensor
    W: Tensor
    batch_size: int
    generator: torch.Generator
    device: torch.device
    holdout: list[Tensor] = field(default_factory=list)  # agent i's validation indices

    @property
    def n(self) -> int:
        return self.adj.shape[0]

    def sample(self) -> Tensor:
        """A batch of B distinct local indices per agent (uniform without replacement), (N, B)."""
        out = []
        for part in self.parts:
            pick = torch.randperm(len(part), generator=self.generator, device=self.device)
            out.append(part[pick[: self.batch_size]])
        return torch.stack(out)

    def gaussian(self, *shape: int) -> Tensor:
        return torch.randn(*shape, generator=self.generator, device=self.device)


def exchange_models(net: SimNetwork, x: Tensor) -> tuple[Tensor, Tensor]:
    """Every agent sends its model to its neighbours (``model`` messages); returns the
    (model, data owner) pairs of the cross-gradient defenses: N self pairs (agent i at its own
    model), then one per edge e — src[e]'s batch at dst[e]'s model, received on e's reverse."""
    received = net.broadcast("model", x)
    models = torch.cat([x, received[net.reverse]])
    owner = torch.cat([torch.arange(x.shape[0], device=x.device), net.src])
    return models, owner


def params_of(cls: type, overrides: dict[str, Any]) -> Any:
    """Build a params dataclass from ``overrides``, rejecting unknown names and bad types."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    bad = sorted(set(overrides) - set(fields))
    if bad:
        raise PrivauditError(
            f"unknown parameter(s) {', '.join(bad)}; valid: {', '.join(sorted(fields))}"
        )
    obj = cls(**overrides)
    check = getattr(obj, "validate", None)
    if check:
        check()
    return obj


DEFENSES: dict[str, Defense] = {}


def register(cls: type[Defense]) -> type[Defense]:
    """Class decorator: add one instance of ``cls`` to :data:`DEFENSES` under ``cls.name``."""
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
        return {"x": ctx.x0.expand(ctx.n, -1).clone()}

    def round(
        self, ctx: Context, p: Any, state: State, net: SimNetwork, batch: tuple[Tensor, Tensor]
    ) -> State:
        raise NotImplementedError

    def holdout_size(self, p: Any) -> int:
        """Examples per agent to hold out of training as a validation split (``ctx.holdout``)."""
        return 0

    # -- privacy ------------------------------------------------------------------
    def releases_per_round(self, adj: Tensor) -> int:
        """How many noised releases of one agent's batch happen per round (worst agent)."""
        return 0

    # -- attack surface -------------------------------------------------------------
    def rounds_needed(self, kind: str, t: int, n: int) -> list[int]:
        """Rounds whose messages ``observe`` needs for the ``kind`` message of round ``t``
        in a run of ``n`` agents."""
        return [t]

    def observe(self, view: View, kind: str, t: int, src: int, dst: int) -> Observation:
        raise NotImplementedError

    # -- shared helpers ---------------------------------------------------------------
    def observe_cg(self, view: View, t: int, src: int, dst: int, **kw: Any) -> Observation:
        """A cross-gradient src→dst: src's batch at dst's model, which crosses the reverse
        link in the clear in the same round (``model`` message dst→src)."""
        params = view.get(t, dst, src, "model")
        return self.make_observation(view, params, view.get(t, src, dst, "cg"), **kw)

    def observe_model_step(self, view: View, t: int, src: int, dst: int) -> Observation:
        """(x^i_{t-1} − x^i_t)/η at x^i_{t-1}, from two consecutive ``model`` messages; mixing
        and momentum are ignored (an approximation)."""
        x_prev = view.get(t, src, dst, "model")
        target = (x_prev - view.get(t + 1, src, dst, "model")) / view.public["params"]["lr"]
        return self.make_observation(view, x_prev, target, meta={"exact": False})

    @staticmethod
    def momentum_step(view: View, kind: str, t: int, src: int, dst: int, beta: float) -> Tensor:
        """ṽ_t − β ṽ_{t-1}, the momentum's new gradient term (exact at t = 1, else with
        v_{t-1} ≈ ṽ_{t-1}); ṽ is the ``mm`` message, or (x_{s-1} − x̃_s)/η from the ``model``
        and ``half-model`` messages."""
        lr = view.public["params"]["lr"]

        def v(s: int) -> Tensor:
            if kind == "mm":
                return view.get(s, src, dst, "mm")
            return (view.get(s, src, dst, "model") - view.get(s, src, dst, "half-model")) / lr

        return v(t) - beta * v(t - 1) if t > 1 else v(t)

    @staticmethod
    def make_observation(view: View, params: Tensor, target: Tensor, **kw: Any) -> Observation:
        pub = view.public
        model = build_model(pub["model"], pub["input_shape"], pub["num_classes"])
        spec = ParamSpec.of(model)
        meta = {"threat": view.threat, **kw.pop("meta", {})}
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
            **kw,
        )
