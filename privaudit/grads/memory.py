"""The memory budget of a gradient computation, and running it in chunks that fit.

Per-example clipping of P (model, batch) pairs of W examples materialises, done naively,
P·W gradients of D parameters each: 4·P·W·D bytes, e.g. 48 pairs × 32 examples × ResNet-18's
11.2 M parameters = 69 GB. :mod:`privaudit.grads.pairs` therefore runs every call in chunks
(of pairs, or of one pair's examples for :mod:`privaudit.grads.ghost`) whose estimated
working memory stays within a budget, ``max_memory`` bytes:

- given explicitly (``PairGrads(max_memory=…)``, or the environment variable
  :data:`MAX_MEMORY_ENV`, e.g. ``PRIVAUDIT_MAX_MEMORY=4G``);
- else :data:`FREE_FRACTION` of what is free when the call starts: on CUDA
  ``torch.cuda.mem_get_info`` plus what PyTorch's caching allocator holds unused, on the CPU
  ``MemAvailable`` of ``/proc/meminfo`` (the kernel's estimate of what can be allocated without
  swapping), elsewhere no limit.

An estimate can be wrong (allocator fragmentation, a kernel's workspace): a chunk that still
runs out of memory (``torch.OutOfMemoryError``, ``MemoryError``, the CPU allocator's "can't
allocate memory") is halved and run again (:func:`run_in_chunks`); a chunk of one that does
not fit ends the call with one :class:`~privaudit.core.errors.PrivauditError` naming the fixes.
On Linux the CPU rarely reports an allocation failure (memory is overcommitted and the OOM
killer ends the process instead), which is why the chunks are sized from the estimate first.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from collections.abc import Callable

import torch

from privaudit.core import limits
from privaudit.core.errors import PrivauditError

MAX_MEMORY_ENV = "PRIVAUDIT_MAX_MEMORY"  # bytes, or a size such as 512M, 4G
FREE_FRACTION = 0.5  # of the memory free when a call starts, the default budget
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
FIXES = (
    "raise --max-memory (PRIVAUDIT_MAX_MEMORY), lower --batch-size or --agents, "
    "or choose another --device"
)


def parse_size(text: str | int | float) -> int:
    """Bytes from an int or a size string: ``4096``, ``512M``, ``4G``, ``1.5GB`` (powers of
    1024); a :class:`PrivauditError` for anything else or a size ≤ 0."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        size = float(text)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)I?B?\s*", str(text).upper())
        if match is None:
            raise PrivauditError(
                f"--max-memory must be a size such as 4G or 512M (bytes, or K/M/G/T), got {text!r}"
            )
        size = float(match.group(1)) * UNITS[match.group(2)]
    if not size > 0 or size == float("inf"):
        raise PrivauditError(f"--max-memory must be a positive size, got {text!r}")
    return int(size)


def env_max_memory() -> int | None:
    """The budget set by :data:`MAX_MEMORY_ENV`, or None."""
    text = os.environ.get(MAX_MEMORY_ENV, "").strip()
    return parse_size(text) if text else None


def available_bytes(device: torch.device) -> int | None:
    """Memory that can be allocated on ``device`` now: CUDA's free memory plus what the
    caching allocator holds unused; on the CPU what this process can still allocate
    (:func:`privaudit.core.limits.available_memory`: ``MemAvailable``, or less under a
    cgroup limit or ``RLIMIT_AS``); None when unknown."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free + cached)
    if device.type == "cpu":
        return limits.available_memory()
    return None


def budget(max_memory: int | None, device: torch.device) -> int | None:
    """The working-memory budget of one call in bytes: ``max_memory`` if given, else
    :data:`FREE_FRACTION` of :func:`available_bytes` (None: no limit known)."""
    if max_memory is not None:
        return max_memory
    have = available_bytes(device)
    return None if have is None else int(FREE_FRACTION * have)


def fitting(budget_bytes: int | None, fixed: float, each: float, most: int) -> int:
    """How many items of ``each`` bytes fit beside ``fixed`` bytes in the budget: between 0
    and ``most`` (``most`` without a budget)."""
    if budget_bytes is None or each <= 0:
        return most
    return max(0, min(most, int((budget_bytes - fixed) // each)))


def is_out_of_memory(exc: BaseException) -> bool:
    """An allocation failure: CUDA's (``torch.OutOfMemoryError``), Python's ``MemoryError``,
    or the CPU allocator's ``RuntimeError`` ("can't allocate memory")."""
    if isinstance(exc, MemoryError | torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text
    )


def human(nbytes: float) -> str:
    """``nbytes`` as 3 significant digits of B, KB, MB, GB or TB (powers of 1024)."""
    if abs(nbytes) < 1024:
        return f"{nbytes:.0f} B"
    for unit in ("KB", "MB", "GB"):
        nbytes /= 1024
        if abs(nbytes) < 1024:
            return f"{nbytes:.3g} {unit}"
    nbytes /= 1024
    return f"{nbytes:.3g} TB"


def does_not_fit(what: str, need: float | None, budget_bytes: int | None, device) -> PrivauditError:
    """The one-line error for a chunk of one that does not fit."""
    if need is not None and budget_bytes is not None:
        size = f" (about {human(need)}, budget {human(budget_bytes)} on {device})"
    else:
        size = f" on {device}"
    return PrivauditError(f"{what} does not fit in memory{size}; {FIXES}")


def run_in_chunks(
    total: int,
    chunk: int,
    run: Callable[[int, int], None],
    what: str,
    device: torch.device,
    on_retry: Callable[[int], None] | None = None,
) -> None:
    """``run(start, end)`` over ``[0, total)`` in chunks of ``chunk``; a chunk that runs out
    of memory is halved and run again (``on_retry(new_chunk)`` is told), one of a single item
    raises :func:`does_not_fit` for ``what`` (e.g. "one example of pair 3"). ``run`` must be
    safe to repeat for a range whose first try failed."""
    if total <= 0:
        return
    if chunk < 1:
        raise does_not_fit(what, None, None, device)
    start = 0
    while start < total:
        end = min(start + chunk, total)
        try:
            run(start, end)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            if device.type == "cuda":
                torch.cuda.empty_cache()
            if end - start == 1:
                raise does_not_fit(what, None, None, device) from exc
            chunk = (end - start) // 2
            if on_retry is not None:
                on_retry(chunk)
            continue
        start = end


def saved_bytes(forward: Callable[[], object], exclude: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``forward()`` runs,
    leaving out those of ``exclude`` (the parameters): a forward of one example gives the
    activation memory per example of a chunk."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    return sum(seen.values())


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None (another C library, another system)."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release(device: torch.device) -> None:
    """Hand memory freed on the CPU back to the system (glibc's ``malloc_trim``), between
    chunks of a computation sized to a budget. The simulator keeps freed blocks in the heap
    for speed (:mod:`privaudit.sim.allocator`), and the blocks of the previous chunk's
    temporaries that the heap cannot reuse would otherwise stay resident and raise the peak
    (one 16-agent ResNet-18 DPDL round at B = 2: 5.56 GB without this call after each chunk,
    5.25 GB with it). A no-op on other devices and C libraries."""
    trim = _malloc_trim() if device.type == "cpu" else None
    if trim is not None:
        trim(0)
