"""The one round loop: restore the agents to a round, step a round, checkpoint.

Every driver of a defense goes through :class:`RoundLoop` — the simulator
(:meth:`privaudit.sim.run.Run.simulate`), each torch.distributed rank (which runs the same
``simulate`` over its own agent) and the white-box and one-run audits
(:mod:`privaudit.experiments.audit`), which step rounds with canary gradients in the context:

- :meth:`RoundLoop.restore` puts the held agents' state and generators back as they were
  after round ``t`` (round 0: the defense's ``init`` and the seeds of
  :func:`~privaudit.core.context.agent_seed`);
- :meth:`RoundLoop.sample` draws a round's Poisson batches from the agents' generators;
- :meth:`RoundLoop.step` runs the defense's round ``t`` over a network, whose tap records
  what crosses the links; with ``stop_after`` it ends the round as soon as those messages
  have all crossed (an audit trial needs one message, not the rest of the round);
- :meth:`RoundLoop.checkpoint` writes the state and the generators' states.

A round either finishes with a finite state or raises :class:`RoundFailed`, one line: when
the defense's own code raises (:func:`calling` names the defense, where it came from, the
round and the exception, chained ``from`` it), or when a state tensor of the round (or of a
restored checkpoint) holds NaN or ±inf — the settings diverge, so the run cannot continue
with them (:data:`NO_RESUME`) and no accuracy of a non-finite model is ever reported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from privaudit.core.context import Context, State, agent_seed
from privaudit.core.errors import PrivauditError
from privaudit.core.network import Network
from privaudit.defenses import Defense
from privaudit.plugins import origin
from privaudit.sim.rundir import RunDir

Message = tuple[int, int, str]  # (src, dst, kind) of one round

# what a failure says when rerunning the same settings meets it again (a divergence)
NO_RESUME = "the run cannot continue with these settings"
SHOWN = 10  # agents named in a line, at most
CHECK_ELEMENTS = 2**22  # elements per isfinite test of the state (4 MB of booleans)


class RoundFailed(PrivauditError):
    """A round could not finish: the defense raised, or the state became non-finite.
    ``resumable``: whether the run's earlier checkpoints can still take it further (after
    the defense is fixed); a divergence is not (:data:`NO_RESUME`)."""

    def __init__(self, message: str, resumable: bool):
        super().__init__(message)
        self.resumable = resumable


class _RoundEnded(BaseException):
    """Raised by the network hook once the watched messages have crossed; caught by
    :meth:`RoundLoop.step` alone (a BaseException, so that neither :func:`calling` nor a
    defense's own ``except Exception`` takes it for a failure)."""


@contextmanager
def calling(defense: Defense, method: str, t: int) -> Iterator[None]:
    """Run a call of ``defense``'s ``method`` ("init", "round", "observe") for round ``t``
    (0: before round 1): an exception its code raises becomes one :class:`RoundFailed` line
    naming the defense, where it came from (a plugin's file or entry point, or privaudit),
    the round and the exception, raised ``from`` it (a debug mode prints its traceback).
    A :class:`PrivauditError` (a clear error already) and what is no bug of the defense —
    an interrupt, running out of memory — pass unchanged."""
    try:
        yield
    except (PrivauditError, MemoryError, torch.cuda.OutOfMemoryError):
        raise
    except Exception as e:
        text = (str(e).strip().splitlines() or [""])[0][:200]
        when = f"in round {t}" if t else "before round 1"
        raise RoundFailed(
            f"{_described(defense)} failed {when}: its {method}() raised {type(e).__name__}: "
            f"{text}; {_who_fixes(defense)} (PRIVAUDIT_DEBUG=1 prints the traceback)",
            resumable=True,
        ) from e


def _described(defense: Defense) -> str:
    """The defense and where it came from, for an error line: ``defense 'x' (plugin F)``."""
    return f"defense {defense.name!r} ({origin('defense', defense.name)})"


def _who_fixes(defense: Defense) -> str:
    """Who fixes a failure of ``defense``'s own code: its plugin's author, or privaudit's."""
    plugin = origin("defense", defense.name).startswith("plugin")
    return "fix the plugin" if plugin else "report it as a privaudit bug"


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
            with calling(self.defense, "init", 0):
                state = self.defense.init(ctx, self.params)
            self.check_shapes(state, None, "init", 0)
            return state
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
        state = {
            k.removeprefix("state."): (v if whole or v.dim() == 0 else v[rows]).to(ctx.device)
            for k, v in blob.items()
            if k.startswith("state.")
        }
        self.check_finite(
            state, f"the checkpoint of round {t} in {path} is of a diverged run or edited"
        )
        return state

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
        needed = [(t, s, d, k) for s, d, k in stop_after or ()]

        def check() -> None:
            if all(key in net.tap.messages for key in needed):
                raise _RoundEnded

        net.after_send = check if needed else None
        before = {k: tuple(v.shape) for k, v in state.items()}  # what the next state must be
        try:
            with calling(self.defense, "round", t):
                state = self.defense.round(self.ctx, self.params, state, net, batch)
        except _RoundEnded:
            return Step(None, True)
        finally:
            net.after_send = None
        self.check_shapes(state, before, "round", t)
        lr = getattr(self.params, "lr", None)
        at = f" at lr={lr:g}" if isinstance(lr, (int, float)) else ""
        self.check_finite(state, f"round {t}: {self.defense.name} diverged{at}")
        return Step(state, False)

    def check_shapes(
        self, state: Any, before: dict[str, tuple[int, ...]] | None, method: str, t: int
    ) -> None:
        """Raise :class:`RoundFailed` naming the defense (and its plugin) unless ``state``,
        what its ``method`` ("init" or "round") returned for round ``t``, is a state: a dict
        of tensors, each a scalar shared by all agents or one row per held agent — and, after
        a round, the keys and shapes of the state it was handed (``before``). A state of
        another shape would fail later, in the checkpoint or the next round, as a privaudit
        bug."""
        when = f"in round {t}" if t else "before round 1"
        if not (isinstance(state, dict) and all(isinstance(v, Tensor) for v in state.values())):
            problem = f"returned a {type(state).__name__}, not a dict of tensors (the state)"
        elif before is not None and {k: tuple(v.shape) for k, v in state.items()} != before:
            got = {k: tuple(v.shape) for k, v in state.items()}
            diff = sorted(k for k in set(got) | set(before) if got.get(k) != before.get(k))
            k = diff[0]
            problem = (
                f"returned a state whose {k!r} is "
                f"{'missing' if k not in got else f'of shape {list(got[k])}'}, where the state "
                f"it was handed has {'none' if k not in before else f'shape {list(before[k])}'}"
            )
        elif before is not None:
            return
        else:
            rows = self.ctx.n_held
            bad = sorted(k for k, v in state.items() if v.dim() and v.shape[0] != rows)
            if not bad:
                return
            k = bad[0]
            problem = (
                f"returned a state whose {k!r} has {state[k].shape[0]} rows (shape "
                f"{list(state[k].shape)}), not one per agent ({rows})"
            )
        raise RoundFailed(
            f"{_described(self.defense)} failed {when}: its {method}() {problem}; "
            f"{_who_fixes(self.defense)}",
            resumable=True,
        )

    def check_finite(self, state: State, what: str) -> None:
        """Raise :class:`RoundFailed` unless every tensor of ``state`` (rows: the held agents)
        is finite; the line starts with ``what`` ("round 3: nd diverged at lr=…"). One
        reduction per slice of at most :data:`CHECK_ELEMENTS` elements (the test's boolean
        temporaries stay small: a (k, D) one is 180 MB for 16 ResNet-18 rows) and one
        synchronisation in all: cheap beside a round."""
        finite = [
            torch.isfinite(part).all()
            for v in state.values()
            for part in v.reshape(-1).split(CHECK_ELEMENTS)
        ]
        if not finite or bool(torch.stack(finite).all()):
            return
        agents, rows, keys = self.ctx.agents, set(), []
        for k, v in state.items():
            bad = ~torch.isfinite(v)
            if not bad.any():
                continue
            keys.append(k)
            if v.dim() == 0:  # shared by every agent
                rows |= set(range(len(agents)))
            else:
                rows |= set(bad.reshape(len(v), -1).any(1).nonzero().flatten().tolist())
        named = [str(agents[r]) for r in sorted(rows)]
        more = f", … ({len(named)} agents)" if len(named) > SHOWN else ""
        raise RoundFailed(
            f"{what}: the state of agent(s) "
            f"{', '.join(named[:SHOWN])}{more} is not finite (NaN or ±inf in {', '.join(keys)}); "
            f"{NO_RESUME}: choose a smaller step size (--lr or -p lr)",
            resumable=False,
        )
