"""SPEAR: exact batch recovery from a ReLU linear layer's gradient (Dimitrov, Baader, Müller
& Vechev, "SPEAR: Exact Gradient Inversion of Batches in Federated Learning", NeurIPS 2024).

For a linear layer ``Z = W X + c 1ᵀ`` (X: n × b, the b examples' inputs as columns) followed
by a ReLU, the observed gradient (divided by ``scale``) is

    ∂W = ∂Z Xᵀ,    ∂c = ∂Z 1                       (the paper's §3: rank ∂W ≤ b)

With its rank-b SVD ``∂W = L R`` (L: m × b, R: b × n) there is one invertible ``Q`` (b × b)
with ``∂Z = L Q`` and ``Xᵀ = Q⁻¹ R`` (the paper's low-rank decomposition): the batch is ``Q``'s
b columns. The ReLU makes ``∂Z`` sparse — ``∂Z_ki = 0`` wherever ``Z_ki ≤ 0``, about half the
entries of an untrained layer — and that finds them (the paper's §4):

1. **Sampling.** Pick b − 1 rows A of L at random (``samples`` times, uniformly, as the paper
   does). If every row of A is a zero of column i of ∂Z, ``L_A q_i = 0``, so the kernel of
   ``L_A`` (one direction, generically) is ``q_i`` up to scale.
2. **Sparsity filter.** A wrong sample gives a direction whose column ``L q̄`` has only the
   b − 1 forced zeros; a right one has every zero of its example (≈ m/2). Directions with at
   least ``tau · m`` zeros are kept (the paper's threshold τ*·m), duplicates merged.
3. **Greedy selection.** Of the candidates, b directions are chosen, sparsest first, and
   single swaps are kept while they raise the *sparsity matching* of the reconstruction:
   the fraction of entries where ``Z = W X + c`` predicts an inactive unit exactly where the
   recovered ``∂Z`` is zero (1 for the true batch); accepted at ``match``.
4. **Scales.** ``∂c = ∂Z 1 = L Q̄ s`` is linear in the b unknown scales ``s`` of the unit
   directions ``Q̄``: least squares gives ``Q = Q̄ diag(s)`` and ``Xᵀ = Q⁻¹ R``.

The cost is the paper's: a sample hits example i with probability ``C(z_i, b−1)/C(m, b−1)``
≈ 2^−(b−1) (``z_i`` ≈ m/2 zeros), so the samples needed grow exponentially with b (the
paper recovers b ≲ 25 on a GPU). ``meta["spear"]`` says how many examples were found.

**Beyond the paper: the next layer** (``next_layer``, where a ReLU joins the layer to another
linear layer whose gradient ``∂W' = ∂Z' relu(Z)ᵀ`` has rank b and m ≥ 2b — an MLP's second
layer). Its row space is ``span{relu(z_j)}``, so one found direction gives its example alone:
its ReLU pattern ``D_i`` is the nonzero rows of ``L q_i``, and ``x_i = Rᵀ p_i`` solves
``N D_i (W Rᵀ p_i + c) = 0`` (N the projector off that row space; m equations of rank m − b
in b unknowns) — exact, and a check: a wrong direction's pattern does not solve. The found
examples are then projected out of the row side, ``∂W (I − Π_X) = L (I − Π_P) R``, which keeps
the others' sparse columns at rank b − k: each find halves the samples the next one needs,
so the cost is that of the first few finds instead of the rarest one's. Examples still
unconfirmed at the end go to the paper's selection (3–4) with those found; examples not
found at all are returned as the mean image (:mod:`.disaggregation`).

**Clipping** multiplies column i of ``∂Z`` by an unknown ``f_i > 0`` in both ``∂W`` and
``∂c``: it rescales ``q_i`` and cancels in ``Xᵀ = Q⁻¹ R`` and in the zero pattern — the attack is
invariant to it. **Noise** ``N(0, σ²)`` on every coordinate (σ = ``noise_std / scale``, known):
the rank-b truncation of the SVD removes the noise outside the signal's span (the
least-squares denoiser for i.i.d. noise); an entry of ``L q̄`` (unit ``q̄``) then carries noise
of std σ, so "zero" means ``|·| ≤ zero_sigmas · σ`` (and ``≤ zero_tol`` of the column's largest
entry without noise); each kept direction is re-solved from *all* its zero rows (least
squares over ≈ m/2 rows instead of b − 1), and the scales from all m bias equations. Noise
large against ``∂Z``'s entries erases the zero pattern: the filter then finds nothing, which
``meta`` reports — no claim that noise stops the attack is made beyond that count.

**Below the classifier** (``search="auto"``): where the layer's ReLU feeds the classifier,
each example's column of ∂Z is ``d_i ⊙ W₂ᵀ(p_i − y_i)``, and :mod:`.vertex` finds it as a
vertex of a per-class polytope by linear programming — also at B where the sampling expects
no find (``fedavg-cnn`` at B = 64).

Where that layer is not the first (an MLP's last hidden layer: ``layer="auto"`` picks it
wherever :mod:`.descent` leads from it down to the first linear layer, unless
``search="sample"``), the layers below are solved exactly once all B are found
(:mod:`.descent`). A layer after a convolutional trunk (``fedavg-cnn``'s FC 512) gives
features; they are inverted to images by the ``fi`` attack's feature inversion
(:mod:`.disaggregation`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from privaudit.core.errors import PrivauditError
from privaudit.core.observation import Observation, Reconstruction

from . import vertex
from .common import as_list, progress_bar
from .descent import bottom, descend
from .disaggregation import Separated, finish, layer_params, pick_layer
from .fi import DEFAULT_ITERATIONS
from .identifiability import (
    LinearLayer,
    layer_gradient,
    linear_layers,
    noise_edge,
    numerical_rank,
    top_singular,
)
from .registry import NON_NEGATIVE, POSITIVE, UNIT_OPEN, Rule, one_of, register_attack

DEFAULT_SAMPLES = 1 << 17  # b − 1-row submatrices drawn (SPEAR's N)
CHUNK = 4096  # submatrices solved per batched QR
TAU = 0.35  # a kept direction has at least tau · m zeros (SPEAR's τ*)
ZERO_TOL = 1e-6  # without noise, |entry| ≤ this × the column's largest is a zero
ZERO_SIGMAS = 3.0  # with noise of std σ, |entry| ≤ this × σ is a zero
SAME = 1e-4  # two unit directions with |cos| > 1 − SAME are one
SHARP = 1e3  # a kept direction is the only near-kernel of its zero rows
SINGULAR = 1e-8  # a selection whose smallest singular value is below this is rank-deficient
GREEDY_ROUNDS = 4  # passes of single swaps in the greedy selection
ROUND = 4 * CHUNK  # samples between two checks of the search (next_layer)
REFINED = 4  # at most this many candidates per example are refined per round
INACTIVE = 0.5  # the share of a ReLU layer's units an example leaves inactive (estimate)
MIN_FINDS = 1e-3  # a budget expecting fewer finds than this is not searched


@dataclass
class Layer:
    """The gradient of one linear layer in SPEAR's factors, float64 on the CPU."""

    L: Tensor  # (m, b): ∂W = L R
    R: Tensor  # (b, n), orthonormal rows
    db: Tensor | None  # (m,) ∂c
    M: Tensor  # (m, b) = W Rᵀ: Z = M P + c for X = Rᵀ P
    c: Tensor  # (m,) the layer's bias
    sigma: float  # noise std per coordinate of ∂W (0: none)
    zero_tol: float
    zero_sigmas: float

    def zeros(self, cols: Tensor) -> Tensor:
        """Which entries of ``cols`` (m, k) count as zero (module docstring)."""
        thr = self.zero_tol * cols.abs().amax(0, keepdim=True)
        if self.sigma > 0:
            thr = torch.maximum(thr, torch.full_like(thr, self.zero_sigmas * self.sigma))
        return cols.abs() <= thr


