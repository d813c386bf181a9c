"""One figure style for every figure privaudit draws, so that a grid, a sweep, a ROC and a
frontier from one study can sit side by side in a paper.

- :func:`save`: the one way a figure is written — a 300 dpi PNG and the same figure as PDF
  beside it (vector, for print), each atomically (temporary file, then rename);
- :func:`series_style`: one colour and one marker per series key — e.g. a (target, ε) pair —
  drawn from Okabe & Ito's colour-blind-safe palette; the marker repeats the distinction
  for print in grey, and no two keys of one figure share both;
- :func:`num`, :func:`eps_text`: numbers as they are printed on a figure (2–3 significant
  digits: ``ε = 3.67``, never ``ε = 3.6708``);
- :func:`title`: a title that names the threat first, then the target, round and ε.

matplotlib is imported by the figures that use this module (Agg, no pyplot): nothing here
loads it.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

from privaudit.core.text import sig

__all__ = [
    "DPI",
    "MARKERS",
    "OKABE_ITO",
    "eps_text",
    "num",
    "save",
    "series_style",
    "style_axes",
    "threat_text",
    "title",
    "write_figure",
]

DPI = 300
OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
FORMATS = (".png", ".pdf")  # what :func:`save` writes for every figure


def num(v: float | None, digits: int = 3) -> str:
    """``v`` to ``digits`` significant digits (2–3 on a figure): 3.6708 → ``3.67``; ∞ for
    inf, ``n/a`` for None, ``nan`` for NaN."""
    if v is None:
        return "n/a"
    v = float(v)
    if math.isnan(v):
        return "nan"
    return sig(v, digits)


def eps_text(eps: float | None, digits: int = 3) -> str:
    """``ε = 3.67``, or ``ε = ∞`` for None (no accountable noise) and inf."""
    return f"ε = {'∞' if eps is None else num(eps, digits)}"


def threat_text(adversaries: Sequence[str]) -> str:
    """The threat a figure shows, from the adversary of every observation: the one
    (``link 0<->1``), or the kind and how many (``link threat, 8 observations``) — a title
    must not name the first of eight links as if it were the only one."""
    seen = list(dict.fromkeys(adversaries))
    if not seen:
        return "no observation"
    if len(seen) == 1:
        return seen[0]
    kinds = list(dict.fromkeys(a.split()[0] for a in seen))
    return f"{'/'.join(kinds)} threat, {len(seen)} observations"


def title(
    threat: str | None = None,
    target: str | None = None,
    round: int | str | None = None,
    epsilon: float | None | str = "",
    extra: Sequence[str] = (),
) -> str:
    """A figure's title: the threat first (who observes), then the target, the round and ε
    (a number, None for ∞, a ready string, or "" for none), then ``extra`` parts; joined
    by `` · ``."""
    parts = [threat, target, None if round is None else f"round {round}"]
    if isinstance(epsilon, str):
        parts.append(epsilon or None)
    else:
        parts.append(eps_text(epsilon))
    return " · ".join(p for p in [*parts, *extra] if p)


def series_style(keys: Sequence[Hashable]) -> dict[Hashable, tuple[str, str]]:
    """A (colour, marker) per key, in order: key ``i`` takes colour ``i mod 8`` and marker
    ``(i + i // 8) mod 8``, so that no two of up to 64 keys share both — two points of one
    target at ε 1 and ε 8 are told apart in colour and in grey print alike."""
    out: dict[Hashable, tuple[str, str]] = {}
    n = len(OKABE_ITO)
    for i, k in enumerate(dict.fromkeys(keys)):
        out[k] = (OKABE_ITO[i % n], MARKERS[(i + i // n) % len(MARKERS)])
    return out


def style_axes(ax: Any) -> None:
    """The axes' look: no top and right spines, thin lines, small ticks."""
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.tick_params(labelsize=7, width=0.6, length=3)
    for side in ("left", "bottom"):
        ax.spines[side].set_linewidth(0.6)


def write_figure(fig: Any, path: str | os.PathLike[str], dpi: int = DPI) -> Path:
    """Write ``fig`` to ``path`` atomically (temp file in the same folder, then rename), in
    the format ``path``'s suffix names (PNG when it has none): a reader never sees half a
    figure, and an interrupted write leaves the old one."""
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


def save(fig: Any, path: str | os.PathLike[str]) -> list[Path]:
    """``fig`` as a 300 dpi PNG at ``path`` (its suffix replaced) and as a PDF beside it;
    returns both paths, the PNG first. Every figure of privaudit is written here. A name
    without a figure suffix keeps its dots (``grid-eps0.5`` → ``grid-eps0.5.png``)."""
    path = Path(path)
    stem = path.with_suffix("") if path.suffix.lower() in FORMATS else path
    return [write_figure(fig, stem.with_name(stem.name + s), dpi=DPI) for s in FORMATS]
