"""The gossip algebra of El Mrini, Cyffers & Bellet (ICML 2024): knowledge matrices,
identifiability (float and exact), noise-free recovery beyond the neighbourhood, the GLS
estimator's reported std, and the graphs it is run on (erdos-renyi, star, line)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from privaudit.attacks.gossip_algebra import (
    Message,
    Recursion,
    averaging,
    dpsgd,
    estimate,
    exact_identifiability,
    gossip_messages,
    identifiability,
    knowledge,
    rref_mod,
    simulate,
    solve,
    state_functional,
    unroll,
)
from privaudit.core.errors import PrivauditError
from privaudit.scenario.topology import (
    TOPOLOGIES,
    build_topology,
    degrees,
    distances,
    erdos_renyi,
    metropolis_hastings,
    neighbors,
    torus_shape,
)

sympy = pytest.importorskip("sympy")
pytestmark = pytest.mark.usefixtures("one_thread")


def graph(name: str, n: int):
    adj = build_topology(name, n)
    return adj, metropolis_hastings(adj)


def averaging_system(name: str, n: int, attackers, T: int, own=("x",)):
    adj, W = graph(name, n)
    rec = averaging(W)
    return rec, knowledge(rec, attackers, gossip_messages(adj, attackers, range(T), own=own))


def random_values(rec: Recursion, T: int, d: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {k: rng.normal(size=d) for k in rec.variables(T)}


# -- exact rational reference (sympy), independent of the module's unrolling ------------------
def rational_W(W: torch.Tensor) -> sympy.Matrix:
    n = W.shape[0]
    return sympy.Matrix(
        n, n, lambda i, j: sympy.Rational(Fraction(float(W[i, j])).limit_denominator(1000))
    )


def sympy_averaging_K(W: torch.Tensor, attackers, T: int) -> sympy.Matrix:
    """Rows e_jᵀ W^t over x^0 for every message x_j^t (j ∉ A a neighbour of A, t < T) and
    each member's own x_a^t, restricted to the non-members' columns."""
    n = W.shape[0]
    Wq = rational_W(W)
    A = set(attackers)
    heard = sorted({j for a in A for j in neighbors(W != 0, a) if j not in A and j != a})
    rows, P = [], sympy.eye(n)
    for _ in range(T):
        rows += [P.row(j) for j in heard] + [P.row(a) for a in sorted(A)]
        P = Wq * P
    K = sympy.Matrix.vstack(*rows)
    return K[:, [k for k in range(n) if k not in A]]


def sympy_identifiable(K: sympy.Matrix) -> tuple[int, list[int]]:
    r = K.rank()
    ident = []
    for u in range(K.shape[1]):
        e = sympy.zeros(1, K.shape[1])
        e[u] = 1
        if sympy.Matrix.vstack(K, e).rank() == r:
            ident.append(u)
    return r, ident


CASES = [
    # (graph, n, attackers, rounds, hand-computed rank, identifiable non-members)
    ("line", 3, [0], 1, 1, [1]),  # x_1^0 only
    ("line", 3, [0], 2, 2, [1, 2]),  # x_1^1 = (x_0 + x_1 + x_2)/3 reveals x_2
    ("line", 5, [0], 2, 2, [1, 2]),
    ("line", 5, [0], 4, 4, [1, 2, 3, 4]),  # one hop further per round
    ("line", 5, [2], 1, 2, [1, 3]),
    ("line", 5, [2], 2, 4, [0, 1, 3, 4]),
    ("ring", 4, [0], 2, 3, [1, 2, 3]),
    ("ring", 5, [0], 2, 4, [1, 2, 3, 4]),
    ("ring", 6, [0], 1, 2, [1, 5]),
    ("ring", 6, [0], 3, 5, [1, 2, 3, 4, 5]),
    ("ring", 6, [0, 3], 2, 4, [1, 2, 4, 5]),
    ("torus", 6, [0], 1, 3, [1, 2, 3]),  # 2×3 torus: 0 ~ 1, 2, 3
    ("torus", 6, [0], 2, 5, [1, 2, 3, 4, 5]),
]


@pytest.mark.parametrize("name,n,attackers,T,rank,ident", CASES)
def test_averaging_identifiability_matches_hand_and_sympy(name, n, attackers, T, rank, ident):
    rec, system = averaging_system(name, n, attackers, T)
    sK = sympy_averaging_K(graph(name, n)[1], attackers, T)
    s_rank, s_ident = sympy_identifiable(sK)
    others = [k for k in range(n) if k not in attackers]
    assert s_rank == rank and [others[u] for u in s_ident] == ident
    for method in ("qr", "exact"):
        a = identifiability(system, method=method)
        assert a.rank == rank, method
        assert sorted(k[1] for k in a.keys("x0")) == ident, method
        tab, rounds = a.table("x0")
        assert rounds == [0] and tab[attackers, 0].tolist() == [-1] * len(attackers)
        assert sorted(np.flatnonzero(tab[:, 0] == 1).tolist()) == ident


def test_torus_2x3_shape():
    assert torus_shape(6) == (2, 3) and degrees(build_topology("torus", 6)).tolist() == [3] * 6


def test_symmetry_hides_mirrored_agents():
    """A leaf attacker of a star cannot tell the other leaves apart (they are symmetric), and
    neither can the attacker at the centre of a 4×4 torus tell mirrored agents: the exact
    and the float analyses agree."""
    _, system = averaging_system("star", 6, [1], 10)
    for method in ("qr", "exact"):
        a = identifiability(system, method=method)
        assert a.rank == 2 and [k[1] for k in a.keys()] == [0]
        assert a.status(("x0", 2, 0)) == "hidden" and a.status(("x0", 1, 0)) == "known"
    _, system = averaging_system("torus", 16, [0], 30)
    q, e = identifiability(system), exact_identifiability(system)
    assert q.rank == e.rank == 13 and q.keys() == e.keys()
    assert set(q.keys()) < {("x0", k, 0) for k in range(1, 16)}


def test_dpsgd_identifiability_by_hand():
    """D-PSGD on a ring of 4, attacker 0, x_0 public, two rounds: the neighbours' first
    gradients are exact (x̃_1 = x_0 − η g_1); at t = 2 each received half-model mixes the
    hidden g_2^1 with a fresh gradient, so 4 independent rows, 6 unknowns, 2 identifiable."""
    adj, W = graph("ring", 4)
    rec = dpsgd(W, lr=0.1)
    system = knowledge(rec, [0], gossip_messages(adj, [0], [1, 2]))
    assert {k[0] for k in system.known} == {"x0", "g"}
    assert len(system.unknowns) == 6
    for method in ("qr", "exact"):
        a = identifiability(system, method=method)
        assert a.rank == 4 and a.keys() == [("g", 1, 1), ("g", 3, 1)], method
        assert a.per_agent("g") == {1: [1], 2: [], 3: [1]}
    # …but the difference g_1^2 − g_3^2 is estimable (both rows share g_2^1's coefficient)
    vals = random_values(rec, 2, d=3)
    st = simulate(rec, 2, vals, d=3)
    rec_ = estimate(system, [{("g", 1, 2): 1.0, ("g", 3, 2): -1.0}], system.observed(st), vals, a)
    np.testing.assert_allclose(rec_.values[0], vals[("g", 1, 2)] - vals[("g", 3, 2)], atol=1e-10)


def test_exact_recovery_of_non_neighbours_in_noise_free_averaging():
    rec, system = averaging_system("line", 6, [0], 6)
    a = identifiability(system)
    assert [k[1] for k in a.keys()] == [1, 2, 3, 4, 5]
    vals = random_values(rec, 0, d=7, seed=3)
    st = simulate(rec, 6, vals, d=7)
    out = solve(system, system.observed(st), vals, analysis=a)
    far = out[("x0", 5, 0)]  # four hops beyond the attacker's only neighbour
    assert far.noise_std == 0 and far.meta["exact"] and far.meta["rank"] == 5
    np.testing.assert_allclose(far.value.numpy(), vals[("x0", 5, 0)], atol=1e-9)
    for r in out.recovered():
        np.testing.assert_allclose(r.value.numpy(), vals[r.key], atol=1e-9)
    # a later state of the far agent, as an Observation's params would need it
    f = state_functional(system, 4, 5)
    est = estimate(system, [f], system.observed(st), vals, a)
    np.testing.assert_allclose(est.values[0], st[4, 5], atol=1e-9)
    # torch payloads are taken as well
    again = solve(system, torch.from_numpy(system.observed(st)), vals, analysis=a)
    np.testing.assert_allclose(again.values, out.values)


def test_unroll_matches_the_forward_recursion_with_two_components():
    """A heavy-ball recursion, state (x, v): v_t = β v_{t-1} + g_t, x_t = W x_{t-1} − η v_t;
    each unrolled Φ_t applied to the variables gives the simulated state."""
    _, W = graph("ring", 5)
    n, lr, beta = 5, 0.1, 0.9
    I = sp.identity(n)
    Wm = sp.csr_matrix(W.numpy())
    A = sp.bmat([[Wm, -lr * beta * I], [None, beta * I]])
    B = sp.vstack([-lr * I, I])
    rec = Recursion(n=n, transition=lambda t: (A, B), state=("x", "v"), inputs=("g",))
    T = 4
    vals = random_values(rec, T, d=2, seed=1)
    keys = rec.variables(T)
    v = np.stack([vals[k] for k in keys])
    st = simulate(rec, T, vals, d=2)
    for t, phi in unroll(rec, T):
        np.testing.assert_allclose(phi @ v, st[t], atol=1e-12)
    msgs = gossip_messages(W, [0], range(1, T + 1), own=("x", "v"))
    assert Message(1, 0, "v", (0,)) in msgs and Message(2, 4, "x", (0,)) in msgs
    system = knowledge(rec, [0], msgs)
    out = solve(system, system.observed(st), vals)
    for r in out.recovered():
        np.testing.assert_allclose(r.value.numpy(), vals[r.key], atol=1e-9)


def test_field_arithmetic():
    """rref_mod finds the rank and the pivots of a small integer matrix over GF(p)."""
    M = np.array([[1, 2, 3], [2, 4, 6], [0, 1, 1]])
    red, piv = rref_mod(M)
    assert piv == [0, 1] and red[2].tolist() == [0, 0, 0]
    assert red[0].tolist() == [1, 0, 1] and red[1].tolist() == [0, 1, 1]


# -- noise: GLS ------------------------------------------------------------------------------
def noisy_averaging(n: int = 4, sigma: float = 0.3) -> Recursion:
    """x^t = W x^{t-1} + z_t: every agent adds fresh noise each round, which is then gossiped
    on, so one noise draw enters many rows (correlated row errors)."""
    _, W = graph("line", n)
    Wm = sp.csr_matrix(W.numpy())
    return Recursion(
        n=n,
        transition=lambda t: (Wm, sp.identity(n)),
        inputs=("z",),
        noise={"z": sigma},
        name="noisy averaging",
    )


def empirical(system, rec, T, d, analysis, row_std=None, seed=0):
    """Errors of solve over d independent coordinates (each one replicate)."""
    rng = np.random.default_rng(seed)
    vals = {k: rng.normal(size=d) for k in rec.variables(T) if k[0] != "z"}
    vals.update({k: rec.noise["z"] * rng.normal(size=d) for k in rec.variables(T) if k[0] == "z"})
    y = system.observed(simulate(rec, T, vals, d=d))
    if row_std is not None:
        y = y + row_std[:, None] * rng.normal(size=y.shape)
    out = solve(system, y, vals, analysis=analysis, row_cov=row_std)
    err = np.stack([out.values[i] - vals[k] for i, k in enumerate(out.keys)])
    return out, err


def test_gls_std_matches_the_empirical_std_with_gossiped_noise():
    rec, T, d = noisy_averaging(), 5, 40_000
    adj = build_topology("line", 4)
    system = knowledge(rec, [0], gossip_messages(adj, [0], range(T)))
    assert system.noise and ("z", 0, 1) in system.known  # the attacker knows its own draws
    a = identifiability(system)
    assert [k[1] for k in a.keys()] == [1, 2, 3]
    out, err = empirical(system, rec, T, d, a)
    assert out.std[0] == 0  # x_1^0 is received before any noise is added
    assert (out.std[1:] > 0).all()
    emp = err.std(1)
    np.testing.assert_allclose(emp[1:], out.std[1:], rtol=0.03)
    assert np.abs(err[0]).max() < 1e-9
    # GLS is no worse than the min-norm (ordinary) weights it improves on
    Sigma = system.covariance()
    K = system.K.toarray()
    for i, key in enumerate(out.keys):
        r0 = np.linalg.pinv(K.T)[:, system.index(key)]
        assert out.std[i] <= np.sqrt(r0 @ Sigma @ r0) + 1e-12


def test_gls_with_independent_row_noise_of_known_std():
    """Link noise of a different std on each row (row_cov as stds), an overdetermined
    system: the reported std is the empirical one and below the best single row's."""
    rec, system = averaging_system("line", 3, [0], 6, own=None)
    a = identifiability(system)
    R = len(system.rows)
    row_std = np.linspace(0.2, 1.0, R)
    out, err = empirical(system, rec, 6, 40_000, a, row_std=row_std)
    np.testing.assert_allclose(err.std(1), out.std, rtol=0.03)
    assert out.std[0] < row_std[0]  # x_1 is seen in six rows, averaged by GLS


