"""The canaries the white-box audit searches (:mod:`privaudit.experiments.audit`).

One canary cannot fit every mechanism: a Dirac of norm C is the worst case for a correct
per-example clip (Nasr et al. 2023, "Tight Auditing of Differentially Private Machine
Learning"), but past a step that forgets its clip it moves the release no further than a
clipped one would. So the audit tries candidates of several norms (C, 10C, 100C) and shapes
— a Dirac coordinate, against the victim's clean batch gradient, a mislabeled training
example whose gradient the defense computes and clips as any other — in the priority order
of :func:`candidates`; :func:`make_canaries` builds their tensors.

Outside the search, the ``real`` canary is a training example with its own label: the
input-space audit (membership of a real example, as a membership-inference attack would
test it), whose bound says what an adversary learns about data that was never crafted to
be found. It is never stronger than the worst-case canaries, so its bound is the smaller.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from privaudit.core.errors import PrivauditError

DOMINATE = 1e4  # flat-clip canary norm, in units of B·C: the clipped mean is ≈ C·direction
CANARY_NORM = 1.0  # canary norm where nothing is clipped
SHAPES = ("dirac", "opposite", "example", "real")  # canary shapes; "real" only when asked
EXAMPLES = ("example", "real")  # the shapes that are examples (their norm is their own)


@dataclass
class Canary:
    """One candidate of the search: its shape (``kind``: ``dirac``, ``opposite`` — against
    the victim's clean batch gradient — ``example`` or ``real``) and gradient norm (an example's is
    its own gradient's), and once made (:func:`make_canaries`) the gradient it adds (``grad`` (D,))
    or the example whose gradient the defense computes, and clips, like any other's."""

    kind: str
    norm: float | None
    grad: Tensor | None = None
    example: tuple[Tensor, Tensor] | None = None


def check_canary(norm: float | None, kind: str | None) -> None:
    """One error line for a canary norm or shape the search cannot fix."""
    if kind is not None and kind not in SHAPES:
        raise PrivauditError(f"--canary-shape must be one of {', '.join(SHAPES)}, got {kind!r}")
    if norm is not None and not (norm > 0 and math.isfinite(norm)):
        raise PrivauditError(f"--canary-norm must be a finite number > 0, got {norm}")
    if norm is not None and kind in EXAMPLES:
        raise PrivauditError(
            "an example canary's norm is its own gradient's; drop --canary-norm or pick "
            "--canary-shape dirac or opposite"
        )


def candidates(
    privacy: Any, batch_size: int, norm: float | None = None, kind: str | None = None
) -> list[Canary]:
    """The white-box search's canaries in priority order (a trial budget too small for all
    keeps the first ones). Norms N, 100N, 10N with N the clip C (per example or flat), the
    bound G a claim assumes where nothing enforces it (:attr:`Privacy.assumption`: the
    first canary then tests the claim within its own hypothesis), or :data:`CANARY_NORM`
    where nothing clips: past a correct clip every norm ≥ C is the same canary, and where a
    step forgets its clip the larger norm shows it.

    - per-example clip or none: Dirac at N (Nasr et al.'s worst case for a correct clip),
      Dirac at 100N, against the clean gradient at 100N, the example, Dirac at 10N;
    - flat batch clip: against the clean gradient at the dominating norm 10⁴·B·C (the clipped
      mean swings by 2C, the sensitivity), Dirac at 100C, the example, Dirac at 10C and C.

    ``norm`` fixes the norm (no example then: its norm is its own), ``kind`` the shape;
    ``real`` (a training example under its own label) is only ever the one candidate."""
    check_canary(norm, kind)
    if kind == "real":
        return [Canary("real", None)]
    assumed = getattr(privacy, "assumption", None)
    if privacy.clip_unit in ("example", "batch"):
        unit = privacy.clip
    else:
        unit = assumed[1] if assumed else CANARY_NORM
    n1, n100, n10 = (unit, 100 * unit, 10 * unit) if norm is None else (norm, norm, norm)
    if privacy.clip_unit == "batch":
        top = DOMINATE * batch_size * unit if norm is None else norm
        order = [("opposite", top), ("dirac", n100), ("example", None), ("dirac", n10)]
        order.append(("dirac", n1))
    else:
        order = [("dirac", n1), ("dirac", n100), ("opposite", n100), ("example", None)]
        order.append(("dirac", n10))
    keep = {
        (k, v): Canary(k, v)
        for k, v in order
        if (kind is None or k == kind) and not (norm is not None and k in EXAMPLES)
    }
    return list(keep.values())


def make_canaries(cands: list[Canary], ctx: Any, clean: list[Tensor], seed: int) -> list[Canary]:
    """The candidates' tensors: a Dirac on a coordinate drawn from ``seed``; against the
    victim's clean batch gradient (the mean of the probe's ``clean`` rows; left out where the
    victim's batch has no gradient); a training input of ``seed``'s draw under another label
    (mislabeled, so misfit: a large gradient, clipped by the defense as any example's); the
    same input under its own label (``real``)."""
    D = ctx.spec.numel
    rng = np.random.default_rng(seed)
    dirac = torch.zeros(D, dtype=torch.float32)
    dirac[int(rng.integers(D))] = 1.0
    u = torch.stack([c.mean(0) for c in clean]).mean(0).float().cpu() if clean else None
    i = int(rng.integers(len(ctx.train_x)))
    classes = int(ctx.train_y.max()) + 1
    label = (int(ctx.train_y[i]) + 1 + int(rng.integers(max(classes - 1, 1)))) % classes
    example = (ctx.train_x[i : i + 1], torch.tensor([label], device=ctx.train_y.device))
    real = (ctx.train_x[i : i + 1], ctx.train_y[i : i + 1])
    out = []
    for c in cands:
        if c.kind == "dirac":
            out.append(dataclasses.replace(c, grad=c.norm * dirac))
        elif c.kind == "opposite" and u is not None and float(u.norm()) > 0:
            out.append(dataclasses.replace(c, grad=-c.norm * u / u.norm()))
        elif c.kind == "example" and classes > 1:
            out.append(dataclasses.replace(c, example=example))
        elif c.kind == "real":
            out.append(dataclasses.replace(c, example=real))
    if not out:
        raise PrivauditError(
            f"no {cands[0].kind} canary fits here (the victim's batch has no gradient to "
            "point against, or the data has one class); drop --canary-shape"
        )
    return out
