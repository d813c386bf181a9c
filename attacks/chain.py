"""A model read as a chain of affine layers and elementwise activations, for R-GAP.

R-GAP (Zhu & Blaschko 2021, "R-GAP: Recursive Gradient Attack on Privacy", ICLR, §3)
inverts a network of the form ``x_l = σ_l(A_l x_{l−1} + b_l)``, ``l = 1..L``, where every
``A_l`` is a convolution or a matrix and every ``σ_l`` acts elementwise; the last layer is
the classifier (no activation). :func:`linear_chain` traces a model with ``torch.fx`` and
returns that chain, or raises :class:`Unsupported` naming the operation that breaks it
(e.g. a max-pool: not elementwise, so the previous layer's output cannot be recovered from
its pooled image).

Activations (:func:`invert`) and what each gives back from an output ``x = σ(z)``:

- sigmoid: ``z = log(x / (1 − x))``, ``σ'(z) = x (1 − x)``;
- tanh: ``z = atanh(x)``, ``σ'(z) = 1 − x²``;
- leaky ReLU (slope a > 0): ``z = x`` where ``x ≥ 0`` else ``x / a``; ``σ'`` is 1 or a;
- ReLU: ``z = x`` where ``x > 0``; where ``x = 0`` (at most ``RELU_ZERO`` of the largest
  output: a recovered zero is not exact) only ``z ≤ 0`` is known, so those
  entries carry no forward equation (``known`` is False) and ``σ'(z) = 0``;
- identity (no activation, ``nn.Identity``, eval-mode ``nn.Dropout``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from privaudit.core.errors import PrivauditError

ACTIVATIONS = (nn.Sigmoid, nn.Tanh, nn.LeakyReLU, nn.ReLU)
PASS_THROUGH = (nn.Identity, nn.Dropout, nn.Flatten)
# values of a sigmoid / tanh output are kept this far inside the open range before inverting
EDGE = 1e-12
# a ReLU output at most this fraction of the largest one is taken as zero (dead unit)
RELU_ZERO = 1e-6


class Unsupported(PrivauditError):
    """The model is not a chain R-GAP can invert; the message names the reason."""


@dataclass(frozen=True)
class Layer:
    """One affine layer of the chain and the activation applied to its output."""

    name: str  # module path, the prefix of its parameters ("body.0")
    module: nn.Conv2d | nn.Linear
    activation: nn.Module | None  # elementwise, on this layer's output; None for identity
    in_shape: tuple[int, ...]  # one example's input to the layer
    out_shape: tuple[int, ...]  # one example's output (before the activation)

    def param(self, what: str) -> str:
        """The parameter name of the layer's ``weight`` or ``bias``."""
        return f"{self.name}.{what}" if self.name else what

    @property
    def unknowns(self) -> int:
        n = 1
        for s in self.in_shape:
            n *= int(s)
        return n


def _is_flatten(node: torch.fx.Node, mod: nn.Module | None) -> bool:
    if isinstance(mod, nn.Flatten):
        return mod.start_dim == 1 and mod.end_dim == -1
    start = None
    if node.op == "call_method" and node.target == "flatten":
        start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
    elif node.op == "call_function" and node.target is torch.flatten:
        start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
    return start == 1


def _activation(node: torch.fx.Node, mod: nn.Module | None) -> nn.Module | None:
    """The elementwise activation a node applies, as a module; None if it is none."""
    if isinstance(mod, ACTIVATIONS):
        return mod
    if node.op == "call_function":
        if node.target is torch.sigmoid:
            return nn.Sigmoid()
        if node.target is torch.tanh:
            return nn.Tanh()
    if node.op == "call_method" and node.target in ("sigmoid", "tanh"):
        return nn.Sigmoid() if node.target == "sigmoid" else nn.Tanh()
    return None


def _check_affine(name: str, mod: nn.Module) -> None:
    if isinstance(mod, nn.Conv2d):
        if mod.groups != 1 or mod.padding_mode != "zeros" or isinstance(mod.padding, str):
            raise Unsupported(
                f"R-GAP supports Conv2d with groups=1, zero padding and numeric padding; "
                f"{name!r} has groups={mod.groups}, padding={mod.padding!r}, "
                f"padding_mode={mod.padding_mode!r}"
            )
    if isinstance(mod, nn.LeakyReLU) and mod.negative_slope <= 0:
        raise Unsupported(f"{name!r}: a leaky ReLU with slope ≤ 0 is not invertible")


