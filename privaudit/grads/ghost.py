"""Clipped per-example gradient sums without per-example gradients: ghost clipping.

Per-example clipping (DP-SGD, Abadi et al. 2016; DPDL's (9)) needs, for a batch of examples i
with losses ℓ_i at parameters θ,

    S = Σ_i c_i ∇ℓ_i(θ),    c_i = min(1, C/(‖∇ℓ_i(θ)‖ + 1e-12))                          (1)

Materialised, the ∇ℓ_i cost W·D floats per batch (ResNet-18, W = 32: 1.4 GB per (model,
batch) pair). Ghost clipping (Goodfellow 2015, "Efficient Per-Example Gradient Computations";
Li, Tramèr, Liang, Hashimoto 2022, "Large Language Models Can Be Strong Differentially Private
Learners", ICLR) with book-keeping (Bu et al. 2023, below) gets (1) from one forward and one
backward pass, holding per example only what each layer's norm and share of (1) need — for
most layers less than its per-example gradient:

1. One backward of Σ_i ℓ_i hands each parametrised layer its input a_i and output gradient
   g_i per example; the layer keeps its share of ‖∇ℓ_i‖² (‖∇ℓ_i‖² = Σ_layers) and what its
   share of (1) needs (:class:`Kept`):

   - ``Linear`` (a_i ∈ R^d, g_i ∈ R^o): ∇W_i = g_i a_iᵀ, ‖∇W_i‖_F² = ‖g_i‖²‖a_i‖², bias ‖g_i‖²
     (opacus' norm sampler); it keeps a and g.
   - ``Conv2d``, unfolded: a_i ∈ R^{T×d} holds the T output positions' input patches
     (d = c_in/groups·k_h·k_w), g_i ∈ R^{T×o}, ∇W_i = g_iᵀ a_i (per group), and

         ‖g_iᵀ a_i‖_F² = ⟨a_i a_iᵀ, g_i g_iᵀ⟩_F                                         (2)

     — the ghost norm, 2T² floats and T²(d + o) multiply-adds per example; it keeps a and g —
     or the explicit product g_iᵀ a_i, o·d floats and T·o·d multiply-adds, which it keeps;
     whichever costs less, layer by layer (:func:`ghost_is_cheaper`): mixed ghost clipping
     (Bu, Mao, Xu 2022, "Scalable and Efficient Training of Large Convolutional Neural Networks
     with Differential Privacy", NeurIPS, which compares the memory, 2T² against o·d). In a
     CIFAR ResNet-18 the 32×32 and 16×16 layers (T = 1024, 256) go explicit — all examples'
     g_iᵀ a_i as one weight-gradient convolution with a group per example — and the 8×8 and
     4×4 ones (T = 64, 16; o·d up to 2.4 M) ghost. Bias: Σ_t g_{i,t}, kept.
   - ``GroupNorm`` and any other layer: its per-example gradients (2C floats per example for
     GroupNorm), from opacus' grad samplers (functorch for layers without one), kept.

2. With the c_i, each layer's share of (1) from what it kept — book-keeping (Bu, Mao, Xu 2023,
   "Differentially Private Optimization on Large Model at Small Cost", ICML): Σ_i c_i ∇W_i of
   the kept per-example gradients, and one weight-gradient convolution (an einsum for
   ``Linear``) of the whole batch with the output gradients scaled by c_i for the ghost layers.
   No second backward pass (Li et al.'s ghost clipping takes one, of Σ_i c_i ℓ_i), which
   would recompute every input gradient and every weight gradient.

The hooks are opacus' fast gradient clipping (``GradSampleModuleFastGradientClipping``, opacus ≥
1.5), extended (:func:`hooks_class`): (a) a ``Conv2d`` norm sampler (:func:`conv2d_norm_sample`;
opacus 1.6 has ghost norms for ``Linear`` and ``Embedding`` only and materialises every
per-example conv gradient); (b) output gradients come from tensor hooks on each layer's output
rather than ``register_full_backward_hook``, which refuses a forward that modifies a layer's
output in place (torchvision's ResNet: ``out += identity``, ``ReLU(inplace=True)``); (c) the
hooks run in eval mode too (the models are in eval mode; a parametrised layer with running
statistics — BatchNorm — is refused by opacus' validation, so no hooked layer depends on the
mode); (d) the backward asks only for the input's gradient, so autograd computes no weight
gradient; (e) the layers keep what step 2 needs (:data:`KEEPERS`). c_i is the project's
(:func:`privaudit.grads.clip_factors`, not opacus' ``+ 1e-6``), so (1) equals the materialised
path's to float rounding.

Memory (:meth:`GhostClipper.example_bytes`): one (model, batch) pair and one chunk of its
examples at a time — the chunk's saved activations, what the layers keep, one layer's norm
temporaries, the model's gradient — whatever the number of pairs. Cost: one forward, one
backward without weight gradients, the norms and the weighted sums (for the ResNet-18 layers
together about a weight gradient's work), against W single-example backward passes.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Iterable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privaudit.core.params import ParamSpec
from privaudit.grads.memory import saved_bytes


def ghost_is_cheaper(positions: int, out_channels: int, patch: int) -> bool:
    """Whether (2) costs fewer multiply-adds than the explicit product: its Gram matrices take
    T²(d + o) per example, g_iᵀ a_i takes T·o·d. Mixed ghost clipping (Bu et al. 2022) decides
    by memory instead (2T² floats against o·d); either rule sends the large early layers of a
    CIFAR ResNet explicit and the deep ones ghost, this one also the 16×16 layers explicit,
    where the explicit weight-gradient convolution is twice as fast on the CPU."""
    return positions * (patch + out_channels) < out_channels * patch


def conv_norm_floats(positions: int, out_channels: int, patch: int, groups: int) -> int:
    """Floats per example :func:`conv2d_norm_sample` holds at once: the unfolded input (d·T)
    and the two Gram matrices (2T²) on the ghost side, the per-example gradient and the
    (unread) weight of its convolution (2·o·d) on the explicit side, per group."""
    o, d, t = out_channels // groups, patch, positions
    return groups * (d * t + 2 * t * t if ghost_is_cheaper(t, o, d) else 2 * o * d)


def kept_floats(layer: nn.Module, inputs: Tensor, output: Tensor) -> int:
    """Floats per example ``layer`` keeps from the backward until the clipped sum
    (:class:`Kept`), for one example's ``inputs`` and ``output``: a ghost ``Conv2d`` or a
    ``Linear`` its input and output gradient, an explicit ``Conv2d`` its per-example weight
    and bias gradients, any other layer its per-example gradients."""
    weights = sum(p.numel() for p in layer.parameters(recurse=False) if p.requires_grad)
    if type(layer) is nn.Conv2d:
        o, groups = layer.out_channels, layer.groups
        d = layer.in_channels // groups * math.prod(layer.kernel_size)
        if ghost_is_cheaper(output.shape[-2] * output.shape[-1], o // groups, d):
            return inputs.numel() + output.numel() + o
        return weights
    if type(layer) is nn.Linear:
        return inputs.numel() + output.numel() + layer.out_features
    return weights


def _padded(layer: nn.Conv2d, a: Tensor) -> Tensor:
    """The layer's input with its padding applied (any ``padding_mode``; an int, a pair,
    "valid" or "same"), so that the convolution itself pads by 0."""
    if isinstance(layer.padding, str):
        pads = []
        for k, dil in zip(reversed(layer.kernel_size), reversed(layer.dilation), strict=True):
            total = dil * (k - 1) if layer.padding == "same" else 0
            pads += [total // 2, total - total // 2]
    else:
        pads = [p for p in reversed(layer.padding) for _ in range(2)]
    if not any(pads):
        return a
    mode = "constant" if layer.padding_mode == "zeros" else layer.padding_mode
    return F.pad(a, pads, mode=mode)


def _patches(layer: nn.Conv2d, a: Tensor, out_hw: tuple[int, int]) -> Tensor:
    """The padded input ``a`` unfolded per group: (n·G, T, k_h·k_w·c_in/G), each row one
    output position's patch — ``F.unfold``'s columns with the entries of a patch in another
    order, which (2) does not see (it sums over them). Built as k_h·k_w strided slices of the
    channels-last input, whose rows are contiguous runs of channels: ten times faster than
    ``F.unfold``'s im2col on the CPU."""
    (kh, kw), (dh, dw), (sh, sw), (ho, wo) = (
        layer.kernel_size,
        layer.dilation,
        layer.stride,
        out_hw,
    )
    n, groups = a.shape[0], layer.groups
    last = a.permute(0, 2, 3, 1)  # (n, H, W, c_in): a view, copied by the slices below
    rows = [
        last[:, i * dh : i * dh + sh * (ho - 1) + 1 : sh, j * dw : j * dw + sw * (wo - 1) + 1 : sw]
        for i in range(kh)
        for j in range(kw)
    ]
    cols = torch.stack(rows, 3)  # (n, ho, wo, k·k, c_in)
    cols = cols.reshape(n, ho * wo, kh * kw, groups, -1).permute(0, 3, 1, 2, 4)
    return cols.reshape(n * groups, ho * wo, -1)


