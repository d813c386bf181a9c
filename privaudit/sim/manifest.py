"""A run directory's manifest: what privaudit wrote there, so that what it reads is checked.

``RUN/manifest.json`` maps each file's path (relative to the run) to the SHA-256 and size
of the bytes privaudit wrote, and for a safetensors file its tensors' dtypes and shapes::

    {"format": 1, "files": {"checkpoints/round-000050.safetensors":
        {"sha256": "…", "bytes": 2470152, "tensors": {"state.x": ["F32", [10, 61706]], …}}}}

A run's manifest also records, under ``"run"``, what the run *is* — written once, with its
``config.json``, and kept by every later write: the identity fields of its configuration
(rounds, agents, δ, the accountant, the ε asked, the defense's parameters, …) and what the
accounting resolved from them (σ, each agent's sample rate, the parameters used). A reader
compares ``config.json`` with it whether or not config.json's hash was updated
(:meth:`privaudit.sim.rundir.RunDir.read_config`): an edited config is refused even with a
matching digest.

A file is read only if its bytes hash to the recorded digest: a truncated, edited, replaced
or foreign file is refused with its name, never used. A round's file that the manifest does
not list (written by another program, or by a privaudit killed between the file and the
manifest) does not exist for privaudit: it is re-simulated and overwritten. The manifest
itself is replaced atomically, under the run's I/O lock (:mod:`privaudit.sim.runlock`).
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

from torch import Tensor

from privaudit.core.errors import PrivauditError
from privaudit.core.tensorfile import DTYPES

NAME = "manifest.json"
FORMAT = 1


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def safetensors_header(data: bytes) -> dict[str, Any]:
    """The JSON header of a safetensors file's bytes (tensor dtypes, shapes, metadata)."""
    if len(data) < 8:
        raise ValueError("shorter than a safetensors header")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError("header longer than the file")
    return json.loads(data[8 : 8 + n])


def entry(data: bytes) -> dict[str, Any]:
    """The manifest entry of a file of bytes ``data``: digest and size."""
    return {"sha256": digest(data), "bytes": len(data)}


def tensor_entry(sha256: str, size: int, tensors: dict[str, Tensor]) -> dict[str, Any]:
    """The manifest entry of a safetensors file written from ``tensors``
    (:func:`privaudit.core.tensorfile.write`, which returned its digest and size): digest,
    size and the tensors' dtypes and shapes."""
    schema = {k: [DTYPES[t.dtype], list(t.shape)] for k, t in sorted(tensors.items())}
    return {"sha256": sha256, "bytes": size, "tensors": schema}


class Manifest:
    """The manifest of the run directory ``root`` (read and written whole; small)."""

    def __init__(self, root: Path):
        self.root = root
        self.path = root / NAME

    def exists(self) -> bool:
        return self.path.exists()

    def _doc(self) -> dict[str, Any]:
        """The manifest as read (empty if there is none yet); one error if it is corrupt."""
        if not self.path.exists():
            return {}
        try:
            doc = json.loads(self.path.read_bytes())
            if doc.get("format") != FORMAT or not isinstance(doc.get("files"), dict):
                raise ValueError
            if not isinstance(doc.get("run", {}), dict):
                raise ValueError
            return doc
        except (ValueError, AttributeError, UnicodeDecodeError):
            raise PrivauditError(
                f"{self.path} is corrupt; the run's files cannot be checked: delete the run "
                "directory and train again"
            ) from None

    def files(self) -> dict[str, dict[str, Any]]:
        """Every recorded file (empty if there is no manifest yet)."""
        return self._doc().get("files", {})

    def run(self) -> dict[str, Any] | None:
        """What the run was created as (module docstring), or None: a manifest written
        before runs recorded it, or a distributed rank's shard."""
        return self._doc().get("run")

    def text(self, files: dict[str, dict[str, Any]], run: dict[str, Any] | None = None) -> bytes:
        """The manifest's bytes: valid JSON, one line per file, and the run's record —
        ``run`` when given (a run being created), else the one already recorded, kept."""
        run = self.run() if run is None else run
        rows = ",\n".join(
            f"  {json.dumps(rel, allow_nan=False)}: "
            f"{json.dumps(rec, sort_keys=True, allow_nan=False)}"
            for rel, rec in sorted(files.items())
        )
        head = f'{{"format": {FORMAT}, '
        if run is not None:
            head += f'"run": {json.dumps(run, sort_keys=True, allow_nan=False)},\n'
        return f'{head}"files": {{\n{rows}\n}}}}\n'.encode()

    def mismatch(self, rel: str, data: bytes) -> str | None:
        """Why ``data`` are not the bytes recorded for ``rel`` (None: they are)."""
        rec = self.files().get(rel)
        if rec is None:
            return f"is not in the run's {NAME}"
        if rec.get("bytes") != len(data):
            return f"has {len(data)} bytes where {NAME} recorded {rec.get('bytes')}"
        if rec.get("sha256") != digest(data):
            return f"does not match its SHA-256 in {NAME} (edited or replaced)"
        return None
