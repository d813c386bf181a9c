"""Label counts at large batches (attacks/labels.py "counts" and "ilrg") and their scores
(eval/labelcounts.py): constructed cases with known answers, synthetic data, CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from privaudit.attacks.labels import (
    METHODS,
    estimated_counts,
    geng_counts,
    ilrg_counts,
    infer_labels,
    round_counts,
)
from privaudit.core.errors import PrivauditError
from privaudit.core.observation import Observation
from privaudit.eval.labelcounts import count_accuracy, count_tv, histogram
from privaudit.scenario.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPE = (1, 16, 16)
B = 64


def synthetic(b: int, seed: int, classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """``b`` images in [0, 1]: a fixed random template per class plus per-example noise,
    labels drawn uniformly (so the counts are uneven)."""
    g = torch.Generator().manual_seed(seed)
    templates = torch.rand((classes, *SHAPE), generator=g)
    y = torch.randint(0, classes, (b,), generator=g)
    x = (0.7 * templates[y] + 0.3 * torch.rand((b, *SHAPE), generator=g)).clamp(0, 1)
    return x, y


def observe(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float | None = None, scale=1.0
) -> Observation:
    """The message of the Observation contract, computed independently of the attack."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    mean, std = (0.5,), (0.25,)

    def loss(p, xb, yb):
        return nn.functional.cross_entropy(functional_call(model, p, ((xb - 0.5) / 0.25,)), yb)

    if clip is None:
        g = grad(loss)(params, x, y)
    else:
        one = grad(lambda p, xi, yi: loss(p, xi[None], yi[None]))
        ge = vmap(one, in_dims=(None, 0, 0))(params, x, y)
        norm = sum(v.flatten(1).square().sum(1) for v in ge.values()).sqrt()
        f = (clip / norm).clamp(max=1.0)
        g = {k: (v * f.view(-1, *[1] * (v.dim() - 1))).mean(0) for k, v in ge.items()}
    return Observation(
        model=model,
        params=params,
        target={k: scale * v for k, v in g.items()},
        batch_size=len(y),
        input_shape=SHAPE,
        num_classes=10,
        scale=scale,
        clip=clip,
        mean=mean,
        std=std,
    )


def counts_of(y: torch.Tensor) -> torch.Tensor:
    return torch.bincount(y, minlength=10).double()


# --- the scores -----------------------------------------------------------------------------


def test_count_accuracy_and_tv_on_hand_made_histograms():
    # true counts (2, 1, 0, 1), predicted (1, 2, 0, 1): classes 0 and 1 wrong, 2 and 3 right
    true, pred = [0, 0, 1, 3], [1, 0, 1, 3]
    assert count_accuracy(pred, true, 4) == 0.5
    assert count_tv(pred, true, 4) == pytest.approx(0.25)  # one example of four moved
    assert count_accuracy(true[::-1], true, 4) == 1.0  # order is not scored
    assert count_tv(torch.tensor(true[::-1]), torch.tensor(true), 4) == 0.0
    assert count_tv([2, 2], [0, 1], 3) == 1.0  # disjoint supports
    # different totals compare normalised histograms: (1/2, 1/2) against (1, 0)
    assert count_tv([0, 1], [0, 0, 0], 2) == pytest.approx(0.5)
    assert histogram([2, 0, 2], 3).tolist() == [1, 0, 2]


@pytest.mark.parametrize(
    ("labels", "classes", "match"),
    [([0, 3], 3, "lie in"), ([-1], 3, "lie in"), ([0.5], 3, "integer"), ([0], 0, "at least")],
)
def test_scores_refuse_labels_outside_the_classes(labels, classes, match):
    with pytest.raises(PrivauditError, match=match):
        count_accuracy(labels, [0], classes)


def test_tv_needs_labels_on_both_sides():
    with pytest.raises(PrivauditError, match="at least one label"):
        count_tv([], [0], 2)


# --- iLRG where its system is exact -----------------------------------------------------------


def test_ilrg_is_exact_when_every_example_has_the_same_posterior():
    """With ``W = 0`` every example's posterior is ``softmax(b)``: iLRG's class posteriors
    are exact whatever its embeddings, so its linear system returns the counts at B = 64."""
    model = build_model("cnn", SHAPE, 10, 0)
    with torch.no_grad():
        model.fc.weight.zero_()
        model.fc.bias.copy_(torch.linspace(-1, 1, 10))
    x, y = synthetic(B, 0)
    obs = observe(model, x, y)
    torch.testing.assert_close(ilrg_counts(obs), counts_of(y), atol=1e-4, rtol=0)
    torch.testing.assert_close(estimated_counts(obs), counts_of(y), atol=1e-4, rtol=0)
    want = sorted(y.tolist())
    assert infer_labels(obs, "ilrg").tolist() == want == infer_labels(obs, "counts").tolist()


