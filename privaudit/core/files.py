"""Files every layer writes: atomic, durable writes and strict JSON.

A write goes to a temporary file in the target's folder, is fsynced, then replaces the
target with ``os.replace`` and the folder is fsynced: a reader sees the old file or the new
one, never half of one, and a crash leaves at most a ``.NAME.*.tmp`` file behind.

JSON is strict (RFC 8259: ``allow_nan=False``, no ``Infinity`` or ``NaN`` literals), in one
convention for every file privaudit writes and every ``--json`` it prints: a non-finite float
travels as the string ``"inf"``, ``"-inf"`` or ``"nan"`` (ε = ∞ of a non-private run is
``"inf"``). :func:`dumps_strict` is the one encoder (every writer goes through it or
:func:`write_json`), :func:`loads_strict` / :func:`from_jsonable` the one decoder (a reader
of privaudit's own files gets ``float("inf")`` back; an older file's ``Infinity`` reads as
well). ``tests/test_strict_json.py`` fails on a ``json.dump`` that bypasses it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    """``obj`` as strict JSON (:func:`dumps_strict`: indented, sorted keys) at ``path``,
    atomically."""
    write_bytes(path, (dumps_strict(obj) + "\n").encode())


def write_columns(path: Path, columns: dict[str, Any]) -> None:
    """A CSV of equal-length ``columns`` (name → sequence), numbers written exactly as
    Python prints them (``repr``: every float read back bit for bit; booleans as 1/0) — what
    a user re-plots, pools across runs or loads with any tool, never a pickle."""
    names = list(columns)
    cols = [_plain(columns[n]) for n in names]
    lines = [",".join(names)] + [",".join(map(repr, row)) for row in zip(*cols, strict=True)]
    write_bytes(path, ("\n".join(lines) + "\n").encode())


def _plain(column: Any) -> list:
    """A column as Python numbers (one dtype: numpy's promotion; booleans as 0/1). Where
    numpy is not loaded (:func:`to_jsonable` says why it is looked up) the column is a plain
    sequence, taken as it is."""
    np = sys.modules.get("numpy")
    if np is None:
        return [int(v) if isinstance(v, bool) else v for v in column]
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(column, torch.Tensor):
        column = column.detach().cpu().numpy()
    a = np.asarray(column)
    return (a.astype(int) if a.dtype == bool else a).tolist()


_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def to_jsonable(obj: Any) -> Any:
    """Plain JSON types, with inf / -inf / NaN written as the strings "inf", "-inf", "nan".

    Tensors and arrays become (nested) lists; the result passes ``json.dumps(allow_nan=False)``.
    torch and numpy are looked up, not imported: an object can only be a tensor or an array
    where they are loaded, and a process that loaded neither (a memory benchmark's parent,
    which must stay small) writes JSON without loading them.
    """
    torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
    if torch is not None and isinstance(obj, torch.Tensor):
        obj = obj.detach().cpu().numpy()
    if np is not None and isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if np is not None and isinstance(obj, np.generic):
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


def dumps_strict(obj: Any, *, indent: int | None = 2, sort_keys: bool = True) -> str:
    """``obj`` as strict JSON text (:func:`to_jsonable`, then ``allow_nan=False``): the one
    encoder of every JSON file privaudit writes and every ``--json`` it prints, so that any
    JSON parser reads them (``Infinity`` is not JSON). ``indent=None``: one line, as
    ``json.dumps`` writes it by default (a cache key's canonical text)."""
    return json.dumps(to_jsonable(obj), indent=indent, sort_keys=sort_keys, allow_nan=False)


def loads_strict(data: str | bytes) -> Any:
    """The decoder of :func:`dumps_strict`: JSON text with "inf", "-inf", "nan" read back as
    floats (:func:`from_jsonable`) — for a document of numbers (a result, a ledger, a cached
    value), not one whose strings are free text."""
    return from_jsonable(json.loads(data))


def digest(obj: Any, length: int = 10) -> str:
    """A short content key: SHA-256 of ``obj`` as canonical JSON (one line, sorted keys:
    :func:`dumps_strict`), its first ``length`` hex digits — the key of every cached cell and
    row."""
    text = dumps_strict(obj, indent=None, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:length]
