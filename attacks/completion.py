"""Completing a separation: ICA's approximate examples made exact, the rest found by SPEAR's
search at the rank they leave.

Where a linear layer ``z = W x + c`` takes the example and is followed by a ReLU and a linear
layer whose gradient has rank B (McMahan et al.'s 2NN up to B = 200), two exact facts pin
every example (:mod:`.spear`, "the next layer"; :mod:`.rowspace`):

- ``x_i = Rᵀ p_i`` lies in the row space of ``∂W = L R`` (rank B);
- its ReLU features ``r_i = D_i (M p_i + c)`` (``M = W Rᵀ``, ``D_i`` the pattern of units
  with ``z > 0``) lie in the row space of the next layer's gradient: ``N r_i = 0``, ``N`` the
  projector off it.

**Polishing** (privaudit's). Given the pattern ``D_i``, ``N D_i (M p + c) = 0`` is linear in
``p`` (m equations of rank m − B in B unknowns: :func:`.spear.solve_patterns`) and exact. An
estimate from ICA and the row-space refinement (:mod:`.cpa`, :mod:`.rowspace`) that lands a
few percent off the example in directions the image's [0, 1] clamp hides still has its
pattern nearly right; re-solving from the pattern, recomputing the pattern from the solution
and repeating (``rounds`` times) reaches the fixed point where the pattern and the solution
agree. An example is **exact** where that fixed point's relative residual
``‖N r‖² / ‖r‖²`` is at most ``exact`` — ≈ 1e-13 for a true example of a float32 gradient, 1e-2
and above for a blend that happens to be a fixed point (docs/attacks.md).

**Search at the rank left** (SPEAR's steps 1–2, Dimitrov et al., NeurIPS 2024, §4). The k
exact examples are projected out of the row side, ``∂W (I − Π_X) = L (I − Π_P) R``
(:func:`.spear.deflate`): the others' sparse output gradients ``∂z_j`` remain, at rank
B − k. A uniform (B − k − 1)-row sample of L hits an example with probability ≈ 2^−(B−k−1)
instead of 2^−(B−1): at B = 64 with 50 examples exact, ≈ 1e-4 instead of 1e-19, so
``samples`` draws find what ICA missed, each solved exactly from the next layer and deflated
in turn (:func:`.spear.search`). A zero there is an entry at most ``zero_tol`` (1e-5) of its
column's largest: the polished examples are exact to ≈ 5e-6 (relative), and what of them
the deflation leaves in the columns would hide the zeros from SPEAR's own 1e-6
(docs/attacks.md gives the measurement).

**Output gradients.** An exact example's ``∂z_i`` is zero on its inactive units: its
direction is the least right singular vector of L restricted to those rows (SPEAR's
re-solve) — what its label is read from (:func:`.disaggregation.labels_from_directions`).

It needs a noise-free gradient: once noise moves both row spaces the exactness test has no
meaning and the pattern solve fits the noise (docs/attacks.md measures it making estimates
worse); the refinement, which tolerates noise, is then what the attack returns.
"""

from __future__ import annotations

import torch
from torch import Tensor

from privaudit.core.observation import Observation

from . import spear
from .disaggregation import Separated
from .identifiability import LinearLayer

ROUNDS = 10  # pattern → solve → pattern rounds of the polish
EXACT = 1e-8  # a fixed point with ‖N r‖² / ‖r‖² at most this is an example
SAMPLES = 1 << 16  # SPEAR's draws at the rank left
ZERO_TOL = 1e-5  # a zero of the search's columns, of their largest entry (module docstring)
SAME = 1e-4  # two solutions within this relative distance are one example


def polish(ly: spear.Layer, proj: Tensor, p: Tensor, rounds: int = ROUNDS) -> tuple[Tensor, Tensor]:
    """Each row of ``p`` (k, B) moved to its pattern's fixed point (module docstring)
    -> (the solutions (k, B), their relative residuals ``‖N r‖² / ‖r‖²`` (k,), where the
    final pattern disagrees with its solution: 1)."""
    agree = torch.zeros(len(p), dtype=torch.float64)
    for _ in range(rounds):
        p, agree = spear.solve_patterns(ly, proj, (ly.M @ p.T + ly.c[:, None]) > 0)
    r = torch.relu(ly.M @ p.T + ly.c[:, None])
    res = (proj @ r).pow(2).sum(0) / r.pow(2).sum(0).clamp_min(1e-300)
    return p, torch.where(agree.double() >= 1.0, res, torch.ones_like(res))


