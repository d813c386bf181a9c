"""Tables and paper-quality figures of a comparison sweep (rows from :mod:`.sweeps`).

- :func:`summarize`: one row per (target, round, ε) — mean over seeds of each seed's mean
  over victims, and the *spread*: the standard deviation over seeds when there are ≥ 2,
  else over the victims of the one seed (``spread_over`` says which).
- :func:`write_tables`: ``cells.csv`` (every attack), ``summary.csv`` / ``summary.md``
  (every point of the sweep and privacy–utility plots), ``images.csv`` (every number
  printed under a grid image).
- :func:`grid_figure`, :func:`sweep_figure`, :func:`privacy_utility_figure`: matplotlib
  (Agg, no pyplot) in the one figure style (:mod:`.style`: 300 dpi PNG and PDF, Okabe &
  Ito's colour-blind-safe palette with a marker repeating each colour for print, titles
  that name the threat, numbers to 3 significant digits).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privaudit.core.files import atomic_write
from privaudit.core.text import sig

from .figures import EMPTY_BLOCK, GridBlock
from .figures import grid_figure as block_grid
from .style import DPI, MARKERS, OKABE_ITO, save, series_style, style_axes

__all__ = [
    "summarize",
    "write_tables",
    "grid_figure",
    "sweep_figure",
    "privacy_utility_figure",
    "write_report",
]

__all__ += ["DPI", "MARKERS", "OKABE_ITO", "RECOVERED_DB", "save_png_pdf", "style_axes"]
__all__ += ["target_style"]
METRICS = ("psnr", "ssim", "mse")
RECOVERED_DB = 20.0  # an image counts as recovered at or above this PSNR (dB)


def eps_text(v: float | None) -> str:
    """ε for a table: ∞ for None (no accountable noise) and for inf."""
    return sig(v, none="∞")


def _inf(v: float | None) -> float:
    """ε for a table: None (no accountable noise) is ∞."""
    return math.inf if v is None else v


def _num(v: Any, digits: int = 4) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf"
        return f"{v:.{digits}g}"
    return str(v)


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and spread over seeds per (target, round, requested ε), in input order."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["target"], r["round"], r["epsilon_requested"]), []).append(r)
    out = []
    for (target, rnd, eps), rs in groups.items():
        s: dict[str, Any] = {
            "target": target,
            "round": rnd,
            "epsilon_requested": eps,
            "epsilon": _mean([r["epsilon"] for r in rs]),
            "run_epsilon": _mean([r.get("run_epsilon") for r in rs]),
            "sigma": _mean([r["sigma"] for r in rs]),
            "threat": rs[0]["threat"],
            "seeds": len(rs),
            "victims": len(rs[0]["per_observation"]),
            # victims whose batch held an image to reconstruct, over every seed
            "scored": sum(_scored(r) for r in rs),
            "spread_over": "seeds" if len(rs) > 1 else "victims",
            **_recovered(rs),
        }
        for m in METRICS:
            means = [r["metrics"][m] for r in rs]
            s[m] = _mean(means)
            s[f"{m}_spread"] = _std(means) if len(rs) > 1 else rs[0]["spread"][m]
        for m in ("lpips", "label_acc"):
            s[m] = _mean([r["metrics"][m] for r in rs])
        accs = [r["test_acc"] for r in rs]
        s["test_acc"], s["test_acc_spread"] = _mean(accs), _std(accs)
        audits = [r["audit_epsilon_lo"] for r in rs if r.get("audit_epsilon_lo") is not None]
        s["audit_epsilon_lo"] = _mean(audits) if audits else None
        s["audit_epsilon_upper"] = _mean([r.get("audit_epsilon_upper") for r in rs])
        for m in ("mia_auc", "mia_tpr", "label_counts_exact"):
            s[m] = _mean([r.get(m) for r in rs])
        out.append(s)
    return out


def _recovered(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Over every seed's attacked images (a cell's ``per_image`` PSNRs): how many there
    were and how many were recovered at :data:`RECOVERED_DB` dB or more — a count, so that
    a fraction is never printed finer than its sample (one image in ``images``)."""
    psnr = [p for r in rows for p in (r.get("per_image") or {}).get("psnr") or [] if p is not None]
    return {"images": len(psnr), "recovered": sum(p >= RECOVERED_DB for p in psnr)}


def _err(spread: float | None) -> float:
    """An error bar: none (NaN, which matplotlib skips) where there is no spread."""
    return math.nan if spread is None else spread


