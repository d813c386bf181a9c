"""SPEAR's sparsity searched as vertices: the output gradients of a ReLU layer that feeds the
classifier, found one linear programme at a time where SPEAR's sampling is out of reach.

For ``z = W h + c``, ``a = relu(z)`` and logits ``W₂ a + c₂`` (cross-entropy), example i's
output gradient at ``z`` is

    δ_i = d_i ⊙ W₂ᵀ e_i,    d_i = 1[z_i > 0],    e_i = f_i (p_i − y_i) / B,

(``f_i`` its clip factor), and every δ_i lies in the column space ``span(U)`` of the observed
``∂W = Σ_i δ_i h_iᵀ`` (m × n, rank B; SPEAR's low-rank decomposition, Dimitrov et al.,
NeurIPS 2024, §3). SPEAR finds δ_i by sampling B − 1 of its zero rows, which succeeds with
probability ≈ 2^−(B−1): out of reach at B = 64. Here the classifier's structure replaces the
sampling:

- **Signs from the label.** For class y, ``W₂ᵀ e = W₂ᵀ (p − e_y) f / B``; where the batch's
  softmax outputs stay within ``spread`` of their mean ``p̄`` (``p̄ = ∂c₂ + n/B``, n the
  label counts :mod:`.labels` estimates; clipped, the model's softmax at the mean image),
  the sign ``s_j`` of unit j's entry is that of ``(W₂ᵀ(p̄ − e_y))_j`` on every unit where
  that value exceeds ``3 · spread · ‖W₂[:, j]‖``.
- **The polytope.** With ``e`` normalised to ``e_y = −1`` (clip factor and 1 − p_y absorbed
  into the scale of q), every example of class y satisfies, on those units,

      0 ≤ s_j u_jᵀ q ≤ s_j w₂_jᵀ e,    Σ_k e_k = 0,   e_y = −1,   0 ≤ e_k ≤ 1,

  linear in ``(q, e)`` (B + C unknowns). δ_i = U q_i meets one of the two bounds on every
  unit (active: the upper, inactive: the lower), several hundred tight constraints in
  B + C − 2 dimensions: a highly degenerate vertex, whose normal cone is wide. A linear
  programme with an objective pointing into that cone lands on it.
- **The search.** Round-robin over the classes the counts name, one LP per class and round
  (HiGHS, on as many threads as torch uses: it releases the GIL). Objectives are a random
  combination of the units' activity or — ``GUIDED`` of the time — the pattern of a mask
  already found with a share ``FLIP`` of its units flipped (examples share most of their
  ReLU pattern). Each vertex is read as a mask and repaired (below); a cut (``MASS``,
  ``CUT``) keeps the all-zero vertex, each example found and each binary vertex that is no
  example (ratios ``u_jᵀq / w₂_jᵀe`` within ``BINARY`` of 0 or 1 on a share ``SHARE`` of the
  signed units) out of later LPs of its class. Five sixths of the
  budget run at half the ``spread`` (more signed units, sharper vertices), the rest at
  ``spread`` (outputs further from p̄). Where finds are ``RARE`` (a narrow layer for its B:
  a random objective lands on a generic vertex), an inexact vertex is followed by up to
  ``FOLLOW`` LPs aimed at its own rounding (:func:`towards`); after ``STALL`` LPs per class
  without a find every class is tried (the label counts can be wrong, e.g. under clipping);
  after ``HOPELESS`` LPs per example without any find the search stops (``mlp``'s 200 units
  at B = 128: a random objective's vertex is generic there, and nothing is found).
- **The last few.** Once at most B / ``FEW`` are missing, the found Δ_K leave
  ``R = (I − Δ_K Δ_K⁺) ∂W``, whose row space is exactly the missing examples' inputs
  (:class:`MissingInputs`); objectives then come from the patterns of inputs of that
  span: where the inputs are ReLU features and at most ``SPARSE_MAX`` are missing, the
  span's sparse rows (:func:`sparse_rows`: the missing inputs themselves, each up to scale),
  else random ones — with one missing, its own input up to sign and scale.
- **Exactness.** Each mask is checked on *every* unit (the m − B units beyond the batch
  must outnumber e's C − 1 free entries ``CHECKS`` times, else the search is not run): d
  rounded from the vertex, e re-solved by least squares so that ``d ⊙ W₂ᵀ e`` lies in
  span(U) (the pattern re-read from its projection up to ``REPAIRS`` times while that
  helps), and accepted only where it does to ``EXACT`` (relative); a wrong unit misses by
  its share of δ's norm. Without noise an accepted find is re-read from its projection
  while that brings it closer still (:func:`polish`): a unit whose share is under ``EXACT``
  may be wrong (under noise the re-reading would fit the noise).
- **Inputs.** With the found output gradients Δ_K, ``H = Δ_K⁺ ∂W`` gives their inputs —
  exact when all B are found, else each mixed with the missing ones' share — and the bias
  gradient ``∂c = Δ_K t`` their scales (:func:`fit_scales`).

**Noise** N(0, σ²) per coordinate turns span(U) away from the output gradients by about
``angle = σ(√m + √n) / s_B`` (the noise's largest singular value over the B-th of ∂W): the
constraints get a slack of three times what that moves an entry, and a mask is exact within
``3 · angle``. Above ``ANGLE`` the search is not run, and says so.
``benchmarks/disaggregation.py`` measures it on ``fedavg-cnn`` at B = 64.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import repeat

import numpy as np
import torch
from scipy.optimize import linprog
from torch import Tensor

from privaudit.core.observation import Observation

from .disaggregation import Separated, images_from_inputs, layer_params
from .identifiability import LinearLayer, layer_gradient, linear_layers, noise_edge, top_singular
from .labels import labels_for
from .rowspace import next_layer

SPREAD = 0.03  # softmax outputs assumed within this of the batch mean when reading signs
BINARY = 0.02  # a vertex ratio within this of 0 or 1 reads as a mask entry
SHARE = 0.95  # ... on at least this share of the signed units
EXACT = 1e-3  # a mask is exact where d ⊙ W₂ᵀe lies in span(∂W) to this, relative
FLIP = 0.1  # guided objectives flip this share of a found mask's units
GUIDED = 0.75  # the share of guided objectives once a mask is found
MASS = 0.25  # a vertex carries at least this share of its units' full activity
CUT = 0.97  # a found mask is cut off by asking 3 % of its activity to go
SLACK = 1e-4  # constraint slack, relative to the largest entry of W₂ᵀ(p̄ − e_y)
ANGLE = 0.05  # noise turning the column space by more than this: not searched
FIXED_POINT = 30  # iterations of the scale's contraction (a layer without bias)
REPAIRS = 5  # re-reads of a vertex's pattern from its projection
VALID = 1e-2  # a fitted e with an entry below −VALID is no softmax output
CHECKS = 4  # a mask is checked only with this many spare units (m − B) per free output
SAME_UNITS = 3  # masks differing on at most this many units are one example's
NEAR_SHARE = 0.1  # a guess's scale: any pattern along s f within this share of a found one
FEW = 4  # mask guesses from the missing inputs' span once at most B / FEW are missing
SPARSE_MAX = 16  # with at most this many missing, their ReLU inputs are sampled by zeros
DRAWS = 4096  # ... in this many draws of r − 1 entries
SPARSE = 0.3  # ... kept where at least this share of the entries are zero
ZERO = 1e-5  # an entry at most this share of the largest is a zero (a float32 message)
LPS_PER_EXAMPLE = 32  # the default budget: this many LPs per example of the batch
FOLLOW = 6  # an inexact vertex is followed by at most this many LPs aimed at its rounding,
RARE = 0.1  # ... while fewer than this share of the LPs so far found an example
FAINT = 16  # a find's units of smallest |W₂ᵀe| each tried flipped when it is polished
HOPELESS = 4  # LPs per example without a single find, after which the search stops
STALL = 4  # LPs per class without a find, after which every class is tried (counts may err)


def classifier_after(obs: Observation, layer: LinearLayer) -> tuple[LinearLayer | None, str]:
    """The classifier right after ``layer``'s ReLU (``Linear → ReLU → Linear`` with the last
    linear layer giving the logits) where the layer has units enough beyond B to check a
    mask (``CHECKS``), or None and why the search does not apply."""
    nxt = next_layer(obs, layer)
    if nxt is None:
        return None, f"{layer.module} is not followed by a ReLU and a linear layer in the message"
    if linear_layers(obs.model)[-1].module != nxt.module:
        return None, f"{nxt.module} is not the classifier (its output gradient is not p − y)"
    if obs.terms:
        return None, "the observation is a sum of gradient terms"
    m, b, free = obs.target[layer.weight].shape[0], int(obs.batch_size), int(obs.num_classes) - 1
    if m - b < CHECKS * free:
        return None, (
            f"{layer.module} has {m} units for B = {b}: {m - b} equations beyond the batch "
            f"cannot check a mask against its {free} free outputs"
        )
    return nxt, ""


@dataclass
class ClassLP:
    """One class's polytope (module docstring): ``A_ub x ≤ b_ub`` over x = (q, e)."""

    label: int
    keep: np.ndarray  # (m,) bool: the signed units
    su: np.ndarray  # (k, B): s_j u_j
    sw: np.ndarray  # (k, C): s_j w₂_j
    a_ub: np.ndarray
    b_ub: np.ndarray
    masks: list = field(default_factory=list)  # the class's masks found so far, (m,) each

    def cut(self, mask: np.ndarray) -> None:
        """Keep ``mask`` (m,) out of later LPs: at least 1 − CUT of its activity must go."""
        on = mask[self.keep][:, None]
        row = np.concatenate([(self.su * on).sum(0), -CUT * (self.sw * on).sum(0)])
        self.a_ub = np.vstack([self.a_ub, row[None]])
        self.b_ub = np.append(self.b_ub, 0.0)
        self.masks.append(mask)