class Kept:
    """One parameter's share of (1) from the first backward: ``sq`` its per-example squared
    gradient norms (n,), and ``weighted(c)`` its clipped sum Σ_i c_i ∇_p ℓ_i (the parameter's
    shape) from what the layer kept of that backward — book-keeping (Bu, Mao, Xu 2023,
    "Differentially Private Optimization on Large Model at Small Cost", ICML): no second
    backward pass."""

    __slots__ = ("sq", "weighted", "rows")

    def __init__(
        self, sq: Tensor, weighted: Callable[[Tensor], Tensor], rows: Tensor | None = None
    ):
        self.sq, self.weighted, self.rows = sq, weighted, rows  # rows: per-example gradients


def per_example(grads: Tensor) -> Kept:
    """:class:`Kept` of materialised per-example gradients ``grads`` (n, *shape)."""
    rows = grads.reshape(len(grads), -1)
    sq = torch.linalg.vector_norm(rows, dim=1).square()
    return Kept(sq, lambda c: (c.to(rows.dtype) @ rows).view(grads.shape[1:]), grads)


def conv2d_kept(
    layer: nn.Conv2d, activations: list[Tensor], backprops: Tensor
) -> dict[nn.Parameter, Kept]:
    """A ``Conv2d``'s :class:`Kept` from its input and output gradient: where
    :func:`ghost_is_cheaper`, the norms by (2) from the unfolded input and the clipped sum by
    one weight-gradient convolution of the whole batch with the output gradients scaled by
    c_i (it keeps the input and the output gradient); else the explicit per-example weight
    gradients g_iᵀ a_i, all n at once as one weight-gradient convolution with one group per
    example (as :mod:`privaudit.grads.pairnet`; no unfold), kept for the clipped sum. Bias:
    the per-example Σ_t g_{i,t}."""
    g, inputs = backprops, activations[0]
    a = _padded(layer, inputs.to(g.dtype))
    n, groups, hw = a.shape[0], layer.groups, tuple(g.shape[2:])
    o, i = layer.out_channels // groups, layer.in_channels // groups
    d, t = i * math.prod(layer.kernel_size), math.prod(hw)
    ret: dict[nn.Parameter, Kept] = {}

    def weight_grad(grad_out: Tensor, inputs: Tensor, shape: tuple, groups: int) -> Tensor:
        """The weight gradient of the layer's convolution (padding applied to ``inputs``)."""
        _, grad, _ = torch.ops.aten.convolution_backward(
            grad_out,
            inputs,
            torch.empty(shape, dtype=g.dtype, device=g.device),  # only its shape is read
            None,
            layer.stride,
            [0, 0],
            layer.dilation,
            False,
            [0, 0],
            groups,
            [False, True, False],
        )
        return grad

    if layer.weight.requires_grad:
        if ghost_is_cheaper(t, o, d):
            cols = _patches(layer, a.contiguous(memory_format=torch.channels_last), hw)
            outs = g.reshape(n * groups, o, t)
            gram_a = torch.bmm(cols, cols.transpose(1, 2))  # a_i a_iᵀ, (n·G, T, T)
            gram_g = torch.bmm(outs.transpose(1, 2), outs)  # g_i g_iᵀ
            sq = torch.einsum("bij,bij->b", gram_a, gram_g).clamp(min=0)
            del a, cols, outs, gram_a, gram_g
            shape = tuple(layer.weight.shape)

            def summed(c: Tensor) -> Tensor:
                scaled = g * c.to(g.dtype).view(n, 1, 1, 1)
                return weight_grad(scaled, _padded(layer, inputs.to(g.dtype)), shape, groups)

            ret[layer.weight] = Kept(sq.reshape(n, groups).sum(1), summed)
        else:
            grad = weight_grad(
                g.reshape(1, n * layer.out_channels, *hw),
                a.reshape(1, n * layer.in_channels, *a.shape[2:]),
                (n * layer.out_channels, i, *layer.kernel_size),
                n * groups,
            )
            ret[layer.weight] = per_example(grad.view(n, *layer.weight.shape))
    if layer.bias is not None and layer.bias.requires_grad:
        ret[layer.bias] = per_example(g.reshape(n, g.shape[1], -1).sum(2))
    return ret


