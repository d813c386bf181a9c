"""The gossip algebra under DP noise: which linear estimator of a non-neighbour's update is
best, and is the error it predicts the error it makes?

For each DP defense with a linear recursion (``dp-dpsgd``: N(0, (σC/B)²) on each agent's
gradient; ``muffliato``: N(0, (σs)²) on y⁰ before the gossip steps), σ is calibrated by the
project's accountant (:func:`privaudit.core.accounting.calibrate`) to ε = ``--epsilon`` over
T rounds at sampling rate 1 (El Mrini et al.'s D-GD setting: one example per agent, full
batch), and the defense's own recursion (``Defense.recursion``) is simulated on a line of n
agents with the attacker at one end, T = n rounds of messages. Every agent's clipped update
is a fixed random vector of norm C (d coordinates), so the tied approximation
(:func:`~privaudit.attacks.gossip_algebra.tie`) holds exactly and only the noise separates the
estimators. For each victim two or more hops away that the coalition identifies:

- **GLS**: :func:`~privaudit.attacks.gossip_algebra.solve` with the noise covariance (the best
  linear unbiased estimator, Gauss–Markov), its predicted per-coordinate std, and the
  measured RMS error over d coordinates;
- **LS**: the minimum-norm least-squares estimator r₀ = (K⁺)ᵀ e_v, the one El Mrini et al.'s
  code computes (``np.linalg.lstsq``), blind to the noise;
- **other**: r₀ + Z a with a random a in null(Kᵀ) (another unbiased linear estimator).

Printed: the median over victims of each estimator's measured error / the noise's std on one
update, the GLS's measured / predicted error (the goal: within 2×), and the update's SNR
(10·log10(‖g‖² / ‖ĝ − g‖²), dB) for GLS and LS. Two systems: **exact** (a fresh unknown per
agent and round; the noise enters every message in the same combination as the update, so
every unbiased estimator has the same error — the victim's own draw) and **tied** (one
unknown per agent over T rounds; the noises of T rounds can be averaged, and GLS does it
best).

    python benchmarks/gossip_noise.py [--agents 12 --epsilon 8 --dim 4000 --json FILE]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privaudit.api.gossip import coalition_system
from privaudit.attacks.gossip_algebra import identifiability, simulate, solve, state_key
from privaudit.core.accounting import calibrate
from privaudit.core.files import write_json
from privaudit.defenses import DEFENSES
from privaudit.scenario.topology import build_topology, distances, metropolis_hastings

DEFENSE_NAMES = ("dp-dpsgd", "muffliato")
GOAL = 2.0  # GLS measured / predicted error within this factor


def calibrated(name: str, W: torch.Tensor, epsilon: float, delta: float, rounds: int) -> Any:
    """The defense's default parameters with σ set by the accountant for ε over ``rounds``
    releases at rate 1 on every agent."""
    defense = DEFENSES[name]
    p = defense.Params()
    sigma = calibrate(defense, p, W, [1.0] * W.shape[0], epsilon, delta, rounds)
    return replace(p, sigma=float(sigma))


def truth(rec: Any, T: int, d: int, clip: float, seed: int) -> dict:
    """Each agent's update: one random direction of norm ``clip``, the same in every round;
    the noise inputs at their stated std; the public x_0 = 0."""
    rng = np.random.default_rng(seed)
    g = rng.normal(size=(rec.n, d))
    g *= clip / np.linalg.norm(g, axis=1, keepdims=True)
    vals: dict = {}
    for key in rec.variables(T):
        kind, k, t = key
        if kind == rec.update:
            vals[key] = g[k]
        elif kind in rec.noise:
            vals[key] = rng.normal(size=d) * rec.noise[kind]
        else:
            vals[key] = np.zeros(d)  # x_0 and any other initial state: public zeros
    return vals


STATE = state_key("", 0, 0)[0]  # the prefix of a coalition member's state variables


def known_values(rec: Any, vals: dict, states: np.ndarray):
    """What the coalition holds: the public x_0, its members' states (the messages it sent,
    read off the simulated trajectory) and its own inputs."""

    def value(key: tuple) -> np.ndarray:
        if key[0].startswith(STATE):
            return states[key[2], rec.component(key[0][len(STATE) :]) * rec.n + key[1]]
        return vals[key]

    return value


def estimators(system: Any, analysis: Any, y: np.ndarray, vals: Any, keys: list, seed: int):
    """GLS (values, predicted std), LS and another unbiased estimator's values, per key."""
    gls = solve(system, y, vals, analysis=analysis, keys=keys)
    rhs = system.rhs(y, vals)
    K = system.K.toarray()
    pinv = np.linalg.pinv(K)  # (U × R): x̂ = K⁺ rhs, the min-norm least squares
    cols = [system.index(k) for k in keys]
    r0 = pinv[cols]  # (q × R)
    _, s, vt = np.linalg.svd(K.T)
    null = vt[int((s > s[0] * 1e-10).sum()) :]  # rows spanning null(Kᵀ)
    rng = np.random.default_rng(seed)
    scale = np.linalg.norm(r0, axis=1, keepdims=True)
    other = r0 + (rng.normal(size=(len(keys), null.shape[0])) @ null) * scale
    return gls, r0 @ rhs, other @ rhs


