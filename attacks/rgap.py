"""R-GAP: recursive closed-form gradient inversion (Zhu & Blaschko 2021, "R-GAP: Recursive
Gradient Attack on Privacy", ICLR 2021, §3 and Algorithm 1).

For one example (B = 1) through a chain ``x_l = σ_l(A_l x_{l−1} + b_l)`` of Conv2d/Linear
layers ``A_l`` and elementwise invertible activations ``σ_l`` (:mod:`.chain`), ending in a
Linear classifier ``z_L = W_L x_{L−1} + b_L``, the gradient of the loss is

    ∂L/∂b_L = δ_L,   ∂L/∂W_L = δ_L x_{L−1}ᵀ,   δ_l = (A_{l+1}ᵀ δ_{l+1}) ⊙ σ_l'(z_l),
    ∂L/∂W_l = Σ_p δ_l[:, p] ⊗ patch_p(x_{l−1})          (a convolution's weight gradient)

and R-GAP recovers the input layer by layer, from the top:

1. **Classifier**. With a bias, ``x_{L−1} = Σ_k ∂b_k ∂W_k / Σ_k ∂b_k²`` (the
   rank-1 fit of :mod:`.analytic`) and ``δ_L = ∂b``. Without one, ``∂W = s u vᵀ`` (its top
   singular triplet), so ``x_{L−1} = α v`` and ``δ_L = (s/α) u`` for one unknown scalar α,
   fixed by the loss itself: ``δ_L = c (softmax(α W v) − y)`` with the label ``y``
   (:mod:`.labels`) and ``c`` the message's ``scale`` (times an unknown clip factor in
   (0, 1] when the example was clipped); α (and c) minimise the mismatch — the multi-class
   form of R-GAP's first step, which solves its single logistic output for the scalar
   logit the same way.
2. **Earlier layers** (Algorithm 1's loop). From ``x_l`` the activation's inverse gives
   ``z_l`` and ``σ'(z_l)``, hence ``δ_l``; then ``x_{l−1}`` solves, by least squares, the
   stacked linear system of the *forward* constraint ``A_l x_{l−1} = z_l − b_l`` and the
   *gradient* constraint ``G_l(δ_l) x_{l−1} = ∂L/∂W_l`` (the weight gradient is linear in
   the layer's input once ``δ_l`` is known). Both are built here as explicit sparse
   matrices (:func:`conv_matrices`) and solved by least squares in float64 on the CPU,
   each block scaled to unit RMS row norm (:func:`solve_layer`). The layer is determined
   exactly when the stacked matrix has full column rank (the condition of R-GAP's rank
   analysis: as many independent equations as unknowns); its rank and condition number are
   reported per layer. The paper's derivation has no biases; a bias only moves the
   forward constraint's right-hand side.
   A Linear layer's gradient block ``δ xᵀ`` is replaced by its normal-equation equivalent
   ``‖δ‖ I`` (same least-squares solution, n rows instead of n·out).

The recovered ``x_0`` is the model's (normalised) input; mapped back to [0, 1] pixels with
the observation's ``mean``/``std``.

``scale`` and per-example clipping multiply every gradient by one factor ``c``. The
recursion carries ``c δ_l`` (it starts from the observed ``∂b``), so ``c`` cancels in every
gradient constraint and need not be known; only the bias-free classifier (step 1) uses it.
Noise on the message is averaged by the least squares but not modelled.

Where R-GAP cannot be exact — B > 1, a model that is not such a chain (a max-pool, a
residual connection), an observation that is a sum of gradient terms, or a layer whose
stacked system is rank deficient — the attack falls back to Inverting Gradients (:mod:`.ig`)
started from what R-GAP recovered (from noise when it recovered nothing) and says why in
``meta["fallback"]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse.linalg  # noqa: F401 - makes sparse.linalg available
import torch
import torch.nn.functional as F
from scipy import sparse
from torch import Tensor, nn

from privaudit.core.errors import PrivauditError
from privaudit.core.observation import Observation, Reconstruction

from .chain import Layer, Unsupported, invert, linear_chain
from .common import as_list, cosine_distance, gradient_fn, one_hot, stack_observations
from .ig import ig, starting_from
from .labels import labels_for
from .registry import LABEL_METHOD, NON_NEGATIVE, POSITIVE, UNIT_OPEN, register_attack

DEFAULT_RCOND = 1e-9  # singular values below rcond × the largest count as zero
NORMAL_COND = 1e6  # below this condition number the normal equations are solved
MAX_ENTRIES = 64_000_000  # systems larger than this (a dense float64 copy: 512 MB) are refused
EIG_TOL = 1e-3  # relative accuracy of the Lanczos estimates of the extreme eigenvalues
DENSE_EIG = 256  # up to this many unknowns the eigenvalues come from a dense eigvalsh
ALPHA_GRID = torch.logspace(-6, 6, 1201, dtype=torch.float64)


def conv_index(conv: nn.Conv2d, in_shape: tuple[int, ...]) -> Tensor:
    """``(Q, P)`` int64: for kernel entry q = (channel, kh, kw) and output position p, the
    flat input index + 1 it reads, 0 where it reads padding (``F.unfold`` of the indices)."""
    c, h, w = in_shape
    ids = torch.arange(1, c * h * w + 1, dtype=torch.float64).reshape(1, c, h, w)
    cols = F.unfold(
        ids, conv.kernel_size, dilation=conv.dilation, padding=conv.padding, stride=conv.stride
    )
    return cols[0].round().long()


def conv_matrices(
    conv: nn.Conv2d, in_shape: tuple[int, ...], weight: Tensor, delta: Tensor
) -> tuple[sparse.csr_matrix, sparse.csr_matrix]:
    """The forward matrix ``A`` (out·P, n), ``conv(x) = A x`` without bias, and the
    gradient matrix ``G`` (out·Q, n), ``∂L/∂W = G x`` for output gradient ``delta``
    (out·P,), both sparse (float64): row (o, p) of ``A`` holds the kernel ``W[o, q]`` at the
    input index read by entry q at position p (:func:`conv_index`), row (o, q) of ``G``
    holds ``δ[o, p]`` there."""
    idx = conv_index(conv, in_shape)
    q, p = idx.shape
    out = weight.shape[0]
    n = int(torch.tensor(in_shape).prod())
    cols = idx.expand(out, q, p)
    keep = (cols > 0).numpy()
    cols = cols.numpy()[keep] - 1
    o = torch.arange(out).reshape(out, 1, 1)
    rows_f = (o * p + torch.arange(p).reshape(1, 1, p)).expand(out, q, p).numpy()[keep]
    rows_g = (o * q + torch.arange(q).reshape(1, q, 1)).expand(out, q, p).numpy()[keep]
    vals_f = weight.double().reshape(out, q, 1).expand(out, q, p).numpy()[keep]
    vals_g = delta.double().reshape(out, 1, p).expand(out, q, p).numpy()[keep]
    fwd = sparse.csr_matrix((vals_f, (rows_f, cols)), shape=(out * p, n))
    grad = sparse.csr_matrix((vals_g, (rows_g, cols)), shape=(out * q, n))
    return fwd, grad


def _rms_rows(a: sparse.spmatrix) -> float:
    norm = float(sparse.linalg.norm(a))
    return (a.shape[0] ** 0.5) / norm if norm > 0 else 1.0


def cholesky_solve(chol: Tensor, rhs: Tensor) -> Tensor:
    """``(L Lᵀ)⁻¹ rhs`` by two triangular solves."""
    y = torch.linalg.solve_triangular(chol, rhs, upper=False)
    return torch.linalg.solve_triangular(chol.t(), y, upper=True)


def _extreme_eigenvalues(gram: Tensor, chol: Tensor) -> tuple[float, float]:
    """Largest and smallest eigenvalue of the positive definite ``gram`` by Lanczos
    (ARPACK), the smallest as the largest of ``gram⁻¹`` applied through its Cholesky
    factor: two O(n²) products per step instead of an O(n³) eigendecomposition. Small
    matrices, and any where Lanczos does not converge, get the full eigendecomposition."""
    n = gram.shape[0]
    if n <= DENSE_EIG:
        eig = torch.linalg.eigvalsh(gram)
        return float(eig[-1]), float(eig[0])
    v0 = np.ones(n)

    def largest(matvec: Any) -> float:
        op = sparse.linalg.LinearOperator((n, n), matvec=matvec, dtype=np.float64)
        (lam,) = sparse.linalg.eigsh(
            op, k=1, which="LA", v0=v0, tol=EIG_TOL, return_eigenvectors=False
        )
        return float(lam)

    def times(v: np.ndarray) -> np.ndarray:
        return (gram @ torch.from_numpy(np.ascontiguousarray(v).reshape(n))).numpy()

    def solve(v: np.ndarray) -> np.ndarray:
        rhs = torch.from_numpy(np.ascontiguousarray(v).reshape(n, 1))
        return cholesky_solve(chol, rhs)[:, 0].numpy()

    try:
        return largest(times), 1.0 / largest(solve)
    except sparse.linalg.ArpackNoConvergence:
        eig = torch.linalg.eigvalsh(gram)
        return float(eig[-1]), float(eig[0])


def solve_layer(
    blocks: list[tuple[sparse.spmatrix, Tensor]], unknowns: int, rcond: float
) -> tuple[Tensor, dict[str, Any]]:
    """Least squares over the stacked sparse ``(matrix, rhs)`` blocks, each scaled to unit
    RMS row norm -> (solution (n,), report: equations, rank, condition number, relative
    residual, full column rank or not).

    The normal matrix ``AᵀA`` is formed from the sparse ``A`` and Cholesky-factored; where
    that succeeds, the extreme singular values of ``A`` follow from Lanczos on ``AᵀA`` and
    its inverse (:func:`_extreme_eigenvalues`), and when the condition number is below
    ``NORMAL_COND`` the normal equations are solved (squaring the condition number costs at
    most 12 of float64's 16 digits). Otherwise ``torch.linalg.lstsq`` with the SVD-based
    ``gelsd`` driver solves the dense system and reports the rank (singular values below
    ``rcond`` × the largest count as zero)."""
    a = sparse.vstack([sparse.csr_matrix(m) * _rms_rows(m) for m, _ in blocks]).tocsr()
    b = torch.cat([r.double() * _rms_rows(m) for m, r in blocks])
    if a.shape[0] * a.shape[1] > MAX_ENTRIES:
        raise Unsupported(
            f"the layer's explicit system is {a.shape[0]}×{a.shape[1]}, larger than R-GAP "
            f"solves here ({MAX_ENTRIES:,} entries)"
        )
    gram = torch.from_numpy((a.T @ a).toarray())
    chol, failed = torch.linalg.cholesky_ex(gram)
    cond = float("inf")
    if not int(failed):
        hi, lo = _extreme_eigenvalues(gram, chol)
        cond = (hi / lo) ** 0.5 if lo > 0 else float("inf")
    if a.shape[0] >= a.shape[1] and cond < min(NORMAL_COND, 1 / rcond):
        atb = torch.from_numpy(a.T @ b.numpy()).unsqueeze(1)
        x = cholesky_solve(chol, atb)[:, 0]
        rank, solver = a.shape[1], "normal-equations"
    else:
        dense = torch.from_numpy(a.toarray())
        sol = torch.linalg.lstsq(dense, b.unsqueeze(1), rcond=rcond, driver="gelsd")
        x, s = sol.solution[:, 0], sol.singular_values
        rank, solver = int(sol.rank), "lstsq-gelsd"
        if len(s) < a.shape[1] or float(s[-1]) == 0.0:
            cond = float("inf")
        else:
            cond = float(s[0] / s[-1])
    fit = torch.from_numpy(a @ x.numpy())
    residual = float((fit - b).norm() / b.norm().clamp_min(1e-300))
    info = {
        "unknowns": unknowns,
        "equations": int(a.shape[0]),
        "rank": rank,
        "cond": cond,
        "residual": residual,
        "full_rank": rank == unknowns,
        "solver": solver,
    }
    return x, info


def _classifier(
    obs: Observation, layer: Layer, labels: Tensor, target: dict[str, Tensor]
) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """``(x_{L−1}, c δ_L, info)`` from the classifier's gradient (module docstring, step 1)."""
    dw = target[layer.param("weight")]
    n = dw.shape[1]
    if layer.module.bias is not None:
        db = target[layer.param("bias")]
        denom = float(db @ db)
        if denom == 0.0:
            raise PrivauditError("the classifier's bias gradient is zero: nothing to recover")
        x = db @ dw / denom
        residual = float((dw - torch.outer(db, x)).norm() / dw.norm().clamp_min(1e-300))
        info = {"unknowns": n, "rank": 1, "residual": residual, "full_rank": True, "exact": True}
        return x, db, info
    u, s, vh = torch.linalg.svd(dw, full_matrices=False)
    u, s0, v = u[:, 0], float(s[0]), vh[0]
    if s0 == 0.0:
        raise PrivauditError("the classifier's weight gradient is zero: nothing to recover")
    w = obs.params[layer.param("weight")].detach().double().cpu()
    y = F.one_hot(labels.reshape(-1)[:1].cpu(), w.shape[0]).double()[0]
    scale = float(obs.scale) or 1.0
    c_sign = 1.0 if scale > 0 else -1.0
    label = int(labels.reshape(-1)[0])
    sign = -c_sign * (1.0 if float(u[label]) > 0 else -1.0)

    def fit(alphas: Tensor) -> tuple[Tensor, Tensor]:
        """Mismatch of δ = (s/α) u with c (softmax(α W v) − y) for each α, and the best c."""
        p = torch.softmax(alphas[:, None] * (w @ v)[None, :], dim=1) - y
        d = (s0 / alphas)[:, None] * u[None, :]
        if obs.clip is None:
            c = torch.full_like(alphas, scale)
        else:  # c = scale · f with f in (0, 1]: least squares, then clamped
            f = (d * p).sum(1) / (p * p).sum(1).clamp_min(1e-300) / scale
            c = scale * f.clamp(1e-12, 1.0)
        return ((d - c[:, None] * p) ** 2).sum(1) / (d**2).sum(1), c

    alphas = sign * ALPHA_GRID
    err = torch.nan_to_num(fit(alphas)[0], nan=float("inf"))
    k = int(err.argmin())
    lo, hi = alphas[max(k - 1, 0)], alphas[min(k + 1, len(alphas) - 1)]
    for _ in range(100):  # golden-section refinement inside the bracket
        m1, m2 = lo + 0.382 * (hi - lo), lo + 0.618 * (hi - lo)
        e = fit(torch.stack([m1, m2]))[0]
        lo, hi = (lo, m2) if e[0] < e[1] else (m1, hi)
    alpha = (lo + hi) / 2
    residual = float(fit(alpha.reshape(1))[0][0]) ** 0.5
    info = {"unknowns": n, "rank": 1, "residual": residual, "full_rank": True, "exact": True}
    return alpha * v, (s0 / alpha) * u, info


def recover(
    obs: Observation, labels: Tensor, rcond: float = DEFAULT_RCOND
) -> tuple[Tensor, list[dict[str, Any]]]:
    """R-GAP on one observation (B = 1): images (1, *input_shape) in [0, 1] (float64, CPU)
    and one report per layer, input side first. Raises :class:`Unsupported` when the model
    or the observation is out of R-GAP's reach."""
    if obs.batch_size != 1:
        raise Unsupported(f"R-GAP inverts one example; this batch holds {obs.batch_size}")
    if obs.terms:
        raise Unsupported("R-GAP inverts one gradient; this observation is a sum of terms")
    layers = linear_chain(obs.model, tuple(obs.input_shape))
    target = {k: v.detach().double().cpu() for k, v in obs.target.items()}
    params = {k: v.detach().double().cpu() for k, v in obs.params.items()}
    top = layers[-1]
    x, delta, info = _classifier(obs, top, labels, target)
    reports = [{"layer": top.name, "type": "Linear", **info}]
    above = sparse.csr_matrix(params[top.param("weight")].numpy())  # the layer above's A
    for layer in reversed(layers[:-1]):
        z, slope, known = invert(layer.activation, x)
        delta = torch.from_numpy(above.T @ delta.numpy()) * slope
        weight = params[layer.param("weight")]
        bias = params.get(layer.param("bias")) if layer.module.bias is not None else None
        dw = target[layer.param("weight")].reshape(-1)
        if isinstance(layer.module, nn.Conv2d):
            fwd, grad = conv_matrices(layer.module, layer.in_shape, weight, delta)
            rhs_grad = dw
            if bias is not None:
                z = z - bias.repeat_interleave(fwd.shape[0] // bias.numel())
        else:
            fwd = sparse.csr_matrix(weight.numpy())
            norm = float(delta.norm())
            grad = sparse.identity(weight.shape[1], format="csr") * norm
            rhs_grad = target[layer.param("weight")].t() @ delta / max(norm, 1e-300)
            if bias is not None:
                z = z - bias
        blocks = [(fwd[known.numpy()], z[known]), (grad, rhs_grad)]
        x, info = solve_layer(blocks, layer.unknowns, rcond)
        info["exact"] = info["full_rank"] and reports[-1]["exact"]  # built on the layer above
        reports.append({"layer": layer.name, "type": type(layer.module).__name__, **info})
        above = fwd
    shape = tuple(obs.input_shape)
    view = (-1, *([1] * (len(shape) - 1))) if len(shape) > 1 else (-1,)
    mean = torch.as_tensor(obs.mean, dtype=torch.float64).reshape(view)
    std = torch.as_tensor(obs.std, dtype=torch.float64).reshape(view)
    images = x.reshape(1, *shape) * std + mean
    return images.clamp(0, 1), reports[::-1]


def gradient_mismatch(obs: Observation, images: Tensor, labels: Tensor) -> float:
    """Cosine distance between the observation's target and the gradient at ``images``
    (Geiping et al. 2020, Eq. 4; 0 for an exact reconstruction)."""
    stack = stack_observations([obs])
    x = images.to(stack.device, stack.dtype).unsqueeze(0)
    g = gradient_fn(stack)(x, one_hot([labels], stack, 1))
    return float(cosine_distance(g, stack.target)[0])


@register_attack(
    "rgap",
    summary="R-GAP: layer-wise linear systems, recursive (Zhu & Blaschko 2021); IG where not exact",
    rules={"lr": POSITIVE, "tv": NON_NEGATIVE, "label_method": LABEL_METHOD, "rcond": UNIT_OPEN},
)
def rgap(
    observations: Observation | Sequence[Observation],
    *,
    iterations: int | None = None,
    restarts: int | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
    lr: float | None = None,
    tv: float | None = None,
    label_method: str = "auto",
    rcond: float = DEFAULT_RCOND,
    fallback: bool = True,
) -> list[Reconstruction]:
    """R-GAP on each observation; where it cannot be exact (module docstring) and
    ``fallback``, Inverting Gradients started from its result with ``iterations``,
    ``restarts``, ``lr``, ``tv`` (None: IG's defaults). ``loss`` is the final cosine
    distance of the gradients.
    ``meta``: ``layers`` (per layer, input side first: unknowns, equations, rank, cond,
    residual, full_rank, exact = full rank here and in every layer above), ``exact_layers``
    (names of the layers determined exactly), ``exact``, ``inexact`` (None, or why R-GAP
    is not exact here), ``fallback`` (None, or why IG ran), and when IG ran ``start``
    (what it started from: "rgap" or "noise") and ``ig`` (its meta); ``attack`` names what
    produced the answer: "rgap", "rgap+ig" (IG refined R-GAP's partial solution) or "ig"."""
    refine = {k: v for k, v in (("lr", lr), ("tv", tv)) if v is not None}
    out = []
    for i, o in enumerate(as_list(observations)):
        src_dev = next(iter(o.params.values())).device
        dtype = next(iter(o.params.values())).dtype
        labels, source = labels_for(o, label_method)
        meta: dict[str, Any] = {"attack": "rgap", "labels": source, "rcond": rcond}
        start = None
        try:
            images, layers = recover(o, labels, rcond)
            meta["layers"] = layers
            meta["exact_layers"] = [r["layer"] for r in layers if r["exact"]]
            meta["exact"] = len(meta["exact_layers"]) == len(layers)
            why = None
            if not meta["exact"]:
                bad = [
                    f"{r['layer']} (rank {r['rank']} < {r['unknowns']} unknowns)"
                    for r in layers
                    if not r["full_rank"]
                ]
                why = f"rank condition fails at {', '.join(bad)}"
                start = images
        except Unsupported as e:
            images, why = None, str(e)
            meta.update(layers=[], exact_layers=[], exact=False)
        meta["inexact"] = why
        meta["fallback"] = why if fallback else None
        if why is not None and fallback:
            with starting_from(None if start is None else start.unsqueeze(0)):
                (rec,) = ig(
                    o,
                    iterations=iterations,
                    restarts=restarts,
                    seed=seed + i,
                    device=device,
                    progress=progress,
                    label_method=label_method,
                    **refine,
                )
            # what ran is what is reported: IG's answer, from R-GAP's partial one or noise
            meta.update(
                attack="rgap+ig" if start is not None else "ig",
                start="rgap" if start is not None else "noise",
                ig=rec.meta,
            )
            meta["observation"] = dict(o.meta)
            out.append(Reconstruction(rec.images, rec.labels, rec.loss, meta))
            continue
        if images is None:
            raise PrivauditError(f"R-GAP cannot invert this observation: {why}")
        images = images.to(src_dev, dtype)
        meta["observation"] = dict(o.meta)
        loss = gradient_mismatch(o, images, labels.to(src_dev))
        out.append(Reconstruction(images, labels.to(src_dev), loss, meta))
    return out