def linear_chain(model: nn.Module, input_shape: tuple[int, ...]) -> list[Layer]:
    """The model as affine layers with their activations, input to output; raises
    :class:`Unsupported` when it is not such a chain ending in a Linear classifier."""
    try:
        graph = torch.fx.symbolic_trace(model).graph
    except Exception as e:  # noqa: BLE001 - any untraceable model is simply unsupported
        raise Unsupported(f"the model cannot be traced as a chain ({type(e).__name__})") from None
    modules = dict(model.named_modules())
    found: list[tuple[str, nn.Module, nn.Module | None]] = []
    prev: torch.fx.Node | None = None
    flat = len(input_shape) == 1  # one example's values are a vector
    for node in graph.nodes:
        if node.op == "placeholder":
            prev = node
            continue
        if node.op == "output":
            if node.args[0] is not prev:
                raise Unsupported("the model's output is not the end of one chain")
            break
        mod = modules.get(node.target) if node.op == "call_module" else None
        where = node.target if mod is not None else node.name
        if list(node.all_input_nodes) != [prev]:
            raise Unsupported(f"{where!r} does not take exactly the previous output")
        act = _activation(node, mod)
        if isinstance(mod, (nn.Conv2d, nn.Linear)):
            _check_affine(node.target, mod)
            if flat != isinstance(mod, nn.Linear):
                need = "an image" if flat else "a flattened vector"
                raise Unsupported(f"{where!r} ({type(mod).__name__}) needs {need} as its input")
            found.append((node.target, mod, None))
        elif act is not None:
            if mod is not None:
                _check_affine(node.target, mod)
            if not found or found[-1][2] is not None:
                raise Unsupported(
                    f"{where!r}: R-GAP needs exactly one activation after an affine layer"
                )
            found[-1] = (found[-1][0], found[-1][1], act)
        elif isinstance(mod, PASS_THROUGH) and not isinstance(mod, nn.Flatten):
            pass  # identity in eval mode
        elif _is_flatten(node, mod):
            flat = True
        else:
            what = type(mod).__name__ if mod is not None else str(node.target)
            raise Unsupported(
                f"R-GAP inverts chains of Conv2d/Linear and elementwise invertible "
                f"activations; {where!r} ({what}) is not one"
            )
        prev = node
    if not found or not isinstance(found[-1][1], nn.Linear) or found[-1][2] is not None:
        raise Unsupported("R-GAP needs the model to end in a Linear classifier (no activation)")
    return _with_shapes(found, input_shape)


def _with_shapes(
    found: list[tuple[str, nn.Module, nn.Module | None]], input_shape: tuple[int, ...]
) -> list[Layer]:
    """Each layer's input and output shape, from one forward pass of a zero example."""
    layers = []
    w = found[0][1].weight
    x = torch.zeros(1, *input_shape, dtype=w.dtype, device=w.device)
    with torch.no_grad():
        for name, mod, act in found:
            if isinstance(mod, nn.Linear):
                x = x.flatten(1)
            elif x.dim() != 4:
                raise Unsupported(f"{name!r} is a Conv2d but its input is not an image")
            try:
                y = mod(x)
            except RuntimeError:
                shape = tuple(x.shape[1:])
                raise Unsupported(f"{name!r} does not take inputs of shape {shape}") from None
            layers.append(Layer(name, mod, act, tuple(x.shape[1:]), tuple(y.shape[1:])))
            x = y
    return layers


def invert(activation: nn.Module | None, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(z, σ'(z), known)`` for an activation's output ``x``: its input where it is
    determined (``known``), and its derivative there (module docstring)."""
    known = torch.ones_like(x, dtype=torch.bool)
    if activation is None or isinstance(activation, PASS_THROUGH):
        return x, torch.ones_like(x), known
    if isinstance(activation, nn.Sigmoid):
        x = x.clamp(EDGE, 1 - EDGE)
        return torch.log(x) - torch.log1p(-x), x * (1 - x), known
    if isinstance(activation, nn.Tanh):
        x = x.clamp(-1 + EDGE, 1 - EDGE)
        return torch.atanh(x), 1 - x * x, known
    if isinstance(activation, nn.LeakyReLU):
        a = float(activation.negative_slope)
        neg = x < 0
        return torch.where(neg, x / a, x), torch.where(neg, a, 1.0).to(x), known
    if isinstance(activation, nn.ReLU):
        on = x > RELU_ZERO * float(x.abs().max())
        return torch.where(on, x, 0.0), on.to(x), on
    raise Unsupported(f"no inverse for activation {type(activation).__name__}")
