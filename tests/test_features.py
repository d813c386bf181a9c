"""privaudit.attacks.features and .fi: per-example features and labels of a batch from the
classifier's gradient, and the attack that inverts them one example at a time (CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_attacks import observe, photos
from torch import nn
from torch.func import jacrev

from privaudit.attacks import check_options, run_attack
from privaudit.attacks.features import System, applicable, recover_features
from privaudit.attacks.fi import fi, observation_features
from privaudit.attacks.labels import infer_labels
from privaudit.core.errors import PrivauditError
from privaudit.eval.metrics import score
from privaudit.scenario.data import load_dataset
from privaudit.scenario.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

IMAGES = photos(4, 16)
LABELS = torch.tensor([8, 0, 5, 2])


def true_features(model: nn.Module, obs, x: torch.Tensor) -> torch.Tensor:
    """What each example feeds the classifier, computed with the model's own modules."""
    m = torch.tensor(obs.mean).view(-1, 1, 1)
    s = torch.tensor(obs.std).view(-1, 1, 1)
    with torch.no_grad():
        return model.body((x - m) / s).flatten(1)


@pytest.mark.parametrize("arch", ["lenet", "cnn"])
def test_features_of_a_batch_are_recovered_exactly(arch):
    model = build_model(arch, (3, 16, 16), 10, 1)
    obs = observe(model, IMAGES, LABELS)
    f = recover_features(obs, LABELS)
    assert f.exact and f.rank == 4 and f.residual < 1e-9
    order = LABELS.argsort()  # the features come in sorted-label order
    assert f.labels.tolist() == sorted(LABELS.tolist())
    want = true_features(model, obs, IMAGES[order])
    cos = F.cosine_similarity(f.h, want, dim=1)
    assert cos.min() > 0.9999
    torch.testing.assert_close(f.h, want, rtol=1e-3, atol=1e-3 * float(want.abs().max()))


def test_scale_and_clipping_are_modelled():
    model = build_model("cnn", (3, 16, 16), 10, 1)
    obs = observe(model, IMAGES, LABELS, scale=-0.3, clip=0.05)
    f = recover_features(obs, LABELS)
    assert f.exact
    want = true_features(model, obs, IMAGES[LABELS.argsort()])
    assert F.cosine_similarity(f.h, want, dim=1).min() > 0.999


def test_a_wrong_label_is_found_by_the_search():
    model = build_model("cnn", (3, 16, 16), 10, 1)
    obs = observe(model, IMAGES, LABELS)
    wrong = torch.tensor([8, 0, 5, 3])  # one example moved from class 2 to 3
    kept = recover_features(obs, wrong, label_search=0, anchors=False)
    assert not kept.exact  # no features explain the gradient with these labels
    found = recover_features(obs, wrong, anchors=False)
    assert found.exact and not found.anchors
    assert found.labels.tolist() == sorted(LABELS.tolist())


class SparseMLP(nn.Module):
    """Flatten → Linear → ReLU → Linear, the hidden bias lowered so that about a quarter of
    the features are active: sparse non-negative features, as after a trained ReLU body."""

    def __init__(self, d: int, width: int = 512, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(d, width), nn.ReLU())
        with torch.no_grad():
            self.body[1].bias.sub_(0.02 * self.body[1].weight.abs().sum(1))
        self.fc = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x))