def _scored(row: dict[str, Any]) -> int:
    """Victims of a cell scored (an empty Poisson batch has nothing to reconstruct)."""
    return sum(o.get("psnr") is not None for o in row["per_observation"])


def _mean(v: Sequence[float | None]) -> float | None:
    v = [x for x in v if x is not None]
    return float(np.mean(v)) if v else None


def _std(v: Sequence[float | None]) -> float | None:
    v = [x for x in v if x is not None]
    return float(np.std(v)) if v else None


# --------------------------------------------------------------------------- tables

CELL_COLUMNS = [
    "target",
    "round",
    "epsilon_requested",
    "epsilon",
    "run_epsilon",
    "sigma",
    "seed",
    "threat",
    "victims",
    "scored",
    "psnr",
    "psnr_std_victims",
    "ssim",
    "ssim_std_victims",
    "mse",
    "lpips",
    "label_acc",
    "test_acc",
    "audit_epsilon_lo",
    "mia_auc",
    "mia_tpr",
    "label_counts_exact",
    "attack",
    "iterations",
    "dir",
]
SUMMARY_COLUMNS = [
    "target",
    "round",
    "epsilon_requested",
    "epsilon",
    "run_epsilon",
    "sigma",
    "threat",
    "seeds",
    "victims",
    "scored",
    "psnr",
    "psnr_spread",
    "ssim",
    "ssim_spread",
    "mse",
    "mse_spread",
    "lpips",
    "label_acc",
    "test_acc",
    "test_acc_spread",
    "audit_epsilon_lo",
    "mia_auc",
    "mia_tpr",
    "label_counts_exact",
    "spread_over",
]


def _cell_row(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "target": r["target"],
        "round": r["round"],
        "epsilon_requested": _inf(r["epsilon_requested"]),
        "epsilon": _inf(r["epsilon"]),
        "run_epsilon": _inf(r.get("run_epsilon")),
        "sigma": r["sigma"],
        "seed": r["seed"],
        "threat": r["threat"],
        "victims": len(r["per_observation"]),
        "scored": _scored(r),
        "psnr": r["metrics"]["psnr"],
        "psnr_std_victims": r["spread"]["psnr"],
        "ssim": r["metrics"]["ssim"],
        "ssim_std_victims": r["spread"]["ssim"],
        "mse": r["metrics"]["mse"],
        "lpips": r["metrics"]["lpips"],
        "label_acc": r["metrics"]["label_acc"],
        "test_acc": r["test_acc"],
        "audit_epsilon_lo": r.get("audit_epsilon_lo"),
        "audit_epsilon_upper": r.get("audit_epsilon_upper"),
        "mia_auc": r.get("mia_auc"),
        "mia_tpr": r.get("mia_tpr"),
        "label_counts_exact": r.get("label_counts_exact"),
        "attack": r["attack"],
        "iterations": r["attack_options"].get("iterations", "default"),
        "dir": r["dir"],
    }


def _csv(rows: list[dict[str, Any]], columns: list[str]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, columns, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: _num(r.get(c), 6) for c in columns})
    return buf.getvalue()


def _write_text(path: Path, text: str) -> Path:
    def write(tmp: str) -> None:
        Path(tmp).write_text(text)

    atomic_write(path, write)
    return path


def _pm(s: dict[str, Any], m: str, digits: int) -> str:
    """Mean ± spread; "—" for a cell without scores (every victim's batch was empty)."""
    spread = s[f"{m}_spread"]
    if s[m] is None:
        return "—"
    return f"{s[m]:.{digits}f}" + ("" if spread is None else f" ± {spread:.{digits}f}")


MEMBERSHIP = (("mia_auc", ".3f"), ("mia_tpr", ".1%"), ("label_counts_exact", ".1%"))


def _fmt(v: float | None, spec: str) -> str:
    return "" if v is None else format(v, spec)