def linear_kept(
    layer: nn.Linear, activations: list[Tensor], backprops: Tensor
) -> dict[nn.Parameter, Kept]:
    """A ``Linear``'s :class:`Kept`: the weight's norms by opacus' ghost norm sampler
    (‖g_i‖‖a_i‖, or its Gram form over a sequence), its clipped sum one einsum
    Σ_i c_i g_iᵀ a_i; the bias per example."""
    from opacus.grad_sample.linear import compute_linear_norm_sample

    a, g = activations[0].to(backprops.dtype), backprops
    n = len(g)
    ret: dict[nn.Parameter, Kept] = {}
    if layer.weight.requires_grad:
        sq = compute_linear_norm_sample(layer, [a], g)[layer.weight].square()

        def summed(c: Tensor) -> Tensor:
            return torch.einsum(
                "n...o,n...d->od", g * c.to(g.dtype).view(n, *[1] * (g.dim() - 1)), a
            )

        ret[layer.weight] = Kept(sq, summed)
    if layer.bias is not None and layer.bias.requires_grad:
        ret[layer.bias] = per_example(g.reshape(n, -1, g.shape[-1]).sum(1))
    return ret


def conv2d_norm_sample(
    layer: nn.Conv2d, activations: list[Tensor], backprops: Tensor
) -> dict[nn.Parameter, Tensor]:
    """Per-example gradient norms of a ``Conv2d``'s weight and bias, (n,) each (opacus'
    norm-sampler signature), from :func:`conv2d_kept`."""
    kept = conv2d_kept(layer, activations, backprops)
    return {p: k.sq.sqrt() for p, k in kept.items()}


