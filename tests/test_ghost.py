"""Ghost clipping (privaudit.grads.ghost) and the memory budget (privaudit.grads.memory):
equal to the materialised per-example path, bounded in memory, halving chunks that do not fit."""

import copy
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn
from torchvision.models.resnet import BasicBlock

from privaudit.core.errors import PrivauditError
from privaudit.core.params import ParamSpec, flat_params
from privaudit.core.sampling import IGNORE
from privaudit.grads import PairGrads, ghost, memory
from privaudit.scenario.models import build_model


def gn(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(2, channels)


class TinyResNet(nn.Module):
    """torchvision's BasicBlock with GroupNorm (in-place ReLU, ``out += identity``): a 16×16
    stem, a 8×8 block (explicit conv norms) and a 4×4 block (ghost norms, T = 16)."""

    def __init__(self, width: int = 8, classes: int = 10):
        super().__init__()
        w = width
        self.stem = nn.Sequential(
            nn.Conv2d(3, w, 3, padding=1, bias=False), gn(w), nn.ReLU(inplace=True)
        )
        down2 = nn.Sequential(nn.Conv2d(w, 2 * w, 1, stride=2, bias=False), gn(2 * w))
        down3 = nn.Sequential(nn.Conv2d(2 * w, 4 * w, 1, stride=2, bias=False), gn(4 * w))
        self.blocks = nn.Sequential(
            BasicBlock(w, 2 * w, stride=2, downsample=down2, norm_layer=gn),
            BasicBlock(2 * w, 4 * w, stride=2, downsample=down3, norm_layer=gn),
        )
        self.fc = nn.Linear(4 * w, classes)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


def model_named(name: str) -> nn.Module:
    if name == "tiny-resnet":
        torch.manual_seed(0)
        return TinyResNet().eval()
    return build_model(name, (3, 16, 16), 10)


def pairs(model: nn.Module, p: int = 3, b: int = 5, padded: bool = False, seed: int = 0):
    """P perturbed copies of the parameters and P batches of width b; ``padded``: the second
    batch has 2 real examples, the third none (zero inputs, label IGNORE)."""
    g = torch.Generator().manual_seed(seed)
    flat = flat_params(model).repeat(p, 1)
    flat = flat + 0.05 * torch.randn(flat.shape, generator=g)
    x = torch.rand((p, b, 3, 16, 16), generator=g)
    y = torch.randint(0, 10, (p, b), generator=g)
    if padded:
        x[1, 2:], y[1, 2:] = 0, IGNORE
        x[2], y[2] = 0, IGNORE
    return ParamSpec.of(model), flat, x, y


def materialised(model, spec, flat, x, y, clip, denom):
    """The reference: per-example gradients from torch.func in float64 (a float32 forward of
    one example and of a batch may fall on either side of a ReLU or max-pool tie), clipped,
    summed, / B."""
    model = copy.deepcopy(model).double()
    g = PairGrads(model, spec, path="vmap").per_example(flat.double(), x.double(), y)
    if clip is not None:
        g = g * torch.clamp(clip / (g.norm(dim=-1, keepdim=True) + 1e-12), max=1.0)
    return (g.sum(1) / denom).float()


def assert_relative(got, want, tol=1e-5):
    scale = float(want.abs().max())
    assert float((got - want).abs().max()) <= tol * scale, float((got - want).abs().max()) / scale


@pytest.mark.parametrize("name", ["lenet", "tanh-cnn", "cnn", "tiny-resnet"])
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
@pytest.mark.parametrize("clip", [0.05, 1e6, None], ids=["clipped", "unclipped", "no-clip"])
def test_ghost_equals_materialised(name, padded, clip):
    model = model_named(name)
    spec, flat, x, y = pairs(model, padded=padded)
    grads = PairGrads(model, spec, batch_size=4, path="ghost")
    got = grads.clipped_mean(flat, x, y, clip)
    want = materialised(model, spec, flat, x, y, clip, 4)
    assert_relative(got, want)
    if padded:
        assert float(got[2].abs().max()) == 0.0  # a batch without examples: a zero sum
    if clip is None:  # the plain mean too
        assert_relative(grads.mean(flat, x, y), want)
    elif clip < 1 and not padded:  # every example clipped: the mean has norm ≤ C
        assert float(got.norm(dim=1).max()) <= clip * (1 + 1e-5)


@pytest.mark.parametrize("name", ["lenet", "tanh-cnn"])
def test_ghost_equals_the_materialised_engines_themselves(name):
    """Small models without ReLU ties: ghost against PairGrads' own vmap and pairnet paths,
    with owners (pairs sharing batches)."""
    model = model_named(name)
    spec, flat, x, y = pairs(model, p=6, padded=True)
    owner = torch.tensor([0, 1, 2, 0, 1, 2])
    xs, ys = x[:3], y[:3]
    want = PairGrads(model, spec, batch_size=4, path="vmap").clipped_mean(flat, xs, ys, 0.05, owner)
    got = PairGrads(model, spec, batch_size=4, path="ghost").clipped_mean(flat, xs, ys, 0.05, owner)
    assert_relative(got, want)
    stacked = PairGrads(model, spec, batch_size=4, path="pairnet")
    assert_relative(stacked.clipped_mean(flat, xs, ys, 0.05, owner), want)


@pytest.mark.parametrize("cheaper", [True, False], ids=["all-ghost", "all-explicit"])
def test_conv_norms_both_ways(cheaper, monkeypatch):
    """Every conv layer by the Gram matrices (2), then every one explicitly: same result."""
    monkeypatch.setattr(ghost, "ghost_is_cheaper", lambda *a: cheaper)
    model = model_named("tiny-resnet")
    spec, flat, x, y = pairs(model, p=2)
    got = PairGrads(model, spec, batch_size=5, path="ghost").clipped_mean(flat, x, y, 0.05)
    assert_relative(got, materialised(model, spec, flat, x, y, 0.05, 5))


@pytest.mark.parametrize(
    "conv",
    [
        nn.Conv2d(4, 6, 3, stride=2, padding=1),
        nn.Conv2d(4, 6, 3, padding="same", dilation=2, padding_mode="reflect"),
        nn.Conv2d(4, 6, (3, 2), stride=(1, 2), padding=(2, 0), groups=2, bias=False),
        nn.Conv2d(4, 4, 5, padding="valid", padding_mode="circular"),
    ],
    ids=["strided", "same-dilated-reflect", "grouped", "valid-circular"],
)
@pytest.mark.parametrize("cheaper", [True, False], ids=["ghost", "explicit"])
def test_conv_norm_sample_is_the_per_example_gradient_norm(conv, cheaper, monkeypatch):
    monkeypatch.setattr(ghost, "ghost_is_cheaper", lambda *a: cheaper)
    torch.manual_seed(0)
    a = torch.randn(3, 4, 9, 10)
    g = torch.randn_like(conv(a))
    norms = ghost.conv2d_norm_sample(conv, [a], g)
    kept = ghost.conv2d_kept(conv, [a], g)
    c = torch.tensor([0.3, 1.0, -2.0])
    sums = {p: torch.zeros_like(p) for p in conv.parameters()}
    for i in range(3):
        out = conv(a[i : i + 1])
        want = torch.autograd.grad(out, list(conv.parameters()), g[i : i + 1])
        for p, w in zip(conv.parameters(), want, strict=True):
            torch.testing.assert_close(norms[p][i], w.norm(), rtol=1e-5, atol=1e-6)
            sums[p] += c[i] * w
    for p, want in sums.items():  # the book-kept clipped sum Σ_i c_i ∇_p ℓ_i
        torch.testing.assert_close(kept[p].weighted(c), want, rtol=1e-5, atol=1e-5)


class TiedNorm(nn.Module):
    """One GroupNorm applied twice (a layer outside ghost.KEEPERS used more than once)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.GroupNorm(2, 4)
        self.fc = nn.Linear(4, 10)

    def forward(self, x):
        h = self.norm(torch.tanh(self.norm(self.conv(x))))
        return self.fc(h.mean((2, 3)))


def test_a_layer_used_twice_sums_its_uses_per_example():
    model = TiedNorm().eval()
    spec, flat, x, y = pairs(model, p=2)
    got = PairGrads(model, spec, batch_size=5, path="ghost").clipped_mean(flat, x, y, 0.05)
    assert_relative(got, materialised(model, spec, flat, x, y, 0.05, 5))


def test_ghost_on_resnet18():
    """The model it is for: torchvision's ResNet-18 with GroupNorm, two examples."""
    model = build_model("resnet18", (3, 16, 16), 10)
    spec, flat, x, y = pairs(model, p=1, b=2)
    grads = PairGrads(model, spec, batch_size=2)
    assert grads.uses_ghost(x)  # auto: 2 × 11.2 M parameters × 4 bytes > GHOST_BYTES
    got = grads.clipped_mean(flat, x, y, 1.0)
    assert_relative(got, materialised(model, spec, flat, x, y, 1.0, 2))


def test_auto_path_and_forcing(monkeypatch):
    small = build_model("lenet", (3, 16, 16), 10)
    spec, flat, x, y = pairs(small)
    assert not PairGrads(small, spec, batch_size=8).uses_ghost(x)
    assert PairGrads(small, spec, path="ghost").uses_ghost(x)
    monkeypatch.setenv("PRIVAUDIT_GRADS", "ghost")
    assert PairGrads(small, spec).path == "ghost"
    monkeypatch.setenv("PRIVAUDIT_GRADS", "fast")
    with pytest.raises(PrivauditError, match="unknown gradient path"):
        PairGrads(small, spec)
    monkeypatch.delenv("PRIVAUDIT_GRADS")

    class WithBatchNorm(nn.Module):  # opacus refuses it: per-example gradients undefined
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)
            self.fc = nn.Linear(4 * 14 * 14, 10)

        def forward(self, x):
            return self.fc(self.bn(self.conv(x)).flatten(1))

    bn = WithBatchNorm().eval()
    spec = ParamSpec.of(bn)
    with pytest.raises(PrivauditError, match="ghost gradient path"):
        PairGrads(bn, spec, path="ghost").clipped_mean(flat_params(bn)[None], x[:1], y[:1], 1.0)


