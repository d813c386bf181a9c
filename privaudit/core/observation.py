"""What an attack is given: the leak, re-expressed as a (noisy, scaled) gradient.

A defense turns a threat model's View into Observations (:meth:`Defense.observe`).
Attacks see only this, never a defense: ``target ≈ scale · ∇_θ mean_b CE(f(θ; x_b), y_b)
+ N(0, noise_std²)`` evaluated at ``params``, where the batch ``x`` of ``batch_size``
images is the private data to recover.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from privaudit.core.errors import PrivauditError


@dataclass
class Observation:
    """One attackable leak.

    model:        architecture (its own parameter values are ignored; ``params`` are used).
    params:       parameter point the gradient was computed at, ``{name: tensor}``.
    target:       the observed gradient-like message, same keys/shapes as ``params``.
    batch_size:   number of private examples behind ``target``: the realised size b of the
                  victim's Poisson batch when the attacker is told it
                  (:func:`privaudit.sim.plan.given_batch_size`), else the expected size B.
    input_shape:  shape of one example, e.g. ``(3, 32, 32)``.
    num_classes:  output classes of ``model``.
    scale:        ``target`` is ``scale`` times the mean gradient over the ``batch_size``
                  examples (plus noise); a defense's message is (1/B) Σ over the b real
                  examples, so a realised ``batch_size`` b comes with a factor b/B.
    clip:         per-example clip norm C if the examples were clipped, else None.
    noise_std:    std of the Gaussian noise per coordinate of ``target`` (0 if none).
    labels:       labels an attack is told (None in every built-in threat model: attacks
                  infer them); set by hand to run an attack with known labels.
    mean, std:    per-channel normalisation the model expects; attacks work in [0, 1]
                  pixel space and normalise inside, so reconstructions are images.
    terms:        further gradient terms inside ``target``, each ``(params_s, coef_s,
                  same_batch_s)``: ``target ≈ scale · (∇L(params; x) + Σ_s coef_s ·
                  ∇L(params_s; x_s)) + noise`` where ``x_s`` is ``x`` itself when
                  ``same_batch_s``, else another unknown batch of ``batch_size`` (e.g. a
                  gradient-tracking difference ∇L(θ^t; ξ_{t+1}) − ∇L(θ^{t−1}; ξ_t));
                  ``meta["term_rounds"]`` names each term's round (whose batch it is).
    meta:         provenance (target name, round, src, dst, threat) — never secrets.
    """

    model: nn.Module
    params: dict[str, Tensor]
    target: dict[str, Tensor]
    batch_size: int
    input_shape: tuple[int, ...]
    num_classes: int
    scale: float = 1.0
    clip: float | None = None
    noise_std: float = 0.0
    labels: Tensor | None = None
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    meta: dict[str, Any] = field(default_factory=dict)
    terms: list[tuple[dict[str, Tensor], float, bool]] = field(default_factory=list)

    def to(self, device: torch.device | str) -> Observation:
        """A copy with every tensor on ``device``."""
        move = lambda d: {k: v.to(device) for k, v in d.items()}  # noqa: E731
        return Observation(
            model=self.model.to(device),
            params=move(self.params),
            target=move(self.target),
            batch_size=self.batch_size,
            input_shape=self.input_shape,
            num_classes=self.num_classes,
            scale=self.scale,
            clip=self.clip,
            noise_std=self.noise_std,
            labels=None if self.labels is None else self.labels.to(device),
            mean=self.mean,
            std=self.std,
            meta=dict(self.meta),
            terms=[(move(p), c, same) for p, c, same in self.terms],
        )


def check_finite(observations: Iterable[Observation]) -> None:
    """Refuse, with one line, an observation whose ``params``, ``target`` or ``terms`` hold
    NaN or ±inf: a message of a diverged run (or an edited file). An attack would answer it
    with noise, or fail deep in a solver (a singular least-squares system), never with a
    reconstruction. One reduction per tensor."""
    for i, o in enumerate(observations):
        tensors = [*o.params.values(), *o.target.values()]
        tensors += [v for p, _, _ in o.terms for v in p.values()]
        if all(bool(torch.isfinite(v).all()) for v in tensors):
            continue
        m = o.meta
        what = (
            f"the {m['target']} message {m['src']}→{m['dst']} of round {m['round']}"
            if {"target", "src", "dst", "round"} <= m.keys()
            else f"observation {i}"
        )
        raise PrivauditError(
            f"{what} is not finite (NaN or ±inf): the run's training diverged or its files "
            "were edited; attack a run trained with a smaller step size (--lr or -p lr)"
        )


@dataclass
class Reconstruction:
    """An attack's answer for one Observation: images in [0, 1] and labels."""

    images: Tensor  # (B, *input_shape), values in [0, 1]
    labels: Tensor  # (B,) int64
    loss: float  # final matching loss
    meta: dict[str, Any] = field(default_factory=dict)
