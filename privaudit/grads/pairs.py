"""Gradients of many (model, batch) pairs at once, with ``torch.func``.

Every defense needs the gradient of some agent's batch at some agent's model: its own
(self-gradient) or a neighbour's (cross-gradient). All pairs of a round are evaluated in
one ``vmap`` over pairs (and, for DP clipping, a nested ``vmap`` over examples), so a
round costs a handful of kernel launches instead of a Python loop over agents. On the CPU,
per-example clipping of a plain conv/linear net runs on :mod:`privaudit.grads.pairnet` instead
(one stacked forward and backward, without materialising every per-example gradient; same
results to float rounding); other models and devices use ``vmap``.

Batches are padded (:mod:`privaudit.core.sampling`): a padded slot has label
:data:`~privaudit.core.sampling.IGNORE`, so losses are summed (never averaged: a batch may have no
real example) and a padded slot's gradient is exactly 0; every mean is the sum over real
examples divided by the expected batch size B (``PairGrads(batch_size=B)``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from privaudit.core.params import ParamSpec
from privaudit.core.sampling import IGNORE
from privaudit.grads import pairnet


def batch_loss_fn(model: nn.Module, spec: ParamSpec) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """``loss(flat, x, y)``: summed cross-entropy of the batch ``x`` at flat parameters;
    padded slots (label :data:`~privaudit.core.sampling.IGNORE`) add exactly 0."""

    def loss(flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        logits = functional_call(model, spec.unflatten(flat), (x,))
        return F.cross_entropy(logits, y, ignore_index=IGNORE, reduction="sum")

    return loss


def clip_factors(g: Tensor, clip: float) -> Tensor:
    """``min(1, C/(‖g‖ + 1e-12))`` per row (last dim) of ``g``, keeping the last dim (1)."""
    return torch.clamp(clip / (g.norm(dim=-1, keepdim=True) + 1e-12), max=1.0)


def clip_rows(g: Tensor, clip: float) -> Tensor:
    """Scale each row (last dim) to norm ≤ ``clip``: ``g · min(1, C/‖g‖)``."""
    return g * clip_factors(g, clip)


class PairGrads:
    """Gradients for stacked pairs: ``flat (P, D)``, ``x (P, W, ...)``, ``y (P, W)``, padded
    batches of width W (:mod:`privaudit.core.sampling`).

    ``batch_size``: the denominator B of every batch mean — the expected size of a Poisson
    batch; None: the width W (fixed-size batches without padding)."""

    def __init__(self, model: nn.Module, spec: ParamSpec, batch_size: int | None = None):
        self.spec = spec
        self.batch_size = batch_size
        self._stacked = pairnet.build(model)  # None: not a plain conv/linear net
        loss = batch_loss_fn(model, spec)
        self._mean = vmap(grad(loss), in_dims=(0, 0, 0))

        def example_loss(flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
            return loss(flat, x.unsqueeze(0), y.unsqueeze(0))

        per_example = vmap(grad(example_loss), in_dims=(None, 0, 0))
        self._per_example = vmap(per_example, in_dims=(0, 0, 0))

    def denominator(self, x: Tensor) -> int:
        """B of the batch means of ``x`` (P, W, …): ``batch_size``, else W."""
        return x.shape[1] if self.batch_size is None else self.batch_size

    def mean(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """Batch-mean gradient of each pair, ``(1/B) Σ_{b real} g_b``, ``(P, D)``; 0 for a
        batch without examples."""
        if x.shape[1] == 0:
            return torch.zeros_like(flat)
        return self._mean(flat, x, y) / self.denominator(x)

    def per_example(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """Per-example gradients, ``(P, W, D)``; 0 in padded slots."""
        if x.shape[1] == 0:
            return flat.new_zeros(flat.shape[0], 0, flat.shape[1])
        return self._per_example(flat, x, y)

    def clipped_mean(
        self, flat: Tensor, x: Tensor, y: Tensor, clip: float | None, owner: Tensor | None = None
    ) -> Tensor:
        """``(1/B) Σ_{b real} g_b · min(1, C/‖g_b‖)`` per pair; the plain mean when ``clip``
        is None. With ``owner`` (P,), ``x``/``y`` are the batches (N, W, …) and pair p's is
        ``owner[p]``: the stacked engine then reads each batch once (DPDL's 3 pairs per batch
        on a ring share one first-layer convolution)."""
        b, stacked = self.denominator(x), self._stacked
        if x.shape[1] == 0:
            return torch.zeros_like(flat)
        if clip is not None and stacked is not None and flat.device.type == "cpu":
            out = stacked.clipped_mean(flat, x, y, clip, owner, b)
            if out is not None:
                return out
        if owner is not None:
            x, y = x[owner], y[owner]
        if clip is None:
            return self.mean(flat, x, y)
        g = self.per_example(flat, x, y)
        # Σ_b f_b g_b / B as one batched matmul: no (P, W, D) temporary for the scaled rows
        return torch.bmm(clip_factors(g, clip).transpose(1, 2), g).squeeze(1) / b