def factor(
    obs: Observation, layer: LinearLayer, b: int, zero_tol: float, zero_sigmas: float
) -> Layer:
    """``∂W = L R`` truncated to rank b (the paper's low-rank decomposition) with the
    layer's weights; refused, with the identifiability bound, below rank b."""
    dw, db = layer_gradient(obs, layer)
    u, s, vh = top_singular(dw, b)
    edge = noise_edge(obs, tuple(dw.shape))
    rank = numerical_rank(s, edge)
    if rank < b:
        raise PrivauditError(
            f"SPEAR needs the gradient of {layer.module} to have rank B = {b}; it has rank "
            f"{rank} (shape {tuple(dw.shape)}): at most {rank} of {b} examples can be "
            "separated from it (privaudit.attacks.identifiability)"
        )
    w, c = layer_params(obs, layer)
    scale = float(obs.scale) if obs.scale else 1.0
    sigma = float(obs.noise_std) / abs(scale)
    r = vh[:b]
    return Layer(u[:, :b] * s[:b], r, db, w @ r.T, c, sigma, zero_tol, zero_sigmas)


def sample_directions(
    ly: Layer, samples: int, tau: float, gen: torch.Generator, advance: Callable[[], None]
) -> Tensor:
    """Steps 1–2: the kernels of ``samples`` uniformly drawn (b − 1)-row submatrices of L whose
    column has at least ``tau · m`` zeros, as unit rows (k, b)."""
    m, b = ly.L.shape
    need = max(int(tau * m), b)
    kept = []
    for start in range(0, samples, CHUNK):
        n = min(CHUNK, samples - start)
        rows = torch.rand(n, m, generator=gen, dtype=torch.float64).argsort(1)[:, : b - 1]
        qf, _ = torch.linalg.qr(ly.L[rows].transpose(1, 2), mode="complete")
        q = qf[:, :, -1]  # (n, b): orthogonal to the b − 1 rows
        keep = ly.zeros(ly.L @ q.T).sum(0) >= need
        kept.append(q[keep])
        for _ in range(n):
            advance()
    return torch.cat(kept) if kept else torch.zeros(0, b, dtype=torch.float64)


