"""Flat parameter vectors <-> named parameter dicts.

Agents' states are stacked flat vectors ``(N, D)`` so that gossip is ``W @ X`` and a
message payload is one 1-D tensor; ``torch.func.functional_call`` needs the named
form, which :meth:`ParamSpec.unflatten` gives as views (it works under ``vmap``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class ParamSpec:
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, model: nn.Module) -> ParamSpec:
        items = list(model.named_parameters())
        return cls(tuple(n for n, _ in items), tuple(tuple(p.shape) for _, p in items))

    @property
    def sizes(self) -> list[int]:
        return [math.prod(s) for s in self.shapes]

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    def unflatten(self, flat: Tensor) -> dict[str, Tensor]:
        """``(..., D)`` -> ``{name: (..., *shape)}`` views."""
        lead = flat.shape[:-1]
        parts = torch.split(flat, self.sizes, dim=-1)
        items = zip(self.names, parts, self.shapes, strict=True)
        return {n: p.reshape(*lead, *s) for n, p, s in items}

    def flatten(self, named: dict[str, Tensor], batch_dims: int = 0) -> Tensor:
        """``{name: (..., *shape)}`` -> ``(..., D)``; ``batch_dims`` leading dims are kept."""
        parts = []
        for n in self.names:
            t = named[n]
            parts.append(t.reshape(*t.shape[:batch_dims], -1))
        return torch.cat(parts, dim=-1)


def flat_params(model: nn.Module) -> Tensor:
    """The model's current parameters as one detached flat vector."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])
