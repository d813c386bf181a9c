"""privaudit.attacks.descent: once the last hidden layer's gradient is separated, the layers
below are solved exactly down the ReLU chain (CPU).

The batches are bundled photos (3×32×32) through freshly initialised ReLU MLPs; the gradient
is computed independently of the attack (``test_attacks.observe``).
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
import torch
from test_attacks import observe
from test_vertex import batch
from torch import nn

from privaudit.attacks import run_attack
from privaudit.attacks.disaggregation import pick_layer
from privaudit.attacks.identifiability import layer_gradient, top_singular
from privaudit.eval.metrics import match, psnr
from privaudit.scenario.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

descent = sys.modules["privaudit.attacks.descent"]
vertex = sys.modules["privaudit.attacks.vertex"]
spear_module = sys.modules["privaudit.attacks.spear"]


def deep(seed: int = 0) -> nn.Module:
    """Three ReLU layers, the last (96 units) feeding the classifier."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(3 * 32 * 32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
        nn.Linear(128, 96), nn.ReLU(), nn.Linear(96, 10),
    ).eval()  # fmt: skip


def scores(x: torch.Tensor, y: torch.Tensor, rec) -> tuple[float, bool]:
    """The worst matched PSNR (dB) and whether every label is right."""
    perm = match(x, rec.images)
    worst = float(min(psnr(x, rec.images[perm].float(), "none")))
    return worst, bool((rec.labels[perm] == y).all())


@pytest.mark.parametrize("clip, scale", [(None, 1.0), (0.5, -3.0)])
def test_a_deep_mlp_is_recovered_exactly_down_its_relu_chain(clip, scale):
    """The vertex search separates the last hidden layer; the two layers below are each one
    least-squares solve, exact — clip factors and the message's scale included."""
    b = 16
    x, y, mean, std = batch(b, seed=2)
    obs = observe(deep(seed=2), x, y, mean=mean, std=std, clip=clip, scale=scale)
    (rec,) = run_attack("spear", [obs])
    meta = rec.meta["spear"]
    assert rec.meta["layer"] == "1" and meta["descent"] == {"solved": ["3", "1"]}, meta
    worst, labels = scores(x, y, rec)
    assert worst > 60 and labels


def test_the_2nn_is_recovered_where_sampling_expects_nothing():
    """``mlp`` (McMahan et al.'s 2NN) at B = 32: SPEAR's sampling on the first layer expects
    ≈ 1e-4 finds; the search on the second layer and one step down give every image."""
    b = 32
    assert spear_module.expected_finds(200, b, 1 << 17) < spear_module.MIN_FINDS
    x, y, mean, std = batch(b, seed=6)
    obs = observe(build_model("mlp", (3, 32, 32), 10, 6), x, y, mean=mean, std=std)
    (rec,) = run_attack("spear", [obs])
    assert rec.meta["spear"]["descent"] == {"solved": ["body.1"]}, rec.meta["spear"]
    worst, labels = scores(x, y, rec)
    assert worst > 60 and labels
    (paper,) = run_attack("spear", [obs], search="sample")  # the paper's route: nothing
    assert paper.meta["recovered"] == 0


def separated(b: int = 12, seed: int = 3):
    """The top hidden layer of a two-hidden-layer net separated by the vertex search."""
    x, y, mean, std = batch(b, seed=seed)
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Flatten(), nn.Linear(3 * 32 * 32, 96), nn.ReLU(), nn.Linear(96, 96), nn.ReLU(),
        nn.Linear(96, 10),
    ).eval()  # fmt: skip
    obs = observe(net, x, y, mean=mean, std=std)
    layer = pick_layer(obs, "3")
    dw, _ = layer_gradient(obs, layer)
    sep = vertex.separate(obs, layer, top_singular(dw, b)[0], seed=0)
    assert bool(sep.found.all()), sep.meta["how"]
    return obs, layer, sep


def test_inputs_off_by_a_thousandth_are_not_carried_down():
    """A step is taken only where its solve reproduces the gradient below: inputs moved by
    1e-3 of their norm stop the descent, with the reason, and leave the separation as it was."""
    obs, layer, sep = separated()
    low, down = descent.descend(obs, layer, replace(sep, meta=dict(sep.meta)))
    assert low.module == "1" and down.meta["descent"] == {"solved": ["1"]}
    gen = torch.Generator().manual_seed(0)
    off = (
        sep.h
        + 1e-3
        * sep.h.norm(dim=1, keepdim=True)
        * torch.randn(sep.h.shape, generator=gen, dtype=torch.float64)
        / sep.h.shape[1] ** 0.5
    )
    moved = replace(sep, h=off, meta={})
    low, kept = descent.descend(obs, layer, moved)
    assert low is layer and torch.equal(kept.h, off)
    assert "not reproduced" in kept.meta["descent"]["stopped"]


def test_a_partial_separation_is_not_carried_down():
    obs, layer, sep = separated()
    found = sep.found.clone()
    found[0] = False
    low, kept = descent.descend(obs, layer, replace(sep, found=found, meta={}))
    assert low is layer and "descent" not in kept.meta