# the layers whose :class:`Kept` is computed without per-example gradients where cheaper
KEEPERS: dict[type, Callable[..., dict[nn.Parameter, Kept]]] = {
    nn.Conv2d: conv2d_kept,
    nn.Linear: linear_kept,
}


def _layer_kept(
    module: nn.Module,
    activations: list[Tensor],
    backprops: Tensor,
    sampler: Callable[..., dict[nn.Parameter, Tensor]],
) -> dict[nn.Parameter, Kept]:
    """A layer's :class:`Kept` per parameter: :data:`KEEPERS`' for its type, else its
    per-example gradients from ``sampler`` (opacus' grad sampler, or functorch's). A parameter
    used more than once in the forward (only layers outside :data:`KEEPERS`; opacus refuses
    tying for the others) sums its uses' per-example gradients."""
    keeper = KEEPERS.get(type(module))
    if keeper is not None:
        return keeper(module, activations, backprops)
    kept = {}
    for param, gs in sampler(module, activations, backprops).items():
        earlier = getattr(param, "_kept", None)
        if earlier is not None:  # a second use: Σ of the uses, per example
            gs = gs + earlier.rows
        kept[param] = per_example(gs)
    return kept


def _forget(modules: Iterable[nn.Module], params: Iterable[nn.Parameter]) -> None:
    """Clear what a pass leaves on the hooked ``modules`` (their saved inputs and batch
    length) and on ``params`` (their use count and :class:`Kept`)."""
    for module in modules:
        module.activations = []
        if hasattr(module, "max_batch_len"):
            del module.max_batch_len
    for p in params:
        p._forward_counter = 0
        p._kept = None


