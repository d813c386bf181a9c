"""Keep freed memory for reuse: glibc malloc thresholds for large per-round tensors.

glibc serves an allocation above ``M_MMAP_THRESHOLD`` (adaptive, at most 32 MB) with fresh
pages from ``mmap`` and hands them back to the kernel on ``free``, and trims the heap top
above ``M_TRIM_THRESHOLD``. A simulator round allocates tensors of tens of MB (per-example
gradients of every pair) and frees them again, so each round page-faults its working set
in anew, and faulting in fresh pages costs several times the arithmetic done on them.
Raising both thresholds keeps freed blocks in the heap, where the next round reuses them,
and nothing is returned to the kernel between rounds. The cost is memory: freed blocks the
heap cannot reuse for the next sizes asked for stay resident, so the peak can grow beyond the
tensors alive at once (one ResNet-18 DPDL round: about a gigabyte). A round that runs in
chunks under a memory budget therefore hands freed memory back between its chunks
(:func:`privaudit.grads.memory.release`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h>
THRESHOLD = 1 << 30  # 1 GiB: larger blocks still come from mmap

_done = False


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; False where there is no
    glibc (macOS, Windows, musl), which is then left as it is."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    _done = bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, THRESHOLD)
    )
    return _done
