"""Shared machinery of the optimisation attacks: one batched problem for many Observations.

K Observations that share one architecture are stacked along a leading dimension and
their dummy gradients are computed in one call, ``vmap`` over observations of
``torch.func.grad`` of the batch loss w.r.t. the parameters (``functional_call``).
The matching losses are therefore independent and are summed: the gradient of the sum
w.r.t. observation k's dummy images is exactly the gradient of observation k's own loss.
Restarts are further rows of the same stack (row ``k * R + r``).

With per-example clipping (``clip_aware``) the dummy gradient models the mechanism:
per-example gradients (a nested ``vmap``), each scaled by ``min(1, C / (‖g‖ + 1e-12))``
(the rule of :func:`privaudit.grads.clip_rows`), then averaged over the batch, then
multiplied by ``scale``.
Everything stays differentiable w.r.t. the dummy images (second order through
``torch.func.grad``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from privaudit.core import text
from privaudit.core.errors import PrivauditError
from privaudit.core.observation import Observation

GradFn = Callable[[Tensor, Tensor], Tensor]
SMALL_CONV = 16  # see conv_backend


def as_list(observations: Observation | Sequence[Observation]) -> list[Observation]:
    """Accept one Observation or a sequence; reject an empty one."""
    obs = [observations] if isinstance(observations, Observation) else list(observations)
    if not obs:
        raise PrivauditError("no observations to attack: pass at least one Observation")
    return obs


def working_device(obs: Sequence[Observation], device: torch.device | str | None) -> torch.device:
    """``device`` if given, else the device of the first observation's parameters."""
    if device is not None:
        return torch.device(device)
    return next(iter(obs[0].params.values())).device


def _channel_view(values: tuple[float, ...], input_shape: tuple[int, ...]) -> Tensor:
    t = torch.as_tensor(values, dtype=torch.float32)
    return t.reshape(-1, *([1] * (len(input_shape) - 1))) if len(input_shape) > 1 else t


@dataclass
class Stack:
    """K compatible Observations as one batched problem (leading dim K on every tensor)."""

    model: nn.Module
    names: tuple[str, ...]
    params: dict[str, Tensor]  # (K, *shape)
    target: Tensor  # (K, D): the targets flattened in ``names`` order
    scale: Tensor  # (K,)
    clip: Tensor  # (K,) C, 1.0 where the observation is unclipped
    has_clip: Tensor  # (K,) bool
    mean: Tensor  # (K, C, 1, 1): broadcasts against one example
    std: Tensor  # (K, C, 1, 1)
    batch_size: int
    input_shape: tuple[int, ...]
    num_classes: int

    @property
    def k(self) -> int:
        return int(self.scale.shape[0])

    @property
    def device(self) -> torch.device:
        return self.scale.device

    @property
    def dtype(self) -> torch.dtype:
        return self.scale.dtype

    def repeat(self, r: int) -> Stack:
        """Each observation ``r`` times in a row (restarts): row ``k * r + j``."""
        if r == 1:
            return self
        rep = lambda t: t.repeat_interleave(r, dim=0)  # noqa: E731
        return replace(
            self,
            params={n: rep(v) for n, v in self.params.items()},
            target=rep(self.target),
            scale=rep(self.scale),
            clip=rep(self.clip),
            has_clip=rep(self.has_clip),
            mean=rep(self.mean),
            std=rep(self.std),
        )


