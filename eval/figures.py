"""Figures as PNG files, written atomically. matplotlib is imported lazily (Agg, no pyplot)."""

from __future__ import annotations

import math
import os
import tempfile
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["reconstruction_grid", "save_figure"]

_CELL_IN = 1.05  # inches per image cell


def _images(x: Any, name: str) -> np.ndarray:
    """``x`` as a float array ``(B, C, H, W)`` clipped to [0, 1] (NaN kept: shown blank)."""
    if isinstance(x, torch.Tensor):
        a = x.detach().to("cpu", torch.float32).numpy()
    else:
        a = np.asarray(x, dtype=np.float32)
    if a.ndim == 2:
        a = a[None, None]
    elif a.ndim == 3:
        a = a[None]
    if a.ndim != 4 or a.shape[1] not in (1, 3):
        raise ValueError(f"{name}: expected (B,C,H,W) images with 1 or 3 channels, got {a.shape}")
    return np.clip(a, 0.0, 1.0)


def show_image(ax: Any, img: np.ndarray) -> None:
    """One (C, H, W) image in [0, 1] on ``ax``, without ticks or frame."""
    if img.shape[0] == 1:
        ax.imshow(img[0], cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    else:
        ax.imshow(np.transpose(img, (1, 2, 0)), interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)


def _fmt(v: Any, digits: int) -> str:
    if v is None:
        return "n/a"
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    return f"{v:.{digits}f}"


def _caption(metrics: Mapping[str, Any] | None, i: int) -> str:
    if not metrics:
        return ""
    lines = []
    for key, label, digits in (("psnr", "PSNR", 1), ("ssim", "SSIM", 2), ("lpips", "LPIPS", 2)):
        values = metrics.get(key)
        if values is not None:
            lines.append(f"{label} {_fmt(values[i], digits)}")
    return "\n".join(lines)


def save_figure(fig: Any, path: str | os.PathLike[str], dpi: int = 150) -> Path:
    """Write ``fig`` to ``path`` atomically (temp file in the same dir, then rename), as PNG
    or in the format ``path``'s suffix names (``.pdf``, ``.svg``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format=path.suffix.lstrip(".").lower() or "png", dpi=dpi)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual file mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def reconstruction_grid(
    true_images: Any,
    recon_images: Any | Sequence[Any],
    metrics_per_image: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None,
    title: str,
    path: str | os.PathLike[str],
    row_labels: Sequence[str] | None = None,
) -> Path:
    """Ground truth on top, one row per reconstruction batch below; returns ``path``.

    true_images:        ``(B, C, H, W)`` in [0, 1], grayscale or RGB.
    recon_images:       one batch of the same shape, already in matched order (index
                        with ``score(...)["perm"]``), or a list of such batches (rows,
                        e.g. one per target or defense).
    metrics_per_image:  per row, a mapping with per-image lists ``psnr``, ``ssim`` and
                        optionally ``lpips`` (None entries skipped), e.g.
                        ``score(...)["per_image"]``; a list for several rows; None for none.
    title:              figure title (target / round / ε ...).
    row_labels:         one label per reconstruction row (default "reconstruction").
    """
    from matplotlib.figure import Figure

    truth = _images(true_images, "true_images")
    if isinstance(recon_images, (list, tuple)):
        rows = [_images(r, f"recon_images[{k}]") for k, r in enumerate(recon_images)]
    else:
        rows = [_images(recon_images, "recon_images")]
    if not rows:
        raise ValueError("recon_images: need at least one row of reconstructions")
    n = len(truth)
    for k, r in enumerate(rows):
        if len(r) != n:
            raise ValueError(f"row {k} has {len(r)} reconstructions for {n} true images")
    if metrics_per_image is None:
        metrics: list[Mapping[str, Any] | None] = [None] * len(rows)
    elif isinstance(metrics_per_image, Mapping):
        if len(rows) != 1:
            raise ValueError("several rows: pass metrics_per_image as a list, one per row")
        metrics = [metrics_per_image]
    else:
        metrics = list(metrics_per_image)
    if len(metrics) != len(rows):
        raise ValueError(f"{len(metrics)} metric sets for {len(rows)} rows of reconstructions")
    for k, m in enumerate(metrics):
        for key in ("psnr", "ssim", "lpips"):
            if m and m.get(key) is not None and len(m[key]) != n:
                raise ValueError(f"row {k}: {len(m[key])} {key} values for {n} images")
    if row_labels is None:
        row_labels = (
            ["reconstruction"] if len(rows) == 1 else [f"row {k}" for k in range(len(rows))]
        )
    if len(row_labels) != len(rows):
        raise ValueError(f"{len(row_labels)} row labels for {len(rows)} rows")

    n_lines = max((_caption(m, 0).count("\n") + 1 if m else 0) for m in metrics)
    text_in = 0.13 * n_lines
    width = max(n * _CELL_IN + 0.6, 3.5)
    heights = [1.0 + text_in / _CELL_IN] * (len(rows) + 1)  # equal rows: equal image sizes
    wrap = max(int(width * 14), 30)
    title_lines = [w for line in title.splitlines() for w in (textwrap.wrap(line, wrap) or [""])]
    height = _CELL_IN * sum(heights) + 0.35 + 0.15 * len(title_lines)
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(len(rows) + 1, n, squeeze=False, gridspec_kw={"height_ratios": heights})
    for i in range(n):
        show_image(axes[0, i], truth[i])
        for k, r in enumerate(rows):
            show_image(axes[k + 1, i], r[i])
            cap = _caption(metrics[k], i)
            if cap:
                axes[k + 1, i].set_xlabel(cap, fontsize=6, linespacing=1.1)
    axes[0, 0].set_ylabel("ground truth", fontsize=7)
    for k, label in enumerate(row_labels):
        axes[k + 1, 0].set_ylabel(label, fontsize=7)
    if title_lines:
        fig.suptitle("\n".join(title_lines), fontsize=9)
    return save_figure(fig, path)
