"""PDSL (Wang, Yuan, Wang, Li): Shapley-weighted cross-gradient momentum with DP noise.

Equations of the paper's Alg. 1 and Alg. 2. Per round t, agent i with batch ξ_{i,t} and
players 𝓜_i = {i} ∪ neighbours (ω_{i,j} = W_ij):

    (9)–(11)  ĝ_{i,i} = clip_C(∇F_i(x_i; ξ_{i,t})) + n_{i,i}
    (12)–(14) ĝ_{i,j} = clip_C(∇F_i(x_j; ξ_{i,t})) + n_{i,j},  same batch, fresh n per j
    (15)      x_{i,j} = x_i − γ ĝ_{j,i}                        candidate models, j ∈ 𝓜_i
    (16)(17)  v(𝓜′) = accuracy of (1/|𝓜′|) Σ_{j∈𝓜′} x_{i,j} on the validation set 𝒬
    (18)/(26) φ_{i,j}: exact Shapley (subset form) or Monte-Carlo permutations (Alg. 2)
    (19)      φ̂_{i,j} = (φ_{i,j} − min_k φ_{i,k}) / (max_k φ_{i,k} − min_k φ_{i,k})
    (20)      π_{i,j} = φ̂_{i,j} / (ω_{i,j} Σ_k φ̂_{i,k})
    (21)–(23) ḡ_i = Σ_j π_{i,j} ĝ_{j,i},  û_i = α u_i + ḡ_i,  x̂_i = x_i − γ û_i
    (24)(25)  u_i = Σ_j ω_{i,j} û_j,  x_i = Σ_j ω_{i,j} x̂_j

Clipping is flat, on the batch-mean gradient (eq. 10), not per example; the noise is
n ~ N(0, σ²C² I): the paper's absolute std σ is written here as ``sigma`` · C, so ``sigma``
is the parameter the run sets from --epsilon.
Orientation: ĝ_{i,j} is i's batch at j's model, computed by i and sent to j (first index =
data owner). Messages on i→j per round:

- ``model`` x_i^{t-1}: the previous round's gossip of half-models;
- ``cg`` ĝ_{i,j}: the only message noised as it is sent;
- ``mm`` û_i: the momentum, π-weighted noised gradients — ĝ_{i,i} (never sent alone) and
  the neighbours' ĝ_{j,i};
- ``half-model`` x̂_i = x_i − γ û_i.

π (eqs. 16–20) is a function of the noised gradients and of 𝒬, so what ``mm``,
``half-model`` and ``model`` reveal depends on 𝒬 (``validation``):

- ``"public"`` (default, the paper's): 𝒬 is ``val_size`` examples of the dataset's *test*
  split, drawn once by a seeded draw, shared by every agent and known to the adversary (the
  paper's "global validation dataset": 2,000 random images, 20 % of the MNIST / CIFAR-10
  test sets). π is then a function of noised releases and public data only, so every
  message is post-processing of the Gaussian releases. ``val_size`` None is 20 % of the test
  split: 2,000 on the full 10,000-image MNIST / CIFAR-10 test sets, as in the paper; 400 of
  the 2,000 when MNIST is read from its t10k files only; 80 of ``photos``' 400. An explicit
  ``val_size`` must leave at least one test example. The run takes 𝒬 out of the test split
  before it measures test accuracy, which is over the remaining test examples only. Each
  round evaluates one forward pass over 𝒬 per distinct Shapley coalition and agent
  (≤ R(|𝓜_i| + 1) under "mc"), so the round's cost grows linearly with ``val_size``: lower
  it (e.g. ``-p val_size=200``) for quick runs on a large test split.
- ``"private"``: 𝒬_i is ``val_size`` (None: 32) seeded examples of agent i's own shard,
  held out of its training batches (``holdout_size``) and kept in the state (``val``). π_i,
  hence û_i, x̂_i and every later model, is an un-noised function of i's validation images:
  no finite ε for those messages.

Choices the paper leaves open, as parameters (paper values where it gives them):
``lr`` γ = 0.01 (paper: 0.01 CIFAR-10, 0.001 MNIST), ``momentum`` α = 0.7 (0.7 / 0.5),
``clip`` C = 1.0 (not given), ``shapley`` = "mc" (Alg. 2) or "exact" (eq. 18),
``permutations`` R = 20 (not given), ``empty_value`` v(∅) = "zero" (Def. 3; "current" =
accuracy of x_i^{t-1}, "chance" = 1/classes; under exact Shapley v(∅) only shifts every
φ_{i,j} by the same amount and cancels in eq. 19), ``tie_tol`` = 1e-9 (Shapley values are
computed in float64): when max_k φ − min_k φ ≤ tie_tol, eq. 19 is 0/0 and every φ̂ is set to
1 (equal weights, π_{i,j} = 1/(ω_{i,j}|𝓜_i|)). u_0 = 0; all agents start at x_0.

Privacy (:meth:`PDSL.privacy`): adding or removing one example moves a flat-clipped batch
mean by up to 2C, so the std σC is a noise multiplier σ/2. Agent i's batch is released
|𝓜_i| = deg + 1 times per round with fresh noise: the ``cg`` messages hold deg of them;
with a public 𝒬, ``mm``/``half-model``/``model`` hold all deg + 1 (ĝ_{i,i} inside û_i, i's
cross-gradients inside its neighbours' û_j). Theorem 1 instead states (ε, δ)-DP *per round*
for σ ≥ max_i 2C(1/ω_min + Σ_j 1/ω_ij)√(2 ln(1.25/δ))/(φ̂_min ε √(Σ_j ω_ij⁻²)): one
mechanism per round, no composition over rounds.

Unsound as written (implemented literally): π divides by ω_{i,j}, so Σ_j ω_{i,j} π_{i,j} = 1
and Σ_j π_{i,j} ≈ 1/ω (the step grows with the degree); the lowest-Shapley player always
gets π = 0, so Theorem 1's φ̂_min is 0 and its σ bound is vacuous.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call, vmap

from privaudit.core.context import Context, State
from privaudit.core.errors import PrivauditError
from privaudit.core.network import Network
from privaudit.core.observation import Observation
from privaudit.core.privacy import Privacy, no_noise
from privaudit.core.threat import View
from privaudit.defenses.base import (
    MODEL_KIND,
    CrossGradientDefense,
    Params,
    check_choice,
    check_count,
    check_fraction,
    check_non_negative,
    check_positive,
    degree,
    max_in_degree,
    per_receiver,
    receiver_rows,
    register,
)

SHAPLEY = ("mc", "exact")
EMPTY = ("zero", "current", "chance")
VALIDATION = ("public", "private")
PUBLIC_FRACTION = 0.2  # |𝒬| / test split when val_size is None (the paper: 2,000 of 10,000)
PRIVATE_SIZE = 32  # |𝒬_i| per agent when val_size is None
_IMAGES = 8192  # validation images × coalition models per vmap call
EXACT_MAX = 16  # players; exact Shapley evaluates 2^m coalitions


@dataclass
class PDSLParams(Params):
    lr: float = 0.01  # γ
    momentum: float = 0.7  # α in (22)
    clip: float = 1.0  # C in (10)(13), flat batch-gradient clip
    sigma: float = 0.0  # noise std / C in (11)(14); set from --epsilon by the accountant
    shapley: str = "mc"  # "mc": Alg. 2 with R permutations; "exact": eq. (18)
    permutations: int = 20  # R in Alg. 2
    validation: str = "public"  # 𝒬: "public" (test split, shared) or "private" (own shard)
    val_size: int | None = None  # |𝒬|; None: 20 % of the test split / 32 per agent
    empty_value: str = "zero"  # v(∅): "zero" (Def. 3), "current", "chance"
    tie_tol: float = 1e-9  # max φ − min φ ≤ tie_tol → eq. (19) is 0/0 → all φ̂ = 1

    def validate(self) -> None:
        super().validate()
        check_fraction("momentum", self.momentum)
        check_positive("clip", self.clip)
        check_non_negative("sigma", self.sigma)
        check_choice("shapley", self.shapley, SHAPLEY)
        check_count("permutations", self.permutations)
        check_choice("validation", self.validation, VALIDATION)
        check_count("val_size", self.val_size, optional=True)
        check_choice("empty_value", self.empty_value, EMPTY)
        check_non_negative("tie_tol", self.tie_tol)


# -- Shapley values: pure functions of a game -------------------------------------------------
def code_bits(codes: Tensor, m: int) -> Tensor:
    """Bitmask coalition codes ``(...)`` → membership ``(..., m)`` in {0, 1} (long)."""
    return (codes.unsqueeze(-1) >> torch.arange(m, device=codes.device)) & 1


def exact_shapley(table: Tensor) -> Tensor:
    """Eq. (18): ``table (..., 2^m)`` holds v(S) at index bitmask(S) → φ ``(..., m)``.

    φ_j = Σ_{S ∌ j} [v(S ∪ {j}) − v(S)] / (m·C(m−1, |S|)), as one matrix product."""
    m = int(table.shape[-1]).bit_length() - 1
    if table.shape[-1] != 1 << m or m < 1:
        raise PrivauditError(f"a Shapley table needs 2^m ≥ 2 entries, got {table.shape[-1]}")
    codes = torch.arange(1 << m, device=table.device)
    bits = code_bits(codes, m).to(table.dtype)  # (2^m, m)
    size = bits.sum(-1).long()
    w = torch.tensor([1.0 / (m * math.comb(m - 1, s)) for s in range(m)], dtype=table.dtype)
    w = w.to(table.device)
    # S ∋ j contributes +w(|S|−1)·v(S); S ∌ j contributes −w(|S|)·v(S)
    plus = w[(size - 1).clamp(min=0)][:, None]
    minus = w[size.clamp(max=m - 1)][:, None]
    coef = bits * plus - (1 - bits) * minus
    return table @ coef


def random_permutations(batch: int, m: int, r: int, generator: torch.Generator) -> Tensor:
    """``r`` uniform permutations of ``m`` players for each of ``batch`` games, (batch, r, m)."""
    keys = torch.rand(batch, r, m, generator=generator, device=generator.device)
    return keys.argsort(-1)


def prefix_masks(perms: Tensor) -> Tensor:
    """Membership of the first k players of each permutation, k = 0..m → (..., m + 1, m)."""
    m = perms.shape[-1]
    first = F.one_hot(perms, m).cumsum(-2) > 0
    return torch.cat([torch.zeros_like(first[..., :1, :]), first], -2)


def mc_shapley(perms: Tensor, prefix_values: Tensor) -> Tensor:
    """Eq. (26): ``perms (..., R, m)`` and v at their prefixes ``(..., R, m + 1)`` → φ (..., m).

    φ_j = (1/R) Σ_r [v(Z_j(ϕ_r) ∪ {j}) − v(Z_j(ϕ_r))], Z_j the predecessors of j in ϕ_r."""
    marginal = prefix_values[..., 1:] - prefix_values[..., :-1]  # of player perms[..., k]
    phi = torch.zeros_like(marginal).scatter_add_(-1, perms, marginal)
    return phi.mean(-2)


def shapley_weights(
    phi: Tensor, omega: Tensor, mask: Tensor | None = None, tol: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Eqs. (19)(20): min–max normalise φ over the real players, then π = φ̂/(ω Σφ̂).

    ``phi``, ``omega`` and ``mask`` (real players; padding gets π = 0) are ``(..., m)``.
    When max − min ≤ ``tol`` eq. (19) is 0/0: every φ̂ is 1 and π_j = 1/(ω_j |𝓜|).
    Returns ``(φ̂, π)``."""
    mask = torch.ones_like(phi, dtype=torch.bool) if mask is None else mask
    lo = phi.masked_fill(~mask, math.inf).amin(-1, keepdim=True)
    hi = phi.masked_fill(~mask, -math.inf).amax(-1, keepdim=True)
    span = hi - lo
    tie = span <= tol
    hat = torch.where(tie, torch.ones_like(phi), (phi - lo) / torch.where(tie, 1.0, span))
    hat = hat.masked_fill(~mask, 0.0)
    denom = omega.masked_fill(~mask, 1.0) * hat.sum(-1, keepdim=True)
    return hat, (hat / denom).masked_fill(~mask, 0.0)


