"""Inverting Gradients (Geiping et al. 2020, "Inverting Gradients — How easy is it to break
privacy in federated learning?", §4, Eq. 4).

``argmin_{x ∈ [0,1]^n} 1 − <∇L(x, y), g> / (‖∇L(x, y)‖ ‖g‖) + α_TV · TV(x)``: cosine distance
over the whole concatenated gradient plus total variation, Adam on the *signed* gradient of
the images, projection onto the box after every step, step decay ×0.1 at 3/8, 5/8 and 7/8 of
the iterations (as in Geiping's ``inversefed`` and ``breaching``), several restarts of which
each observation keeps the one with the lowest final cosine distance. Labels are
``obs.labels`` when given, else inferred (:mod:`.labels`).

Defaults: ``lr=0.1`` (Geiping's and breaching's step), ``tv=5e-2`` (TV on [0, 1] pixels,
breaching's mean form), ``iterations=3000``, ``restarts=1``; ``noise_aware``: where every
observation states its noise std and scale, the cosine is replaced by the Gaussian negative
log-likelihood (:func:`gaussian_nll`: a MAP estimate with TV as the prior);
``feature_weight``: for a batch whose classifier gradient gives every example's features
exactly (:mod:`.features`), each dummy example is pulled toward its own features,
``feature_weight · mean_b ‖h(x_b) − h_b‖² / ‖h_b‖²``, and its label is the one those
equations give. How each default was chosen, measured: docs/attacks.md.

Batching: all observations and restarts are one tensor under one Adam; Adam, the sign and
the box are elementwise and the losses are independent, so a batched run equals separate
runs with seeds ``seed + i`` up to float rounding of the batched kernels: bit-identical on
the sigmoid LeNet; on the ReLU CNN the batched convolutions round differently and the sign
of a near-zero gradient entry can flip, so pixels may differ by a few steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from privaudit.core.observation import Observation, Reconstruction

from .common import (
    Problem,
    Stack,
    as_list,
    best_restart,
    cosine_distance,
    generators,
    gradient_fn,
    init_images,
    one_hot,
    problem,
    progress_bar,
    total_variation,
)
from .compiled import conv_backend, onednn_convs, value_and_grad, worth_tracing
from .features import Features, batch_features, classifier_module, feature_targets
from .labels import labels_for
from .registry import LABEL_METHOD, NON_NEGATIVE, POSITIVE, register_attack

DEFAULT_ITERATIONS = 3000
DEFAULT_RESTARTS = 1
_START: ContextVar[torch.Tensor | None] = ContextVar("ig_start", default=None)
_FEATURES: ContextVar[list[Features] | None] = ContextVar("ig_features", default=None)


@contextmanager
def starting_from(
    images: torch.Tensor | None, features: list[Features] | None = None
) -> Iterator[None]:
    """Inside this block :func:`ig` starts the first restart of observation k from
    ``images[k]`` ((K, B, *input_shape) in [0, 1]) instead of uniform noise, e.g. from
    R-GAP's partial recovery (:mod:`.rgap`) or feature inversion (:mod:`.fi`); None keeps
    the noise. ``features`` (one per observation, images in their label order) replaces
    :func:`batch_features`' recovery. A context, not an attack option: a tensor cannot come
    from the command line."""
    tokens = _START.set(images), _FEATURES.set(features)
    try:
        yield
    finally:
        _START.reset(tokens[0])
        _FEATURES.reset(tokens[1])


def _started(x: torch.Tensor, restarts: int, slots: int) -> torch.Tensor:
    """``x`` (free rows ordered (k, slot, restart)) with the :func:`starting_from` images
    in each observation's slot-0, restart-0 row."""
    start = _START.get()
    if start is not None:
        rows = torch.arange(start.shape[0], device=x.device) * slots * restarts
        x[rows] = start.to(x.device, x.dtype).reshape(x[rows].shape)
    return x


def gaussian_nll(obs: list[Observation], prob: Problem, restarts: int) -> Callable | None:
    """The noise-aware data term: the Gaussian negative log-likelihood of the target,
    ``‖g − t‖² / (2 σ² D)`` per observation (σ = ``noise_std``, D coordinates), used instead
    of the cosine distance when every observation is noised with a known std and a known
    ``scale`` (not ``meta["scale_estimated"]``): with TV as the prior this is the MAP
    estimate, so the noisier the message the more the prior decides. None otherwise."""
    if not all(o.noise_std > 0 and not o.meta.get("scale_estimated") for o in obs):
        return None
    sd = torch.tensor([o.noise_std for o in obs], dtype=prob.target.dtype)
    var = sd.repeat_interleave(restarts).to(prob.target.device).square().unsqueeze(1)
    d = prob.target.shape[1]
    return lambda g: ((g - prob.target).square() / (2 * var)).sum(1) / d


