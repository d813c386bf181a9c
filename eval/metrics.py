"""Reconstruction quality: MSE, PSNR, SSIM, LPIPS, label accuracy, matching.

Images are in [0, 1], as torch tensors or numpy arrays shaped ``(C, H, W)`` or
``(B, C, H, W)`` (a bare ``(H, W)`` is read as grayscale). Reconstructions are
clamped to [0, 1]; ground truth outside [0, 1] is an error (normalised inputs
passed by mistake). Non-finite reconstruction pixels (a diverged attack) are
kept: the metrics come out NaN rather than a made-up number.

PSNR of identical images is ``math.inf``; :func:`privaudit.core.files.to_jsonable` writes
it as the string ``"inf"`` so JSON stays strict.
"""

from __future__ import annotations

import importlib.util
import math
import os
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from skimage.metrics import mean_squared_error as _sk_mse
from skimage.metrics import peak_signal_noise_ratio as _sk_psnr
from skimage.metrics import structural_similarity as _sk_ssim

__all__ = [
    "ALEXNET_WEIGHTS",
    "aggregate",
    "alexnet_weights_path",
    "label_accuracy",
    "label_set_accuracy",
    "lpips_distance",
    "lpips_status",
    "match",
    "mse",
    "psnr",
    "score",
    "score_many",
    "ssim",
]

Reduction = Literal["mean", "none"]
METRICS = ("mse", "psnr", "ssim", "lpips", "label_acc", "label_acc_set")

ALEXNET_WEIGHTS = "alexnet-owt-7be5be79.pth"
"""torchvision's AlexNet ImageNet checkpoint, the backbone LPIPS (net='alex') needs."""

_LPIPS_MIN_SIDE = 32  # AlexNet's two max-pools need >= 31 px; smaller images are upsampled
_LPIPS_UPSAMPLE_TO = 64


# --------------------------------------------------------------------------- inputs


def _batch(x: Any, name: str) -> np.ndarray:
    """``x`` as a float64 array ``(B, C, H, W)``."""
    if isinstance(x, torch.Tensor):
        a = x.detach().to("cpu", torch.float64).numpy()
    else:
        a = np.asarray(x, dtype=np.float64)
    if a.ndim == 2:
        a = a[None, None]
    elif a.ndim == 3:
        a = a[None]
    elif a.ndim != 4:
        raise ValueError(f"{name}: expected (C,H,W) or (B,C,H,W) images, got shape {a.shape}")
    return a