def test_budget_smaller_than_a_pair_chunks_its_examples():
    """A budget for 2 examples beside the model: chunks of 2, same result as one chunk."""
    model = model_named("tiny-resnet")
    spec, flat, x, y = pairs(model, p=2, b=5)
    whole = PairGrads(model, spec, batch_size=5, path="ghost")
    want = whole.clipped_mean(flat, x, y, 0.05)
    clipper = whole.ghost()
    two = clipper.fixed_bytes + 2 * clipper.example_bytes(x[0])
    grads = PairGrads(model, spec, batch_size=5, path="ghost", max_memory=int(two))
    sizes = []
    inner = grads.ghost().clipped_sum
    grads.ghost().clipped_sum = lambda xs, *a: sizes.append(len(xs)) or inner(xs, *a)
    got = grads.clipped_mean(flat, x, y, 0.05)
    assert sizes == [2, 2, 1, 2, 2, 1]
    assert_relative(got, want)


def test_out_of_memory_halves_the_chunk_and_retries():
    """A chunk that runs out of memory (simulated above 2 examples) is halved and retried; the
    smaller chunk is kept for the later pairs; the result is unchanged."""
    model = model_named("tiny-resnet")
    spec, flat, x, y = pairs(model, p=2, b=5)
    grads = PairGrads(model, spec, batch_size=5, path="ghost")
    want = grads.clipped_mean(flat, x, y, 0.05)
    tried = []
    inner = grads.ghost().clipped_sum

    def tight(xs, *a):
        tried.append(len(xs))
        if len(xs) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        inner(xs, *a)

    grads.ghost().clipped_sum = tight
    got = grads.clipped_mean(flat, x, y, 0.05)
    assert tried == [5, 2, 2, 1, 2, 2, 1]  # 5 fails, halved to 2; pair 2 starts at 2
    assert grads.ghost_chunk == 2
    assert_relative(got, want)


