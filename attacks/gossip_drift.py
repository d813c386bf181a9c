"""The tied approximation's drift, forecast and taken out of the rows.

El Mrini, Cyffers & Bellet (ICML 2024, §5) solve D-GD's messages as if every agent's
gradient were the same in every round (:func:`~privaudit.attacks.gossip_algebra.tie`). In a
run it drifts with the agent's model, g_k^t = g_k^1 + o_(k,t), first order in the step size,
and the tie's error is Σ (rᵀK)_(k,t) o_(k,t), times an estimator gain that grows
geometrically with the victim's distance. A coalition that can re-run the training from what
it recovered can predict o: it re-simulates the run (:func:`resimulate`) with each recovered
agent's gradient held at its tied value, except the agents it can forecast, whose gradient it
computes afresh at their simulated model every round; subtracting the forecast drift's part
of the rows (:func:`~privaudit.attacks.gossip_algebra.drift_shift`, K o over the untied
system's columns) leaves the tied system exactly where the forecast is right, and the tied
system is solved again (:func:`solve_tied`).

Which agents a coalition can forecast is the caller's (:data:`Forecast`): in El Mrini et al.'s
setting, the members from their own messages and the victims whose recovered gradient is
within a ``trust`` of one example's (its example then inverted in closed form). A forecast
is kept only while it explains the messages better than the pass before (least-squares
misfit of the tied system), so one that explains the run worse than the tie alone is never
used.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privaudit.core.recursion import Key, Recursion

from .gossip_algebra import (
    Identifiability,
    LinearSystem,
    Recovery,
    drift_shift,
    relative_error,
    solve,
)

TRUSTS = (1e-3, 1.0)  # rank-one residuals up to which a victim's own drift is forecast
PASSES = 3  # re-solves with the drift forecast from the previous pass

# (recovered tied gradients by agent, trust) ↦ the forecast drift o_(k,t), keyed as the untied
# system's unknowns
Forecast = Callable[[Mapping[int, np.ndarray], float], Mapping[Key, np.ndarray]]


@dataclass
class Drifted:
    """What :func:`solve_tied` settled on.

    got:      agent → its recovered tied gradient (those within ``max_error``).
    errors:   agent → the relative rounding error of its recovered gradient.
    shift:    (R × d) the forecast drift's part of the rows, subtracted before the last solve
              (zeros: the tie alone).
    offsets:  the forecast drift behind ``shift`` ({}: none used).
    trust:    the ``trusts`` entry whose forecast was kept (None: none).
    misfits:  the least-squares misfit of each accepted pass (empty without a forecast).
    recovery: the last solve.
    """

    got: dict[int, np.ndarray]
    errors: dict[int, float]
    shift: np.ndarray
    offsets: Mapping[Key, np.ndarray] = field(default_factory=dict)
    trust: float | None = None
    misfits: list[float] = field(default_factory=list)
    recovery: Recovery | None = None


def solve_tied(
    system: LinearSystem,
    untied: LinearSystem,
    observed: np.ndarray,
    known: Callable[[Key], Any],
    analysis: Identifiability,
    keys: Sequence[Key],
    reference: Any = None,
    forecast: Forecast | None = None,
    trusts: Sequence[float] = TRUSTS,
    passes: int = PASSES,
    max_error: float | None = 1.0,
) -> Drifted:
    """The tied ``system``'s identifiable ``keys`` (each an agent's update), solved on the
    ``observed`` rows (R × d) with ``known`` values around ``reference``
    (:func:`~privaudit.attacks.gossip_algebra.solve`); an agent whose estimated rounding error
    is at least ``max_error`` times its RMS is left out (None: kept). With a ``forecast``,
    up to ``passes`` re-solves, each with the drift it forecasts from the previous pass's
    gradients subtracted (:func:`~privaudit.attacks.gossip_algebra.drift_shift` over the
    ``untied`` system): of its forecasts, one per ``trusts``, the one whose tied system fits
    the messages best (the least-squares misfit ‖y − K K⁺ y‖), and only while that misfit
    falls."""
    shift = np.zeros((len(system.rows), 1))
    out = Drifted({}, {}, shift)
    dense = system.K.toarray() if forecast is not None else None

    def misfit(shift: np.ndarray) -> float:
        y = system.rhs(observed - shift, known, reference=reference)
        return float(np.linalg.norm(y - dense @ np.linalg.lstsq(dense, y, rcond=None)[0]))

    for _ in range(1 + (passes if forecast is not None else 0)):
        trust, offsets = None, {}
        if forecast is not None:
            candidates = [(None, {}, shift)]
            if out.got:
                candidates = []
                for u in trusts:
                    o = forecast(out.got, u)
                    candidates.append((u, o, drift_shift(untied, o)))
            miss, trust, offsets, shift = min(
                ((misfit(s), u, o, s) for u, o, s in candidates), key=lambda c: c[0]
            )
            if out.misfits and miss >= out.misfits[-1]:
                break  # no forecast explains the messages better: the previous pass stands
            out.misfits.append(miss)
        rec = solve(
            system, observed - shift, known, analysis=analysis, keys=keys, reference=reference
        )
        assert rec.float_error is not None
        rel = relative_error(rec.values, rec.float_error)
        out.got, out.errors = {}, {}
        for i, key in enumerate(rec.keys):
            if max_error is None or rel[i] < max_error:
                out.got[key[1]] = rec.values[i]
                out.errors[key[1]] = float(rel[i])
        out.shift, out.offsets, out.trust, out.recovery = shift, offsets, trust, rec
    return out


def resimulate(
    rec: Recursion,
    rounds: int,
    x0: np.ndarray,
    held: Mapping[int, np.ndarray],
    gradient: Callable[[Sequence[int], np.ndarray, int], np.ndarray],
    forecast: Sequence[int] = (),
    states: Mapping[tuple[int, int], np.ndarray] | None = None,
) -> np.ndarray:
    """Every agent's update in rounds 1..``rounds`` (rounds, n, d), the recursion run forward
    from the public x_0 (every initial state x_0): ``forecast`` agents' update is
    ``gradient(agents, points, t)`` at their model :attr:`Recursion.point` of the simulated
    states (points: (len(agents), d)); a ``held`` agent's is its given vector every round; any
    other's is 0. ``states``: (agent, round) → a state the coalition knows (the message it
    sent, one carried component), written over the simulated one — its members' part of the
    run, exact. Noise inputs are 0. Only the update kind (:attr:`Recursion.update`) is
    simulated."""
    n, d = rec.n, x0.size
    s = np.zeros((rounds + 1, rec.S, d))
    s[0] = x0.reshape(1, -1)
    u = np.zeros((rounds, n, d))
    col = rec.inputs.index(rec.update) * n
    carried = rec.component(next(iter(rec.carries.values()))) * n if rec.carries else 0
    for k, g in held.items():
        u[:, k] = g.reshape(-1)
    agents = list(forecast)
    for t in range(1, rounds + 1):
        if agents:
            points = np.zeros((len(agents), d))
            for i, k in enumerate(agents):
                for (c, j, idx), w in rec.point(t, k).items():
                    points[i] += w * s[idx, rec.component(c) * n + j]
            u[t - 1, agents] = gradient(agents, points, t)
        A, B = rec.step(t)
        s[t] = A @ s[t - 1]
        if B is not None:
            inputs = np.zeros((rec.P, d))
            inputs[col : col + n] = u[t - 1]
            s[t] += B @ inputs
        for (k, r), value in (states or {}).items():
            if r == t:
                s[t, carried + k] = value.reshape(-1)
    return u


def offsets(rec: Recursion, updates: np.ndarray, agents: Sequence[int]) -> dict[Key, np.ndarray]:
    """The drift o_(k,t) = u_k^t − u_k^1 of ``agents`` in ``updates`` (rounds, n, d), keyed as
    the untied system's unknowns (:func:`~privaudit.attacks.gossip_algebra.drift_shift`)."""
    T = updates.shape[0]
    return {
        (rec.update, k, t): updates[t - 1, k] - updates[0, k]
        for k in agents
        for t in range(2, T + 1)
    }