def confident(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """Set ``model.fc`` (the minimum-norm weights, no bias) so that every example is
    classified as its label with a logit of 4 to 8 against N(0, 1) for the other classes:
    a trained network's gradient, where each example's δ_b barely moves the bias."""
    h = true_features(model, observe(model, x, y), x).double()
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(len(y), 10, generator=gen, dtype=torch.float64)
    z[torch.arange(len(y)), y] = 4 + 4 * torch.rand(len(y), generator=gen, dtype=torch.float64)
    w = torch.linalg.lstsq(h, z).solution.T  # (10, d): h w.T = z
    with torch.no_grad():
        model.fc.weight.copy_(w.float())
        model.fc.bias.zero_()


def test_anchors_recover_a_confident_batch_where_counting_fails():
    """Sparse ReLU features: coordinates active in one example only make collinear groups
    in ∂W's row space, which give labels and features in closed form."""
    data = load_dataset("photos")
    images, labels = data.test_x[:6], torch.tensor([3, 3, 7, 1, 1, 1])
    model = SparseMLP(images[0].numel())
    confident(model, images, labels)
    obs = observe(model, images, labels)
    counted = infer_labels(obs)
    assert counted.tolist() != sorted(labels.tolist())  # the count estimate is wrong here
    assert not recover_features(obs, counted, anchors=False).exact  # so is the search
    f = recover_features(obs, counted)
    assert f.anchors and f.exact and f.labels.tolist() == sorted(labels.tolist())
    want = true_features(model, obs, images[labels.argsort(stable=True)])
    for c in f.labels.unique():  # within a class the order is free
        cos = F.cosine_similarity(f.h[f.labels == c][:, None], want[f.labels == c][None], dim=-1)
        assert cos.max(1).values.min() > 0.9999


def test_anchors_need_sparse_features():
    """The sigmoid LeNet's features are dense: no column of R is collinear with another,
    so there is no anchor solution and the count path runs alone."""
    model = build_model("lenet", (3, 16, 16), 10, 1)
    obs = observe(model, IMAGES, LABELS, mean=(0.0,) * 3, std=(1.0,) * 3)
    assert System(obs, 1e-9).anchors() is None
    f = recover_features(obs, LABELS)
    assert f.exact and not f.anchors


def test_noise_makes_the_features_inexact():
    model = build_model("cnn", (3, 16, 16), 10, 1)
    obs = observe(model, IMAGES, LABELS, noise=1e-3)
    f = recover_features(obs, LABELS, label_search=0)
    assert not f.exact and f.residual > 1e-9


def test_closed_form_jacobian_equals_autograd():
    model = build_model("cnn", (3, 16, 16), 10, 1)
    for clip in (None, 0.05):
        obs = observe(model, IMAGES, LABELS, clip=clip)
        system = System(obs, 1e-13)
        y = F.one_hot(LABELS.sort().values, 10).double()
        v = torch.randn(16 + (4 if clip else 0), dtype=torch.float64)
        _, jac = system.residuals(v, y)
        want = jacrev(lambda u, s=system, y=y: s.residuals(u, y, False)[0])(v)
        torch.testing.assert_close(jac, want, rtol=1e-10, atol=1e-12)


def test_where_the_recovery_does_not_apply():
    model = build_model("cnn", (3, 16, 16), 10, 1)
    big = observe(model, photos(10, 16), torch.arange(10))
    assert "classes" in applicable(big)
    with pytest.raises(PrivauditError, match="does not apply"):
        observation_features([big])
    no_bias = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 10, bias=False))
    assert "bias" in applicable(observe(no_bias, IMAGES, LABELS))


def test_features_raise_psnr_on_a_batch():
    model = build_model("lenet", (3, 16, 16), 10, 1)
    obs = observe(model, IMAGES, LABELS, mean=(0.0,) * 3, std=(1.0,) * 3)

    def psnr(name: str, **kw) -> float:
        (rec,) = run_attack(name, [obs], **kw)
        return score(IMAGES, LABELS, rec.images, rec.labels, lpips=False)["psnr"]

    plain = psnr("ig", iterations=300, feature_weight=0.0)
    assert psnr("ig", iterations=300) > plain + 2  # the feature term
    assert psnr("fi", iterations=150, refine=0) > plain + 0.5  # first order, half the steps


def test_fi_keeps_each_examples_best_restart():
    model = build_model("cnn", (3, 16, 16), 10, 1)
    obs = observe(model, IMAGES, LABELS)
    one = fi([obs], iterations=30, refine=0)[0].meta["feature_loss"]
    two = fi([obs], iterations=30, refine=0, restarts=3)[0].meta["feature_loss"]
    # restart 0 of three runs what the single restart runs; each example keeps its best
    assert all(b <= a * (1 + 1e-4) for a, b in zip(one, two, strict=True))
    assert sum(two) < sum(one)


def test_fi_batched_equals_separate():
    obs = [observe(build_model("cnn", (3, 16, 16), 10, k), IMAGES, LABELS) for k in range(2)]
    batched = fi(obs, iterations=20, refine=5, seed=3)
    for k in range(2):
        (alone,) = fi([obs[k]], iterations=20, refine=5, seed=3 + k)
        torch.testing.assert_close(batched[k].images, alone.images, atol=1e-4, rtol=0)
        assert batched[k].labels.tolist() == alone.labels.tolist()


def test_auto_picks_fi_where_the_features_solve():
    model = build_model("cnn", (3, 16, 16), 10, 1)
    exact = observe(model, IMAGES, LABELS)
    noised = observe(model, IMAGES, LABELS, noise=0.1)  # features residual ≈ 6e-3
    (a,) = run_attack("auto", [exact], iterations=10)
    (b,) = run_attack("auto", [noised], iterations=10)
    assert a.meta["attack"] == "fi" and "exactly" in a.meta["auto"]
    assert b.meta["attack"] == "ig" and "is above" in b.meta["auto"]


def test_fi_options_are_checked():
    assert check_options("fi", {"refine": 0, "feature_weight": 2}) == {
        "refine": 0,
        "feature_weight": 2.0,
    }
    with pytest.raises(PrivauditError, match="refine must be"):
        check_options("fi", {"refine": -1})
    with pytest.raises(PrivauditError, match="feature_weight must be"):
        check_options("ig", {"feature_weight": -0.5})
