"""What the batch disaggregation attacks (:mod:`.cpa`, :mod:`.spear`) share once a linear
layer's gradient is separated into per-example terms.

Both separate ``∂W = Σ_i f_i g_i h_iᵀ`` (divided by ``scale``; ``f_i`` an unknown
per-example clip factor, ``g_i = ∂ℓ_i/∂z_i``) into its B terms, up to the attack's own
ambiguity, and hand over the per-example layer inputs ``h_i`` and output gradients ``g_i``
(each times ``f_i``, which no step below needs):

- **Labels** (:func:`labels_from_directions`). With ``h_i`` known, the gradient at ``z_i``
  for a candidate label ``y`` is ``∂CE(f(h_i), y)/∂z`` — one backward pass from the layer
  up. The label is the class whose gradient is parallel to the recovered ``g_i`` (largest
  |cosine|, so a direction known up to sign will do): exact where ``g_i`` is, and unchanged
  by the clip factor.
- **Images** (:func:`images_from_inputs`). Where the layer takes the example itself (an MLP's
  first layer), ``h_i`` is the normalised, flattened image: mapped back to [0, 1] pixels with
  the observation's ``mean``/``std``. Where a trunk comes first (``fedavg-cnn``), ``h_i`` are
  features, inverted to images by :func:`.fi.invert_features` (the same feature inversion as
  the ``fi`` attack, fitted to this layer's input instead of the classifier's).
- **Missing examples** (:func:`fill_missing`): an attack that separated only some examples
  returns the per-channel mean image for the others and the labels the count estimate
  (:mod:`.labels`) leaves over — no guess dressed as a reconstruction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call

from privaudit.core.errors import PrivauditError
from privaudit.core.observation import Observation, Reconstruction

from .features import Features
from .fi import invert_features
from .identifiability import LinearLayer, linear_layers
from .labels import labels_for


def pick_layer(obs: Observation, layer: str = "auto") -> LinearLayer:
    """The linear layer an attack separates: ``layer`` by module name, or with "auto" the
    first ``nn.Linear`` whose gradient the observation carries (the widest place for B
    outer products in the chains privaudit trains)."""
    layers = [ly for ly in linear_layers(obs.model) if ly.weight in obs.target]
    if not layers:
        raise PrivauditError(
            "batch disaggregation needs a model with an nn.Linear layer (e.g. --model mlp or "
            "fedavg-cnn); use --attack ig for this model"
        )
    if layer == "auto":
        return layers[0]
    for ly in layers:
        if ly.module == layer:
            return ly
    raise PrivauditError(
        f"no linear layer {layer!r} in this model; its linear layers: "
        + ", ".join(ly.module for ly in layers)
    )


def layer_params(obs: Observation, layer: LinearLayer) -> tuple[Tensor, Tensor]:
    """The layer's weight (m, n) and bias (m,) (zeros without one), float64 on the CPU."""
    w = obs.params[layer.weight].detach().double().cpu()
    c = obs.params[layer.bias] if layer.bias is not None else torch.zeros(w.shape[0])
    return w, c.detach().double().cpu()


def labels_from_directions(
    obs: Observation, layer: LinearLayer, h: Tensor, g: Tensor, chunk: int = 1024
) -> Tensor:
    """Per-example labels (b,) int64: the class whose ``∂CE/∂z`` at ``z_i = W h_i + c`` has
    the largest |cosine| with ``g[:, i]`` (module docstring). ``h`` (b, n), ``g`` (m, b)."""
    w, c = layer_params(obs, layer)
    b, classes = h.shape[0], int(obs.num_classes)
    z_all = (h.double() @ w.T + c).repeat_interleave(classes, dim=0)  # (b·C, m)
    y_all = torch.arange(classes).repeat(b)
    module = obs.model.get_submodule(layer.module)
    params = {k: v.detach() for k, v in obs.params.items()}
    dtype = next(iter(params.values())).dtype
    device = next(iter(params.values())).device
    grads = []
    for start in range(0, len(z_all), chunk):
        z = z_all[start : start + chunk].to(device, dtype).requires_grad_(True)
        handle = module.register_forward_hook(lambda _m, _a, _o, z=z: z)
        try:
            dummy = torch.zeros(len(z), *obs.input_shape, device=device, dtype=dtype)
            logits = functional_call(obs.model, params, (dummy,))
            loss = F.cross_entropy(logits, y_all[start : start + chunk].to(device), reduction="sum")
            (gz,) = torch.autograd.grad(loss, z)
        finally:
            handle.remove()
        grads.append(gz.detach().double().cpu())
    cand = torch.cat(grads).view(b, classes, -1)
    target = g.T.double()  # (b, m)
    cos = (cand * target[:, None]).sum(-1).abs() / (
        cand.norm(dim=-1) * target.norm(dim=-1, keepdim=True)
    ).clamp_min(1e-300)
    return cos.argmax(1)


