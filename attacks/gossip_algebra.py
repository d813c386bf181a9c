"""Gossip algebra: what curious agents learn beyond their neighbourhood (El Mrini et al. 2024).

El Mrini, Cyffers & Bellet ("Privacy Attacks in Decentralized Learning", ICML 2024) observe
that in gossip averaging and decentralized gradient descent every message is a *known*
linear function (powers and products of the public gossip matrix W) of everyone's private
quantities: the initial values and every update. A coalition A of curious agents that
records what it receives over the rounds therefore holds a linear system — its *knowledge
matrix* — and an agent's private value is reconstructable exactly when its canonical vector
e_u lies in the row space of that matrix, even when the agent is no neighbour of A. This
module is that machinery, independent of any defense:

1. **A linear recursion** (:class:`Recursion`, defined with its builders in
   :mod:`privaudit.core.recursion` so that defenses can state theirs): per-agent states
   s_t ∈ R^S (S = n·#components) driven by per-agent inputs u_t ∈ R^P (P = n·#kinds),

       s_t = A_t s_{t-1} + B_t u_t,     t = 1, …, T,     s_0 the initial states,

   with every coordinate of the d-dimensional payload following the same recursion (W acts
   on agents, not on coordinates). A defense states its linear structure once, as a
   function ``t ↦ (A_t, B_t)``; :func:`averaging` (x^t = W x^{t-1}, El Mrini et al.'s gossip
   averaging of private values x^0) and :func:`dpsgd` (this project's adapt-then-combine
   D-PSGD, ``defenses/dsgd.py``: x̃_t = W x̃_{t-1} − η g_t, x̃_1 = x_0 − η g_1) and
   :func:`tracking` (gradient tracking, ``dsgt``) are given.
   The unknowns are indexed ``(kind, agent, round)``: ``("x0", k, 0)`` for k's initial state
   (component c: ``(c + "0", k, 0)``) and ``("g", k, t)`` for k's round-t input of kind g.
2. **Knowledge** (:class:`LinearSystem`, built by :func:`knowledge`): unrolling the
   recursion, each received message s_t[c, j] is one sparse row over the variables. Variables
   the coalition knows (its own initial states and inputs, public ones such as a shared
   x_0) move to the right-hand side; input kinds declared *noise* (a Gaussian prior of known
   std, e.g. Muffliato's or DP noise) become nuisance unknowns: the rows then read
       y = K u + C k + M z,     z ~ N(0, I),     M = (noise coefficients) · std,
   so noise that enters several rows (gossiped on) makes their errors correlated with
   covariance Σ = M Mᵀ. Modelling noise as extra unknowns with a known prior, rather than
   asking for Σ, is the choice here: Σ then follows from the recursion for free and is
   exact; a further row covariance (e.g. link noise) can still be added when solving. With
   ``cut`` the coalition's own states at every index are known variables too
   (:func:`state_key`, :func:`unroll`): every row is then the others' part plus the
   members' recorded values, and the members' own rows drop out.
3. **Identifiability** (:func:`identifiability`): u is identifiable iff e_u ∈ row(K). It is
   computed from an SVD of K (rows scaled to unit norm, unused unknowns left out), obtained
   as a QR of the tall Kᵀ followed by an SVD of its small triangular factor: with Q_k an
   orthonormal basis of the numerical row space (rank k at relative tolerance ``rtol``, by
   default the rounding of K itself: :func:`default_rtol`), u's *leverage*
   h_u = ‖Q_kᵀ e_u‖² is 1 exactly when e_u ∈ row(K), and its *condition* ‖r'_u‖ says how
   far its solve amplifies the rows' relative errors.
   ``method="exact"`` instead row-reduces K over the prime field GF(2³¹ − 1) after unrolling
   the recursion with its rational coefficients (Metropolis–Hastings weights, step sizes): no
   tolerance and no conditioning, exact unless the prime divides a minor of K (a negligible
   chance): the structural answer, where the float one says what is recoverable numerically.
4. **Solve** (:func:`solve`, :func:`estimate`): for an identifiable u the unbiased linear
   estimators are x̂_u = r_uᵀ y with Kᵀ r_u = e_u; the noise-free answer takes the min-norm
   r_u, and with noise the generalised least-squares (best linear unbiased) one minimises
   Var = ‖Mᵀ r_u‖² (+ r_uᵀ Σ_extra r_u) over r_u ∈ r_0 + null(Kᵀ). The estimate comes with its
   per-coordinate std sqrt(r_uᵀ Σ r_u) (:class:`Recovery`, :class:`Recovered`), which is what
   an :class:`~privaudit.core.observation.Observation` needs as ``target`` and ``noise_std``.
   A linear functional c of the variables (a state, to serve as an Observation's ``params``)
   is estimated the same way when its unknown part lies in row(K); noise variables in c are
   predicted (their part of the error enters the variance). Each estimate also carries the
   error the payloads' own rounding leaves in it (:func:`float_error`): what decides, in
   floating point, how far past the neighbourhood a recovery still is one.

Everything runs on the coefficient structure once; the d-dimensional payloads enter only as
an (R × d) right-hand side. Sizes: unknowns V ≈ n·(T + 1), rows R ≤ (messages of distinct
(round, sender)); the cost is one dense QR of the (U × R) matrix Kᵀ (U used unknowns) and
one SVD of an (min(U, R) × R) triangle.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
import torch
from torch import Tensor

from privaudit.core.errors import PrivauditError
from privaudit.core.recursion import Key, Matrix, Recursion, as_csr

# the recursion vocabulary lives in privaudit.core.recursion (defenses state theirs with it);
# its builders are re-exported here, where the algebra that solves them is
from privaudit.core.recursion import averaging as averaging
from privaudit.core.recursion import dpsgd as dpsgd
from privaudit.core.recursion import tracking as tracking

PRIME = 2**31 - 1  # the field of the exact analysis (products of two residues fit in int64)


# -- the recursion ------------------------------------------------------------------------------
STATE = "state:"  # kind prefix of a coalition member's state entry, known to it (``cut``)


def state_key(component: str, agent: int, t: int) -> Key:
    """The variable ``("state:" + component, agent, t)``: component ``component`` of agent
    ``agent``'s state s_t, a variable of its own once the recursion is cut there
    (:func:`unroll` with ``cut``; the member knows it: it is what it holds and sends)."""
    return (STATE + component, int(agent), int(t))


def cut_variables(rec: Recursion, rounds: int, cut: Collection[int] = ()) -> list[Key]:
    """:meth:`Recursion.variables` (``rounds``) followed, when ``cut`` names agents, by their
    state entries at indices 1 … ``rounds`` (:func:`state_key`), in :func:`unroll`'s order."""
    members = sorted({int(a) for a in cut})
    keys = rec.variables(rounds)
    for t in range(1, rounds + 1):
        keys += [state_key(c, m, t) for c in rec.state for m in members]
    return keys