def candidates(
    ly: Layer, samples: int, tau: float, gen: torch.Generator, advance: Callable[[], None]
) -> Tensor:
    """Steps 1–2 with duplicates merged and the sparsest ``REFINED`` × b directions refined
    (a mixture of examples is zero only where all of them are: it is never sparser than
    each of its examples), sparsest first."""
    q = unique(sample_directions(ly, samples, tau, gen, advance))
    zeros = ly.zeros(ly.L @ q.T).sum(0)
    q = q[zeros.argsort(descending=True, stable=True)[: REFINED * ly.L.shape[1]]]
    return unique(refine(ly, q))


def refine(ly: Layer, q: Tensor, rounds: int = 2) -> Tensor:
    """Each direction re-solved as the least right singular vector of L restricted to all its
    zero rows (noise averaged over ≈ m/2 equations instead of b − 1); kept only where that
    kernel is one direction (the second smallest singular value at least ``SHARP`` times the
    smallest) and its zeros still number at least b — sparsest first."""
    b = ly.L.shape[1]
    out, zeros = [], []
    for v in q:
        sv = None
        for _ in range(rounds):
            rows = ly.zeros((ly.L @ v)[:, None])[:, 0]
            if int(rows.sum()) < b - 1:
                break
            _, sv, vh = torch.linalg.svd(ly.L[rows], full_matrices=True)
            v = vh[-1]
        count = int(ly.zeros((ly.L @ v)[:, None]).sum())
        sharp = (
            sv is not None
            and len(sv) >= b
            and (b == 1 or float(sv[b - 2]) > SHARP * float(sv[b - 1]))
        )
        if sharp and count >= b:
            out.append(v / v.norm())
            zeros.append(count)
    if not out:
        return torch.zeros(0, b, dtype=torch.float64)
    order = torch.tensor(zeros).argsort(descending=True, stable=True)
    return torch.stack(out)[order]


def unique(q: Tensor) -> Tensor:
    """One row per direction (|cos| > 1 − SAME is the same one), the first kept."""
    out: list[Tensor] = []
    for v in q:
        if all(float((v @ u).abs()) <= 1 - SAME for u in out):
            out.append(v)
    return torch.stack(out) if out else q


@dataclass
class Selection:
    """Chosen unit directions (b, b) as columns, their scales, and the sparsity matching."""

    qbar: Tensor
    scales: Tensor
    matching: float
    swaps: int = 0
    history: list[float] = field(default_factory=list)


def scales(ly: Layer, qbar: Tensor) -> Tensor:
    """Step 4: ``s`` from ``∂c = L Q̄ s`` (least squares); ones without a bias."""
    if ly.db is None:
        return torch.ones(qbar.shape[1], dtype=torch.float64)
    return torch.linalg.lstsq(ly.L @ qbar, ly.db[:, None]).solution.flatten()