def stack_observations(
    observations: Sequence[Observation], device: torch.device | str | None = None
) -> Stack:
    """Check that the observations share one architecture and stack them on ``device``."""
    obs = list(observations)
    dev = working_device(obs, device)
    first = obs[0]
    model = copy.deepcopy(first.model).eval().to(dev)
    names = tuple(n for n, _ in model.named_parameters())
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    for i, o in enumerate(obs):
        if int(o.batch_size) < 1:
            raise PrivauditError(
                f"observation {i} has batch_size {o.batch_size}: an empty batch leaves nothing "
                "to reconstruct (privaudit.attacks.run_attack answers it with an empty result)"
            )
        if type(o.model) is not type(first.model):
            raise PrivauditError(
                f"observation {i} uses {type(o.model).__name__}, observation 0 uses "
                f"{type(first.model).__name__}: batch only observations of one architecture"
            )
        for what in ("batch_size", "input_shape", "num_classes"):
            if _key(getattr(o, what)) != _key(getattr(first, what)):
                raise PrivauditError(
                    f"observation {i} has {what}={getattr(o, what)}, observation 0 has "
                    f"{getattr(first, what)}: batch only observations that agree on it"
                )
        for field_name in ("params", "target"):
            d = getattr(o, field_name)
            if set(d) != set(names) or any(tuple(d[n].shape) != shapes[n] for n in names):
                raise PrivauditError(
                    f"observation {i}: {field_name} do not match the model's parameters "
                    f"(expected names and shapes {shapes})"
                )
    dtype = next(iter(first.params.values())).dtype

    def stk(field_name: str) -> dict[str, Tensor]:
        return {
            n: torch.stack([getattr(o, field_name)[n].detach().to(dev, dtype) for o in obs])
            for n in names
        }

    shape = tuple(first.input_shape)
    return Stack(
        model=model,
        names=names,
        params=stk("params"),
        target=torch.cat([v.reshape(len(obs), -1) for v in stk("target").values()], dim=1),
        scale=torch.tensor([float(o.scale) for o in obs], device=dev, dtype=dtype),
        clip=torch.tensor([float(o.clip or 1.0) for o in obs], device=dev, dtype=dtype),
        has_clip=torch.tensor([o.clip is not None for o in obs], device=dev),
        mean=torch.stack([_channel_view(o.mean, shape) for o in obs]).to(dev, dtype),
        std=torch.stack([_channel_view(o.std, shape) for o in obs]).to(dev, dtype),
        batch_size=int(first.batch_size),
        input_shape=shape,
        num_classes=int(first.num_classes),
    )


@dataclass
class Problem:
    """K Observations × R restarts as one batched problem, with every observation's extra
    gradient ``terms`` (:attr:`Observation.terms`, e.g. a tracking difference) as further
    rows of the stack: row ``(k, s, r)`` is term s of observation k (s = 0 the observation
    itself), restart r. Dummy batches ("free" rows) are ordered ``(k, slot, r)``: slot 0 is
    the attacked batch, each term not sharing it has its own slot. ``target`` is (K·R, D);
    :meth:`gradient` sums each observation's terms, so the matching losses are unchanged."""

    stack: Stack  # K·S·R rows
    k: int
    terms: int  # S = 1 + len(obs.terms)
    slots: int  # distinct dummy batches per observation
    restarts: int
    gather: Tensor | None  # stack row -> free row; None when S = 1
    target: Tensor  # (K·R, D)

    def gradient(self, dummy_grad: GradFn, x: Tensor, y: Tensor) -> Tensor:
        """Free dummies ``x`` (K·slots·R, B, …), labels ``y`` -> (K·R, D)."""
        if self.gather is None:
            return dummy_grad(x, y)
        g = dummy_grad(x[self.gather], y[self.gather])
        return g.view(self.k, self.terms, self.restarts, -1).sum(1).flatten(0, 1)

    def per_problem(self, v: Tensor) -> Tensor:
        """A per-free-row quantity (K·slots·R,) summed over slots -> (K·R,)."""
        return v.view(self.k, self.slots, self.restarts).sum(1).flatten()

    def free_row(self, row: int) -> int:
        """The slot-0 free row of problem row ``row`` = k·R + r."""
        k, r = divmod(row, self.restarts)
        return (k * self.slots) * self.restarts + r


def problem(
    observations: Sequence[Observation], restarts: int, device: torch.device | str | None
) -> tuple[Problem, list[Observation]]:
    """The batched :class:`Problem`, and one Observation per free slot ``(k, slot)`` (slot 0
    the observation itself; a term's slot carries that term's parameters and signed scale —
    for label inference)."""
    obs = list(observations)
    pattern = [same for _, _, same in obs[0].terms]
    if any([same for _, _, same in o.terms] != pattern for o in obs):
        raise PrivauditError("batch only observations with the same gradient terms")
    rows, slot_obs = [], []
    for o in obs:
        rows.append(o)
        slot_obs.append(o)
        for params, coef, same in o.terms:
            term = replace(o, params=params, scale=o.scale * coef, terms=[])
            rows.append(term)
            if not same:
                slot_obs.append(term)
    s = 1 + len(pattern)
    slot_of = [0]
    for same in pattern:
        slot_of.append(0 if same else max(slot_of) + 1)
    n_slots = max(slot_of) + 1
    stack = stack_observations(rows, device).repeat(restarts)
    k = len(obs)
    gather = None
    target = stack.target
    if s > 1:
        idx = [
            (kk * n_slots + slot_of[ss]) * restarts + rr
            for kk in range(k)
            for ss in range(s)
            for rr in range(restarts)
        ]
        gather = torch.tensor(idx, device=stack.device)
        target = stack.target.view(k, s, restarts, -1)[:, 0].flatten(0, 1)
    return Problem(stack, k, s, n_slots, restarts, gather, target), slot_obs