def test_what_does_not_fit_is_one_line_naming_the_fixes():
    model = model_named("tiny-resnet")
    spec, flat, x, y = pairs(model, p=1)
    for grads in [
        PairGrads(model, spec, path="ghost", max_memory=1024),  # below one example
        PairGrads(model, spec, path="vmap", max_memory="1K"),  # below one pair
    ]:
        with pytest.raises(PrivauditError) as err:
            grads.clipped_mean(flat, x, y, 1.0)
        message = str(err.value)
        assert "\n" not in message
        for fix in ("--max-memory", "--batch-size", "--agents", "--device"):
            assert fix in message
    grads = PairGrads(model, spec, path="ghost")

    def never(*a):
        raise MemoryError

    grads.ghost().clipped_sum = never  # not even one example fits
    with pytest.raises(PrivauditError, match="one example of a .* does not fit in memory"):
        grads.clipped_mean(flat, x, y, 1.0)


def test_vmap_path_runs_in_chunks_of_pairs_within_the_budget():
    model = model_named("cnn")
    spec, flat, x, y = pairs(model, p=5, padded=True)
    want = PairGrads(model, spec, batch_size=4, path="vmap").clipped_mean(flat, x, y, 0.05)
    grads = PairGrads(model, spec, batch_size=4, path="vmap")
    each = x.shape[1] * (2 * grads.example_bytes(flat, x) + 3 * 4 * flat.shape[1])
    grads.max_memory = int(2 * each)  # two pairs per chunk
    calls = []
    inner = grads._per_example
    grads._per_example = lambda f, *a: calls.append(len(f)) or inner(f, *a)
    got = grads.clipped_mean(flat, x, y, 0.05)
    assert calls == [2, 2, 1]
    assert_relative(got, want)