def feature_term(
    feats: list[Features], weight: float, restarts: int, stack: Stack
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``h (K·R, B, d) -> (K·R,)``: ``weight · mean_b ‖h_b − ĥ_b‖² / ‖ĥ_b‖²`` against the
    recovered features ĥ of each observation whose recovery is exact (0 for the others):
    each dummy example is pulled to its own example's features, so the B examples of a
    batch stop competing for the same gradient."""
    target, inv = feature_targets(feats, restarts, stack.device, stack.dtype)
    w = torch.tensor([weight if f.exact else 0.0 for f in feats], dtype=stack.dtype)
    w = w.repeat_interleave(restarts).to(stack.device)
    return lambda h: w * ((h - target).square().sum(-1) * inv).mean(-1)


def milestones(iterations: int) -> list[int]:
    """Step-decay points at 3/8, 5/8, 7/8 of the run (``inversefed``: ``it // 2.667`` …)."""
    return sorted({max(1, round(iterations * f)) for f in (3 / 8, 5 / 8, 7 / 8)})


@register_attack(
    "ig",
    summary="Inverting Gradients: cosine matching + TV, Adam (Geiping et al. 2020)",
    rules={
        "lr": POSITIVE,
        "tv": NON_NEGATIVE,
        "label_method": LABEL_METHOD,
        "feature_weight": NON_NEGATIVE,
    },
)
def ig(
    observations: Observation | Sequence[Observation],
    *,
    iterations: int | None = None,
    restarts: int | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
    lr: float = 0.1,
    tv: float = 5e-2,
    signed: bool = True,
    boxed: bool = True,
    lr_decay: bool = True,
    clip_aware: bool = True,
    label_method: str = "auto",
    noise_aware: bool = True,
    feature_weight: float = 1.0,
) -> list[Reconstruction]:
    """Inverting Gradients on every observation at once; one Reconstruction each (on the
    device of that observation's params), ``loss`` = final cosine distance."""
    obs = as_list(observations)
    iterations = DEFAULT_ITERATIONS if iterations is None else int(iterations)
    r = DEFAULT_RESTARTS if restarts is None else max(1, int(restarts))
    prob, slot_obs = problem(obs, r, device)
    stack = prob.stack
    labels, sources, feats = _labels_and_features(
        obs, slot_obs, prob, seed, label_method, feature_weight
    )
    y = one_hot(labels, stack, r)
    exact = feats is not None and any(f.exact for f in feats)
    classifier = classifier_module(obs[0]) if exact and feature_weight else None
    dummy_grad = gradient_fn(stack, clip_aware, features=classifier)
    match_features = feature_term(feats, feature_weight, r, stack) if classifier else None

    x = init_images(generators(seed, len(obs)), r * prob.slots, stack)
    x = _started(x, r, prob.slots).requires_grad_(True)
    nll = gaussian_nll(obs, prob, r) if noise_aware else None
    objective = _objective(prob, dummy_grad, y, nll, match_features, tv)
    signed_adam = _SignedAdam(x, lr, iterations if lr_decay else None, signed, boxed)
    images = x.shape[0] * x.shape[1]
    step = value_and_grad(
        objective,
        x,
        trace=worth_tracing(stack, clip_aware),
        channels_last=onednn_convs(stack, images),
    )
    with (
        progress_bar(progress, iterations, f"IG ×{len(obs)}") as advance,
        conv_backend(stack, images),
    ):
        for _ in range(iterations):
            (g,), _ = step(x)
            signed_adam.step(g)
            advance()

    with torch.no_grad():
        x = x.detach().clamp(0, 1)
    g = prob.gradient(dummy_grad, x, y)
    match = cosine_distance(g[0] if match_features is not None else g, prob.target).detach()
    meta = {
        "attack": "ig",
        "iterations": iterations,
        "restarts": r,
        "tv": tv,
        "loss": "gaussian" if nll is not None else "cosine",
        "lr": lr,
    }
    return _reconstructions(obs, prob, x, match, labels, sources, feats, seed, meta)


def _labels_and_features(
    obs: list[Observation],
    slot_obs: list[Observation],
    prob: Problem,
    seed: int,
    label_method: str,
    feature_weight: float,
) -> tuple[tuple[torch.Tensor, ...], tuple[str, ...], list[Features] | None]:
    """Each free slot's labels and their provenance, and the batch features the attack
    matches: the :func:`starting_from` ones, else recovered (:func:`batch_features`) for a
    noiseless batch of several examples whose classifier gradient is one term, else None.
    Exact recovered features replace the inferred labels by the ones that explain them."""
    labels, sources = zip(*(labels_for(o, label_method) for o in slot_obs), strict=True)
    feats = given = _FEATURES.get()
    noised = any(o.noise_std > 0 for o in obs)  # a noised message's features are not exact
    if feats is None and feature_weight and prob.gather is None and prob.stack.batch_size > 1:
        feats = None if noised else batch_features(obs, seed, label_method)
    if feats is not None:  # exact features come with the labels that explain them
        keep = [given is None and not f.exact for f in feats]
        labels = tuple(
            lab if k else f.labels for f, lab, k in zip(feats, labels, keep, strict=True)
        )
    return labels, sources, feats


def _objective(
    prob: Problem,
    dummy_grad: Callable,
    y: torch.Tensor,
    nll: Callable | None,
    match_features: Callable | None,
    tv: float,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x -> (K·R,)`` losses (Eq. 4): the cosine distance of the dummy gradient to the
    target (the Gaussian ``nll`` instead when given), plus the feature term when given, plus
    ``tv`` times the total variation of each problem's images."""

    def objective(x: torch.Tensor) -> torch.Tensor:
        g = prob.gradient(dummy_grad, x, y)
        if match_features is not None:
            g, h = g
        loss = nll(g) if nll is not None else cosine_distance(g, prob.target)
        if match_features is not None:
            loss = loss + match_features(h)
        if tv:
            loss = loss + tv * prob.per_problem(total_variation(x))
        return loss

    return objective


class _SignedAdam:
    """IG's update of the images ``x``: Adam (``lr``) on the sign of the gradient (the
    gradient itself unless ``signed``), the step decayed ×0.1 at :func:`milestones` of
    ``decay_over`` iterations (None: no decay), then with ``boxed`` projected onto
    [0, 1]."""

    def __init__(
        self, x: torch.Tensor, lr: float, decay_over: int | None, signed: bool, boxed: bool
    ) -> None:
        self.x, self.signed, self.boxed = x, signed, boxed
        self.opt = torch.optim.Adam([x], lr=lr)
        self.sched = (
            torch.optim.lr_scheduler.MultiStepLR(
                self.opt, milestones=milestones(decay_over), gamma=0.1
            )
            if decay_over is not None
            else None
        )

    def step(self, g: torch.Tensor) -> None:
        """One update from the objective's gradient ``g``."""
        self.x.grad = g.sign() if self.signed else g
        self.opt.step()
        if self.sched is not None:
            self.sched.step()
        if self.boxed:
            with torch.no_grad():
                self.x.clamp_(0, 1)


def _reconstructions(
    obs: list[Observation],
    prob: Problem,
    x: torch.Tensor,
    match: torch.Tensor,
    labels: Sequence[torch.Tensor],
    sources: Sequence[str],
    feats: list[Features] | None,
    seed: int,
    meta: dict,
) -> list[Reconstruction]:
    """One Reconstruction per observation from its restart of lowest cosine distance
    ``match`` (on the device of the observation's params); ``meta`` the run's settings."""
    r = prob.restarts
    rows = best_restart(match, r)
    out = []
    for k, o in enumerate(obs):
        row = int(rows[k])
        dev = next(iter(o.params.values())).device
        free = prob.free_row(row)
        out.append(
            Reconstruction(
                images=x[free].to(dev),
                labels=labels[k * prob.slots].to(dev),
                loss=float(match[row]),
                meta={
                    "attack": meta["attack"],
                    "iterations": meta["iterations"],
                    "restarts": r,
                    "restart": row - k * r,
                    "seed": int(seed) + k,
                    "labels": sources[k * prob.slots],
                    "slots": prob.slots,
                    "tv": meta["tv"],
                    "loss": meta["loss"],
                    "lr": meta["lr"],
                    "features": None if feats is None else feats[k].meta(),
                    "observation": dict(o.meta),
                },
            )
        )
    return out
