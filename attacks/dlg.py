"""L-BFGS gradient matching, one loop (:func:`lbfgs_attack`) and three presets of it:
``dlg``, ``idlg`` and ``hybrid``.

**dlg** — Deep Leakage from Gradients (Zhu et al. 2019, NeurIPS, Algorithm 1, Eq. 4).

``argmin_{x', y'} ‖∇_θ L(f(x'; θ), softmax(y')) − ∇W‖²``: dummy images ``x'`` and dummy
label logits ``y'`` (soft labels through a softmax, soft cross-entropy) optimised jointly
with L-BFGS (the authors' code: ``lr=1``, 20 inner iterations per step, 300 steps).
Deviation: the default ``line_search_fn="strong_wolfe"``; the authors use none, and a
fixed unit step diverges to NaN from some initialisations (seen on the sigmoid LeNet at
16×16) while strong Wolfe costs about the same and converges; pass ``line_search_fn=None``
for the original. The optimiser is :class:`.lbfgs.LBFGS`, torch's L-BFGS (same iterates up
to rounding) with the search direction from the compact representation instead of the
two-loop recursion: fewer Python-level operations per step, which matter on small images. Dummy
images start uniform in [0, 1] (the authors draw N(0, 1)) and are unconstrained during the
search, as in the paper; they are clamped to [0, 1] on return; label logits start N(0, 1).
Each observation returns the best iterate it reached (lowest matching loss over every point
L-BFGS evaluated), which also guards against DLG's occasional divergence to NaN. Returned
labels are ``argmax y'``.

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
matching with L-BFGS, exactly as in :mod:`.dlg` (including its note on batched L-BFGS).

**hybrid** — L-BFGS gradient matching with the TV prior and the box constraint.

Inverting Gradients' objective (Geiping et al. 2020, Eq. 4) — cosine distance over the
whole gradient plus ``tv`` times the total variation, images in ``[0, 1]`` — minimised by
L-BFGS as in DLG (Zhu et al. 2019, Algorithm 1) instead of by Adam on the signed gradient.
L-BFGS has no projection step, so the box is a change of variables: the images are
``sigmoid(w)`` and L-BFGS runs on the unconstrained ``w`` (every iterate is a valid image,
and a pixel can only approach 0 or 1 asymptotically). Labels are fixed, given or inferred
(:mod:`.labels`), as in iDLG.

``tv=1e-2``: on the photos *train* split it beat IG's 5e-2 for the sigmoid LeNet (README,
"Exact recovery and batches"). On a ReLU network the gradient-matching objective is
piecewise smooth and L-BFGS's curvature model serves it poorly, as for DLG; use ``ig`` or
``fi`` there.

``iterations`` counts L-BFGS steps of up to ``max_iter`` objective evaluations (strong
Wolfe line search by default), so 30 steps cost up to 600 gradient evaluations, about two
IG runs of 300 iterations. Batched L-BFGS is jointly preconditioned (:mod:`.dlg`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from privaudit.core.observation import Observation, Reconstruction

from .common import (
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
    x = init_images(gens, r * prob.slots, stack)
    if box:
        x = torch.logit(x.clamp(BOX_EDGE, 1 - BOX_EDGE))
    x.requires_grad_(True)
    variables = [x]
    match = DISTANCES[distance]

    def pixels(v: Tensor) -> Tensor:
        return torch.sigmoid(v) if box else v

    if fixed_labels:
        labels, sources = zip(*(labels_for(o, label_method) for o in slot_obs), strict=True)
        y_fixed = one_hot(labels, stack, r)
        labels, sources = labels[:: prob.slots], sources[:: prob.slots]
    else:
        shape = (r * prob.slots, stack.batch_size, stack.num_classes)
        y_logits = torch.cat([torch.randn(shape, generator=g) for g in gens])
        y_logits = y_logits.to(stack.device, stack.dtype).requires_grad_(True)
        variables.append(y_logits)
        sources = ("optimized",) * len(obs)

    def soft_labels() -> Tensor:
        return y_fixed if fixed_labels else torch.softmax(y_logits, dim=-1)

    best_loss = torch.full((len(obs) * r,), float("inf"), device=stack.device, dtype=stack.dtype)
    best_x = pixels(x).detach().clone()
    best_y = soft_labels().detach().clone()

    opt = LBFGS(
        variables,
        lr=lr,
        max_iter=max_iter,
        history_size=history_size,
        line_search_fn=line_search_fn,
    )

    def objective(*v: Tensor) -> Tensor:
        y = y_fixed if fixed_labels else torch.softmax(v[1], dim=-1)
        images = pixels(v[0])
        loss = match(prob.gradient(dummy_grad, images, y), prob.target)
        if tv:
            loss = loss + tv * prob.per_problem(total_variation(images))
        return loss

    images = x.shape[0] * x.shape[1]
    step = value_and_grad(
        objective,
        *variables,
        trace=worth_tracing(stack, clip_aware),
        channels_last=onednn_convs(stack, images),
    )
    evaluations = 0

    def closure() -> Tensor:
        nonlocal best_loss, best_x, best_y, evaluations
        grads, losses = step(*variables)
        for v, g in zip(variables, grads, strict=True):
            v.grad = g
        evaluations += 1
        with torch.no_grad():
            better = torch.nan_to_num(losses, nan=float("inf")) < best_loss
            best_loss = torch.where(better, losses, best_loss)
            # per free row, without boolean indexing (no host sync, no gather/scatter)
            free = better.view(len(obs), 1, r).expand(-1, prob.slots, -1).reshape(-1, 1, 1)
            best_x = torch.where(free.view(-1, *[1] * (x.dim() - 1)), pixels(x), best_x)
            best_y = torch.where(free, soft_labels(), best_y)
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

    rows = best_restart(best_loss, r)
    out = []
    for k, o in enumerate(obs):
        row = int(rows[k])
        free = prob.free_row(row)
        dev = next(iter(o.params.values())).device
        lab = labels[k] if fixed_labels else best_y[free].argmax(-1)
        out.append(
            Reconstruction(
                images=best_x[free].clamp(0, 1).to(dev),
                labels=lab.long().to(dev),
                loss=float(best_loss[row]),
                meta={
                    "attack": name,
                    "iterations": iterations,
                    "restarts": r,
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
