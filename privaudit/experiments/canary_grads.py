"""The canary, added where a defense computes its gradients.

:class:`CanaryGrads` stands in for a context's gradient engine (``ctx.grads``) and adds
canary gradients to the victim's rows, as extra examples of its batch clipped and normalised
as the defense treats its own, so that the audits (:mod:`privaudit.experiments.audit`,
:mod:`privaudit.experiments.final_audit`) step the defense's real round code with the
canary in. :func:`audit_batch` pads batches so that the victim's rows are told apart from
every other agent's, even where its batch is empty. Which canaries an audit tries, and how
each is built, is :mod:`privaudit.eval.canaries`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from privaudit.core import sampling
from privaudit.grads import clip_rows


@dataclass(frozen=True)
class Diracs:
    """k Dirac canaries, each of norm ``norm`` on its own coordinate of a ``size``-vector —
    the one-run and pooled audits', held as their coordinates (memory O(k + D), where dense
    rows take k·D: 500,000 canaries on the 656,810-parameter 2NN). :class:`CanaryGrads` adds
    exactly what it adds of the equal dense rows: each row clipped as one example, then
    summed (distinct coordinates, so the sum is one scatter)."""

    coords: Tensor  # (k,) distinct coordinates
    norm: float
    size: int

    def summed(self, clip: float | None, like: Tensor) -> Tensor:
        """Σ_i clip_C(norm · e_{coords[i]}) as a vector of ``like``'s dtype and device
        (``clip`` None: unclipped), the rows' own clip rule (:func:`clip_rows`)."""
        row = torch.zeros(1, 1, dtype=like.dtype, device=like.device) + self.norm
        value = row if clip is None else clip_rows(row, clip)
        out = torch.zeros(self.size, dtype=like.dtype, device=like.device)
        out[self.coords.to(like.device)] = value.reshape(())
        return out