@functools.cache
def hooks_class() -> type:
    """:class:`Hooks` — opacus' fast-gradient-clipping hooks around a model, with the
    extensions (a)–(c) and (e) of the module docstring; each parameter's :class:`Kept` lands
    in its ``_kept``. Defined on first use: importing opacus takes seconds (it loads its
    accountants and scipy), and only models on the ghost path need it. An ImportError where
    opacus is missing or older than 1.5."""
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.grad_sample.functorch import ft_compute_per_sample_gradient, prepare_layer

    class Hooks(GradSampleModuleFastGradientClipping):
        """See :func:`hooks_class`."""

        NORM_SAMPLERS = {
            **GradSampleModuleFastGradientClipping.NORM_SAMPLERS,
            nn.Conv2d: conv2d_norm_sample,
        }

        def add_hooks(
            self, *, loss_reduction: str = "mean", batch_first: bool = True, force_functorch=False
        ) -> None:
            """One forward hook per parametrised layer: it stores the input (opacus' activation
            hook) and puts a tensor hook on the output, which hands the output gradient to
            opacus' backprop hook. Layers without a grad sampler get opacus' functorch one."""
            if hasattr(self._module, "autograd_grad_sample_hooks"):
                raise ValueError("Trying to add hooks twice to the same model")
            handles: list = []
            self._module.autograd_grad_sample_hooks = handles
            self.autograd_grad_sample_hooks = handles
            for module in self.iterate_submodules(self._module):
                if force_functorch or type(module) not in self.GRAD_SAMPLERS:
                    prepare_layer(module, batch_first=batch_first)
                hook = partial(self.capture, loss_reduction=loss_reduction, batch_first=batch_first)
                handles.append(module.register_forward_hook(hook))
            self.enable_hooks()

        def capture(
            self, module: nn.Module, inputs, output, *, loss_reduction: str, batch_first: bool
        ) -> None:
            """Forward hook: opacus' activation capture, and the output's gradient hook."""
            self.capture_activations_hook(module, inputs, output)
            if (
                self.hooks_enabled
                and torch.is_grad_enabled()
                and isinstance(output, Tensor)
                and output.requires_grad
            ):

                def backprop(grad: Tensor) -> None:
                    self.keep(module, grad, loss_reduction, batch_first)

                output.register_hook(backprop)

        def capture_activations_hook(
            self, module: nn.Module, forward_input, forward_output
        ) -> None:
            """opacus' hook, in either train/eval mode (it skips modules in eval mode)."""
            mode = module.training
            module.training = True
            try:
                super().capture_activations_hook(module, forward_input, forward_output)
            finally:
                module.training = mode

        def keep(
            self, module: nn.Module, grad: Tensor, loss_reduction: str, batch_first: bool
        ) -> None:
            """Backward hook: the layer's :class:`Kept` per parameter (:func:`_layer_kept`, with
            opacus' grad sampler of the layer or else functorch's), in each ``_kept``."""
            if not self.hooks_enabled:
                return
            activations, backprops = self.rearrange_grad_samples(
                module=module,
                backprops=grad.detach(),
                loss_reduction=loss_reduction,
                batch_first=batch_first,
            )
            sampler = self.GRAD_SAMPLERS.get(type(module), ft_compute_per_sample_gradient)
            for param, k in _layer_kept(module, activations, backprops, sampler).items():
                if param.requires_grad:
                    param._kept = k
            if not module.activations and hasattr(module, "max_batch_len"):
                del module.max_batch_len

        def reset(self) -> None:
            """Forget what an earlier (possibly interrupted) pass left on the layers/parameters."""
            _forget(self.iterate_submodules(self._module), self._module.parameters())

    return Hooks