def columns(ly: spear.Layer, p: Tensor) -> Tensor:
    """``∂z_i`` (m, k) up to scale for exact examples ``p`` (k, B): the least right singular
    vector of L on each example's inactive rows."""
    out = []
    for pi in p:
        rows = (ly.M @ pi + ly.c) <= 0
        out.append(ly.L @ torch.linalg.svd(ly.L[rows])[2][-1])
    return torch.stack(out, 1) if out else torch.zeros(ly.L.shape[0], 0, dtype=torch.float64)


def distinct(p: Tensor, candidates: list[int]) -> list[int]:
    """The candidates (indices into ``p``) that are not the same example as an earlier one."""
    kept: list[int] = []
    for i in candidates:
        if all(float((p[i] - p[j]).norm() / p[j].norm().clamp_min(1e-300)) > SAME for j in kept):
            kept.append(i)
    return kept


def complete(
    obs: Observation,
    layer: LinearLayer,
    sep: Separated,
    *,
    samples: int = SAMPLES,
    exact: float = EXACT,
    zero_tol: float = ZERO_TOL,
    seed: int = 0,
) -> Separated:
    """``sep`` (the layer's inputs as estimated, e.g. by :func:`.cpa.unmix` and
    :func:`.rowspace.refine`) with every example polished to exactness where it can be, and
    the rest replaced by what SPEAR's search finds at the rank they leave (module
    docstring); slots neither exact nor found keep the estimate. Needs a noise-free
    gradient and a next layer of rank B (the caller checks :func:`.rowspace.applicable`)."""
    b = int(obs.batch_size)
    if obs.noise_std:
        return _skipped(sep, "the gradient is noised: exactness cannot be checked")
    ly = spear.factor(obs, layer, b, zero_tol, spear.ZERO_SIGMAS)
    proj = spear.next_layer_projector(obs, layer, b)
    if proj is None:
        return _skipped(sep, "the next layer does not pin the examples (rank or width below B)")
    p, res = polish(ly, proj, sep.h.double() @ ly.R.T)
    known = distinct(p, [i for i in range(b) if res[i] <= exact])
    found = spear.search(
        ly,
        proj,
        samples=samples,
        tau=spear.TAU,
        match=spear.MATCH,
        gen=torch.Generator().manual_seed(int(seed)),
        advance=lambda: None,
        known=p[known],
    )
    h, g = sep.h.double().clone(), sep.g.double().clone()
    h[known], g[:, known] = p[known] @ ly.R, columns(ly, p[known])
    rest = [i for i in range(b) if i not in known]
    for k, slot in enumerate(_nearest(h[rest], found.p @ ly.R)):  # a find takes the estimate
        h[rest[slot]], g[:, rest[slot]] = found.p[k] @ ly.R, found.g[:, k]  # nearest to it
    searched = int(found.p.shape[0])
    meta = {
        **sep.meta,
        "how": f"{len(known)} exact after the polish, {searched} found by SPEAR's search at "
        f"rank {b - len(known)}, {b - len(known) - searched} left at the estimate",
        "complete": {
            "exact": len(known),
            "searched": searched,
            "samples": found.used,
            "left": b - len(known) - searched,
            "residual": [float(v) for v in res],
        },
    }
    return Separated(h, g, sep.found, meta)


def _nearest(estimates: Tensor, finds: Tensor) -> list[int]:
    """For each find, the index of a distinct estimate it replaces: greedily, the pair of
    largest |cosine| first."""
    if not len(finds):
        return []
    cos = (_unit(finds) @ _unit(estimates).T).abs()
    out = [-1] * len(finds)
    for _ in range(len(finds)):
        k, j = divmod(int(cos.argmax()), cos.shape[1])
        out[k] = j
        cos[k, :] = -1
        cos[:, j] = -1
    return out


def _unit(v: Tensor) -> Tensor:
    return v / v.norm(dim=1, keepdim=True).clamp_min(1e-300)


def _skipped(sep: Separated, why: str) -> Separated:
    return Separated(sep.h, sep.g, sep.found, {**sep.meta, "complete": {"skipped": why}})
