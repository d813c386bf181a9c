"""Copies of a run: its defense at its operating point, simulated again in this process.

A *copy* of a run is the run's round loop (:class:`~privaudit.sim.loop.RoundLoop`: its
defense, resolved parameters, seed and checkpoints; ``run.loop``) over a context of the
run's — the run's own, or one with something replaced: canary gradients, fresh generators,
other shards, the disjoint union of several copies of the graph — on an in-process network
(:func:`network`) whose tap records the messages the caller selects. The caller restores the
state to start from (a checkpoint, the defense's ``init``) and names the rounds; each round's
batch is drawn from the context's generators or fixed beforehand. A copy never writes to the
run directory.

Who simulates copies, each keeping only what is its own (which messages it records, how it
reseeds, where its canary goes):

- the white-box audit's trials (:mod:`privaudit.experiments.audit_trials`): round t and the
  rounds its span observes, on fixed batches, with fresh noise and a canary per trial;
- the one-run audit (same module): the whole run again from its seeds, its canaries drawn
  round by round;
- the final-model audit (:mod:`privaudit.experiments.final_audit`): the whole run on fixed
  batches, the canary in every round;
- the membership reference runs (:mod:`privaudit.api.model_membership`): K runs as one copy over
  the disjoint union of K copies of the graph.

The run itself (:meth:`privaudit.sim.run.Run.simulate`) steps the same loop over the same
network (:func:`network`) but is no copy: it writes checkpoints, secrets and messages, stops
at a Ctrl-C on a round boundary every rank agrees on, hands each round its state to
overwrite, and under torch.distributed runs over a rank's network instead.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from torch import Tensor

from privaudit.core.context import Context, State
from privaudit.core.messages import CaptureSpec, Tap
from privaudit.core.network import SimNetwork
from privaudit.sim.loop import Message, RoundLoop, Step

Batch = tuple[Tensor, Tensor]  # a round's padded inputs and labels, one row per held agent
Key = tuple[int, int, int, str]  # (round, src, dst, kind) of a recorded message


def network(ctx: Context, capture: CaptureSpec | None = None) -> SimNetwork:
    """The in-process network over ``ctx``'s graph, on its device, whose tap records the
    messages ``capture`` selects (None: none)."""
    return SimNetwork(ctx.adj, ctx.W, Tap(capture)).to(ctx.device)


@dataclass(frozen=True)
class Copy:
    """One copy of a run (module docstring): ``loop`` over its context, on ``net``."""

    loop: RoundLoop
    net: SimNetwork

    @classmethod
    def of(cls, loop: RoundLoop, capture: CaptureSpec | None = None) -> Copy:
        """``loop`` (the run's ``run.loop``, or ``run.loop.with_ctx(ctx)``) on a new
        network over its context's graph, recording what ``capture`` selects (None: none)."""
        return cls(loop, network(loop.ctx, capture))

    @property
    def ctx(self) -> Context:
        return self.loop.ctx

    @property
    def tap(self) -> Tap:
        return self.net.tap

    def with_ctx(self, ctx: Context) -> Copy:
        """This copy with another context over the same graph (canary gradients, other
        generators), on the same network and tap."""
        return Copy(self.loop.with_ctx(ctx), self.net)

    def restore(self, t: int) -> State:
        """The state after round ``t`` (:meth:`RoundLoop.restore`: a checkpoint of the run,
        or its ``init`` at 0), the generators set back with it."""
        return self.loop.restore(t)

    def messages(self) -> dict[Key, Tensor]:
        """The payloads the tap holds, by (round, src, dst, kind)."""
        return {k: m.payload for k, m in self.tap.messages.items()}

    def simulate(
        self,
        state: State,
        rounds: Iterable[int],
        *,
        batches: Callable[[int], Batch] | None = None,
        before: Callable[[int, Batch], None] | None = None,
        after: Callable[[int, Step], None] | None = None,
        stop_after: Collection[Message] | None = None,
    ) -> State | None:
        """Step ``rounds`` (ascending, consecutive) from ``state`` and return the state after
        the last. Round t's batch is ``batches(t)`` (default: drawn from the context's
        generators, :meth:`RoundLoop.sample`); ``before(t, batch)`` runs just before the
        round, ``after(t, step)`` just after. The tap keeps what it records (the caller
        clears it). ``stop_after``: end the last round once these of its messages have
        crossed (:meth:`RoundLoop.step`), and return None: the rest of it did not run."""
        rounds = list(rounds)
        for t in rounds:
            batch = self.loop.sample()[1] if batches is None else batches(t)
            if before is not None:
                before(t, batch)
            stop = stop_after if t == rounds[-1] else None
            step = self.loop.step(state, t, self.net, batch, stop_after=stop)
            state = step.state
            if after is not None:
                after(t, step)
        return state