def matching(ly: Layer, qbar: Tensor) -> tuple[float, Tensor]:
    """Sparsity matching (step 3) of unit directions ``qbar`` (b, b) and their scales."""
    if float(torch.linalg.svdvals(qbar)[-1]) < SINGULAR:
        return 0.0, torch.ones(qbar.shape[1], dtype=torch.float64)
    s = scales(ly, qbar)
    q = qbar * s
    if not bool(torch.isfinite(q).all()) or float(torch.linalg.svdvals(q / q.norm())[-1]) < 1e-12:
        return 0.0, s
    p = torch.linalg.inv(q)  # rows: x_iᵀ = p_iᵀ R
    z = ly.M @ p.T + ly.c[:, None]  # (m, b)
    active = ~ly.zeros(ly.L @ q)
    return float(((z > 0) == active).double().mean()), s


def select(ly: Layer, cands: Tensor, rounds: int = GREEDY_ROUNDS) -> Selection:
    """Step 3: b of the candidate directions (rows, sparsest first), improved by single
    swaps while the sparsity matching rises; at least b candidates needed."""
    b = ly.L.shape[1]
    order = ly.zeros(ly.L @ cands.T).sum(0).argsort(descending=True, stable=True)
    cands = cands[order]
    chosen: list[int] = []
    for k in range(len(cands)):
        trial = torch.stack([cands[i] for i in [*chosen, k]], 1)
        if float(torch.linalg.svdvals(trial)[-1]) >= SINGULAR:
            chosen.append(k)
        if len(chosen) == b:
            break
    if len(chosen) < b:  # fewer independent directions than examples
        return Selection(cands[chosen].T, torch.ones(len(chosen), dtype=torch.float64), 0.0)
    best, s = matching(ly, cands[chosen].T)
    sel = Selection(cands[chosen].T, s, best, history=[best])
    for _ in range(rounds):
        improved = False
        for k in (k for k in range(len(cands)) if k not in chosen):
            for pos in range(b):
                trial = [*chosen[:pos], k, *chosen[pos + 1 :]]
                score, s = matching(ly, cands[trial].T)
                if score > best + 1e-12:
                    chosen, best, improved = trial, score, True
                    sel = Selection(cands[chosen].T, s, best, sel.swaps + 1, sel.history)
                    sel.history.append(best)
                    break
        if not improved or best >= 1.0:
            break
    return sel


def next_layer_projector(obs: Observation, layer: LinearLayer, b: int) -> Tensor | None:
    """``N`` (m, m), the projector off the row space of the next linear layer's gradient,
    where a ReLU joins the two, that gradient has rank b and m ≥ 2b (module docstring, the
    next layer); None otherwise."""
    layers = [ly for ly in linear_layers(obs.model) if ly.weight in obs.target]
    at = next(i for i, ly in enumerate(layers) if ly.module == layer.module)
    if not layer.relu_after or at + 1 >= len(layers):
        return None
    dw2, _ = layer_gradient(obs, layers[at + 1])
    m = int(obs.target[layer.weight].shape[0])
    if dw2.shape[1] != m or m < 2 * b:
        return None
    _, s, vh = top_singular(dw2, b)
    if numerical_rank(s, noise_edge(obs, tuple(dw2.shape))) != b:
        return None
    r2 = vh[:b]
    return torch.eye(m, dtype=torch.float64) - r2.T @ r2


def solve_patterns(ly: Layer, proj: Tensor, active: Tensor) -> tuple[Tensor, Tensor]:
    """For each ReLU pattern (columns of ``active``, (m, k) bool), ``p``
    from ``N D (M p + c) = 0`` -> (P (k, b), the solved pattern's agreement with it (k,))."""
    ps, agree = [], []
    for i in range(active.shape[1]):
        a = active[:, i]
        lhs = proj[:, a] @ ly.M[a]
        rhs = -(proj[:, a] @ ly.c[a])
        p = torch.linalg.lstsq(lhs, rhs[:, None]).solution.flatten()
        ps.append(p)
        agree.append(((ly.M @ p + ly.c) > 0).eq(a).double().mean())
    if not ps:
        return torch.zeros(0, ly.L.shape[1], dtype=torch.float64), torch.zeros(0)
    return torch.stack(ps), torch.stack(agree)