def class_lp(
    u: np.ndarray,
    w2: np.ndarray,
    pbar: np.ndarray,
    label: int,
    spread: float,
    masks=(),
    angle: float = 0.0,
) -> ClassLP:
    """The polytope of class ``label`` (module docstring) for the orthonormal column basis
    ``u`` (m, B) and the classifier weight ``w2`` (C, m), with ``masks`` already cut off;
    ``angle``: how far noise turns span(u) from the output gradients' (each entry of a true
    δ's projection then moves by about ``angle · ‖δ‖ / √m``, three times which is allowed)."""
    a = w2.T @ (pbar - np.eye(len(pbar))[label])
    keep = (np.abs(a) > 3 * spread * np.linalg.norm(w2, axis=0)) & (np.linalg.norm(u, axis=1) > 0)
    s = np.sign(a[keep])
    su, sw = s[:, None] * u[keep], s[:, None] * w2[:, keep].T
    k, c = sw.shape
    lower = np.hstack([-su, np.zeros((k, c))])
    upper = np.hstack([su, -sw])
    mass = np.concatenate([-su.sum(0), MASS * sw.sum(0)])[None]
    slack = max(
        SLACK * float(np.abs(a).max()), 3 * angle * float(np.linalg.norm(a)) / math.sqrt(len(a))
    )
    b_ub = np.concatenate([np.full(2 * k, slack), [0.0]])
    lp = ClassLP(label, keep, su, sw, np.vstack([lower, upper, mass]), b_ub)
    for mask in masks:
        lp.cut(mask)
    return lp


