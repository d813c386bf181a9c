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
within a ``trust`` of one example's (its example then inverted in closed form). Every solve
is checked by re-running the training from it: the messages the re-simulated run would have
sent the coalition against those it recorded (the misfit). Passes go on while the misfit
falls, and a forecast is used only where its solve explains the messages :data:`EXPLAIN`
times better than the tie's own; a forecast that explains the run worse, or barely better,
is never used.
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

TRUSTS = (1e-3, 1e-2, 1e-1, 1.0)  # rank-one residuals up to which a victim is forecast
PASSES = 10  # at most this many re-solves with the drift forecast, while the misfit falls
# a forecast is used only where it explains the messages this many times better than the tie
# (re-simulation misfit): a first-order forecast from partly wrong inversions that explains
# less moves the estimates of victims it cannot predict (set from benchmarks/anchor.py's runs
# at η ≥ 1e-3: on ten image sets forecasts explained 1.4–7.5× better and, used, lost five
# victims and gained one; one that explained 84× better gained nine)
EXPLAIN = 10.0

# (recovered tied gradients by agent, trust) ↦ the run re-simulated from them: every agent's
# update (T, n, d) and the states (T + 1, S, d), index 0 the initial one (:func:`resimulate`)
Forecast = Callable[[Mapping[int, np.ndarray], float], tuple[np.ndarray, np.ndarray]]


@dataclass
class Drifted:
    """What :func:`solve_tied` settled on.

    got:      agent → its recovered tied gradient (those within ``max_error``).
    errors:   agent → the relative rounding error of its recovered gradient.
    shift:    (R × d) the forecast drift's part of the rows, subtracted before this solve
              (zeros: the tie alone).
    offsets:  the forecast drift behind ``shift`` ({}: none).
    trust:    the ``trusts`` entry of that forecast (None: none).
    misfits:  ‖rows observed − rows of the run re-simulated from the solve‖ for the tie's
              solve and each accepted pass after it (empty without a forecast).
    drift:    the drift of the run re-simulated from this solve ({}: no forecast) — what
              its agents' updates of later rounds add to their tied value.
    recovery: the solve.
    """

    got: dict[int, np.ndarray]
    errors: dict[int, float]
    shift: np.ndarray
    offsets: Mapping[Key, np.ndarray] = field(default_factory=dict)
    trust: float | None = None
    misfits: list[float] = field(default_factory=list)
    drift: Mapping[Key, np.ndarray] = field(default_factory=dict)
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
    explain: float = EXPLAIN,
) -> Drifted:
    """The tied ``system``'s identifiable ``keys`` (each an agent's update), solved on the
    ``observed`` rows (R × d) with ``known`` values around ``reference``
    (:func:`~privaudit.attacks.gossip_algebra.solve`); an agent whose estimated rounding error
    is at least ``max_error`` times its RMS is left out (None: kept).

    With a ``forecast``, each solve is checked against the messages: the run is re-simulated
    from its gradients at each of ``trusts`` and the rows it would have recorded compared
    with ``observed`` (the misfit; the best trust's). The drift of that re-simulation is
    taken out of the rows (:func:`~privaudit.attacks.gossip_algebra.drift_shift` over the
    ``untied`` system) and the tied system solved again, up to ``passes`` times, while the
    misfit falls; the solve whose re-simulation explains the messages best is returned — the
    tie's own where no forecast does better, or none brings the misfit below 1/``explain`` of
    the tie's. The check re-runs the training itself, not the
    tied linear model, so it also tells apart solves the tied system fits equally well (on a
    line, where the tied system has one row to spare)."""
    rec = untied.recursion

    def solved(
        shift: np.ndarray, offsets: Mapping[Key, np.ndarray], trust: float | None
    ) -> Drifted:
        got = solve(
            system, observed - shift, known, analysis=analysis, keys=keys, reference=reference
        )
        assert got.float_error is not None
        rel = relative_error(got.values, got.float_error)
        out = Drifted({}, {}, shift, offsets, trust, recovery=got)
        for i, key in enumerate(got.keys):
            if max_error is None or rel[i] < max_error:
                out.got[key[1]] = got.values[i]
                out.errors[key[1]] = float(rel[i])
        return out

    tied = out = solved(np.zeros((len(system.rows), 1)), {}, None)
    if forecast is None:
        return out
    best: Drifted | None = None
    for p in range(passes + 1):
        candidates = []
        for u in trusts:
            updates, states = forecast(out.got, u)
            miss = float(np.linalg.norm(observed - system.observed(states)))
            candidates.append((miss, u, updates))
        miss, u, updates = min(candidates, key=lambda c: c[0])
        if best is not None and miss >= best.misfits[-1]:
            break  # this solve explains the messages no better: the previous one stands
        out.misfits = [*(best.misfits if best else []), miss]
        out.drift = drift_of(rec, updates, list(out.got))
        best = out
        if p == passes:
            break
        out = solved(drift_shift(untied, out.drift), out.drift, u)
    assert best is not None
    if best.misfits[-1] * explain > best.misfits[0]:
        return tied  # explained too little to be trusted: the tie's solve, checked
    return best


def resimulate(
    rec: Recursion,
    rounds: int,
    x0: np.ndarray,
    held: Mapping[int, np.ndarray],
    gradient: Callable[[Sequence[int], np.ndarray, int], np.ndarray],
    forecast: Sequence[int] = (),
    states: Mapping[tuple[int, int], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The recursion run forward from the public x_0 (every initial state x_0): every agent's
    update in rounds 1..``rounds`` (rounds, n, d) and the states (rounds + 1, S, d), what
    :data:`Forecast` returns. A ``forecast`` agent's update is
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
    return u, s


def drift_of(rec: Recursion, updates: np.ndarray, agents: Sequence[int]) -> dict[Key, np.ndarray]:
    """The drift o_(k,t) = u_k^t − u_k^1 of ``agents`` in ``updates`` (rounds, n, d), keyed as
    the untied system's unknowns (:func:`~privaudit.attacks.gossip_algebra.drift_shift`)."""
    T = updates.shape[0]
    return {
        (rec.update, k, t): updates[t - 1, k] - updates[0, k]
        for k in agents
        for t in range(2, T + 1)
    }
