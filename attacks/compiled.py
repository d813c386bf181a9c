"""Speed for the optimisation attacks: one iteration traced into a flat ATen graph and
replayed (:func:`value_and_grad`), with constant folding, direct ATen calls and the choice
of convolution layout and backend. Results equal the eager path to float rounding; what is
traced is :mod:`.common`'s batched problem."""

from __future__ import annotations

import functools
import gc
import operator
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.func import grad_and_value
from torch.fx.experimental.proxy_tensor import make_fx

from .common import SMALL_CONV, Stack

aten = torch.ops.aten


def value_and_grad(
    objective: Callable[..., Tensor],
    *example: Tensor,
    trace: bool = True,
    channels_last: bool = False,
) -> Callable[..., tuple[tuple[Tensor, ...], Tensor]]:
    """``step(*v) -> (∂ Σ objective(*v) / ∂v for each v, objective(*v))``: one iteration's
    work of an optimisation attack, run without autograd bookkeeping (under ``no_grad``).

    With ``trace`` (the default) ``torch.func.grad_and_value`` of the objective — whose dummy
    gradient is itself a ``torch.func.grad``, so this is second order — is traced once on
    ``example`` with ``make_fx`` into a flat graph of ATen operations, and every iteration
    replays that graph: the same operations on the same values (results equal to float
    rounding) without re-running functorch's transform layers, ``functional_call``, module
    calls and the objective's Python on every step — the overhead that dominates an iteration
    on a small model and batch (the sigmoid LeNet at B = 1). The objective must not
    branch on tensor values, and what it closes over (targets, labels, model parameters) is
    baked into the graph as constants. If tracing fails, the untraced function is used.
    ``channels_last`` runs the traced graph's convolutions channels-last
    (:func:`channels_last_convs`). Work on constants alone (reshaping and converting the
    model's weights) is done once at tracing (:func:`fold_constants`), and the replay calls
    ATen directly (:func:`direct_ops`).
    """

    def total(*v: Tensor) -> tuple[Tensor, Tensor]:
        losses = objective(*v)
        return losses.sum(), losses

    fn = grad_and_value(total, argnums=tuple(range(len(example))), has_aux=True)
    example = tuple(v.detach() for v in example)
    if trace:
        try:
            with torch.no_grad(), _no_gc():
                gm = make_fx(fn)(*example)
            gm.graph.eliminate_dead_code()  # e.g. input gradients nothing uses
            if channels_last:
                channels_last_convs(gm)
            with torch.no_grad():
                fold_constants(gm)
            gm.recompile()
            fn = direct_ops(gm, example)
        except Exception:  # noqa: BLE001 - an untraceable op: fall back to eager functorch
            pass

    def step(*v: Tensor) -> tuple[tuple[Tensor, ...], Tensor]:
        with torch.no_grad():
            grads, (_, losses) = fn(*(t.detach() for t in v))
        return tuple(grads), losses

    return step