def markdown(summary: Sequence[dict[str, Any]]) -> str:
    """The summary as a Markdown table (mean ± spread)."""
    audit = any(s["audit_epsilon_lo"] is not None for s in summary)
    member = any(s.get("mia_auc") is not None for s in summary)
    head = ["target", "round", "ε asked", "ε message", "ε run", "σ", "threat", "scored"]
    head += ["PSNR dB"]
    head += ["SSIM", "MSE"]
    head += ["label acc", "test acc"] + (
        ["one release: audited ε ≥ / accountant ε ≤"] if audit else []
    )
    head += ["MIA AUC", "MIA TPR @ 1 % FPR", "label counts exact"] if member else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summary:
        cells = [
            f"`{s['target']}`",
            str(s["round"]),
            eps_text(s["epsilon_requested"]),
            eps_text(s["epsilon"]),
            eps_text(s["run_epsilon"]),
            f"{s['sigma']:.3g}",
            s["threat"],
            str(s["scored"]),
            _pm(s, "psnr", 2),
            _pm(s, "ssim", 3),
            _pm(s, "mse", 4),
            "" if s["label_acc"] is None else f"{s['label_acc']:.2f}",
            f"{s['test_acc']:.3f}",
        ]
        if audit:
            lo, up = s["audit_epsilon_lo"], s["audit_epsilon_upper"]
            cells.append("" if lo is None else f"{lo:.3g} / {eps_text(up)}")
        if member:
            cells += [_fmt(s.get(k), p) for k, p in MEMBERSHIP]
        lines.append("| " + " | ".join(cells) + " |")
    n = summary[0]
    note = (
        f"\nMean ± spread (s.d.) over {'seeds' if n['spread_over'] == 'seeds' else 'victims'} "
        f"({n['seeds']} seed(s), {n['victims']} victims attacked per cell; scored: those "
        "whose batch held an image, over every seed; no ± where one value). ε asked: the target σ "
        "was calibrated to, over the run; ε message: the attacked kind's guarantee spent up to "
        "the rounds the cell observes; ε run: that of everything the run puts on the wire, "
        "up to the same rounds; ∞: no formal guarantee (docs/privacy-accounting.md).\n"
    )
    return "\n".join(lines) + "\n" + note


def write_tables(
    rows: Sequence[dict[str, Any]], summary: Sequence[dict[str, Any]], out: Path
) -> list[Path]:
    """``cells.csv``, ``summary.csv``, ``summary.md`` and ``images.csv`` in ``out``."""
    images = []
    for r in rows:
        for i, (p, s) in enumerate(
            zip(r["per_image"]["psnr"], r["per_image"]["ssim"], strict=True)
        ):
            images.append(
                {
                    "target": r["target"],
                    "round": r["round"],
                    "epsilon_requested": _inf(r["epsilon_requested"]),
                    "seed": r["seed"],
                    "image": i,
                    "psnr": p,
                    "ssim": s,
                }
            )
    img_cols = ["target", "round", "epsilon_requested", "seed", "image", "psnr", "ssim"]
    srows = [
        {
            **s,
            "epsilon_requested": _inf(s["epsilon_requested"]),
            "epsilon": _inf(s["epsilon"]),
            "run_epsilon": _inf(s["run_epsilon"]),
        }
        for s in summary
    ]
    return [
        _write_text(out / "cells.csv", _csv([_cell_row(r) for r in rows], CELL_COLUMNS)),
        _write_text(out / "summary.csv", _csv(srows, SUMMARY_COLUMNS)),
        _write_text(out / "summary.md", markdown(summary)),
        _write_text(out / "images.csv", _csv(images, img_cols)),
    ]


# --------------------------------------------------------------------------- figures


def save_png_pdf(fig: Any, path: Path) -> list[Path]:
    """``path`` as 300 dpi PNG and the same figure as PDF beside it (:func:`.style.save`)."""
    return save(fig, path)


def target_style(targets: Sequence[str]) -> dict[str, tuple[str, str]]:
    """A (colour, marker) per target, for figures with one series per target."""
    return series_style(targets)  # type: ignore[return-value]


Block = tuple[str, torch.Tensor, torch.Tensor, list[float], list[float]]


def grid_figure(
    blocks: Sequence[GridBlock | Block],
    title: str,
    path: Path,
    headers: dict[Any, str] | None = None,
) -> list[Path]:
    """One block per target — its originals, its reconstructions under them, PSNR/SSIM
    under each image — aligned per victim (:mod:`.figures`). ``blocks``: :class:`GridBlock`
    (:func:`cell_block` makes one from a sweep's cell), or ``(label, truth, recon, psnr,
    ssim)`` tuples, whose images take columns 0, 1, … in order."""
    made = []
    for b in blocks:
        if isinstance(b, GridBlock):
            made.append(b)
            continue
        label, truth, recon, ps, ss = b
        keys = [(0, i) for i in range(len(truth))]
        made.append(
            GridBlock(label, _np(truth), _np(recon), keys, _captions(ps, ss), empty=EMPTY_BLOCK)
        )
    return block_grid(made, f"{title}\nPSNR (dB) / SSIM under each image", path, headers)


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().to("cpu", torch.float32).numpy()