class GhostClipper:
    """(1) for one (model, batch) pair at a time, on a private copy of ``model`` whose
    parameters are loaded from each pair's flat vector (:class:`ParamSpec` layout). Build
    with :func:`build`."""

    def __init__(self, model: nn.Module, spec: ParamSpec):
        net = copy.deepcopy(model)
        for p in net.parameters():
            p.requires_grad_(True)
        named = dict(net.named_parameters())
        self.spec, self.net = spec, net
        self.params = [named[n] for n in spec.names]
        self.hooks = hooks_class()(net, loss_reduction="sum", strict=True, max_grad_norm=1.0)
        self.hooks.disable_hooks()
        self.probed: dict[tuple, float] = {}  # input shape -> working bytes per example

    @property
    def fixed_bytes(self) -> int:
        """Bytes a pair needs whatever its chunk: the model's parameters (D floats) and as
        much again for the layers' sums, which autograd does not compute (the backward asks
        only for the input's gradient), and slack."""
        return 2 * self.spec.numel * self.params[0].element_size()

    def load(self, flat: Tensor) -> None:
        """Set the private copy's parameters to the flat vector ``flat`` (D,)."""
        with torch.no_grad():
            for p, v in zip(self.params, torch.split(flat, self.spec.sizes), strict=True):
                p.copy_(v.view_as(p))

    def example_bytes(self, x: Tensor) -> float:
        """Working bytes per example of a chunk (inputs like ``x[0]``), once per input shape,
        from a forward of one example: the tensors autograd saves (:func:`saved_bytes`;
        the backward frees each once its layer is done), two output gradients in flight
        (a layer's and a residual branch's) of the largest layer output, what the layers keep
        for the clipped sum (:func:`kept_floats`) and the largest conv norm temporary
        (:func:`conv_norm_floats`)."""
        key = (tuple(x.shape[1:]), x.dtype, x.device.type)
        if key not in self.probed:
            temps, kept, widest = [0], [0], [0]

            def record(layer: nn.Module, inputs, output) -> None:
                if not isinstance(output, Tensor):
                    return
                widest.append(output.numel())
                if not list(layer.parameters(recurse=False)):
                    return
                kept.append(kept_floats(layer, inputs[0], output))
                if type(layer) is nn.Conv2d:
                    t = output.shape[-2] * output.shape[-1]
                    d = layer.in_channels // layer.groups * math.prod(layer.kernel_size)
                    temps.append(conv_norm_floats(t, layer.out_channels, d, layer.groups))

            handles = [m.register_forward_hook(record) for m in self.net.modules()]
            try:
                with torch.enable_grad():
                    saved = saved_bytes(lambda: self.net(x[:1]), self.params)
            finally:
                for h in handles:
                    h.remove()
            floats = 2 * max(widest) + sum(kept) + max(temps)
            self.probed[key] = saved + floats * self.params[0].element_size()
        return self.probed[key]

    def clipped_sum(self, x: Tensor, y: Tensor, clip: float | None, out: Tensor) -> None:
        """``out`` (D,) += (1) over the examples ``x``, ``y`` (all real: no ignored labels), at
        the loaded parameters; Σ_i ∇ℓ_i when ``clip`` is None (one plain backward)."""
        hooks = self.hooks
        hooks.reset()
        parts = torch.split(out, self.spec.sizes)
        with torch.enable_grad():
            if clip is None:
                loss = F.cross_entropy(self.net(x), y, reduction="sum")
                grads = torch.autograd.grad(loss, self.params)
                with torch.no_grad():
                    for o, g in zip(parts, grads, strict=True):
                        o.add_(g.reshape(-1))
                return
            xin = x.detach().requires_grad_(x.is_floating_point())
            hooks.enable_hooks()
            try:
                losses = F.cross_entropy(self.net(xin), y, reduction="none")
                # the one backward: the layers keep their norms and sums (the input's
                # gradient is asked for, so autograd computes no weight gradient)
                first = [xin] if xin.requires_grad else self.params
                torch.autograd.grad(losses.sum(), first)
            finally:
                hooks.disable_hooks()
        with torch.no_grad():
            kept = [getattr(p, "_kept", None) for p in self.params]
            sq = losses.detach().new_zeros(len(y))
            for k in kept:
                if k is not None:
                    sq += k.sq.to(sq.dtype)
            factor = torch.clamp(clip / (sq.sqrt() + 1e-12), max=1.0)
            for o, k in zip(parts, kept, strict=True):
                if k is not None:
                    o.add_(k.weighted(factor).reshape(-1))
        hooks.reset()


def build(model: nn.Module, spec: ParamSpec) -> GhostClipper | None:
    """The ghost clipper of ``model``, or None where opacus refuses it (a parametrised layer
    with buffers, e.g. BatchNorm: per-example gradients are undefined with batch statistics)
    or is missing or older than 1.5."""
    try:
        return GhostClipper(model, spec)
    except (NotImplementedError, ImportError):
        return None