def deflate(ly: Layer, p: Tensor) -> Layer:
    """``ly`` with the found examples (rows of ``p``: ``x_i = Rᵀ p_i``) projected out of the row
    side: ``∂W (I − Π_X) = L (I − Π_P) R`` keeps the other examples' sparse columns ``∂z_j``
    and has rank b − k, so the search goes on at b − k (each find halves the samples)."""
    qp, _ = torch.linalg.qr(p.T)  # (b, k): span of the found p_i
    rest = ly.L - (ly.L @ qp) @ qp.T
    u, s, _ = torch.linalg.svd(rest, full_matrices=False)
    k = ly.L.shape[1] - p.shape[0]
    return replace(ly, L=u[:, :k] * s[:k])


@dataclass
class Found:
    """What :func:`search` found: solved examples, their columns, the last round's
    unconfirmed columns (for the paper's selection) and the samples drawn."""

    p: Tensor  # (k, b): x_i = Rᵀ p_i
    g: Tensor  # (m, k): ∂z_i, up to scale
    extra: Tensor  # (m, e)
    used: int


def search(
    ly: Layer,
    proj: Tensor,
    *,
    samples: int,
    tau: float,
    match: float,
    gen: torch.Generator,
    advance: Callable[[], None],
    known: Tensor | None = None,
) -> Found:
    """Steps 1–2 in rounds of ``ROUND`` samples; each candidate whose ReLU pattern the next
    layer confirms (agreement at least ``match``) is an example, solved exactly, and the
    search deflates past it (:func:`deflate`). ``known`` (k, b): examples already solved
    (``x_i = Rᵀ p_i``), deflated before the first sample, so the search starts at rank
    b − k; only the new ones are returned."""
    m, b = ly.L.shape
    known = torch.zeros(0, b, dtype=torch.float64) if known is None else known
    found_p: list[Tensor] = []
    found_g: list[Tensor] = []
    extra = torch.zeros(m, 0, dtype=torch.float64)
    cur = deflate(ly, known) if len(known) else ly
    left, stale, b_left = samples, 0, b - len(known)
    while left > 0 and len(found_p) < b_left:
        n = min(ROUND, left)
        left -= n
        cands = candidates(cur, n, tau, gen, advance)
        if not len(cands):
            continue
        cols = cur.L @ cands.T
        p, agree = solve_patterns(ly, proj, ~cur.zeros(cols))
        new = []
        for i in torch.nonzero(agree >= match).flatten().tolist():
            if len(found_p) < b_left and all(
                float((p[i] - q).norm() / q.norm().clamp_min(1e-300)) > 1e-6
                for q in [*known, *found_p]
            ):
                found_p.append(p[i])
                found_g.append(cols[:, i])
                new.append(i)
        extra = cols[:, [i for i in range(cols.shape[1]) if i not in new]]
        stale = 0 if new else stale + 1
        if stale >= 2 and len(found_p) + extra.shape[1] >= b_left:
            break  # the rest are seen but not confirmed: left to the paper's selection
        if new and len(found_p) < b_left:
            cur = deflate(ly, torch.cat([known, torch.stack(found_p)]))
    if not found_p:
        return Found(torch.zeros(0, b, dtype=torch.float64), extra[:, :0], extra, samples - left)
    return Found(torch.stack(found_p), torch.stack(found_g, 1), extra, samples - left)


def expected_finds(m: int, b: int, samples: int, inactive: float = INACTIVE) -> float:
    """Examples the first ``samples`` uniform draws are expected to find, each example
    inactive on ``inactive · m`` rows: ``samples · b · C(inactive m, b − 1) / C(m, b − 1)``."""
    z = int(inactive * m)
    return samples * b * (math.comb(z, b - 1) / math.comb(m, b - 1)) if z >= b - 1 else 0.0


