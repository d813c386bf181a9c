"""L-BFGS gradient matching with the TV prior and the box constraint.

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

from privaudit.core.observation import Observation, Reconstruction

from .dlg import lbfgs_attack


def hybrid(
    observations: Observation | Sequence[Observation],
    *,
    iterations: int | None = None,
    restarts: int | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
    lr: float = 1.0,
    tv: float = 1e-2,
    max_iter: int = 20,
    history_size: int = 100,
    line_search_fn: str | None = "strong_wolfe",
    clip_aware: bool = True,
    label_method: str = "auto",
) -> list[Reconstruction]:
    """Cosine gradient matching + ``tv`` · TV over images ``sigmoid(w)``, by L-BFGS with
    labels fixed (module docstring)."""
    return lbfgs_attack(
        observations,
        name="hybrid",
        fixed_labels=True,
        iterations=iterations,
        restarts=restarts,
        seed=seed,
        device=device,
        progress=progress,
        lr=lr,
        max_iter=max_iter,
        history_size=history_size,
        line_search_fn=line_search_fn,
        clip_aware=clip_aware,
        label_method=label_method,
        distance="cosine",
        tv=tv,
        box=True,
    )
