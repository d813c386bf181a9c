"""The one round loop: restore the agents to a round, step a round, checkpoint.

Every driver of a defense goes through :class:`RoundLoop` — the simulator
(:meth:`privaudit.sim.run.Run.simulate`), each torch.distributed rank (which runs the same
``simulate`` over its own agent) and the white-box and one-run audits
(:mod:`privaudit.eval.audit`), which step rounds with canary gradients in the context:

- :meth:`RoundLoop.restore` puts the held agents' state and generators back as they were
  after round ``t`` (round 0: the defense's ``init`` and the seeds of
  :func:`~privaudit.core.context.agent_seed`);
- :meth:`RoundLoop.sample` draws a round's Poisson batches from the agents' generators;
- :meth:`RoundLoop.step` runs the defense's round ``t`` over a network, whose tap records
  what crosses the links; with ``stop_after`` it ends the round as soon as those messages
  have all crossed (an audit trial needs one message, not the rest of the round);
- :meth:`RoundLoop.checkpoint` writes the state and the generators' states.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from privaudit.core.context import Context, State, agent_seed
from privaudit.core.errors import PrivauditError
from privaudit.core.network import Network
from privaudit.defenses import Defense
from privaudit.sim.rundir import RunDir

Message = tuple[int, int, str]  # (src, dst, kind) of one round


class _RoundEnded(Exception):
    """Raised by the network hook once the watched messages have crossed; caught by
    :meth:`RoundLoop.step` alone."""


@dataclass(frozen=True)
class Step:
    """The outcome of :meth:`RoundLoop.step`: the state after the round, or — when the round
    was ended early (``stop_after``) — None, since the rest of the round did not run."""

    state: State | None
    ended_early: bool


@dataclass(frozen=True)
class RoundLoop:
    """A defense with its parameters over the agents ``ctx`` holds, its checkpoints in
    ``store``. Replace ``ctx`` (``dataclasses.replace(loop, ctx=…)``, or :meth:`with_ctx`) to
    step with other gradients or generators, as the audits do."""

    defense: Defense
    params: Any
    ctx: Context
    seed: int
    store: RunDir

    def with_ctx(self, ctx: Context) -> RoundLoop:
        return dataclasses.replace(self, ctx=ctx)

    # -- restore and checkpoint ------------------------------------------------------------
    def restore(self, t: int) -> State:
        """The held agents' state after round ``t`` and their generators as they were then."""
        ctx = self.ctx
        if t == 0:
            for a, g in zip(ctx.agents, ctx.generators, strict=True):
                g.manual_seed(agent_seed(self.seed, a))
            return self.defense.init(ctx, self.params)
        blob = self.store.load_checkpoint(t)
        path = self.store.path / "checkpoints"
        for a, g in zip(ctx.agents, ctx.generators, strict=True):
            if f"rng.{a}" not in blob:
                raise PrivauditError(
                    f"checkpoint round {t} in {path} has no RNG state for agent {a} (an older "
                    "privaudit wrote it); delete that folder and train again"
                )
            g.set_state(blob[f"rng.{a}"])
        rows = torch.tensor(ctx.agents)
        whole = ctx.n_held == ctx.n
        return {
            k.removeprefix("state."): (v if whole or v.dim() == 0 else v[rows]).to(ctx.device)
            for k, v in blob.items()
            if k.startswith("state.")
        }

    def rng_states(self) -> dict[str, Tensor]:
        """The held agents' generator states, keyed as a checkpoint stores them."""
        held = zip(self.ctx.agents, self.ctx.generators, strict=True)
        return {f"rng.{a}": g.get_state() for a, g in held}

    @staticmethod
    def checkpoint(store: RunDir, t: int, state: State, rngs: dict[str, Tensor]) -> None:
        """Write round ``t``'s ``state`` and the generator states ``rngs`` to ``store``."""
        store.save_checkpoint(t, {**{f"state.{k}": v for k, v in state.items()}, **rngs})

    # -- one round -------------------------------------------------------------------------
    def sample(self) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """This round's padded Poisson batch indices of the held agents and their data."""
        index = self.ctx.sample()
        return index, self.ctx.gather(index)

    def step(
        self,
        state: State,
        t: int,
        net: Network,
        batch: tuple[Tensor, Tensor],
        stop_after: Collection[Message] | None = None,
    ) -> Step:
        """Run round ``t`` of the defense on ``batch`` over ``net`` (its tap records the
        messages). ``stop_after``: end the round once every one of these messages of round
        ``t`` is in the tap (``ended_early``; the state is then incomplete and not given)."""
        net.round = t
        if not stop_after:
            return Step(self.defense.round(self.ctx, self.params, state, net, batch), False)
        needed = [(t, s, d, k) for s, d, k in stop_after]

        def check() -> None:
            if all(key in net.tap.messages for key in needed):
                raise _RoundEnded

        net.after_send = check
        try:
            return Step(self.defense.round(self.ctx, self.params, state, net, batch), False)
        except _RoundEnded:
            return Step(None, True)
        finally:
            net.after_send = None
