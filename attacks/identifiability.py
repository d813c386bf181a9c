"""What one observation can determine about its batch, before any attack runs.

Two bounds, both read off the observation alone (the attacks' view: :class:`Observation`):

1. **Counting.** The message carries ``N`` numbers (every coordinate of ``target``); the
   batch has ``B · d`` unknown pixels (``d`` per example, one unknown batch per distinct
   batch in ``terms``). The observation is a smooth function of the batch, so the set of
   batches giving the same message has dimension at least ``B d − N`` (the rank of its
   Jacobian is at most ``N``). If ``k`` examples were determined, that set would lie in the
   other ``(B − k) d`` coordinates, so ``B d − N ≤ (B − k) d``, i.e. ``k ≤ ⌊N / d⌋``: at most
   ``⌊N / d⌋`` of the B examples are determined by the message, whatever the attack.
2. **Rank of each linear layer's gradient.** For ``z = W h + c`` the batch-mean gradient is
   ``∂W = (1/B) Σ_i f_i g_i h_iᵀ`` (``g_i = ∂ℓ_i/∂z_i``, ``f_i`` a per-example clip factor):
   a sum of B outer products, of rank ``r ≤ min(B, out, in)`` — and ``≤ classes − 1`` for the
   classifier under cross-entropy, whose ``g_i = softmax − one-hot`` all sum to 0 (so the
   classifier alone never separates more than classes − 1). An attack that separates the
   batch from this gradient (:mod:`.spear`, :mod:`.cpa`, :mod:`.analytic` at B = 1) can
   separate at most ``r`` examples from it: ``∂W`` holds only an r-dimensional span of the
   ``h_i``. The rank is numerical: singular values above ``rtol · s_max`` and, where the
   message is noised with a known std σ, above the largest singular value the noise alone
   reaches, ``σ (√out + √in)`` (Marchenko–Pastur's edge) times ``noise_margin``.

:func:`identifiability` reports both, per layer and as plain sentences ("at most k of B
examples are determined by this message"). The rank bound is a bound on *separation* from
one layer, not on what the message determines; the counting bound holds for every attack.
Both are upper bounds: an attack may recover fewer (SPEAR's search is exponential in B).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from privaudit.core.observation import Observation

RTOL = 1e-5  # singular values below this fraction of the largest are rounding (float32)
NOISE_MARGIN = 1.1  # a singular value counts above the noise edge times this


@dataclass(frozen=True)
class LinearLayer:
    """One ``nn.Linear`` of the model: its module and parameter names, in forward order."""

    module: str
    weight: str
    bias: str | None
    takes_input: bool  # its input is the example itself (flattened): no parameters before it
    relu_after: bool  # the module registered right after it is an nn.ReLU


def linear_layers(model: nn.Module) -> list[LinearLayer]:
    """The model's ``nn.Linear`` modules in registration (= forward, for the chains here)
    order; ``takes_input`` for one that no parameterised module precedes."""
    out: list[LinearLayer] = []
    seen_params = False
    modules = list(model.named_modules())
    for k, (name, module) in enumerate(modules):
        own = any(True for _ in module.parameters(recurse=False))
        if isinstance(module, nn.Linear):
            prefix = f"{name}." if name else ""
            nxt = modules[k + 1][1] if k + 1 < len(modules) else None
            out.append(
                LinearLayer(
                    module=name,
                    weight=prefix + "weight",
                    bias=prefix + "bias" if module.bias is not None else None,
                    takes_input=not seen_params,
                    relu_after=isinstance(nxt, nn.ReLU),
                )
            )
        seen_params = seen_params or own
    return out


def layer_gradient(obs: Observation, layer: LinearLayer) -> tuple[Tensor, Tensor | None]:
    """``(∂W, ∂c | None)`` of ``layer`` divided by ``scale``, float64 on the CPU."""
    s = float(obs.scale) if obs.scale else 1.0
    dw = obs.target[layer.weight].detach().double().cpu() / s
    db = None if layer.bias is None else obs.target[layer.bias].detach().double().cpu() / s
    return dw, db


def noise_edge(obs: Observation, shape: tuple[int, int], margin: float = NOISE_MARGIN) -> float:
    """The largest singular value i.i.d. N(0, σ²) noise of ``shape`` reaches, σ(√m + √n),
    in the units of :func:`layer_gradient` (σ = ``noise_std / scale``), times ``margin``."""
    if not obs.noise_std:
        return 0.0
    s = float(obs.scale) if obs.scale else 1.0
    return margin * float(obs.noise_std) / abs(s) * (math.sqrt(shape[0]) + math.sqrt(shape[1]))


def top_singular(g: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(U_k (m, k), s (min(m, n),) all singular values, descending, V_kᵀ (k, n))`` of ``g``
    from the eigendecomposition of its smaller Gram matrix — one (min × min) eigenproblem
    instead of an SVD of the wide matrix; singular values below ≈ 1e-8 of the largest are
    lost to it, far under :data:`RTOL`."""
    wide = g.shape[0] <= g.shape[1]
    gram = g @ g.T if wide else g.T @ g
    lam, vec = torch.linalg.eigh(gram)
    lam, vec = lam.flip(0).clamp_min(0), vec.flip(1)
    s = lam.sqrt()
    k = min(k, len(s))
    inv = torch.where(s[:k] > 0, 1 / s[:k], torch.zeros_like(s[:k]))
    if wide:
        return vec[:, :k], s, (vec[:, :k].T @ g) * inv[:, None]
    return (g @ vec[:, :k]) * inv, s, vec[:, :k].T


