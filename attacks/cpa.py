"""The Cocktail Party Attack (Kariyappa, Guo, Maeng, Xiong, Suh, Qureshi & Lee, "Cocktail Party
Attack: Breaking Aggregation-Based Privacy in Federated Learning using Independent Component
Analysis", ICML 2023): blind source separation of a linear layer's gradient.

**Mixing** (the paper's §3, Fig. 1). For ``z = W h + c`` the observed gradient (divided by
``scale``) is

    G = ∂W = Σ_i f_i g_i h_iᵀ = A H,     A = [f_1 g_1 … f_B g_B]  (m × B),

so each of the m rows of G is a linear mixture of the B inputs ``h_i`` (rows of H, the
"sources"; for an MLP's first layer, the normalised images), the n input coordinates being
the samples — a cocktail party with m microphones and B speakers.

**Whitening** (the paper's preprocessing). Rows centred over the samples,
``G_c = G − μ 1ᵀ``; with ``C = G_c G_cᵀ / n = E Λ Eᵀ``, the B largest eigenpairs give
``K = (Λ_B − σ² I)^{-1/2} E_Bᵀ`` and ``Z = K G_c`` (B × n) with identity covariance — the PCA to
B components discards the m − B directions that carry no source. Noise ``N(0, σ²)`` on each
coordinate (σ = ``noise_std / scale``, known) adds ``σ² I`` to ``C``; it is subtracted before
the inverse square root (bias-removed whitening, as for noisy ICA: Hyvärinen 1999, "Gaussian
moments for noisy independent component analysis").

**Non-Gaussianity** (the paper's J_NG). The unmixing ``W`` (B × B, orthonormal rows)
maximises the negentropy approximation ``Σ_i (E[G(w_iᵀ z)] − E[G(ν)])²``,
``G(u) = (1/a) log cosh(a u)``: mixtures are more Gaussian than their sources. Solved by
FastICA's fixed point (Hyvärinen 1999, "Fast and robust fixed-point algorithms for ICA",
eq. 20), with ``γ = tanh(a·)``:

    W⁺ = E[γ(W Z) Zᵀ] − diag(E[γ'(W Z)]) W,     W ← (W⁺ W⁺ᵀ)^{-1/2} W⁺,

the symmetric decorrelation keeping the recovered sources uncorrelated — the hard form of the
paper's mutual-independence term J_MI. It stops when no row turns by more than ``tol``
(``1 − |⟨w_new, w_old⟩|``) or after ``ica_iterations``.

**Sign and scale** (the paper's image prior). The unmixing ``U = W K`` applied to the
*uncentred* gradient gives ``ŝ_i = u_iᵀ G = t_i h_i`` with unknown ``t_i`` (sign included).
``scale="bias"``: ``∂c = Σ_i f_i g_i = A 1`` and ``G = Σ_i (f_i g_i / t_i) ŝ_iᵀ``, so
``A' = G Ŝ⁺`` and ``∂c = A' t`` (least squares) give every ``t_i`` — exact once the sources
are, and, as the clip factor ``f_i`` sits in both ``∂W`` and ``∂c``, invariant to clipping.
``scale="prior"`` (images only, no bias needed): pixels ``μ + σ t ŝ`` must lie in [0, 1];
of the two signs the one admitting the larger ``|t|`` is taken, at its largest (the image
then touches 0 or 1, as a photograph does). That is exact for an image reaching 0 or 1 whose
reflection ``2μ − x`` leaves [0, 1] (a mean away from 1/2, as digits); an image symmetric
about μ leaves the sign undecided. "auto": the bias where the layer has one.

What ICA assumes — independent, non-Gaussian sources — images only approximate: crops of
one photograph, or digits, are correlated and their pixel values close to Gaussian, and
whitening forces the recovered sources to be uncorrelated. **Where the sources are images**
(``ica_on="differences"``, what "auto" picks for a layer that takes the image) the unmixing
is learned on the gradient's rows filtered by horizontal and vertical pixel differences,
per channel: the mixing acts on each pixel alike, so ``G D = A (H D)`` for the difference
operator D, and the same ``U`` unmixes ``G`` itself; natural images' differences are sparse,
heavy-tailed and far less correlated between images than their values (Hyvärinen, Hurri &
Hoyer 2009, *Natural Image Statistics*, ch. 7 — the reason the official code's total-
variation prior helps). The filter doubles the noise's variance, which the whitening
removes (2σ²). ``ica_on="values"``: the paper's ICA on the values themselves (features
below a trunk, or a comparison). ``benchmarks/disaggregation.py`` and
``benchmarks/cpa_anchor.py`` measure the separation. Below a convolutional trunk the
sources are ReLU features (sparse, closer to the assumptions); they are then inverted to
images by the ``fi`` attack's feature inversion, as the paper does (:mod:`.disaggregation`).

**Refinement** (privaudit's, not the paper's; :mod:`.rowspace`). Where the layer is followed
by a ReLU and a linear layer whose gradient has rank ≥ B (an MLP's first layer), each
separated input is moved, from ICA's estimate, to where its ReLU features lie in that
gradient's row space — an exact property of every true input. **Completion** (privaudit's;
:mod:`.completion`): on a noise-free gradient each refined input is polished to the exact
fixed point of its ReLU pattern where it has one, and the examples left are found by SPEAR's
search at the rank the exact ones leave — on McMahan et al.'s 2NN at B = 64 the two turn
ICA's approximate separations into exact ones (``benchmarks/disaggregation.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from privaudit.core.errors import PrivauditError
from privaudit.core.observation import Observation, Reconstruction

from . import completion, rowspace
from .common import as_list
from .disaggregation import Separated, finish, pick_layer
from .fi import DEFAULT_ITERATIONS
from .identifiability import (
    LinearLayer,
    layer_gradient,
    linear_layers,
    numerical_rank,
    rank_above_noise,
)
from .registry import NON_NEGATIVE, POSITIVE, UNIT_OPEN, Rule, one_of, register_attack

ICA_ITERATIONS = 1000
TOL = 1e-7
CONTRAST = 1.0  # a in G(u) = log cosh(a u) / a (FastICA's usual 1 ≤ a ≤ 2)
SCALES = ("auto", "bias", "prior")
ICA_ON = ("auto", "values", "differences")
COMPLETES = ("auto", "off")


def differences(g: Tensor, shape: Sequence[int]) -> tuple[Tensor, float]:
    """Rows of ``g`` (m, n) as images of ``shape`` (C, H, W), filtered by horizontal and
    vertical neighbour differences per channel and concatenated (m, n'); and the factor (2)
    by which the filter multiplies i.i.d. noise's variance."""
    x = g.reshape(g.shape[0], *shape)
    dx = (x[..., :, 1:] - x[..., :, :-1]).flatten(1)
    dy = (x[..., 1:, :] - x[..., :-1, :]).flatten(1)
    return torch.cat([dx, dy], 1), 2.0


def whiten(g: Tensor, b: int, noise_var: float = 0.0) -> tuple[Tensor, Tensor]:
    """``(Z (b, n), K (b, m))``: the centred rows of ``g`` (m, n) whitened onto their b
    principal components, ``σ²`` (``noise_var``) removed from each eigenvalue."""
    gc = g - g.mean(1, keepdim=True)
    lam, e = torch.linalg.eigh(gc @ gc.T / gc.shape[1])
    lam, e = lam.flip(0), e.flip(1)
    rank = numerical_rank(lam.clamp_min(0).sqrt())
    lam, e = lam[:b] - noise_var, e[:, :b]
    if rank < b or len(lam) < b or float(lam.min()) <= 0:
        raise PrivauditError(
            f"the gradient has {min(rank, len(lam))} components (above its noise: fewer where "
            f"it is noised) for B = {b} sources: ICA cannot separate them; at most "
            f"{min(rank, len(lam))} of {b} examples can be separated from this layer "
            "(privaudit.attacks.identifiability)"
        )
    k = e.T / lam.sqrt()[:, None]
    return k @ gc, k


def fastica(
    z: Tensor, *, a: float, iterations: int, tol: float, gen: torch.Generator
) -> tuple[Tensor, int]:
    """Symmetric FastICA with the log cosh contrast (module docstring) on whitened ``z``
    (b, n), from a random orthogonal start -> (W (b, b), iterations run)."""
    b, n = z.shape
    w = torch.linalg.qr(torch.randn(b, b, generator=gen, dtype=z.dtype))[0]
    for it in range(1, iterations + 1):
        y = torch.tanh(a * (w @ z))
        new = y @ z.T / n - (a * (1 - y * y)).mean(1)[:, None] * w
        lam, u = torch.linalg.eigh(new @ new.T)
        new = (u / lam.clamp_min(1e-300).sqrt()) @ u.T @ new
        turn = float((1 - (new * w).sum(1).abs()).abs().max())
        w = new
        if turn < tol:
            return w, it
    return w, iterations


def prior_scales(s: Tensor, obs: Observation) -> Tensor:
    """``t`` (b,) from the image prior (module docstring): for each source, the sign whose
    largest [0, 1]-feasible ``|t|`` is larger, at that ``|t|``."""
    per = s.shape[1] // len(obs.mean)
    if per * len(obs.mean) != s.shape[1]:
        raise PrivauditError("the image prior needs one mean/std per input channel")
    mu = torch.as_tensor(obs.mean, dtype=s.dtype).repeat_interleave(per)
    sd = torch.as_tensor(obs.std, dtype=s.dtype).repeat_interleave(per)
    v = s * sd  # pixel = mu + t v

    def largest(sign: float) -> Tensor:
        top = torch.where(sign * v > 0, (1 - mu) / (sign * v), torch.inf)
        bottom = torch.where(sign * v < 0, -mu / (sign * v), torch.inf)
        return torch.minimum(top, bottom).amin(1)

    up, down = largest(1.0), largest(-1.0)
    return torch.where(up >= down, up, -down)


def unmix(
    obs: Observation,
    layer: LinearLayer,
    *,
    scale: str,
    a: float,
    iterations: int,
    tol: float,
    seed: int,
    ica_on: str = "auto",
) -> Separated:
    """Whitening, FastICA, sign and scale (module docstring) -> each example's layer input
    ``h_i`` and output gradient ``f_i g_i``; the unmixing learned on ``ica_on``'s rows."""
    g, db = layer_gradient(obs, layer)
    b = int(obs.batch_size)
    s_ = float(obs.scale) if obs.scale else 1.0
    sigma = float(obs.noise_std) / abs(s_)
    if ica_on == "differences" and not layer.takes_input:
        raise PrivauditError(
            f"ica_on='differences' filters images, and {layer.module}'s inputs are features; "
            "use ica_on='values' (or 'auto')"
        )
    images = ica_on == "differences" or (ica_on == "auto" and layer.takes_input)
    rows, gain = differences(g, obs.input_shape) if images else (g, 1.0)
    z, k = whiten(rows, b, gain * sigma * sigma)
    gen = torch.Generator().manual_seed(seed)
    w, its = fastica(z, a=a, iterations=iterations, tol=tol, gen=gen)
    src = (w @ k) @ g  # (b, n): t_i h_i
    mix = g @ torch.linalg.pinv(src)  # (m, b): f_i g_i / t_i
    how = "bias" if scale == "bias" or (scale == "auto" and db is not None) else "prior"
    if how == "bias" and db is None:
        raise PrivauditError(f"scale='bias' needs a bias on {layer.module}; use scale='prior'")
    if how == "prior" and not layer.takes_input:
        raise PrivauditError(
            f"the image prior fixes the scale of images, and {layer.module}'s inputs are "
            "features: its bias is needed (scale='bias')"
        )
    if how == "bias":
        t = torch.linalg.lstsq(mix, db[:, None]).solution.flatten()
    else:
        t = prior_scales(src, obs)
    t = torch.where(t.abs() > 0, t, torch.ones_like(t))
    meta = {"ica_iterations": its, "converged": its < iterations, "scale": how}
    meta["ica_on"] = "differences" if images else "values"
    return Separated(src / t[:, None], mix * t, torch.ones(b, dtype=torch.bool), meta)


def applies(obs: Observation) -> str | None:
    """Why :mod:`.auto` should run CPA on ``obs``, or None: a single gradient of B > 1 whose
    first linear layer takes the example, carries B components above its noise, and is
    followed by a ReLU and a layer wide enough for the row-space refinement
    (:func:`.rowspace.applicable`) — where the refinement makes ICA's separation exact."""
    b = int(obs.batch_size)
    if obs.terms or b <= 1:
        return None
    layers = [ly for ly in linear_layers(obs.model) if ly.weight in obs.target]
    if not layers or not layers[0].takes_input:
        return None
    if rank_above_noise(obs, layers[0]) < b:
        return None
    nxt, _ = rowspace.applicable(obs, layers[0])
    if nxt is None:
        return None
    return (
        f"B = {b}: {layers[0].module} takes the image and its gradient has rank B, and "
        f"{nxt.module}'s row space pins every example (ICA, the row-space refinement, then "
        "the completion)"
    )


@register_attack(
    "cpa",
    summary="Cocktail Party Attack: FastICA separates a linear layer's gradient into the batch",
    rules={
        "scale": one_of(SCALES),
        "ica_on": one_of(ICA_ON),
        "contrast": Rule("a number in [1, 2]", lambda v: 1 <= v <= 2),
        "ica_iterations": Rule("an integer in 1..10^6", lambda v: 1 <= v <= 10**6),
        "tol": UNIT_OPEN,
        "lr": POSITIVE,
        "tv": NON_NEGATIVE,
        "refine": one_of(rowspace.REFINES),
        "refine_iterations": Rule("an integer in 1..10^5", lambda v: 1 <= v <= 10**5),
        "complete": one_of(COMPLETES),
        "complete_samples": Rule("an integer in 1..10^9", lambda v: 1 <= v <= 10**9),
    },
)
def cpa(
    observations: Observation | Sequence[Observation],
    *,
    iterations: int | None = None,
    restarts: int | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
    layer: str = "auto",
    scale: str = "auto",
    contrast: float = CONTRAST,
    ica_iterations: int = ICA_ITERATIONS,
    tol: float = TOL,
    lr: float = 0.1,
    tv: float = 5e-2,
    ica_on: str = "auto",
    refine: str = "auto",
    refine_iterations: int = rowspace.ITERATIONS,
    complete: str = "auto",
    complete_samples: int = completion.SAMPLES,
) -> list[Reconstruction]:
    """The Cocktail Party Attack (module docstring) on ``layer`` ("auto": the first linear
    layer) of each observation, observation i with seed ``seed + i`` (FastICA's start).
    Where the layer's input is not the image, ``iterations`` (default 1000) and ``restarts``
    of feature inversion at step ``lr`` with TV weight ``tv`` turn the features into images.
    ``ica_on``: the rows FastICA learns the unmixing on, "values" or "differences" (of
    pixels; "auto": where the layer takes the image). ``refine``: "auto" moves the separated
    inputs to the next layer's row space (:mod:`.rowspace`, ``refine_iterations`` of L-BFGS)
    where its gradient has rank ≥ B after a ReLU, "off" keeps ICA's. ``complete``: "auto",
    after the refinement on a noise-free gradient, polishes every example to exactness where
    it can and finds the rest by SPEAR's search at the rank they leave
    (:mod:`.completion`, ``complete_samples`` draws); "off" stops at the refinement.
    ``loss`` is 0: ICA has no residual to report (``meta["cpa"]`` says whether it converged,
    on which rows, the refinement's residual per example or why it did not run, and how
    many examples the completion made exact and found)."""
    out = []
    for i, o in enumerate(as_list(observations)):
        if o.terms:
            raise PrivauditError(
                "the Cocktail Party Attack separates one gradient; this observation is a sum of "
                "gradient terms (e.g. a tracking difference): use --attack ig"
            )
        ly = pick_layer(o, layer)
        sep = unmix(
            o,
            ly,
            scale=scale,
            a=contrast,
            iterations=ica_iterations,
            tol=tol,
            seed=seed + i,
            ica_on=ica_on,
        )
        if refine == "auto":
            nxt, why = rowspace.applicable(o, ly)
            if nxt is None:
                sep.meta["refine"] = {"skipped": why}
            else:
                sep = rowspace.refine(o, ly, nxt, sep, refine_iterations)
                if complete == "auto":
                    sep = completion.complete(o, ly, sep, samples=complete_samples, seed=seed + i)
        inv = {"iterations": DEFAULT_ITERATIONS if iterations is None else int(iterations)}
        inv.update(restarts=1 if restarts is None else int(restarts), lr=lr, tv=tv)
        rec = finish(o, ly, sep, seed + i, device, progress, inv, "cpa")
        out.append(Reconstruction(rec.images, rec.labels, 0.0, rec.meta))
    return out