def test_sizes_and_out_of_memory_errors():
    assert memory.parse_size("4G") == 4 * 2**30
    assert memory.parse_size("512m") == 512 * 2**20
    assert memory.parse_size("1.5GB") == int(1.5 * 2**30)
    assert memory.parse_size(1000) == 1000
    for bad in ("lots", "-1G", "0", True):
        with pytest.raises(PrivauditError, match="--max-memory"):
            memory.parse_size(bad)
    assert memory.is_out_of_memory(MemoryError())
    assert memory.is_out_of_memory(
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"
        )
    )
    assert not memory.is_out_of_memory(RuntimeError("shape mismatch"))
    assert memory.budget(None, torch.device("cpu")) > 0  # half of MemAvailable
    assert memory.budget(123, torch.device("cpu")) == 123


PEAK = textwrap.dedent(
    """
    import sys, torch
    torch.set_num_threads(1)
    sys.path.insert(0, {tests!r})
    from test_ghost import TinyResNet, pairs
    from privaudit.grads import PairGrads
    model = TinyResNet(width=32).eval()
    spec, flat, x, y = pairs(model, p=int(sys.argv[1]), b=48)
    grads = PairGrads(model, spec, batch_size=48, path="ghost")
    grads.clipped_mean(flat[:1], x[:1], y[:1], 1.0)  # opacus imported, shapes probed
    grads.clipped_mean(flat, x, y, 1.0)
    # VmHWM, not ru_maxrss: a child's ru_maxrss starts from its parent's RSS at the fork
    hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
    print(int(hwm.split()[1]) * 1024, spec.numel)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_ghost_memory_does_not_grow_with_pairs():
    """Peak RSS (a fresh process each) of 8 pairs within 10 % of 2 pairs' — where the
    materialised per-example gradients would add 6 × 48 × D floats (330 MB)."""
    script = PEAK.format(tests=str(Path(__file__).parent))
    peaks = {}
    for p in (2, 8):
        out = subprocess.run(
            [sys.executable, "-c", script, str(p)], capture_output=True, text=True, check=True
        )
        peak, numel = map(int, out.stdout.split())
        peaks[p] = peak
    assert peaks[8] <= 1.1 * peaks[2], peaks
    # the 10 % allowed is under half of what materialising would have added
    assert 0.1 * peaks[2] < 0.5 * 6 * 48 * numel * 4