def unroll(
    rec: Recursion, rounds: int, cut: Collection[int] = ()
) -> Iterable[tuple[int, np.ndarray]]:
    """Yield (t, Φ_t) for t = 0 … ``rounds``: Φ_t (S × V) is the dense coefficient matrix of
    the states s_t over :func:`cut_variables` (``rounds``, ``cut``): s_t = Φ_t v.

    ``cut``: agents (a coalition) whose states are known to the solver. After each step
    their rows of Φ_t are replaced by the unit vectors of their own state variables
    (:func:`state_key`), so later states are expressed through those *values* rather than
    through what made them: with A = coalition and T = the rest, the recursion read from T's
    side is s_T^t = A_TT s_T^{t-1} + A_TA s_A^{t-1} + B_T u^t with s_A^{t-1} a known input
    (El Mrini et al.'s attacker-state subtraction, the B_t of their ``reconstruct_LS``).
    Whatever reached T through a member — including the real, untied history of the other
    agents' updates that passed through it — is then carried by the member's recorded state
    and not re-modelled. A member input that reaches T within the step (B_TA ≠ 0) is
    rewritten through the member's own state (:func:`_through_states`)."""
    S, P = rec.S, rec.P
    V = S + rounds * P
    members = sorted({int(a) for a in cut})
    reset = np.array([ci * rec.n + m for ci in range(len(rec.state)) for m in members], dtype=int)
    rest = np.setdiff1d(np.arange(S), reset)
    own = np.array([ci * rec.n + m for ci in range(len(rec.inputs)) for m in members], dtype=int)
    phi = np.zeros((S, V + reset.size * rounds))
    phi[:, :S] = np.eye(S)
    yield 0, phi
    for t in range(1, rounds + 1):
        A, B = rec.step(t)
        phi = np.asarray(A @ phi)
        if B is not None:
            off = S + (t - 1) * P
            phi[:, off : off + P] += B.toarray()
        if reset.size:
            known = V + (t - 1) * reset.size + np.arange(reset.size)
            if B is not None and own.size:
                _through_states(phi, reset, rest, off + own, known, rec.name)
            phi[reset] = 0.0
            phi[reset, known] = 1.0
        yield t, phi


def _through_states(
    phi: np.ndarray,
    reset: np.ndarray,
    rest: np.ndarray,
    inputs: np.ndarray,
    known: np.ndarray,
    name: str,
) -> None:
    """In place, for a ``cut`` step whose fresh member inputs reach the other agents within
    the step (Muffliato's K gossip steps mix a member's noised step into everyone's y^k):
    rewrite those rows through the members' own states, which the members hold. With B_TA
    and B_AA the inputs' coefficients in the others' and the members' rows and B_TA = M B_AA,
    s_T = … + B_TA u_A = … + M (s_A − (s_A's other terms)): subtract M times the members'
    rows, add M times their known state variables. Refused when B_TA is outside B_AA's row
    space (an input that reaches others but not its own agent's state)."""
    BT, BA = phi[np.ix_(rest, inputs)], phi[np.ix_(reset, inputs)]
    if not np.abs(BT).max(initial=0.0) > 0:
        return
    M = BT @ np.linalg.pinv(BA)
    if np.abs(BT - M @ BA).max() > 1e-10 * np.abs(BT).max():
        raise PrivauditError(
            f"in the {name} recursion a coalition member's input reaches other agents without "
            "passing through its own state, so its states cannot stand for it; solve without "
            "cut"
        )
    phi[rest] -= M @ phi[reset]
    phi[np.ix_(rest, inputs)] = 0.0  # exactly: what is left is the product's rounding
    phi[np.ix_(rest, known)] += M


# -- what the coalition receives -------------------------------------------------------------
@dataclass(frozen=True)
class Message:
    """One recorded value: component ``component`` of agent ``src``'s state s_t, received by
    ``receivers`` (coalition members; ``(src,)`` for a member's own state). A broadcast value
    received by several members is one row."""

    t: int
    src: int
    component: str = "x"
    receivers: tuple[int, ...] = ()


def _members(coalition: Collection[int], n: int) -> list[int]:
    members = sorted({int(a) for a in coalition})
    if not members:
        raise PrivauditError("the coalition is empty; name at least one attacking agent")
    bad = [a for a in members if not 0 <= a < n]
    if bad:
        raise PrivauditError(f"coalition agents {bad} are not in 0..{n - 1}; use agent indices")
    return members


def gossip_messages(
    adj: Matrix,
    coalition: Collection[int],
    rounds: Iterable[int],
    component: str = "x",
    own: Sequence[str] | None = ("x",),
) -> list[Message]:
    """The messages a coalition records when every agent sends state component ``component``
    to its neighbours at each state index in ``rounds`` (``adj``: adjacency or W, off-diagonal
    non-zeros are edges): one row per (t, j) with j ∉ A a neighbour of some member, plus each
    member's own state components ``own`` (known to it; None: none) — redundant for plain
    gossip, informative when a state mixes values the member never sees."""
    a = as_csr(adj)
    n = a.shape[0]
    members = _members(coalition, n)
    inside = set(members)
    heard: dict[int, list[int]] = {}
    for m in members:
        for j in a[m].indices.tolist():
            if j != m and j not in inside:
                heard.setdefault(j, []).append(m)
    out: list[Message] = []
    for t in sorted(set(int(t) for t in rounds)):
        out += [Message(t, j, component, tuple(sorted(r))) for j, r in sorted(heard.items())]
        for c in own or ():
            out += [Message(t, m, c, (m,)) for m in members]
    return out


