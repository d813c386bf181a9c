"""Files every layer writes: atomic, durable writes and strict JSON.

A write goes to a temporary file in the target's folder, is fsynced, then replaces the
target with ``os.replace`` and the folder is fsynced: a reader sees the old file or the new
one, never half of one, and a crash leaves at most a ``.NAME.*.tmp`` file behind. JSON is
strict (``allow_nan=False``): inf / -inf / NaN travel as the strings "inf", "-inf", "nan".
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

_UMASK = os.umask(0o022)
os.umask(_UMASK)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[str], Any]) -> None:
    """Call ``write(tmp_path)`` and move the result over ``path`` only once it is complete
    and on disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp's 0600, widened as open() would create it
    os.close(fd)
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def write_json(path: Path, obj: Any) -> None:
    write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def write_columns(path: Path, columns: dict[str, Any]) -> None:
    """A CSV of equal-length ``columns`` (name → sequence), numbers written exactly as
    Python prints them (``repr``: every float read back bit for bit; booleans as 1/0) — what
    a user re-plots, pools across runs or loads with any tool, never a pickle."""
    names = list(columns)
    arrays = [np.asarray(columns[n]) for n in names]
    cols = [(a.astype(int) if a.dtype == bool else a).tolist() for a in arrays]
    lines = [",".join(names)] + [",".join(map(repr, row)) for row in zip(*cols, strict=True)]
    write_bytes(path, ("\n".join(lines) + "\n").encode())


_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def to_jsonable(obj: Any) -> Any:
    """Plain JSON types, with inf / -inf / NaN written as the strings "inf", "-inf", "nan".

    Tensors and arrays become (nested) lists; the result passes ``json.dumps(allow_nan=False)``.
    """
    if isinstance(obj, torch.Tensor):
        obj = obj.detach().cpu().numpy()
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot make {type(obj).__name__} JSON-serialisable")


def from_jsonable(obj: Any) -> Any:
    """Inverse of :func:`to_jsonable` for numbers: "inf", "-inf", "nan" back to floats."""
    if isinstance(obj, str):
        return _NONFINITE.get(obj, obj)
    if isinstance(obj, dict):
        return {k: from_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_jsonable(v) for v in obj]
    return obj


def digest(obj: Any, length: int = 10) -> str:
    """A short content key: SHA-256 of ``obj`` as canonical JSON (sorted keys), its first
    ``length`` hex digits — the key of every cached cell and row."""
    text = json.dumps(to_jsonable(obj), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]