def rms(a: np.ndarray) -> float:
    return float(np.sqrt(np.mean(a**2)))


def cell(name: str, n: int, epsilon: float, delta: float, d: int, tied: bool, seed: int):
    adj = build_topology("line", n)
    W = metropolis_hastings(adj)
    T = n
    p = calibrated(name, W, epsilon, delta, T)
    defense = DEFENSES[name]
    rec = defense.recursion(p, W, 1)
    clip = float(rec.facts.get("clip", 1.0))
    attackers = [0]
    system = coalition_system(rec, adj, attackers, 0, T, tied)  # privaudit's own, cut
    analysis = identifiability(system)
    hops = distances(adj)[attackers].min(0).values
    keys = [k for k in analysis.keys() if k[0] == rec.update and hops[k[1]] >= 2 and k[2] == 1]
    noise = next(iter(rec.noise.values())) / p.lr  # the std one update carries (σC/B, σs/η)
    base = dict(defense=name, system="tied" if tied else "exact", sigma=p.sigma, n=n, T=T)
    base.update(identifiable=len(keys), noise=noise)
    if not keys:
        return [base]
    vals = truth(rec, T, d, clip, seed)
    states = simulate(rec, T, vals, d=d)
    y = system.observed(states)
    held = known_values(rec, vals, states)
    gls, ls, other = estimators(system, analysis, y, held, keys, seed)
    rows = []
    for i, key in enumerate(keys):
        g = vals[key]
        err = {
            e: rms(v - g) for e, v in (("gls", gls.values[i]), ("ls", ls[i]), ("other", other[i]))
        }
        row = dict(base, victim=key[1], hops=int(hops[key[1]]))
        row.update({f"{e}_err": v / noise for e, v in err.items()})
        row.update(
            {
                f"{e}_snr_db": 10 * math.log10(float(g @ g) / (err[e] ** 2 * d))
                for e in ("gls", "ls")
            }
        )
        row["measured_over_predicted"] = err["gls"] / float(gls.std[i])
        # best up to the sampling error of an RMS over d coordinates (≈ 1/√(2d) relative)
        row["gls_best"] = err["gls"] <= min(err["ls"], err["other"]) * (1 + 3 / math.sqrt(2 * d))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=12)
    ap.add_argument("--epsilon", type=float, default=8.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--dim", type=int, default=4000, help="coordinates per update")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the rows to this file")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = [
        r
        for name in DEFENSE_NAMES
        for tied in (False, True)
        for r in cell(name, a.agents, a.epsilon, a.delta, a.dim, tied, a.seed)
    ]
    print(
        f"line of {a.agents}, attacker 0, T = {a.agents} rounds, ε = {a.epsilon:g} "
        f"(δ = {a.delta:g}, rate 1), d = {a.dim}; errors in units of one update's noise std"
    )
    cols = ["defense", "system", "sigma", "identifiable", "victim", "hops"]
    cols += ["gls_err", "ls_err", "other_err"]
    cols += ["measured_over_predicted", "gls_snr_db", "ls_snr_db", "gls_best"]
    print("  ".join(f"{c:>12}" for c in cols))
    for r in rows:
        cells = [r.get(c, "-") for c in cols]
        print("  ".join(f"{v:>12.3g}" if isinstance(v, float) else f"{v!s:>12}" for v in cells))
    ok = all(
        r.get("gls_best", True) and 1 / GOAL <= r.get("measured_over_predicted", 1.0) <= GOAL
        for r in rows
    )
    print(f"GLS best of the three and its error within {GOAL:g}× of its prediction: {ok}")
    if a.json:
        write_json(Path(a.json), rows)
    return rows


if __name__ == "__main__":
    main()
