"""Presets: where the training settings a user leaves unset come from.

- ``utility`` — the defense's *operating point* on the dataset at the run's ε: the model,
  expected batch size B, rounds T, partition and step size (and clip) at which it learns.
  A noised defense has one point per searched ε (the privacy level changes the best
  rounds and step size: more noise favours fewer, smaller steps); a run takes the point
  searched at the ε nearest its own on a log scale (with ``--sigma``, the largest). Found by
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
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from privaudit.core.config import RunConfig
from privaudit.core.errors import unknown

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
    epsilon: float | None = None  # the ε it was searched at (None: a defense without noise)

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

# (defense, dataset) -> its operating points, one per searched (model, ε): benchmarks/tune.py's
# output. The first model listed is the dataset's default; another is chosen with --model.
# MNIST (t10k split 8,000/2,000 when only the test files are present), 10 agents on a ring:
# B = 64, near-IID shards (α = 100: with Dirichlet(0.5) the smallest shard holds 289
# examples, so its q = B/n_i — which sets the run's ε — is 2.6× the others' and σ 2×);
# tanh-cnn, and McMahan et al.'s 2NN (mlp) and CNN (fedavg-cnn) for the defenses the batch
# attacks are measured on
_TUNE = "benchmarks/tune.py --dataset mnist --model {model} --batch-size 64 --dirichlet-alpha 100"
_CNN = "fedavg-cnn"


def _mnist(
    defense: str,
    epsilon: float | None,
    rounds: int,
    lr: float,
    grid: str,
    validation: float,
    model: str = "tanh-cnn",
) -> OperatingPoint:
    """A searched MNIST point: ``model``, B = 64, α = 100, and the search that chose it."""
    eps = "inf" if epsilon is None else f"{epsilon:g}"
    return OperatingPoint(
        model=model,
        batch_size=64,
        dirichlet_alpha=100.0,
        rounds=rounds,
        params={"lr": lr},
        epsilon=epsilon,
        searched=f"{_TUNE.format(model=model)} --defense {defense} {grid} --epsilons {eps}: "
        f"validation {validation:.3f}",
    )


OPERATING_POINTS: dict[tuple[str, str], tuple[OperatingPoint, ...]] = {
    ("dsgd", "mnist"): (
        _mnist("dsgd", None, 300, 0.5, "--rounds 300 --grid lr=0.5,1,2", 0.978),
        _mnist("dsgd", None, 300, 0.5, "--rounds 300 --grid lr=0.1,0.5,1", 0.948, "mlp"),
        _mnist("dsgd", None, 300, 0.5, "--rounds 300 --grid lr=0.5,1", 0.975, _CNN),
    ),
    ("dp-dpsgd", "mnist"): (
        _mnist("dp-dpsgd", 1.0, 100, 0.5, "--grid rounds=50,100 --grid lr=0.25,0.5,1", 0.694),
        _mnist("dp-dpsgd", 8.0, 300, 1.0, "--grid rounds=100,300 --grid lr=0.5,1,2", 0.929),
        _mnist("dp-dpsgd", 1.0, 50, 0.5, "--grid lr=0.1,0.5,1 --grid rounds=50,100", 0.714, "mlp"),
        _mnist(
            "dp-dpsgd", 8.0, 300, 0.5, "--grid lr=0.1,0.5,1 --grid rounds=100,300", 0.875, "mlp"
        ),
        _mnist("dp-dpsgd", 1.0, 50, 0.5, "--grid lr=0.5,1 --grid rounds=50,100", 0.662, _CNN),
        _mnist("dp-dpsgd", 8.0, 300, 0.5, "--grid lr=0.5,1 --grid rounds=100,300", 0.905, _CNN),
    ),
    ("dpdl", "mnist"): (
        _mnist("dpdl", 1.0, 100, 0.5, "--grid lr=0.5,1 --grid rounds=100,300", 0.839),
        _mnist("dpdl", 8.0, 300, 1.0, "--grid lr=0.5,1 --grid rounds=100,300", 0.946),
        _mnist("dpdl", 1.0, 50, 0.5, "--grid lr=0.1,0.5,1 --grid rounds=50,100", 0.797, "mlp"),
        _mnist("dpdl", 8.0, 300, 0.5, "--grid lr=0.1,0.5,1 --grid rounds=100,300", 0.902, "mlp"),
        _mnist("dpdl", 1.0, 50, 0.5, "--grid lr=0.5,1 --grid rounds=50,100", 0.809, _CNN),
        _mnist("dpdl", 8.0, 300, 0.5, "--rounds 300 --grid lr=0.5", 0.905, _CNN),
    ),
    ("clipd2p", "mnist"): (
        _mnist("clipd2p", 1.0, 100, 0.5, "--grid lr=0.5,1 --grid rounds=100,300", 0.688),
        _mnist("clipd2p", 8.0, 300, 1.0, "--rounds 300 --grid lr=0.5,1,2", 0.930),
    ),
    ("muffliato", "mnist"): (
        _mnist("muffliato", 1.0, 100, 0.5, "--grid lr=0.5,1 --grid rounds=100,300", 0.953),
        _mnist("muffliato", 8.0, 300, 0.5, "--rounds 300 --grid lr=0.5,1,2", 0.976),
    ),
    ("constd2p", "mnist"): (
        _mnist("constd2p", 1.0, 100, 0.5, "--grid lr=0.5,1 --grid rounds=100,300", 0.734),
        _mnist("constd2p", 8.0, 300, 0.5, "--rounds 300 --grid lr=0.5,1,2", 0.955),
    ),
    ("nd", "mnist"): (_mnist("nd", None, 300, 0.5, "--rounds 300 --grid lr=0.5,1", 0.981),),
    ("dsgt", "mnist"): (_mnist("dsgt", None, 300, 0.1, "--rounds 300 --grid lr=0.1,0.5", 0.949),),
    ("lppa", "mnist"): (_mnist("lppa", None, 300, 0.1, "--rounds 300 --grid lr=0.1,0.5", 0.946),),
    # Laplace noise on every transmitted γ accumulates in the tracking variable
    ("dp-dsgt", "mnist"): (
        _mnist("dp-dsgt", None, 300, 0.01, "--rounds 300 --grid lr=0.01,0.03,0.1,0.5", 0.316),
    ),
    ("adad2p", "mnist"): (
        _mnist("adad2p", None, 300, 0.5, "--rounds 300 --grid lr=0.5,1,2", 0.976),
    ),
    # the flat batch clip: noise σC on a batch mean of norm ≤ C, B times the per-example
    # clip's relative noise; no searched point learns at ε = 8 (the README says why)
    ("pdsl", "mnist"): (_mnist("pdsl", 8.0, 100, 0.5, "--rounds 100 --grid lr=0.1,0.5", 0.159),),
    ("dp-cga", "mnist"): (
        _mnist("dp-cga", 8.0, 100, 0.1, "--rounds 100 --grid lr=0.1,0.5", 0.119),
    ),
}


def operating_point(
    preset: str,
    defense: str,
    dataset: str,
    epsilon: float | None = None,
    model: str | None = None,
) -> OperatingPoint | None:
    """The settings ``preset`` gives ``defense`` on ``dataset`` at ``epsilon`` (the point
    searched at the nearest ε on a log scale; None: the largest) for ``model`` (None: the
    dataset's default, the first model listed); None when ``utility`` has no searched point
    there (the caller says so and falls back to :data:`ATTACK`)."""
    if preset not in PRESETS:
        raise unknown("preset", preset, PRESETS)
    if preset == "attack":
        return ATTACK
    points = OPERATING_POINTS.get((defense, dataset), ())
    if not points:
        return None
    model = points[0].model if model is None else model
    points = tuple(p for p in points if p.model == model)
    if not points:
        return None

    def distance(p: OperatingPoint) -> float:
        if p.epsilon is None:
            return 0.0
        if epsilon is None:
            return -p.epsilon  # the largest searched ε
        return abs(math.log(p.epsilon / epsilon))

    return min(points, key=distance)


def apply(cfg: RunConfig, preset: str, explicit: Mapping[str, Any]) -> tuple[RunConfig, str]:
    """``cfg`` with the preset's settings for its defense and dataset, then the ``explicit``
    ones (flags the user gave: RunConfig fields, and ``params`` merged key by key on top of
    the preset's). Returns the config and one line naming where the settings came from."""
    epsilon = None if cfg.sigma is not None else cfg.epsilon  # --sigma overrides ε
    model = explicit.get("model")
    point = operating_point(preset, cfg.defense, cfg.dataset, epsilon, model)
    note = f"{preset} preset"
    if point is None:
        point = ATTACK
        where = f"{cfg.dataset} with --model {model}" if model else cfg.dataset
        note = (
            f"no operating point for {cfg.defense} on {where} yet; using the attack "
            "preset's settings (pass --model/--batch-size/--lr to choose)"
        )
    values = point.fields()
    params = {**values.pop("params"), **explicit.get("params", {})}
    values.update({k: v for k, v in explicit.items() if k != "params"})
    used = {**values, "params": params}
    out = dataclasses.replace(cfg, **used, preset=preset).validate()
    shown = ", ".join(f"{k}={v}" for k, v in {**values, **params}.items())
    return out, f"{note}: {shown}"
