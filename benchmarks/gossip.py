"""Gossip algebra beyond the neighbourhood (El Mrini, Cyffers & Bellet, ICML 2024): how fast the
knowledge-matrix analysis runs, and whom a few curious agents reconstruct.

(a) **Timing** at N agents × T rounds (default 64 × 50) on a ring and an exponential graph,
    for gossip averaging of private values x^0 and for this project's D-PSGD (gradients g_k^t
    as unknowns, x_0 public; noise-free, and with N(0, σ²) on every gossiped half-step, solved
    by GLS): build the system, the float identifiability (QR + SVD), the solve of every
    identifiable unknown on a d-dimensional payload, and the exact analysis over GF(2³¹ − 1)
    (skipped, "-", where its O(R·U·rank) elimination is large, unless --exact).
(b) **The anchor's setting**: gossip averaging of fixed private values, attackers at given
    positions on a line, a ring and an Erdős–Rényi graph: how many non-neighbours are
    identifiable (exact arithmetic and float), after how many rounds, and the noise gain
    ‖r_u‖ of the float estimates (the std of an estimate under unit i.i.d. message noise).

    python benchmarks/gossip.py [--agents 64] [--rounds 50] [--dim 1000] [--exact] [--json FILE]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: small dense LAPACK calls

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from privaudit.attacks.gossip_algebra import (  # noqa: E402
    Recursion,
    averaging,
    dpsgd,
    gossip_messages,
    identifiability,
    knowledge,
    simulate,
    solve,
)
from privaudit.scenario.topology import (  # noqa: E402
    build_topology,
    distances,
    erdos_renyi,
    metropolis_hastings,
)


def values(rec: Recursion, T: int, d: int, seed: int = 0) -> dict:
    """Random private values (standard normal), noise draws at their std."""
    rng = np.random.default_rng(seed)
    keys = rec.variables(T)
    draws = rng.normal(size=(len(keys), d))
    return {k: draws[i] * rec.noise.get(k[0], 1.0) for i, k in enumerate(keys)}


EXACT_WORK = 3e9  # skip the exact analysis above this many int64 updates (R·U·rank) unless --exact


def timing_row(
    graph: str, adj, rec: Recursion, attackers, T: int, d: int, exact_all: bool
) -> dict[str, Any]:
    first = 0 if rec.name == "averaging" else 1
    t0 = time.perf_counter()
    system = knowledge(rec, attackers, gossip_messages(adj, attackers, range(first, T + first)))
    t1 = time.perf_counter()
    a = identifiability(system)
    t2 = time.perf_counter()
    vals = values(rec, system.rounds, d)
    y = system.observed(simulate(rec, system.rounds, vals, d=d))
    t3 = time.perf_counter()
    out = solve(system, y, vals, analysis=a)
    t4 = time.perf_counter()
    work = len(system.rows) * len(system.unknowns) * a.rank
    exact = identifiability(system, method="exact") if exact_all or work < EXACT_WORK else None
    t5 = time.perf_counter()
    err = [float(np.abs(out.values[i] - vals[k]).max()) for i, k in enumerate(out.keys)]
    noisy = [s for s in out.std if s > 0]
    return dict(
        graph=graph,
        recursion=rec.name + ("+noise" if rec.noise else ""),
        attackers=len(attackers),
        rows=len(system.rows),
        unknowns=len(system.unknowns),
        rank=a.rank,
        ident=len(a.keys()),
        exact_rank=exact.rank if exact else "-",
        exact_ident=len(exact.keys()) if exact else "-",
        max_err=max(err, default=0.0),
        std=float(np.median(noisy)) if noisy else 0.0,
        build_s=t1 - t0,
        analysis_s=t2 - t1,
        solve_s=t4 - t3,
        exact_s=t5 - t4 if exact else "-",
    )


def part_a(n: int, T: int, d: int, exact_all: bool) -> list[dict[str, Any]]:
    rows = []
    for graph in ("ring", "exponential"):
        adj = build_topology(graph, n)
        W = metropolis_hastings(adj)
        for attackers in ([0], [0, n // 4, n // 2, 3 * n // 4]):
            for rec in (averaging(W), dpsgd(W, 0.05), dpsgd(W, 0.05, noise_std=0.01)):
                rows.append(timing_row(graph, adj, rec, attackers, T, d, exact_all))
    return rows


def anchor_row(graph: str, adj, attackers, T: int) -> dict[str, Any]:
    """Averaging of private x^0, messages x^0 … x^{T−1}: identifiable non-neighbours, exact
    and float, the first round count at which the exact set is complete, and float gains."""
    W = metropolis_hastings(adj)
    rec = averaging(W)
    dist = distances(adj)[attackers].min(0).values
    beyond = [k for k in range(adj.shape[0]) if dist[k] >= 2]
    system = knowledge(rec, attackers, gossip_messages(adj, attackers, range(T)))
    exact = identifiability(system, method="exact")
    a = identifiability(system)
    ident_e = {k[1] for k in exact.keys()}
    ident_f = {k[1] for k in a.keys()}
    rounds_needed = None
    for t in range(1, T + 1):
        sub = knowledge(rec, attackers, gossip_messages(adj, attackers, range(t)))
        if {k[1] for k in identifiability(sub, method="exact").keys()} == ident_e:
            rounds_needed = t
            break
    gains = []
    if ident_f:
        vals = values(rec, 0, 1)
        states = simulate(rec, system.rounds, vals)
        out = solve(system, system.observed(states), vals, analysis=a)
        gains = [out[k].meta["gain"] for k in out.keys if k[1] in beyond]
    return dict(
        graph=graph,
        n=adj.shape[0],
        attackers=list(attackers),
        beyond=len(beyond),
        exact=len(ident_e & set(beyond)),
        float=len(ident_f & set(beyond)),
        hidden=sorted(set(beyond) - ident_e),
        rounds_needed=rounds_needed,
        max_gain=max(gains, default=float("nan")),
    )


def part_b(T_factor: int = 2) -> list[dict[str, Any]]:
    rows = []
    n = 16
    line, ring = build_topology("line", n), build_topology("ring", n)
    for attackers in ([0], [4], [7], [0, 15], [5, 10]):
        rows.append(anchor_row("line", line, attackers, T_factor * n))
    for attackers in ([0], [0, 1], [0, 8], [0, 5], [0, 4, 8, 12]):
        rows.append(anchor_row("ring", ring, attackers, T_factor * n))
    star, torus = build_topology("star", n), build_topology("torus", n)
    for attackers in ([1], [1, 2]):
        rows.append(anchor_row("star", star, attackers, T_factor * n))
    for attackers in ([0], [0, 1], [0, 5]):
        rows.append(anchor_row("torus", torus, attackers, T_factor * n))
    er = erdos_renyi(32, 0.1, seed=0)
    rng = np.random.default_rng(0)
    for m in (1, 2, 4):
        attackers = sorted(rng.choice(32, size=m, replace=False).tolist())
        rows.append(anchor_row("erdos-renyi(32,0.1)", er, attackers, 64))
    big = build_topology("ring", 64)
    rows.append(anchor_row("ring", big, [0], 64))
    rows.append(anchor_row("line", build_topology("line", 64), [0], 64))
    return rows


def show(rows: list[dict[str, Any]], cols: list[str]) -> None:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.2e}"
        return str(v)

    table = [[fmt(r[c]) for c in cols] for r in rows]
    width = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, width, strict=True)))
    for t in table:
        print("  ".join(v.rjust(w) for v, w in zip(t, width, strict=True)))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=64)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--dim", type=int, default=1000, help="payload dimension d of the solve")
    p.add_argument("--exact", action="store_true", help="exact analysis on every (a) row")
    p.add_argument("--json", default=None, help="write the rows to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"(a) timing, N = {args.agents}, T = {args.rounds}, d = {args.dim}")
    a = part_a(args.agents, args.rounds, args.dim, args.exact)
    show(a, ["graph", "recursion", "attackers", "rows", "unknowns", "rank", "ident",
             "exact_rank", "exact_ident", "max_err", "std", "build_s", "analysis_s", "solve_s",
             "exact_s"])  # fmt: skip
    print("\n(b) gossip averaging of private values: non-neighbours identifiable")
    b = part_b()
    show(b, ["graph", "n", "attackers", "beyond", "exact", "float", "rounds_needed",
             "max_gain", "hidden"])  # fmt: skip
    doc = {"timing": a, "anchor": b}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return doc


if __name__ == "__main__":
    main()