# -- the linear system ------------------------------------------------------------------------
@dataclass
class LinearSystem:
    """The coalition's knowledge: row r reads y_r = K[r] u + C[r] k + M[r] z (module docstring).

    rows:      the recorded Message of each row.
    unknowns:  keys of K's columns (every variable neither known nor noise, used or not).
    K:         (R × U) CSR, coefficients of the unknowns.
    known:     keys of C's columns (the coalition's own variables, public ones).
    C:         (R × Kn) CSR, coefficients of the known variables (moved to the right side).
    noise:     keys of M's columns (unknown noise inputs).
    M:         (R × Z) CSR, noise coefficients times the noise std: the rows' noise
               covariance is M Mᵀ.
    tied:      variable → the unknown it is assumed equal to (:func:`tie`: El Mrini et al.'s
               constant-gradient approximation); empty for the exact system.
    cut:       the coalition's states are known variables (:func:`knowledge` ``cut``,
               :func:`unroll`): rows and functionals are over :func:`cut_variables`.
    """

    recursion: Recursion
    rounds: int
    coalition: tuple[int, ...]
    rows: list[Message]
    unknowns: list[Key]
    K: sp.csr_matrix
    known: list[Key]
    C: sp.csr_matrix
    noise: list[Key]
    M: sp.csr_matrix
    tied: dict[Key, Key] = field(default_factory=dict)
    cut: bool = False
    _where: dict[Key, tuple[str, int]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for role, keys in (("unknown", self.unknowns), ("known", self.known)):
            self._where.update({k: (role, i) for i, k in enumerate(keys)})
        self._where.update({k: ("noise", i) for i, k in enumerate(self.noise)})
        # a tied variable is read as its representative's column (:func:`tie`)
        self._where.update({k: self._where[r] for k, r in self.tied.items()})

    def role(self, key: Key) -> str:
        """``unknown``, ``known``, ``noise`` or ``absent`` (a noise input of std 0, a round
        past the system's)."""
        return self._where.get(tuple(key), ("absent", -1))[0]

    def index(self, key: Key) -> int:
        """Column of ``key`` among the unknowns."""
        role, i = self._where.get(tuple(key), ("absent", -1))
        if role != "unknown":
            raise PrivauditError(f"{key} is not an unknown of this system (it is {role})")
        return i

    def covariance(self) -> np.ndarray:
        """Σ = M Mᵀ (R × R): the rows' noise covariance per coordinate."""
        return np.asarray((self.M @ self.M.T).todense())

    def observed(self, states: Tensor | np.ndarray) -> np.ndarray:
        """The rows' payloads (R × d) read off a trajectory ``states`` (T + 1, S, d), e.g.
        from :func:`simulate` — what the coalition would have recorded."""
        s = _array(states)
        idx = [self.recursion.component(m.component) * self.recursion.n + m.src for m in self.rows]
        ts = [m.t for m in self.rows]
        return s[ts, idx].reshape(len(self.rows), -1)

    def rhs(
        self,
        observed: Tensor | np.ndarray,
        known_values: Mapping[Key, Any] | Callable[[Key], Any] | None = None,
        reference: Any = None,
    ) -> np.ndarray:
        """y − C k (R × d): the observed payloads (R × d, or (R,) for d = 1, in ``rows``
        order) minus the known variables' part. ``known_values`` maps each known key with a
        non-zero coefficient to its value (a d-vector); a missing one is refused.

        ``reference`` (a d-vector, e.g. the shared x_0): computed as (y − ref) − C (k − ref)
        − ref (C 1 − 1), the same number without subtracting large, nearly equal payloads
        (a D-PSGD message is x_0 + O(η)): the differences are exact (Sterbenz) and only the
        payloads' own rounding is left (:func:`float_error`)."""
        y = _array(observed)
        y = y.reshape(len(self.rows), -1) if y.ndim == 1 else y
        if y.shape[0] != len(self.rows):
            raise PrivauditError(
                f"observed has {y.shape[0]} rows but the system has {len(self.rows)}; pass "
                "one payload per row, in LinearSystem.rows order"
            )
        used = np.unique(self.C.indices)
        if used.size == 0:
            return y
        if known_values is None:
            k0 = self.known[int(used[0])]
            raise PrivauditError(
                f"the rows involve {used.size} known variables such as {k0}; pass their "
                "values as known_values={key: vector}"
            )
        get = known_values if callable(known_values) else known_values.get
        vals = np.zeros((len(self.known), y.shape[1]))
        for i in used.tolist():
            v = get(self.known[i])
            if v is None:
                raise PrivauditError(
                    f"known_values lacks {self.known[i]}, which the coalition knows and the "
                    "rows involve; add its value"
                )
            vals[i] = _array(v).reshape(-1)
        if reference is None:
            return y - np.asarray(self.C @ vals)
        ref = _array(reference).reshape(1, -1)
        vals[used] -= ref
        total = np.asarray(self.C.sum(1)).reshape(-1, 1)
        return (y - ref) - np.asarray(self.C @ vals) - (total - 1.0) * ref

    def known_from(
        self,
        states: Tensor | np.ndarray,
        values: Mapping[Key, Any] | Callable[[Key], Any] | None = None,
    ) -> Callable[[Key], Any]:
        """``known_values`` for :meth:`rhs`/:func:`estimate`: a member's state entry
        (:func:`state_key`, a ``cut`` system's) read off the trajectory ``states`` (T + 1, S,
        d) — what the member held and sent —, any other key from ``values`` (a mapping or a
        callable; None: none)."""
        s = _array(states)
        rec = self.recursion
        get = values if callable(values) else (values or {}).get

        def value(key: Key) -> Any:
            if key[0].startswith(STATE):
                return s[key[2], rec.component(key[0][len(STATE) :]) * rec.n + key[1]]
            return get(key)

        return value

    def functional(self, coeffs: Mapping[Key, float]) -> tuple[np.ndarray, ...]:
        """Split a linear functional Σ c_key · key of the variables into its (unknown, known,
        noise) coefficient vectors; noise coefficients are scaled by their std like M."""
        cu, ck, cz = (
            np.zeros(len(self.unknowns)),
            np.zeros(len(self.known)),
            np.zeros(len(self.noise)),
        )
        for key, c in coeffs.items():
            role, i = self._where.get(tuple(key), ("absent", -1))
            if role == "unknown":
                cu[i] += c
            elif role == "known":
                ck[i] += c
            elif role == "noise":
                cz[i] += c * self.recursion.noise[key[0]]
        return cu, ck, cz


def _array(v: Any) -> np.ndarray:
    if isinstance(v, Tensor):
        return v.detach().cpu().to(torch.float64).numpy()
    return np.asarray(v, dtype=np.float64)


def _default_known(rec: Recursion, members: set[int]) -> Callable[[Key], bool]:
    return lambda key: key[1] in members or key[0] in rec.public


def knowledge(
    rec: Recursion,
    coalition: Collection[int],
    messages: Sequence[Message],
    rounds: int | None = None,
    known: Callable[[Key], bool] | None = None,
    tied: Collection[int] | None = None,
    cut: bool = False,
) -> LinearSystem:
    """The coalition's linear system from the recorded ``messages`` (:func:`gossip_messages`).

    Unrolls ``rec`` to ``rounds`` (default: the last message's round) and gives each message
    its row of Φ_t. A variable is known when ``known(key)`` (default: its agent is a member,
    or its kind is in ``rec.public``); else noise when its kind is in ``rec.noise`` (std > 0;
    std 0: left out), else unknown. Rows that involve no unknown and no noise carry no
    information and are dropped. ``tied``: agents whose update (``rec.update``) is assumed
    the same in every round — El Mrini et al.'s approximation, :func:`tie`; None: exact.

    ``cut``: subtract everything the coalition holds — its states at every index become
    known variables (:func:`state_key`, :func:`unroll` with ``cut``), so each received row
    reads y = (the non-members' part) + A_TA-propagated member *values*, as El Mrini et al.
    build it (their ``reconstruct_LS_target_only`` subtracts B_t = W_TT B_{t-1} + W_TA X_A).
    A member's own message is then one of its known variables (its row is dropped): in a
    protocol a member's next state is computed from what it received and what it holds, so
    that row repeats the received ones — provided ``messages`` hold everything the members
    receive (every carried component of every neighbour, as :func:`gossip_messages` per
    component gives; a component left out would have been seen through the members' rows).
    Nothing is lost against the uncut system then, whose answer it gives with fewer rows
    and unknowns: under :func:`tie` the other agents' real updates that travelled through a
    member reach its neighbours as its recorded values (the uncut system gets there by
    solving the member's per-round updates from its own rows), and no member input is ever
    asked for — where one reaches the others within a round (Muffliato's gossip steps) it is
    rewritten through the member's own states (:func:`unroll`)."""
    n = rec.n
    members = _members(coalition, n)
    msgs = list(messages)
    if not msgs:
        raise PrivauditError("no messages recorded; give the coalition at least one round")
    last = max(m.t for m in msgs)
    rounds = last if rounds is None else int(rounds)
    if min(m.t for m in msgs) < 0 or last > rounds:
        raise PrivauditError(
            f"messages span rounds {min(m.t for m in msgs)}..{last}, outside 0..{rounds}; "
            "raise rounds or drop those messages"
        )
    for m in msgs:
        rec.component(m.component)
        if not 0 <= m.src < n:
            raise PrivauditError(f"message sender {m.src} is not in 0..{n - 1}")
    is_known = known or _default_known(rec, set(members))
    keys = cut_variables(rec, rounds, members if cut else ())
    role = np.empty(len(keys), dtype=object)
    for i, key in enumerate(keys):
        if is_known(key) or key[0].startswith(STATE):
            role[i] = "known"
        elif key[0] in rec.noise:
            role[i] = "noise" if rec.noise[key[0]] > 0 else "absent"
        else:
            role[i] = "unknown"
    by_t: dict[int, list[int]] = {}
    for i, m in enumerate(msgs):
        by_t.setdefault(m.t, []).append(i)
    coef = np.zeros((len(msgs), len(keys)))
    for t, phi in unroll(rec, rounds, members if cut else ()):
        for i in by_t.get(t, []):
            coef[i] = phi[rec.component(msgs[i].component) * n + msgs[i].src]
    scale = np.array([rec.noise.get(k[0], 1.0) for k in keys])
    part = {r: np.flatnonzero(role == r) for r in ("unknown", "known", "noise")}
    informative = (
        np.abs(coef[:, np.concatenate([part["unknown"], part["noise"]])]).max(1, initial=0.0) > 0
    )
    coef = coef[informative]
    rows = [m for m, keep in zip(msgs, informative.tolist(), strict=True) if keep]

    def block(r: str, s: np.ndarray | float = 1.0) -> sp.csr_matrix:
        return sp.csr_matrix(coef[:, part[r]] * s)

    system = LinearSystem(
        recursion=rec,
        rounds=rounds,
        coalition=tuple(members),
        rows=rows,
        unknowns=[keys[i] for i in part["unknown"]],
        K=block("unknown"),
        known=[keys[i] for i in part["known"]],
        C=block("known"),
        noise=[keys[i] for i in part["noise"]],
        M=block("noise", scale[part["noise"]]),
        cut=cut,
    )
    return system if tied is None else tie(system, tied)


def tie(system: LinearSystem, agents: Collection[int], kind: str | None = None) -> LinearSystem:
    """El Mrini, Cyffers & Bellet's gradient-similarity approximation (ICML 2024, §5, D-GD):
    each of ``agents``' unknown inputs of ``kind`` (default the recursion's update, ``g``) is
    taken to be the same in every round of the system, g_k^t = g_k (t = 1..T), so its T
    columns of K merge into one, keyed by its first round (the others alias to it:
    :attr:`LinearSystem.tied`, so ``role``, ``index`` and ``functional`` read any round's key
    as the tied unknown).

    Why: under D-PSGD each round adds one fresh unknown per agent, and a coalition can never
    separate a non-neighbour's (README, "the gossip algebra"); with one unknown per agent
    the neighbours' messages x̃_j^t = −η Σ_{s<t} (W^s)_j g + (the coalition's part) give, on
    a connected graph, up to n equations per coordinate over T ≥ n rounds: the Krylov rows
    e_jᵀ Σ_{s<t} W^s, which reach every agent a walk from the coalition's neighbours reaches.

    The error it makes: the system is solved as if K_tied ḡ = K g, while in a run the
    gradients drift with the models, g_k^t = g_k^1 + δ_k^t with ‖δ_k^t‖ ≤ L ‖x_k^{t-1} − x_0‖
    ≤ L η (t − 1) G (L the loss's smoothness, G a gradient bound). The estimate of g_v^1 is
    rᵀ y with Kᵀ_tied r = e_v, so its error is Σ_{k,t} (rᵀ K)_{(k,t)} δ_k^t: first order in
    η (the rows carry η, r carries 1/η, δ carries η), times the estimator's gain ‖r‖, which
    grows geometrically with the victim's distance. Exact when every agent's gradient is
    constant (η → 0, or a loss linear in the model); never exact under fresh Poisson batches,
    where δ is the batch noise itself (O(1), not O(η)) — :func:`privaudit.api.gossip.
    observe_beyond` refuses it there. The coalition's own inputs stay per round (it knows or
    solves them exactly)."""
    rec = system.recursion
    kind = rec.update if kind is None else kind
    group = {int(a) for a in agents}
    first: dict[int, int] = {}  # agent → column of its first unknown of kind
    alias: dict[Key, Key] = dict(system.tied)
    merge = np.arange(len(system.unknowns))  # old column → new column (before compaction)
    for i, key in enumerate(system.unknowns):
        if key[0] != kind or key[1] not in group:
            continue
        if key[1] in first:
            j = first[key[1]]
            merge[i] = j
            alias[key] = system.unknowns[j]
        else:
            first[key[1]] = i
    keep = np.flatnonzero(merge == np.arange(len(system.unknowns)))
    new = np.full(len(system.unknowns), -1)
    new[keep] = np.arange(keep.size)
    P = sp.csr_matrix(
        (np.ones(len(merge)), (np.arange(len(merge)), new[merge])),
        shape=(len(system.unknowns), keep.size),
    )
    return LinearSystem(
        recursion=rec,
        rounds=system.rounds,
        coalition=system.coalition,
        rows=list(system.rows),
        unknowns=[system.unknowns[i] for i in keep.tolist()],
        K=sp.csr_matrix(system.K @ P),
        known=list(system.known),
        C=system.C,
        noise=list(system.noise),
        M=system.M,
        tied=alias,
        cut=system.cut,
    )


def drift_shift(untied: LinearSystem, drift: Mapping[Key, Any]) -> np.ndarray:
    """K o (R × d): what the updates' drift from their tied value puts in the rows,
    o_(k,t) = g_k^t − g_k^1 for each unknown update key of ``untied`` (the system before
    :func:`tie`) that ``drift`` maps to a d-vector, 0 for the others. Subtracted from the
    observed rows, it leaves exactly K_tied ḡ where the drift is right, so it removes
    :func:`tie`'s first-order error Σ (rᵀ K)_(k,t) δ_k^t to the extent a prediction of
    δ is right — e.g. the run re-simulated from the first pass's recovered examples
    (``benchmarks/anchor.py``, docs/threat-models.md). (R, 1) zeros where ``drift`` holds
    none of the unknowns."""
    keys = [k for k in untied.unknowns if k in drift]
    if not keys:
        return np.zeros((len(untied.rows), 1))
    cols = [untied.index(k) for k in keys]
    values = np.stack([_array(drift[k]).reshape(-1) for k in keys])
    return np.asarray(untied.K[:, cols] @ values)


def state_functional(system: LinearSystem, t: int, agent: int, component: str = "x") -> dict:
    """The coefficients {key: c} of state s_t[component, agent] over the variables: a target
    for :func:`estimate` (e.g. x^k_{t-1}, the point an update's Observation is taken at)."""
    rec = system.recursion
    if not 0 <= t <= system.rounds:
        raise PrivauditError(f"round {t} is outside the system's 0..{system.rounds}")
    cut = system.coalition if system.cut else ()
    keys = cut_variables(rec, t, cut)
    row = rec.component(component) * rec.n + agent
    for s, phi in unroll(rec, t, cut):
        if s == t:
            return {keys[i]: float(phi[row, i]) for i in np.flatnonzero(phi[row])}
    raise AssertionError("unreachable")


def simulate(rec: Recursion, rounds: int, values: Mapping[Key, Any], d: int = 1) -> np.ndarray:
    """Run the recursion forward (no unrolling): states (rounds + 1, S, d) from ``values``
    of the variables (missing ones are 0). The ground truth of tests and benchmarks."""
    n = rec.n
    s = np.zeros((rounds + 1, rec.S, d))
    for ci, c in enumerate(rec.state):
        for k in range(n):
            v = values.get((f"{c}0", k, 0))
            if v is not None:
                s[0, ci * n + k] = _array(v).reshape(-1)
    for t in range(1, rounds + 1):
        A, B = rec.step(t)
        s[t] = A @ s[t - 1]
        if B is not None:
            u = np.zeros((rec.P, d))
            for ci, c in enumerate(rec.inputs):
                for k in range(n):
                    v = values.get((c, k, t))
                    if v is not None:
                        u[ci * n + k] = _array(v).reshape(-1)
            s[t] += B @ u
    return s


# -- identifiability ------------------------------------------------------------------------
@dataclass
class Identifiability:
    """Which unknowns the coalition can reconstruct.

    unknowns:      the system's unknown keys (order of ``identifiable`` and ``leverage``).
    identifiable:  bool per unknown: e_u ∈ row(K).
    leverage:      ‖Q_kᵀ e_u‖² ∈ [0, 1] (1 when identifiable); exactly 0/1 for ``exact``.
    rank:          rank of K (numerical at ``rtol`` for ``qr``).
    method:        ``qr`` or ``exact``.
    condition:     per unknown, κ_u = ‖r'_u‖ (``qr``: :func:`identifiability`), inf where
                   hidden; None for ``exact``.
    rtol:          the rank's cut-off relative to σ_1 (``qr``).
    """

    system: LinearSystem
    unknowns: list[Key]
    identifiable: np.ndarray
    leverage: np.ndarray
    rank: int
    method: str
    _qr: dict[str, Any] | None = field(default=None, repr=False)
    condition: np.ndarray | None = None
    rtol: float | None = None

    def keys(self, kind: str | None = None) -> list[Key]:
        """Identifiable unknowns (of ``kind`` when given)."""
        return [
            k
            for k, ok in zip(self.unknowns, self.identifiable.tolist(), strict=True)
            if ok and (kind is None or k[0] == kind)
        ]

    def status(self, key: Key) -> str:
        """``identifiable``, ``hidden`` (an unknown outside row(K)), ``known``, ``noise`` or
        ``absent``."""
        role = self.system.role(key)
        if role != "unknown":
            return role
        return "identifiable" if self.identifiable[self.system.index(key)] else "hidden"

    def table(self, kind: str) -> tuple[np.ndarray, list[int]]:
        """(n × rounds) int8 table for one variable kind: 1 identifiable, 0 hidden, −1 known
        (or noise/absent), and the rounds of its columns."""
        every = self.system.recursion.variables(self.system.rounds)
        rounds = sorted({k[2] for k in every if k[0] == kind})
        if not rounds:
            raise PrivauditError(f"the system has no variables of kind {kind!r}")
        out = np.full((self.system.recursion.n, len(rounds)), -1, dtype=np.int8)
        col = {r: i for i, r in enumerate(rounds)}
        for key, ok in zip(self.unknowns, self.identifiable.tolist(), strict=True):
            if key[0] == kind:
                out[key[1], col[key[2]]] = int(ok)
        return out, rounds

    def per_agent(self, kind: str) -> dict[int, list[int]]:
        """{agent: rounds whose ``kind`` variable is identifiable} for every non-member."""
        tab, rounds = self.table(kind)
        return {
            k: [r for r, v in zip(rounds, tab[k].tolist(), strict=True) if v == 1]
            for k in range(tab.shape[0])
            if k not in self.system.coalition
        }


def _scaled(
    system: LinearSystem, columns: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(K restricted to its used columns with its rows scaled to unit norm — and its columns
    too when ``columns``; the row scales; the column scales (ones unless ``columns``); the
    used columns). K' = D_r K D_c has K's row space up to the column scaling, so e_u ∈ row(K)
    ⇔ e_u ∈ row(K'). Rows only is the default: a coefficient below the rounding of its row
    is then rounding, as it is in the payloads; scaling the columns would lift an unknown
    whose coefficients gossip has shrunk below that (like w^distance) back to unit size, and
    call identifiable what no float solve recovers."""
    K = system.K
    used = np.unique(K.indices)
    Kd = np.asarray(K[:, used].todense()) if used.size else np.zeros((K.shape[0], 0))
    norms = np.linalg.norm(Kd, axis=1)
    dscale = 1.0 / np.where(norms > 0, norms, 1.0)  # an all-zero row (noise only) keeps 1
    Kd = Kd * dscale[:, None]
    cscale = np.ones(used.size)
    if columns:
        cnorms = np.linalg.norm(Kd, axis=0)
        cscale = 1.0 / np.where(cnorms > 0, cnorms, 1.0)
    return Kd * cscale[None, :], dscale, cscale, used


def default_rtol(system: LinearSystem) -> float:
    """The numerical rank's cut-off relative to σ_1 of the row-scaled K': machine ε times
    max(R, U, T·f) — LAPACK's (and NumPy's ``matrix_rank``'s) ε·max(m, n), raised to the
    rounding the unrolling itself accumulates in K's coefficients (T steps, each entry a sum
    of at most f products, f the largest row count of A_T): a singular value below it is
    indistinguishable from the rounding of a zero one."""
    R, U = system.K.shape
    A, _ = system.recursion.step(max(system.rounds, 1))
    fan = int(np.diff(A.indptr).max(initial=1))
    return float(np.finfo(float).eps * max(R, U, system.rounds * fan, 1))


def identifiability(
    system: LinearSystem,
    method: str = "qr",
    rtol: float | None = None,
    ltol: float = 1e-10,
    equilibrate: bool = False,
) -> Identifiability:
    """Which unknowns are identifiable: e_u ∈ row(K) (El Mrini et al. 2024's criterion).

    ``qr``: K' (K's used columns, rows scaled to unit norm: :func:`_scaled`) as K' = V S Bᵀ,
    from a QR of K'ᵀ and an SVD of its small triangular factor; rank k = #{σ_i > ``rtol``·σ_1}
    (``rtol`` None: :func:`default_rtol`, the float error of K itself), Q_k = B[:, :k] an
    orthonormal basis of row(K), u identifiable iff its leverage ‖Q_kᵀ e_u‖² > 1 − ``ltol``.
    Each identifiable u's *condition* κ_u = ‖Σ_i (Q_k[u, i]/σ_i) v_i‖ = ‖r'_u‖ is the norm
    of its min-norm weights over the unit rows (K'ᵀ r' = e_u): the factor by which relative
    errors of the rows reach its solution — how far gossip has mixed it, where the old fixed
    cut-off (rtol 1e-9) simply hid every unknown past ~11 hops of a line. What a victim's
    recovered value is worth is then said with its payloads: :attr:`Recovery.float_error`.
    ``equilibrate``: scale K's columns to unit norm too (:func:`_scaled`), which counts as
    identifiable unknowns whose coefficients are below their rows' rounding — reached on a
    ring of 64 (gossip averaging, measured errors 1e-6 … 4e-2 at 18 … 28 hops), but claimed
    on a line of 64 where the solve returns rounding (d ≥ 58): off by default.
    ``exact``: rank and identifiability over GF(2³¹ − 1) (:func:`exact_identifiability`)."""
    if method == "exact":
        return exact_identifiability(system)
    if method != "qr":
        raise PrivauditError(f"unknown identifiability method {method!r}; use qr or exact")
    rtol = default_rtol(system) if rtol is None else float(rtol)
    U = len(system.unknowns)
    Ks, dscale, cscale, used = _scaled(system, columns=equilibrate)
    R = Ks.shape[0]
    lev, cond = np.zeros(U), np.full(U, np.inf)
    basis, sv, right = np.zeros((used.size, 0)), np.zeros(0), np.zeros((0, R))
    if used.size and R:
        # K'ᵀ = Q₁ R₁ (BLAS-3 QR of the tall side), then the small R₁ = U₂ S V₂ᵀ: an SVD of
        # K' without forming it, K'ᵀ = (Q₁ U₂) S V₂ᵀ
        Q1, R1 = sla.qr(Ks.T, mode="economic")
        U2, sv, right = sla.svd(R1, full_matrices=False, lapack_driver="gesdd")
        k = int((sv > rtol * sv[0]).sum()) if sv[0] > 0 else 0
        basis, sv, right = Q1 @ U2[:, :k], sv[:k], right[:k]
    lev[used] = (basis**2).sum(1)
    ident = lev > 1 - ltol
    cond[used] = np.where(ident[used], np.linalg.norm(basis / sv, axis=1), np.inf)
    cache = dict(
        basis=basis, sv=sv, right=right, dscale=dscale, cscale=cscale, used=used, ltol=ltol
    )
    return Identifiability(
        system, list(system.unknowns), ident, lev, sv.size, "qr", cache, cond, rtol
    )


def _to_field(x: float, p: int = PRIME) -> int:
    """A float coefficient as an element of GF(p), through the rational it represents: the
    nearest fraction of denominator ≤ 2²⁰ (Metropolis–Hastings weights 1/(1 + d), step sizes
    such as 0.05) when it matches to rounding; an irrational one (a Chebyshev ω) is refused,
    since its best such fraction is typically off by ~2⁻⁴⁰."""
    fr = Fraction(x).limit_denominator(1 << 20)
    if abs(float(fr) - x) > 4 * np.finfo(float).eps * max(1.0, abs(x)):
        raise PrivauditError(
            f"coefficient {x!r} is not a simple rational, so the exact analysis cannot use "
            "it; use identifiability(system, method='qr')"
        )
    return fr.numerator % p * pow(fr.denominator, p - 2, p) % p


def _field_matrix(m: sp.csr_matrix, p: int, memo: dict[float, int]) -> sp.coo_matrix:
    m = m.tocoo()
    vals = [memo.get(v) for v in m.data.tolist()]
    for i, v in enumerate(vals):
        if v is None:
            vals[i] = memo[float(m.data[i])] = _to_field(float(m.data[i]), p)
    data = np.array(vals, dtype=np.int64)
    return sp.coo_matrix((data, (m.row, m.col)), shape=m.shape)


def _field_rows(system: LinearSystem, p: int) -> np.ndarray:
    """K over GF(p), re-unrolled from the recursion's rational coefficients (int64)."""
    rec = system.recursion
    S, P = rec.S, rec.P
    members = system.coalition if system.cut else ()
    keys = cut_variables(rec, system.rounds, members)
    V = S + system.rounds * P
    reset = [ci * rec.n + m for ci in range(len(rec.state)) for m in members]
    phi = np.zeros((S, len(keys)), dtype=np.int64)
    phi[np.arange(S), np.arange(S)] = 1
    rows = np.zeros((len(system.rows), len(keys)), dtype=np.int64)
    by_t: dict[int, list[int]] = {}
    for i, m in enumerate(system.rows):
        by_t.setdefault(m.t, []).append(i)

    def take(t: int) -> None:
        for i in by_t.get(t, []):
            m = system.rows[i]
            rows[i] = phi[rec.component(m.component) * rec.n + m.src]

    take(0)
    memo: dict[float, int] = {}
    for t in range(1, system.rounds + 1):
        A, B = rec.step(t)
        A = _field_matrix(A, p, memo)
        new = np.zeros_like(phi)
        for i, j, a in zip(A.row.tolist(), A.col.tolist(), A.data.tolist(), strict=True):
            new[i] = (new[i] + a * phi[j]) % p
        if B is not None:
            B = _field_matrix(B, p, memo)
            off = S + (t - 1) * P
            for i, j, b in zip(B.row.tolist(), B.col.tolist(), B.data.tolist(), strict=True):
                new[i, off + j] = (new[i, off + j] + b) % p
        if reset and B is not None:  # as unroll's _through_states, which is float-only
            others = np.setdiff1d(np.arange(S), reset)
            cols = [
                S + (t - 1) * P + ci * rec.n + m for ci in range(len(rec.inputs)) for m in members
            ]
            if new[np.ix_(others, cols)].any():
                raise PrivauditError(
                    f"the exact analysis of a cut {rec.name} system, whose members' inputs "
                    "reach the others within a round, is not available; use method='qr'"
                )
        for r, i in enumerate(reset):  # the coalition's states: known values (cut)
            new[i] = 0
            new[i, V + (t - 1) * len(reset) + r] = 1
        phi = new
        take(t)
    col = {k: i for i, k in enumerate(keys)}
    out = rows[:, [col[k] for k in system.unknowns]]
    for key, rep in system.tied.items():  # a tied variable's column adds to its unknown's
        i = system.index(rep)
        out[:, i] = (out[:, i] + rows[:, col[key]]) % p
    return out


def rref_mod(M: np.ndarray, p: int = PRIME) -> tuple[np.ndarray, list[int]]:
    """Reduced row echelon form of an int64 matrix over GF(p) (p < 2³¹), and its pivot
    columns. Column by column; each pivot clears its column in every other row (residues
    below 2³¹, so a product and a difference fit in int64)."""
    M = np.array(M, dtype=np.int64) % p
    R, U = M.shape
    pivots: list[int] = []
    row = 0
    for c in range(U):
        if row == R:
            break
        nz = np.flatnonzero(M[row:, c])
        if nz.size == 0:
            continue
        i = row + int(nz[0])
        if i != row:
            M[[row, i]] = M[[i, row]]
        M[row, c:] = M[row, c:] * pow(int(M[row, c]), p - 2, p) % p
        f = M[:, c].copy()
        f[row] = 0
        hit = np.flatnonzero(f)
        if hit.size > R // 2:  # most rows: whole-slice updates, no gather/scatter
            block = M[:, c:]
            block -= np.multiply.outer(f, M[row, c:])
            block %= p
        elif hit.size:
            M[hit, c:] = (M[hit, c:] - f[hit, None] * M[row, c:]) % p
        pivots.append(c)
        row += 1
    return M, pivots


def exact_identifiability(system: LinearSystem, p: int = PRIME) -> Identifiability:
    """Identifiability with exact arithmetic over GF(p): K's rows are re-unrolled from the
    recursion's rational coefficients (refused when one is not a simple rational, e.g. a
    Chebyshev ω), reduced to RREF, and e_u ∈ row(K) iff the RREF row whose pivot is u has no
    other non-zero (a non-pivot column is never in the row space). Equal to the rational
    answer unless p divides a minor of K."""
    Kp = _field_rows(system, p)
    U = Kp.shape[1]
    used = np.flatnonzero(Kp.any(0))
    ident = np.zeros(U, dtype=bool)
    rank = 0
    if used.size and Kp.shape[0]:
        red, piv = rref_mod(Kp[:, used], p)
        rank = len(piv)
        for r, c in enumerate(piv):
            ident[used[c]] = np.count_nonzero(red[r]) == 1
    return Identifiability(
        system, list(system.unknowns), ident, ident.astype(float), rank, "exact", None
    )


# -- solving ----------------------------------------------------------------------------------
@dataclass
class Recovered:
    """One reconstructed linear quantity: what an Observation needs.

    key:        the variable (or a label for a functional).
    value:      the estimate, a float64 (d,) tensor (``target`` of an Observation, after the
                defense's own scaling, e.g. a gradient g = value).
    noise_std:  per-coordinate std of the estimate's error (0: exact up to rounding).
    meta:       ``exact`` (noise_std == 0), ``rank``, ``gain`` (‖r‖₂, the amplification of
                unit row noise), ``rows`` (messages with a non-zero weight, as (t, src)),
                ``float_error`` (the per-coordinate RMS error the payloads' rounding leaves,
                :func:`float_error`).
    """

    key: Any
    value: Tensor
    noise_std: float
    meta: dict[str, Any]


@dataclass
class Recovery:
    """Estimates of several targets: ``values`` (q × d), per-coordinate ``std`` (q,), the
    weights ``weights`` (q × R: value = weights @ (y − C k)) and ``keys`` naming each.
    ``float_error`` (q,): the estimated per-coordinate RMS error that the payloads' own
    rounding leaves in each value (:func:`float_error`; zeros when not estimated)."""

    keys: list[Any]
    values: np.ndarray
    std: np.ndarray
    weights: np.ndarray
    rank: int
    rows: list[Message]
    float_error: np.ndarray | None = None

    def __getitem__(self, key: Any) -> Recovered:
        try:
            i = self.keys.index(key)
        except ValueError:
            raise PrivauditError(f"{key} was not recovered (not identifiable)") from None
        w = self.weights[i]
        used = [(m.t, m.src) for m, x in zip(self.rows, w.tolist(), strict=True) if x != 0]
        fe = 0.0 if self.float_error is None else float(self.float_error[i])
        meta = dict(
            exact=bool(self.std[i] == 0),
            rank=self.rank,
            gain=float(np.linalg.norm(w)),
            rows=used,
            float_error=fe,
        )
        return Recovered(key, torch.from_numpy(self.values[i].copy()), float(self.std[i]), meta)

    def recovered(self) -> list[Recovered]:
        """One :class:`Recovered` per target, in ``keys`` order."""
        return [self[k] for k in self.keys]


def _row_cov(system: LinearSystem, row_cov: Matrix | None) -> np.ndarray | None:
    """Extra row covariance: None, per-row stds (R,), or a dense/sparse (R × R) matrix."""
    if row_cov is None:
        return None
    R = len(system.rows)
    c = np.asarray(row_cov.todense()) if sp.issparse(row_cov) else _array(row_cov)
    if c.ndim == 1:
        if c.shape != (R,) or (c < 0).any():
            raise PrivauditError(f"row_cov as stds needs {R} non-negative values, got {c.shape}")
        return np.diag(c**2)
    if c.shape != (R, R):
        raise PrivauditError(f"row_cov must be ({R}, {R}) or ({R},) stds, got {c.shape}")
    return c


def estimate(
    system: LinearSystem,
    targets: Sequence[Mapping[Key, float]],
    observed: Tensor | np.ndarray,
    known_values: Mapping[Key, Any] | Callable[[Key], Any] | None = None,
    analysis: Identifiability | None = None,
    row_cov: Matrix | None = None,
    names: Sequence[Any] | None = None,
    reference: Any = None,
    roundoff: float | None = None,
) -> Recovery:
    """Best linear unbiased estimates of linear functionals c of the variables.

    For each target c = (c_u, c_k, c_z) (:meth:`LinearSystem.functional`), c_u must lie in
    row(K) (refused otherwise, naming it). Among r with Kᵀ r = c_u (unbiased for every u)
    the one minimising the error variance ‖Mᵀ r − c_z‖² + rᵀ Σ_extra r is taken: r = r_0 + Z a
    with r_0 the min-norm solution and Z a basis of null(Kᵀ) (GLS; noise-free rows:
    r = r_0). The estimate is rᵀ (y − C k) + c_kᵀ k, its per-coordinate std the square root
    of that variance. ``analysis``: a ``qr`` :func:`identifiability` of ``system`` to reuse;
    ``row_cov``: extra row noise, per-row stds (R,) or a covariance (R × R); ``reference``:
    the point y − C k is computed around (:meth:`LinearSystem.rhs`, e.g. the shared x_0);
    ``roundoff``: the payloads' unit roundoff for :func:`float_error` (None: their dtype's)."""
    if analysis is None or analysis._qr is None:
        analysis = identifiability(system)
    names = list(names) if names is not None else list(range(len(targets)))
    split = [system.functional(c) for c in targets]
    q = len(split)
    Cu = np.array([s[0] for s in split]).reshape(q, len(system.unknowns))
    Ck = np.array([s[1] for s in split]).reshape(q, len(system.known))
    Cz = np.array([s[2] for s in split]).reshape(q, len(system.noise))
    extra = _row_cov(system, row_cov)
    M = system.M.toarray()
    weights = _weights(system, analysis, Cu, Cz, names, M, extra)
    y = system.rhs(observed, known_values, reference)
    values = weights @ y
    for j in np.flatnonzero(np.abs(Ck).max(0, initial=0.0) > 0).tolist():
        get = known_values if callable(known_values) else (known_values or {}).get
        v = get(system.known[j])
        if v is None:
            raise PrivauditError(f"known_values lacks {system.known[j]}, which a target uses")
        values = values + np.outer(Ck[:, j], _array(v).reshape(-1))
    err = weights @ M - Cz
    var = (err**2).sum(1)
    if extra is not None:
        var = var + np.einsum("qr,rs,qs->q", weights, extra, weights)
    # rounding: a variance at the level of float error against the noise it cancelled is 0
    level = np.abs(M).max(initial=0.0) ** 2 + (0.0 if extra is None else np.abs(extra).max())
    var[var <= 1e-18 * ((weights**2).sum(1) * level + (Cz**2).sum(1))] = 0.0
    fe = float_error(system, weights, observed, known_values, roundoff)
    std = np.sqrt(np.maximum(var, 0.0))
    return Recovery(names, values, std, weights, analysis.rank, list(system.rows), fe)


def _weights(
    system: LinearSystem,
    analysis: Identifiability,
    Cu: np.ndarray,
    Cz: np.ndarray,
    names: list[Any],
    M: np.ndarray,
    extra: np.ndarray | None,
) -> np.ndarray:
    """:func:`estimate`'s weights (q × R) over the rows: the min-norm unbiased r_0 through
    the row-scaled K' = D_r K D_c (:func:`_scaled`), then the GLS step in null(Kᵀ)."""
    qr = analysis._qr
    assert qr is not None
    q, R, k = Cu.shape[0], len(system.rows), analysis.rank
    used, dscale, Qk = qr["used"], qr["dscale"], qr["basis"]
    # in K'`s columns the target is D_c c_u; it must lie in row(K') = span(Q_k), to the
    # analysis' leverage tolerance
    cs = Cu[:, used] * qr["cscale"][None, :]
    b = Qk.T @ cs.T  # (k × q)
    resid = np.linalg.norm(cs.T - Qk @ b, axis=0) if q else np.zeros(0)
    off = np.linalg.norm(np.delete(Cu, used, axis=1), axis=1)
    bad = np.flatnonzero((resid**2 > qr["ltol"] * np.linalg.norm(cs, axis=1) ** 2) | (off > 0))
    if bad.size:
        raise PrivauditError(
            f"target {names[int(bad[0])]} is not identifiable from the coalition's messages "
            "(its unknown part is outside the knowledge matrix's row space); estimate only "
            "Identifiability.keys()"
        )
    # K'ᵀ = Q_k S_k V_kᵀ: K'ᵀ r' = D_c c_u ⇔ S_k V_kᵀ r' = Q_kᵀ D_c c_u, min-norm r' =
    # V_k S_k⁻¹ b; null(K'ᵀ) = V_k's orthogonal complement. Rows: K' = D_r K D_c and
    # Kᵀ (D_r r') = D_c⁻¹ K'ᵀ r' = c_u, so r = D_r r'.
    right = qr["right"]
    weights = ((right.T @ (b / qr["sv"][:, None])) * dscale[:, None]).T
    Sigma = M @ M.T + (0.0 if extra is None else extra)
    if k < R and q and np.abs(Sigma).max(initial=0.0) > 0:
        Z = sla.qr(right.T, mode="full")[0][:, k:] if k else np.eye(R)
        Z = Z * dscale[:, None]
        G = Z.T @ Sigma @ Z
        h = Z.T @ (Sigma @ weights.T - M @ Cz.T)
        weights = weights - (Z @ np.linalg.lstsq(G, h, rcond=None)[0]).T
    return weights


def unit_roundoff(payload: Any) -> float:
    """The unit roundoff u of a payload's float type: 2⁻²⁴ for float32, 2⁻⁵³ for float64."""
    dtype = payload.dtype if isinstance(payload, (Tensor, np.ndarray)) else np.float64
    if isinstance(dtype, torch.dtype):
        return float(torch.finfo(dtype).eps) / 2
    return float(np.finfo(dtype).eps) / 2 if np.issubdtype(dtype, np.floating) else 2.0**-53


def float_error(
    system: LinearSystem,
    weights: np.ndarray,
    observed: Tensor | np.ndarray,
    known_values: Mapping[Key, Any] | Callable[[Key], Any] | None = None,
    roundoff: float | None = None,
) -> np.ndarray:
    """The per-coordinate RMS error (q,) that rounding the payloads leaves in the estimates
    ``weights`` @ (y − C k): rounding to nearest leaves each recorded number an error uniform
    within ±u·|value| at most (u the unit roundoff of its float type, ``roundoff`` or
    ``observed``'s), of RMS at most u·|value|/√3, independent between messages and
    coordinates, so row r contributes (u²/3)(m_r² + Σ_k C_rk² m_k²) (m: a payload's RMS over
    its coordinates) and

        err_q = (u/√3) · sqrt(Σ_r w_qr² (m_r² + Σ_k C_rk² m_k²)).

    This is the error that decides how far a recovery reaches: on a line the weights of an
    agent d hops away grow like w^(−d), and once err_q reaches the value itself the agent is
    lost to rounding though e_u ∈ row(K). Model error (the tied approximation's drift) is not
    in it. Public keys read through ``known_values`` are exact (no rounding of their own)."""
    u = unit_roundoff(observed) if roundoff is None else float(roundoff)
    y = _array(observed)
    y = y.reshape(len(system.rows), -1) if y.ndim == 1 else y
    power = (y**2).mean(1)
    C = system.C.tocsc()
    used = np.flatnonzero(np.diff(C.indptr) > 0)
    get = known_values if callable(known_values) else (known_values or {}).get
    for j in used.tolist():
        key = system.known[j]
        if key[0] in system.recursion.public:
            continue  # the shared initial model: known exactly to the coalition
        v = get(key)
        if v is not None:
            col = C[:, j].toarray().ravel()
            power = power + col**2 * float((_array(v) ** 2).mean())
    return u / np.sqrt(3.0) * np.sqrt((weights**2) @ power)


def relative_error(values: np.ndarray, error: np.ndarray) -> np.ndarray:
    """Each estimate's error against its signal (q,): err / sqrt(RMS(value)² − err²), the
    value's RMS with the error's share taken out (inf where the error explains all of it:
    the estimate is rounding, not a signal). ``values`` (q × d), ``error`` (q,) per-coordinate
    RMS errors (:func:`float_error`)."""
    ms = (np.asarray(values, dtype=np.float64) ** 2).reshape(len(error), -1).mean(1)
    signal = np.sqrt(np.maximum(ms - error**2, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(signal > 0, error / np.where(signal > 0, signal, 1.0), np.inf)


def solve(
    system: LinearSystem,
    observed: Tensor | np.ndarray,
    known_values: Mapping[Key, Any] | Callable[[Key], Any] | None = None,
    analysis: Identifiability | None = None,
    row_cov: Matrix | None = None,
    keys: Sequence[Key] | None = None,
    reference: Any = None,
) -> Recovery:
    """Recover every identifiable unknown (or ``keys``, each of which must be identifiable):
    exact in the noise-free case, GLS with its std otherwise (:func:`estimate` with
    e_u as targets; ``reference`` as there)."""
    if analysis is None or analysis._qr is None:
        analysis = identifiability(system)
    keys = list(keys) if keys is not None else analysis.keys()
    targets = [{key: 1.0} for key in keys]
    for key in keys:
        system.index(key)
    return estimate(
        system, targets, observed, known_values, analysis, row_cov, names=keys, reference=reference
    )
