"""Closed-form recovery through a first Linear layer with bias (Phong et al. 2017, "Privacy-
Preserving Deep Learning via Additively Homomorphic Encryption", §3.2; Geiping et al. 2020,
§3, Prop. 1).

For ``z = W x + b`` and one example, ``∂L/∂W_k = (∂L/∂b_k) · xᵀ`` for every row k, so
``x = ∂L/∂W_k / ∂L/∂b_k`` for any row with ``∂L/∂b_k ≠ 0``. Using all rows at once, the
least-squares estimate ``x = Σ_k ∂b_k ∂W_k / Σ_k ∂b_k²`` is exact without noise and averages
noise when there is some. ``scale`` and a per-example clip multiply both sides by one
factor and cancel. The recovered vector is the *normalised, flattened* input; it is mapped
back to [0, 1] pixels with the observation's ``mean``/``std``.

B > 1: rows mix the examples; exact recovery needs rows that only one example activates
(e.g. after a ReLU). As a heuristic, each row with a large ``|∂b_k|`` gives a candidate
``∂W_k / ∂b_k`` and B mutually farthest candidates are returned — exact only for B = 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from privaudit.core.errors import PrivauditError
from privaudit.core.observation import Observation, Reconstruction

from .common import as_list, working_device
from .labels import labels_for
from .registry import LABEL_METHOD, register_attack


def first_linear(model: nn.Module) -> str:
    """Name of the first module that owns parameters; it must be ``nn.Linear`` with bias."""
    for name, module in model.named_modules():
        if any(True for _ in module.parameters(recurse=False)):
            if isinstance(module, nn.Linear) and module.bias is not None:
                return name
            break
    raise PrivauditError(
        "the analytic attack needs a model whose first layer is Linear with bias; "
        "use the 'ig' attack for this model"
    )


def _farthest(candidates: Tensor, weights: Tensor, b: int) -> Tensor:
    """Greedy farthest-point choice of ``b`` rows, starting from the heaviest."""
    chosen = [int(weights.argmax())]
    dist = (candidates - candidates[chosen[0]]).norm(dim=1)
    while len(chosen) < min(b, len(candidates)):
        nxt = int(dist.argmax())
        chosen.append(nxt)
        dist = torch.minimum(dist, (candidates - candidates[nxt]).norm(dim=1))
    while len(chosen) < b:
        chosen.append(chosen[-1])
    return candidates[chosen]


def recover(obs: Observation, device: torch.device | str | None = None) -> tuple[Tensor, float]:
    """Images (B, *input_shape) in [0, 1] (float64, on ``device`` or the target's) and the
    relative residual ``‖∂W − ∂b xᵀ‖² / ‖∂W‖²`` of the rank-1 fit (0 when exact)."""
    layer = first_linear(obs.model)
    prefix = f"{layer}." if layer else ""
    dw = obs.target[prefix + "weight"].detach().to(device).double()
    db = obs.target[prefix + "bias"].detach().to(device).double()
    numel = 1
    for s in obs.input_shape:
        numel *= int(s)
    if dw.shape[1] != numel:
        raise PrivauditError(
            f"the first Linear layer takes {dw.shape[1]} inputs, an example has {numel} values"
        )
    denom = float((db * db).sum())
    if denom == 0.0:
        raise PrivauditError("the first layer's bias gradient is zero: nothing to recover")
    if obs.batch_size == 1:
        flat = (db @ dw / denom).unsqueeze(0)
    else:
        keep = db.abs() >= 0.1 * db.abs().max()
        flat = _farthest(dw[keep] / db[keep, None], db[keep].abs(), obs.batch_size)
    ls = db @ dw / denom
    residual = float((dw - db[:, None] * ls[None]).pow(2).sum() / dw.pow(2).sum().clamp_min(1e-300))
    shape = tuple(obs.input_shape)
    view = (-1, *([1] * (len(shape) - 1))) if len(shape) > 1 else (-1,)
    mean = torch.as_tensor(obs.mean, dtype=torch.float64, device=dw.device).reshape(view)
    std = torch.as_tensor(obs.std, dtype=torch.float64, device=dw.device).reshape(view)
    images = flat.reshape(-1, *shape) * std + mean
    return images.clamp(0, 1), residual


@register_attack(
    "analytic",
    summary="closed-form recovery of the first linear layer's input (B = 1 or exact cases)",
    rules={"label_method": LABEL_METHOD},
)
def analytic(
    observations: Observation | Sequence[Observation],
    *,
    iterations: int | None = None,
    restarts: int | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
    label_method: str = "auto",
) -> list[Reconstruction]:
    """Closed-form input recovery (no optimisation: ``iterations``, ``restarts``, ``seed``
    and ``progress`` are accepted for a uniform interface and ignored)."""
    del iterations, restarts, seed, progress
    obs = as_list(observations)
    out = []
    for o in obs:
        if o.terms:
            raise PrivauditError(
                "the analytic attack inverts one gradient; this observation is a sum of "
                "gradient terms (e.g. a tracking difference): use --attack ig or dlg"
            )
        src_dev = next(iter(o.params.values())).device
        dtype = next(iter(o.params.values())).dtype
        images, residual = recover(o, working_device([o], device))
        labels, source = labels_for(o, label_method)
        out.append(
            Reconstruction(
                images=images.to(src_dev, dtype),
                labels=labels.to(src_dev),
                loss=residual,
                meta={"attack": "analytic", "labels": source, "observation": dict(o.meta)},
            )
        )
    return out
