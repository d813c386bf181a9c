"""Gradients of many (model, batch) pairs at once, with ``torch.func``.

Every defense needs the gradient of some agent's batch at some agent's model: its own
(self-gradient) or a neighbour's (cross-gradient). All pairs of a round are evaluated in
one ``vmap`` over pairs (and, for DP clipping, a nested ``vmap`` over examples), so a
round costs a handful of kernel launches instead of a Python loop over agents.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from .params import ParamSpec


def batch_loss_fn(model: nn.Module, spec: ParamSpec) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """``loss(flat, x, y)``: mean cross-entropy of the batch ``x`` at flat parameters."""

    def loss(flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(functional_call(model, spec.unflatten(flat), (x,)), y)

    return loss


def clip_rows(g: Tensor, clip: float) -> Tensor:
    """Scale each row (last dim) to norm ≤ ``clip``: ``g · min(1, C/‖g‖)``."""
    norm = g.norm(dim=-1, keepdim=True)
    return g * torch.clamp(clip / (norm + 1e-12), max=1.0)


class PairGrads:
    """Gradients for stacked pairs: ``flat (P, D)``, ``x (P, B, ...)``, ``y (P, B)``.

    ``chunk_size`` bounds the memory of per-example gradients (``P·B·D`` floats).
    """

    def __init__(self, model: nn.Module, spec: ParamSpec, chunk_size: int | None = None):
        loss = batch_loss_fn(model, spec)
        self._mean = vmap(grad(loss), in_dims=(0, 0, 0), chunk_size=chunk_size)

        def example_loss(flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
            return loss(flat, x.unsqueeze(0), y.unsqueeze(0))

        per_example = vmap(grad(example_loss), in_dims=(None, 0, 0))
        self._per_example = vmap(per_example, in_dims=(0, 0, 0), chunk_size=chunk_size)

    def mean(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """Batch-mean gradient of each pair, ``(P, D)``."""
        return self._mean(flat, x, y)

    def per_example(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """Per-example gradients, ``(P, B, D)``."""
        return self._per_example(flat, x, y)

    def clipped_mean(self, flat: Tensor, x: Tensor, y: Tensor, clip: float | None) -> Tensor:
        """``(1/B) Σ_b g_b · min(1, C/‖g_b‖)`` per pair; the plain mean when ``clip`` is None."""
        if clip is None:
            return self.mean(flat, x, y)
        return clip_rows(self.per_example(flat, x, y), clip).mean(dim=1)