def solve_vertex(lp: ClassLP, objective: np.ndarray, b: int, classes: int) -> np.ndarray | None:
    """One LP: the vertex (q, e) minimising ``objective`` over q, or None."""
    a_eq = np.zeros((2, b + classes))
    a_eq[0, b:] = 1.0
    a_eq[1, b + lp.label] = 1.0
    bounds = [(None, None)] * b + [
        (-1.0, -1.0) if k == lp.label else (0.0, 1.0) for k in range(classes)
    ]
    obj = np.concatenate([objective, np.zeros(classes)])
    res = linprog(
        obj, A_ub=lp.a_ub, b_ub=lp.b_ub, A_eq=a_eq, b_eq=[0.0, -1.0], bounds=bounds,
        method="highs", options={"presolve": False},  # a fifth faster on these small LPs
    )  # fmt: skip
    return res.x if res.status == 0 else None


def read_mask(u: np.ndarray, w2: np.ndarray, q: np.ndarray, e: np.ndarray) -> np.ndarray:
    """The vertex (q, e) read as a ReLU pattern on every unit: active where ``u q`` is nearer
    ``W₂ᵀ e`` than 0."""
    dz = u @ q
    return np.abs(dz - w2.T @ e) < np.abs(dz)


def fit_delta(
    u: np.ndarray, w2: np.ndarray, mask: np.ndarray, label: int
) -> tuple[np.ndarray, np.ndarray, float]:
    """For a ReLU pattern ``mask`` (m,), the e of a softmax output — e_y = −1 and the rest
    ``p_k / (1 − p_y)``, summing to 1 — that brings ``mask ⊙ W₂ᵀ e`` nearest span(u), by least
    squares with that sum as a (heavily weighted) equation -> (that δ (m,), e (C,), its
    relative distance from span(u): 0 for a true pattern, ≈ |δ_j| / ‖δ‖ for one wrong unit
    j; ∞ where e is no softmax output, an entry below −``VALID``)."""
    cols = w2.T * mask[:, None]  # (m, C)
    cols = cols - u @ (u.T @ cols)  # off span(u)
    rest = [k for k in range(w2.shape[0]) if k != label]
    weight = 10.0 * float(np.linalg.norm(cols)) + 1e-300
    lhs = np.vstack([cols[:, rest], np.full((1, len(rest)), weight)])
    rhs = np.concatenate([cols[:, label], [weight]])
    e = np.zeros(w2.shape[0])
    e[label], e[rest] = -1.0, np.linalg.lstsq(lhs, rhs, rcond=None)[0]
    delta = mask * (w2.T @ e)
    norm = float(np.linalg.norm(delta))
    if norm == 0 or e[rest].min() < -VALID:
        return delta, e, math.inf
    return delta, e, float(np.linalg.norm(delta - u @ (u.T @ delta))) / norm