def _normalisation(obs: Observation) -> tuple[Tensor, Tensor]:
    """The observation's per-channel mean and std, float64, shaped to broadcast over a
    batch of images (b, *input_shape)."""
    shape = tuple(obs.input_shape)
    view = (1, -1, *([1] * (len(shape) - 1))) if len(shape) > 1 else (1, -1)
    mean = torch.as_tensor(obs.mean, dtype=torch.float64).reshape(view)
    return mean, torch.as_tensor(obs.std, dtype=torch.float64).reshape(view)


def images_from_inputs(obs: Observation, rows: Tensor) -> Tensor:
    """Normalised, flattened examples (b, d) as images (b, *input_shape) in [0, 1], float64."""
    mean, std = _normalisation(obs)
    return (rows.double().reshape(-1, *obs.input_shape) * std + mean).clamp(0, 1)


def inputs_from_images(obs: Observation, images: Tensor) -> Tensor:
    """Images (b, *input_shape) as the normalised, flattened examples (b, d) the model's first
    layer takes, float64: :func:`images_from_inputs`' inverse (before its clamp)."""
    mean, std = _normalisation(obs)
    return ((images.double() - mean) / std).flatten(1)


def invert_layer_inputs(
    obs: Observation,
    layer: LinearLayer,
    h: Tensor,
    labels: Tensor,
    *,
    iterations: int,
    restarts: int,
    seed: int,
    device: torch.device | str | None,
    progress: bool,
    lr: float,
    tv: float,
) -> tuple[Tensor, Tensor]:
    """Feature inversion of the layer's inputs ``h`` (b, n) to images, by
    :func:`.fi.invert_features` -> (images (b, *input_shape), feature loss (b,)), CPU."""
    feats = Features(h=h.float(), labels=labels, residual=0.0, rank=int(h.shape[0]), exact=True)
    images, fit = invert_features(
        [obs], [feats], iterations=iterations, restarts=restarts, seed=seed, device=device,
        progress=progress, lr=lr, tv=tv, module=layer.module,
    )  # fmt: skip
    return images[0].detach().cpu(), fit[0].detach().cpu()


def fill_missing(
    obs: Observation, images: Tensor, labels: Tensor, found: Sequence[bool]
) -> tuple[Tensor, Tensor]:
    """``images``/``labels`` with every example not ``found`` replaced by the per-channel
    mean image and a label the count estimate leaves over (module docstring)."""
    found_t = torch.as_tensor(list(found), dtype=torch.bool)
    if bool(found_t.all()):
        return images, labels
    images, labels = images.clone(), labels.clone()
    shape = tuple(obs.input_shape)
    view = (-1, *([1] * (len(shape) - 1))) if len(shape) > 1 else (-1,)
    mean = torch.as_tensor(obs.mean, dtype=images.dtype).reshape(view).expand(shape)
    images[~found_t] = mean.clamp(0, 1)
    estimate, _ = labels_for(obs, "auto")
    left = torch.bincount(estimate.cpu(), minlength=obs.num_classes)
    left -= torch.bincount(labels[found_t].cpu(), minlength=obs.num_classes)
    spare = [c for c in range(obs.num_classes) for _ in range(max(int(left[c]), 0))]
    for k, i in enumerate(torch.nonzero(~found_t).flatten().tolist()):
        labels[i] = spare[k] if k < len(spare) else int(estimate[i % len(estimate)])
    return images, labels


@dataclass
class Separated:
    """What the search gave: each example's layer input and output gradient, which were
    found, and how (for ``meta``)."""

    h: Tensor  # (b, n)
    g: Tensor  # (m, b)
    found: Tensor  # (b,) bool
    meta: dict


def finish(
    obs: Observation,
    layer: LinearLayer,
    sep: Separated,
    seed: int,
    device: torch.device | str | None,
    progress: bool,
    inversion: dict,
    name: str,
) -> Reconstruction:
    """Labels, images (feature inversion below a trunk) and the missing examples filled
    (:mod:`.disaggregation`) -> the observation's Reconstruction."""
    b = int(obs.batch_size)
    found = sep.found
    labels = torch.zeros(b, dtype=torch.long)
    if bool(found.any()):
        labels[found] = labels_from_directions(obs, layer, sep.h[found], sep.g[:, found])
    images = torch.zeros(b, *obs.input_shape, dtype=torch.float64)
    meta = {"attack": name, "layer": layer.module, name: sep.meta}
    if bool(found.any()) and layer.takes_input:
        images[found] = images_from_inputs(obs, sep.h[found])
    elif bool(found.any()):
        h = sep.h.clone()  # the inversion runs on the whole batch: stand-ins where not found
        h[~found] = sep.h[found].mean(0)
        inv, fit = invert_layer_inputs(
            obs, layer, h, labels, seed=seed, device=device, progress=progress, **inversion
        )
        images[found] = inv[found].double()
        meta["feature_loss"] = [float(v) for v in fit[found]]
        meta["inversion"] = dict(inversion)
    images, labels = fill_missing(obs, images, labels, found.tolist())
    meta["recovered"] = int(found.sum())
    meta["observation"] = dict(obs.meta)
    src = next(iter(obs.params.values()))
    return Reconstruction(
        images=images.to(src.device, src.dtype),
        labels=labels.to(src.device),
        loss=1.0 - float(found.double().mean()),
        meta=meta,
    )
