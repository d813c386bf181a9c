"""The drift forecast of a run's tied attack: the coalition re-runs the training from what it
recovered (:mod:`privaudit.attacks.gossip_drift`, El Mrini, Cyffers & Bellet's setting).

:func:`privaudit.api.gossip.observe_beyond` with ``tie=True`` solves the tied system, then
hands this forecast to :func:`~privaudit.attacks.gossip_drift.solve_tied`: the run is
re-simulated through the defense's own recursion from the public x_0, with

- the members' states the messages they sent (what they hold, exactly);
- each victim whose recovered gradient is within ``trust`` of one example's — the rank-one
  residual ‖∂W − ∂b xᵀ‖²/‖∂W‖² of the model's first Linear layer — computing its gradient
  afresh at its simulated model every round, on its example inverted in closed form
  (:func:`privaudit.attacks.analytic.recover`) with its label inferred from the same
  gradient (:func:`privaudit.attacks.labels.infer_labels`), through the run's own gradient
  engine (``ctx.grads``, clipped as the recursion states);
- every other recovered agent held at its tied gradient; the rest at 0.

It applies where the coalition can re-run the training: the messages of every round from
x_0 on, one example per agent and a first Linear layer (:func:`applies` says why not).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from privaudit.attacks.analytic import recover
from privaudit.attacks.disaggregation import inputs_from_images
from privaudit.attacks.gossip_drift import resimulate
from privaudit.attacks.labels import infer_labels
from privaudit.core.errors import PrivauditError
from privaudit.core.observation import Observation
from privaudit.core.recursion import Recursion
from privaudit.sim.run import Run


def applies(run: Run, first: int) -> str | None:
    """None where the run's tied attack can forecast its drift, else why not (a phrase)."""
    if first > 0:
        return "the window starts after round 0 (rounds_back), so x_0 does not start it"
    sizes = {len(p) for p in run.ctx.parts}
    if sizes != {1}:
        return f"agents hold {max(sizes)} examples, and only one example's gradient inverts"
    return None


class RunForecast:
    """The :data:`~privaudit.attacks.gossip_drift.Forecast` of a run (module docstring).

    ``observation(g)``: the Observation of a recovered gradient ``g`` at x_0 (the defense's
    own, so its mean/std and shapes are the run's); ``states``: (member, round) → the message
    it sent (the carried component); ``rounds``: the recursion's rounds used from x_0."""

    def __init__(
        self,
        run: Run,
        rec: Recursion,
        rounds: int,
        observation: Callable[[Tensor], Observation],
        states: Mapping[tuple[int, int], np.ndarray],
    ) -> None:
        self.run, self.rec, self.rounds = run, rec, rounds
        self.observation, self.states = observation, states
        self.x0 = run.ctx.x0.detach().cpu().double().numpy()
        self.clip = rec.facts.get("clip")
        self.inverted: dict[int, tuple[float, Tensor, Tensor]] = {}  # agent → (residual, x, y)
        self.seen: dict[int, np.ndarray] = {}  # the gradients ``inverted`` was taken from

    def example(self, v: int, g: np.ndarray) -> tuple[float, Tensor, Tensor]:
        """Agent v's example inverted from its recovered gradient: (rank-one residual, the
        normalised input (1, *shape), its label (1,)); residual ∞ where the model's first
        layer does not invert."""
        obs = self.observation(torch.from_numpy(np.ascontiguousarray(g)))
        try:
            images, residual = recover(obs)
        except PrivauditError:
            return float("inf"), torch.empty(0), torch.empty(0)
        x = inputs_from_images(obs, images.cpu()).reshape(1, *obs.input_shape)
        return residual, x, infer_labels(obs, "counts").reshape(1).cpu()

    def __call__(
        self, got: Mapping[int, np.ndarray], trust: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """The run re-simulated from ``got`` at ``trust`` (class docstring): every agent's
        update and the states (:func:`~privaudit.attacks.gossip_drift.resimulate`)."""
        self.inverted = {
            v: self.inverted[v] if v in self.inverted and self.seen[v] is g else self.example(v, g)
            for v, g in got.items()
        }
        self.seen = dict(got)
        agents = [v for v in got if self.inverted[v][0] <= trust]
        held = {v: g for v, g in got.items() if v not in agents}
        return resimulate(self.rec, self.rounds, self.x0, held, self.gradient, agents, self.states)

    def gradient(self, agents: Sequence[int], points: np.ndarray, t: int) -> np.ndarray:
        """The forecast agents' round-t gradients at ``points``: the run's own engine on
        their inverted examples."""
        ctx = self.run.ctx
        flat = torch.from_numpy(points).to(device=ctx.device, dtype=ctx.x0.dtype)
        x = torch.stack([self.inverted[v][1] for v in agents]).to(flat)
        y = torch.stack([self.inverted[v][2] for v in agents]).to(ctx.device)
        g = ctx.grads.clipped_mean(flat, x, y, self.clip)
        return g.detach().cpu().double().numpy()