def _captions(psnr: Sequence[float | None], ssim: Sequence[float | None]) -> list[str]:
    """PSNR to 3 significant digits and SSIM to 2, per image."""
    return [f"{sig(p)} dB\n{sig(s, 2)}" for p, s in zip(psnr, ssim, strict=True)]


def cell_block(row: dict[str, Any], tensors: dict[str, torch.Tensor]) -> tuple[GridBlock, dict]:
    """A sweep cell's grid block and its column headers: each image keyed by (victim, k),
    the k-th of that victim's batch (``links``' senders and ``batch_sizes``, in the order the
    images were stacked); a victim whose batch was empty is an ``empty batch`` gap, and a
    cell with no image at all a labelled empty block."""
    label = (
        f"{row['target']}\nε asked {eps_text(row['epsilon_requested'])} · "
        f"ε {eps_text(row['epsilon'])}\n{row['threat']} · {row['attack']}"
    )
    victims = [src for src, _ in row.get("links") or []]
    sizes = row.get("batch_sizes") or []
    keys = [(v, k) for v, b in zip(victims, sizes, strict=False) for k in range(b)]
    truth = tensors["truth"]
    if len(keys) != len(truth):  # a cell without per-victim sizes: its images in order
        keys = [(0, i) for i in range(len(truth))]
    headers = {(v, k): f"victim {v}" + (f" · {k + 1}" if k else "") for v, k in keys}
    absent = {
        (v, 0): f"victim {v}:\nempty batch" for v, b in zip(victims, sizes, strict=False) if b == 0
    }
    scores = row["per_image"]
    block = GridBlock(
        label,
        _np(truth),
        _np(tensors["recon"]),
        keys,
        _captions(scores["psnr"], scores["ssim"]),
        absent=absent,
    )
    return block, headers


def sweep_figure(
    summary: Sequence[dict[str, Any]], x: str, fixed: dict[str, Any], title: str, path: Path
) -> list[Path]:
    """PSNR and SSIM (mean ± spread) against ``x`` ("round" or "epsilon_requested"), one
    line per target, the other axis held at ``fixed``. Against ε, a target without ε is a
    dashed horizontal line (its value does not depend on ε)."""
    from matplotlib.figure import Figure

    targets = list(dict.fromkeys(s["target"] for s in summary))
    style = target_style(targets)
    fig = Figure(figsize=(6.6, 2.5), layout="constrained")
    axes = fig.subplots(1, 2)
    xs_all = sorted({s[x] for s in summary if s[x] is not None})
    for ax, m, label in zip(axes, ("psnr", "ssim"), ("PSNR (dB)", "SSIM"), strict=True):
        for t in targets:
            pts = [
                s
                for s in summary
                if s["target"] == t
                and s[m] is not None  # None: every victim's batch was empty
                and all(s[k] == v for k, v in fixed.items())
            ]
            if not pts:
                continue
            color, marker = style[t]
            if x == "epsilon_requested" and pts[0]["epsilon_requested"] is None:
                s = pts[0]
                ax.axhline(s[m], color=color, ls="--", lw=1.0, label=f"{t} (ε = ∞)")
                if s[f"{m}_spread"] is not None:  # no spread from one value
                    lo, hi = s[m] - s[f"{m}_spread"], s[m] + s[f"{m}_spread"]
                    ax.axhspan(lo, hi, color=color, alpha=0.12, lw=0)
                continue
            pts = sorted(pts, key=lambda s: s[x])
            xv = [_dodge(s[x], targets.index(t), len(targets), xs_all, x) for s in pts]
            ax.errorbar(
                xv,
                [s[m] for s in pts],
                yerr=[_err(s[f"{m}_spread"]) for s in pts],
                color=color,
                marker=marker,
                ms=3.5,
                lw=1.0,
                capsize=2,
                elinewidth=0.7,
                label=t,
            )
        if x == "epsilon_requested":
            ax.set_xscale("log")
            ax.set_xlabel("ε (target, per agent over the run)", fontsize=7.5)
        else:
            ax.set_xlabel("attacked round", fontsize=7.5)
        if xs_all:
            ax.set_xticks(xs_all, [f"{v:g}" for v in xs_all])
            ax.minorticks_off()
        ax.set_ylabel(label, fontsize=7.5)
        if not ax.has_data():
            ax.text(0.5, 0.5, EMPTY_BLOCK, transform=ax.transAxes, ha="center", fontsize=6.5)
        style_axes(ax)
    spread = summary[0]["spread_over"] if summary else "seeds"
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=6.5, frameon=False)
    fig.suptitle(f"{title}   (mean ± s.d. over {spread})", fontsize=7.5)
    return save_png_pdf(fig, path)