def test_noisy_dpsgd_first_gradients_carry_sigma_over_lr():
    adj, W = graph("ring", 6)
    sigma, lr = 0.02, 0.1
    rec = dpsgd(W, lr, noise_std=sigma)
    system = knowledge(rec, [0], gossip_messages(adj, [0], [1, 2, 3]))
    out = solve(system, np.zeros((len(system.rows), 1)), lambda k: np.zeros(1))
    assert out.keys == [("g", 1, 1), ("g", 5, 1)]
    np.testing.assert_allclose(out.std, sigma / lr)
    assert out[("g", 1, 1)].noise_std == pytest.approx(sigma / lr)


# -- errors ----------------------------------------------------------------------------------
def test_errors_are_one_line():
    rec, system = averaging_system("ring", 6, [0], 2)  # x_3 is hidden after two rounds
    with pytest.raises(PrivauditError, match="not identifiable"):
        solve(system, np.zeros((len(system.rows), 1)), lambda k: np.zeros(1), keys=[("x0", 3, 0)])
    with pytest.raises(PrivauditError, match="not identifiable"):
        estimate(system, [{("x0", 3, 0): 1.0}], np.zeros((len(system.rows), 1)), None)
    with pytest.raises(PrivauditError, match="use qr or exact"):
        identifiability(system, method="lu")
    with pytest.raises(PrivauditError, match="coalition is empty"):
        gossip_messages(graph("ring", 6)[0], [], [0])
    with pytest.raises(PrivauditError, match="known_values"):
        system.rhs(np.zeros((len(system.rows), 1)))
    with pytest.raises(PrivauditError, match="rows"):
        system.rhs(np.zeros((len(system.rows) + 1, 1)), lambda k: np.zeros(1))
    with pytest.raises(PrivauditError, match="not a simple rational"):
        W = graph("ring", 4)[1] * 0.999 + torch.eye(4, dtype=torch.float64) * 0.001 * np.pi
        exact_identifiability(knowledge(averaging(W), [0], gossip_messages(W, [0], [0, 1])))
    with pytest.raises(PrivauditError, match="shape"):
        bad = Recursion(n=3, transition=lambda t: (np.eye(2), None), inputs=())
        knowledge(bad, [0], [Message(1, 1)])
    with pytest.raises(PrivauditError, match="component"):
        knowledge(rec, [0], [Message(0, 1, "v")])


