"""Label inference from the last layer's gradient.

For cross-entropy on softmax outputs, the last linear layer ``z = W h + b`` has
``∂L/∂b_c = (1/B) Σ_b (p_bc − y_bc)`` and ``∂L/∂W_c = (1/B) Σ_b (p_bc − y_bc) h_bᵀ``.
Everything below first divides the target by ``scale`` (a negative scale flips every
sign); per-example clipping multiplies each example's terms by a factor in (0, 1].

- **B = 1, iDLG** (Zhao et al. 2020, §3.1): only the true class has ``p_c − y_c < 0``; with
  non-negative features ``h`` (after sigmoid / ReLU / pooling of ReLU: ``lenet``, ``cnn``,
  ``resnet18``; not ``tanh-cnn``, whose classifier reads tanh outputs) its weight-gradient
  row is the only one with a negative sum:
  ``label = argmin_c Σ_j ∂L/∂W_cj`` (iDLG's own rule; summing many coordinates also averages
  Gaussian noise on the target).
- **B > 1, "counts"** (default when the last layer has a bias): the bias-corrected count
  estimator of Geng et al. 2021 ("Towards General Deep Leakage in Federated Learning",
  §3.2), ``n_c ≈ B (p̄_c − ∂b_c / f)``, where ``p̄`` is the batch's mean softmax output and
  ``f`` the mean clip factor (1 without clipping). ``p̄`` is estimated from the gradient
  itself: each class with a clearly negative ``∂b_c`` is dominated by its own example(s),
  so ``ĥ_c = ∂W_c / ∂b_c`` is (close to) that example's feature vector and
  ``softmax(W ĥ_c + b)`` its prediction; ``p̄`` averages these. With clipping, ``f`` is the
  smallest ``−B ∂b_c / (1 − B p̄_c)`` over those classes (a class seen once). Then every
  clearly negative class gets one slot (it is certainly present: LLG's first rule) and the
  remaining slots go one at a time to the class with the largest unexplained count.
  This handles the case that defeats sign-only rules on untrained networks: a class that
  is present *and* predicted for the whole batch has a positive ``∂b_c``.
- **B > 1, "llg"** (Wainakh et al. 2022, "User-Level Label Leakage from Gradients in
  Federated Learning", §4; fallback without a bias): negative classes first, then fill
  greedily with the most negative signal, adding the per-example *impact*
  ``m = −Σ_{s_c<0} s_c / B`` to a class each time it is taken.

"Clearly negative" means below ``−3 · noise_std / |scale|`` (the noise std of one
coordinate of ``∂b`` after dividing by ``scale``); 0 without noise. More than B such
classes: the B most negative are returned. Labels are returned sorted.
"""

from __future__ import annotations

import torch
from torch import Tensor

from privaudit.core.errors import PrivauditError, unknown
from privaudit.core.observation import Observation

METHODS = ("auto", "counts", "llg")


def last_linear(obs: Observation) -> tuple[str, str | None]:
    """Names of the last 2-D parameter (the classifier weight) and of its bias (or None)."""
    names = [n for n, _ in obs.model.named_parameters()] or list(obs.target)
    weights = [n for n in names if n in obs.target and obs.target[n].dim() == 2]
    if not weights:
        raise PrivauditError(
            "label inference needs a model whose last layer is Linear (a 2-D weight)"
        )
    w_name = weights[-1]
    rows = obs.target[w_name].shape[0]
    if rows != obs.num_classes:
        raise PrivauditError(
            f"the last 2-D parameter {w_name!r} has {rows} rows, not num_classes="
            f"{obs.num_classes}: the model's last layer must be the classifier"
        )
    b_name = w_name[: -len("weight")] + "bias" if w_name.endswith("weight") else None
    if b_name is None or b_name not in obs.target or tuple(obs.target[b_name].shape) != (rows,):
        b_name = None
    return w_name, b_name


def last_linear_gradient(obs: Observation) -> tuple[Tensor, Tensor | None]:
    """``(∂W (classes, d), ∂b (classes,) | None)`` of the last layer, divided by ``scale``,
    float64 on the CPU."""
    w_name, b_name = last_linear(obs)
    s = float(obs.scale) if obs.scale else 1.0
    dw = obs.target[w_name].detach().double().cpu() / s
    db = None if b_name is None else obs.target[b_name].detach().double().cpu() / s
    return dw, db