def _dodge(v: float, i: int, n: int, xs: list[float], x: str) -> float:
    """Shift target ``i`` of ``n`` sideways so that error bars at one x do not overlap."""
    step = (i - (n - 1) / 2) * 0.012
    if x == "epsilon_requested":
        span = math.log10(max(xs) / min(xs)) if len(xs) > 1 else 1.0
        return v * 10 ** (step * span)
    span = (max(xs) - min(xs)) if len(xs) > 1 else 1.0
    return v + step * span


def point_key(s: dict[str, Any]) -> tuple[str, float | None]:
    """A summary row's series in a scatter: its target and the ε asked."""
    return s["target"], s["epsilon_requested"]


def point_label(s: dict[str, Any]) -> str:
    """``dpdl-cg · ε asked 8, accounted ∞``: the legend entry of :func:`point_key`."""
    if s["epsilon_requested"] is None:
        return f"{s['target']} · ε ∞"
    asked, accounted = eps_text(s["epsilon_requested"]), eps_text(s["epsilon"])
    return f"{s['target']} · ε asked {asked}, accounted {accounted}"


def threats(summary: Sequence[dict[str, Any]]) -> str:
    """The threats of the rows, for a title: ``link threat`` or ``link/neighbor threat``."""
    kinds = list(dict.fromkeys(s["threat"] for s in summary if s.get("threat")))
    return f"{'/'.join(kinds)} threat" if kinds else ""


def privacy_utility_figure(summary: Sequence[dict[str, Any]], round: int, path: Path) -> list[Path]:
    """Test accuracy against reconstruction PSNR at ``round``, one colour and marker per
    (target, ε asked) — two runs of one target at ε 1 and ε 8 are two series even where
    neither has an accounted ε; with audit results, a second panel sets the white-box
    audit's ε lower bound against the accountant's ε for the same single release (points
    above the diagonal refute the accounting)."""
    from matplotlib.figure import Figure

    pts = [s for s in summary if s["round"] == round]
    audited = [
        s
        for s in pts
        if s["audit_epsilon_lo"] is not None
        and s["audit_epsilon_upper"] is not None
        and math.isfinite(s["audit_epsilon_upper"])
    ]
    style = series_style([point_key(s) for s in pts])
    fig = Figure(figsize=(7.2 if audited else 5.0, 3.0), layout="constrained")
    axes = fig.subplots(1, 2 if audited else 1, squeeze=False)[0]
    ax = axes[0]
    for s in pts:
        color, marker = style[point_key(s)]
        if s["psnr"] is None:  # every victim's batch was empty: nothing was reconstructed
            ax.plot(
                [],
                [],
                marker,
                color=color,
                mec="black",
                mew=0.4,
                label=f"{point_label(s)}: no image",
            )
            continue
        ax.errorbar(
            s["test_acc"],
            s["psnr"],
            xerr=s["test_acc_spread"] or None,
            yerr=s["psnr_spread"],
            fmt=marker,
            color=color,
            mec="black",
            mew=0.4,
            ms=5,
            elinewidth=0.6,
            capsize=1.5,
            label=point_label(s),
        )
    ax.set_xlabel("test accuracy (average model, last round)", fontsize=7.5)
    ax.set_ylabel(f"reconstruction PSNR (dB), round {round}", fontsize=7.5)
    style_axes(ax)
    if audited:
        _audit_panel(axes[1], audited, style)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=6, frameon=False)
    fig.suptitle(
        f"privacy vs utility · {threats(pts)} · round {round}: reconstruction PSNR against "
        "test accuracy" + (", audited against accounted ε" if audited else ""),
        fontsize=7.5,
    )
    return save(fig, path)


