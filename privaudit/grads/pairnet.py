"""Per-example clipped gradients of P (model, batch) pairs in one forward and one backward.

``torch.func``'s nested ``vmap`` (:mod:`privaudit.grads`) is general, but on the CPU it
spends most of a DPDL round materialising and concatenating per-example gradients. This
engine runs the model once for all P pairs with the pairs stacked along the channel
dimension — every ``Conv2d`` becomes one grouped convolution (groups = P), every ``Linear``
one batched matmul — and one autograd backward of the summed per-example losses gives each
layer's output gradient per example (examples never interact). From activations and output
gradients, as opacus computes grad samples:

- a convolution's per-example weight gradients are one weight-gradient convolution with one
  group per example, its bias gradients from the same kernel;
- a linear layer's per-example gradient g aᵀ is never materialised: its squared norm is
  ‖g‖²‖a‖² (the ghost norm, Goodfellow 2015; Li et al. 2022) and the clipped sum one
  einsum Σ_b f_b g_b a_bᵀ.

Every convolution runs channels-last (the layout oneDNN's grouped convolutions with few
channels per group run directly, the stride-2 input gradient above all), with 12 channels per
pair zero-padded to 16 (:func:`padded_channels`); per-example weight gradients are read in
that memory order, so the only layout copies are one per activation into the
one-image-per-example layout. Pairs that share a batch (``owner``: DPDL's self and cross
pairs of one data owner) read it once, and their first convolution is one group with all
their filters. Large calls run in chunks of pairs (``CHUNK_FLOATS``) so each chunk's
tensors stay in cache; Poisson batches of different sizes run in chunks of similar sizes,
each padded only to its own widest batch.

The clip factors f_b = min(1, C/(‖g_b‖ + 1e-12))/B (:func:`privaudit.grads.clip_rows`), B the
expected batch size, weight one batched sum per layer; the padded slots of a Poisson batch
(:mod:`privaudit.core.sampling`) have ignored labels, so their gradients, and their terms, are 0.
Same mathematics as the ``vmap`` path; float rounding differs (relative 1e-6 on the default
LeNet and the DPDL CNN, ``tests/test_grads.py``).

Supported models: parametrised layers are ``Conv2d`` (groups = 1, zero padding) and
``Linear``; every other module is parameter-free and acts per channel or per element
(activations, pooling, flatten, dropout in eval mode). Anything else — normalisation layers,
embeddings, a forward that reshapes across channels — is refused by :func:`build` or by a
numerical check of the first call against the model itself, and the caller falls back to
``vmap``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from privaudit.core.params import ParamSpec
from privaudit.core.sampling import IGNORE

# parameter-free modules that act per channel or per element, so stacking pairs along the
# channel dimension does not mix them
CHANNELWISE = (
    nn.Sigmoid,
    nn.ReLU,
    nn.Tanh,
    nn.LeakyReLU,
    nn.ELU,
    nn.GELU,
    nn.SiLU,
    nn.Softplus,
    nn.MaxPool2d,
    nn.AvgPool2d,
    nn.Identity,
    nn.Flatten,
    nn.Dropout,
)
CHECK_TOL = 1e-4  # relative agreement of the first call's logits with the model itself
# floats of the largest stacked activation per chunk of pairs (4 MB): larger calls run in
# chunks, whose activations and per-example gradients stay in cache between the layers'
# kernels
CHUNK_FLOATS = 1 << 20
# (pair, example) slots of padding worth a chunk of its own: a chunk costs about a dozen
# per-example gradients (LeNet, DPDL pairs, one thread), so Poisson batches of different
# sizes run in chunks of similar sizes rather than all padded to the largest
WIDEN_SLOTS = 12


def padded_channels(c: int) -> int:
    """Channels per pair a stacked convolution computes for ``c`` real ones: the next multiple
    of 8 when that adds at most a third (12 → 16, 20 → 24), else ``c``. oneDNN blocks 12
    channels in fours; zero-padded to 16 they fill its 16-wide AVX-512 blocks, so the forward
    and input-gradient convolutions of the stacked LeNet cost less despite 1.8× the
    multiply-adds. Smaller counts (4, 6, 8, 10) do not gain from padding, hence ``c > 8`` and
    the limit of a third; per-example weight gradients keep the real channels (padding would
    only add work there)."""
    up = -(-c // 8) * 8
    return up if c > 8 and 3 * up <= 4 * c else c


@dataclass
class _Tape:
    """What the stacked layers read (the pairs' parameters) and record (inputs, outputs)."""

    params: dict[str, Tensor] = field(default_factory=dict)  # name -> (P, *shape)
    pairs: int = 1
    # (layer, input, output, channel groups of the input) per stacked layer
    records: list[tuple[nn.Module, Tensor, Tensor, int]] = field(default_factory=list)
    channels: tuple[int, int] | None = None  # (real, computed) channels of the last conv
    shared: int = 1  # pairs per input batch, until the first layer has read the input


class _StackedConv(nn.Module):
    """``Conv2d`` for P pairs: (B, P·Cin, H, W) -> (B, P·Cout, H', W'), groups = P.

    With ``out`` > Cout every pair's output is zero-padded to ``out`` channels (zero weights
    and bias, :func:`padded_channels`); a convolution fed padded channels gives them zero
    weights, a linear layer drops them, so the padding never reaches the logits."""

    def __init__(self, conv: nn.Conv2d, name: str, tape: _Tape, out: int):
        super().__init__()
        self.conv, self.name, self.tape, self.out = conv, name, tape, out

    def forward(self, a: Tensor) -> Tensor:
        c, t = self.conv, self.tape
        w = t.params[f"{self.name}.weight"]
        b = t.params.get(f"{self.name}.bias")
        o, i = w.shape[1:3]
        groups = t.pairs // t.shared  # one per input batch: its pairs' filters side by side
        cin = a.shape[1] // groups
        if (self.out, cin) != (o, i):  # zero weights to and from padded channels
            w = F.pad(w, (0, 0, 0, 0, 0, cin - i, 0, self.out - o))
            b = None if b is None else F.pad(b, (0, self.out - o))
        w = w.reshape(t.pairs * self.out, *w.shape[2:])
        a = a.contiguous(memory_format=torch.channels_last)
        z = F.conv2d(
            a, w, None if b is None else b.reshape(-1), c.stride, c.padding, c.dilation, groups
        )
        t.records.append((self, a, z.requires_grad_() if not z.requires_grad else z, groups))
        t.channels, t.shared = (o, self.out), 1
        return z


class _StackedLinear(nn.Module):
    """``Linear`` for P pairs: (B, P·F) -> (B, P·O), one batched matmul."""

    def __init__(self, linear: nn.Linear, name: str, tape: _Tape):
        super().__init__()
        self.linear, self.name, self.tape = linear, name, tape

    def forward(self, a: Tensor) -> Tensor:
        t = self.tape
        a = a.reshape(a.shape[0], t.pairs, -1)
        if a.shape[2] != self.linear.in_features and t.channels is not None:
            real, computed = t.channels  # drop the padded channels of the last conv
            a = a.reshape(*a.shape[:2], computed, -1)[:, :, :real].reshape(*a.shape[:2], -1)
        z = torch.einsum("bpf,pof->bpo", a, t.params[f"{self.name}.weight"])
        if self.linear.bias is not None:
            z = z + t.params[f"{self.name}.bias"]
        t.records.append((self, a, z.requires_grad_() if not z.requires_grad else z, t.pairs))
        return z.reshape(a.shape[0], -1)


class PairNet:
    """The model's stacked twin; :meth:`clipped_mean` is the engine. Build with :func:`build`."""

    def __init__(self, model: nn.Module, stacked: nn.Module, tape: _Tape, shares_input: bool):
        self.model, self.stacked, self.tape = model, stacked, tape
        self.shares_input = shares_input  # the first layer is a convolution of the input
        self.spec = ParamSpec.of(model)
        self.checked: dict[tuple, bool] = {}  # (input shape, pairs per batch) -> agrees
        self.example_floats: dict[tuple, int] = {}  # largest activation per example

    def _forward(self, params: dict[str, Tensor], x: Tensor, rows: Tensor, shared: int) -> Tensor:
        """Logits (B, P, classes) of every pair at its parameters, layers recorded: the
        batches ``x[rows]`` stacked, each the input of ``shared`` consecutive pairs."""
        b, r = x.shape[1], len(rows)
        p = r * shared
        t = self.tape
        t.params, t.pairs, t.records, t.channels, t.shared = params, p, [], None, shared
        if x.dim() == 5:
            # channels-last in one copy: (N, B, C, H, W) -> memory (B, H, W, R·C), as a
            # gather along N (cheaper than a contiguous copy of the permuted view)
            h, w = x.shape[3:]
            stacked = x.permute(1, 3, 4, 0, 2).index_select(3, rows)
            stacked_x = stacked.reshape(b, h, w, -1).permute(0, 3, 1, 2)
        else:
            picked = x.index_select(0, rows).transpose(0, 1)
            stacked_x = picked.reshape(b, r * x.shape[2], *x.shape[3:])
        return self.stacked(stacked_x).reshape(b, p, -1)

    def _grouping(self, owner: Tensor) -> tuple[Tensor, int]:
        """Pairs in the order they are stacked and how many share each batch: grouped by
        owner when every owner has the same number m of pairs and the first layer is a
        convolution (one grouped convolution per batch then computes all m pairs' first
        layer: a DPDL ring owns 3 pairs per batch), else one batch per pair."""
        counts = torch.bincount(owner)
        counts = counts[counts > 0]
        m = int(counts[0])
        if m > 1 and self.shares_input and bool((counts == m).all()):
            return torch.argsort(owner, stable=True), m
        return torch.arange(len(owner), device=owner.device), 1

    def agrees(self, flat: Tensor, x: Tensor, owner: Tensor, order: Tensor, m: int) -> bool:
        """Whether the stacked forward gives the model's own logits (the first batch's pairs,
        or the first two pairs; two examples), once per input shape and grouping
        (:meth:`_grouping`): catches a forward that mixes channels. The same forward records
        the largest activation per example, which sizes the chunks of :meth:`clipped_mean`."""
        key = (*x.shape[2:], m)
        if key not in self.checked:
            pick = order[: m if m > 1 else 2]
            sub = self.spec.unflatten(flat.index_select(0, pick))
            x2 = x[:, :2]
            with torch.no_grad():
                ref = torch.stack(
                    [
                        functional_call(
                            self.model, {n: v[i] for n, v in sub.items()}, (x2[owner[j]],)
                        )
                        for i, j in enumerate(pick.tolist())
                    ]
                )
                try:
                    ours = self._forward(sub, x2, owner[pick][::m], m).transpose(0, 1).detach()
                except RuntimeError:  # e.g. a reshape that assumed one model's channels
                    ours = None
            sizes = [t.numel() for _, a, z, _ in self.tape.records for t in (a, z)]
            self.example_floats[key] = max(sizes, default=0) // (len(pick) * x2.shape[1])
            self.tape.records = []
            ok = ours is not None and ours.shape == ref.shape
            err = float((ours - ref).abs().max()) / max(float(ref.abs().max()), 1e-30) if ok else 1
            self.checked[key] = ok and err <= CHECK_TOL
        return self.checked[key]

    def clipped_mean(
        self,
        flat: Tensor,
        x: Tensor,
        y: Tensor,
        clip: float,
        owner: Tensor | None = None,
        batch_size: int | None = None,
    ) -> Tensor | None:
        """``(1/B) Σ_b clip_C(∇ CE(f(x_pb; θ_p), y_pb))`` per pair p, (P, D) in the flat
        layout of ``flat`` (P, D) (:class:`~privaudit.core.params.ParamSpec` of the model); ``x``
        (N, W, …), ``y`` (N, W) the padded batches (:mod:`privaudit.core.sampling`: a padded
        slot's label is ignored, its gradient exactly 0), pair p's being ``owner[p]``
        (default p); B is ``batch_size`` (default W). None when the stacked forward does not
        reproduce the model (:meth:`agrees`): the caller falls back. In chunks of pairs whose
        batches need similar widths (:meth:`_chunks`), each within ``CHUNK_FLOATS``."""
        owner = torch.arange(len(x), device=x.device) if owner is None else owner
        order, m = self._grouping(owner)
        if not self.agrees(flat, x, owner, order, m):
            return None
        denom = x.shape[1] if batch_size is None else batch_size
        # the slots each batch needs: up to its last real example (all W without padding)
        rank = torch.arange(1, x.shape[1] + 1, device=y.device)
        need = ((y != IGNORE) * rank).amax(1)[owner[order]]
        by_need = torch.argsort(need, stable=True)  # keeps a batch's pairs side by side
        need = need[by_need].tolist()
        order = order[by_need]
        moved = m > 1 or need[0] != need[-1]
        if moved:
            flat, owner = flat.index_select(0, order), owner[order]
        out = torch.empty_like(flat)
        for s, e, w in self._chunks(need, m, self.example_floats[(*x.shape[2:], m)]):
            if w == 0:  # empty batches: no example, a zero sum
                out[s:e] = 0
                continue
            xs, ys = x[:, :w], y[:, :w]
            self._clipped_mean(flat[s:e], xs, ys, owner[s:e], m, clip, denom, out[s:e])
        return torch.empty_like(out).index_copy_(0, order, out) if moved else out

    @staticmethod
    def _chunks(need: list[int], m: int, example_floats: int) -> list[tuple[int, int, int]]:
        """``(start, end, width)`` chunks of the pairs, sorted by the slots ``need`` of their
        batches (``m`` pairs per batch): a new chunk wherever widening the current one to the
        next batch would pad more than ``WIDEN_SLOTS`` (pair, example) slots, then each such
        run in equal chunks of whole batches whose stacked activations stay within
        ``CHUNK_FLOATS``. Each chunk is padded only to its own widest batch, not to the
        round's."""
        runs, start, p = [], 0, len(need)
        for end in range(m, p + 1, m):
            if end == p or (end - start) * (need[end] - need[end - 1]) > WIDEN_SLOTS:
                runs.append((start, end))
                start = end
        out = []
        for start, end in runs:
            width, pairs = need[end - 1], end - start
            chunks = max(1, -(-pairs * width * example_floats // CHUNK_FLOATS))
            step = -(-pairs // chunks)  # ⌈pairs / chunks⌉ ...
            step = -(-step // m) * m  # ... in whole batches
            out += [(s, min(s + step, end), width) for s in range(start, end, step)]
        return out

    def _clipped_mean(
        self,
        flat: Tensor,
        x: Tensor,
        y: Tensor,
        owner: Tensor,
        m: int,
        clip: float,
        denom: int,
        out: Tensor,
    ) -> None:
        p, b = len(owner), x.shape[1]
        with torch.enable_grad():
            logits = self._forward(self.spec.unflatten(flat), x, owner[::m], m)
            labels = y.index_select(0, owner).t().reshape(-1)
            loss = F.cross_entropy(
                logits.reshape(b * p, -1), labels, ignore_index=IGNORE, reduction="sum"
            )
            records = self.tape.records
            self.tape.records = []
            grads = torch.autograd.grad(loss, [z for _, _, z, _ in records])
        parts = [
            _per_example(layer, a.detach(), g, b, p, groups)
            for (layer, a, _, groups), g in zip(records, grads, strict=True)
        ]
        sq = sum(part.sq for part in parts)
        factor = (clip / (sq.sqrt() + 1e-12)).clamp(max=1.0) / denom
        named = self.spec.unflatten(out)
        for (layer, *_), part in zip(records, parts, strict=True):
            part.weighted(factor, named[f"{layer.name}.weight"], named.get(f"{layer.name}.bias"))


@dataclass
class _Part:
    """One layer's per-example gradients, (B, P, …), or its linear factors."""

    weight: Tensor | None  # conv: (B, P, O·k·k·I), channels-last order
    bias: Tensor | None  # (B, P, O)
    shape: tuple[int, ...]  # the weight's, in the order of ``weight``'s last dim
    sq: Tensor  # (B, P): squared norm of each example's gradient in this layer
    g: Tensor | None = None  # linear: output gradients (B, P, O)
    a: Tensor | None = None  # linear: inputs (B, P, F)
    order: tuple[int, ...] | None = None  # permutes ``shape`` to the weight's (O, I, k, k)

    def weighted(self, f: Tensor, weight: Tensor, bias: Tensor | None) -> None:
        """Σ_b f[b, p] · (this layer's gradient of example (b, p)) per pair, written into
        ``weight`` (P, *shape) and ``bias`` (P, O)."""
        if self.weight is not None:
            w = torch.einsum("bp,bpd->pd", f, self.weight)
        else:
            w = torch.einsum("bpo,bpf->pof", self.g * f[..., None], self.a)
        w = w.reshape(w.shape[0], *self.shape)
        if self.order is not None:
            w = w.permute(0, *(1 + d for d in self.order))
        weight.copy_(w)
        if bias is not None:
            bias.copy_(torch.einsum("bp,bpo->po", f, self.bias))


def _per_example(layer: nn.Module, a: Tensor, g: Tensor, b: int, p: int, groups: int) -> _Part:
    """One layer's per-example gradients from its input ``a`` (``groups`` channel groups:
    one per pair, or one per batch shared by P/groups pairs) and output gradients ``g``."""
    if isinstance(layer, _StackedLinear):
        has_bias = layer.linear.bias is not None
        g2 = _sq(g)
        sq = g2 * _sq(a) + (g2 if has_bias else 0)
        w_shape = tuple(layer.linear.weight.shape)
        return _Part(None, g if has_bias else None, w_shape, sq, g=g, a=a)
    c: nn.Conv2d = layer.conv
    e = b * p
    o, i, kh, kw = c.weight.shape
    w1 = torch.empty(  # only its shape and layout are read
        (e * o, i, kh, kw), dtype=a.dtype, device=a.device, memory_format=torch.channels_last
    )
    # one group per example and batch: the P/groups pairs sharing a batch are side by side
    a1, g1 = _one_image_per_example(a, groups, i), _one_image_per_example(g, p, o)
    has_bias = c.bias is not None
    _, gw, gb = torch.ops.aten.convolution_backward(
        g1,
        a1,
        w1,
        [e * o],
        c.stride,
        c.padding,
        c.dilation,
        False,
        [0, 0],
        b * groups,
        [False, True, has_bias],
    )
    # read in channels-last memory order (O, k, k, I): a free view, no reordering copy
    gw = gw.permute(0, 2, 3, 1).reshape(b, p, -1)
    gb = gb.reshape(b, p, o) if has_bias else None
    sq = _sq(gw) + (_sq(gb) if gb is not None else 0)
    return _Part(gw, gb, (o, kh, kw, i), sq, order=(0, 3, 1, 2))


def _sq(t: Tensor) -> Tensor:
    """Squared norms over the last dim without a squared temporary."""
    return torch.linalg.vector_norm(t, dim=-1).square()


def _one_image_per_example(t: Tensor, groups: int, c: int) -> Tensor:
    """(B, G·C', H, W) in either layout, C' ≥ C channels per group of which the first C are
    real -> (1, B·G·C, H, W) channels-last (memory (H, W, B·G·C)), in one copy."""
    h, w = t.shape[2:]
    rows = t.permute(2, 3, 0, 1).reshape(h, w, -1, groups, t.shape[1] // groups)[..., :c]
    return rows.reshape(h, w, -1).permute(2, 0, 1).unsqueeze(0)


def build(model: nn.Module) -> PairNet | None:
    """The stacked twin of ``model``, or None if a module is not supported (see module
    docstring)."""
    tape = _Tape()
    stacked = copy.deepcopy(model)
    # pad every convolution's channels but the last layer's, whose outputs are the logits
    layers = [n for n, m in model.named_modules() if type(m) in (nn.Conv2d, nn.Linear)]

    def convert(module: nn.Module, prefix: str) -> bool:
        for name, child in list(module.named_children()):
            full = f"{prefix}{name}"
            if type(child) is nn.Conv2d:
                if (
                    child.groups != 1
                    or child.padding_mode != "zeros"
                    or isinstance(child.padding, str)
                ):
                    return False
                out = child.out_channels
                out = out if layers[-1] == full else padded_channels(out)
                setattr(module, name, _StackedConv(child, full, tape, out))
            elif type(child) is nn.Linear:
                setattr(module, name, _StackedLinear(child, full, tape))
            elif isinstance(child, CHANNELWISE):
                if isinstance(child, nn.Flatten) and child.start_dim != 1:
                    return False
            elif type(child) is nn.Sequential or (
                not list(child.parameters(recurse=False)) and list(child.children())
            ):
                if not convert(child, f"{full}."):
                    return False
            else:
                return False
        return True

    if list(model.parameters(recurse=False)) or not convert(stacked, ""):
        return None
    if any(n.split(".")[-1] not in ("weight", "bias") for n, _ in model.named_parameters()):
        return None
    first = bool(layers) and type(model.get_submodule(layers[0])) is nn.Conv2d
    return PairNet(model, stacked.eval(), tape, shares_input=first)
