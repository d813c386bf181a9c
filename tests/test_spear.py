"""privaudit.attacks.spear: exact batches from a ReLU linear layer's gradient (CPU).

The batches are real photographs (the bundled ``photos`` dataset, 3×32×32) through a freshly
initialised ``mlp`` (McMahan et al.'s 2NN); the gradient is computed independently of the
attack (``test_attacks.observe``). Recovered means PSNR ≥ 30 dB after matching.
"""

from __future__ import annotations

import sys

import pytest
import torch
from test_attacks import observe
from torch import nn

from privaudit.attacks import run_attack
from privaudit.attacks.auto import choose
from privaudit.core.errors import PrivauditError
from privaudit.eval.metrics import match, psnr
from privaudit.scenario.data import photos
from privaudit.scenario.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

spear_module = sys.modules["privaudit.attacks.spear"]  # the package exports the function


def batch(b: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, tuple, tuple]:
    """``b`` photos of distinct crops, their labels and the dataset's mean/std."""
    data = photos()
    idx = torch.randperm(len(data.train_x), generator=torch.Generator().manual_seed(seed))[:b]
    return data.train_x[idx], data.train_y[idx], data.mean, data.std


def recovered(x: torch.Tensor, y: torch.Tensor, rec, db: float = 30.0) -> tuple[float, float]:
    """(fraction of the batch at ≥ ``db`` PSNR, label accuracy), after matching."""
    perm = match(x, rec.images)
    p = torch.tensor(psnr(x, rec.images[perm].float(), "none"))
    return float((p >= db).double().mean()), float((rec.labels[perm] == y).double().mean())


def attack(model: nn.Module, x, y, mean, std, **kw):
    """SPEAR's sampling (``search="sample"`` unless given: on ``mlp`` the default searches the
    last hidden layer's vertices instead, tested in test_descent)."""
    kw.setdefault("search", "sample")
    obs_kw = {k: kw.pop(k) for k in ("clip", "scale", "noise") if k in kw}
    obs = observe(model, x, y, mean=mean, std=std, **obs_kw)
    (rec,) = run_attack("spear", [obs], **kw)
    return obs, rec


def test_a_batch_of_16_photos_is_recovered_exactly():
    x, y, mean, std = batch(16)
    model = build_model("mlp", (3, 32, 32), 10, 0)
    _, rec = attack(model, x, y, mean, std, samples=300_000)
    frac, labels = recovered(x, y, rec)
    assert frac >= 0.9 and labels >= 0.9, rec.meta["spear"]
    assert rec.meta["recovered"] == 16 and rec.loss == 0.0


def test_the_papers_path_inverts_q_when_no_next_layer_is_used():
    """``next_layer=False``: all B directions sampled, selected by sparsity matching and
    scaled from the bias gradient, ``Xᵀ = Q⁻¹ R`` — SPEAR as published."""
    x, y, mean, std = batch(8, seed=1)
    model = build_model("mlp", (3, 32, 32), 10, 1)
    _, rec = attack(model, x, y, mean, std, samples=40_000, next_layer=False)
    meta = rec.meta["spear"]
    assert meta["how"].startswith("all B directions") and meta["matching"] >= 0.99
    assert recovered(x, y, rec) == (1.0, 1.0)


def test_clipping_and_scale_change_nothing():
    """Per-example clip factors scale each column of ∂Z and cancel; so does ``scale``."""
    x, y, mean, std = batch(8, seed=2)
    model = build_model("mlp", (3, 32, 32), 10, 2)
    _, rec = attack(model, x, y, mean, std, samples=40_000, clip=1e-3, scale=-0.3)
    assert recovered(x, y, rec, db=60.0) == (1.0, 1.0)


def test_small_noise_is_averaged_and_large_noise_is_reported():
    x, y, mean, std = batch(8, seed=3)
    model = build_model("mlp", (3, 32, 32), 10, 3)
    _, rec = attack(model, x, y, mean, std, samples=40_000, noise=1e-6)
    assert recovered(x, y, rec)[0] == 1.0  # entries of ∂W are ≈ 3e-3: the pattern survives
    _, rec = attack(model, x, y, mean, std, samples=8_192, noise=1e-3)
    # noise at the scale of ∂W's entries hides the ReLU pattern: nothing is claimed
    assert rec.meta["recovered"] == 0 and rec.loss == 1.0
    assert recovered(x, y, rec, db=20.0)[0] == 0.0


