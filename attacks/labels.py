"""Label inference from the last layer's gradient.

For cross-entropy on softmax outputs, the last linear layer ``z = W h + b`` has
``∂L/∂b_c = (1/B) Σ_i f_i (p_ic − y_ic)`` and ``∂L/∂W_c = (1/B) Σ_i f_i (p_ic − y_ic) h_iᵀ``,
``f_i = 1`` without clipping and ``min(1, C/‖g_i‖)`` with per-example clipping to norm C.
Everything below first divides the target by ``scale`` (a negative scale flips every sign).
Without clipping ``n_c = B (p̄_c − ∂b_c)`` holds exactly (``p̄`` the batch's mean softmax
output), so counting labels is estimating ``p̄`` to within ``1/(2B)`` per class.

- **B = 1, iDLG** (Zhao et al. 2020, §3.1): only the true class has ``p_c − y_c < 0``; with
  non-negative features ``h`` (after sigmoid / ReLU / pooling of ReLU: ``lenet``, ``cnn``,
  ``resnet18``; not ``tanh-cnn``, whose classifier reads tanh outputs) its weight-gradient
  row is the only one with a negative sum: ``label = argmin_c Σ_j ∂L/∂W_cj`` (iDLG's own
  rule; summing many coordinates also averages Gaussian noise on the target). Where the
  classifier is the model's only layer (``linear``), ``h`` is the normalised input, whose
  sum has either sign, and the bias gradient p − y is read instead: ``label = argmin_c ∂b_c``.
- **B > 1, "ilrg"** (Ma et al. 2023, "Instance-wise Batch Label Restoration via Gradients in
  Federated Learning", ICLR, §3; official code github.com/BUAA-CST/iLRG, ``methods.py``),
  as published: each class's embedding ``ê_c = ∂W_c / ∂b_c``, its posterior
  ``q_c = softmax(W ê_c + b)``, then the C + 1 linear equations ``Σ_c n_c = B`` and
  ``Σ_j n_j q_jc − n_c = B ∂b_c`` (``Σ_j n_j q_jc`` standing in for ``Σ_i p_ic``) solved
  with the Moore–Penrose pseudo-inverse; negatives are set to 0, the rest rounded and the
  sum corrected by ±1 where rounding moved most. It needs a bias (``∂b``); without one
  "llg" runs instead. ``ê_c`` is class c's mean feature when the other examples' posteriors
  for c are negligible beside the class's own (``B p̄_c ≪ n_c``), and the system is exact
  when each class's examples also share one posterior. At B ≫ C on an untrained network
  ``p̄_c ≈ 1/C ≈ n_c/B`` instead, so ``∂b_c ≈ 0`` and ``ê_c`` divides by almost nothing:
  at B = 64 of 10 classes it gets 55–66 % of the counts right on MNIST
  (``benchmarks/labels.py``).
- **B > 1, "counts"** (default when the last layer has a bias): Geng et al.'s
  bias-corrected count (2021, "Towards General Deep Leakage in Federated Learning", §3.2,
  ``n_c = B (p̄_c − ∂b_c)``) with ``p̄`` from iLRG's linear system, each class's posterior
  taken from whichever source is well posed, and clip factors:

  1. *Batch-mean feature* from the rank-one fit ``∂W ≈ ∂b ĥᵀ``, weighted:
     ``ĥ = Σ_c (∂b_c/F_c) ∂W_c / Σ_c ∂b_c²/F_c`` (``F_c = f_c n_c``). With every posterior
     equal to ``π`` the rows say ``B ∂W_c = B π_c h̄ − F_c m_c``: the class means
     ``m_c = ĥ + B (∂b_c ĥ − ∂W_c) / F_c`` follow from the batch mean ``ĥ``, but the rows
     do not fix ``ĥ`` itself (a shift of it trades against the class means' offsets); the
     weights pick the ``ĥ`` that minimises their spread ``Σ_c F_c ‖m_c − ĥ‖²``. When the
     classifier's inputs are non-negative (ReLU, sigmoid: every one is ≥ 0 on the synthetic
     inputs of step 4) and the message is noiseless, ``m_c ≥ 0`` bounds ``ĥ`` from below,
     ``ĥ ≥ max_c B ∂W_c / (π_c Σ_j F_j)`` over the classes with ``B π_c ≥ ½`` (smaller
     masses make the bound a ratio of rounding errors). On untrained networks, whose
     logits barely vary across inputs, ``π = softmax(W ĥ + b)`` is ``p̄`` to within 1/(2B).
  2. *Class posteriors*: ``q_c = softmax(W m_c + b)``, or iLRG's ``softmax(W ê_c + b)``
     where ``ê_c`` is well conditioned: ``ê_c`` extrapolates from two sums of sizes ``n_c``
     (the class's own examples) and ``B p̄_c`` (the rest) by their difference ``B |∂b_c|``,
     so it is used where ``(F_c + π_c Σ_j F_j) / (B |∂b_c|) < WELL_CONDITIONED``. (A class
     the network predicts for half the batch, as an untrained ``lenet`` does, is of this
     kind: its class mean is not identifiable, iLRG's embedding is a posterior-weighted
     batch mean, which is what its row needs.)
  3. *Counts*: ``[(Qᵀ − I) diag(f); 1ᵀ] n = [B ∂b; B]`` in least squares (iLRG's system
     with ``F_j = f_j n_j`` in place of ``n_j``).
  4. *Clip factors* (with clipping only): ``f_c = min(1, C / ν_c)`` with ``ν_c`` the norm
     of a class-c example's gradient: ``ν_c² = ‖g_c‖² (‖m_c‖² + 1) (1 + ρ(g_c))``,
     ``g_c = q_c − e_c``; the first factors are the last layer's own share, ``ρ(g)`` the
     ratio of the rest of the network's squared gradient norm to the last layer's for an
     example whose logits receive ``g``, averaged over ``SYNTHETIC_INPUTS`` uniform-noise
     inputs (``ρ(g) = gᵀ K g / ‖g‖²`` with ``K`` the mean, over the inputs, of the Gram
     matrix of the logits' gradients below the last layer divided by ``‖h‖² + 1``).

  The estimate is the fixed point of steps 1–4 (``ITERATIONS`` rounds from ``f = 1`` and
  every ``q_c = π``; a round that meets a non-finite number, as heavy noise can cause,
  stops them); it is "ilrg" where every class is well conditioned and nothing is clipped.
  Where the clearly present classes' own posteriors ``q_cc`` (iLRG's) average above
  ``CONFIDENT``, the network classifies its batch: an example's pull on ``∂b`` shrinks
  with ``1 − p_{i,y_i}``, the columns of the system vanish and it no longer determines the
  counts. There Geng et al.'s estimate runs unchanged — ``p̄`` the plain mean of the present
  classes' ``softmax(W ê_c + b)``, and with clipping one factor ``f``, the smallest
  ``−B ∂b_c / (1 − B p̄_c)`` over them (a class seen once) — whose equal weighting of
  present classes is the prior that fits small batches of distinct classes.
  Labels then follow as before: every clearly negative class gets one slot (it is certainly
  present: LLG's first rule) and the remaining slots go one at a time to the class with the
  largest unexplained count. What it cannot do: on a trained network posteriors differ from
  example to example within a class, so a class's mean posterior is not the posterior of
  its mean feature (Jensen's gap), and a confidently classified example barely moves the
  gradient at all. At B = 64 on MNIST after 300 SGD steps, even an oracle told each
  class's true mean feature and count gets only 68–76 % of the counts right that way
  (``benchmarks/labels.py``, row ``class-oracle``), so no class-level estimator (this one,
  iLRG) reaches exact counts there.
- **B > 1, "llg"** (Wainakh et al. 2022, "User-Level Label Leakage from Gradients in
  Federated Learning", §4; fallback without a bias): negative classes first, then fill
  greedily with the most negative signal, adding the per-example *impact*
  ``m = −Σ_{s_c<0} s_c / B`` to a class each time it is taken.

"Clearly negative" means below ``−3 · noise_std / |scale|`` (the noise std of one
coordinate of ``∂b`` after dividing by ``scale``); 0 without noise. More than B such
classes: the B most negative are returned. Labels are returned sorted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.func import functional_call

from privaudit.core.errors import PrivauditError, unknown
from privaudit.core.observation import Observation

METHODS = ("auto", "counts", "ilrg", "llg")

ITERATIONS = 8  # rounds of the "counts" fixed point (it settles in 3–5)
WELL_CONDITIONED = 3.0  # iLRG's ê_c is used where (F_c + π_c ΣF) / (B |∂b_c|) is below this
SYNTHETIC_INPUTS = 8  # uniform-noise inputs: sign of the features, rest-of-network norm ratio
CONFIDENT = 0.5  # present classes' mean own posterior above which Geng's estimate is used
RATIO_CAP = 1e10  # |∂W_c / ∂b_c| is capped here (iLRG's code caps the exponent gap at 10)


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


def ratio_embeddings(dw: Tensor, db: Tensor) -> Tensor:
    """iLRG's class-wise embeddings ``ê_c = ∂W_c / ∂b_c`` (classes, d), capped at
    ``RATIO_CAP`` in magnitude (a ``∂b_c`` of exactly 0 counts as ``1 / RATIO_CAP``)."""
    den = torch.where(db == 0, torch.full_like(db, 1 / RATIO_CAP), db)
    return (dw / den[:, None]).clamp(-RATIO_CAP, RATIO_CAP)


def _classifier(obs: Observation) -> tuple[Tensor, Tensor]:
    """``(W, b)`` of the last layer at ``obs.params``, float64 on the CPU."""
    w_name, b_name = last_linear(obs)
    if b_name is None:
        raise PrivauditError("count estimation needs a bias in the last layer; use method='llg'")
    return (
        obs.params[w_name].detach().double().cpu(),
        obs.params[b_name].detach().double().cpu(),
    )


def ilrg_counts(obs: Observation) -> Tensor:
    """iLRG's real-valued class counts (module docstring, "ilrg") -> (classes,) float64:
    ``n = A⁺ v`` with ``A = [1ᵀ; Qᵀ − I]``, ``v = [B; B ∂b]``, ``Q_j = softmax(W ê_j + b)``."""
    weight, bias = _classifier(obs)
    dw, db = last_linear_gradient(obs)
    assert db is not None
    c, b = len(db), obs.batch_size
    q = torch.softmax(ratio_embeddings(dw, db) @ weight.T + bias, dim=-1)
    a = torch.cat([torch.ones(1, c, dtype=q.dtype), q.T - torch.eye(c, dtype=q.dtype)])
    v = torch.cat([torch.tensor([float(b)], dtype=q.dtype), b * db])
    return torch.linalg.pinv(a) @ v


def round_counts(n: Tensor, total: int) -> Tensor:
    """iLRG's rounding: clamp to [0, ``total``], round, then fix the sum to ``total`` one
    count at a time, taking back where rounding added most or adding where it removed most
    (iLRG's code does each class at most once, which can leave the sum off) -> int64."""
    x = n.double().clamp(0, total)
    r = x.round()
    err = r - x
    while r.sum() > total:
        k = int(torch.where(r > 0, err, torch.full_like(err, -torch.inf)).argmax())
        r[k] -= 1
        err[k] -= 1
    while r.sum() < total:
        k = int(err.argmin())
        r[k] += 1
        err[k] += 1
    return r.long()


@dataclass
class Probe:
    """What synthetic inputs tell about the network below its classifier.

    nonneg:  every classifier input on every synthetic input is ≥ 0 (ReLU, sigmoid, pooling).
    ratio:   (classes, classes) ``K``: ``gᵀ K g / ‖g‖²`` is the squared gradient norm of the
             layers below the classifier over the classifier's own, for an example whose
             logits receive the gradient ``g``, averaged over the inputs; None unless asked.
    """

    nonneg: bool
    ratio: Tensor | None


def probe(obs: Observation, ratio: bool, inputs: int = SYNTHETIC_INPUTS) -> Probe:
    """Run ``inputs`` uniform-noise images (in [0, 1], normalised with ``obs.mean/std``)
    through the model at ``obs.params``; with ``ratio`` also backpropagate each logit on each
    of them (``inputs × classes`` backward passes)."""
    w_name, b_name = last_linear(obs)
    module = w_name.rsplit(".", 1)[0] if "." in w_name else ""
    device = obs.params[w_name].device
    gen = torch.Generator().manual_seed(0)
    x = torch.rand((inputs, *obs.input_shape), generator=gen).to(device)
    shape = (-1, *[1] * (len(obs.input_shape) - 1))
    mean = torch.as_tensor(obs.mean, dtype=x.dtype, device=device).reshape(shape)
    std = torch.as_tensor(obs.std, dtype=x.dtype, device=device).reshape(shape)
    x = (x - mean) / std
    params = {k: v.detach().requires_grad_(ratio) for k, v in obs.params.items()}
    seen: list[Tensor] = []
    hook = obs.model.get_submodule(module).register_forward_pre_hook(
        lambda _m, args: seen.append(args[0])
    )
    below = [params[k] for k in params if k not in (w_name, b_name)]
    k_sum = torch.zeros(obs.num_classes, obs.num_classes, dtype=torch.float64)
    try:
        with torch.set_grad_enabled(ratio):
            if not (ratio and below):  # the features' sign only: one batched pass
                functional_call(obs.model, params, (x,))
            for i in range(inputs if ratio and below else 0):
                z = functional_call(obs.model, params, (x[i : i + 1],)).reshape(-1)
                h2 = float(seen[-1].detach().double().square().sum()) if seen else 0.0
                rows = []
                for c in range(obs.num_classes):
                    g = torch.autograd.grad(z[c], below, retain_graph=True, allow_unused=True)
                    rows.append(torch.cat([t.reshape(-1) for t in g if t is not None] or [z[:0]]))
                jac = torch.stack(rows).detach().double().cpu()
                k_sum += jac @ jac.T / (h2 + 1)
    finally:
        hook.remove()
    nonneg = bool(seen) and all(bool((t >= 0).all()) for t in seen)
    return Probe(nonneg=nonneg, ratio=k_sum / inputs if ratio else None)


def geng_counts(obs: Observation) -> Tensor:
    """Geng et al.'s count estimate ``n_c = B (p̄_c − ∂b_c / f)`` with ``p̄`` the mean of the
    clearly present classes' posteriors ``softmax(W ê_c + b)`` and, with clipping, ``f`` the
    smallest ``−B ∂b_c / (1 − B p̄_c)`` over them (a class seen once) -> (classes,) float64."""
    weight, bias = _classifier(obs)
    dw, db = last_linear_gradient(obs)
    assert db is not None
    b = obs.batch_size
    present = (db < -_threshold(obs)).nonzero().flatten()
    if len(present) == 0:
        present = db.argmin().reshape(1)
    feats = ratio_embeddings(dw[present], db[present])
    p_bar = torch.softmax(feats @ weight.T + bias, dim=-1).mean(0)
    f = 1.0
    if obs.clip is not None:
        pc = p_bar[present]
        ok = pc < 1.0 / b
        if ok.any():
            f = float((-b * db[present][ok] / (1 - b * pc[ok])).min().clamp(1e-12, 1.0))
    return b * (p_bar - db / f)


def estimated_counts(obs: Observation) -> Tensor:
    """Real-valued class counts -> (classes,) float64: the fixed point of the "counts"
    estimator (module docstring, steps 1–4), or :func:`geng_counts` where the present
    classes are confidently classified."""
    weight, bias = _classifier(obs)
    dw, db = last_linear_gradient(obs)
    assert db is not None
    c, b = len(db), obs.batch_size
    eye = torch.eye(c, dtype=torch.float64)
    clipped = obs.clip is not None
    q_ilrg = torch.softmax(ratio_embeddings(dw, db) @ weight.T + bias, dim=-1)
    present = (db < -_threshold(obs)).nonzero().flatten()
    if len(present) == 0:
        present = db.argmin().reshape(1)
    if float(q_ilrg[present, present].mean()) > CONFIDENT:
        return geng_counts(obs)
    net = probe(obs, ratio=clipped)
    h = dw.T @ db / (db @ db).clamp_min(1e-300)
    pi = torch.softmax(weight @ h + bias, dim=-1)
    q = pi.expand(c, c)
    f = torch.ones(c, dtype=torch.float64)
    rhs = torch.cat([b * db, torch.tensor([float(b)], dtype=torch.float64)])
    bound = net.nonneg and not obs.noise_std
    n = b * (pi - db)  # Geng et al.'s form with the unweighted fit: the answer if a round fails
    for _ in range(ITERATIONS):
        a = torch.cat([(q.T - eye) * f, torch.ones(1, c, dtype=torch.float64)])
        if not (torch.isfinite(a).all() and torch.isfinite(rhs).all()):
            break
        n = torch.linalg.lstsq(a, rhs[:, None]).solution[:, 0]
        big_f = f * n.clamp(min=0.5)
        w = db / big_f
        h = (w[:, None] * dw).sum(0) / (w * db).sum().clamp_min(1e-300)
        mass = pi * big_f.sum()  # Σ_i f_i p_ic under the last round's π
        held = b * pi >= 0.5  # classes the network gives at least half an example's mass
        if bound and held.any():
            h = torch.maximum(h, (b * dw[held] / mass[held, None]).max(0).values)
        pi = torch.softmax(weight @ h + bias, dim=-1)
        m = h + b * (db[:, None] * h - dw) / big_f[:, None]
        cond = (big_f + pi * big_f.sum()) / (b * db).abs()
        q = torch.where(
            (cond < WELL_CONDITIONED)[:, None], q_ilrg, torch.softmax(m @ weight.T + bias, -1)
        )
        if clipped:
            assert net.ratio is not None
            g = q - eye
            g2 = g.square().sum(1)
            rest = (g @ net.ratio * g).sum(1) / g2.clamp_min(1e-300)
            norm = (g2 * (m.square().sum(1) + 1) * (1 + rest)).sqrt()
            f = (float(obs.clip) / norm.clamp_min(1e-300)).clamp(max=1.0)
    return n


def _assign(n: Tensor, obs: Observation) -> Tensor:
    """Labels from real-valued counts ``n``: one slot per clearly present class, the rest by
    largest unexplained count -> (B,) int64, sorted."""
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
        k = int(rest.argmax())
        labels.append(k)
        rest[k] -= 1
    return torch.tensor(sorted(labels), dtype=torch.int64)


def counts(obs: Observation) -> Tensor:
    """Labels from :func:`estimated_counts` -> (B,) int64, sorted."""
    return _assign(estimated_counts(obs), obs)


def ilrg(obs: Observation) -> Tensor:
    """Labels from :func:`ilrg_counts` with iLRG's rounding -> (B,) int64, sorted."""
    r = round_counts(ilrg_counts(obs), obs.batch_size)
    return torch.repeat_interleave(torch.arange(len(r)), r)


def infer_labels(obs: Observation, method: str = "auto") -> Tensor:
    """The batch's labels from the last layer's gradient -> (B,) int64, sorted, on the
    target's device. ``method``: "auto" (iDLG for B = 1; "counts" for B > 1 when the last
    layer has a bias, else "llg"), "counts", "ilrg" (iLRG as published; "llg" without a
    bias) or "llg". "auto" never picks "ilrg": "counts" is iLRG wherever iLRG's class
    embeddings are well conditioned and replaces them only where they are not."""
    if method not in METHODS:
        raise unknown("label method", method, METHODS)
    w_name, b_name = last_linear(obs)
    device = obs.target[w_name].device
    dw, _ = last_linear_gradient(obs)
    row_sums = dw.sum(dim=1)
    if obs.batch_size == 1 and method == "auto":
        names = [n for n, _ in obs.model.named_parameters()]
        if b_name is not None and names[:1] == [w_name]:
            # the classifier reads the (normalised, signed) input itself: iDLG's principle on
            # the bias, whose gradient is p − y exactly
            return last_linear_gradient(obs)[1].argmin().reshape(1).to(device)
        return row_sums.argmin().reshape(1).to(device)
    if method == "ilrg" and b_name is not None:
        return ilrg(obs).to(device)
    if method == "counts" or (method == "auto" and b_name is not None):
        return counts(obs).to(device)
    return llg(row_sums, obs.batch_size, _threshold(obs) * dw.shape[1] ** 0.5).to(device)


def labels_for(obs: Observation, method: str = "auto") -> tuple[Tensor, str]:
    """``obs.labels`` when the threat model reveals them, else inferred; with its provenance."""
    if obs.labels is not None:
        return torch.as_tensor(obs.labels).reshape(-1).long(), "given"
    return infer_labels(obs, method), "inferred"
