"""Clipped per-example gradient sums without per-example gradients: ghost clipping.

Per-example clipping (DP-SGD, Abadi et al. 2016; DPDL's (9)) needs, for a batch of examples i
with losses ℓ_i at parameters θ,

    S = Σ_i c_i ∇ℓ_i(θ),    c_i = min(1, C/(‖∇ℓ_i(θ)‖ + 1e-12))                          (1)

Materialised, the ∇ℓ_i cost W·D floats per batch (ResNet-18, W = 32: 1.4 GB per (model,
batch) pair). Ghost clipping (Goodfellow 2015, "Efficient Per-Example Gradient Computations";
Li, Tramèr, Liang, Hashimoto 2022, "Large Language Models Can Be Strong Differentially Private
Learners", ICLR) gets (1) from one forward and two backward passes and never holds more than
one layer's per-example quantities:

1. A first backward of Σ_i ℓ_i records, for each parametrised layer, its input a_i and output
   gradient g_i per example, and each layer's share of ‖∇ℓ_i‖² (‖∇ℓ_i‖² = Σ_layers):

   - ``Linear`` (a_i ∈ R^d, g_i ∈ R^o): ∇W_i = g_i a_iᵀ, ‖∇W_i‖_F² = ‖g_i‖²‖a_i‖², bias ‖g_i‖²
     (opacus' norm sampler).
   - ``Conv2d``, unfolded: a_i ∈ R^{T×d} holds the T output positions' input patches
     (d = c_in/groups·k_h·k_w), g_i ∈ R^{T×o}, ∇W_i = g_iᵀ a_i (per group), and

         ‖g_iᵀ a_i‖_F² = ⟨a_i a_iᵀ, g_i g_iᵀ⟩_F                                         (2)

     — the ghost norm, 2T² floats and T²(d + o) multiply-adds per example — or the explicit
     product g_iᵀ a_i, o·d floats and T·o·d multiply-adds, whichever costs less, layer by layer
     (:func:`ghost_is_cheaper`): mixed ghost clipping (Bu, Mao, Xu 2022, "Scalable and
     Efficient Training of Large Convolutional Neural Networks with Differential Privacy",
     NeurIPS, which compares the memory, 2T² against o·d). In a CIFAR ResNet-18 the 32×32 and
     16×16 layers (T = 1024, 256) go explicit — all examples' g_iᵀ a_i as one
     weight-gradient convolution with a group per example — and the 8×8 and 4×4 ones (T = 64,
     16; o·d up to 2.4 M) ghost.
     Bias: ‖Σ_t g_{i,t}‖².
   - ``GroupNorm`` and any other layer: its per-example gradients (2C floats per example for
     GroupNorm), from opacus' grad samplers (functorch for layers without one), then norms.

2. A second backward of Σ_i c_i ℓ_i, with the c_i as constants, gives (1) directly.

The hooks are opacus' fast gradient clipping (``GradSampleModuleFastGradientClipping``, opacus ≥
1.5), extended (:func:`hooks_class`): (a) a ``Conv2d`` norm sampler (:func:`conv2d_norm_sample`;
opacus 1.6 has ghost norms for ``Linear`` and ``Embedding`` only and materialises every
per-example conv gradient); (b) output gradients come from tensor hooks on each layer's output
rather than ``register_full_backward_hook``, which refuses a forward that modifies a layer's
output in place (torchvision's ResNet: ``out += identity``, ``ReLU(inplace=True)``); (c) the
hooks run in eval mode too (the models are in eval mode; a parametrised layer with running
statistics — BatchNorm — is refused by opacus' validation, so no hooked layer depends on the
mode); (d) the first backward asks only for the input's gradient, so autograd computes no weight
gradient there. c_i is the project's (:func:`privaudit.grads.clip_factors`, not opacus'
``+ 1e-6``), so (1) equals the materialised path's to float rounding.

Memory (:meth:`GhostClipper.example_bytes`): one (model, batch) pair and one chunk of its
examples at a time — the chunk's saved activations, one layer's norm temporaries, the model's
gradient — whatever the number of pairs. Cost: one forward, one backward without weight
gradients, one full backward, and the norms (for the ResNet-18 layers about a weight gradient's
work), against W single-example backward passes.
"""

from __future__ import annotations

import copy
import functools
import math
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


def conv2d_norm_sample(
    layer: nn.Conv2d, activations: list[Tensor], backprops: Tensor
) -> dict[nn.Parameter, Tensor]:
    """Per-example gradient norms of a ``Conv2d``'s weight and bias, (n,) each, from its
    inputs and output gradients (opacus' norm-sampler signature): (2) from the unfolded input
    where :func:`ghost_is_cheaper`, else the explicit per-example weight gradients g_iᵀ a_i, all
    n at once as one weight-gradient convolution with one group per example (as
    :mod:`privaudit.grads.pairnet`; no unfold)."""
    g = backprops
    a = _padded(layer, activations[0].to(g.dtype))
    n, groups, hw = a.shape[0], layer.groups, tuple(g.shape[2:])
    o, i = layer.out_channels // groups, layer.in_channels // groups
    d, t = i * math.prod(layer.kernel_size), math.prod(hw)
    ret: dict[nn.Parameter, Tensor] = {}
    if layer.weight.requires_grad:
        if ghost_is_cheaper(t, o, d):
            cols = _patches(layer, a.contiguous(memory_format=torch.channels_last), hw)
            outs = g.reshape(n * groups, o, t)
            gram_a = torch.bmm(cols, cols.transpose(1, 2))  # a_i a_iᵀ, (n·G, T, T)
            gram_g = torch.bmm(outs.transpose(1, 2), outs)  # g_i g_iᵀ
            sq = torch.einsum("bij,bij->b", gram_a, gram_g).clamp(min=0)
        else:
            shape = (n * layer.out_channels, i, *layer.kernel_size)  # only its shape is read
            _, grad, _ = torch.ops.aten.convolution_backward(
                g.reshape(1, n * layer.out_channels, *hw),
                a.reshape(1, n * layer.in_channels, *a.shape[2:]),
                torch.empty(shape, dtype=g.dtype, device=g.device),
                None,
                layer.stride,
                [0, 0],
                layer.dilation,
                False,
                [0, 0],
                n * groups,
                [False, True, False],
            )
            sq = torch.linalg.vector_norm(grad.reshape(n * groups, -1), dim=1).square()
        ret[layer.weight] = sq.reshape(n, groups).sum(1).sqrt()
    if layer.bias is not None and layer.bias.requires_grad:
        ret[layer.bias] = torch.linalg.vector_norm(g.reshape(n, g.shape[1], -1).sum(2), dim=1)
    return ret