def repair(
    u: np.ndarray, w2: np.ndarray, mask: np.ndarray, label: int, until: float = EXACT
) -> tuple[np.ndarray, np.ndarray, float]:
    """:func:`fit_delta` of ``mask``, re-read from its δ's projection onto span(u) while that
    lowers the distance and it is above ``until`` (up to ``REPAIRS`` times): a vertex a few
    units off its example's pattern is pulled onto it."""
    delta, e, off = fit_delta(u, w2, mask, label)
    for _ in range(REPAIRS):
        if off <= until:
            break
        again = fit_delta(u, w2, read_mask(u, w2, u.T @ delta, e), label)
        if again[2] >= off:
            break
        delta, e, off = again
    return delta, e, off


def polish(
    u: np.ndarray, w2: np.ndarray, found: tuple[int, np.ndarray, np.ndarray]
) -> tuple[int, np.ndarray, np.ndarray]:
    """A find (label, δ, e) re-read from its projection while that lowers its distance from
    span(u) further (:func:`repair` past ``EXACT``), then each of its ``FAINT`` units of smallest
    ``|W₂ᵀe|`` flipped where that lowers it: a mask accepted within ``EXACT`` may still be
    wrong on units whose share of δ is that small."""
    label, delta, _ = found
    delta, e, off = repair(u, w2, delta != 0, label, until=0.0)
    for j in np.argsort(np.abs(w2.T @ e))[:FAINT]:  # the units a wrong entry hides best in
        mask = delta != 0
        mask[j] = not mask[j]
        again = fit_delta(u, w2, mask, label)
        if again[2] < off:
            delta, e, off = again
    return label, delta, e


