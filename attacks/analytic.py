"""Closed-form recovery through a first Linear layer with bias (Phong et al. 2017, "Privacy-
Preserving Deep Learning via Additively Homomorphic Encryption", §3.2; Geiping et al. 2020,
§3, Prop. 1).

For ``z = W x + b`` and one example, every row k of the layer's gradient satisfies

    (1)   ∂L/∂W_k = (∂L/∂b_k) · xᵀ,

so each row with ``∂b_k ≠ 0`` gives a candidate ``c_k = ∂W_k / ∂b_k = x``. With a gradient
that carries errors (one recovered by the gossip algebra, one noised by a defense) the rows
disagree, and which to trust is the choice (:func:`combine`, ``rule``):

- ``row`` — El Mrini, Cyffers & Bellet's rule (ICML 2024, the decAttack code's
  ``invert_gradient_FC_Model``): the one row of largest ``|∂b_k|``.
- ``ls`` — least squares over all rows: minimising Σ_k ‖∂W_k − ∂b_k x‖² gives

      (2)   x̂ = Σ_k ∂b_k ∂W_k / Σ_k ∂b_k² = Σ_k (∂b_k² / Σ_j ∂b_j²) · c_k,

  the maximum-likelihood (and best linear unbiased, Gauss–Markov) estimate when every row
  carries independent errors of the same size σ per coordinate: c_k then has error σ/|∂b_k|,
  and (2) is its inverse-variance weighting.
- ``reliable`` (default) — (2) where the rows agree, the anchor's row where they do not.
  Errors of the same size in every row leave the residuals of the other rows against the
  anchor's candidate c_m, R_k = ∂W_k − ∂b_k c_m (k ≠ m), taken off c_m's own direction
  (where ∂b's errors move every candidate: c_k = x ∂b_k/(∂b_k + ε_k) + …), a (K × d) matrix
  whose singular values stay below the Marchenko–Pastur edge σ(√d + √K) (Marchenko & Pastur
  1967; Geman 1980: the largest singular value of a K × d matrix of iid entries). The tied
  approximation's drift instead adds a few *shared* directions — every other agent's
  contribution is a rank-1 term α_k ⊗ [x_k; 1], the same images in every row — whose
  singular values stand far above it. With σ̂ from the smallest singular value
  (s_K = σ̂(√d − √K)) and V the right singular vectors above ``margin`` · σ̂(√d + √K):
  none — the rows agree, x̂ is (2); some — with E = [ĉ_m, V] (ĉ_m = c_m/‖c_m‖),

      (3)   x̂ = c_m + (I − E Eᵀ)(x̂_ls − c_m):

  c_m along the directions where the rows disagree and along its own scale, which the data
  cannot settle (moving along a shared error direction changes no residual, so there the
  anchor's prior — the largest ``|∂b|`` is the least corrupted — decides), (2) in every
  other direction.

``scale`` and a per-example clip multiply both sides by one factor and cancel. The recovered
vector is the *normalised, flattened* input; it is mapped back to [0, 1] pixels with the
observation's ``mean``/``std``.

B > 1: rows mix the examples; exact recovery needs rows that only one example activates
(e.g. after a ReLU). As a heuristic, each row with a large ``|∂b_k|`` gives a candidate
``∂W_k / ∂b_k`` and B mutually farthest candidates are returned — exact only for B = 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from privaudit.core.errors import PrivauditError
from privaudit.core.observation import Observation, Reconstruction

from .common import as_list, working_device
from .labels import labels_for
from .registry import LABEL_METHOD, POSITIVE, one_of, register_attack


def first_linear(model: nn.Module) -> str:
    """Name of the first module that owns parameters; it must be ``nn.Linear`` with bias."""
    for name, module in model.named_modules():
        if any(True for _ in module.parameters(recurse=False)):
            if isinstance(module, nn.Linear) and module.bias is not None:
                return name
            break
    raise PrivauditError(
        "the analytic attack needs a model whose first layer is Linear with bias; "
        "use the 'ig' attack for this model"
    )


def _farthest(candidates: Tensor, weights: Tensor, b: int) -> Tensor:
    """Greedy farthest-point choice of ``b`` rows, starting from the heaviest."""
    chosen = [int(weights.argmax())]
    dist = (candidates - candidates[chosen[0]]).norm(dim=1)
    while len(chosen) < min(b, len(candidates)):
        nxt = int(dist.argmax())
        chosen.append(nxt)
        dist = torch.minimum(dist, (candidates - candidates[nxt]).norm(dim=1))
    while len(chosen) < b:
        chosen.append(chosen[-1])
    return candidates[chosen]


RULES = ("reliable", "ls", "row")
MARGIN = 1.5  # a residual direction counts as shared above this multiple of the MP edge


def combine(dw: Tensor, db: Tensor, rule: str = "reliable", margin: float = MARGIN) -> Tensor:
    """One example's flattened input from a first Linear layer's gradient rows ``dw`` (C × d)
    and ``db`` (C,), by ``rule`` (module docstring: ``row`` the anchor's largest-``|∂b|``
    row, ``ls`` eq. (2), ``reliable`` eq. (3) with the edge multiplied by ``margin``)."""
    if rule not in RULES:
        raise PrivauditError(f"unknown row rule {rule!r}; use one of {', '.join(RULES)}")
    m = int(db.abs().argmax())
    anchor = dw[m] / db[m]
    if rule == "row":
        return anchor
    ls = db @ dw / (db * db).sum()
    others = [k for k in range(len(db)) if k != m and db[k] != 0]
    if rule == "ls" or len(others) < 2:
        return ls
    # the other rows against the anchor's candidate, off its own direction: ∂b noise moves
    # every candidate along x (c_k = x ∂b_k/(∂b_k + ε_k) + …), a scale the test leaves out
    unit = anchor / anchor.norm()
    resid = dw[others] - db[others, None] * anchor[None]
    resid = resid - (resid @ unit)[:, None] * unit[None]
    _, sv, vt = torch.linalg.svd(resid, full_matrices=False)
    k, d = len(others), dw.shape[1]
    # σ̂ from the smallest singular value (the edge √d − √K); none when K ≥ d
    sigma = float(sv[-1]) / (d**0.5 - k**0.5) if d > k else 0.0
    r = int((sv > margin * sigma * (d**0.5 + k**0.5)).sum())
    if r == 0:  # the rows agree up to equal-size errors: eq. (2)
        return ls
    shared = torch.cat([unit[:, None], vt[:r].T], 1)  # orthonormal: vt ⊥ unit
    diff = ls - anchor
    return anchor + diff - shared @ (shared.T @ diff)


def recover(
    obs: Observation,
    device: torch.device | str | None = None,
    rule: str = "reliable",
    margin: float = MARGIN,
) -> tuple[Tensor, float]:
    """Images (B, *input_shape) in [0, 1] (float64, on ``device`` or the target's) and the
    relative residual ``‖∂W − ∂b xᵀ‖² / ‖∂W‖²`` of the rank-1 fit (0 when exact). B = 1: the
    rows are combined by ``rule`` (:func:`combine`, ``margin`` its edge factor)."""
    layer = first_linear(obs.model)
    prefix = f"{layer}." if layer else ""
    dw = obs.target[prefix + "weight"].detach().to(device).double()
    db = obs.target[prefix + "bias"].detach().to(device).double()
    numel = 1
    for s in obs.input_shape:
        numel *= int(s)
    if dw.shape[1] != numel:
        raise PrivauditError(
            f"the first Linear layer takes {dw.shape[1]} inputs, an example has {numel} values"
        )
    denom = float((db * db).sum())
    if denom == 0.0:
        raise PrivauditError("the first layer's bias gradient is zero: nothing to recover")
    if obs.batch_size == 1:
        flat = combine(dw, db, rule, margin).unsqueeze(0)
    else:
        keep = db.abs() >= 0.1 * db.abs().max()
        flat = _farthest(dw[keep] / db[keep, None], db[keep].abs(), obs.batch_size)
    ls = db @ dw / denom
    residual = float((dw - db[:, None] * ls[None]).pow(2).sum() / dw.pow(2).sum().clamp_min(1e-300))
    shape = tuple(obs.input_shape)
    view = (-1, *([1] * (len(shape) - 1))) if len(shape) > 1 else (-1,)
    mean = torch.as_tensor(obs.mean, dtype=torch.float64, device=dw.device).reshape(view)
    std = torch.as_tensor(obs.std, dtype=torch.float64, device=dw.device).reshape(view)
    images = flat.reshape(-1, *shape) * std + mean
    return images.clamp(0, 1), residual


@register_attack(
    "analytic",
    summary="closed-form recovery of the first linear layer's input (B = 1 or exact cases)",
    rules={"label_method": LABEL_METHOD, "rule": one_of(RULES), "margin": POSITIVE},
)
def analytic(
    observations: Observation | Sequence[Observation],
    *,
    iterations: int | None = None,
    restarts: int | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
    label_method: str = "auto",
    rule: str = "reliable",
    margin: float = MARGIN,
) -> list[Reconstruction]:
    """Closed-form input recovery (no optimisation: ``iterations``, ``restarts``, ``seed``
    and ``progress`` are accepted for a uniform interface and ignored). ``rule``: how the
    layer's rows are combined (``reliable``, ``ls``, ``row``: :func:`combine`), ``margin``
    the factor on the Marchenko–Pastur edge that ``reliable`` tests against."""
    del iterations, restarts, seed, progress
    obs = as_list(observations)
    out = []
    for o in obs:
        if o.terms:
            raise PrivauditError(
                "the analytic attack inverts one gradient; this observation is a sum of "
                "gradient terms (e.g. a tracking difference): use --attack ig or dlg"
            )
        src_dev = next(iter(o.params.values())).device
        dtype = next(iter(o.params.values())).dtype
        images, residual = recover(o, working_device([o], device), rule, margin)
        labels, source = labels_for(o, label_method)
        out.append(
            Reconstruction(
                images=images.to(src_dev, dtype),
                labels=labels.to(src_dev),
                loss=residual,
                meta={"attack": "analytic", "labels": source, "observation": dict(o.meta)},
            )
        )
    return out