def test_a_budget_too_small_recovers_part_of_the_batch_and_says_so():
    x, y, mean, std = batch(16, seed=4)
    model = build_model("mlp", (3, 32, 32), 10, 4)
    _, rec = attack(model, x, y, mean, std, samples=4_096)
    k = rec.meta["recovered"]
    assert 0 < k < 16 and rec.loss == pytest.approx(1 - k / 16)
    assert recovered(x, y, rec)[0] == pytest.approx(k / 16)  # the found ones are exact
    mean_image = torch.tensor(mean).view(3, 1, 1).expand(3, 32, 32)
    missing = [i for i in range(16) if torch.allclose(rec.images[i], mean_image)]
    assert len(missing) == 16 - k  # the rest are the mean image, not a guess


def test_features_below_a_trunk_are_separated_exactly():
    """fedavg-cnn: the FC 512 layer's inputs are features, separated exactly by the paper's
    sampling (then inverted to images by the fi attack's feature inversion, not run here)."""
    x, y, mean, std = batch(6, seed=5)
    model = build_model("fedavg-cnn", (3, 32, 32), 10, 5)
    obs = observe(model, x, y, mean=mean, std=std)
    layer = spear_module.pick_layer(obs)
    assert layer.module == "head.0" and not layer.takes_input
    ly = spear_module.factor(obs, layer, 6, spear_module.ZERO_TOL, spear_module.ZERO_SIGMAS)
    sep = spear_module.separate(
        obs, ly, layer, samples=20_000, tau=spear_module.TAU, greedy_rounds=4,
        next_layer=True, match=spear_module.MATCH, min_finds=0.0, seed=0, progress=False,
        search_by="sample",
    )  # fmt: skip
    with torch.no_grad():
        m, s = torch.tensor(mean).view(-1, 1, 1), torch.tensor(std).view(-1, 1, 1)
        h = model.body((x - m) / s).double()
    assert bool(sep.found.all())
    cos = torch.nn.functional.cosine_similarity(sep.h[:, None], h[None], dim=-1)
    assert float(cos.max(1).values.min()) > 1 - 1e-9
    err = (sep.h[:, None] - h[None]).norm(dim=-1).min(1).values / h.norm(dim=-1).mean()
    assert float(err.max()) < 1e-6  # scale too: the features are the true ones


def test_a_rank_deficient_gradient_is_refused_with_the_bound():
    x, y, mean, std = batch(3, seed=6)
    x, y = torch.cat([x, x[:1]]), torch.cat([y, y[:1]])  # a duplicate: rank 3 < B = 4
    model = build_model("mlp", (3, 32, 32), 10, 6)
    with pytest.raises(PrivauditError, match="rank 3.*at most 3 of 4"):
        attack(model, x, y, mean, std, samples=100)


def test_auto_picks_spear_for_a_noise_free_relu_batch_only():
    x, y, mean, std = batch(8, seed=7)
    model = build_model("mlp", (3, 32, 32), 10, 7)
    clean = observe(model, x, y, mean=mean, std=std)
    assert choose(clean)[0] == "spear" and "rank B" in choose(clean)[1]
    noisy = observe(model, x, y, mean=mean, std=std, noise=1e-4)
    assert choose(noisy)[0] == "cpa"  # SPEAR needs it noise-free; CPA's rank holds here
    louder = observe(model, x, y, mean=mean, std=std, noise=1e-2)
    assert choose(louder)[0] == "ig"  # the rank above the noise falls below B: neither
    sigmoid = build_model("lenet", (3, 32, 32), 10, 7)
    assert choose(observe(sigmoid, x, y, mean=mean, std=std))[0] == "ig"
    (rec,) = run_attack("auto", [clean])
    assert rec.meta["attack"] == "spear"


def test_a_budget_that_cannot_find_anything_is_not_spent():
    """B = 64 on a 200-unit layer: a uniform sample hits an example with probability
    ≈ 64 · C(100, 63) / C(200, 63) ≈ 1e-22 — the search is skipped, and says why."""
    assert spear_module.expected_finds(200, 16, 1 << 17) > 10
    assert spear_module.expected_finds(200, 64, 1 << 17) < 1e-15
    x, y, mean, std = batch(64, seed=8)
    model = build_model("mlp", (3, 32, 32), 10, 8)
    _, rec = attack(model, x, y, mean, std)
    assert rec.meta["recovered"] == 0 and rec.meta["spear"]["how"].startswith("not searched")