@functools.cache
def hooks_class() -> type:
    """:class:`Hooks` — opacus' fast-gradient-clipping hooks around a model, with the
    extensions (a)–(c) of the module docstring; per-example norms land in each parameter's
    ``_norm_sample``. Defined on first use: importing opacus takes seconds (it loads its
    accountants and scipy), and only models on the ghost path need it. An ImportError where
    opacus is missing or older than 1.5."""
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.grad_sample.functorch import prepare_layer

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
                    self.capture_backprops_hook(
                        module,
                        None,
                        (grad,),
                        loss_reduction=loss_reduction,
                        batch_first=batch_first,
                    )

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

        def reset(self) -> None:
            """Forget what an earlier (possibly interrupted) pass left on the layers/parameters."""
            for module in self.iterate_submodules(self._module):
                module.activations = []
                if hasattr(module, "max_batch_len"):
                    del module.max_batch_len
            for p in self._module.parameters():
                p._forward_counter = 0
                p._norm_sample = None
                p.grad_sample = None

        def squared_norms(self, n: int, like: Tensor) -> Tensor:
            """‖∇ℓ_i‖² per example (n,): the sum over parameters of their recorded norms²."""
            sq = like.new_zeros(n)
            for p in self._module.parameters():
                ns = getattr(p, "_norm_sample", None)
                if ns is not None and ns.numel():
                    sq = sq + ns.reshape(n).to(sq.dtype).square()
            return sq

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
        """Bytes a pair needs whatever its chunk: the model's parameters and the gradient
        buffers of the two backward passes (D floats each), with one more for slack."""
        return 4 * self.spec.numel * self.params[0].element_size()

    def load(self, flat: Tensor) -> None:
        """Set the private copy's parameters to the flat vector ``flat`` (D,)."""
        with torch.no_grad():
            for p, v in zip(self.params, torch.split(flat, self.spec.sizes), strict=True):
                p.copy_(v.view_as(p))

    def example_bytes(self, x: Tensor) -> float:
        """Working bytes per example of a chunk (inputs like ``x[0]``), once per input shape:
        a forward of one example counts the tensors autograd saves (:func:`saved_bytes`, ×2
        for the output gradients of the backward passes, which are of the same sizes) and the
        largest conv norm temporary (:func:`conv_norm_floats`)."""
        key = (tuple(x.shape[1:]), x.dtype, x.device.type)
        if key not in self.probed:
            temps: list[int] = [0]

            def record(layer: nn.Module, inputs, output) -> None:
                if type(layer) is nn.Conv2d and isinstance(output, Tensor):
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
            self.probed[key] = 2 * saved + 4 * max(temps)
        return self.probed[key]

    def clipped_sum(self, x: Tensor, y: Tensor, clip: float | None, out: Tensor) -> None:
        """``out`` (D,) += (1) over the examples ``x``, ``y`` (all real: no ignored labels), at
        the loaded parameters; Σ_i ∇ℓ_i when ``clip`` is None (one plain backward)."""
        hooks = self.hooks
        hooks.reset()
        with torch.enable_grad():
            if clip is None:
                loss = F.cross_entropy(self.net(x), y, reduction="sum")
                grads = torch.autograd.grad(loss, self.params)
            else:
                xin = x.detach().requires_grad_(x.is_floating_point())
                hooks.enable_hooks()
                try:
                    losses = F.cross_entropy(self.net(xin), y, reduction="none")
                    total = losses.sum()
                    # first backward: norms only (the input's gradient, no weight gradient)
                    first = [xin] if xin.requires_grad else self.params
                    torch.autograd.grad(total, first, retain_graph=True)
                finally:
                    hooks.disable_hooks()
                sq = hooks.squared_norms(len(y), losses)
                factor = torch.clamp(clip / (sq.sqrt() + 1e-12), max=1.0).detach()
                hooks.reset()
                # second backward: Σ_i c_i ∇ℓ_i
                grads = torch.autograd.grad(torch.dot(factor, losses), self.params)
        with torch.no_grad():
            for o, g in zip(torch.split(out, self.spec.sizes), grads, strict=True):
                o.add_(g.reshape(-1))


def build(model: nn.Module, spec: ParamSpec) -> GhostClipper | None:
    """The ghost clipper of ``model``, or None where opacus refuses it (a parametrised layer
    with buffers, e.g. BatchNorm: per-example gradients are undefined with batch statistics)
    or is missing or older than 1.5."""
    try:
        return GhostClipper(model, spec)
    except (NotImplementedError, ImportError):
        return None