def _threshold(obs: Observation) -> float:
    return 3.0 * float(obs.noise_std) / abs(float(obs.scale) or 1.0)


def llg(signal: Tensor, batch_size: int, threshold: float = 0.0) -> Tensor:
    """LLG's greedy rule on a per-class signal (negative for present classes) -> (B,) int64."""
    s = signal.detach().double().cpu()
    order = torch.argsort(s)
    present = order[s[order] < -threshold][:batch_size]
    if len(present) == 0:
        present = order[:1]
    impact = float(-s[s < 0].sum()) / batch_size
    if impact <= 0:
        impact = float(s.abs().mean()) or 1.0
    rest = s.clone()
    rest[present] += impact
    labels = present.tolist()
    while len(labels) < batch_size:
        c = int(rest.argmin())
        labels.append(c)
        rest[c] += impact
    return torch.tensor(sorted(labels), dtype=torch.int64)


def estimated_counts(obs: Observation) -> Tensor:
    """Real-valued class counts ``n_c ≈ B (p̄_c − ∂b_c / f)`` (see module docstring)."""
    w_name, b_name = last_linear(obs)
    if b_name is None:
        raise PrivauditError("count estimation needs a bias in the last layer; use method='llg'")
    dw, db = last_linear_gradient(obs)
    assert db is not None
    b = obs.batch_size
    present = (db < -_threshold(obs)).nonzero().flatten()
    if len(present) == 0:
        present = db.argmin().reshape(1)
    weight = obs.params[w_name].detach().double().cpu()
    bias = obs.params[b_name].detach().double().cpu()
    feats = dw[present] / db[present, None]
    p_bar = torch.softmax(feats @ weight.T + bias, dim=-1).mean(0)
    f = 1.0
    if obs.clip is not None:
        pc = p_bar[present]
        ok = pc < 1.0 / b
        if ok.any():
            f = float((-b * db[present][ok] / (1 - b * pc[ok])).min().clamp(1e-12, 1.0))
    return b * (p_bar - db / f)


def counts(obs: Observation) -> Tensor:
    """Labels from :func:`estimated_counts`: one slot per clearly present class, the rest by
    largest unexplained count -> (B,) int64."""
    n = estimated_counts(obs)
    _, db = last_linear_gradient(obs)
    assert db is not None
    order = torch.argsort(db)
    present = order[db[order] < -_threshold(obs)][: obs.batch_size]
    if len(present) == 0:
        present = order[:1]
    labels = present.tolist()
    rest = n.clone()
    rest[present] -= 1
    while len(labels) < obs.batch_size:
        c = int(rest.argmax())
        labels.append(c)
        rest[c] -= 1
    return torch.tensor(sorted(labels), dtype=torch.int64)


def infer_labels(obs: Observation, method: str = "auto") -> Tensor:
    """The batch's labels from the last layer's gradient -> (B,) int64, sorted, on the
    target's device. ``method``: "auto" (iDLG for B = 1; "counts" for B > 1 when the last
    layer has a bias, else "llg"), "counts" or "llg"."""
    if method not in METHODS:
        raise unknown("label method", method, METHODS)
    w_name, b_name = last_linear(obs)
    device = obs.target[w_name].device
    dw, _ = last_linear_gradient(obs)
    row_sums = dw.sum(dim=1)
    if obs.batch_size == 1 and method == "auto":
        return row_sums.argmin().reshape(1).to(device)
    if method == "counts" or (method == "auto" and b_name is not None):
        return counts(obs).to(device)
    return llg(row_sums, obs.batch_size, _threshold(obs) * dw.shape[1] ** 0.5).to(device)


def labels_for(obs: Observation, method: str = "auto") -> tuple[Tensor, str]:
    """``obs.labels`` when the threat model reveals them, else inferred; with its provenance."""
    if obs.labels is not None:
        return torch.as_tensor(obs.labels).reshape(-1).long(), "given"
    return infer_labels(obs, method), "inferred"
