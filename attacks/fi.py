"""Feature inversion: a batch attacked one example at a time.

Three steps per Observation:

1. **Features.** Each example's input ``h_b`` to the classifier, and its label, are solved
   from the classifier's gradient (:mod:`.features`; the embedding idea of iLRG, Ma et al.
   2023). Exact (to float rounding) wherever the system is, which is reported.
2. **Inversion.** Each dummy example is fitted to its own ``h_b``:
   ``argmin_{x_b ∈ [0,1]^n} ‖h(x_b) − h_b‖² / ‖h_b‖² + α_TV · TV(x_b)``, by the same signed
   Adam, box and step decay as :func:`.ig.ig`. This is first order (no gradient of a
   gradient) and the examples no longer compete for one batch gradient, so it converges in
   far fewer, cheaper steps than matching the batch gradient. With ``restarts`` R, every
   *example* keeps its own best restart (lowest feature loss plus TV): the choice is per
   image, not per batch, because each image has its own loss.
3. **Refinement.** Inverting Gradients (:func:`.ig.ig`, ``refine`` iterations at step size
   ``refine_lr``) from the inverted batch, with the labels from step 1 and, where the
   features are exact, the feature term beside the gradient match — the whole gradient's
   information (every layer, not only the classifier's input) on top of step 2.

Applies to an Observation without gradient terms whose model ends in a Linear layer with
a bias and whose batch is smaller than the number of classes (:func:`.features.applicable`).
Noise on the message makes the features approximate (``meta["features"]["exact"]`` False);
:func:`.auto.auto` uses this attack where their residual is at most its ``fi_residual``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from privaudit.core.errors import PrivauditError
from privaudit.core.observation import Observation, Reconstruction

from .common import (
    as_list,
    feature_fn,
    generators,
    init_images,
    progress_bar,
    stack_observations,
    total_variation,
)
from .compiled import conv_backend, onednn_convs, value_and_grad
from .features import (
    Features,
    applicable,
    batch_features,
    classifier_module,
    feature_targets,
)
from .ig import ig, milestones, starting_from
from .registry import LABEL_METHOD, NON_NEGATIVE, POSITIVE, Rule, register_attack

DEFAULT_ITERATIONS = 1000
DEFAULT_REFINE = 200


def observation_features(
    obs: Sequence[Observation], seed: int = 0, label_method: str = "auto"
) -> list[Features]:
    """:func:`.features.batch_features`, or one error naming the first observation it does
    not apply to."""
    feats = batch_features(obs, seed, label_method)
    if feats is None:
        k, why = next((k, why) for k, o in enumerate(obs) if (why := applicable(o)))
        raise PrivauditError(f"feature inversion does not apply to observation {k}: {why}")
    return feats


def invert_features(
    obs: Sequence[Observation],
    feats: Sequence[Features],
    *,
    iterations: int,
    restarts: int = 1,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
    lr: float = 0.1,
    tv: float = 5e-2,
    module: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 2 on every observation at once -> (images (K, B, *S), feature loss (K, B)), each
    example from its best restart. ``module``: the submodule whose input the features are
    (default: the classifier's; a batch disaggregation attack passes its linear layer)."""
    stack = stack_observations(obs, device).repeat(restarts)
    k, b = len(obs), stack.batch_size
    features = feature_fn(stack, classifier_module(obs[0]) if module is None else module)
    target, inv = feature_targets(feats, restarts, stack.device, stack.dtype)

    def per_image(x: torch.Tensor) -> torch.Tensor:
        fit = (features(x) - target).square().sum(-1) * inv
        smooth = total_variation(x.flatten(0, 1).unsqueeze(1)).view(fit.shape)
        return fit + tv * smooth  # (K·R, B)

    x = init_images(generators(seed, k), restarts, stack).requires_grad_(True)
    opt = torch.optim.Adam([x], lr=lr)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones(iterations), gamma=0.1)
    images = x.shape[0] * x.shape[1]
    step = value_and_grad(
        lambda v: per_image(v).sum(1), x, channels_last=onednn_convs(stack, images)
    )
    with progress_bar(progress, iterations, f"FI ×{k}") as advance, conv_backend(stack, images):
        for _ in range(iterations):
            (g,), _ = step(x)
            x.grad = g.sign()
            opt.step()
            sched.step()
            with torch.no_grad():
                x.clamp_(0, 1)
            advance()
    with torch.no_grad():
        x = x.detach()
        loss = per_image(x).view(k, restarts, b)
        best = loss.argmin(1)  # (K, B): each example's best restart
        x = x.view(k, restarts, b, *x.shape[2:])
        pick = best.view(k, 1, b, *[1] * (x.dim() - 3)).expand(k, 1, b, *x.shape[3:])
        chosen = x.gather(1, pick).squeeze(1)
        return chosen, loss.gather(1, best.unsqueeze(1)).squeeze(1)


