"""privaudit.attacks.identifiability: what one message can determine, on constructed cases
whose answer is known (CPU)."""

from __future__ import annotations

import pytest
import torch
from test_attacks import observe
from torch import nn

from privaudit.attacks.identifiability import (
    Identifiability,
    LayerRank,
    identifiability,
    linear_layers,
)
from privaudit.scenario.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

MEAN, STD = (0.5,), (0.25,)


def images(b: int, shape: tuple[int, ...] = (1, 28, 28), seed: int = 0) -> torch.Tensor:
    return torch.rand(b, *shape, generator=torch.Generator().manual_seed(seed))


def labels(b: int, classes: int = 10) -> torch.Tensor:
    return torch.arange(b) % classes


def test_a_layer_narrower_than_the_batch_bounds_it_by_its_width():
    """784 → r ReLU → 10 classes at B = 16 > r: the hidden layer's gradient has rank r, and
    the message carries r·785 + 10·(r + 1) numbers, ⌊·/784⌋ = r examples' worth: both bounds
    are exactly r."""
    r, b = 6, 16
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, r), nn.ReLU(), nn.Linear(r, 10)).eval()
    obs = observe(model, images(b), labels(b), mean=MEAN, std=STD)
    ident = identifiability(obs)
    hidden, classifier = ident.layers
    assert (hidden.rank, hidden.separable, ident.separable, ident.determined) == (r, r, r, r)
    assert classifier.rank == r  # 10 × r
    assert ident.numbers == r * 785 + 10 * (r + 1) and ident.unknowns == b * 784
    assert ident.sentence().startswith(f"at most {r} of {b} examples are determined")
    assert f"at most {r} of {b} examples can be separated" in ident.sentence()


def test_the_classifiers_gradient_loses_one_rank_to_the_softmax():
    """∂W = Δᵀ H with every row of Δ (softmax − one-hot) summing to 0: rank ≤ classes − 1."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 6)).eval()
    obs = observe(model, images(16), labels(16, 6), mean=MEAN, std=STD, num_classes=6)
    assert identifiability(obs).layers[0].rank == 5


def test_a_rank_deficient_batch_is_reported_at_its_rank():
    """Eight examples, three distinct: the first layer's gradient has rank exactly 3."""
    x = images(3)[torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])]
    model = build_model("mlp", (1, 28, 28), 10, 0)
    obs = observe(model, x, torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]), mean=MEAN, std=STD)
    ident = identifiability(obs)
    first = ident.layers[0]
    assert first.layer == "body.1" and first.takes_input and first.relu_after
    assert first.rank == 3 and first.separable == 3
    assert ident.determined == 8  # 199,210 numbers: counting does not bind
    assert ident.layers[-1].rank == 3  # the classifier sees the same 3 distinct examples
    assert ident.separable == 3
    assert "at most 3 of 8 examples can be separated" in ident.sentence()


def test_the_operating_point_model_is_under_determined_at_b_64():
    """tanh-cnn on 28×28 at B = 64: 26,010 numbers for 50,176 pixels — at most 33 examples."""
    model = build_model("tanh-cnn", (1, 28, 28), 10, 0)
    obs = observe(model, images(64), labels(64), mean=MEAN, std=STD)
    ident = identifiability(obs)
    assert (ident.numbers, ident.unknowns, ident.determined) == (26_010, 50_176, 33)
    assert [ly.rank for ly in ident.layers] == [32, 9]  # FC 32; the classifier: 10 − 1
    assert ident.sentence().startswith("at most 33 of 64 examples are determined")
    assert "at most 32 of 64 examples can be separated" in ident.sentence()


def test_mlp_at_b_256_is_bounded_by_its_width():
    model = build_model("mlp", (1, 28, 28), 10, 0)
    obs = observe(model, images(256), labels(256), mean=MEAN, std=STD)
    ident = identifiability(obs)
    assert ident.numbers == 199_210 and ident.determined == 254
    assert [ly.rank for ly in ident.layers] == [200, 200, 9]
    assert ident.separable == 200
    assert "at most 200 of 256 examples can be separated" in ident.sentence()


def test_a_full_batch_says_so():
    model = build_model("mlp", (1, 28, 28), 10, 0)
    obs = observe(model, images(16), labels(16), mean=MEAN, std=STD)
    ident = identifiability(obs)
    assert ident.separable == 16 and ident.determined == 16
    assert ident.sentence().startswith("all 16 examples may be determined")
    assert ident.to_dict()["sentence"] == ident.sentence()


def test_noise_is_not_counted_as_rank():
    """A rank-3 gradient plus N(0, σ²) noise: the noise alone has full rank, its singular
    values stay under σ(√m + √n), and the rank reported is the signal's."""
    x = images(3)[torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])]
    model = build_model("mlp", (1, 28, 28), 10, 0)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    obs = observe(model, x, y, mean=MEAN, std=STD, noise=1e-6)
    assert identifiability(obs).layers[0].rank == 3
    naive = identifiability(obs, noise_margin=0.0)  # ignoring the stated noise
    assert naive.layers[0].rank > 8  # the noise counted as rank: more than B terms


def test_linear_layers_are_listed_in_forward_order():
    model = build_model("fedavg-cnn", (1, 28, 28), 10, 0)
    layers = linear_layers(model)
    assert [ly.module for ly in layers] == ["head.0", "head.2"]
    assert not layers[0].takes_input and layers[0].relu_after and not layers[1].relu_after


def test_sentence_when_a_layer_separates_more_than_the_batch():
    """A cross-gradient mixes two batches: a layer's rank may exceed B (the bug: compare's
    default study ended in an internal error writing this sentence)."""

    layer = LayerRank("fc", (10, 20), 4, 4, True, False)
    text = Identifiability(2, 40, 1000, 2, 2, (layer,)).sentence()
    assert text.startswith("all 2 examples may be determined") and "fc's gradient" in text
