"""L-BFGS gradient matching, one loop (:func:`lbfgs_attack`) and three presets of it:
``dlg``, ``idlg`` and ``hybrid``.

**dlg** — Deep Leakage from Gradients (Zhu et al. 2019, NeurIPS, Algorithm 1, Eq. 4).

``argmin_{x', y'} ‖∇_θ L(f(x'; θ), softmax(y')) − ∇W‖²``: dummy images ``x'`` and dummy
label logits ``y'`` (soft labels through a softmax, soft cross-entropy) optimised jointly
with L-BFGS, with the authors' settings as defaults: ``lr=1``, ``max_iter=20`` inner
iterations per step, ``iterations=300`` steps. One deviation: ``line_search_fn`` defaults to
``"strong_wolfe"`` where the authors use none, because a fixed unit step can diverge to NaN
from some initialisations; ``line_search_fn=None`` gives the original. The optimiser is
:class:`.lbfgs.LBFGS`, torch's L-BFGS (same iterates up to rounding) with the search
direction from the compact representation instead of the two-loop recursion (fewer
Python-level operations per step). Dummy images start uniform in [0, 1] (the authors draw
N(0, 1)) and are unconstrained during the search, as in the paper; they are clamped to
[0, 1] on return; label logits start N(0, 1). Each observation returns the best iterate it
reached (lowest matching loss over every point L-BFGS evaluated), which also guards against
DLG's occasional divergence to NaN. Returned labels are ``argmax y'``.

Batching and L-BFGS: the K observations' losses are independent and summed, but
L-BFGS is not elementwise — its curvature pairs, the line search (one step length for
all) and the stopping tests are computed on the concatenation of all observations'
variables. A batched run therefore optimises the same objective with a *jointly*
preconditioned search and does not reproduce separate runs bit for bit (Adam-based IG
does). Pass one observation per call when an exactly per-observation L-BFGS matters.

**idlg** — Improved DLG (Zhao et al. 2020, "iDLG: Improved Deep Leakage from Gradients", §3).

DLG with the labels fixed instead of optimised: ``obs.labels`` when the threat model reveals
them, else extracted from the last layer's gradient (:mod:`.labels`; iDLG's sign rule for
B = 1, LLG's greedy fill for B > 1). Only the images are optimised, by L2 gradient
matching with L-BFGS, exactly as in DLG above (including its note on batched L-BFGS).

**hybrid** — L-BFGS gradient matching with the TV prior and the box constraint.

Inverting Gradients' objective (Geiping et al. 2020, Eq. 4) — cosine distance over the
whole gradient plus ``tv`` times the total variation, images in ``[0, 1]`` — minimised by
L-BFGS as in DLG (Zhu et al. 2019, Algorithm 1) instead of by Adam on the signed gradient.
L-BFGS has no projection step, so the box is a change of variables: the images are
``sigmoid(w)`` and L-BFGS runs on the unconstrained ``w`` (every iterate is a valid image,
and a pixel can only approach 0 or 1 asymptotically). Labels are fixed, given or inferred
(:mod:`.labels`), as in iDLG. The default ``tv=1e-2`` was tuned on the sigmoid LeNet
(``docs/measurements.md``, "History"). On a ReLU network the gradient-matching objective
is piecewise smooth and L-BFGS's curvature model serves it poorly, as for DLG; use ``ig`` or
``fi`` there.

In all three, ``iterations`` counts L-BFGS steps of up to ``max_iter`` objective
evaluations each (the strong Wolfe line search by default), not evaluations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from privaudit.core.observation import Observation, Reconstruction

from .common import (
    Problem,
    Stack,
    as_list,
    best_restart,
    cosine_distance,
    generators,
    gradient_fn,
    init_images,
    l2_distance,
    one_hot,
    problem,
    progress_bar,
    total_variation,
)
from .compiled import conv_backend, onednn_convs, value_and_grad, worth_tracing
from .labels import labels_for
from .lbfgs import LBFGS
from .registry import LABEL_METHOD, NON_NEGATIVE, POSITIVE, Rule, preset

DEFAULT_ITERATIONS = 300
DEFAULT_RESTARTS = 1
DISTANCES = {"l2": l2_distance, "cosine": cosine_distance}
BOX_EDGE = 1e-3  # start pixels are kept this far inside [0, 1] before their logit


def lbfgs_attack(
    observations: Observation | Sequence[Observation],
    *,
    iterations: int | None = None,
    restarts: int | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
    lr: float = 1.0,
    max_iter: int = 20,
    history_size: int = 100,
    line_search_fn: str | None = "strong_wolfe",
    clip_aware: bool = True,
    label_method: str = "auto",
    name: str = "lbfgs",
    fixed_labels: bool = False,
    distance: str = "l2",
    tv: float = 0.0,
    box: bool = False,
) -> list[Reconstruction]:
    """The L-BFGS gradient-matching loop shared by DLG (soft labels optimised), iDLG
    (labels fixed) and the hybrid (labels fixed, ``distance="cosine"``, ``tv`` times the
    total variation added, and with ``box`` the images ``sigmoid(w)`` of free variables
    ``w``: L-BFGS stays unconstrained while every iterate lies in [0, 1])."""
    obs = as_list(observations)
    iterations = DEFAULT_ITERATIONS if iterations is None else int(iterations)
    r = DEFAULT_RESTARTS if restarts is None else max(1, int(restarts))
    prob, slot_obs = problem(obs, r, device)
    stack = prob.stack
    dummy_grad = gradient_fn(stack, clip_aware)
    gens = generators(seed, len(obs))
    x = _start_images(gens, r * prob.slots, stack, box)
    if fixed_labels:
        y_fixed, labels, sources = _fixed_labels(slot_obs, label_method, stack, r, prob.slots)
        unknowns = _Unknowns([x], box, y_fixed)
    else:
        labels, sources = None, ("optimized",) * len(obs)
        unknowns = _Unknowns([x, _start_label_logits(gens, r * prob.slots, stack)], box, None)
    variables = unknowns.variables
    best = _BestIterates(len(obs), r, prob.slots, unknowns.images(x), unknowns.labels(variables))
    opt = LBFGS(
        variables,
        lr=lr,
        max_iter=max_iter,
        history_size=history_size,
        line_search_fn=line_search_fn,
    )
    images = x.shape[0] * x.shape[1]
    step = value_and_grad(
        _objective(prob, dummy_grad, unknowns, distance, tv),
        *variables,
        trace=worth_tracing(stack, clip_aware),
        channels_last=onednn_convs(stack, images),
    )
    evaluations = 0

    def closure() -> Tensor:
        nonlocal evaluations
        grads, losses = step(*variables)
        for v, g in zip(variables, grads, strict=True):
            v.grad = g
        evaluations += 1
        with torch.no_grad():
            best.update(losses, unknowns.images(x), unknowns.labels(variables))
        return losses.sum()

    with (
        progress_bar(progress, iterations, f"{name.upper()} ×{len(obs)}") as advance,
        conv_backend(stack, images),
    ):
        for _ in range(iterations):
            loss = opt.step(closure)
            advance()
            if not torch.isfinite(loss):
                break
    meta = {"attack": name, "iterations": iterations, "restarts": r}
    return _reconstructions(obs, prob, best, labels, sources, meta, seed, evaluations)


class _Unknowns:
    """What L-BFGS optimises and what it stands for. ``variables`` are the dummy images (with
    ``box`` their logits ``w``), then DLG's label logits ``y'`` unless the labels are fixed;
    they decode to images (``sigmoid(w)`` with ``box``) and soft labels (``softmax(y')``, or
    the fixed one-hot labels ``y_fixed``)."""

    def __init__(self, variables: list[Tensor], box: bool, y_fixed: Tensor | None):
        self.variables = variables
        self.box = box
        self.y_fixed = y_fixed

    def images(self, v: Tensor) -> Tensor:
        """The images that the first variable ``v`` stands for."""
        return torch.sigmoid(v) if self.box else v

    def labels(self, v: Sequence[Tensor]) -> Tensor:
        """The soft labels that the variables ``v`` stand for."""
        return self.y_fixed if self.y_fixed is not None else torch.softmax(v[1], dim=-1)


def _start_images(gens: Sequence[torch.Generator], rows: int, stack: Stack, box: bool) -> Tensor:
    """Dummy images uniform in [0, 1] (:func:`.common.init_images`), one batch per free row;
    with ``box`` their logits, taken ``BOX_EDGE`` inside [0, 1] so that they are finite."""
    x = init_images(gens, rows, stack)
    if box:
        x = torch.logit(x.clamp(BOX_EDGE, 1 - BOX_EDGE))
    return x.requires_grad_(True)


def _start_label_logits(gens: Sequence[torch.Generator], rows: int, stack: Stack) -> Tensor:
    """DLG's dummy label logits ``y'``, N(0, 1), one batch per free row, drawn from each
    observation's generator after its images."""
    shape = (rows, stack.batch_size, stack.num_classes)
    y_logits = torch.cat([torch.randn(shape, generator=g) for g in gens])
    return y_logits.to(stack.device, stack.dtype).requires_grad_(True)


def _fixed_labels(
    slot_obs: Sequence[Observation], label_method: str, stack: Stack, restarts: int, slots: int
) -> tuple[Tensor, tuple, tuple]:
    """iDLG's fixed labels, given or inferred (:func:`.labels.labels_for`) for every free
    slot: their one-hot rows, then each observation's labels and where they came from."""
    labels, sources = zip(*(labels_for(o, label_method) for o in slot_obs), strict=True)
    return one_hot(labels, stack, restarts), labels[::slots], sources[::slots]


class _BestIterates:
    """Each problem row's lowest matching loss over every point L-BFGS evaluated (NaN counts
    as +∞, so a diverged point is never kept), with the images and soft labels there."""

    def __init__(
        self, observations: int, restarts: int, slots: int, images: Tensor, labels: Tensor
    ):
        self.observations, self.restarts, self.slots = observations, restarts, slots
        self.loss = torch.full(
            (observations * restarts,), float("inf"), device=images.device, dtype=images.dtype
        )
        self.images = images.detach().clone()
        self.labels = labels.detach().clone()

    def update(self, losses: Tensor, images: Tensor, labels: Tensor) -> None:
        """Keep the rows of ``images`` and ``labels`` whose ``losses`` beat the best so far."""
        better = torch.nan_to_num(losses, nan=float("inf")) < self.loss
        self.loss = torch.where(better, losses, self.loss)
        # per free row, without boolean indexing (no host sync, no gather/scatter)
        rows = better.view(self.observations, 1, self.restarts).expand(-1, self.slots, -1)
        free = rows.reshape(-1, 1, 1)
        self.images = torch.where(free.view(-1, *[1] * (images.dim() - 1)), images, self.images)
        self.labels = torch.where(free, labels, self.labels)


def _objective(
    prob: Problem, dummy_grad: Callable, unknowns: _Unknowns, distance: str, tv: float
) -> Callable[..., Tensor]:
    """Each problem row's loss at the variables: the ``distance`` between the dummy gradient
    and the observed one, plus ``tv`` times the images' total variation when ``tv`` > 0."""
    match = DISTANCES[distance]

    def objective(*v: Tensor) -> Tensor:
        y = unknowns.labels(v)
        images = unknowns.images(v[0])
        loss = match(prob.gradient(dummy_grad, images, y), prob.target)
        if tv:
            loss = loss + tv * prob.per_problem(total_variation(images))
        return loss

    return objective


def _reconstructions(
    obs: Sequence[Observation],
    prob: Problem,
    best: _BestIterates,
    labels: tuple | None,
    sources: tuple,
    meta: dict,
    seed: int,
    evaluations: int,
) -> list[Reconstruction]:
    """Each observation's best restart as a :class:`Reconstruction` on its parameters'
    device: images clamped to [0, 1], the fixed ``labels`` or else ``argmax y'``."""
    r = best.restarts
    rows = best_restart(best.loss, r)
    out = []
    for k, o in enumerate(obs):
        row = int(rows[k])
        free = prob.free_row(row)
        dev = next(iter(o.params.values())).device
        lab = labels[k] if labels is not None else best.labels[free].argmax(-1)
        out.append(
            Reconstruction(
                images=best.images[free].clamp(0, 1).to(dev),
                labels=lab.long().to(dev),
                loss=float(best.loss[row]),
                meta={
                    **meta,
                    "restart": row - k * r,
                    "seed": int(seed) + k,
                    "labels": sources[k],
                    "evaluations": evaluations,
                    "observation": dict(o.meta),
                },
            )
        )
    return out


LBFGS_RULES = {
    "lr": POSITIVE,
    "max_iter": Rule("an integer in 1..10^4", lambda v: 1 <= v <= 10**4),
    "history_size": Rule("an integer in 1..10^4", lambda v: 1 <= v <= 10**4),
    "line_search_fn": Rule("'strong_wolfe' or null", lambda v: v == "strong_wolfe"),
}

dlg = preset(
    "dlg",
    lbfgs_attack,
    doc="DLG: images and soft labels by L2 gradient matching with L-BFGS (Zhu et al. 2019). "
    "``iterations`` counts L-BFGS steps of up to ``max_iter`` evaluations each.",
    summary="DLG: images and soft labels by L2 gradient matching, L-BFGS (Zhu et al. 2019)",
    fixed={
        "name": "dlg",
        "fixed_labels": False,
        "label_method": "auto",
        "distance": "l2",
        "tv": 0.0,
        "box": False,
    },
    rules=LBFGS_RULES,
)
idlg = preset(
    "idlg",
    lbfgs_attack,
    doc="iDLG: DLG's L-BFGS L2 matching with labels fixed (given or inferred; Zhao et al. 2020).",
    summary="iDLG: DLG with the labels inferred first (Zhao et al. 2020)",
    fixed={"name": "idlg", "fixed_labels": True, "distance": "l2", "tv": 0.0, "box": False},
    rules={**LBFGS_RULES, "label_method": LABEL_METHOD},
)
hybrid = preset(
    "hybrid",
    lbfgs_attack,
    doc="Cosine gradient matching + ``tv`` · TV over images ``sigmoid(w)``, by L-BFGS with "
    "labels fixed (Inverting Gradients' objective, DLG's optimiser).",
    summary="IG's objective (cosine + TV, images in the box) minimised by L-BFGS",
    fixed={"name": "hybrid", "fixed_labels": True, "distance": "cosine", "box": True},
    defaults={"tv": 1e-2},
    rules={**LBFGS_RULES, "label_method": LABEL_METHOD, "tv": NON_NEGATIVE},
)
