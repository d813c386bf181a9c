"""Image grids — every reconstruction under its own original — written through the one
figure style (:func:`privaudit.eval.style.save`: 300 dpi PNG and PDF). matplotlib is imported
lazily (Agg, no pyplot).

A grid is a stack of *blocks* (:class:`GridBlock`), one per reconstruction row (a target, a
defense, an attack). Its columns are keyed — by (victim, image of that victim's batch) — and
every block puts each image in its key's column, so that a block with fewer victims (an empty
Poisson batch) leaves a labelled gap instead of shifting its reconstructions off their
originals. A ground-truth row is drawn above a block whenever the block's originals are not
the ones last shown; a block without any image is a labelled empty row.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privaudit.eval.style import num, save, write_figure

__all__ = [
    "EMPTY_BLOCK",
    "GridBlock",
    "grid_figure",
    "reconstruction_grid",
    "save_figure",
    "show_image",
]

save_figure = write_figure  # one file in the format its suffix names (the style's writer)

CELL_IN = 0.8  # inches per image cell
EMPTY_BLOCK = "no image: every victim's batch was empty"


@dataclass(frozen=True)
class GridBlock:
    """One reconstruction row of a grid and the originals it is scored against.

    ``truth`` and ``recon``: ``(n, C, H, W)`` in [0, 1], matched image for image;
    ``columns``: per image, its column key (``(victim, k)``: the k-th image of that victim's
    batch), which places it — and its original — in the same column in every block;
    ``captions``: per image, the text under its reconstruction (scores); ``absent``: the
    text shown in a column of the grid this block has no image for (e.g. ``{(1, 0): "empty
    batch"}``); ``empty``: what an imageless block says across its row."""

    label: str
    truth: np.ndarray
    recon: np.ndarray
    columns: Sequence[Hashable]
    captions: Sequence[str] = ()
    absent: Mapping[Hashable, str] = field(default_factory=dict)
    empty: str = EMPTY_BLOCK


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


def _caption(metrics: Mapping[str, Any] | None, i: int) -> str:
    """PSNR (3 significant digits), SSIM and LPIPS (2) of image ``i``, one per line."""
    if not metrics:
        return ""
    lines = []
    for key, label, digits, unit in (
        ("psnr", "PSNR", 3, " dB"),
        ("ssim", "SSIM", 2, ""),
        ("lpips", "LPIPS", 2, ""),
    ):
        values = metrics.get(key)
        if values is not None:
            lines.append(f"{label} {num(values[i], digits)}{unit if values[i] is not None else ''}")
    return "\n".join(lines)


def _rows(blocks: Sequence[GridBlock]) -> list[tuple[str, Any]]:
    """The grid's rows in order: ``("truth", {key: image})`` where a block's originals are
    not the ones shown last, ``("recon", block)`` and ``("empty", block)``."""
    rows: list[tuple[str, Any]] = []
    shown: dict[Hashable, np.ndarray] = {}
    for b in blocks:
        if len(b.truth) == 0:
            rows.append(("empty", b))
            continue
        mine = dict(zip(b.columns, b.truth, strict=True))
        if any(k not in shown or not np.array_equal(shown[k], v) for k, v in mine.items()):
            shown = mine
            rows.append(("truth", mine))
        rows.append(("recon", b))
    return rows


def _label(ax: Any, text: str) -> None:
    ax.set_ylabel(text, fontsize=6.5, rotation=0, ha="right", va="center", labelpad=4)


def _gap(ax: Any, text: str) -> None:
    """A column a row has no image for: blank, or its reason in small grey text."""
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)
    if text:
        ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=5, color="0.45", wrap=True)