def _pair(true: Any, recon: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validated ``(true, clamped recon)`` batches of equal shape."""
    t, r = _batch(true, "true"), _batch(recon, "recon")
    if t.shape != r.shape:
        raise ValueError(f"true {t.shape} and recon {r.shape} images differ in shape")
    lo, hi = np.nanmin(t), np.nanmax(t)
    if not np.isfinite(t).all() or lo < -1e-6 or hi > 1 + 1e-6:
        raise ValueError(
            f"true images must be finite and in [0, 1] (got min {lo:.3g}, max {hi:.3g}); "
            "pass pixel-space images, not normalised model inputs"
        )
    return np.clip(t, 0.0, 1.0), np.clip(r, 0.0, 1.0)  # np.clip keeps NaN


def _reduce(values: list[float], reduction: Reduction) -> float | list[float]:
    if reduction == "none":
        return values
    if reduction == "mean":
        return float(np.mean(values))
    raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")


# --------------------------------------------------------------------------- pixel metrics


def mse(true: Any, recon: Any, reduction: Reduction = "mean") -> float | list[float]:
    """Mean squared error per image (``skimage.metrics.mean_squared_error``)."""
    t, r = _pair(true, recon)
    return _reduce([float(_sk_mse(a, b)) for a, b in zip(t, r, strict=True)], reduction)


def _psnr_one(a: np.ndarray, b: np.ndarray) -> float:
    if np.array_equal(a, b):
        return math.inf
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(_sk_psnr(a, b, data_range=1.0))


def psnr(true: Any, recon: Any, reduction: Reduction = "mean") -> float | list[float]:
    """PSNR in dB with data range 1, per image; identical images give ``math.inf``."""
    t, r = _pair(true, recon)
    return _reduce([_psnr_one(a, b) for a, b in zip(t, r, strict=True)], reduction)


def _win_size(h: int, w: int) -> int:
    side = min(h, w)
    if side < 3:
        raise ValueError(f"SSIM needs images at least 3 px on a side, got {h}x{w}")
    return min(7, side if side % 2 else side - 1)


def ssim(true: Any, recon: Any, reduction: Reduction = "mean") -> float | list[float]:
    """SSIM per image (skimage defaults: uniform window, 7 px or the largest odd size that fits)."""
    t, r = _pair(true, recon)
    win = _win_size(t.shape[2], t.shape[3])
    vals = [
        float(_sk_ssim(a, b, data_range=1.0, channel_axis=0, win_size=win))
        for a, b in zip(t, r, strict=True)
    ]
    return _reduce(vals, reduction)


# --------------------------------------------------------------------------- LPIPS

_LPIPS_NETS: dict[tuple[str, str], Any] = {}
_LPIPS_FAILURES: dict[tuple[str, int, int], str] = {}


def alexnet_weights_path() -> Path:
    """Where torchvision keeps (and LPIPS looks for) the AlexNet ImageNet weights."""
    return Path(torch.hub.get_dir()) / "checkpoints" / ALEXNET_WEIGHTS


def _fix_hint(path: Path) -> str:
    return (
        "download them once with internet access (python -c 'import torchvision; "
        'torchvision.models.alexnet(weights="DEFAULT")\' saves them there), '
        f"or copy {ALEXNET_WEIGHTS} into {path.parent} (or set TORCH_HOME)"
    )


def _build_lpips(path: Path) -> Any:
    """LPIPS(net='alex') with its backbone loaded from ``path``; never downloads."""
    state = torch.load(path, map_location="cpu", weights_only=True)  # fails fast if corrupt

    import lpips

    with warnings.catch_warnings():  # lpips passes torchvision's deprecated `pretrained=`
        warnings.simplefilter("ignore")
        # pnet_rand=True: build the backbone empty (no download); load it from `path` below.
        net = lpips.LPIPS(pretrained=True, net="alex", pnet_rand=True, verbose=False)
    for k in range(1, net.net.N_slices + 1):
        for idx, module in getattr(net.net, f"slice{k}").named_children():
            names = [n for n, _ in module.named_parameters()]
            if names:
                module.load_state_dict({n: state[f"features.{idx}.{n}"] for n in names})
    return net.eval().requires_grad_(False)


def _lpips_net(device: torch.device) -> tuple[Any, str | None]:
    """Cached network for ``device``, or ``(None, reason)``."""
    if importlib.util.find_spec("lpips") is None:  # checked without the slow import
        return None, "LPIPS unavailable: the lpips package is not installed; pip install lpips."
    path = alexnet_weights_path()
    key = (str(path), str(device))
    if key in _LPIPS_NETS:
        return _LPIPS_NETS[key], None
    if not path.is_file():
        return None, f"LPIPS unavailable: AlexNet weights not found at {path}; {_fix_hint(path)}."
    st = os.stat(path)
    fkey = (str(path), st.st_mtime_ns, st.st_size)
    if fkey in _LPIPS_FAILURES:
        return None, _LPIPS_FAILURES[fkey]
    try:
        net = _build_lpips(path).to(device)
    except Exception as e:  # corrupt or wrong file: say so, never fall back to random weights
        msg = (
            f"LPIPS unavailable: could not load AlexNet weights from {path} "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            f"{_fix_hint(path)}."
        )
        _LPIPS_FAILURES[fkey] = msg
        return None, msg
    _LPIPS_NETS[key] = net
    return net, None


def lpips_status() -> str | None:
    """None if LPIPS can be computed here, else one sentence: why not and how to fix it."""
    return _lpips_net(torch.device("cpu"))[1]


def lpips_distance(
    true: Any, recon: Any, reduction: Reduction = "mean", device: str | torch.device | None = None
) -> float | list[float] | None:
    """LPIPS (AlexNet, v0.1) per image, or None when unavailable (see :func:`lpips_status`).

    Grayscale is repeated to 3 channels and [0, 1] mapped to [-1, 1]. AlexNet needs
    at least 31 px, so images whose short side is below 32 px are upsampled
    bilinearly to a 64 px short side first (e.g. MNIST 28 -> 64).
    """
    t, r = _pair(true, recon)
    if device is None:
        device = true.device if isinstance(true, torch.Tensor) else "cpu"
    dev = torch.device(device)
    net, _ = _lpips_net(dev)
    if net is None:
        return None

    def prep(a: np.ndarray) -> torch.Tensor:
        x = torch.as_tensor(a, dtype=torch.float32, device=dev)
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        elif x.shape[1] != 3:
            raise ValueError(f"LPIPS needs 1 or 3 channels, got {x.shape[1]}")
        h, w = x.shape[2:]
        if min(h, w) < _LPIPS_MIN_SIDE:
            s = _LPIPS_UPSAMPLE_TO / min(h, w)
            size = (round(h * s), round(w * s))
            x = torch.nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=False)
        return x * 2 - 1

    with torch.no_grad():
        d = net(prep(t), prep(r)).flatten().double().cpu().tolist()
    return _reduce([float(v) for v in d], reduction)


# --------------------------------------------------------------------------- labels, matching


def _labels(y: Any) -> np.ndarray:
    if isinstance(y, torch.Tensor):
        y = y.detach().cpu().numpy()
    return np.asarray(y).reshape(-1).astype(np.int64)


def label_accuracy(true_labels: Any, recon_labels: Any) -> float:
    """Fraction of pairs (already matched, same order) whose labels agree."""
    t, r = _labels(true_labels), _labels(recon_labels)
    if t.shape != r.shape:
        raise ValueError(f"{t.size} true labels but {r.size} reconstructed labels")
    if t.size == 0:
        raise ValueError("no labels to compare")
    return float((t == r).mean())


def label_set_accuracy(true_labels: Any, recon_labels: Any) -> float:
    """Order-free label recovery: size of the multiset intersection over B."""
    t, r = _labels(true_labels), _labels(recon_labels)
    if t.size != r.size or t.size == 0:
        raise ValueError(f"{t.size} true labels but {r.size} reconstructed labels")
    classes = np.union1d(t, r)
    hits = sum(min((t == c).sum(), (r == c).sum()) for c in classes)
    return float(hits / t.size)


def _cost(t: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Pairwise MSE, ``cost[i, j] = mse(true[i], recon[j])``; non-finite -> huge."""
    tf, rf = t.reshape(len(t), -1), r.reshape(len(r), -1)
    cost = np.stack([((rf - row) ** 2).mean(axis=1) for row in tf])
    return np.where(np.isfinite(cost), cost, 1e12)


def match(true: Any, recon: Any) -> list[int]:
    """Permutation ``perm`` such that ``recon[perm][i]`` is the reconstruction of ``true[i]``.

    Optimal one-to-one assignment (``scipy.optimize.linear_sum_assignment``) on the
    pairwise MSE cost; attacks return their images in arbitrary order.
    """
    t, r = _pair(true, recon)
    if len(t) == 1:
        return [0]
    rows, cols = linear_sum_assignment(_cost(t, r))
    return [int(c) for _, c in sorted(zip(rows, cols, strict=True))]


# --------------------------------------------------------------------------- scoring


def _mean(v: list[float] | None) -> float | None:
    return None if v is None else float(np.mean(v))


def score(
    true_images: Any,
    true_labels: Any,
    recon_images: Any,
    recon_labels: Any,
    lpips: bool = True,
) -> dict[str, Any]:
    """Match reconstructions to the truth, then score them.

    Returns batch means ``mse, psnr, ssim, lpips`` (None if not requested or
    unavailable; ``lpips_note`` says why), ``label_acc`` (pairs after matching) and
    ``label_acc_set`` (order-free; both None without labels), ``perm`` (from
    :func:`match`; ``recon[perm]`` is in true order) and ``per_image`` lists in true order.
    An empty batch (no true and no reconstructed image: an empty Poisson batch) scores None
    everywhere, with ``empty`` True, and :func:`aggregate` leaves it out.
    """
    if len(_batch(true_images, "true")) == 0 and len(_batch(recon_images, "recon")) == 0:
        per = {k: [] for k in ("mse", "psnr", "ssim", "lpips", "label_match")}
        empty = {"lpips_note": None, "perm": [], "per_image": per, "empty": True}
        return {**dict.fromkeys(METRICS), **empty}
    t, _ = _pair(true_images, recon_images)
    perm = match(true_images, recon_images)
    r = _batch(recon_images, "recon")[perm]
    per: dict[str, Any] = {
        "mse": mse(t, r, "none"),
        "psnr": psnr(t, r, "none"),
        "ssim": ssim(t, r, "none"),
        "lpips": None,
        "label_match": None,
    }
    note = None
    if lpips:
        dev = true_images.device if isinstance(true_images, torch.Tensor) else None
        per["lpips"] = lpips_distance(t, r, "none", device=dev)
        note = lpips_status() if per["lpips"] is None else None
    acc = acc_set = None
    if true_labels is not None and recon_labels is not None:
        tl, rl = _labels(true_labels), _labels(recon_labels)
        if rl.size != len(perm):
            raise ValueError(f"{rl.size} reconstructed labels for {len(perm)} images")
        rl = rl[perm]
        acc, acc_set = label_accuracy(tl, rl), label_set_accuracy(tl, rl)
        per["label_match"] = [bool(a == b) for a, b in zip(tl, rl, strict=True)]
    return {
        "mse": _mean(per["mse"]),
        "psnr": _mean(per["psnr"]),
        "ssim": _mean(per["ssim"]),
        "lpips": _mean(per["lpips"]),
        "lpips_note": note,
        "label_acc": acc,
        "label_acc_set": acc_set,
        "perm": perm,
        "per_image": per,
    }


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"mean": None, "std": None, "median": None, "n": 0}
    v = np.asarray(values, dtype=np.float64)
    finite = bool(np.isfinite(v).all())
    with np.errstate(invalid="ignore"):
        return {
            "mean": float(v.mean()),
            # a spread needs two values: one victim scored has none (not "± 0")
            "std": (float(v.std()) if finite else math.nan) if v.size > 1 else None,
            "median": float(np.median(v)),
            "n": int(v.size),
        }


def aggregate(scores: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean, population std, median and count per metric over :func:`score` results.

    None values (e.g. LPIPS unavailable) are left out of a metric's count; std is
    NaN when a value is non-finite (e.g. an infinite PSNR), the median still holds, and
    None from fewer than two values.
    """
    out: dict[str, Any] = {
        m: _stats([s[m] for s in scores if s.get(m) is not None]) for m in METRICS
    }
    out["n_observations"] = len(scores)
    out["lpips_note"] = next((s["lpips_note"] for s in scores if s.get("lpips_note")), None)
    return out


def score_many(pairs: Iterable[tuple[Any, Any]], lpips: bool = True) -> dict[str, Any]:
    """Score several observations and :func:`aggregate` them.

    Each pair is ``(truth, recon)``: ``truth = (images, labels)`` and ``recon`` either a
    :class:`privaudit.core.observation.Reconstruction` or ``(images, labels)``. The result
    also holds the individual scores under ``"scores"``.
    """
    scores = []
    for truth, recon in pairs:
        ti, tl = truth
        ri, rl = (recon.images, recon.labels) if hasattr(recon, "images") else recon
        scores.append(score(ti, tl, ri, rl, lpips=lpips))
    out = aggregate(scores)
    out["scores"] = scores
    return out
