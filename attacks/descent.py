"""Down a ReLU chain: once a hidden layer's gradient is separated, the layers below it are
solved exactly, one linear least-squares problem each — no feature inversion.

For ``Z = W A + c 1ᵀ`` (layer L − 1, inputs A: the B examples' rows) followed by a ReLU whose
output ``H = relu(Z)`` is layer L's input, back-propagation gives layer L − 1's output
gradients from layer L's:

    Δ_{L−1} = 1[H > 0] ⊙ (W_Lᵀ Δ_L),      ∂W_{L−1} = Δ_{L−1} A,   ∂c_{L−1} = Δ_{L−1} 1

(Δ: one column per example). A separated layer hands over every example's input ``h_i``
exactly once all B are found; then ``Δ_L = ∂W_L H⁺`` (exact, at the true scale, clip factors
included, whatever scale the separation left), the pattern ``1[h_i > 0]`` is read off ``h_i``
itself (zero below a share of its largest entry: of ``ZEROS``, the one that fits best), and
``A = Δ_{L−1}⁺ ∂W_{L−1}`` is exact wherever ``Δ_{L−1}`` has rank B (its columns are
independent wherever the separation above was possible: that needed ``H`` of rank B, so the
layer has at least B units). This is R-GAP's recursion (Zhu & Blaschko, ICLR 2021, §3) for a
batch: there the unknown of each step is one input, here the B inputs at once, made
determined by the B output gradients the separation found. Each step is checked: the solved
inputs must reproduce ``∂W_{L−1}`` to ``EXACT`` (relative) or within the stated noise's reach
(``NOISE_FIT`` × its Frobenius norm), else the descent stops at the layer above and says why.

The step repeats while the layer below is itself a linear layer (in the message) whose ReLU
feeds the current one — down to the layer that takes the image (an MLP), or to the first
layer after a trunk (then the features go to feature inversion, as before).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor

from privaudit.core.observation import Observation

from .disaggregation import Separated, layer_params
from .identifiability import LinearLayer, layer_gradient, linear_layers
from .rowspace import next_layer

EXACT = 1e-4  # a noise-free step is accepted where it reproduces ∂W to this (relative)
NOISE_FIT = 2.0  # with noise of std σ, a residual up to this × σ√(mn) is accepted
# an input at most this share of its example's largest is an inactive unit; tried in turn
# (a message rounded to float32 leaves its zeros at 1e-5 or so), the best fit kept
ZEROS = (1e-6, 1e-5, 1e-4, 1e-3)


def layer_below(obs: Observation, layer: LinearLayer) -> LinearLayer | None:
    """The linear layer (in the message) whose ReLU output is ``layer``'s input, or None."""
    for ly in linear_layers(obs.model):
        if ly.weight in obs.target and (nxt := next_layer(obs, ly)) is not None:
            if nxt.module == layer.module:
                return ly
    return None


def bottom(obs: Observation, layer: LinearLayer) -> LinearLayer:
    """The lowest layer the descent can reach from ``layer`` (``layer`` itself if none)."""
    while (below := layer_below(obs, layer)) is not None:
        layer = below
    return layer


def step(
    obs: Observation, layer: LinearLayer, below: LinearLayer, h: Tensor
) -> tuple[Tensor, Tensor] | str:
    """One step (module docstring): the inputs (B, n) and output gradients (m, B) of
    ``below`` from ``layer``'s inputs ``h`` (B, m), or why the step does not check out."""
    dw, _ = layer_gradient(obs, layer)
    dwb, _ = layer_gradient(obs, below)
    w, _ = layer_params(obs, layer)
    delta = torch.linalg.lstsq(h.T, dw.T).solution.T  # ∂W_L = Δ_L H  ->  Δ_L (m_L, B)
    back = w.T @ delta  # (m, B): Δ_{L−1} before the ReLU's pattern
    best = None
    for zero in ZEROS:  # the pattern read at each threshold; the best fit is kept
        below_delta = (h > zero * h.abs().amax(1, keepdim=True)).T * back
        a = torch.linalg.lstsq(below_delta, dwb).solution  # (B, n)
        res = float((below_delta @ a - dwb).norm())
        if best is None or res < best[0]:
            best = (res, a, below_delta)
    res, a, below_delta = best
    sigma = float(obs.noise_std or 0.0) / (float(obs.scale) if obs.scale else 1.0)
    allowed = max(EXACT * float(dwb.norm()), NOISE_FIT * abs(sigma) * math.sqrt(dwb.numel()))
    if res > allowed:
        return f"{below.module}'s gradient is not reproduced ({res:.2e} > {allowed:.2e})"
    return a, below_delta


def descend(obs: Observation, layer: LinearLayer, sep: Separated) -> tuple[LinearLayer, Separated]:
    """``sep`` of ``layer`` carried down the ReLU chain below it as far as every step checks
    out (module docstring) -> (the lowest layer reached, its Separated; ``meta["descent"]``
    names the layers solved and, where it stopped early, why). Unchanged unless all B were
    found and the layer's input is a ReLU output in the message."""
    if not bool(sep.found.all()):
        return layer, sep
    solved: list[str] = []
    why = ""
    while not layer.takes_input and (below := layer_below(obs, layer)) is not None:
        out = step(obs, layer, below, sep.h)
        if isinstance(out, str):
            why = out
            break
        sep = replace(sep, h=out[0], g=out[1])
        layer = below
        solved.append(below.module)
    if solved or why:
        sep.meta["descent"] = {"solved": solved, **({"stopped": why} if why else {})}
        if solved:
            sep.meta["how"] = (
                sep.meta.get("how", "")
                + "; then down the ReLU chain, inputs of "
                + ", ".join(solved)
                + f" by least squares (each reproducing its gradient to {EXACT:g})"
            )
    return layer, sep
