"""The documented range of every numeric input, and the checks that enforce them.

Each bound is where the component behind it still answers in well under a few seconds and
in bounded memory (opacus 1.6 on a 2-core CPU), or where a larger value is
meaningless:

- ε ∈ [1e-3, 1e3]: a DP guarantee outside is no guarantee (ε > 1e3) or needs σ beyond
  :data:`SIGMA_MAX` for any run (ε < 1e-3). Inside, the RDP accountant answers in
  milliseconds; whether a given ε is reachable at the run's δ, q and T is the accountant's
  bracket check (:mod:`privaudit.core.accounting`), e.g. RDP cannot certify ε below about
  0.1 at δ = 1e-5 however large σ is.
- δ ∈ [1e-30, 1): RDP is exact and fast down to 1e-30 (below, no ε ≤ 1 is reachable);
  the PRV accountant's floating-point check refuses δ below about 1e-12
  (:data:`PRV_MIN_DELTA`).
- σ = 0 (no noise) or σ ∈ (0, 1e6]: 1e6 is opacus' own search ceiling (``MAX_SIGMA``); at
  σ = 1e300 its RDP formulas overflow, and at σ → 0 every ε is infinite (below
  ``SIGMA_NEGLIGIBLE`` = 1e-100 it is reported ∞ at once: opacus would take minutes).
- a step size (``lr``: η, γ or λ) in (0, 1e4]: the gradients of the bundled models are
  O(1), so a step beyond 1e4 only moves the weights to where the models overflow float32
  within a few rounds (the round loop stops a run whose state becomes non-finite,
  :mod:`privaudit.sim.loop`); at 1e300 the first step is already infinite.
- rounds T ≤ 1e7; agents N ≤ 10,000: the simulator keeps dense N×N graph and mixing
  matrices (float64 W alone is 0.8 GB at N = 10,000) and loops over links.
- seeds in [0, 2^63): torch generators take 64-bit seeds, numpy no negative ones.
"""

from __future__ import annotations

import math
import numbers
import os
import resource
from pathlib import Path
from typing import Any

import numpy as np

from privaudit.core.errors import PrivauditError

