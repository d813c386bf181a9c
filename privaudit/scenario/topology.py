"""Communication graphs on N agents and their gossip (mixing) matrices.

A graph is an undirected, loop-free ``(N, N)`` boolean adjacency matrix (``torch.bool``).
The builders:

- ``ring``: i ~ i ± 1 (mod N); the DPDL / D-PSGD default (Lian et al. 2017).
- ``complete``: every pair.
- ``bipartite``: complete bipartite K_{N/2,N/2}, agents ``0..N/2-1`` against ``N/2..N-1``
  (the DPDL paper's "bipartite" graph has its sizes stripped; this is our choice).
- ``torus``: 2-D torus on an r×c grid, r·c = N, r the largest divisor of N with r ≤ √N;
  agent k sits at (k // c, k % c) and talks to its 4 wrap-around grid neighbours. Neighbours
  that coincide (r or c = 2) count once, so N = 4 is a 4-cycle. Prime N has no r, c ≥ 2 grid
  and is refused.
- ``exponential``: i ~ i ± 2^k (mod N) for every 2^k < N — the (symmetrized) exponential
  graph of SGP (Assran et al. 2019) and Ying et al. 2021.
- ``erdos-renyi``: G(N, p), each pair an edge independently with probability p, drawn from a
  seeded generator and redrawn until connected (gossip on a disconnected graph never
  averages), so the graph is a deterministic function of (N, p, seed). By name it uses
  p = min(1, 2 ln N / N) — twice the connectivity threshold ln N / N (Erdős & Rényi 1960),
  so a draw is connected with high probability — and seed 0; :func:`erdos_renyi` takes both.
  The random graphs of El Mrini, Cyffers & Bellet (ICML 2024) are of this kind.
- ``star``: agent 0 (the hub) ~ every other agent; the leaves talk only to the hub.
- ``line``: the path i ~ i + 1 (a ring without the edge N−1 ~ 0): the worst-connected tree,
  and the setting where a few curious agents reconstruct the most (El Mrini et al. 2024).

:func:`distances` gives BFS hop distances, e.g. to sort victims by how far they are from an
attacker (neighbours at 1, non-neighbours beyond).

Gossip uses Metropolis–Hastings weights (Xiao, Boyd & Kim 2007): symmetric, doubly
stochastic, positive diagonal, computable by each agent from its neighbours' degrees.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from privaudit.core.errors import PrivauditError, unknown


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise PrivauditError(
            f"--agents must be at least 2 (got {n!r}): decentralized learning needs a neighbour"
        )


def _from_pairs(n: int, pairs) -> Tensor:
    adj = torch.zeros(n, n, dtype=torch.bool)
    for i, j in pairs:
        if i != j:
            adj[i, j] = adj[j, i] = True
    return adj


def ring(n: int) -> Tensor:
    """Cycle i ~ i ± 1 mod N (N = 2: a single edge)."""
    _check_n(n)
    return _from_pairs(n, ((i, (i + 1) % n) for i in range(n)))


def complete(n: int) -> Tensor:
    """All pairs."""
    _check_n(n)
    return ~torch.eye(n, dtype=torch.bool)


def bipartite(n: int) -> Tensor:
    """Complete bipartite K_{N/2,N/2}: first half against second half; N must be even."""
    _check_n(n)
    if n % 2:
        raise PrivauditError(
            f"the bipartite topology splits agents into two equal halves, so --agents must be "
            f"even (got {n}); use {n - 1} or {n + 1}"
        )
    h = n // 2
    adj = torch.zeros(n, n, dtype=torch.bool)
    adj[:h, h:] = True
    adj[h:, :h] = True
    return adj


def torus_shape(n: int) -> tuple[int, int]:
    """(r, c) with r·c = N and r the largest divisor of N with r ≤ √N; r, c ≥ 2 required."""
    _check_n(n)
    r = max(d for d in range(1, int(np.sqrt(n)) + 1) if n % d == 0)
    if r < 2:
        raise PrivauditError(
            f"the torus topology needs an r×c grid with r, c ≥ 2, and --agents {n} has none "
            f"(it is prime); use a composite number such as {n + 1 if n > 2 else 4} or "
            f"another topology"
        )
    return r, n // r


def torus(n: int) -> Tensor:
    """2-D wrap-around grid (see module docstring); degree 4 when r, c ≥ 3."""
    r, c = torus_shape(n)
    pairs = []
    for k in range(n):
        a, b = divmod(k, c)
        pairs += [(k, ((a + 1) % r) * c + b), (k, a * c + (b + 1) % c)]
    return _from_pairs(n, pairs)


def exponential(n: int) -> Tensor:
    """i ~ i ± 2^k mod N for every 2^k < N (symmetrized exponential graph)."""
    _check_n(n)
    pairs = []
    k = 1
    while k < n:
        pairs += [(i, (i + k) % n) for i in range(n)]
        k *= 2
    return _from_pairs(n, pairs)


def star(n: int) -> Tensor:
    """Agent 0 is the hub, linked to every other agent; no other edges."""
    _check_n(n)
    return _from_pairs(n, ((0, i) for i in range(1, n)))


def line(n: int) -> Tensor:
    """The path 0 ~ 1 ~ … ~ N−1 (no wrap-around edge)."""
    _check_n(n)
    return _from_pairs(n, ((i, i + 1) for i in range(n - 1)))


ER_TRIES = 1000  # draws of G(N, p) before giving up on a connected one


def er_probability(n: int) -> float:
    """The edge probability ``erdos-renyi`` uses by name: min(1, 2 ln N / N), twice the
    connectivity threshold, so that a connected draw is the rule rather than the exception."""
    _check_n(n)
    return min(1.0, 2.0 * float(np.log(n)) / n)


def erdos_renyi(n: int, p: float | None = None, seed: int = 0) -> Tensor:
    """G(N, p) redrawn until connected: draw k = 0, 1, … uses ``numpy.random.default_rng(
    (seed, k))`` and each pair i < j is an edge when its uniform draw is below p; the first
    connected draw is returned, so the graph depends on (N, p, seed) only. ``p`` None:
    :func:`er_probability` (N). Refused when no draw in :data:`ER_TRIES` is connected (p far
    below ln N / N)."""
    _check_n(n)
    p = er_probability(n) if p is None else p
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
        raise PrivauditError(f"the erdos-renyi edge probability p must be in (0, 1], got {p!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise PrivauditError(f"the erdos-renyi seed must be an integer ≥ 0, got {seed!r}")
    iu = np.triu_indices(n, 1)
    for k in range(ER_TRIES):
        keep = np.random.default_rng((int(seed), k)).random(iu[0].size) < p
        adj = torch.zeros(n, n, dtype=torch.bool)
        adj[iu[0][keep], iu[1][keep]] = True
        adj = adj | adj.T
        if bool((distances(adj)[0] >= 0).all()):
            return adj
    raise PrivauditError(
        f"no connected Erdős–Rényi graph on {n} agents with p = {p:g} in {ER_TRIES} draws; "
        f"use p ≥ {er_probability(n):.3g} (2 ln N / N)"
    )


TOPOLOGIES: dict[str, Callable[[int], Tensor]] = {
    "ring": ring,
    "complete": complete,
    "bipartite": bipartite,
    "torus": torus,
    "exponential": exponential,
    "erdos-renyi": erdos_renyi,
    "star": star,
    "line": line,
}


def build_topology(name: str, n: int) -> Tensor:
    """The adjacency matrix of topology ``name`` on ``n`` agents."""
    if name not in TOPOLOGIES:
        raise unknown("topology", name, TOPOLOGIES)
    _check_n(n)
    return TOPOLOGIES[name](n)


def _check_adj(adj: Tensor) -> Tensor:
    adj = torch.as_tensor(adj).to(torch.bool)
    if adj.ndim != 2 or adj.shape[0] != adj.shape[1]:
        raise PrivauditError(f"an adjacency matrix must be square (got shape {tuple(adj.shape)})")
    if not torch.equal(adj, adj.T):
        raise PrivauditError("the adjacency matrix is not symmetric; the graph must be undirected")
    if adj.diagonal().any():
        raise PrivauditError("the adjacency matrix has self loops; set its diagonal to False")
    return adj


def degrees(adj: Tensor) -> Tensor:
    """Number of neighbours of each agent (int64)."""
    return _check_adj(adj).sum(1)


def metropolis_hastings(adj: Tensor) -> Tensor:
    """Metropolis–Hastings weights: w_ij = 1/(1 + max(d_i, d_j)) on edges, w_ii = 1 − Σ_j w_ij.

    Returns a float64 ``(N, N)`` tensor, symmetric and doubly stochastic with w_ii > 0.
    """
    adj = _check_adj(adj)
    d = adj.sum(1).to(torch.float64)
    w = 1.0 / (1.0 + torch.maximum(d[:, None], d[None, :]))
    w = torch.where(adj, w, torch.zeros((), dtype=torch.float64))
    w = w + torch.diag(1.0 - w.sum(1))
    return w


def laplacian_gossip(adj: Tensor) -> Tensor:
    """El Mrini, Cyffers & Bellet's gossip matrix W = I − L / d_max (ICML 2024; decAttack's
    ``LaplacianGossipMatrix``), L the graph Laplacian and d_max its largest degree: float64
    ``(N, N)``, symmetric and doubly stochastic, w_ii = 1 − d_i/d_max (0 at a node of the
    largest degree)."""
    a = _check_adj(adj).to(torch.float64)
    a.fill_diagonal_(0)
    deg = a.sum(1)
    return torch.eye(len(a), dtype=torch.float64) - (torch.diag(deg) - a) / deg.max()


# --gossip: how a run's mixing weights are built from its graph
GOSSIP_MATRICES: dict[str, Callable[[Tensor], Tensor]] = {
    "mh": metropolis_hastings,
    "laplacian": laplacian_gossip,
}


def gossip_matrix(name: str, adj: Tensor) -> Tensor:
    """The ``name`` gossip matrix (:data:`GOSSIP_MATRICES`) of the graph ``adj``, float64."""
    if name not in GOSSIP_MATRICES:
        raise unknown("gossip matrix", name, GOSSIP_MATRICES)
    return GOSSIP_MATRICES[name](adj)


def validate_mixing(W: Tensor, adj: Tensor | None = None, atol: float = 1e-10) -> None:
    """Raise :class:`PrivauditError` unless ``W`` is a valid gossip matrix.

    Valid: square, finite, symmetric, non-negative, rows and columns summing to 1, and —
    when ``adj`` is given — zero off the graph's edges (agents only mix with neighbours).
    """
    W = torch.as_tensor(W, dtype=torch.float64)
    fix = "build it with metropolis_hastings(adj)"
    if W.ndim != 2 or W.shape[0] != W.shape[1]:
        raise PrivauditError(f"mixing matrix W must be square (got shape {tuple(W.shape)}); {fix}")
    if not torch.isfinite(W).all():
        raise PrivauditError(f"mixing matrix W has NaN or infinite entries; {fix}")
    asym = (W - W.T).abs().max().item()
    if asym > atol:
        raise PrivauditError(f"mixing matrix W is not symmetric (max |W − Wᵀ| = {asym:.3g}); {fix}")
    if W.min().item() < -atol:
        raise PrivauditError(
            f"mixing matrix W has negative entries (min {W.min().item():.3g}); {fix}"
        )
    for axis, what in ((1, "rows"), (0, "columns")):
        err = (W.sum(axis) - 1.0).abs().max().item()
        if err > atol:
            raise PrivauditError(
                f"mixing matrix W's {what} do not sum to 1 (max error {err:.3g}); {fix}"
            )
    if adj is not None:
        adj = _check_adj(adj)
        if adj.shape != W.shape:
            raise PrivauditError(
                f"mixing matrix W has shape {tuple(W.shape)} but the graph has {adj.shape[0]} "
                f"agents; {fix}"
            )
        off = ~adj & ~torch.eye(adj.shape[0], dtype=torch.bool)
        if (W[off].abs() > atol).any():
            raise PrivauditError(f"mixing matrix W mixes agents that are not neighbours; {fix}")


def distances(adj: Tensor) -> Tensor:
    """BFS hop distances: ``(N, N)`` int64, entry (i, j) the fewest edges from i to j (0 on
    the diagonal), −1 where j cannot be reached from i. Each agent's distance to an attacker
    says whether it is a neighbour (1) or lies beyond the neighbourhood (≥ 2)."""
    a = torch.as_tensor(adj).to(torch.bool)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise PrivauditError(f"an adjacency matrix must be square (got shape {tuple(a.shape)})")
    n = a.shape[0]
    dist = torch.full((n, n), -1, dtype=torch.int64)
    dist.fill_diagonal_(0)
    frontier = torch.eye(n, dtype=torch.bool)
    seen = frontier.clone()
    hop = 0
    while frontier.any():
        hop += 1
        frontier = (frontier.to(torch.float32) @ a.to(torch.float32) > 0) & ~seen
        dist[frontier] = hop
        seen |= frontier
    return dist


def neighbors(adj: Tensor, i: int) -> list[int]:
    """Sorted neighbours of agent ``i``."""
    return torch.nonzero(torch.as_tensor(adj)[i]).flatten().tolist()


def directed_edges(adj: Tensor) -> list[tuple[int, int]]:
    """Every directed link (src, dst), src ≠ dst, sorted — the order messages are tapped in."""
    adj = _check_adj(adj)
    return [(int(s), int(d)) for s, d in torch.nonzero(adj).tolist()]


def spectral_gap(W: Tensor) -> float:
    """1 − max(|λ₂|, |λ_N|) of a symmetric W: the per-step contraction of gossip consensus.

    Larger is faster mixing; 0 means a disconnected (or periodic) graph never reaches consensus.
    """
    ev = torch.linalg.eigvalsh(torch.as_tensor(W, dtype=torch.float64))
    if ev.numel() < 2:
        return 1.0
    slem = max(abs(ev[0].item()), abs(ev[-2].item()))
    return 1.0 - slem


@dataclass
class Topology:
    """A named graph with its Metropolis–Hastings mixing matrix."""

    name: str
    adj: Tensor
    W: Tensor

    @classmethod
    def build(cls, name: str, n: int) -> Topology:
        adj = build_topology(name, n)
        return cls(name, adj, metropolis_hastings(adj))

    @property
    def n(self) -> int:
        return self.adj.shape[0]

    def neighbors(self, i: int) -> list[int]:
        return neighbors(self.adj, i)

    @property
    def edges(self) -> list[tuple[int, int]]:
        """Directed links (src, dst), sorted."""
        return directed_edges(self.adj)

    @property
    def spectral_gap(self) -> float:
        return spectral_gap(self.W)