@register_attack(
    "fi",
    summary="feature inversion: the last layer's input solved in closed form, then inverted",
    rules={
        "lr": POSITIVE,
        "tv": NON_NEGATIVE,
        "refine": Rule("an integer in 0..10^7", lambda v: 0 <= v <= 10**7),
        "refine_lr": POSITIVE,
        "feature_weight": NON_NEGATIVE,
        "label_method": LABEL_METHOD,
    },
)
def fi(
    observations: Observation | Sequence[Observation],
    *,
    iterations: int | None = None,
    restarts: int | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
    lr: float = 0.1,
    tv: float = 5e-2,
    refine: int = DEFAULT_REFINE,
    refine_lr: float = 0.01,
    feature_weight: float = 1.0,
    label_method: str = "auto",
    clip_aware: bool = True,
) -> list[Reconstruction]:
    """Feature inversion (module docstring) on every observation; ``iterations`` of step 2
    (default 1000), ``restarts`` per example, then ``refine`` IG iterations (0: none).
    ``loss`` is IG's final cosine distance after refinement, else the mean feature loss."""
    obs = as_list(observations)
    feats = observation_features(obs, seed, label_method)
    return fi_from(
        obs, feats, iterations=iterations, restarts=restarts, seed=seed, device=device,
        progress=progress, lr=lr, tv=tv, refine=refine, refine_lr=refine_lr,
        feature_weight=feature_weight, clip_aware=clip_aware,
    )  # fmt: skip


def fi_from(
    obs: list[Observation],
    feats: list[Features],
    *,
    iterations: int | None = None,
    restarts: int | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
    lr: float = 0.1,
    tv: float = 5e-2,
    refine: int = DEFAULT_REFINE,
    refine_lr: float = 0.01,
    feature_weight: float = 1.0,
    clip_aware: bool = True,
) -> list[Reconstruction]:
    """Steps 2 and 3 of :func:`fi` from features already recovered (one per observation)."""
    iterations = DEFAULT_ITERATIONS if iterations is None else int(iterations)
    r = 1 if restarts is None else max(1, int(restarts))
    images, fit = invert_features(
        obs, feats, iterations=iterations, restarts=r, seed=seed, device=device,
        progress=progress, lr=lr, tv=tv,
    )  # fmt: skip
    if refine > 0:
        with starting_from(images, feats):
            recs = ig(
                obs, iterations=refine, seed=seed, device=device, progress=progress,
                lr=refine_lr, tv=tv, clip_aware=clip_aware, feature_weight=feature_weight,
            )  # fmt: skip
    else:
        devices = [next(iter(o.params.values())).device for o in obs]
        recs = [
            Reconstruction(images[k].to(d), feats[k].labels.to(d), float(fit[k].mean()), {})
            for k, d in enumerate(devices)
        ]
    out = []
    for k, (o, rec) in enumerate(zip(obs, recs, strict=True)):
        meta = {
            "attack": "fi",
            "iterations": iterations,
            "restarts": r,
            "refine": refine,
            "refine_lr": refine_lr,
            "tv": tv,
            "lr": lr,
            "seed": int(seed) + k,
            "labels": "given" if o.labels is not None else "inferred",
            "features": feats[k].meta(),
            "feature_loss": [float(v) for v in fit[k]],
            "observation": dict(o.meta),
        }
        out.append(Reconstruction(rec.images, rec.labels, rec.loss, meta))
    return out
