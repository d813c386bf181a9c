"""The engine's vocabulary: a round's Context, the agents' State, their seeds and a defense's
parameters — what a defense computes with, shared by the simulator and the torch.distributed
ranks.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from privaudit.core import sampling, schema
from privaudit.core.errors import PrivauditError
from privaudit.core.params import ParamSpec


class Gradients(Protocol):
    """What a round asks of the per-example gradient engine (:class:`privaudit.grads.PairGrads`
    implements it): per pair p of (parameters ``flat[p]``, batch ``x[p]``, ``y[p]``), the batch
    mean over the expected batch size, the per-example gradients, and the clipped mean;
    ``max_memory``: the working-memory budget in bytes (None: from what is free)."""

    max_memory: int | None

    def mean(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor: ...

    def per_example(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor: ...

    def clipped_mean(
        self, flat: Tensor, x: Tensor, y: Tensor, clip: float | None, owner: Tensor | None = None
    ) -> Tensor: ...


State = dict[str, Tensor]


class Consumed(dict):
    """A state handed to :meth:`privaudit.defenses.Defense.round` by a caller that drops it:
    the caller never reads its tensors again, so the round may write the next state into
    them rather than beside them (a second copy of the state: for 16 ResNet-18 agents with
    momentum, 1.4 GB). The simulator's round loop hands its state so; the audits, which step
    one state more than once, do not."""


def agent_seed(seed: int, agent: int) -> int:
    """The 64-bit seed of agent ``agent``'s generator in a run seeded ``seed``: the first 8
    bytes of SHA-256("privaudit:<seed>:<agent>"), so streams are independent across agents
    and identical in every engine (the simulator and agent's own rank)."""
    digest = hashlib.sha256(f"privaudit:{seed}:{agent}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


@dataclass
class Context:
    """Everything a round computes with: model, data shards, graph, randomness — for the
    agents this process holds (``agents``: all N in the simulator, one per rank).

    Randomness is per agent: ``generators[r]`` (seeded by :func:`agent_seed`) draws held
    agent ``agents[r]``'s batches and the noise of every row it owns, in a fixed order, so
    a rank holding one agent reproduces the simulator's draws for that agent exactly."""

    model: nn.Module
    spec: ParamSpec
    grads: Gradients
    x0: Tensor  # shared initial model (D,) — public
    train_x: Tensor  # (n, C, H, W), normalised
    train_y: Tensor
    parts: list[Tensor]  # held agent r's indices into train_x
    adj: Tensor  # the whole graph (N, N) — public
    W: Tensor  # the whole mixing matrix (N, N) — public
    batch_size: int
    generators: list[torch.Generator]  # one per held agent
    device: torch.device
    holdout: list[Tensor] = field(default_factory=list)  # held agent r's validation indices
    # a public validation set drawn from the test split, shared by every agent (normalised
    # like train_x) and left out of the run's test accuracy; None when the defense uses none
    val_x: Tensor | None = None
    val_y: Tensor | None = None
    agents: list[int] | None = None  # global ids of the held agents, ascending (None: all)

    def __post_init__(self) -> None:
        if self.agents is None:
            self.agents = list(range(self.n))

    @property
    def n(self) -> int:
        """Agents in the run (N), held here or not."""
        return self.adj.shape[0]

    @property
    def n_held(self) -> int:
        """Agents held by this process: the rows of every state tensor."""
        return len(self.agents)

    def sample(self) -> Tensor:
        """One round's Poisson batches of the held agents (:mod:`privaudit.core.sampling`): each
        example of agent r's shard kept with probability q_r = B/n_r, drawn from the agent's
        own generator; a padded index tensor ``(n_held, W)``, :data:`~privaudit.core.sampling.PAD`
        in padded slots. B (``batch_size``) is the expected size, the denominator of every
        batch mean."""
        return sampling.pad(
            [
                sampling.poisson(part, sampling.rate(self.batch_size, len(part)), gen)
                for part, gen in zip(self.parts, self.generators, strict=True)
            ]
        )

    def gather(self, index: Tensor) -> tuple[Tensor, Tensor]:
        """The inputs and labels of a padded ``index`` (:func:`privaudit.core.sampling.gather`)."""
        return sampling.gather(index, self.train_x, self.train_y)

    def draw(self, owner: Tensor | None, fn: Callable[[torch.Generator, int], Tensor]) -> Tensor:
        """Random rows, each from its owner's generator: ``owner[r]`` is the held agent
        (local row) that owns row r (None: row r is agent r's). Agent a's ``c`` rows come from
        one call ``fn(generator_a, c)`` and keep their order, so the draws do not depend on
        which other agents share the process. A loop over agents, not over rows."""
        if owner is None:
            return torch.cat([fn(g, 1) for g in self.generators])
        counts = torch.bincount(owner, minlength=len(self.generators)).tolist()
        parts = [fn(g, c) for g, c in zip(self.generators, counts, strict=True) if c]
        if not parts:
            raise ValueError("draw needs at least one row")
        # the draws in agent order, then each row to its place: one gather, no scatter
        return torch.cat(parts).index_select(0, torch.argsort(torch.argsort(owner, stable=True)))

    def gaussian(self, owner: Tensor | None, *shape: int) -> Tensor:
        """N(0, 1) rows of shape ``shape``, row r from agent ``owner[r]``'s generator."""
        return self.draw(
            owner, lambda g, c: torch.randn(c, *shape, generator=g, device=self.device)
        )

    def gaussian_rows(self, owner: Tensor, *shape: int) -> GaussianRows:
        """The rows of :meth:`gaussian` one at a time, on demand (:class:`GaussianRows`)."""
        return GaussianRows(self, owner, shape)


class GaussianRows:
    """The rows of :meth:`Context.gaussian` handed out one at a time, in any order
    (:meth:`Context.gaussian_rows`): agent a's rows are drawn by the same one call as
    :meth:`Context.gaussian` when the first of them is asked for, and each row is freed
    once taken. The numbers do not depend on the order rows are asked for (every agent has
    its own generator); only the rows drawn and not yet taken are alive."""

    def __init__(self, ctx: Context, owner: Tensor, shape: tuple[int, ...]):
        self.ctx, self.shape = ctx, shape
        self.owner = owner.tolist()
        self.pending: dict[int, Tensor] = {}

    def take(self, row: int) -> Tensor:
        """Row ``row``'s draws (shape ``shape``); each row can be taken once."""
        if row not in self.pending:
            a = self.owner[row]
            rows = [r for r, o in enumerate(self.owner) if o == a]
            g = self.ctx.generators[a]
            block = torch.randn(len(rows), *self.shape, generator=g, device=self.ctx.device)
            self.pending.update({r: b.clone() for r, b in zip(rows, block, strict=True)})
            del block
        return self.pending.pop(row)


def params_of(cls: type, overrides: dict[str, Any]) -> Any:
    """Build a params dataclass from ``overrides``, rejecting unknown names, values of the
    wrong type (each coerced to its field's annotation by :mod:`privaudit.core.schema`, for the
    CLI's ``-p`` and a run directory's config alike) and, by its ``validate``, bad values."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    bad = sorted(set(overrides) - set(fields))
    if bad:
        raise PrivauditError(
            f"unknown parameter(s) {', '.join(bad)}; valid: {', '.join(sorted(fields))}"
        )
    obj = cls(**schema.coerce_all(overrides, schema.hints(cls)))
    check = getattr(obj, "validate", None)
    if check:
        check()
    return obj