# -- graphs ----------------------------------------------------------------------------------
def test_new_graphs_are_registered_and_shaped():
    assert {"erdos-renyi", "star", "line"} <= set(TOPOLOGIES)
    assert degrees(build_topology("star", 5)).tolist() == [4, 1, 1, 1, 1]
    assert degrees(build_topology("line", 5)).tolist() == [1, 2, 2, 2, 1]
    assert distances(build_topology("line", 5))[0].tolist() == [0, 1, 2, 3, 4]
    assert distances(build_topology("ring", 6))[0].tolist() == [0, 1, 2, 3, 2, 1]
    assert distances(build_topology("star", 4))[1].tolist() == [1, 0, 2, 2]
    disconnected = torch.zeros(3, 3, dtype=torch.bool)
    disconnected[0, 1] = disconnected[1, 0] = True
    assert distances(disconnected)[0].tolist() == [0, 1, -1]


def test_erdos_renyi_is_deterministic_and_connected():
    for n in (2, 5, 16, 40):
        for seed in range(5):
            g = erdos_renyi(n, seed=seed)
            assert torch.equal(g, erdos_renyi(n, seed=seed))
            assert torch.equal(g, g.T) and not g.diagonal().any()
            assert (distances(g) >= 0).all()
    assert torch.equal(build_topology("erdos-renyi", 16), erdos_renyi(16, seed=0))
    draws = {tuple(erdos_renyi(30, seed=s).flatten().tolist()) for s in range(5)}
    assert len(draws) == 5
    # p controls the density; p = 1 is the complete graph
    assert erdos_renyi(30, 0.9).sum() > erdos_renyi(30, 0.2).sum()
    assert torch.equal(erdos_renyi(7, 1.0), build_topology("complete", 7))
    with pytest.raises(PrivauditError, match="no connected"):
        erdos_renyi(40, 0.01)
    for bad in (0, 1.5, -0.1):
        with pytest.raises(PrivauditError, match="edge probability"):
            erdos_renyi(10, bad)
    with pytest.raises(PrivauditError, match="seed"):
        erdos_renyi(10, 0.5, seed=-1)


