"""Improved DLG (Zhao et al. 2020, "iDLG: Improved Deep Leakage from Gradients", §3).

DLG with the labels fixed instead of optimised: ``obs.labels`` when the threat model reveals
them, else extracted from the last layer's gradient (:mod:`.labels`; iDLG's sign rule for
B = 1, LLG's greedy fill for B > 1). Only the images are optimised, by L2 gradient
matching with L-BFGS, exactly as in :mod:`.dlg` (including its note on batched L-BFGS).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from privaudit.core.observation import Observation, Reconstruction

from .dlg import lbfgs_attack


def idlg(
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
) -> list[Reconstruction]:
    """iDLG: DLG's L-BFGS L2 matching with labels fixed (given or inferred)."""
    return lbfgs_attack(
        observations,
        name="idlg",
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
    )
