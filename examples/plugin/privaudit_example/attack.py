"""``guess``: a blind baseline attack, as a privaudit plugin (docs/extending.md).

It never looks at the observed gradient beyond its labels: each image is uniform noise
(observation i drawn with seed ``seed + i``), each label the one the threat model reveals
or the one inferred from the last layer's gradient. Its scores are what an attack gets for
free; a real attack is worth what it scores above them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from privaudit.attacks import infer_labels, register_attack
from privaudit.core.observation import Observation, Reconstruction


def guess(
    observations: Observation | Sequence[Observation],
    *,
    iterations: int | None = None,
    restarts: int | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> list[Reconstruction]:
    """Uniform-noise images and the given (or inferred) labels, one per example."""
    obs = [observations] if isinstance(observations, Observation) else list(observations)
    out = []
    for i, o in enumerate(obs):
        where = next(iter(o.params.values())).device
        gen = torch.Generator().manual_seed(seed + i)
        images = torch.rand(o.batch_size, *o.input_shape, generator=gen).to(where)
        labels = o.labels if o.labels is not None else infer_labels(o)
        out.append(Reconstruction(images, torch.as_tensor(labels).long().to(where), loss=0.0))
    return out


register_attack("guess", guess)