def test_cut_system_needs_none_of_the_coalitions_inputs_even_when_they_mix_within_a_round():
    """``cut``: the coalition's states are known values. Under Muffliato a member's noised step
    reaches the others within the round (K gossip steps), so its inputs appear in their
    rows; they are rewritten through the member's own recorded states, and the victims are
    recovered from the messages and x_0 alone — no member gradient is asked for."""
    from privaudit.core.recursion import muffliato

    adj, W = graph("line", 5)
    rec = muffliato(W, 0.1, steps=3)
    T = 4
    vals = random_values(rec, T, d=3, seed=2)
    for k in range(5):
        vals[("x0", k, 0)] = vals[("x0", 0, 0)]  # the shared initial model
    st = simulate(rec, T, vals, d=3)
    # every component the member receives (model, model@2, model@3) must be recorded: its
    # own states are computed from them, which is what lets the cut drop its rows
    rows = [m for c in rec.state for m in gossip_messages(adj, [0], range(1, T + 1), c, own=None)]
    s = knowledge(rec, [0], rows, rounds=T, cut=True)
    uncut = knowledge(rec, [0], rows + gossip_messages(adj, [0], range(1, T + 1), own=rec.state))
    assert identifiability(s).keys() == identifiability(uncut).keys()
    assert s.role(("g", 0, 2)) == "known" and not any(m.src == 0 for m in s.rows)
    assert not any(s.known[j][0] == "g" for j in np.unique(s.C.indices))
    public = {("x0", k, 0): vals[("x0", 0, 0)] for k in range(5)}
    out = solve(s, s.observed(st), s.known_from(st, public), reference=vals[("x0", 0, 0)])
    assert {k[1] for k in out.keys} >= {1, 2, 3}
    for i, key in enumerate(out.keys):
        np.testing.assert_allclose(out.values[i], vals[key], atol=1e-8)
