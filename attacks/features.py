"""Per-example features and labels of a batch, from the classifier's gradient.

For a last layer ``z = W h + c`` under the batch-mean cross-entropy, the observed gradient
(divided by ``scale``) is

    ∂W = (1/B) Σ_b f_b δ_b h_bᵀ = (1/B) Δᵀ H,   ∂c = (1/B) Σ_b f_b δ_b,
    δ_b = softmax(W h_b + c) − e_{y_b},

with ``f_b = 1`` without clipping and ``f_b = min(1, C / ‖g_b‖)`` with per-example
clipping. Every feature vector ``h_b`` is a row of ``H`` (B × d) and so lies in the row
space of ``∂W``; when ``Δ`` has rank B (B < classes, as the softmax's rows sum to one) that
space is exactly ``span{h_b}``. Writing ``H = A R`` with ``R`` the top-B right singular
vectors of ``∂W`` leaves B² unknowns (A) — plus B clip factors — against classes × (B + 1)
equations, a small nonlinear least-squares problem:

    min_A (‖(1/B) Δ(A)ᵀ A − ∂W Rᵀ‖² + ‖(1/B) Σ_b f_b δ_b(A) − ∂c‖²) / (‖∂W Rᵀ‖² + ‖∂c‖²),

solved by Levenberg–Marquardt in float64 from ``starts`` points
(``h_b ≈ ∂W_{y_b} / ∂c_{y_b}``, the B = 1 identity, then perturbations of it). A residual
at float rounding means the per-example
features ``h_b`` — and with them each example's logits and prediction — are recovered
exactly: the batch decouples into B single-example problems (:func:`privaudit.attacks.ig.ig`
matches each dummy example's features to its own ``h_b``).

**Anchors: labels without a search, for sparse non-negative features.** ``H = A R`` means
``R = A⁻¹ H``: column j of ``R`` is ``Σ_b H_bj g_b`` with ``g_b`` the b-th column of
``G = A⁻¹``. Features after a ReLU are non-negative and sparse, so many coordinates j are
active in one example only (anchors, as in separable non-negative matrix factorisation:
Arora et al. 2012, "Computing a Nonnegative Matrix Factorization — Provably", §4); every
anchor column of ``R`` points along its example's ``g_b``. :meth:`System.anchors` groups
the columns of ``R`` that are collinear to within ``ANCHOR_TOL``; B of the groups give
``G = Ĝ diag(t)``, up to positive scales ``t``. Then ``Δᵀ = B M G`` (from
``(1/B) Δᵀ A = M``): each ``δ_b = B t_b (M Ĝ)_b``, the bias equation
``(1/B) Σ_b δ_b = ∂c`` is linear in ``t`` (least squares), and since
``δ_b = softmax − e_{y_b}`` is negative at its label only, ``y_b = argmin_c δ_bc``. That
gives labels and ``A = G⁻¹`` in closed form — on trained networks too, where a confidently
classified example barely moves ``∂c`` and the count estimate fails. A pair of mixed
columns can be collinear by chance, so up to B + ``ANCHOR_EXTRA`` groups are candidates,
and of the B-subsets with every ``t_b > 0`` the one whose closed form leaves the smallest
residual is polished by one Levenberg–Marquardt run. Dense features (sigmoid) or noise on
the message leave no anchor groups; the count path below then runs alone.

This is the embedding-recovery idea of iLRG (Ma et al. 2023, "Instance-wise Batch Label
Restoration via Gradients in Federated Learning", ICLR, §3), solved here as one joint
least-squares problem in the coefficients ``A`` rather than iLRG's closed form for
untrained networks. The labels are part of the model: starting from the count estimate
(:mod:`.labels`), a local search moves one example's label to another class — the
``MOVES`` moves the real-valued count estimate ``n_c`` favours most (from the class most
over-represented to the most under-represented) — and keeps the best move that lowers the
residual, stopping at one that solves the system (``label_search`` rounds). Where the
system has no exact solution — noise on the message, duplicate labels on an untrained
network (equal ``δ_b`` merge rows of ``Δ``, so the rank falls below B), a local minimum —
``exact`` is False and the residual says by how much.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from privaudit.core.errors import PrivauditError
from privaudit.core.observation import Observation

from .labels import estimated_counts, labels_for, last_linear, last_linear_gradient

MOVES = 16  # label moves tried per search round, the most plausible first
ANCHOR_TOL = 1e-6  # 1 − cosine within which two columns of R are one anchor direction
ANCHOR_MIN = 2  # columns an anchor group needs (one column is collinear with itself)
ANCHOR_EXTRA = 4  # groups beyond B kept as candidates (a pair can be collinear by chance)
ANCHOR_SUBSETS = 5000  # at most this many B-subsets of the candidates are checked
DEFAULT_TOL = 1e-9  # squared relative residual; float32 gradients leave 1e-17…1e-10
FLOOR = 1e-20  # a solve stops here: nothing left to gain


@dataclass
class Features:
    """Recovered per-example features of one Observation's batch, in label order."""

    h: Tensor  # (B, d) float32 on the CPU: the last layer's input per example
    labels: Tensor  # (B,) int64, sorted: example b has label labels[b]
    residual: float  # squared relative residual of the system above
    rank: int  # numerical rank of ∂W (B when every example contributes)
    exact: bool  # residual <= tol: the features solve the gradient equations
    anchors: bool = False  # labels and features from the anchor groups (module docstring)

    def meta(self) -> dict:
        return {
            "residual": self.residual,
            "rank": self.rank,
            "exact": self.exact,
            "anchors": self.anchors,
        }