def _key(v: object) -> object:
    """A comparable value for an int or a shape (tuple, list or torch.Size)."""
    return tuple(v) if isinstance(v, (tuple, list)) else v


def _bcast(s: Tensor, v: Tensor) -> Tensor:
    """A (K,) tensor shaped to multiply a (K, ...) tensor."""
    return s.reshape(-1, *[1] * (v.dim() - 1))


def _inputs_of(model: nn.Module, module: str) -> list[Tensor]:
    """A list that each forward pass of ``model`` appends ``module``'s input to (the
    caller pops it): the features a submodule receives, read from the same pass."""
    seen: list[Tensor] = []
    model.get_submodule(module).register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    return seen


def gradient_fn(stack: Stack, clip_aware: bool = True, features: str | None = None) -> GradFn:
    """``(x (K, B, *S) in [0, 1], y (K, B, classes) probabilities) -> (K, D)``, flattened in
    ``stack.names`` order like ``stack.target``.

    The dummy counterpart of each target: ``scale · mean_b clip(∇_θ CE(f(norm(x_b)), y_b))``;
    the per-example clip is applied only if ``clip_aware`` and the observation has ``clip``.
    Soft labels ``y`` give DLG's soft cross-entropy; one-hot ``y`` gives the ordinary one.
    With ``features`` (the name of a submodule, e.g. the classifier ``"fc"``) the function
    returns ``(gradient, inputs of that submodule (K, B, d))`` from the same forward pass.
    """
    model = stack.model
    seen = _inputs_of(model, features) if features is not None else []

    identity = bool((stack.mean == 0).all() and (stack.std == 1).all())  # e.g. DLG's LeNet

    def batch_loss(p: dict[str, Tensor], x: Tensor, y: Tensor, mean: Tensor, std: Tensor):
        logits = functional_call(model, p, (x if identity else (x - mean) / std,))
        loss = -(y * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
        return loss, (seen.pop().flatten(1) if seen else logits.new_zeros(0))

    per_example = clip_aware and bool(stack.has_clip.any())
    if not per_example:
        g_batch = grad(batch_loss, has_aux=True)

        def one(p, x, y, mean, std, clip, has):  # noqa: ARG001 - uniform signature
            return g_batch(p, x, y, mean, std)

    else:

        def example_loss(p, x, y, mean, std):
            loss, h = batch_loss(p, x.unsqueeze(0), y.unsqueeze(0), mean, std)
            return loss, h.squeeze(0) if h.numel() else h

        g_examples = vmap(grad(example_loss, has_aux=True), in_dims=(None, 0, 0, None, None))

        def one(p, x, y, mean, std, clip, has):
            gs, h = g_examples(p, x, y, mean, std)  # {name: (B, *shape)}
            sq = sum(v.reshape(v.shape[0], -1).pow(2).sum(1) for v in gs.values())
            norm = sq.clamp_min(1e-30).sqrt()
            factor = torch.where(has, (clip / (norm + 1e-12)).clamp(max=1.0), torch.ones_like(norm))
            return {n: (v * _bcast(factor, v)).mean(0) for n, v in gs.items()}, h

    args = (stack.params, stack.mean, stack.std, stack.clip, stack.has_clip)
    if stack.scale.shape[0] == 1:
        # one problem: vmap's batching rules would only add per-iteration overhead
        p1, mean1, std1, clip1, has1 = (
            {n: v[0] for n, v in a.items()} if isinstance(a, dict) else a[0] for a in args
        )

        def batched(p, x, y, mean, std, clip, has):  # noqa: ARG001 - same signature as vmap's
            g, h = one(p1, x[0], y[0], mean1, std1, clip1, has1)
            return {n: v.unsqueeze(0) for n, v in g.items()}, h.unsqueeze(0)

    else:
        batched = vmap(one)

    names, k = stack.names, stack.k
    scale = stack.scale.unsqueeze(1)

    def fn(x: Tensor, y: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        gs, h = batched(stack.params, x, y, stack.mean, stack.std, stack.clip, stack.has_clip)
        g = torch.cat([gs[n].reshape(k, -1) for n in names], dim=1) * scale
        return g if features is None else (g, h)

    return fn


def feature_fn(stack: Stack, module: str) -> Callable[[Tensor], Tensor]:
    """``x (K, B, *S) in [0, 1] -> (K, B, d)``: what each example feeds the submodule
    ``module`` (e.g. the classifier ``"fc"``) under each observation's parameters."""
    model = stack.model
    seen = _inputs_of(model, module)
    identity = bool((stack.mean == 0).all() and (stack.std == 1).all())

    def one(p: dict[str, Tensor], x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
        functional_call(model, p, (x if identity else (x - mean) / std,))
        return seen.pop().flatten(1)

    batched = vmap(one)

    def fn(x: Tensor) -> Tensor:
        return batched(stack.params, x, stack.mean, stack.std)

    return fn


def l2_distance(g: Tensor, t: Tensor) -> Tensor:
    """Per-observation ``‖g − t‖²`` over all parameters (DLG, Zhu et al. 2019, Eq. 4):
    flat ``(K, D)`` gradients -> (K,)."""
    return (g - t).pow(2).sum(1)


def cosine_distance(g: Tensor, t: Tensor) -> Tensor:
    """Per-observation ``1 − <g, t> / (‖g‖ ‖t‖)`` over the whole concatenated gradient
    (Geiping et al. 2020, Eq. 4): flat ``(K, D)`` gradients -> (K,)."""
    return 1 - torch.nn.functional.cosine_similarity(g, t, dim=1, eps=1e-30)


def total_variation(x: Tensor) -> Tensor:
    """Anisotropic TV, ``mean|∂_h x| + mean|∂_w x|`` per observation (Geiping et al. 2020,
    Eq. 4; the mean form of breaching) for ``x`` of shape (K, B, C, H, W) -> (K,)."""
    if x.dim() < 5:
        return x.new_zeros(x.shape[0])
    dx = (x[..., :, 1:] - x[..., :, :-1]).abs().flatten(1).mean(1)
    dy = (x[..., 1:, :] - x[..., :-1, :]).abs().flatten(1).mean(1)
    return dx + dy


def generators(seed: int, k: int) -> list[torch.Generator]:
    """One CPU generator per observation, seeded ``seed + index``: observation i of a batched
    run draws exactly what a run of that observation alone with ``seed + i`` draws."""
    return [torch.Generator().manual_seed(int(seed) + i) for i in range(k)]


def init_images(gens: Sequence[torch.Generator], restarts: int, stack: Stack) -> Tensor:
    """Uniform[0, 1] dummy images, (K * R, B, *S), drawn on the CPU (same on every device)."""
    shape = (restarts, stack.batch_size, *stack.input_shape)
    x = torch.cat([torch.rand(shape, generator=g) for g in gens])
    return x.to(stack.device, stack.dtype)


def one_hot(labels: Sequence[Tensor], stack: Stack, restarts: int) -> Tensor:
    """Labels per observation -> one-hot (K * R, B, classes) on the stack's device."""
    y = torch.stack([torch.as_tensor(lab).reshape(-1).to(stack.device).long() for lab in labels])
    if y.shape[1] != stack.batch_size:
        raise PrivauditError(
            f"labels have {y.shape[1]} entries, the batch size is {stack.batch_size}"
        )
    oh = torch.nn.functional.one_hot(y, stack.num_classes).to(stack.dtype)
    return oh.repeat_interleave(restarts, dim=0)


def best_restart(losses: Tensor, restarts: int) -> Tensor:
    """Row index (into K * R) of each observation's lowest loss; NaN counts as +inf."""
    l2 = torch.nan_to_num(losses.detach(), nan=float("inf")).reshape(-1, restarts)
    return torch.arange(l2.shape[0], device=l2.device) * restarts + l2.argmin(1)


@contextmanager
def progress_bar(enabled: bool, total: int, description: str) -> Iterator[Callable[[], None]]:
    """A rich progress bar when ``enabled``; yields ``advance()``."""
    bar, task = text.progress(total, description, enabled)
    with bar:
        yield lambda: bar.advance(task)