def numerical_rank(singular: Tensor, edge: float = 0.0, rtol: float = RTOL) -> int:
    """Singular values above both ``rtol · s_max`` and ``edge``."""
    if singular.numel() == 0 or float(singular[0]) <= 0:
        return 0
    return int((singular > max(rtol * float(singular[0]), edge)).sum())


def rank_above_noise(obs: Observation, layer: LinearLayer) -> int:
    """The numerical rank of ``layer``'s gradient above its noise (:func:`noise_edge`,
    :data:`RTOL`): how many examples it can hold apart."""
    g, _ = layer_gradient(obs, layer)
    return numerical_rank(top_singular(g, 0)[1], noise_edge(obs, tuple(g.shape)))


@dataclass(frozen=True)
class LayerRank:
    """One linear layer's gradient: its shape, numerical rank and what it can separate."""

    layer: str
    shape: tuple[int, int]
    rank: int
    separable: int  # min(rank, B): the most examples its gradient can separate
    takes_input: bool
    relu_after: bool


@dataclass(frozen=True)
class Identifiability:
    """The bounds of the module docstring for one observation."""

    batch_size: int
    unknowns: int  # B · d per unknown batch
    numbers: int  # N: coordinates of the message
    determined: int  # ⌊N / d⌋ capped at B: the counting bound
    separable: int  # the most any one linear layer's gradient can separate (0: none)
    layers: tuple[LayerRank, ...]

    def sentence(self) -> str:
        """The bounds in words, the binding one first."""
        b = self.batch_size
        parts = []
        if self.determined < b:
            parts.append(
                f"at most {self.determined} of {b} examples are determined by this message "
                f"({self.numbers:,} numbers for {self.unknowns:,} unknown pixels)"
            )
        if self.layers and self.separable < b:
            best = max(self.layers, key=lambda r: r.rank)
            parts.append(
                f"at most {self.separable} of {b} examples can be separated from one "
                f"linear layer's gradient (the largest rank, {best.layer}'s, is {best.rank})"
            )
        if parts:
            return "; ".join(parts)
        where = f"; {self._full_rank_layer()}'s gradient has rank {b}" if self.layers else ""
        return (
            f"all {b} examples may be determined by this message ({self.numbers:,} numbers "
            f"for {self.unknowns:,} unknown pixels{where})"
        )

    def _full_rank_layer(self) -> str:
        return next(r.layer for r in self.layers if r.separable >= self.batch_size)

    def to_dict(self) -> dict:
        """The fields and the sentence, as ``result.json`` would hold them."""
        d = asdict(self)
        d["layers"] = [asdict(r) for r in self.layers]
        d["sentence"] = self.sentence()
        return d


def identifiability(
    obs: Observation, *, rtol: float = RTOL, noise_margin: float = NOISE_MARGIN
) -> Identifiability:
    """The counting and rank bounds (module docstring) for ``obs``; ``rtol`` and
    ``noise_margin`` set the numerical rank (:func:`numerical_rank`, :func:`noise_edge`)."""
    b = int(obs.batch_size)
    d = math.prod(int(s) for s in obs.input_shape)
    batches = 1 + sum(1 for _, _, same in obs.terms if not same)
    numbers = sum(int(v.numel()) for v in obs.target.values())
    unknowns = batches * b * d
    determined = min(b, numbers // d) if d else b
    ranks = []
    for layer in linear_layers(obs.model):
        if layer.weight not in obs.target:
            continue
        dw, _ = layer_gradient(obs, layer)
        _, singular, _ = top_singular(dw, 0)
        rank = numerical_rank(singular, noise_edge(obs, tuple(dw.shape), noise_margin), rtol)
        ranks.append(
            LayerRank(
                layer=layer.module,
                shape=(int(dw.shape[0]), int(dw.shape[1])),
                rank=rank,
                separable=min(rank, b * batches),
                takes_input=layer.takes_input,
                relu_after=layer.relu_after,
            )
        )
    separable = max((min(r.separable, b) for r in ranks), default=0)
    return Identifiability(b, unknowns, numbers, determined, separable, tuple(ranks))