def separate(
    obs: Observation,
    ly: Layer,
    layer: LinearLayer,
    *,
    samples: int,
    tau: float,
    greedy_rounds: int,
    next_layer: bool,
    match: float,
    min_finds: float,
    seed: int,
    progress: bool,
    search_by: str = "auto",
    lps: int | None = None,
) -> Separated:
    """The paper's steps 1–4 (not run where the budget expects fewer than ``min_finds``
    finds: :func:`expected_finds`), or — with ``next_layer`` where the next layer allows it — the
    search that solves each found example from the next layer and deflates past it.
    ``search_by``: "vertex" runs :mod:`.vertex`'s LP search instead; "auto" runs it wherever
    it applies (a layer that feeds the classifier, with noise small enough: it checks every
    find on every unit, and on ``fedavg-cnn`` beats the sampling at B = 8 and 16 too);
    "sample" never."""
    m, b = ly.L.shape
    gen = torch.Generator().manual_seed(int(seed))
    expect = expected_finds(m, b, samples)
    meta: dict = {"samples": samples, "batch": b, "expected_finds": expect}
    if search_by == "vertex" or (
        search_by == "auto" and vertex.classifier_after(obs, layer)[0] is not None
    ):
        sep = vertex.separate(obs, layer, ly.L, lps=lps, seed=seed)
        sep.meta.update(batch=b, expected_finds=expect)
        return sep
    proj = next_layer_projector(obs, layer, b) if next_layer else None
    h = torch.zeros(b, ly.R.shape[1], dtype=torch.float64)
    g = torch.zeros(m, b, dtype=torch.float64)
    found = torch.zeros(b, dtype=torch.bool)
    if expect < min_finds:
        meta["how"] = (
            f"not searched: {samples} uniform samples expect {expect:.1e} finds at B = {b} "
            f"(each hits an example with probability ≈ 2^−(B−1)); raise samples"
        )
        return Separated(h, g, found, meta)
    with progress_bar(progress, samples, f"SPEAR b={b}") as advance:
        if proj is not None:
            res = search(ly, proj, samples=samples, tau=tau, match=match, gen=gen, advance=advance)
            k = res.p.shape[0]
            meta["used"] = res.used
            h[:k], g[:, :k], found[:k] = res.p @ ly.R, res.g, True
            meta["how"] = f"{k} of {b} examples, each solved from the next layer's gradient"
            if k == b or k + res.extra.shape[1] < b:
                return Separated(h, g, found, meta)
            # the rest did not check out: the paper's selection over found + unconfirmed
            cands = torch.linalg.lstsq(ly.L, torch.cat([res.g, res.extra], 1)).solution.T
            cands = cands / cands.norm(dim=1, keepdim=True)
        else:
            cands = candidates(ly, samples, tau, gen, advance)
    meta["directions"] = int(len(cands))
    if len(cands) >= b:
        sel = select(ly, cands, greedy_rounds)
        meta.update(matching=sel.matching, swaps=sel.swaps)
        if sel.matching >= match:
            q = sel.qbar * sel.scales
            meta["how"] = "all B directions, Xᵀ = Q⁻¹ R (SPEAR)"
            return Separated(
                torch.linalg.inv(q) @ ly.R, ly.L @ q, torch.ones(b, dtype=torch.bool), meta
            )
    if not bool(found.any()):
        meta["how"] = "too few directions" if len(cands) < b else "the selection does not match"
    return Separated(h, g, found, meta)


def search_layer(obs: Observation, layer: str, search_by: str) -> LinearLayer:
    """``layer`` by name; with "auto" the first linear layer — or, unless ``search_by`` is
    "sample", a later one whose ReLU feeds the classifier where :mod:`.vertex` searches it and
    :mod:`.descent` leads from it down to the first (an MLP's last hidden layer)."""
    first = pick_layer(obs, layer)
    if layer != "auto" or search_by == "sample":
        return first
    for ly in linear_layers(obs.model):
        if ly.weight in obs.target and vertex.classifier_after(obs, ly)[0] is not None:
            if bottom(obs, ly).module == first.module:
                return ly
    return first


SEARCHES = ("auto", "sample", "vertex")
MATCH = 0.99  # sparsity matching (or a solved pattern's agreement) accepted as exact