def batch_mean_softmax(obs: Observation, nxt: LinearLayer, counts: Tensor) -> np.ndarray:
    """``p̄``: unclipped, ``∂c₂ + n / B`` (the classifier's bias gradient), clamped to the
    simplex; clipped or without a bias (clip factors weigh ``∂c₂``), the model's softmax at
    the mean image, which a fresh model's outputs stay near."""
    b = int(obs.batch_size)
    _, db = layer_gradient(obs, nxt)
    if db is not None and obs.clip is None:
        p = (db + counts.double() / b).clamp_min(0).numpy()
        if p.sum() > 0:
            return p / p.sum()
    params = {k: v.detach() for k, v in obs.params.items()}
    src = next(iter(params.values()))
    mean = torch.zeros(1, *obs.input_shape, dtype=torch.float64)  # normalised: the mean
    if not getattr(obs.model, "normalize_inputs", True):
        mean = images_from_inputs(obs, mean.flatten(1))
    mean = mean.to(src.device, src.dtype)
    with torch.no_grad():
        out = torch.func.functional_call(obs.model, params, (mean,))
    return torch.softmax(out.double(), 1)[0].cpu().numpy()


def objective(lp: ClassLP, pool: list, rng: np.random.Generator) -> np.ndarray:
    """One try's objective over q: a random combination of the signed units' activity, or —
    a share ``GUIDED`` of the time once masks are found — a found mask with a share ``FLIP``
    of its units flipped (module docstring)."""
    if pool and rng.random() < GUIDED:
        base = pool[rng.integers(len(pool))][lp.keep]
        return towards(lp, np.where(rng.random(len(base)) < FLIP, ~base, base))
    return -(rng.standard_normal(int(lp.keep.sum()))[:, None] * lp.su).sum(0)


def towards(lp: ClassLP, pattern: np.ndarray) -> np.ndarray:
    """The objective over q whose vertex best matches ``pattern`` on the signed units."""
    return -((2.0 * pattern - 1)[:, None] * lp.su).sum(0)


def read_vertex(
    lp: ClassLP, u: np.ndarray, w2: np.ndarray, x: np.ndarray | None
) -> tuple[np.ndarray, bool] | None:
    """The LP's vertex ``x`` = (q, e) as a mask (m,), and whether it is binary — its ratios
    within ``BINARY`` of 0 or 1 on a share ``SHARE`` of the signed units; None without one."""
    if x is None:
        return None
    b = u.shape[1]
    q, e = x[:b], x[b:]
    ratio = (u @ q)[lp.keep] / (w2.T @ e)[lp.keep]
    binary = (np.minimum(np.abs(ratio), np.abs(ratio - 1)) < BINARY).mean() >= SHARE
    return read_mask(u, w2, q, e), bool(binary)


def sparse_rows(span: np.ndarray, rng: np.random.Generator, draws: int = DRAWS) -> np.ndarray:
    """The rows of ``span``'s row space (r, n) that are zero on at least a share ``SPARSE`` of
    their entries, found by SPEAR's sampling turned to the rows (Dimitrov et al., NeurIPS
    2024, §4): the combination that vanishes on r − 1 random entries is one ReLU input of
    the span wherever they all are zeros of it, probability ≈ 2^−(r−1) — not sampled for
    r > ``SPARSE_MAX``. Distinct, unit norm."""
    r, n = span.shape
    if r > SPARSE_MAX or r < 2:
        return span[:0] if r != 1 else span / np.linalg.norm(span)
    draws = min(draws, 2 ** (r + 5))  # ≈ 2^(r−1) draws per find expected: 64 finds' worth
    cols = np.sort(rng.integers(0, n, (draws, r - 1)), 1)
    cols = cols[(np.diff(cols, axis=1) > 0).all(1)]  # r − 1 distinct entries
    kernel = np.linalg.svd(np.transpose(span[:, cols], (1, 2, 0)))[2][:, -1]  # (draws, r)
    rows = kernel @ span
    rows /= np.abs(rows).max(1, keepdims=True)
    zeros = (np.abs(rows) <= ZERO).mean(1)
    order = np.argsort(-zeros)[: int((zeros >= SPARSE).sum())]  # sparsest first
    rows = rows[order] / np.linalg.norm(rows[order], axis=1, keepdims=True)
    kept: list[np.ndarray] = []
    for row in rows:
        if len(kept) == 4 * r:
            break
        if all(abs(float(row @ k)) < 1 - 1e-6 for k in kept):
            kept.append(row)
    return np.array(kept).reshape(-1, n)