def shapley(
    value: Callable[[Tensor], Tensor],
    batch: int,
    m: int,
    method: str,
    permutations: int = 20,
    generator: torch.Generator | None = None,
    perms: Tensor | None = None,
    device: torch.device | None = None,
) -> Tensor:
    """Shapley values of ``batch`` m-player games, ``(batch, m)``.

    ``value(masks (batch, K, m) bool) → (batch, K)`` evaluates coalitions given by
    membership. ``method`` "exact" evaluates all 2^m coalitions (eq. 18); "mc" evaluates
    the prefixes of ``permutations`` random permutations from ``generator`` (Alg. 2), or
    of the given ``perms (batch, R, m)``."""
    if method == "exact":
        if m > EXACT_MAX:
            raise PrivauditError(
                f"exact Shapley over {m} players needs 2^{m} evaluations per agent; "
                f"use shapley=mc (exact allows at most {EXACT_MAX} players)"
            )
        device = device if generator is None else generator.device
        masks = code_bits(torch.arange(1 << m, device=device), m).bool()
        return exact_shapley(value(masks.expand(batch, -1, -1)))
    if perms is None:
        if generator is None:
            raise PrivauditError("Monte-Carlo Shapley needs a generator")
        perms = random_permutations(batch, m, permutations, generator)
    masks = prefix_masks(perms)  # (batch, R, m + 1, m)
    values = value(masks.reshape(batch, -1, m)).reshape(masks.shape[:-1])
    return mc_shapley(perms, values)


