"""Writing a safetensors file straight from the tensors, with no copy of them in memory.

``safetensors.torch.save`` builds the whole file as one ``bytes`` object, after a ``bytes``
copy of every tensor: writing a checkpoint of N agents' x and v (ResNet-18: 45 MB a row)
held two to three more copies of the state at once, the largest transient of a round at many
agents. :func:`write` writes the same bytes — the safetensors layout (an 8-byte little-endian
header length, the JSON header padded with spaces to a multiple of 8, then the tensors'
bytes back to back; tensors ordered by dtype, widest first, then by name, as safetensors
orders them) — tensor by tensor from each tensor's own memory, and hashes them on the way.
``tests/test_rundir.py`` checks the bytes equal ``safetensors.torch.save``'s.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from privaudit.core.files import atomic_write

# safetensors' dtype names, in its enum's order (the file orders tensors by it, widest first)
DTYPES: dict[torch.dtype, str] = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int32: "I32",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.int64: "I64",
}
_RANK = {name: r for r, name in enumerate(DTYPES.values())}


def header(tensors: dict[str, Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """The length-prefixed, padded JSON header of ``tensors`` (contiguous, on the CPU) in
    :func:`order`."""
    entries: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name in order(tensors):
        t = tensors[name]
        size = t.numel() * t.element_size()
        entries[name] = {
            "dtype": DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(entries, separators=(",", ":"), allow_nan=False).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def order(tensors: dict[str, Tensor]) -> list[str]:
    """The names in the file's order: dtype widest first (safetensors' enum order, reversed),
    then name."""
    return sorted(tensors, key=lambda n: (-_RANK[DTYPES[tensors[n].dtype]], n))


def write(
    path: Path, tensors: dict[str, Tensor], metadata: dict[str, str] | None = None
) -> tuple[str, int]:
    """Write ``tensors`` to ``path`` as a safetensors file, atomically and durably
    (:func:`~privaudit.core.files.atomic_write`), reading each tensor's memory in place;
    returns the file's SHA-256 (hex) and size."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    bad = sorted({str(t.dtype) for t in tensors.values() if t.dtype not in DTYPES})
    if bad:
        raise ValueError(f"no safetensors dtype for {', '.join(bad)}")
    head = header(tensors, metadata)
    sha, size = hashlib.sha256(head), len(head)

    def put(tmp: str) -> None:
        nonlocal size
        with open(tmp, "wb") as f:
            f.write(head)
            for name in order(tensors):
                t = tensors[name]
                if t.numel() == 0:
                    continue
                view = memoryview(t.reshape(-1).view(torch.uint8).numpy())
                f.write(view)
                sha.update(view)
                size += len(view)

    atomic_write(path, put)
    return sha.hexdigest(), size