class MissingInputs:
    """Mask guesses for the examples the search has not found. With the found output
    gradients Δ_K, ``R = (I − Δ_K Δ_K⁺) ∂W = (I − Δ_K Δ_K⁺) Δ_u F_uᵀ`` has rank B − k and
    row space span(F_u): the missing examples' inputs lie exactly in it (one missing: its
    input up to sign and scale). A guess is a random input of that span, signed to a
    positive sum where the inputs are ``nonnegative`` (a trunk's ReLU features; else either
    sign), read through the layer as ``1[s W f + c > 0]`` at a scale s drawn among the
    patterns along the ray whose share of active units is within ``NEAR_SHARE`` of a found
    mask's (each of the ray's ≤ m + 1 patterns is one interval of s)."""

    def __init__(
        self, dw: np.ndarray, w: np.ndarray, c: np.ndarray, b: int, nonnegative: bool
    ) -> None:
        self.dw, self.w, self.c, self.b, self.nonnegative = dw, w, c, b, nonnegative
        self.k = -1
        self.span = self.sparse = np.zeros((0, dw.shape[1]))

    def __call__(self, deltas: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
        if len(deltas) != self.k:
            self.k = len(deltas)
            d = np.stack(deltas, 1)
            r = self.dw - d @ np.linalg.lstsq(d, self.dw, rcond=None)[0]
            _, vec = np.linalg.eigh(r @ r.T)  # (m, m): R's left singular vectors, ascending
            self.span = vec[:, vec.shape[1] - (self.b - self.k) :].T @ r  # B − k largest
            self.sparse = sparse_rows(self.span, rng) if self.nonnegative else self.sparse[:0]
        if len(self.sparse):
            f = self.sparse[rng.integers(len(self.sparse))]
        else:
            f = rng.standard_normal(len(self.span)) @ self.span
        if (f.sum() < 0) if self.nonnegative else (rng.random() < 0.5):
            f = -f
        wf = self.w @ f
        cuts = -self.c / np.where(wf == 0, np.inf, wf)  # where a unit switches along s f
        cuts = np.unique(cuts[cuts > 0])
        if len(cuts) == 0:
            return wf + self.c > 0
        scales = np.concatenate([[cuts[0] / 2], (cuts[1:] + cuts[:-1]) / 2, [2 * cuts[-1]]])
        shares = ((scales[:, None] * wf[None] + self.c) > 0).mean(1)  # one per pattern
        target = float((deltas[rng.integers(len(deltas))] != 0).mean())  # a found share
        near = np.flatnonzero(np.abs(shares - target) <= NEAR_SHARE)
        pick = (
            near[rng.integers(len(near))] if len(near) else int(np.argmin(np.abs(shares - target)))
        )
        return scales[pick] * wf + self.c > 0


def search(
    u: np.ndarray,
    w2: np.ndarray,
    pbar: np.ndarray,
    counts: list[int],
    *,
    lps: int,
    spread: float,
    seed: int,
    workers: int = 1,
    guess: Callable[[list[np.ndarray], np.random.Generator], np.ndarray] | None = None,
    angle: float = 0.0,
) -> tuple[list[tuple[int, np.ndarray, np.ndarray]], int]:
    """The search of the module docstring -> ([(label, δ (m,), e (C,)), …] exact finds, LPs
    solved). Five sixths of ``lps`` at half the ``spread`` (more signed units, sharper
    vertices), the rest at ``spread`` (for outputs further from p̄); once at most B / FEW are
    missing, objectives from ``guess``'s patterns of a missing example (:class:`MissingInputs`)
    where it is given. Each round tries every class short of its count (every class once all
    counts are met), its LPs solved on ``workers`` threads (HiGHS releases the GIL), until B
    are found. ``angle``: the noise's turn of span(u) (:func:`class_lp`); a mask is then
    exact within ``3 · angle`` instead of ``EXACT``."""
    b, classes = u.shape[1], w2.shape[0]
    rng = np.random.default_rng(seed)
    found: list[tuple[int, np.ndarray, np.ndarray]] = []
    pool: list[np.ndarray] = []  # found masks on all m units, found's order
    used = last = 0  # LPs solved; LPs solved at the last find
    follow: dict[int, tuple[np.ndarray, int]] = {}  # class -> (last inexact mask, steps)

    def take(c: int, delta: np.ndarray, e: np.ndarray, off: float) -> bool:
        """Keep an exact, new output gradient of class c (and cut it off from its LP)."""
        if off > max(EXACT, 3 * angle) or len(found) >= b:
            return False
        if angle == 0:
            c, delta, e = polish(u, w2, (c, delta, e))
        mask = delta != 0
        if not any((mask != m).sum() <= SAME_UNITS for m in pool):
            nonlocal last
            found.append((c, delta, e))
            last = used
            pool.append(mask)
            lp[c].cut(mask)
        return True

    with ThreadPoolExecutor(max(1, workers)) as threads:
        for width, until in ((spread / 2, 5 * lps // 6), (spread, lps)):
            lp = {}
            for c in range(classes):
                masks = [m for (y, _, _), m in zip(found, pool, strict=True) if y == c]
                lp[c] = class_lp(u, w2, pbar, c, width, masks, angle)
            while used < until and len(found) < b and (found or used < HOPELESS * b):
                short = [c for c in range(classes) if sum(y == c for y, _, _ in found) < counts[c]]
                tries = short or [c for c in range(classes) if counts[c]]
                if not tries or used - last >= STALL * classes:  # the counts may be wrong
                    tries = list(range(classes))
                tries = tries[: until - used]
                objs = [
                    towards(lp[c], follow[c][0][lp[c].keep]) if c in follow
                    else objective(lp[c], pool, rng)
                    for c in tries
                ]  # fmt: skip
                if guess is not None and pool and b - len(found) <= max(1, b // FEW):
                    masks = [guess([d for _, d, _ in found], rng) for _ in tries]
                    for c, m in zip(tries, masks, strict=True):  # the guess itself, repaired
                        take(c, *repair(u, w2, m, c))
                    objs = [
                        towards(lp[c], m[lp[c].keep]) for c, m in zip(tries, masks, strict=True)
                    ]
                xs = threads.map(
                    solve_vertex, [lp[c] for c in tries], objs, repeat(b), repeat(classes)
                )
                for c, x in zip(tries, list(xs), strict=True):
                    used += 1
                    hit = read_vertex(lp[c], u, w2, x)
                    if hit is None:
                        continue
                    steps = follow.pop(c, (None, 0))[1]
                    if take(c, *repair(u, w2, hit[0], c)):
                        continue
                    if steps < FOLLOW and used >= classes and len(found) < RARE * used:
                        # finds are rare: the next LP of c aims at this vertex's rounding
                        follow[c] = (hit[0], steps + 1)
                    if hit[1] and not any((hit[0] != m).sum() <= SAME_UNITS for m in lp[c].masks):
                        lp[c].cut(hit[0])  # a binary vertex that is no example
    return found, used


def fit_scales(
    obs: Observation,
    layer: LinearLayer,
    nxt: LinearLayer,
    h: Tensor,
    deltas: Tensor,
    labels: list[int],
) -> Tensor:
    """The inputs ``h`` (k, n) found with the output gradients ``deltas`` (m, k), each known
    up to a factor t_i (the normalisation e_y = −1, 1 − p_y, B and the clip factor), at their
    true scale ``h_i / t_i``. With a bias, ``∂c = Σ_i t_i δ̂_i``: t by least squares over its
    m equations (SPEAR's scales, the paper's §4), exact once all B are found and unchanged by
    clipping. Without one, unclipped, ``t_i = (1 − p_y(h_i / t_i)) / B``: a contraction
    (p_y moves little with t), iterated; clipped, that leaves the clip factor in the scale."""
    _, db = layer_gradient(obs, layer)
    if db is not None:
        t = torch.linalg.lstsq(deltas, db[:, None]).solution[:, 0]
        return h / t[:, None]
    w, c = layer_params(obs, layer)
    w2, c2 = layer_params(obs, nxt)
    pre, b, y = h @ w.T, int(obs.batch_size), torch.as_tensor(labels)
    t = torch.full((len(labels),), 1.0 / b, dtype=torch.float64)
    for _ in range(FIXED_POINT):
        logits = (pre / t[:, None] + c).clamp_min(0) @ w2.T + c2
        t = (1 - torch.softmax(logits, 1)[torch.arange(len(labels)), y]) / b
    return h / t[:, None]


def separate(
    obs: Observation,
    layer: LinearLayer,
    basis: Tensor,
    *,
    lps: int | None = None,
    spread: float = SPREAD,
    seed: int = 0,
) -> Separated:
    """The vertex search on ``layer``, whose gradient's column space is ``basis`` (m, B), as
    a :class:`.disaggregation.Separated` (``meta["how"]`` says how many were found and with
    how many LPs, or why the search did not run)."""
    b = int(obs.batch_size)
    dw, _ = layer_gradient(obs, layer)
    h = torch.zeros(b, dw.shape[1], dtype=torch.float64)
    g = torch.zeros(dw.shape[0], b, dtype=torch.float64)
    found = torch.zeros(b, dtype=torch.bool)
    nxt, why = classifier_after(obs, layer)
    if nxt is None:
        return Separated(h, g, found, {"how": f"vertex search not run: {why}"})
    budget = LPS_PER_EXAMPLE * b if lps is None else int(lps)
    sv = top_singular(dw, b)[1]
    angle = noise_edge(obs, tuple(dw.shape), margin=1.0) / float(sv[b - 1]) if b <= len(sv) else 1.0
    if angle > ANGLE:
        why = f"the noise turns the gradient's column space by ≈ {angle:.2g} (> {ANGLE})"
        return Separated(h, g, found, {"how": f"vertex search not run: {why}", "angle": angle})
    estimate, _ = labels_for(obs, "auto")
    counts = torch.bincount(estimate.cpu(), minlength=int(obs.num_classes))
    w2, _ = layer_params(obs, nxt)
    u, _ = torch.linalg.qr(basis.double())
    pbar = batch_mean_softmax(obs, nxt, counts)
    w, c = layer_params(obs, layer)
    missing = MissingInputs(dw.numpy(), w.numpy(), c.numpy(), b, not layer.takes_input)
    finds, used = search(
        u.numpy(), w2.numpy(), pbar, counts.tolist(), lps=budget, spread=spread, seed=seed,
        workers=torch.get_num_threads(), guess=missing, angle=angle,
    )  # fmt: skip
    meta = {"lps": used, "budget": budget, "spread": spread, "angle": angle}
    if not finds:
        meta["how"] = f"vertex search: no exact output gradient in {used} LPs"
        return Separated(h, g, found, meta)
    k = len(finds)
    deltas = torch.from_numpy(np.stack([d for _, d, _ in finds], 1))  # (m, k)
    inputs = torch.linalg.lstsq(deltas, dw).solution  # (k, n)
    h[:k] = fit_scales(obs, layer, nxt, inputs, deltas, [y for y, _, _ in finds])
    g[:, :k], found[:k] = deltas, True
    meta["how"] = (
        f"{k} of {b} output gradients found exactly as vertices of their class's polytope "
        f"({used} LPs); inputs by least squares"
        + ("" if k == b else ", mixed with the missing ones' share")
    )
    return Separated(h, g, found, meta)