def build_grid(
    blocks: Sequence[GridBlock], title: str, headers: Mapping[Hashable, str] | None = None
) -> Any:
    """The matplotlib Figure of ``blocks`` (see the module): one column per key of any
    block, sorted; ``headers`` names each column above every ground-truth row (victim,
    round, attack). Each axes is labelled (``ax.get_label()``) ``truth <key>``,
    ``recon <block> <key>`` or ``empty <block>``, so the geometry can be checked."""
    from matplotlib.figure import Figure

    if not blocks:
        raise ValueError("a grid needs at least one block")
    keys = sorted({k for b in blocks for k in b.columns})  # e.g. (victim, k): victim order
    rows = _rows(blocks)
    n = max(len(keys), 1)
    lines = max((c.count("\n") + 1 for b in blocks for c in b.captions if c), default=0)
    cell = 1.0 + 0.16 * lines  # every image row alike: equal rows give equal image sizes
    heights = [0.45 if kind == "empty" else cell for kind, _ in rows]
    width = max(1.4 + n * CELL_IN, 3.5)
    wrap = max(int(width * 13), 30)
    title_lines = [w for line in title.splitlines() for w in (textwrap.wrap(line, wrap) or [""])]
    height = CELL_IN * sum(heights) + 0.3 + 0.14 * len(title_lines) + 0.12 * bool(headers)
    fig = Figure(figsize=(width, height), layout="constrained")
    gs = fig.add_gridspec(len(rows), n, height_ratios=heights)
    index = {id(b): i for i, b in enumerate(blocks)}
    for r, (kind, what) in enumerate(rows):
        if kind == "empty":
            ax = fig.add_subplot(gs[r, :], label=f"empty {index[id(what)]}")
            _gap(ax, "")
            ax.text(0.5, 0.5, what.empty, ha="center", va="center", fontsize=6.5, color="0.3")
            _label(ax, what.label)
            continue
        for c, key in enumerate(keys):
            name = "truth" if kind == "truth" else f"recon {index[id(what)]}"
            ax = fig.add_subplot(gs[r, c], label=f"{name} {key!r}")
            images = what if kind == "truth" else dict(zip(what.columns, what.recon, strict=True))
            if key in images:
                show_image(ax, np.clip(images[key], 0.0, 1.0))
                if kind == "recon" and what.captions:
                    cap = what.captions[list(what.columns).index(key)]
                    ax.set_xlabel(cap, fontsize=5.5, linespacing=1.0, labelpad=1.5)
            else:
                _gap(ax, "" if kind == "truth" else what.absent.get(key, ""))
            if kind == "truth" and headers and key in headers:
                ax.set_title(headers[key], fontsize=5.5, pad=2)
            if c == 0:
                _label(ax, "ground truth" if kind == "truth" else what.label)
    if title_lines:
        fig.suptitle("\n".join(title_lines), fontsize=7.5)
    return fig


def grid_figure(
    blocks: Sequence[GridBlock],
    title: str,
    path: str | os.PathLike[str],
    headers: Mapping[Hashable, str] | None = None,
) -> list[Path]:
    """:func:`build_grid`, saved as 300 dpi PNG and PDF (:func:`~privaudit.eval.style.save`)."""
    return save(build_grid(blocks, title, headers), path)


def reconstruction_grid(
    true_images: Any,
    recon_images: Any | Sequence[Any],
    metrics_per_image: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None,
    title: str,
    path: str | os.PathLike[str],
    row_labels: Sequence[str] | None = None,
    column_labels: Sequence[str] | None = None,
) -> Path:
    """Ground truth on top, one row per reconstruction batch below, written as PNG at
    ``path`` and PDF beside it; returns ``path``.

    true_images:        ``(B, C, H, W)`` in [0, 1], grayscale or RGB.
    recon_images:       one batch of the same shape, already in matched order (index
                        with ``score(...)["perm"]``), or a list of such batches (rows,
                        e.g. one per target or defense).
    metrics_per_image:  per row, a mapping with per-image lists ``psnr``, ``ssim`` and
                        optionally ``lpips`` (None entries skipped), e.g.
                        ``score(...)["per_image"]``; a list for several rows; None for none.
    title:              figure title (threat · target · round · ε …:
                        :func:`privaudit.eval.style.title`).
    row_labels:         one label per reconstruction row (default "reconstruction").
    column_labels:      one label per image, shown above its column (victim, link, attack).
    """
    truth = _images(true_images, "true_images")
    if isinstance(recon_images, (list, tuple)):
        rows = [_images(r, f"recon_images[{k}]") for k, r in enumerate(recon_images)]
    else:
        rows = [_images(recon_images, "recon_images")]
    if not rows:
        raise ValueError("recon_images: need at least one row of reconstructions")
    metrics = _metrics(metrics_per_image, rows, len(truth))
    if row_labels is None:
        row_labels = (
            ["reconstruction"] if len(rows) == 1 else [f"row {k}" for k in range(len(rows))]
        )
    if len(row_labels) != len(rows):
        raise ValueError(f"{len(row_labels)} row labels for {len(rows)} rows")
    n = len(truth)
    if column_labels is not None and len(column_labels) != n:
        raise ValueError(f"{len(column_labels)} column labels for {n} images")
    keys = [(i, 0) for i in range(n)]
    headers = dict(zip(keys, column_labels, strict=True)) if column_labels is not None else None
    blocks = [
        GridBlock(label, truth, r, keys, [_caption(m, i) for i in range(n)])
        for label, r, m in zip(row_labels, rows, metrics, strict=True)
    ]
    path = Path(path)
    grid_figure(blocks, title, path, headers)
    return path


def _metrics(
    metrics_per_image: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None,
    rows: list[np.ndarray],
    n: int,
) -> list[Mapping[str, Any] | None]:
    """One metric mapping (or None) per row, each list of one value per image."""
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
    return metrics