def _audit_panel(ax: Any, audited: Sequence[dict[str, Any]], style: dict) -> None:
    """The audited ε lower bound against the accountant's ε of one release, the diagonal
    between (a point above it refutes the accounting)."""
    for s in audited:
        color, marker = style[point_key(s)]
        ax.plot(
            s["audit_epsilon_upper"],
            s["audit_epsilon_lo"],
            marker,
            color=color,
            mec="black",
            mew=0.4,
            ms=5,
        )
    vals = [v for s in audited for v in (s["audit_epsilon_upper"], s["audit_epsilon_lo"])]
    lim = [0.0, max(vals) * 1.15 or 1.0]
    ax.plot(lim, lim, color="0.6", lw=0.8, ls=":")
    ax.set_xlim(lim)
    ax.set_ylim(lim)
    ax.set_aspect("equal")
    ax.set_xlabel("accountant's ε, one release", fontsize=7.5)
    ax.set_ylabel("audited ε lower bound, one release", fontsize=7.5)
    style_axes(ax)


def _slug(v: float | None) -> str:
    return "inf" if v is None else f"{v:g}"


def _grid(
    rows: Sequence[dict[str, Any]], rnd: Any, e: float | None, out: Path, load: Any
) -> list[Path]:
    """The grid of round ``rnd`` (or "last") at target ε ``e`` for the first seed: one block
    per target (a target whose victims all had empty batches is a labelled empty block);
    none when no target has an image."""
    seed0 = rows[0]["seed"] if rows else 0
    blocks, headers, shown = [], {}, []
    for t in dict.fromkeys(r["target"] for r in rows):
        r = next(
            (
                r
                for r in rows
                if r["target"] == t
                and r["round"] == rnd
                and r["seed"] == seed0
                and r["epsilon_requested"] in (e, None)
            ),
            None,
        )
        if r is None:
            continue
        block, heads = cell_block(r, load(Path(r["dir"])))
        blocks.append(block)
        headers.update(heads)
        shown.append(r)
    if not any(len(b.truth) for b in blocks):
        return []
    when = "last round" if rnd == "last" else f"round {rnd}"
    title = f"{threats(shown)} · {when} · target ε = {_slug(e)} · seed {seed0}"
    return grid_figure(blocks, title, out / f"grid-r{rnd}-eps{_slug(e)}", headers)


def write_report(
    rows: Sequence[dict[str, Any]], out: str | Path, load: Any, last_round: bool = False
) -> dict[str, list[Path]]:
    """Every table and figure of a sweep into ``out``; ``load(dir)`` returns a cell's
    tensors (:func:`privaudit.api.sweeps.load_tensors`). Grids are drawn for the first
    seed, one per (round, ε). ``last_round`` (a utility-preset sweep, whose runs end at
    different rounds): one grid per ε of each target's last round, and no round sweep or
    privacy–utility scatter (:mod:`.frontier` draws the frontier instead)."""
    out = Path(out)
    summary = summarize(rows)
    written: dict[str, list[Path]] = {"tables": write_tables(rows, summary, out)}
    if last_round:
        last = {}
        for r in rows:
            last[r["target"]] = max(last.get(r["target"], 0), r["round"])
        rows = [{**r, "round": "last"} for r in rows if r["round"] == last[r["target"]]]
    rounds = sorted({r["round"] for r in rows})
    eps_list = sorted({r["epsilon_requested"] for r in rows if r["epsilon_requested"]})
    grids = []
    for rnd in rounds:
        for e in eps_list or [None]:
            grids += _grid(rows, rnd, e, out, load)
    written["grids"] = grids
    sweeps = []
    if len(rounds) > 1 and not last_round:
        for e in eps_list or [None]:
            sub = [s for s in summary if s["epsilon_requested"] in (e, None)]
            sweeps += sweep_figure(
                sub,
                "round",
                {},
                f"{threats(sub)} · PSNR/SSIM vs round, target ε = {_slug(e)}",
                out / f"sweep-round-eps{_slug(e)}",
            )
    if len(eps_list) > 1 and not last_round:
        for rnd in rounds:
            sweeps += sweep_figure(
                summary,
                "epsilon_requested",
                {"round": rnd},
                f"{threats(summary)} · PSNR/SSIM vs ε, round {rnd}",
                out / f"sweep-eps-r{rnd}",
            )
    written["sweeps"] = sweeps
    if not last_round:
        written["privacy_utility"] = privacy_utility_figure(
            summary, rounds[-1], out / f"privacy-utility-r{rounds[-1]}"
        )
    return written