@register_attack(
    "spear",
    summary="SPEAR: exact batch from a ReLU linear layer's low-rank, sparse gradient",
    rules={
        "samples": Rule("an integer in 1..10^9", lambda v: 1 <= v <= 10**9),
        "tau": UNIT_OPEN,
        "zero_tol": UNIT_OPEN,
        "zero_sigmas": POSITIVE,
        "greedy_rounds": Rule("an integer in 0..1000", lambda v: 0 <= v <= 1000),
        "match": UNIT_OPEN,
        "min_finds": NON_NEGATIVE,
        "search": one_of(SEARCHES),
        "lps": Rule("an integer in 1..10^6", lambda v: 1 <= v <= 10**6),
        "lr": POSITIVE,
        "tv": NON_NEGATIVE,
    },
)
def spear(
    observations: Observation | Sequence[Observation],
    *,
    iterations: int | None = None,
    restarts: int | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
    layer: str = "auto",
    samples: int = DEFAULT_SAMPLES,
    tau: float = TAU,
    zero_tol: float = ZERO_TOL,
    zero_sigmas: float = ZERO_SIGMAS,
    greedy_rounds: int = GREEDY_ROUNDS,
    match: float = MATCH,
    min_finds: float = MIN_FINDS,
    next_layer: bool = True,
    search: str = "auto",
    lps: int | None = None,
    lr: float = 0.1,
    tv: float = 5e-2,
) -> list[Reconstruction]:
    """SPEAR (module docstring) on ``layer`` (by name, or "auto": :func:`search_layer`) of each
    observation, observation i with seed ``seed + i``: ``samples`` submatrices, directions
    with at least ``tau · m`` zeros, a selection accepted at sparsity matching ``match``
    (no search where the budget expects fewer than ``min_finds`` finds, 0: always);
    with ``next_layer`` each found example is solved from the next layer and deflated. Where
    the layer's input is not the image, ``iterations`` (default 1000) and ``restarts`` of
    feature inversion at step ``lr`` with TV weight ``tv`` turn features into images.
    ``search``: "auto" hands a layer that feeds the classifier to :mod:`.vertex`'s
    LP search (``lps`` LPs; default 32 per example), "sample" keeps the paper's sampling,
    "vertex" always searches vertices.
    ``loss`` is 1 − the fraction of examples recovered."""
    out = []
    for i, o in enumerate(as_list(observations)):
        if o.terms:
            raise PrivauditError(
                "SPEAR separates one gradient; this observation is a sum of gradient terms "
                "(e.g. a tracking difference): use --attack ig"
            )
        ly = search_layer(o, layer, search)
        f = factor(o, ly, int(o.batch_size), zero_tol, zero_sigmas)
        sep = separate(
            o, f, ly, samples=samples, tau=tau, greedy_rounds=greedy_rounds, next_layer=next_layer,
            match=match, min_finds=min_finds, seed=seed + i, progress=progress, search_by=search,
            lps=lps,
        )  # fmt: skip
        inv = {"iterations": DEFAULT_ITERATIONS if iterations is None else int(iterations)}
        inv.update(restarts=1 if restarts is None else int(restarts), lr=lr, tv=tv)
        low, sep = descend(o, ly, sep)
        out.append(finish(o, low, sep, seed + i, device, progress, inv, "spear"))
    return out


AUTO_MAX_B = 16  # auto picks SPEAR up to this B (the search grows as 2^B)


def applies(obs: Observation, max_b: int = AUTO_MAX_B) -> str | None:
    """Why SPEAR should run on ``obs`` (the reason :mod:`.auto` gives), or None: a noise-free
    single gradient of B > 1 examples whose first linear layer is followed by a ReLU and has
    a gradient of rank B, with 1 < B ≤ ``max_b`` (the sampling) or with the classifier right
    after that ReLU (:mod:`.vertex`'s search, at any B the rank allows)."""
    b = int(obs.batch_size)
    if obs.terms or obs.noise_std or b <= 1:
        return None
    layers = [ly for ly in linear_layers(obs.model) if ly.weight in obs.target]
    if not layers or not layers[0].relu_after:
        return None
    by_vertex = vertex.classifier_after(obs, layers[0])[0] is not None
    if b > max_b and not by_vertex:
        return None
    dw, _ = layer_gradient(obs, layers[0])
    if numerical_rank(top_singular(dw, 0)[1]) != b:
        return None
    how = "its output gradients are LP vertices (the vertex search)" if by_vertex else "SPEAR"
    return (
        f"B = {b}: {layers[0].module}'s gradient has rank B and a ReLU follows it, so {how} "
        "separates the batch exactly"
    )