EPSILON = (1e-3, 1e3)
DELTA_MIN = 1e-30
PRV_MIN_DELTA = 1e-12
SIGMA_MAX = 1e6
# a noise multiplier below this is no noise: its ε (≈ q²T/z² in RDP) passes 1e200, and
# opacus' fractional-order series for it runs for minutes (seen at z = 1e-157)
SIGMA_NEGLIGIBLE = 1e-100
LR_MAX = 1e4
MAX_ROUNDS = 10**7
MAX_AGENTS = 10_000
SEED_END = 2**63  # seeds lie in [0, SEED_END)
DIRICHLET_ALPHA = (1e-3, 1e6)
MAX_SECONDS = 1e6  # a timeout: about 11 days
MAX_TRIALS = 10**7  # audit trials or canaries


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _fmt(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def check_float(
    flag: str,
    value: Any,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
    hint: str = "",
) -> float:
    """``value`` as a finite float in the interval [lo, hi] (an end open where asked; None:
    unbounded), or one :class:`PrivauditError` naming ``flag``, the range and the value."""
    ok = _number(value) and math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value < hi if hi_open else value <= hi
    if ok:
        return float(value)
    if lo is not None and hi is not None:
        where = f"in {'(' if lo_open else '['}{_fmt(lo)}, {_fmt(hi)}{')' if hi_open else ']'}"
    elif lo is not None:
        where = f"{'>' if lo_open else '≥'} {_fmt(lo)}"
    elif hi is not None:
        where = f"{'<' if hi_open else '≤'} {_fmt(hi)}"
    else:
        where = ""
    tail = f" ({hint})" if hint else ""
    raise PrivauditError(f"{flag} must be a finite number {where}, got {value!r}{tail}".strip())


def check_delta(delta: Any) -> float:
    """δ of (ε, δ)-DP: a finite number in [DELTA_MIN, 1) — the one δ check of every command,
    the accountants, the audits' bounds and the reference."""
    return check_float("--delta", delta, DELTA_MIN, 1.0, hi_open=True)


def check_int(
    flag: str, value: Any, lo: int | None = None, hi: int | None = None, hint: str = ""
) -> int:
    """``value`` as an int in [lo, hi] (None: unbounded), or one :class:`PrivauditError`."""
    ok = _integer(value)
    if ok and lo is not None:
        ok = value >= lo
    if ok and hi is not None:
        ok = value <= hi
    if ok:
        return int(value)
    if lo is not None and hi is not None:
        where = f"in {lo}..{hi}"
    elif lo is not None:
        where = f"≥ {lo}"
    else:
        where = f"≤ {hi}"
    tail = f" ({hint})" if hint else ""
    raise PrivauditError(f"{flag} must be an integer {where}, got {value!r}{tail}")


def check_seed(flag: str, value: Any) -> int:
    """A seed: an integer in [0, 2^63) (torch generators take 64-bit seeds)."""
    if _integer(value) and 0 <= value < SEED_END:
        return int(value)
    raise PrivauditError(f"{flag} must be an integer in [0, 2^63), got {value!r}")


def check_sigma(flag: str, value: Any) -> float:
    """A noise multiplier: 0 (no noise) or a finite number in (0, :data:`SIGMA_MAX`]."""
    return check_float(flag, value, 0.0, SIGMA_MAX, hint="0: no noise")


def check_step_size(flag: str, value: Any) -> float:
    """A step size (a learning rate): a finite number in (0, :data:`LR_MAX`]."""
    return check_float(flag, value, 0.0, LR_MAX, lo_open=True, hint="a larger step only diverges")


def check_threads(flag: str, value: Any) -> int:
    """CPU threads for torch: 1 up to this machine's cores."""
    cores = os.cpu_count() or 1
    return check_int(flag, value, 1, cores, f"this machine has {cores} CPU cores")


CGROUP_ROOT = Path("/sys/fs/cgroup")
UNLIMITED = 2**60  # a cgroup v1 limit at or above this is "no limit" (v1 writes 2^63 − 4096)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (cgroup v2): no limit


def _meminfo_available() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo``: what the kernel estimates can be allocated
    without swapping (free memory plus reclaimable caches)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def cgroup_headroom(root: Path = CGROUP_ROOT, membership: str | None = None) -> int | None:
    """The least room left under a memory limit of this process's cgroups (its own and every
    ancestor's: limit − usage), cgroup v2 (``memory.max``/``memory.current``) or v1
    (``memory.limit_in_bytes``/``memory.usage_in_bytes``); None without a limit.
    ``membership``: the text of ``/proc/self/cgroup`` (None: read it); ``root``: where the
    hierarchies are mounted."""
    if membership is None:
        try:
            membership = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    lines = membership.splitlines()
    folders: list[tuple[Path, str, str]] = []
    for line in lines:
        _, controllers, rel = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # v2: one unified hierarchy
            folders.append((root / rel.lstrip("/"), "memory.max", "memory.current"))
        elif "memory" in controllers.split(","):  # v1: the memory controller's hierarchy
            base = root / "memory" / rel.lstrip("/")
            folders.append((base, "memory.limit_in_bytes", "memory.usage_in_bytes"))
    room: list[int] = []
    for folder, limit_file, usage_file in folders:
        level = folder
        while True:  # a limit anywhere above the process applies to it too
            limit, usage = _read_int(level / limit_file), _read_int(level / usage_file)
            if limit is not None and limit < UNLIMITED and usage is not None:
                room.append(max(limit - usage, 0))
            if level == root or root not in level.parents:
                break
            level = level.parent
    return min(room) if room else None


def address_space_headroom() -> int | None:
    """Room left under ``RLIMIT_AS`` (``ulimit -v``): the soft limit less this process's
    address space now (``/proc/self/statm``); None without a limit."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY or soft < 0:
            return None
        pages = int(Path("/proc/self/statm").read_text().split()[0])
        return max(soft - pages * int(os.sysconf("SC_PAGE_SIZE")), 0)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def available_memory() -> int | None:
    """Bytes this process can still allocate on the host: the smallest of ``MemAvailable``,
    the room under its cgroups' memory limits and the room under ``RLIMIT_AS`` (where a
    container or ``ulimit -v`` caps it well below the machine's RAM); None where the system
    says none of them."""
    known = [
        b
        for b in (_meminfo_available(), cgroup_headroom(), address_space_headroom())
        if b is not None
    ]
    return min(known) if known else None


def device_memory(device: str) -> int | None:
    """Bytes of memory available on ``device``: the free memory of a CUDA device, what this
    process can still allocate on the host otherwise (:func:`available_memory`: not the
    physical RAM, which a container, a ``ulimit -v`` or other processes may leave far from
    reach); None where the system does not say."""
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.mem_get_info(torch.device(device))[0])
        return None
    return available_memory()


# float32 (N, D) tensors a round holds at least: the models, one state vector (momentum,
# tracking), the gradients and the messages
STATE_COPIES = 4
# bytes per entry of the dense N×N graph: the bool adjacency, the float64 mixing matrix and
# the float64 temporaries of building it
GRAPH_BYTES = 41


def check_memory(agents: int, held: int, params: int, device: str) -> None:
    """Refuse, before anything is allocated, a run whose state cannot fit: ``held`` agents'
    :data:`STATE_COPIES` float32 copies of ``params`` parameters, and the dense graph of
    ``agents`` agents (:data:`GRAPH_BYTES` per entry); a lower bound on what a round needs."""
    state = STATE_COPIES * 4 * held * params
    graph = GRAPH_BYTES * agents * agents
    have = device_memory(device)
    if have is None or state + graph <= have:
        return
    gb = 2.0**30
    raise PrivauditError(
        f"{agents} agents of a {params:,}-parameter model need at least "
        f"{(state + graph) / gb:.3g} GB ({state / gb:.3g} GB of state, {graph / gb:.3g} GB "
        f"of N×N graph), more than the {have / gb:.3g} GB available on {device}; lower "
        "--agents or choose a smaller --model"
    )
