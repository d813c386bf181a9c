"""Message-level membership inference: was this example in the batch behind one message?

White box, one message, no shadow models. An :class:`~privaudit.core.observation.Observation`
promises

    target = scale · (1/B) Σ_{b ∈ batch} clip_C(∇ℓ(θ; x_b, y_b)) + N(0, noise_std² I),

with θ = ``params``, B = ``batch_size``, ℓ the cross-entropy and clip_C the per-example clip
(the identity when ``clip`` is None). Write m = target/scale for the message on the gradient
scale. A candidate (x, y) that was in the batch put exactly g_x/B into m, where g_x is its
own clipped gradient at θ; one that was not put nothing. Every candidate's g_x can be
computed by the attacker (the model and θ cross the link or are public), so each candidate is
scored by how much of its own gradient the message holds. This is the white-box gradient
attack of Nasr, Shokri & Houmansadr 2019 ("Comprehensive Privacy Analysis of Deep Learning")
reduced to a single gradient message, and the statistic of a gradient-canary DP audit (Nasr
et al. 2021, "Adversary Instantiation"; Nasr et al. 2023, "Tight Auditing of Differentially
Private Machine Learning") applied to real examples instead of crafted canaries.

Scorers (:data:`SCORERS`; higher = more likely a member):

- ``inner``: ⟨m, g_x⟩.
- ``cosine``: ⟨m, g_x⟩ / (‖m‖ ‖g_x‖).
- ``lr``: the Gaussian log-likelihood ratio of H1 "m = g_x/B + R" against H0 "m = R", where
  R, the rest of the message (the other examples and the noise), is modelled as
  N(μ, diag(s²)). Then

      log Λ(x) = Σ_d [ (m − μ)_d g_{x,d} / B − g_{x,d}² / (2B²) ] / s_d².

  The rest's moments come from a population sample of gradients (``reference`` examples
  from the data distribution, or the candidates themselves when none are given) with
  per-coordinate mean ḡ and variance v: the B − 1 other examples contribute mean
  μ = (B − 1)/B · ḡ and variance (B − 1)/B² · v, and the noise (noise_std/scale)², so
  s² = (noise_std/scale)² + (B − 1)/B² · v. Centring on μ removes the direction every
  gradient shares; dividing by s² down-weights coordinates where the other examples or the
  noise vary most; the −‖g_x‖²/(2B²) term stops a candidate with a large gradient from
  scoring high merely for being large. ``lr-iso`` is the same test with one pooled variance
  s² = mean_d s_d² (isotropic rest): then Λ ranks like ⟨m − μ, g_x⟩ − ‖g_x‖²/(2B).

  The value is a log-likelihood ratio only as far as the rest is Gaussian with independent
  coordinates (the noise is; a sum of B − 1 clipped gradients roughly is); the ROC uses its
  ranking alone. With the candidates as the population and the batch's members among them,
  the candidates' mean holds the members' own gradients, so centring on it also contrasts
  each candidate with the others: in m − μ a member's own gradient has weight about
  1/B − 1/n and a non-member's −1/n (n candidates), instead of 1/B and 0. That makes the
  default the stronger variant when the candidates cover the batch; a separate
  ``reference`` sample estimates the same moments without it.

- ``decompose`` (joint): the message as a combination of *all* candidates' gradients,
  B·m = Σ_j w_j g_j + B·n with w_j = 1 for a member and 0 otherwise; each candidate is
  scored by its weight's posterior mean under the prior w_j ~ N(½, ¼) (a member or not,
  equally likely a priori) and Gaussian noise n ~ N(0, s² I), s = noise_std/|scale|:

      ŵ = ½ + (G Gᵀ + λ I)⁻¹ G (B·m − ½ Gᵀ 1),   λ = 4 B² s²,

  G the (n, D) matrix of candidate gradients (a ridge of 1e-9 · tr(G Gᵀ)/n where s = 0).
  Where the candidates cover the batch and D ≫ n, the message is an exact combination of
  their gradients and ŵ is the membership indicator; members outside the candidates act as
  further noise. This is the attacker of the DP membership game, who knows every candidate
  and asks which of them are in: a post-processing of the release, so (ε, δ)-DP bounds its
  ROC like any other test's.

Observations with extra gradient ``terms`` (gradient tracking's differences, …) are refused:
their terms carry the candidate's gradient at other parameter points with other
coefficients, which none of these tests models.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call, grad, vmap

from privaudit.core.errors import PrivauditError, unknown
from privaudit.core.observation import Observation, check_finite

__all__ = [
    "SCORERS",
    "RestModel",
    "candidate_gradients",
    "message",
    "per_example_gradients",
    "rest_model",
    "score_candidates",
]


@dataclass(frozen=True)
class RestModel:
    """The message's rest R (everything but the candidate), as N(mean, diag(var)), on the
    scale of m = target/scale; ``batch_size`` is B."""

    batch_size: int
    mean: Tensor  # (D,)
    var: Tensor  # (D,), > 0


Scorer = Callable[[Tensor, Tensor, "RestModel | None"], Tensor]


def _inner(m: Tensor, g: Tensor, rest: RestModel | None) -> Tensor:  # noqa: ARG001
    return g @ m


def _cosine(m: Tensor, g: Tensor, rest: RestModel | None) -> Tensor:  # noqa: ARG001
    tiny = torch.finfo(g.dtype).tiny
    return (g @ m) / (g.norm(dim=1) * m.norm() + tiny)


def _lr(m: Tensor, g: Tensor, rest: RestModel | None) -> Tensor:
    assert rest is not None
    b = rest.batch_size
    w = 1.0 / rest.var
    return g @ ((m - rest.mean) * w) / b - (g * g) @ w / (2 * b * b)


def _lr_iso(m: Tensor, g: Tensor, rest: RestModel | None) -> Tensor:
    assert rest is not None
    pooled = RestModel(rest.batch_size, rest.mean, rest.var.mean().expand_as(rest.var))
    return _lr(m, g, pooled)


SCORERS: dict[str, Scorer] = {
    "inner": _inner,
    "cosine": _cosine,
    "lr": _lr,
    "lr-iso": _lr_iso,
}
"""name → ``fn(m (D,), g (k, D), rest) -> (k,)``; ``rest`` is None for the scorers that do
not model the rest (:data:`NEEDS_REST` lists those that do)."""

NEEDS_REST = frozenset({"lr", "lr-iso"})


def _check(obs: Observation) -> list[str]:
    if obs.terms:
        raise PrivauditError(
            "membership scoring needs a message with one gradient, but this observation has "
            f"{len(obs.terms)} extra gradient term(s) (e.g. a tracking difference); score a "
            "message without terms (a cross-gradient, a noised gradient)"
        )
    if not (math.isfinite(float(obs.scale)) and float(obs.scale) != 0):
        raise PrivauditError(
            f"the observation's scale is {obs.scale}: membership scoring divides the message "
            "by it; give the finite, non-zero factor the defense multiplied the gradient by"
        )
    if int(obs.batch_size) < 1:
        raise PrivauditError(
            f"the observation's batch_size is {obs.batch_size}: a message of an empty batch "
            "holds no member; score a message of a non-empty batch"
        )
    names = list(obs.params)
    if set(obs.target) != set(names) or any(
        obs.target[n].shape != obs.params[n].shape for n in names
    ):
        raise PrivauditError(
            "the observation's target does not have the names and shapes of its params; "
            "build the Observation from one model's gradient"
        )
    check_finite([obs])
    return names


def _check_candidates(obs: Observation, x: Tensor, y: Tensor, what: str) -> None:
    shape = tuple(obs.input_shape)
    if x.dim() != len(shape) + 1 or tuple(x.shape[1:]) != shape:
        raise PrivauditError(
            f"{what} images have shape {tuple(x.shape)}; pass (n, {', '.join(map(str, shape))}),"
            " the observation's input_shape with a leading candidate dimension"
        )
    if y.shape != (x.shape[0],):
        raise PrivauditError(
            f"{what} labels have shape {tuple(y.shape)}; pass one integer label per image, "
            f"shape ({x.shape[0]},)"
        )
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= obs.num_classes):
        raise PrivauditError(
            f"{what} labels must lie in [0, {obs.num_classes}); got {int(y.min())}..{int(y.max())}"
        )


def _channels(values: tuple[float, ...], shape: tuple[int, ...], like: Tensor) -> Tensor:
    t = torch.as_tensor(values, dtype=like.dtype, device=like.device)
    return t.reshape(-1, *([1] * (len(shape) - 1))) if len(shape) > 1 else t


def message(obs: Observation) -> Tensor:
    """m = target/scale, flattened in ``params`` order, in float64: the message on the scale
    of the batch-mean gradient."""
    names = _check(obs)
    flat = torch.cat([obs.target[n].detach().reshape(-1) for n in names])
    return flat.to(torch.float64) / float(obs.scale)


def candidate_gradients(
    obs: Observation, x: Tensor, y: Tensor, *, chunk: int = 64
) -> Iterator[Tensor]:
    """Each candidate's own per-example gradient ∇ℓ(params; x_i, y_i), clipped to norm
    ``obs.clip`` like the mechanism clips (g · min(1, C/(‖g‖ + 1e-12))) when the observation
    is clipped, flattened in ``params`` order: one (k, D) float64 block per ``chunk``
    candidates, so memory stays at ``chunk`` gradients whatever n is.

    ``x`` (n, *input_shape) are images in [0, 1]; they are normalised with the observation's
    ``mean``/``std`` before the model, as every attack does."""
    names = _check(obs)
    if chunk < 1:
        raise PrivauditError(f"chunk must be a positive number of candidates, got {chunk}")
    _check_candidates(obs, x, y, "candidate")
    first = obs.params[names[0]]
    model = copy.deepcopy(obs.model).eval().to(first.device)
    params = {n: obs.params[n].detach() for n in names}
    shape = tuple(obs.input_shape)
    mean = _channels(obs.mean, shape, first)
    std = _channels(obs.std, shape, first)

    def loss(p: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
        logits = functional_call(model, p, (((xi - mean) / std).unsqueeze(0),))
        return F.cross_entropy(logits, yi.unsqueeze(0))

    per_example = vmap(grad(loss), in_dims=(None, 0, 0))
    for i in range(0, x.shape[0], chunk):
        xb = x[i : i + chunk].to(first.device, first.dtype)
        yb = y[i : i + chunk].to(first.device, torch.long)
        gs = per_example(params, xb, yb)
        g = torch.cat([gs[n].reshape(xb.shape[0], -1) for n in names], dim=1).to(torch.float64)
        if obs.clip is not None:
            g = g * torch.clamp(obs.clip / (g.norm(dim=1, keepdim=True) + 1e-12), max=1.0)
        yield g


def per_example_gradients(obs: Observation, x: Tensor, y: Tensor, *, chunk: int = 64) -> Tensor:
    """All candidates' clipped gradients as one (n, D) float64 tensor
    (:func:`candidate_gradients`, concatenated; n · D numbers in memory)."""
    blocks = list(candidate_gradients(obs, x, y, chunk=chunk))
    if not blocks:
        return torch.zeros(0, message(obs).numel(), dtype=torch.float64)
    return torch.cat(blocks)


def rest_model(obs: Observation, x_pop: Tensor, y_pop: Tensor, *, chunk: int = 64) -> RestModel:
    """The rest R of the message under the ``lr`` test, from a population sample
    (x_pop, y_pop) of at least two examples: μ = (B − 1)/B · ḡ and
    s² = (noise_std/scale)² + (B − 1)/B² · v, with ḡ and v the per-coordinate mean and
    (unbiased) variance of the sample's clipped gradients. Accumulated ``chunk`` examples at
    a time. Variances are floored at 1e-12 of their mean (of the message's mean square if
    all are 0: one example and no noise) so that a coordinate no gradient moves does not
    divide by zero."""
    b = int(obs.batch_size)
    n, total, sq = 0, None, None
    for g in candidate_gradients(obs, x_pop, y_pop, chunk=chunk):
        # shifted sums (by the first block's mean) keep the variance accurate
        if total is None:
            shift = g.mean(0)
            total, sq = torch.zeros_like(shift), torch.zeros_like(shift)
        d = g - shift
        total += d.sum(0)
        sq += (d * d).sum(0)
        n += g.shape[0]
    if n < 2 or total is None or sq is None:
        raise PrivauditError(
            f"the lr scorer estimates the other examples' spread from a population sample, "
            f"got {n} example(s); pass at least 2 (reference examples or candidates)"
        )
    mean_d = total / n
    var = (sq - n * mean_d * mean_d).clamp_min(0) / (n - 1)
    noise_var = (float(obs.noise_std) / float(obs.scale)) ** 2
    s2 = noise_var + (b - 1) / b**2 * var
    energy = float((message(obs) ** 2).mean())  # the message's own scale, if s² is all 0
    floor = 1e-12 * max(float(s2.mean()), energy) or torch.finfo(torch.float64).tiny
    return RestModel(batch_size=b, mean=(b - 1) / b * (shift + mean_d), var=s2.clamp_min(floor))


def score_candidates(
    obs: Observation,
    x: Tensor,
    y: Tensor,
    scorer: str = "lr",
    *,
    reference: tuple[Tensor, Tensor] | None = None,
    chunk: int = 64,
) -> Tensor:
    """Membership score of each candidate (x_i, y_i) for the batch behind ``obs``: higher =
    more likely a member. Returns (n,) float64 on the observation's device.

    scorer:     a name in :data:`SCORERS` (module docstring: ``inner`` ⟨m, g_x⟩, ``cosine``,
                ``lr`` the Gaussian log-likelihood ratio
                Σ_d [(m − μ)_d g_{x,d}/B − g_{x,d}²/(2B²)] / s_d², ``lr-iso`` its
                isotropic form).
    reference:  (x_ref, y_ref), examples of the data distribution known to the attacker
                (members or not), from which ``lr`` estimates the other examples' mean
                and spread; None: the candidates themselves, which is sound when they are
                drawn from the same distribution as the batch (members among them are).
    chunk:      candidates per vmapped gradient call (memory bound: ``chunk`` gradients).
    """
    if scorer == "decompose":
        return decompose(obs, x, y, chunk=chunk)
    if scorer not in SCORERS:
        raise unknown("membership scorer", scorer, [*SCORERS, "decompose"])
    m = message(obs)
    _check_candidates(obs, x, y, "candidate")
    rest = None
    if scorer in NEEDS_REST:
        xr, yr = (x, y) if reference is None else reference
        if reference is not None:
            _check_candidates(obs, xr, yr, "reference")
        rest = rest_model(obs, xr, yr, chunk=chunk)
    fn = SCORERS[scorer]
    m = m.to(next(iter(obs.params.values())).device)
    out = [fn(m, g, rest) for g in candidate_gradients(obs, x, y, chunk=chunk)]
    return torch.cat(out) if out else m.new_zeros(0)


def decompose(obs: Observation, x: Tensor, y: Tensor, *, chunk: int = 64) -> Tensor:
    """Every candidate's posterior-mean weight in the message (the ``decompose`` scorer of the
    module docstring): (n,) float64, about 1 for a member and 0 for a non-member."""
    _check_candidates(obs, x, y, "candidate")
    m = message(obs)
    G = per_example_gradients(obs, x, y, chunk=chunk).to(m.device)
    n, B = len(G), obs.batch_size
    if n == 0:
        return m.new_zeros(0)
    s = obs.noise_std / abs(obs.scale)
    gram = G @ G.T
    lam = 4 * B**2 * s**2 if s > 0 else 1e-9 * float(gram.diagonal().mean())
    rhs = G @ (B * m - 0.5 * G.sum(0))
    eye = torch.eye(n, dtype=gram.dtype, device=gram.device)
    return 0.5 + torch.linalg.solve(gram + lam * eye, rhs)