@dataclass
class CanaryGrads:
    """A stand-in for ``ctx.grads`` that adds canary gradients to the victim's pairs.

    Rows whose (padded) batch equals ``victim_x`` get ``canaries (k, D)`` (or :class:`Diracs`,
    the same k rows held sparse) — or, with
    ``example`` (x (1, …), y (1,)), that example's gradient at each pair's own model — as k
    extra examples of the batch with the defense's fixed normalisation B, the expected batch
    size (``inner.denominator``; :mod:`privaudit.core.sampling`): ``clipped_mean`` adds
    Σ clip_C(c)/B (each canary clipped by the defense's own C), ``mean`` adds Σ c/B (a flat
    clip applies after), ``per_example`` adds them to the first example (the add-one batch,
    normalised by B). Batches come from :func:`audit_batch`, whose padded slots tell the
    agents apart even when the victim's batch is empty. With ``replay`` the k-th call of a
    trial returns the k-th result of the first trial when its inputs match (same state, same
    batch), so trials pay for noise only. :meth:`stop` ends the victim's round: later calls
    of the trial see no victim (a span audit's later rounds)."""

    inner: Any
    victim_x: Tensor
    canaries: Tensor | Diracs | None = None
    example: tuple[Tensor, Tensor] | None = None
    replay: bool = True
    clean: list[Tensor] = field(default_factory=list)  # victim rows' clean results (probe)
    example_norm: float | None = None  # the example's gradient norm where first computed
    _store: dict[tuple[str, int], tuple[tuple, Tensor, Tensor]] = field(default_factory=dict)
    _examples: dict[tuple[str, int], tuple[Tensor, Tensor]] = field(default_factory=dict)
    _calls: int = 0
    _active: bool = True

    @property
    def max_memory(self) -> int | None:
        """The wrapped engine's memory budget (a round sizes its chunks by it)."""
        return self.inner.max_memory

    def start(
        self, canaries: Tensor | Diracs | None, example: tuple[Tensor, Tensor] | None = None
    ) -> None:
        """A new trial: ``canaries`` (k, D) or :class:`Diracs`, an ``example``, or neither."""
        self.canaries, self.example, self._calls, self._active = canaries, example, 0, True

    def stop(self) -> None:
        """The victim's round is over: no canary, no victim rows, nothing replayed."""
        self.canaries, self.example, self._active = None, None, False

    def _rows(self, x: Tensor) -> Tensor:
        v = self.victim_x
        if not self._active or x.shape[1:] != v.shape:
            return torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
        return (x.reshape(x.shape[0], -1) == v.reshape(1, -1)).all(-1)

    def _call(
        self,
        name: str,
        fn: Callable[..., Tensor],
        flat: Tensor,
        x: Tensor,
        *rest: Any,
        owner: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, tuple[str, int]]:
        """``fn``'s result (replayed when this call's inputs are those of the first trial's
        call at the same position: the same tensors, or equal ones element for element), the
        mask of the victim's rows (pair p's batch is ``x[owner[p]]`` with ``owner``) and the
        call's key."""
        key = (name, self._calls)
        self._calls += 1
        replay = self.replay and self._active
        inputs = (flat, x, *[r for r in rest if isinstance(r, Tensor)], owner)
        hit = self._store.get(key) if replay else None
        if hit is not None and _same(hit[0], inputs):
            return hit[1].clone(), hit[2], key  # a copy: a round may update its rows in place
        if owner is None:
            out, rows = fn(flat, x, *rest), self._rows(x)
        else:
            out, rows = fn(flat, x, *rest, owner), self._rows(x)[owner]
        if replay:
            self._store[key] = (inputs, out, rows)
            out = out.clone()
        if rows.any() and name != "per_example" and len(self.clean) < 64:
            self.clean.append(out[rows].detach())
        return out, rows, key

    def _planted(self, key: tuple[str, int], flat: Tensor, clip: _Clip) -> Tensor | None:
        """The canaries' sum (r, D) for the victim's r pairs at their models ``flat``, each
        canary ``clip``-ped as one example first."""
        if self.example is not None:
            hit = self._examples.get(key)
            if hit is None or not _same((hit[0],), (flat,)):
                x, y = self.example
                r = len(flat)
                g = self.inner.per_example(flat, x.expand(r, *x.shape), y.expand(r, *y.shape))
                hit = (flat, g)
                if self.replay and self._active:
                    self._examples[key] = hit
                if self.example_norm is None and r:
                    self.example_norm = float(g[0, 0].norm())
            return clip(hit[1]).sum(1)
        c = self.canaries
        if c is None:
            return None
        if isinstance(c, Diracs):
            return c.summed(clip.clip, flat).expand(len(flat), -1)
        return clip(c.to(flat.dtype)).sum(0).expand(len(flat), -1)

    def mean(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        out, rows, key = self._call("mean", self.inner.mean, flat, x, y)
        return self._add(out, rows, key, flat, self.inner.denominator(x), _Clip(None))

    def clipped_mean(
        self, flat: Tensor, x: Tensor, y: Tensor, clip: float | None, owner: Tensor | None = None
    ) -> Tensor:
        out, rows, key = self._call(
            "clipped_mean", self.inner.clipped_mean, flat, x, y, clip, owner=owner
        )
        return self._add(out, rows, key, flat, self.inner.denominator(x), _Clip(clip))

    def per_example(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        out, rows, key = self._call("per_example", self.inner.per_example, flat, x, y)
        c = self._planted(key, flat[rows], _Clip(None)) if rows.any() else None
        if c is None:
            return out
        out = out.clone()
        out[rows, 0] += c.to(out.dtype)
        return out

    def _add(
        self,
        out: Tensor,
        rows: Tensor,
        key: tuple[str, int],
        flat: Tensor,
        B: int,
        clip: _Clip,
    ) -> Tensor:
        c = self._planted(key, flat[rows], clip) if rows.any() else None
        if c is None:
            return out
        out = out.clone()
        out[rows] += c.to(out.dtype) / B
        return out


@dataclass(frozen=True)
class _Clip:
    """Each canary row clipped to norm ≤ ``clip`` (:func:`clip_rows`; None: as it is)."""

    clip: float | None

    def __call__(self, c: Tensor) -> Tensor:
        return c if self.clip is None else clip_rows(c, self.clip)


def _same(a: tuple[Tensor | None, ...], b: tuple[Tensor | None, ...]) -> bool:
    """Whether two calls' inputs are the same: each pair one tensor, or equal tensors."""
    return len(a) == len(b) and all(
        u is v or (u is not None and v is not None and torch.equal(u, v))
        for u, v in zip(a, b, strict=True)
    )


def audit_batch(ctx: Any, index: Tensor) -> tuple[Tensor, Tensor]:
    """The padded batches of ``index`` (:meth:`Context.gather`) with every padded input set
    to its row's number + 1: a padded slot's gradient is 0 whatever it holds, and an empty
    batch is then told apart from every other by its inputs (:class:`CanaryGrads`)."""
    x, y = ctx.gather(index)
    pad = ~sampling.real(index).view(*index.shape, *[1] * (x.dim() - 2))
    row = torch.arange(1, len(index) + 1, dtype=x.dtype, device=x.device)
    return torch.where(pad, row.view(-1, *[1] * (x.dim() - 1)), x), y
