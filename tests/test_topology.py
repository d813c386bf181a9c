import pytest
import torch

from privaudit.core.errors import PrivauditError
from privaudit.scenario.topology import (
    TOPOLOGIES,
    Topology,
    build_topology,
    degrees,
    directed_edges,
    metropolis_hastings,
    neighbors,
    spectral_gap,
    validate_mixing,
)

PRIMES = {2, 3, 5, 7, 11, 13, 17}


def valid_ns(name: str) -> list[int]:
    ns = range(2, 18)
    if name == "bipartite":
        return [n for n in ns if n % 2 == 0]
    if name == "torus":
        return [n for n in ns if n not in PRIMES]
    return list(ns)


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_mixing_matrix_is_valid_for_every_topology(name):
    for n in valid_ns(name):
        adj = build_topology(name, n)
        assert adj.dtype == torch.bool and adj.shape == (n, n)
        assert torch.equal(adj, adj.T) and not adj.diagonal().any()
        W = metropolis_hastings(adj)
        assert W.dtype == torch.float64
        validate_mixing(W, adj)
        assert torch.allclose(W, W.T)
        assert torch.allclose(W.sum(0), torch.ones(n, dtype=torch.float64))
        assert torch.allclose(W.sum(1), torch.ones(n, dtype=torch.float64))
        assert (W.diagonal() > 0).all()
        assert 0 < spectral_gap(W) <= 1 + 1e-12  # connected


@pytest.mark.parametrize(
    "name,n,deg",
    [("ring", 10, 2), ("complete", 7, 6), ("bipartite", 10, 5), ("torus", 16, 4)],
)
def test_degrees(name, n, deg):
    assert degrees(build_topology(name, n)).tolist() == [deg] * n


def test_graph_details():
    assert neighbors(build_topology("ring", 5), 0) == [1, 4]
    assert neighbors(build_topology("bipartite", 6), 4) == [0, 1, 2]
    assert neighbors(build_topology("exponential", 8), 0) == [1, 2, 4, 6, 7]
    assert degrees(build_topology("torus", 4)).tolist() == [2] * 4  # 2×2: neighbours coincide
    assert degrees(build_topology("torus", 6)).tolist() == [3] * 6  # 2×3
    assert directed_edges(build_topology("ring", 3)) == [
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 2),
        (2, 0),
        (2, 1),
    ]
    assert len(directed_edges(build_topology("complete", 5))) == 20
    # a denser graph mixes faster
    gaps = [spectral_gap(metropolis_hastings(build_topology(t, 16))) for t in ("ring", "complete")]
    assert gaps[0] < gaps[1]


def test_topology_dataclass():
    t = Topology.build("ring", 6)
    assert t.n == 6 and t.neighbors(0) == [1, 5] and len(t.edges) == 12
    validate_mixing(t.W, t.adj)
    assert t.spectral_gap == spectral_gap(t.W)


def test_validate_mixing_rejects_bad_matrices():
    W = metropolis_hastings(build_topology("ring", 5))
    with pytest.raises(PrivauditError, match="square"):
        validate_mixing(W[:3])
    asym = W.clone()
    asym[0, 1] += 0.1
    asym[0, 0] -= 0.1
    with pytest.raises(PrivauditError, match="not symmetric"):
        validate_mixing(asym)
    with pytest.raises(PrivauditError, match="rows do not sum to 1"):
        validate_mixing(W * 1.1)
    neg = torch.tensor([[1.5, -0.5], [-0.5, 1.5]], dtype=torch.float64)
    with pytest.raises(PrivauditError, match="negative"):
        validate_mixing(neg)
    with pytest.raises(PrivauditError, match="not neighbours"):
        validate_mixing(torch.full((5, 5), 0.2, dtype=torch.float64), build_topology("ring", 5))


def test_errors():
    with pytest.raises(
        PrivauditError,
        match="choose one of: bipartite, complete, erdos-renyi, exponential, line, ring, star, "
        "torus",
    ):
        build_topology("hypercube", 4)
    for n in (0, 1):
        with pytest.raises(PrivauditError, match="--agents must be at least 2"):
            build_topology("ring", n)
    with pytest.raises(PrivauditError, match="even"):
        build_topology("bipartite", 5)
    with pytest.raises(PrivauditError, match="prime"):
        build_topology("torus", 7)
    with pytest.raises(PrivauditError, match="not symmetric"):
        metropolis_hastings(torch.triu(torch.ones(3, 3, dtype=torch.bool), 1))
