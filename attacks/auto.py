"""The strongest applicable attack, chosen per observation.

Exact closed forms first, optimisation where the maths leaves no closed form:

1. ``analytic`` (:mod:`.analytic`; Phong et al. 2017, Geiping et al. 2020 Prop. 1) when
   B = 1 and the model's first layer is Linear with a bias: the input is a ratio of two
   gradient rows.
2. ``rgap`` (:mod:`.rgap`; Zhu & Blaschko 2021) when B = 1, the message carries no noise
   and the model is a chain of Conv2d/Linear layers and elementwise invertible activations
   whose every layer meets R-GAP's rank condition (checked by running it: the rank is a
   property of the weights and the recovered activations, not of the architecture alone).
3. ``fi`` (:mod:`.fi`) otherwise, when the classifier's gradient gives every example's
   features (:mod:`.features`) to a squared relative residual of at most ``fi_residual``
   (checked by solving: it depends on the labels, the weights and the noise): the batch is
   inverted one example at a time, then refined by IG. The bound is not float rounding:
   on a trained network the smallest singular value of ∂W can sit near float32's
   resolution, and approximate features (residual 1e-9…1e-2) still beat batch gradient
   matching there (``benchmarks/strength.py``; the bound was chosen on the photos train
   split: README, "Exact recovery and batches"; at B = 1 through the ReLU ``cnn`` too).
4. ``ig`` (:mod:`.ig`; Geiping et al. 2020) otherwise: no usable features, a
   noised message (each layer's least squares feeds its error to the next, so R-GAP falls
   to noise level where gradient matching does not), a model R-GAP cannot invert
   (max-pooling, residual connections), a sum of gradient terms — started from R-GAP's
   partial recovery where a rank condition failed.

Before 3 and 4, a batch (B > 1) goes to ``spear`` (:mod:`.spear`; Dimitrov et al. 2024)
where its first linear layer is followed by a ReLU and its gradient has rank B, the message
is noise-free and B ≤ ``spear.AUTO_MAX_B`` (the search is exponential in B) — or, at any B
the rank allows, where that ReLU feeds the classifier (the vertex search, :mod:`.vertex`):
the batch is then separated exactly. Past that B, the Cocktail Party Attack (:mod:`.cpa`) where its
first linear layer takes the image with a gradient of rank B and the next layer's row space
pins every example (:func:`.cpa.applies`): ICA's approximate separation, made exact for most
of the batch by the row-space refinement (:mod:`.rowspace`; ``benchmarks/disaggregation.py``).

``meta["attack"]`` names the attack whose answer is returned, ``meta["auto"]`` why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from privaudit.core.errors import PrivauditError
from privaudit.core.observation import Observation, Reconstruction

from .analytic import analytic, first_linear
from .chain import Unsupported, linear_chain
from .common import as_list
from .cpa import applies as cpa_applies
from .cpa import cpa
from .features import Features, batch_features
from .fi import fi_from
from .ig import ig
from .registry import LABEL_METHOD, NON_NEGATIVE, POSITIVE, UNIT_OPEN, register_attack
from .rgap import DEFAULT_RCOND, rgap
from .spear import applies as spear_applies
from .spear import spear

FI_RESIDUAL = 1e-2


def choose(obs: Observation) -> tuple[str, str]:
    """``(attack, reason)`` for one observation before anything runs: "analytic", "rgap"
    (subject to its rank condition, see :func:`auto`), "spear", "cpa" or "ig"."""
    if obs.batch_size != 1:
        for name, applies in (("spear", spear_applies), ("cpa", cpa_applies)):
            why = applies(obs)
            if why is not None:
                return name, why
        return "ig", f"B = {obs.batch_size}: the closed forms invert one example"
    if obs.terms:
        return "ig", "a sum of gradient terms: the closed forms invert one gradient"
    try:
        first_linear(obs.model)
        return "analytic", "B = 1 and the first layer is Linear with bias"
    except PrivauditError:
        pass
    try:
        linear_chain(obs.model, tuple(obs.input_shape))
    except Unsupported as e:
        return "ig", f"R-GAP does not apply: {e}"
    if obs.noise_std > 0:
        return "ig", (
            f"a noised message (std {obs.noise_std:.3g}): R-GAP's layer-by-layer least "
            "squares compounds the noise, where gradient matching averages it"
        )
    return "rgap", "B = 1 and the model is a chain R-GAP inverts"


@register_attack(
    "auto",
    summary="picks analytic, R-GAP, SPEAR, CPA, fi or IG per observation by what is solvable",
    rules={
        "lr": POSITIVE,
        "tv": NON_NEGATIVE,
        "label_method": LABEL_METHOD,
        "rcond": UNIT_OPEN,
        "fi_residual": NON_NEGATIVE,
    },
)
def auto(
    observations: Observation | Sequence[Observation],
    *,
    iterations: int | None = None,
    restarts: int | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
    lr: float | None = None,
    tv: float | None = None,
    label_method: str = "auto",
    rcond: float = DEFAULT_RCOND,
    fi_residual: float = FI_RESIDUAL,
) -> list[Reconstruction]:
    """Each observation attacked by :func:`choose`'s pick (observation i with seed
    ``seed + i``); an R-GAP pick whose rank condition fails becomes IG started from R-GAP's
    recovery; an IG pick whose features solve the classifier's equations to a squared
    relative residual of at most ``fi_residual`` goes to ``fi``. ``lr``/``tv`` (None: the defaults)
    and ``iterations``/``restarts`` reach IG and ``fi`` only."""
    obs = as_list(observations)
    common: dict[str, Any] = {"device": device, "progress": progress}
    common["label_method"] = label_method
    opt: dict[str, Any] = {"iterations": iterations, "restarts": restarts}
    opt.update({k: v for k, v in (("lr", lr), ("tv", tv)) if v is not None})
    picks = [choose(o) for o in obs]
    feats = batch_features(obs, seed, label_method) if any(a == "ig" for a, _ in picks) else None
    if feats is not None:
        picks = [
            with_features(o, f, pick, fi_residual)
            for o, f, pick in zip(obs, feats, picks, strict=True)
        ]
        if all(a == "fi" for a, _ in picks):  # one batched inversion
            recs = fi_from(obs, feats, seed=seed, device=device, progress=progress, **opt)
            return [_tagged(r, a, why) for r, (a, why) in zip(recs, picks, strict=True)]
    if all(a == "ig" for a, _ in picks):  # one batched optimisation
        recs = ig(obs, seed=seed, **common, **opt)
        return [_tagged(r, a, why) for r, (a, why) in zip(recs, picks, strict=True)]
    out = []
    for i, (o, (attack, why)) in enumerate(zip(obs, picks, strict=True)):
        if attack == "fi":
            (rec,) = fi_from(
                [o], [feats[i]], seed=seed + i, device=device, progress=progress, **opt
            )
        elif attack == "analytic":
            (rec,) = analytic(o, **common)
        elif attack == "spear":
            (rec,) = spear(o, seed=seed + i, device=device, progress=progress, **opt)
        elif attack == "cpa":
            (rec,) = cpa(o, seed=seed + i, device=device, progress=progress)
        elif attack == "rgap":
            (rec,) = rgap(o, seed=seed + i, rcond=rcond, **common, **opt)
            if rec.meta["fallback"] is not None:
                start = "R-GAP's recovery" if rec.meta["start"] == "rgap" else "noise"
                attack, why = "ig", f"{rec.meta['fallback']}: IG started from {start}"
        else:
            (rec,) = ig(o, seed=seed + i, **common, **opt)
        out.append(_tagged(rec, attack, why))
    return out


def with_features(
    obs: Observation, feats: Features, pick: tuple[str, str], bound: float
) -> tuple[str, str]:
    """``pick`` turned into ``fi`` when it is IG's and the features' residual is at most
    ``bound``; the reason says why either way."""
    attack, why = pick
    if attack != "ig":
        return pick
    if feats.residual > bound:
        return (
            attack,
            f"{why}; the features' residual {feats.residual:.1e} is above {bound:g} "
            f"(rank {feats.rank})",
        )
    how = "exactly" if feats.exact else "approximately"
    return "fi", (
        f"B = {obs.batch_size}: the classifier's gradient gives each example's features "
        f"({how}: residual {feats.residual:.1e})"
    )


def _tagged(rec: Reconstruction, attack: str, why: str) -> Reconstruction:
    meta = {**rec.meta, "attack": attack, "auto": why}
    return Reconstruction(rec.images, rec.labels, rec.loss, meta)