def test_ilrg_is_exact_on_a_batch_of_one_image():
    """One image under many labels: every ``ê_c`` is that image's feature vector, so the
    class posteriors, and the counts, are exact for any network."""
    model = build_model("tanh-cnn", SHAPE, 10, 1)
    x, _ = synthetic(1, 1)
    y = torch.tensor([0] * 20 + [3] * 30 + [7] * 14)
    obs = observe(model, x.expand(B, *SHAPE), y)
    torch.testing.assert_close(ilrg_counts(obs), counts_of(y), atol=1e-3, rtol=0)
    assert infer_labels(obs, "ilrg").tolist() == sorted(y.tolist())


def test_ilrg_rounding_keeps_the_total():
    n = torch.tensor([2.6, 2.6, 0.8, -0.4], dtype=torch.float64)
    assert round_counts(n, 5).tolist() == [2, 2, 1, 0]  # 3 + 3 + 1 rounded; two taken back
    assert round_counts(n, 7).tolist() == [3, 3, 1, 0]
    assert round_counts(torch.tensor([0.2, 0.3]), 2).tolist() in ([1, 1], [0, 2])


# --- counts at B = 64 on untrained networks -------------------------------------------------


@pytest.mark.parametrize(("arch", "seed"), [("tanh-cnn", 0), ("tanh-cnn", 1), ("cnn", 2)])
def test_counts_are_exact_at_batch_64(arch, seed):
    """An untrained network's logits barely vary across inputs, so the batch-mean posterior
    from the rank-one fit puts every count within rounding (margin asserted too)."""
    model = build_model(arch, SHAPE, 10, seed)
    x, y = synthetic(B, seed)
    obs = observe(model, x, y)
    n = estimated_counts(obs)
    assert (n - counts_of(y)).abs().max() < 0.3
    assert infer_labels(obs).tolist() == sorted(y.tolist())


@pytest.mark.parametrize(("arch", "seed"), [("tanh-cnn", 1), ("cnn", 2)])
def test_counts_are_exact_at_batch_64_with_clipping(arch, seed):
    """Every example clipped (C = 1 is far below their norms): the clip factors come from
    the modelled per-example norm, and the counts stay exact."""
    model = build_model(arch, SHAPE, 10, seed)
    x, y = synthetic(B, seed)
    obs = observe(model, x, y, clip=1.0, scale=-0.5)
    assert (estimated_counts(obs) - counts_of(y)).abs().max() < 0.35
    assert infer_labels(obs, "counts").tolist() == sorted(y.tolist())


def test_counts_beat_ilrg_where_the_bias_gradient_vanishes():
    """At B = 64 of 10 classes an untrained tanh-cnn has ``B p̄_c ≈ n_c``, so ``∂b_c ≈ 0``
    and iLRG's embedding ``∂W_c / ∂b_c`` is ill conditioned: its counts are off, the
    estimator that replaces those embeddings is not."""
    model = build_model("tanh-cnn", SHAPE, 10, 1)
    x, y = synthetic(B, 1)
    obs = observe(model, x, y)
    want = counts_of(y).long()
    assert (torch.bincount(infer_labels(obs, "ilrg"), minlength=10) != want).sum() >= 2
    assert torch.equal(torch.bincount(infer_labels(obs, "counts"), minlength=10), want)


def test_a_confident_network_keeps_gengs_estimate():
    """A classifier that separates the class templates (logits ≈ 8 × template similarity):
    each present class's own posterior is near 1, the system's columns vanish, and the
    estimate is Geng et al.'s, unchanged."""
    x, y = synthetic(16, 4)
    g = torch.Generator().manual_seed(4)
    templates = torch.rand((10, *SHAPE), generator=g).flatten(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(256, 10))
    with torch.no_grad():
        t = (templates - 0.5) / 0.25
        model[1].weight.copy_(8 * t / t.square().sum(1, keepdim=True))
        model[1].bias.zero_()
    obs = observe(model, x, y)
    p = torch.softmax(model((x - 0.5) / 0.25), -1)
    assert p[torch.arange(16), y].min() > 0.9
    torch.testing.assert_close(estimated_counts(obs), geng_counts(obs), rtol=0, atol=0)


def test_methods_and_fallbacks():
    assert "ilrg" in METHODS and "counts" in METHODS
    model = nn.Sequential(nn.Flatten(), nn.Linear(256, 10, bias=False))
    x, y = synthetic(8, 3)
    obs = observe(model, x, y)
    assert len(infer_labels(obs, "ilrg")) == 8  # no bias: iLRG falls back to LLG
    with pytest.raises(PrivauditError, match="bias"):
        estimated_counts(obs)
    with pytest.raises(PrivauditError, match="unknown label method"):
        infer_labels(obs, "ilgr")