def feature_targets(
    feats: Sequence[Features], restarts: int, device: torch.device, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """What dummy examples' features are fitted to: each observation's recovered ``h``,
    repeated per restart (K·R, B, d), and the inverse of each ``‖h_b‖²`` (K·R, B)."""
    target = torch.stack([f.h for f in feats]).to(device, dtype)
    target = target.repeat_interleave(restarts, dim=0)
    return target, 1 / target.square().sum(-1).clamp_min(1e-30)


def classifier_module(obs: Observation) -> str:
    """The name of the submodule whose input is ``h`` (the owner of the last 2-D weight)."""
    return last_linear(obs)[0].rsplit(".", 1)[0]


def applicable(obs: Observation) -> str | None:
    """Why :func:`recover_features` cannot run on ``obs`` (None when it can)."""
    if obs.terms:
        return "a sum of gradient terms"
    try:
        _, b_name = last_linear(obs)
    except PrivauditError as e:  # no classifier layer
        return str(e)
    if b_name is None:
        return "the last layer has no bias"
    if obs.batch_size >= obs.num_classes:
        return f"B = {obs.batch_size} ≥ classes = {obs.num_classes}: Δ cannot have rank B"
    return None


class System:
    """The equations above for one Observation, in float64 on the CPU."""

    def __init__(self, obs: Observation, tol: float):
        self.tol = tol
        w_name, b_name = last_linear(obs)
        dw, db = last_linear_gradient(obs)
        assert db is not None
        self.b = int(obs.batch_size)
        self.w = obs.params[w_name].detach().double().cpu()
        self.c = obs.params[b_name].detach().double().cpu()
        self.db = db
        self.dw = dw
        _, s, vh = torch.linalg.svd(dw, full_matrices=False)
        self.s = s
        self.r = vh[: self.b]  # (B, d)
        self.m = dw @ self.r.T  # (classes, B)
        self.k = self.w @ self.r.T  # (classes, B): logits = A kᵀ + c
        self.norm = float(self.m.square().sum() + db.square().sum()) ** 0.5 or 1.0
        self.clipped = obs.clip is not None

    def features(
        self, a: Tensor, labels: Tensor, residual: float, anchors: bool = False
    ) -> Features:
        """The :class:`Features` of coefficients ``a`` for these labels."""
        return Features(
            h=(a @ self.r).float(),
            labels=labels,
            residual=residual,
            rank=self.rank(),
            exact=residual <= self.tol,
            anchors=anchors,
        )

    def rank(self, rtol: float = 1e-5) -> int:
        return int((self.s > rtol * self.s[0]).sum()) if len(self.s) else 0

    def start(self, labels: Tensor) -> Tensor:
        """``h_b ≈ ∂W_y / ∂c_y`` for each example's label, in the coefficients of R."""
        den = self.db[labels].clone()
        den[den.abs() < 1e-30] = -1e-30
        return (self.dw[labels] / den[:, None]) @ self.r.T

    def residuals(self, v: Tensor, y: Tensor, jacobian: bool = True) -> tuple[Tensor, Tensor]:
        """The equations' residuals relative to the target's norm, and their Jacobian, at
        ``v`` = A flattened (then the B clip-factor logits ``u`` when clipped). Closed form:
        with ``D_b = f_b (p_b − y_b)``, ``∂D_b/∂a_b = f_b (diag p_b − p_b p_bᵀ) K``."""
        b = self.b
        a = v[: b * b].view(b, b)
        p = torch.softmax(a @ self.k.T + self.c, -1)  # (B, C)
        f = torch.sigmoid(v[b * b :]) if self.clipped else torch.ones(b, dtype=v.dtype)
        d = (p - y) * f[:, None]
        r = torch.cat([(d.T @ a / b - self.m).flatten(), d.sum(0) / b - self.db]) / self.norm
        if not jacobian:
            return r, r
        jp = (torch.diag_embed(p) - p[:, :, None] * p[:, None, :]) @ self.k  # (B, C, B)
        g = jp * f[:, None, None]  # ∂D_b / ∂a_b: (B, C, B)
        # ∂r1[c, j] / ∂A[q, i] = (g[q, c, i] A[q, j] + D[q, c] δ_ij) / B
        j1 = torch.einsum("qci,qj->cjqi", g, a)
        j1 = j1 + torch.einsum("qc,ji->cjqi", d, torch.eye(b, dtype=v.dtype))
        j2 = g.permute(1, 0, 2)  # ∂r2[c] / ∂A[q, i]
        jac = torch.cat([j1.reshape(-1, b * b), j2.reshape(-1, b * b)]) / b
        if self.clipped:  # ∂/∂u_q: D_q · f'(u_q)/f(u_q)
            dd = d * (1 - f)[:, None]  # (B, C)
            ju1 = torch.einsum("qc,qj->cjq", dd, a).reshape(-1, b)
            jac = torch.cat([jac, torch.cat([ju1, dd.T]) / b], dim=1)
        return r, jac / self.norm

    def clip_logits(self, a: Tensor, y: Tensor) -> Tensor:
        """Starting clip factors for coefficients ``a``: the least-squares fit of the bias
        equation ``(1/B) Σ_b f_b δ_b = ∂c``, clamped to [1e-4, 1 − 1e-4], as logits."""
        d = torch.softmax(a @ self.k.T + self.c, -1) - y  # (B, C)
        f = torch.linalg.lstsq(d.T / self.b, self.db[:, None]).solution.flatten()
        return torch.logit(f.clamp(1e-4, 1 - 1e-4))

    def fit(self, a: Tensor, labels: Tensor, iterations: int) -> tuple[float, Tensor]:
        """One Levenberg–Marquardt run from coefficients ``a`` for these labels ->
        (squared relative residual, A)."""
        y = F.one_hot(labels, self.w.shape[0]).double()
        v = a.flatten()
        if self.clipped:
            v = torch.cat([v, self.clip_logits(a, y)])
        fn = lambda v, jac=True: self.residuals(v, y, jac)  # noqa: E731
        value, v = levenberg_marquardt(fn, v, iterations, FLOOR)
        return value, v[: self.b * self.b].view(self.b, self.b)

    def solve(
        self, labels: Tensor, starts: int, iterations: int, gen: torch.Generator
    ) -> tuple[float, Tensor]:
        """Best of up to ``starts`` Levenberg–Marquardt runs for these labels (ending at the
        first that meets ``tol``) -> (squared relative residual, A)."""
        base = self.start(labels)
        spread = float(base.norm(dim=1).mean()) / self.b**0.5
        best: tuple[float, Tensor] = (float("inf"), base)
        for s in range(starts):
            a = base + (0.3 * s * spread) * torch.randn(base.shape, generator=gen, dtype=base.dtype)
            best = min(best, self.fit(a, labels, iterations), key=lambda r: r[0])
            if best[0] <= self.tol:
                break
        return best

    def anchor_groups(self) -> list[Tensor]:
        """Unit directions of the largest groups of collinear columns of ``R`` (at most
        B + ``ANCHOR_EXTRA``, each of at least ``ANCHOR_MIN`` columns), largest first."""
        norms = self.r.norm(dim=0)
        x = self.r[:, norms > 1e-4 * norms.max()]
        x = x / x.norm(dim=0)
        counts = torch.cat([(x[:, i : i + 512].T @ x > 1 - ANCHOR_TOL).sum(1)
                            for i in range(0, x.shape[1], 512)])  # fmt: skip
        alive = torch.ones(x.shape[1], dtype=torch.bool)
        groups = []
        while len(groups) < self.b + ANCHOR_EXTRA:
            k = int(torch.where(alive, counts, 0).argmax())
            members = alive & (x[:, k] @ x > 1 - ANCHOR_TOL)
            if int(members.sum()) < ANCHOR_MIN:
                break
            groups.append(x[:, members].mean(1))
            alive &= ~members
        return groups

    def anchors(self) -> tuple[Tensor, Tensor] | None:
        """Labels (sorted) and coefficients ``A`` (rows in label order) in closed form from
        the anchor groups (module docstring): of the B-subsets of the candidate groups
        whose scales ``t`` are all positive, the one whose closed-form solution leaves the
        smallest residual; None without one."""
        groups = self.anchor_groups()
        if len(groups) < self.b:
            return None
        subsets = itertools.combinations(range(len(groups)), self.b)
        if math.comb(len(groups), self.b) > ANCHOR_SUBSETS:
            subsets = iter([tuple(range(self.b))])
        best: tuple[float, Tensor, Tensor] | None = None
        for subset in subsets:
            g = torch.stack([groups[i] for i in subset], 1)  # (B, B): columns along g_b
            mg = self.m @ g  # (classes, B)
            t = torch.linalg.lstsq(mg, self.db[:, None]).solution.flatten()
            if bool((t <= 0).any()):
                continue
            labels = (mg * t).argmin(0)  # δ_b ∝ t_b (M Ĝ)_b is negative at its label only
            order = labels.argsort(stable=True)
            labels, a = labels[order], torch.linalg.inv(g * t)[order]
            y = F.one_hot(labels, self.w.shape[0]).double()
            v = torch.cat([a.flatten(), self.clip_logits(a, y)]) if self.clipped else a.flatten()
            r, _ = self.residuals(v, y, jacobian=False)
            if best is None or float(r @ r) < best[0]:
                best = (float(r @ r), labels, a)
        return None if best is None else best[1:]


def levenberg_marquardt(
    fn: Callable[..., tuple[Tensor, Tensor]], v: Tensor, iterations: int, floor: float
) -> tuple[float, Tensor]:
    """Minimise ``‖r(v)‖²`` by Levenberg–Marquardt (Marquardt's diagonal scaling, the damping
    divided by 3 after an accepted step, multiplied by 4 after a rejected one); ``fn(v)``
    returns ``(r, ∂r/∂v)``, ``fn(v, False)`` only ``r``. Stops at ``floor`` or when no step
    helps -> (‖r(v)‖², v)."""
    r, jac = fn(v)
    value = float(r @ r)
    mu = 1e-3
    eye = torch.eye(len(v), dtype=v.dtype)
    for _ in range(iterations):
        if value <= floor:
            break
        jtj, jtr = jac.T @ jac, jac.T @ r
        while mu < 1e8:
            step = torch.linalg.solve(jtj + mu * (torch.diag(jtj.diagonal()) + 1e-12 * eye), -jtr)
            r2, _ = fn(v + step, False)
            value2 = float(r2 @ r2)
            if value2 < value:
                v, value, mu = v + step, value2, max(mu / 3, 1e-12)
                r, jac = fn(v)
                break
            mu *= 4
        else:
            break
    return value, v


def recover_features(
    obs: Observation,
    labels: Tensor,
    *,
    starts: int = 4,
    iterations: int = 100,
    label_search: int = 2,
    tol: float = DEFAULT_TOL,
    seed: int = 0,
    anchors: bool = True,
) -> Features:
    """Solve for the batch's features (module docstring), starting from ``labels`` ((B,)
    int64, e.g. :func:`.labels.infer_labels`); ``label_search`` rounds of single-label moves
    (0: keep ``labels``). With ``anchors``, the anchor solution is tried first (with
    ``label_search=0`` only if its labels are ``labels``): it is returned when it solves the
    equations, and kept where the count path ends with a larger residual. Call
    :func:`applicable` first."""
    system = System(obs, tol)
    gen = torch.Generator().manual_seed(int(seed))
    labels = torch.as_tensor(labels).reshape(-1).long().cpu().sort().values
    anchored: Features | None = None
    closed = system.anchors() if anchors else None
    if closed is not None and (label_search > 0 or torch.equal(closed[0], labels)):
        residual, a = system.fit(closed[1], closed[0], iterations)
        anchored = system.features(a, closed[0], residual, anchors=True)
        if anchored.exact:
            return anchored
    residual, a = system.solve(labels, starts, iterations, gen)
    tried = {tuple(labels.tolist())}
    classes = system.w.shape[0]
    expected = estimated_counts(obs)
    for _ in range(label_search):
        if residual <= tol:
            break
        gap = expected - torch.bincount(labels, minlength=classes).double()
        moves = sorted(
            ((float(gap[new] - gap[old]), old, new)
             for old in set(labels.tolist()) for new in range(classes) if new != old),
            reverse=True,
        )  # fmt: skip
        found = None
        for _, old, new in moves[:MOVES]:
            cand = labels.tolist()
            cand.remove(old)
            key = tuple(sorted([*cand, new]))
            if key in tried:
                continue
            tried.add(key)
            r, a2 = system.solve(torch.tensor(key), 1, iterations // 2, gen)
            if r < residual:
                residual, a, found = r, a2, torch.tensor(key)
                if r <= tol:
                    break
        if found is None:
            break
        labels = found
    if anchored is not None and anchored.residual < residual:
        return anchored
    return system.features(a, labels, residual)


def batch_features(
    obs: Sequence[Observation], seed: int = 0, label_method: str = "auto"
) -> list[Features] | None:
    """:func:`recover_features` for each observation (seed ``seed + k``) from its given or
    inferred labels, searching labels only where they were inferred; None when one of the
    observations does not allow the recovery (:func:`applicable`)."""
    if any(applicable(o) is not None for o in obs):
        return None
    out = []
    for k, o in enumerate(obs):
        labels, source = labels_for(o, label_method)
        search = 0 if source == "given" else 2
        out.append(recover_features(o, labels, label_search=search, seed=seed + k))
    return out
