"""Presets: where the training settings a user leaves unset come from.

- ``utility`` — the defense's *operating point* on the dataset: the model, expected batch
  size B, rounds T, partition and step size (and clip) at which it learns, found by
  ``benchmarks/tune.py``, a grid search scored on a validation split carved out of the
  training data (``eval_split="validation"``), never on the test split. As is usual, the
  search itself is not accounted: its ε is not part of the ε a run reports. The default of
  ``privaudit train``.
- ``attack`` — the small-batch setting gradient-inversion papers attack (DLG's sigmoid LeNet,
  B = 8, the defense's own default step size): reconstructions are meaningful there, accuracy
  is not. The default of ``attack``, ``audit``, ``claims``, ``compare`` and ``reproduce``.

An explicit flag (``--model``, ``--batch-size``, ``--rounds``, ``--dirichlet-alpha``,
``--lr``, ``--clip``, ``-p``) always wins over the preset; the run's ``config.json`` records
the values used and the preset they came from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .config import RunConfig
from .errors import unknown

PRESETS = ("utility", "attack")


@dataclass(frozen=True)
class OperatingPoint:
    """Training settings of one defense on one dataset (the RunConfig fields they set)."""

    model: str
    batch_size: int
    rounds: int
    dirichlet_alpha: float
    params: Mapping[str, Any] = field(default_factory=dict)  # defense parameters: lr, clip…
    searched: str = ""  # the search that chose it and its validation accuracy

    def fields(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "batch_size": self.batch_size,
            "rounds": self.rounds,
            "dirichlet_alpha": self.dirichlet_alpha,
            "params": dict(self.params),
        }


_DEFAULT = RunConfig()
ATTACK = OperatingPoint(
    model=_DEFAULT.model,
    batch_size=_DEFAULT.batch_size,
    rounds=_DEFAULT.rounds,
    dirichlet_alpha=_DEFAULT.dirichlet_alpha,
    searched="the attack setting: not searched",
)

# (defense, dataset) -> its operating point; filled from benchmarks/tune.py's output
OPERATING_POINTS: dict[tuple[str, str], OperatingPoint] = {}


def operating_point(preset: str, defense: str, dataset: str) -> OperatingPoint | None:
    """The settings ``preset`` gives ``defense`` on ``dataset``; None when ``utility`` has
    no searched point there (the caller says so and falls back to :data:`ATTACK`)."""
    if preset not in PRESETS:
        raise unknown("preset", preset, PRESETS)
    if preset == "attack":
        return ATTACK
    return OPERATING_POINTS.get((defense, dataset))


def apply(cfg: RunConfig, preset: str, explicit: Mapping[str, Any]) -> tuple[RunConfig, str]:
    """``cfg`` with the preset's settings for its defense and dataset, then the ``explicit``
    ones (flags the user gave: RunConfig fields, and ``params`` merged key by key on top of
    the preset's). Returns the config and one line naming where the settings came from."""
    point = operating_point(preset, cfg.defense, cfg.dataset)
    note = f"{preset} preset"
    if point is None:
        point = ATTACK
        note = (
            f"no operating point for {cfg.defense} on {cfg.dataset} yet; using the attack "
            "preset's settings (pass --model/--batch-size/--lr to choose)"
        )
    values = point.fields()
    params = {**values.pop("params"), **explicit.get("params", {})}
    values.update({k: v for k, v in explicit.items() if k != "params"})
    used = {**values, "params": params}
    out = dataclasses.replace(cfg, **used, preset=preset).validate()
    shown = ", ".join(f"{k}={v}" for k, v in {**values, **params}.items())
    return out, f"{note}: {shown}"
