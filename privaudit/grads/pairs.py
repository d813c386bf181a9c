"""Gradients of many (model, batch) pairs, within a memory budget.

Every defense needs the gradient of some agent's batch at some agent's model: its own
(self-gradient) or a neighbour's (cross-gradient), per-example clipped for the DP ones. Three
engines compute the same quantities (equal to float rounding, ``tests/test_grads.py``,
``tests/test_ghost.py``), chosen per call by ``PairGrads(path=…)``:

- ``vmap``: ``torch.func``, one ``vmap`` over pairs (and, for clipping, a nested ``vmap`` over
  examples that materialises every per-example gradient, W·D floats per pair): a handful of
  kernel launches per round for small models, on any device.
- ``pairnet`` (:mod:`privaudit.grads.pairnet`): on the CPU, per-example clipping of a plain
  conv/linear net as one stacked forward and backward; ``vmap`` for what it does not cover.
- ``ghost`` (:mod:`privaudit.grads.ghost`): ghost clipping, one pair at a time, per-example
  norms and the clipped sum from each layer's inputs and output gradients of one backward
  (book-keeping); never a per-example gradient of the whole model.

``auto`` (the default; :data:`PATH_ENV` overrides it for a whole run) takes ``ghost`` when one
batch's per-example gradients would exceed :data:`GHOST_BYTES` (B·D·4 bytes, B the expected batch
size: ResNet-18 at B ≥ 2) — a rule of the model and B alone, so a run and its re-simulation by
an attack take the same path — and ``pairnet`` otherwise. Every path runs in chunks (of pairs;
``ghost``: of one pair's examples) sized to a memory budget and halved when a chunk still runs
out of memory (:mod:`privaudit.grads.memory`); an ``auto`` call whose single pair does not fit the
``vmap`` budget goes ``ghost``. Chunking changes float rounding only, and only where the budget
is smaller than the whole call.

Batches are padded (:mod:`privaudit.core.sampling`): a padded slot has label
:data:`~privaudit.core.sampling.IGNORE`, so losses are summed (never averaged: a batch may have no
real example) and a padded slot's gradient is exactly 0 (``ghost`` skips padded slots); every mean
is the sum over real examples divided by the expected batch size B (``PairGrads(batch_size=B)``).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from privaudit.core.errors import PrivauditError
from privaudit.core.params import ParamSpec
from privaudit.core.sampling import IGNORE
from privaudit.grads import memory, pairnet
from privaudit.grads.ghost import GhostClipper
from privaudit.grads.ghost import build as build_ghost

PATHS = ("auto", "ghost", "pairnet", "vmap")
PATH_ENV = "PRIVAUDIT_GRADS"  # the default path of every PairGrads in the process
# auto takes the ghost path above this many bytes of per-example gradients per batch (B·D·4):
# ResNet-18 (11.2 M parameters) from B = 2; the bundled small CNNs (≤ 0.1 M) stay far below
GHOST_BYTES = 64 * 2**20
# working memory of the vmap paths per example and per pair, in units of their parts: the
# saved activations (×2: the backward's output gradients) and D-float gradients (×3: the
# gradient, vmap's stacked copy, the clipped rows)
ACTIVATION_COPIES, GRADIENT_COPIES = 2, 3


def batch_loss_fn(model: nn.Module, spec: ParamSpec) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """``loss(flat, x, y)``: summed cross-entropy of the batch ``x`` at flat parameters;
    padded slots (label :data:`~privaudit.core.sampling.IGNORE`) add exactly 0."""

    def loss(flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        logits = functional_call(model, spec.unflatten(flat), (x,))
        return F.cross_entropy(logits, y, ignore_index=IGNORE, reduction="sum")

    return loss


def clip_factors(g: Tensor, clip: float) -> Tensor:
    """``min(1, C/(‖g‖ + 1e-12))`` per row (last dim) of ``g``, keeping the last dim (1)."""
    return torch.clamp(clip / (g.norm(dim=-1, keepdim=True) + 1e-12), max=1.0)


def clip_rows(g: Tensor, clip: float) -> Tensor:
    """Scale each row (last dim) to norm ≤ ``clip``: ``g · min(1, C/‖g‖)``."""
    return g * clip_factors(g, clip)


def check_path(path: str) -> str:
    """``path`` if it is one of :data:`PATHS`, else one :class:`PrivauditError`."""
    if path not in PATHS:
        raise PrivauditError(
            f"unknown gradient path {path!r} ({PATH_ENV}); choose one of: {', '.join(PATHS)}"
        )
    return path


class PairGrads:
    """Gradients for stacked pairs: ``flat (P, D)``, ``x (P, W, ...)``, ``y (P, W)``, padded
    batches of width W (:mod:`privaudit.core.sampling`).

    ``batch_size``: the denominator B of every batch mean — the expected size of a Poisson
    batch; None: the width W (fixed-size batches without padding). ``path``: the engine
    (module docstring; default :data:`PATH_ENV`, else "auto"). ``max_memory``: the working
    memory budget of one call in bytes, or a size such as "4G" (default
    :data:`~privaudit.grads.memory.MAX_MEMORY_ENV`, else half the free memory at each call)."""

    def __init__(
        self,
        model: nn.Module,
        spec: ParamSpec,
        batch_size: int | None = None,
        *,
        path: str | None = None,
        max_memory: int | str | None = None,
    ):
        self.model, self.spec, self.batch_size = model, spec, batch_size
        self.path = check_path(os.environ.get(PATH_ENV, "auto") if path is None else path)
        self.max_memory = (
            memory.env_max_memory() if max_memory is None else memory.parse_size(max_memory)
        )
        # None: not a plain conv/linear net (or not asked for)
        self._stacked = pairnet.build(model) if self.path in ("auto", "pairnet") else None
        self._ghost: GhostClipper | None = None
        self._ghost_built = False
        self._example_bytes: dict[tuple, int] = {}  # input shape -> saved bytes per example
        self.ghost_chunk: int | None = None  # examples per ghost chunk once one was halved
        loss = batch_loss_fn(model, spec)
        self._loss = loss
        self._mean = vmap(grad(loss), in_dims=(0, 0, 0))

        def example_loss(flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
            return loss(flat, x.unsqueeze(0), y.unsqueeze(0))

        per_example = vmap(grad(example_loss), in_dims=(None, 0, 0))
        self._per_example = vmap(per_example, in_dims=(0, 0, 0))

    def denominator(self, x: Tensor) -> int:
        """B of the batch means of ``x`` (P, W, …): ``batch_size``, else W."""
        return x.shape[1] if self.batch_size is None else self.batch_size

    # -- choosing the engine ------------------------------------------------------------------
    def ghost(self) -> GhostClipper | None:
        """The ghost clipper of the model, built on first use (None: opacus refuses the model,
        or is older than 1.5)."""
        if not self._ghost_built:
            self._ghost_built = True
            self._ghost = build_ghost(self.model, self.spec)
        return self._ghost

    def uses_ghost(self, x: Tensor) -> bool:
        """Whether calls on batches like ``x`` (P, W, …) take the ghost path: always when
        forced (a :class:`PrivauditError` if the model cannot), under "auto" when one batch's
        per-example gradients exceed :data:`GHOST_BYTES` and the model allows it."""
        if self.path in ("pairnet", "vmap"):
            return False
        if self.path == "ghost":
            if self.ghost() is None:
                raise PrivauditError(
                    "the ghost gradient path needs opacus ≥ 1.5 and a model without "
                    f"parametrised layers with buffers (BatchNorm); set {PATH_ENV}=auto"
                )
            return True
        examples = self.denominator(x)
        return examples * self.spec.numel * 4 > GHOST_BYTES and self.ghost() is not None

    # -- the interface ------------------------------------------------------------------------
    def mean(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """Batch-mean gradient of each pair, ``(1/B) Σ_{b real} g_b``, ``(P, D)``; 0 for a
        batch without examples."""
        if x.shape[1] == 0:
            return torch.zeros_like(flat)
        return self._sum(flat, x, y, None, None).div_(self.denominator(x))  # no (P, D) copy

    def per_example(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """Per-example gradients, ``(P, W, D)``; 0 in padded slots."""
        if x.shape[1] == 0:
            return flat.new_zeros(flat.shape[0], 0, flat.shape[1])
        return self._per_example(flat, x, y)

    def clipped_mean(
        self, flat: Tensor, x: Tensor, y: Tensor, clip: float | None, owner: Tensor | None = None
    ) -> Tensor:
        """``(1/B) Σ_{b real} g_b · min(1, C/‖g_b‖)`` per pair; the plain mean when ``clip``
        is None. With ``owner`` (P,), ``x``/``y`` are the batches (N, W, …) and pair p's is
        ``owner[p]``: the stacked engine then reads each batch once (DPDL's 3 pairs per batch
        on a ring share one first-layer convolution)."""
        b, stacked = self.denominator(x), self._stacked
        if x.shape[1] == 0:
            return torch.zeros_like(flat)
        if (
            clip is not None
            and stacked is not None
            and flat.device.type == "cpu"
            and not self.uses_ghost(x)
        ):
            out = stacked.clipped_mean(flat, x, y, clip, owner, b)
            if out is not None:
                return out
        return self._sum(flat, x, y, clip, owner).div_(b)

    # -- the engines ----------------------------------------------------------------------------
    def _sum(self, flat: Tensor, x: Tensor, y: Tensor, clip: float | None, owner) -> Tensor:
        """``Σ_{b real} g_b · min(1, C/‖g_b‖)`` (the plain sum when ``clip`` is None) per pair,
        by ghost clipping or chunked ``vmap``."""
        if self.uses_ghost(x):
            return self._ghost_sum(flat, x, y, clip, owner)
        out = self._vmap_sum(flat, x, y, clip, owner)
        if out is None:  # one pair does not fit the budget: auto goes ghost
            return self._ghost_sum(flat, x, y, clip, owner)
        return out

    def _budget(self, device: torch.device) -> int | None:
        return memory.budget(self.max_memory, device)

    def _ghost_sum(self, flat: Tensor, x: Tensor, y: Tensor, clip: float | None, owner) -> Tensor:
        """Ghost clipping (:mod:`privaudit.grads.ghost`), pair by pair, each pair's real
        examples in chunks that fit the budget beside the model."""
        clipper = self.ghost()
        if clipper is None:
            raise PrivauditError(
                "one pair's per-example gradients do not fit in memory and the model cannot "
                f"take the ghost path (opacus ≥ 1.5, no BatchNorm); {memory.FIXES}"
            )
        device, width = flat.device, x.shape[1]
        owner = torch.arange(len(flat), device=device) if owner is None else owner
        limit = self._budget(device)
        each = clipper.example_bytes(x[0])
        chunk = memory.fitting(limit, clipper.fixed_bytes, each, width)
        if self.ghost_chunk is not None:
            chunk = min(chunk, self.ghost_chunk)
        numel = self.spec.numel
        if chunk < 1:
            need = clipper.fixed_bytes + each
            raise memory.does_not_fit(
                f"one example of a {numel:,}-parameter model", need, limit, device
            )
        real = y != IGNORE
        out = torch.zeros_like(flat)

        def halved(size: int) -> None:
            self.ghost_chunk = size

        for p, o in enumerate(owner.tolist()):
            rows = real[o].nonzero().squeeze(1)
            if len(rows) == 0:
                continue
            xs, ys = (x[o], y[o]) if len(rows) == width else (x[o][rows], y[o][rows])
            clipper.load(flat[p])

            def run(s: int, e: int, xs=xs, ys=ys, p=p) -> None:
                clipper.clipped_sum(xs[s:e], ys[s:e], clip, out[p])

            size = chunk if self.ghost_chunk is None else min(chunk, self.ghost_chunk)
            what = f"one example of a {numel:,}-parameter model"
            memory.run_in_chunks(len(rows), size, run, what, device, on_retry=halved)
        return out

    def example_bytes(self, flat: Tensor, x: Tensor) -> int:
        """Bytes autograd saves per example of batches like ``x`` (P, W, …), measured once per
        input shape by a forward of one example (:func:`~privaudit.grads.memory.saved_bytes`)."""
        key = (tuple(x.shape[2:]), x.dtype, x.device.type)
        if key not in self._example_bytes:
            theta = flat[0].detach().clone().requires_grad_(True)
            label = torch.zeros(1, dtype=torch.long, device=x.device)
            with torch.enable_grad():
                saved = memory.saved_bytes(lambda: self._loss(theta, x[0, :1], label), [theta])
            self._example_bytes[key] = saved
        return self._example_bytes[key]

    def _vmap_sum(
        self, flat: Tensor, x: Tensor, y: Tensor, clip: float | None, owner
    ) -> Tensor | None:
        """``torch.func`` in chunks of pairs that fit the budget; None when one pair does not
        and the path is "auto" (the caller goes ghost)."""
        p, width, device = flat.shape[0], x.shape[1], flat.device
        act = ACTIVATION_COPIES * self.example_bytes(flat, x)
        grad_bytes = GRADIENT_COPIES * flat.shape[1] * flat.element_size()
        each = width * (act + grad_bytes) if clip is not None else width * act + grad_bytes
        limit = self._budget(device)
        chunk = memory.fitting(limit, 0, each, p)
        if chunk < 1:
            if self.path == "auto":
                return None
            raise memory.does_not_fit("one pair (its per-example gradients)", each, limit, device)
        done: dict[str, Tensor] = {}  # "all": one chunk's result; "out": the chunks' rows

        def run(s: int, e: int) -> None:
            rows = slice(s, e) if owner is None else owner[s:e]
            xs, ys = x[rows], y[rows]
            if clip is None:
                part = self._mean(flat[s:e], xs, ys)
            else:
                g = self._per_example(flat[s:e], xs, ys)
                # Σ_b f_b g_b as one batched matmul: no (P, W, D) temporary for the scaled rows
                part = torch.bmm(clip_factors(g, clip).transpose(1, 2), g).squeeze(1)
            if e - s == p:  # all pairs at once: no copy into a (P, D) output
                done["all"] = part
            else:
                if "out" not in done:
                    done["out"] = torch.empty_like(flat)
                done["out"][s:e] = part

        memory.run_in_chunks(p, chunk, run, "one pair (its per-example gradients)", device)
        return done["all"] if "all" in done else done["out"]