@contextmanager
def _no_gc() -> Iterator[None]:
    """Python's cyclic garbage collector off while tracing: make_fx creates many short-lived
    objects, and a collection triggered in the middle of tracing walks all of them, which can
    cost as much as the tracing itself; the garbage is collected after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# clip-aware graphs are traced while their per-example gradients, K·B·D floats, stay this small
TRACE_FLOATS = 2**20


def worth_tracing(stack: Stack, clip_aware: bool) -> bool:
    """Whether :func:`value_and_grad` should trace. The plain dummy gradient's iterations are
    overhead-bound, so replaying a trace saves most of their time. The per-example
    (clip-aware) graph is traced only while its per-example gradients (K observations × B
    slots × D parameters) are at most :data:`TRACE_FLOATS` — e.g. the README's main command,
    one cross-gradient of the 15,826-parameter LeNet with 10 slots, where an iteration is
    overhead-bound too and replaying the trace takes about two thirds of the time. A larger
    one is compute-bound (tracing saves nothing per iteration), slow to trace, and its many
    small decomposed operations slow down badly when two OpenMP threads compete with other
    processes."""
    if not (clip_aware and bool(stack.has_clip.any())):
        return True
    return stack.k * stack.batch_size * stack.target.shape[1] <= TRACE_FLOATS


_STRIDE_SENSITIVE = {aten.as_strided.default, aten._reshape_alias.default, aten.set_.source_Tensor}


def channels_last_convs(gm: torch.fx.GraphModule) -> None:
    """Rewrite a traced graph so every 2-d convolution (and its backward) reads channels-last
    tensors — oneDNN's fast layout for grouped convolutions with few channels per group,
    i.e. K observations batched by ``vmap`` (see :func:`onednn_convs`) — and every ``view``
    becomes a ``reshape``, which copies only where a channels-last tensor cannot be viewed.
    A transposed convolution (the double backward's input gradients) becomes the input
    gradient of the forward convolution: the same mathematics, through a oneDNN kernel that
    is cheaper than its transposed convolution (notably at stride 2). Results are the same up
    to float rounding. Left unchanged if the graph has an operation that depends on strides."""
    g = gm.graph
    if any(n.target in _STRIDE_SENSITIVE for n in g.nodes):
        return
    for k, n in enumerate(list(g.nodes)):
        if n.target is aten.convolution.default and n.args[6] and n.args[2] is None:
            y, w, _, stride, padding, dilation, _, _, groups = n.args
            out = n.meta["val"]  # the transposed convolution's output
            name = f"_input_shape_{k}"  # only its shape is read
            layout = torch.channels_last if out.dim() == 4 else torch.contiguous_format
            like_out = torch.empty(out.shape, dtype=out.dtype, device=out.device)
            gm.register_buffer(name, like_out.contiguous(memory_format=layout))
            with g.inserting_before(n):
                like = g.get_attr(name)
                cb = g.call_function(
                    aten.convolution_backward.default,
                    (y, like, w, None, stride, padding, dilation, False, [0, 0], groups),
                    {"output_mask": [True, False, False]},
                )
                grad_input = g.call_function(operator.getitem, (cb, 0))
            n.replace_all_uses_with(grad_input)
            g.erase_node(n)
    for n in list(g.nodes):
        if n.target is aten.convolution.default:
            tensors = (0, 1)
        elif n.target is aten.convolution_backward.default:
            tensors = (0, 1, 2)
        else:
            if n.target in (aten.view.default, aten._unsafe_view.default):
                n.target = aten.reshape.default
            continue
        if n.args[1 if n.target is aten.convolution.default else 2].meta["val"].dim() != 4:
            continue  # the weight: 2-d convolutions only
        args = list(n.args)
        with g.inserting_before(n):
            for i in tensors:
                args[i] = g.call_function(_to_channels_last, (args[i],))
        n.args = tuple(args)


_ATEN_CALL = re.compile(r"torch\.ops\.aten\.(\w+)\.(\w+)\(")


def direct_ops(gm: torch.fx.GraphModule, example: tuple[Tensor, ...]) -> Callable[..., object]:
    """``gm``'s forward with every ATen overload called through its C++ entry point
    (``OpOverload._op``, what ``OpOverload.__call__`` calls) instead of
    ``torch.ops.aten.<op>.<overload>(…)``: no Python frame and no attribute lookups per
    operation. A traced step is a few hundred small operations, so on a small model that
    per-operation Python is a noticeable share of an iteration. The same operations run in
    the same order; checked bitwise on ``example``, else ``gm`` itself is returned."""
    ops: dict[str, object] = {}

    def bind(m: re.Match) -> str:
        name = f"_aten_{m.group(1)}_{m.group(2)}"
        ops[name] = getattr(getattr(torch.ops.aten, m.group(1)), m.group(2))._op
        return f"{name}("

    source = _ATEN_CALL.sub(bind, gm.code)
    namespace = {**gm.graph.python_code(root_module="self").globals, **ops}
    exec(compile(source, "<traced step>", "exec"), namespace)  # noqa: S102
    fast = functools.partial(namespace["forward"], gm)
    with torch.no_grad():
        want = torch.utils._pytree.tree_leaves(gm(*example))
        got = torch.utils._pytree.tree_leaves(fast(*example))
    same = len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    return fast if same else gm


def fold_constants(gm: torch.fx.GraphModule) -> None:
    """Merge repeated pure operations on the same arguments (the same constant read twice
    counts as one argument), then evaluate once every pure operation whose inputs are all
    constants of the graph (the model's parameters, targets, labels baked in by tracing) and
    replace it by its value, so an iteration replays only the work that depends on its
    inputs. In-place operations, random ones and operations without tensor inputs are left
    alone."""
    g = gm.graph
    value: dict[torch.fx.Node, object] = {}
    seen: dict[tuple, torch.fx.Node] = {}
    for n in list(g.nodes):
        if n.op == "get_attr":
            attr = operator.attrgetter(n.target)(gm)
            key: tuple = ("attr", id(attr))
        elif n.op == "call_function" and _pure(n.target):
            key = (n.target, _hashable(n.args), _hashable(n.kwargs))
        else:
            continue
        if key in seen:
            n.replace_all_uses_with(seen[key])
            continue
        seen[key] = n
        if n.op == "get_attr":
            value[n] = attr
        elif n.all_input_nodes and all(i in value for i in n.all_input_nodes):
            args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), value.__getitem__)
            value[n] = n.target(*args, **kwargs)
    folded = 0
    for n in list(g.nodes):
        if n.op != "call_function" or n not in value or all(u in value for u in n.users):
            continue
        if not isinstance(value[n], Tensor):
            continue
        name = f"_folded_{folded}"
        folded += 1
        gm.register_buffer(name, value[n])
        with g.inserting_before(n):
            const = g.get_attr(name)
        n.replace_all_uses_with(const)
    g.eliminate_dead_code()


def _hashable(a: object) -> object:
    if isinstance(a, (list, tuple)):
        return tuple(_hashable(v) for v in a)
    if isinstance(a, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in a.items()))
    if isinstance(a, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(a)
    return a


def _pure(target: object) -> bool:
    if isinstance(target, torch._ops.OpOverload):
        return (
            not target._schema.is_mutable and torch.Tag.nondeterministic_seeded not in target.tags
        )
    return target in (_to_channels_last, operator.getitem)


def _to_channels_last(t: Tensor) -> Tensor:
    return t.contiguous(memory_format=torch.channels_last)


def _widest_conv(model: nn.Module) -> int:
    return max((m.out_channels for m in model.modules() if isinstance(m, nn.Conv2d)), default=0)


def onednn_convs(stack: Stack, examples: int) -> bool:
    """Whether an attack's convolutions run on oneDNN (see :func:`conv_backend`): on the
    CPU, when ``examples`` × the widest convolution's output channels exceeds
    ``SMALL_CONV``. Its traced graphs are then rewritten for oneDNN's fast channels-last
    layout (:func:`channels_last_convs`)."""
    return stack.device.type == "cpu" and examples * _widest_conv(stack.model) > SMALL_CONV


@contextmanager
def conv_backend(stack: Stack, examples: int) -> Iterator[None]:
    """Convolution kernels for one attack. On the CPU, ATen's own (im2col + GEMM) replace
    oneDNN's when ``examples`` (images per convolution call) × the widest convolution's
    output channels is at most ``SMALL_CONV`` — e.g. one image through the 12-channel LeNet —
    where oneDNN's per-call overhead dominates; with 8 or more images through the LeNet, or
    one image through the 64-channel DPDL CNN, oneDNN is faster (figures: README, "Benchmarks").
    Same mathematics, float rounding differs."""
    small = stack.device.type == "cpu" and not onednn_convs(stack, examples)
    before = torch._C._get_mkldnn_enabled()  # only this flag (mkldnn.flags() resets others)
    torch._C._set_mkldnn_enabled(before and not small)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(before)
