"""PairGrads: the stacked per-example engine (privaudit.grads.pairnet) against torch.func's vmap."""

import pytest
import torch
from torch import nn

from privaudit.core.params import ParamSpec, flat_params
from privaudit.grads import PairGrads, clip_rows, pairnet
from privaudit.scenario.models import build_model
from privaudit.sim.allocator import keep_freed_memory


def pairs(model: nn.Module, p: int = 3, b: int = 4, shape=(3, 32, 32), seed: int = 0):
    """P perturbed copies of the model's parameters and P random batches."""
    g = torch.Generator().manual_seed(seed)
    spec = ParamSpec.of(model)
    flat = flat_params(model).repeat(p, 1)
    flat = flat + 0.05 * torch.randn(flat.shape, generator=g)
    x = torch.rand((p, b, *shape), generator=g)
    y = torch.randint(0, 10, (p, b), generator=g)
    return spec, flat, x, y


def vmap_clipped_mean(grads: PairGrads, flat, x, y, clip):
    return clip_rows(grads.per_example(flat, x, y), clip).mean(1)


@pytest.mark.parametrize("name", ["lenet", "cnn"])
@pytest.mark.parametrize("clip", [0.05, 1e6])  # every example clipped / none clipped
def test_stacked_engine_matches_vmap(name, clip):
    model = build_model(name, (3, 32, 32), 10)
    spec, flat, x, y = pairs(model)
    grads = PairGrads(model, spec)
    assert grads._stacked is not None
    got = grads.clipped_mean(flat, x, y, clip)
    want = vmap_clipped_mean(grads, flat, x, y, clip)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))
    if clip < 1:  # every example clipped to norm C: the mean has norm ≤ C
        assert float(got.norm(dim=1).max()) <= clip * (1 + 1e-5)
    # and is not the unclipped mean
    assert not torch.allclose(got, grads.mean(flat, x, y), atol=1e-6) or clip > 1


def test_stacked_engine_gradient_is_the_true_per_example_gradient():
    """One example per pair: the engine's unclipped result is autograd's gradient."""
    model = build_model("lenet", (3, 16, 16), 10)
    spec, flat, x, y = pairs(model, p=2, b=1, shape=(3, 16, 16))
    got = PairGrads(model, spec).clipped_mean(flat, x, y, 1e9)
    for i in range(2):
        m = build_model("lenet", (3, 16, 16), 10)
        torch.nn.utils.vector_to_parameters(flat[i], m.parameters())
        loss = nn.functional.cross_entropy(m(x[i]), y[i])
        want = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(m.parameters()))])
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


def test_chunked_pairs_give_the_same_result(monkeypatch):
    """Above ``CHUNK_FLOATS`` the pairs run in chunks: same result as one call."""
    model = build_model("lenet", (3, 32, 32), 10)
    spec, flat, x, y = pairs(model, p=5)
    grads = PairGrads(model, spec)
    whole = grads.clipped_mean(flat, x, y, 0.05)
    per_pair = x.shape[1] * grads._stacked.example_floats[(*x.shape[2:], 1)]
    assert per_pair >= x[0].numel()  # at least the input itself
    calls = []
    inner = grads._stacked._clipped_mean
    monkeypatch.setattr(grads._stacked, "_clipped_mean", lambda *a: calls.append(1) or inner(*a))
    monkeypatch.setattr(pairnet, "CHUNK_FLOATS", 2 * per_pair)  # 2 pairs per chunk: 2, 2, 1
    chunked = grads.clipped_mean(flat, x, y, 0.05)
    assert len(calls) == 3
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6 * float(whole.abs().max()))


@pytest.mark.parametrize(
    "owner",
    [[0, 1, 2, 0, 1, 2], [2, 0, 1, 1, 0, 2], [0, 0, 1, 2, 2, 2]],
    ids=["ring-order", "shuffled", "unequal"],
)
def test_pairs_sharing_batches_match_one_batch_per_pair(owner, monkeypatch):
    """``owner``: pairs that share a batch read it once (grouped first layer when every batch
    has as many pairs, otherwise one batch per pair); chunked or not, same result as vmap."""
    model = build_model("lenet", (3, 16, 16), 10)
    spec, flat, x, y = pairs(model, p=6, shape=(3, 16, 16))
    owner = torch.tensor(owner)
    xs, ys = x[:3], y[:3]
    grads = PairGrads(model, spec)
    want = vmap_clipped_mean(grads, flat, xs[owner], ys[owner], 0.05)
    got = grads.clipped_mean(flat, xs, ys, 0.05, owner)
    shared = 1 if len(set(torch.bincount(owner).tolist())) > 1 else 2
    assert grads._stacked.checked == {(3, 16, 16, shared): True}
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))
    monkeypatch.setattr(pairnet, "CHUNK_FLOATS", 1)  # one batch (or pair) per chunk
    chunked = grads.clipped_mean(flat, xs, ys, 0.05, owner)
    torch.testing.assert_close(chunked, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))
    grads._stacked = None  # the vmap path (other models, CUDA) gathers the batches itself
    torch.testing.assert_close(grads.clipped_mean(flat, xs, ys, 0.05, owner), want)
    torch.testing.assert_close(
        grads.clipped_mean(flat, xs, ys, None, owner), grads.mean(flat, xs[owner], ys[owner])
    )


def test_channel_padding_rule():
    cases = {3: 3, 6: 6, 10: 10, 12: 16, 16: 16, 20: 24, 28: 32, 40: 40}
    assert {c: pairnet.padded_channels(c) for c in cases} == cases


class FullyConvolutional(nn.Module):
    """Logits from a convolution (not padded: it is the last layer), after a padded one."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 12, 5, stride=2, padding=2),
            nn.Tanh(),
            nn.Conv2d(12, 10, 3, stride=2, padding=1),
            nn.AvgPool2d(4),
            nn.Flatten(),
        )

    def forward(self, x):
        return self.body(x)


def test_fully_convolutional_model_matches_vmap():
    model = FullyConvolutional()
    spec, flat, x, y = pairs(model, shape=(3, 16, 16))
    grads = PairGrads(model, spec)
    assert [m.out for m in grads._stacked.stacked.modules() if hasattr(m, "out")] == [16, 10]
    got = grads.clipped_mean(flat, x, y, 0.05)
    assert grads._stacked.checked == {(3, 16, 16, 1): True}
    want = vmap_clipped_mean(grads, flat, x, y, 0.05)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


def test_unsupported_models_fall_back_to_vmap():
    # GroupNorm (resnet18) has parameters the engine does not know
    assert pairnet.build(build_model("resnet18", (3, 32, 32), 10)) is None

    class ChannelMix(nn.Module):
        """Parameter-free, but mixes channels: refused by the first call's check."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 12, 3)  # padded to 16: the mean would see the padding
            self.fc = nn.Linear(30 * 30, 10)

        def forward(self, x):
            return self.fc(self.conv(x).mean(1).flatten(1))

    model = ChannelMix()
    spec, flat, x, y = pairs(model, shape=(3, 32, 32))
    grads = PairGrads(model, spec)
    assert grads._stacked is not None  # structurally fine ...
    got = grads.clipped_mean(flat, x, y, 0.5)
    assert grads._stacked.checked == {(3, 32, 32, 1): False}  # ... numerically not
    torch.testing.assert_close(got, vmap_clipped_mean(grads, flat, x, y, 0.5))


def test_keep_freed_memory_is_idempotent():
    first = keep_freed_memory()
    assert keep_freed_memory() == first
