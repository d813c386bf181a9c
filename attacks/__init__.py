"""Gradient inversion and label inference (imported as ``privaudit.attacks``).

Attacks see only :class:`~privaudit.core.observation.Observation` objects — never a defense.
Every attack takes a *list* of Observations sharing one architecture and solves them as one
batched problem (``torch.func.vmap`` over observations; see :mod:`.common`), returning one
:class:`~privaudit.core.observation.Reconstruction` per Observation, in order::

    attack(observations, *, iterations=None, restarts=None, seed=0, device=None,
           progress=False, **options) -> list[Reconstruction]

Observation ``i`` of a call uses seed ``seed + i``. Results are put on the device of each
observation's params; the work runs on ``device`` (default: that same device).
:func:`run_attack` also takes observations of different batch sizes (Poisson batches: the
realised size of each victim's batch), attacking each run of equal sizes as one problem, and
answers an observation of an empty batch with an empty Reconstruction. A plugin's attack that
raises, or answers anything but one such Reconstruction per Observation, is one line naming
the attack, its plugin and what went wrong (:mod:`privaudit.core.extensions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from privaudit.core.errors import unknown
from privaudit.core.extensions import calling, failure
from privaudit.core.observation import Observation, Reconstruction, check_finite

# importing an attack's module registers it (:mod:`.registry`)
from .analytic import analytic
from .auto import auto
from .cpa import cpa
from .dlg import dlg, hybrid, idlg
from .fi import fi
from .ig import ig
from .labels import infer_labels
from .registry import (
    ATTACKS,
    COMMON_OPTIONS,
    RULES,
    Attack,
    Rule,
    check_attack,
    check_options,
    options,
    preset,
    register_attack,
)
from .rgap import rgap
from .spear import spear

DEFAULT_ATTACK = "ig"


def run_attack(
    name: str, observations: Observation | Sequence[Observation], **kw: Any
) -> list[Reconstruction]:
    """Run the attack ``name`` (a key of :data:`ATTACKS`) on ``observations``: consecutive
    observations of one batch size as one batched problem (observation i keeps seed
    ``seed + i``); one with ``batch_size`` 0 (an empty Poisson batch) gets an empty
    Reconstruction (``meta["empty"]``), as there is nothing to reconstruct. A non-finite
    observation is refused first (:func:`~privaudit.core.observation.check_finite`)."""
    if name not in ATTACKS:
        raise unknown("attack", name, ATTACKS)
    kw = check_options(name, kw)
    obs = [observations] if isinstance(observations, Observation) else list(observations)
    check_finite(obs)
    sizes = [int(o.batch_size) for o in obs]
    if not obs or (min(sizes) > 0 and len(set(sizes)) == 1):
        return _called(name, obs, kw)
    seed = kw.pop("seed", 0)
    out: list[Reconstruction] = []
    start = 0
    while start < len(obs):
        end = start + 1
        while end < len(obs) and sizes[end] == sizes[start]:
            end += 1
        group = obs[start:end]
        if sizes[start] == 0:
            out += [_empty(o) for o in group]
        else:
            out += _called(name, group, {**kw, "seed": seed + start})
        start = end
    return out


ANSWER = (
    "return a list of Reconstruction(images (b, *input_shape), labels (b,), loss, meta), "
    "one per Observation, in order (b: its batch_size)"
)


def _called(name: str, obs: list[Observation], kw: dict[str, Any]) -> list[Reconstruction]:
    """The attack ``name`` on ``obs``, its answer checked: one Reconstruction per
    Observation with the Observation's batch of images and labels. A plugin's exception or
    malformed answer is one line naming it; a built-in's is a bug (raised as it is)."""
    fn = ATTACKS[name]
    with calling("attack", name, fn, "attack function"):
        out = fn(obs, **kw)
    problem = _malformed(out, obs)
    if problem:
        raise failure("attack", name, fn, "attack function", problem, ANSWER)
    return list(out)


def _malformed(out: Any, obs: list[Observation]) -> str | None:
    """What is wrong with an attack's answer ``out`` for ``obs``, or None."""
    if not isinstance(out, list | tuple):
        return f"returned a {type(out).__name__}, not a list of Reconstruction"
    if len(out) != len(obs):
        return f"returned {len(out)} reconstruction(s) for {len(obs)} observation(s)"
    for i, (r, o) in enumerate(zip(out, obs, strict=True)):
        b, shape = int(o.batch_size), tuple(o.input_shape)
        if not isinstance(r, Reconstruction):
            return f"returned a {type(r).__name__} for observation {i}, not a Reconstruction"
        images, labels = r.images, r.labels
        if not isinstance(images, torch.Tensor) or tuple(images.shape) != (b, *shape):
            got = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            return f"returned images of shape {got} for observation {i}, not {(b, *shape)}"
        if not isinstance(labels, torch.Tensor) or tuple(labels.shape) != (b,):
            got = tuple(labels.shape) if isinstance(labels, torch.Tensor) else type(labels).__name__
            return f"returned labels of shape {got} for observation {i}, not {(b,)}"
        if not isinstance(r.meta, dict):
            return (
                f"returned a meta of type {type(r.meta).__name__} for observation {i}, not a dict"
            )
    return None


def _empty(obs: Observation) -> Reconstruction:
    """The answer for an observation of an empty batch: no images, no labels."""
    device = next(iter(obs.params.values())).device
    return Reconstruction(
        images=torch.zeros(0, *obs.input_shape, device=device),
        labels=torch.zeros(0, dtype=torch.long, device=device),
        loss=0.0,
        meta={"empty": "the victim's batch has no example: nothing to reconstruct"},
    )


__all__ = [
    "ATTACKS",
    "COMMON_OPTIONS",
    "DEFAULT_ATTACK",
    "RULES",
    "Attack",
    "Rule",
    "preset",
    "analytic",
    "auto",
    "check_attack",
    "check_options",
    "cpa",
    "dlg",
    "fi",
    "hybrid",
    "idlg",
    "ig",
    "infer_labels",
    "options",
    "register_attack",
    "rgap",
    "run_attack",
    "spear",
]