def theorem1_epsilon(sigma: float, W: Tensor, delta: float) -> float:
    """Theorem 1 solved for ε at noise multiplier σ (std σC), with φ̂_min = 1/|𝓜_i|:
    max_i 2(1/ω_min + Σ_j 1/ω_ij)√(2 ln(1.25/δ)) / (φ̂_min σ √(Σ_j ω_ij⁻²)), j ∈ 𝓜_i."""
    if sigma <= 0:
        return math.inf
    Wd = W.double().cpu()
    omega_min = float(Wd[Wd > 0].min())
    root = math.sqrt(2 * math.log(1.25 / delta))
    worst = 0.0
    for row in Wd:
        w = row[row > 0]
        phi_min = 1.0 / len(w)
        val = 2 * (1 / omega_min + float((1 / w).sum())) * root
        worst = max(worst, val / (phi_min * float(w.pow(-2).sum().sqrt())))
    return worst / sigma


# -- the defense ------------------------------------------------------------------------------
@register
class PDSL(CrossGradientDefense):
    name = "pdsl"
    kinds = {
        "model": MODEL_KIND,
        "cg": "ĝ_{i,j}: i's batch at j's model, batch-gradient clip C + N(0,σ²C²)",
        "mm": "û_i = α u_i + Σ_j π_ij ĝ_{j,i}: Shapley-weighted momentum, in the clear",
        "half-model": "x̂_i = x_i − γ û_i: the half-step model, in the clear",
    }
    Params = PDSLParams
    momentum_key = "u"

    def init(self, ctx: Context, p: PDSLParams) -> State:
        """x_0 and u_0 = 0 per agent; with a private 𝒬, also ``val``: agent i's validation
        indices into ``train_x`` (a public 𝒬 is ``ctx.val_x``, the same for all agents)."""
        state = super().init(ctx, p)
        if p.validation == "private":
            state["val"] = torch.stack(ctx.holdout).long()
        elif ctx.val_x is None or ctx.val_y is None:
            raise PrivauditError(
                "PDSL's public validation set is missing (ctx.val_x): the run draws it from "
                "the test split (public_validation_size)"
            )
        return state

    def holdout_size(self, p: PDSLParams) -> int:
        """A private 𝒬_i: ``val_size`` examples of agent i's shard, held out of its
        training batches; none with a public 𝒬."""
        if p.validation != "private":
            return 0
        return PRIVATE_SIZE if p.val_size is None else p.val_size

    def public_validation_size(self, p: PDSLParams, test_size: int) -> int:
        """A public 𝒬: how many examples of the test split (of ``test_size``) the run draws,
        once and shared by every agent, into ``ctx.val_x``/``ctx.val_y`` and leaves out of
        its test accuracy; ``val_size``, or 20 % of the test split (the paper's 2,000 of
        10,000) when None. 0 with a private 𝒬."""
        if p.validation != "public":
            return 0
        if p.val_size is not None:
            return p.val_size
        return max(1, round(PUBLIC_FRACTION * test_size))

    def round(
        self,
        ctx: Context,
        p: PDSLParams,
        state: State,
        net: Network,
        batch: tuple[Tensor, Tensor],
    ) -> State:
        x, u, val = state["x"], state["u"], state.get("val")
        u_half, x_half = self.next_rows(state, x, u)
        # for a chunk of receivers: L5–L11, (9)–(14): models cross the links; flat clip of
        # each batch-mean gradient, fresh noise per (data, model) pair; out-edge i→j carries
        # ĝ_{i,j}. Then each receiver's Shapley weights and half-step into x̃ and ũ
        for chunk in self.cross_gradient_chunks(ctx, p, net, x, batch):
            rows = chunk.rows
            # players 𝓜_i of agent i: slot 0 = i itself (ω_{i,i}), then its incoming links in
            # edge order (ω_{i,j}); padding slots are not real
            G, omega, real = per_receiver(
                chunk.cg,
                chunk.receivers,
                net.w_in[chunk.in_edges],
                chunk.self_noisy,
                own=chunk.self_noisy,
                w_own=net.w_self[rows],
            )
            del chunk
            n, m = G.shape[:2]
            # (15)–(18)/(26), (19)(20)
            mine = None if val is None else val[rows]
            value = self._utility(ctx, p, x[rows], G, real, mine)
            gens = ctx.generators[rows]
            perms = self._permutations(gens, p, real) if p.shapley == "mc" else None
            phi = shapley(value, n, m, p.shapley, p.permutations, perms=perms, device=x.device)
            _, pi = shapley_weights(phi, omega, real, p.tie_tol)
            # (21)–(25)
            g_bar = torch.einsum("nm,nmd->nd", pi.to(x.dtype), G)
            del G, value
            self.half_step_rows(p, x, u, g_bar, rows, u_half, x_half)
            del g_bar
        out = self.mix_half(net, x_half, u_half)
        return out if val is None else {**out, "val": val}

    def rows_per_receiver(self, adj: Tensor) -> int:
        """The chunk's rows (:func:`receiver_rows`), the players' gradients G of a receiver
        of in-degree d (d + 1 rows) and its aggregate ḡ."""
        return receiver_rows(adj) + max_in_degree(adj) + 2

    @staticmethod
    def _permutations(generators: list[torch.Generator], p: PDSLParams, real: Tensor) -> Tensor:
        """Alg. 2's R random permutations per agent of ``real`` (n, m), ``(n, R, m)``: agent
        a's come from its own generator (``generators[a]``) over its own m_a players (sort
        keys U[0, 1)); padding slots get key +∞, so they follow every real player and, being
        null players, change nothing. An agent's permutations thus do not depend on the other
        agents' degrees, nor on which agents a chunk of receivers holds."""
        n, m = real.shape
        keys = torch.full((n, p.permutations, m), math.inf, device=real.device)
        for a, (g, c) in enumerate(zip(generators, real.sum(1).tolist(), strict=True)):
            keys[a, :, :c] = torch.rand(p.permutations, c, generator=g, device=real.device)
        return keys.argsort(-1)

    @staticmethod
    def _utility(
        ctx: Context, p: PDSLParams, x: Tensor, G: Tensor, real: Tensor, val: Tensor | None
    ) -> Callable[[Tensor], Tensor]:
        """v(codes) per agent, eqs. (16)(17): accuracy of x_i − γ·mean_{j∈S} ĝ_{j,i} on 𝒬 —
        the public ``ctx.val_x`` when ``val`` is None, else agent i's ``train_x[val[i]]``.

        Codes are restricted to real players (padding slots are null players, which leaves
        the real players' Shapley values unchanged), deduplicated across the agents of ``x``,
        and evaluated by ``vmap`` over coalition models in chunks of about ``_IMAGES``
        (model, image) pairs; a public 𝒬 is one input shared by every model."""
        n, m, d = G.shape
        shared = val is None
        if shared:
            vx, vy = ctx.val_x, ctx.val_y
        else:
            vx, vy = ctx.train_x[val], ctx.train_y[val]
        size_q = vy.shape[-1]
        models = max(1, _IMAGES // size_q)  # coalition models per call
        images = min(size_q, _IMAGES)  # validation images per call

        def hits(flat: Tensor, xb: Tensor, yb: Tensor) -> Tensor:
            out = functional_call(ctx.model, ctx.spec.unflatten(flat), (xb,))
            return (out.argmax(-1) == yb).sum()

        count = vmap(hits, in_dims=(0, None, None) if shared else 0)

        def value(masks: Tensor) -> Tensor:
            masks = masks & real[:, None, :]
            agent = torch.arange(n, device=x.device)[:, None, None].expand(*masks.shape[:2], 1)
            rows = torch.cat([agent, masks.long()], -1).reshape(-1, m + 1)
            uniq, inv = torch.unique(rows, dim=0, return_inverse=True)
            a_u, bits = uniq[:, 0], uniq[:, 1:].to(x.dtype)
            size = bits.sum(-1)
            coef = bits / size.clamp(min=1)[:, None]
            out = torch.empty(len(uniq), dtype=torch.float64, device=x.device)
            with torch.no_grad():
                for s in range(0, len(uniq), models):
                    a, c = a_u[s : s + models], coef[s : s + models]
                    mix = x.new_zeros(len(a), n, m)
                    mix[torch.arange(len(a), device=x.device), a] = c
                    cand = x[a] - p.lr * (mix.reshape(len(a), n * m) @ G.reshape(n * m, d))
                    right = torch.zeros(len(a), dtype=torch.long, device=x.device)
                    for v in range(0, size_q, images):
                        if shared:
                            right += count(cand, vx[v : v + images], vy[v : v + images])
                        else:
                            right += count(cand, vx[a, v : v + images], vy[a, v : v + images])
                    out[s : s + models] = right.double() / size_q
                if p.empty_value != "current":
                    probe = vx[:1] if shared else vx[0, :1]
                    classes = functional_call(ctx.model, ctx.spec.unflatten(x[0]), (probe,))
                    empty = 0.0 if p.empty_value == "zero" else 1.0 / classes.shape[-1]
                    out = torch.where(size == 0, empty, out)
            return out[inv].reshape(masks.shape[:2])

        return value

    def privacy(self, p: PDSLParams, kind: str, W: Tensor, agent: int | None = None) -> Privacy:
        """Flat batch clip: adding or removing one example moves the clipped mean by up to
        2C, so the std σC is a noise multiplier σ/2. Agent i's batch is released deg + 1
        times per round (fresh noise each): ``cg`` holds the deg cross-gradients. An
        adversary holding every ``mm`` message sees ĝ_{i,i} inside û_i and i's
        cross-gradients inside its neighbours' û_j; with a public 𝒬, π (eqs. 16–20) is a
        function of noised releases and public data, so ``mm``, ``half-model`` and ``model``
        are post-processing of those deg + 1 releases. With a private 𝒬 they are un-noised
        functions of the agents' validation images: no finite ε.

        The claim is Theorem 1: (ε, δ)-DP in each round, one Gaussian mechanism per round
        (the π-weighted aggregate; neither the deg + 1 same-batch releases nor the rounds
        are composed), at std σC (multiplier σ)."""
        if p.sigma <= 0:
            return no_noise(self.name)
        deg = degree(W, agent)
        public = p.validation == "public"
        caveats = [
            "flat batch clipping has add/remove sensitivity 2C (multiplier σ/2); the claimed "
            "accounting takes the std σC as multiplier σ (sensitivity C)",
            "Theorem 1 is per round: it counts one release per round, not agent i's deg + 1 "
            "same-batch releases, and does not compose rounds",
            "Theorem 1's φ̂_min is 0 as defined (eq. 19): its σ bound is vacuous",
        ]
        if public:
            caveats.append(
                "the public validation set is test data known to the adversary: the run's test "
                "accuracy leaves it out"
            )
        else:
            caveats.append(
                "private validation set: mm, half-model and model are un-noised functions of "
                "each agent's validation images, and cg is evaluated at models that carry "
                "them: only one cg release at a fixed model has a finite ε"
            )
        common: dict[str, Any] = dict(
            mechanism="gaussian",
            noise_multiplier=p.sigma / 2,
            releases=deg if kind == "cg" else deg + 1,
            clip=p.clip,
            clip_unit="batch",
            claimed_multiplier=p.sigma,
            claimed_releases=1,
            paper="Theorem 1, (ε, δ)-DP per round if σ ≥ max_i 2C(1/ω_min + Σ_j 1/ω_ij)"
            "√(2 ln(1.25/δ))/(φ̂_min ε √(Σ_j ω_ij⁻²)); as defined φ̂_min = 0 (eq. 19) and the "
            "bound is vacuous; evaluated at φ̂_min = 1/|𝓜_i| (equal Shapley weights, its "
            "largest value)",
            paper_epsilon=lambda delta, impact: theorem1_epsilon(p.sigma, W, delta),
            caveats=tuple(caveats),
        )
        if kind == "cg" and public:
            return Privacy(
                **common,
                formal=True,
                reason="batch-mean clip C + N(0, σ²C²), one cross-gradient per neighbour",
            )
        if kind == "cg":
            return Privacy(
                **common,
                formal=False,
                per_release=True,
                reason="each cross-gradient (batch-mean clip C + N(0, σ²C²)) is evaluated at "
                "the receiver's model, which mixes π-weighted updates whose π is an un-noised "
                "function of agent i's private validation split (eqs. 16–20): the releases do "
                "not compose (one release at a fixed model is a Gaussian mechanism)",
            )
        if public:
            return Privacy(
                **common,
                formal=True,
                reason="post-processing: π is a function of noised gradients and the public "
                "validation set; ĝ_ii in û_i and i's cross-gradients in the neighbours' û_j",
            )
        return Privacy(
            **common,
            formal=False,
            reason="π is an un-noised function of agent i's private validation split (eqs. 16–20)",
        )

    def observe_update(self, view: View, kind: str, t: int, src: int, dst: int) -> Observation:
        """Under ``link`` (src ↔ dst); ``cg`` and ``model`` as every cross-gradient defense
        (:meth:`CrossGradientDefense.observe`):

        - ``mm``: ḡ_i = û_i^t − α u_i^{t-1}, u_i^{t-1} = Σ_j w_ij û_j^{t-1}: exact when every
          neighbour's û_j^{t-1} is seen (else the consecutive-round approximation): a
          π-weighted sum of gradients at x_i^{t-1} of src's and its neighbours' batches.
          π is unseen: it depends on ĝ_{i,i}, which is never sent alone, and on 𝒬 (known to
          the adversary only when ``validation`` is "public"), so even a global observer
          cannot subtract the neighbours' cross-gradients it intercepts; ``scale`` is the
          equal-Shapley weight π_ii = 1/(ω_ii |𝓜_i|), ``noise_std`` the matching
          σC·√(Σ_j π_ij²).
        - ``half-model``: û_i^t = (x_i^{t-1} − x̂_i^t)/γ exactly, then as ``mm``.
        """
        p = view.public.params
        x_prev = view.get(t, src, dst, "model")
        target, unseen = self.momentum_step(view, kind, t, src, dst, p["momentum"])
        W = view.public.W
        w = W[src][W[src] > 0].double()  # ω_{i,j}, j ∈ 𝓜_i (self included)
        pi = 1.0 / (w * len(w))
        return self.make_observation(
            view,
            x_prev,
            target,
            scale=1.0 / (float(W[src, src]) * len(w)),
            noise_std=p["sigma"] * p["clip"] * float(pi.square().sum().sqrt()),
            meta={
                "exact": False,
                "scale_estimated": True,
                "batch_clip": p["clip"],
                "momentum_exact": not unseen,
            },
        )
