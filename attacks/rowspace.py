"""Row-space refinement: separated layer inputs made consistent with the next layer's gradient.

A disaggregation attack (:mod:`.cpa`) estimates each example's input ``h_i`` of a linear layer
``z = W h + c``; where the layer is followed by a ReLU and another linear layer
``z' = W' relu(z) + c'``, the message carries two exact facts every true input satisfies:

- **its own layer's row space.** ``∂W = Σ_i f_i g_i h_iᵀ`` has rank B (the batch) when the
  examples are independent, and its row space is ``span{h_i}``: every ``h_i = Vᵀ a_i`` for
  the top-B right singular vectors ``V`` (B × n) of ``∂W`` and some ``a_i ∈ R^B`` — the
  parameterisation the refinement searches in (B numbers per example instead of n);
- **the next layer's row space.** ``∂W' = Σ_i f_i g'_i r_iᵀ`` with ``r_i = relu(W h_i + c)``,
  the next layer's inputs, computed from ``h_i`` with the weights the message was evaluated
  at (known to every receiver). Where ``∂W'`` has rank B too (the next layer is at least B
  wide), its row space is ``span{r_i}``: each ``r_i`` lies in it, exactly — an observation
  the gradient makes of every example separately, independent of the mixing.

So each example is the solution of its own small problem,

    min_a  ‖(I − Q Qᵀ) r(a)‖² / ‖r(a)‖²,    r(a) = relu(W Vᵀ a + c),

``Q`` (m' × B) an orthonormal basis of the row space of ``∂W'`` (the ratio keeps the trivial
``r = 0`` out: it is not scale-free in ``a`` — the bias ``c`` fixes the scale and the sign that
ICA leaves open). It is non-convex (the ReLU's pattern moves with ``a``), so it starts from
the attack's estimate: L-BFGS (strong Wolfe line search) on all examples at once, in float64.
An example whose estimate was a blend of two examples can end at a local minimum; the
residual it reaches is reported per example (``meta["refine"]["residual"]``: ≈ 1e-7 where it
converged, the float32 rounding of the gradient; 1e-3 and above where it did not).

The rank conditions are what the ``rank`` arguments of Dimitrov et al. (SPEAR, NeurIPS 2024:
``∂W`` of rank B, its ReLU-sparse factorisation) and Zhu & Blaschko (R-GAP, ICLR 2021: the
gradient constrains each layer's input through the next) rest on; the refinement itself is
privaudit's. It applies (``refine="auto"``) where the layer is followed by an ``nn.ReLU`` and
a linear layer whose gradient the message carries with numerical rank ≥ B above its noise
(:func:`.identifiability.numerical_rank`, :func:`.identifiability.noise_edge`): McMahan et
al.'s 2NN (``mlp``) up to B = 200, not ``fedavg-cnn`` (its next layer has 10 outputs).
Under noise both row spaces are the top-B subspaces of noised matrices: the refinement then
fits the noise too, and the rank test turns it off once the noise swamps the rank.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from privaudit.core.observation import Observation

from .disaggregation import Separated, images_from_inputs, inputs_from_images, layer_params
from .identifiability import (
    LinearLayer,
    layer_gradient,
    linear_layers,
    rank_above_noise,
    top_singular,
)

ITERATIONS = 500  # L-BFGS iterations (each one function and gradient evaluation or a few)
REFINES = ("auto", "off")


def next_layer(obs: Observation, layer: LinearLayer) -> LinearLayer | None:
    """The linear layer right after ``layer``'s ReLU (``Linear → ReLU → Linear`` in the
    model's registration order), if the message carries its gradient; else None."""
    modules = [name for name, _ in obs.model.named_modules()]
    at = modules.index(layer.module)
    if at + 2 >= len(modules) or not layer.relu_after:
        return None
    after = obs.model.get_submodule(modules[at + 2])
    if not isinstance(after, nn.Linear):
        return None
    found = [ly for ly in linear_layers(obs.model) if ly.module == modules[at + 2]]
    return found[0] if found and found[0].weight in obs.target else None


def applicable(obs: Observation, layer: LinearLayer) -> tuple[LinearLayer | None, str]:
    """The next layer whose row space constrains ``layer``'s inputs, or None and why not."""
    nxt = next_layer(obs, layer)
    if nxt is None:
        return None, f"{layer.module} is not followed by ReLU and a linear layer in the message"
    b = int(obs.batch_size)
    rank = rank_above_noise(obs, nxt)
    if rank < b:
        return None, f"{nxt.module}'s gradient has rank {rank} above its noise, below B = {b}"
    return nxt, ""


def refine(
    obs: Observation,
    layer: LinearLayer,
    nxt: LinearLayer,
    sep: Separated,
    iterations: int = ITERATIONS,
) -> Separated:
    """``sep`` with every input ``h_i`` moved to the nearest solution of the module
    docstring's problem from where it was (never to a larger residual); the output gradients
    ``f_i g_i`` stay the attack's (re-solving them from ``∂W`` against the inputs would spread
    one unconverged input's error over every example's label)."""
    b = int(obs.batch_size)
    g1, _ = layer_gradient(obs, layer)
    g2, _ = layer_gradient(obs, nxt)
    _, _, v = top_singular(g1, b)  # (b, n): the row space of ∂W
    _, _, q = top_singular(g2, b)  # (b, m'): the row space of ∂W'
    w, c = layer_params(obs, layer)
    basis = q.T

    def residual(a: Tensor) -> Tensor:
        r = torch.relu(a @ v @ w.T + c)
        off = r - (r @ basis) @ basis.T
        return off.pow(2).sum(1) / r.pow(2).sum(1).clamp_min(1e-300)

    start = sep.h.double()
    if layer.takes_input:  # ICA's images clipped to [0, 1] pixels: a better start
        start = inputs_from_images(obs, images_from_inputs(obs, start))
    a = (start @ v.T).clone().requires_grad_(True)
    before = residual(a).detach()
    opt = torch.optim.LBFGS(
        [a],
        lr=1.0,
        max_iter=iterations,
        history_size=50,
        line_search_fn="strong_wolfe",
        tolerance_grad=1e-14,
        tolerance_change=1e-16,
    )

    def closure() -> Tensor:
        opt.zero_grad()
        loss = residual(a).sum()
        loss.backward()
        return loss

    opt.step(closure)
    a = a.detach()
    after = residual(a)
    keep = (after <= before) & ~_duplicates(a @ v, start)  # never worse than the start
    h = torch.where(keep[:, None], a @ v, start)
    meta = {
        **sep.meta,
        "refine": {
            "layer": nxt.module,
            "residual_before": [float(x) for x in before],
            "residual": [float(x) for x in torch.where(keep, after, before)],
        },
    }
    return Separated(h, sep.g, sep.found, meta)


def _duplicates(h: Tensor, start: Tensor, close: float = 1e-6) -> Tensor:
    """(b,) bool: the refined inputs that landed on the same example as another (cosine
    within ``close`` of 1) and started farther from it — two starts near one example end on
    it together; the later ones are handed back at their start, a distinct estimate."""
    unit = h / h.norm(dim=1, keepdim=True).clamp_min(1e-300)
    near = (unit @ unit.T) > 1 - close
    toward = (start * h).sum(1) / (start.norm(dim=1) * h.norm(dim=1)).clamp_min(1e-300)
    near.fill_diagonal_(False)
    out = torch.zeros(len(h), dtype=torch.bool)
    for i in torch.argsort(toward, descending=True).tolist():  # the nearest start keeps it
        if not out[i]:
            out |= near[i]
    return out
