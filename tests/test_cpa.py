"""privaudit.attacks.cpa: the Cocktail Party Attack's FastICA, whitening and scales (CPU).

ICA recovers independent, non-Gaussian sources: the separation tests use images whose pixels
are independent (Laplacian noise around grey), where the method's assumption holds on the
pixel values (``ica_on="values"``, the paper's ICA) and a broken whitening, contrast or
unmixing fails. Photographs are correlated sources with near-Gaussian pixel values: there
the unmixing is learned on their pixel differences (the default for images), which the
photo tests bound against the values and against whitening alone.
"""

from __future__ import annotations

import sys

import pytest
import torch
from test_attacks import observe

from privaudit.attacks import run_attack
from privaudit.core.errors import PrivauditError
from privaudit.eval.metrics import match, psnr
from privaudit.scenario.data import photos
from privaudit.scenario.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

cpa_module = sys.modules["privaudit.attacks.cpa"]  # the package exports the function
MEAN, STD = (0.5, 0.5, 0.5), (0.17, 0.17, 0.17)


def independent_images(b: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``b`` 3×32×32 images of i.i.d. Laplacian pixels around grey, and labels."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(b, 3, 32, 32, generator=gen) - 0.5
    lap = -u.sign() * torch.log1p(-2 * u.abs())  # inverse CDF: Laplace(0, 1)
    return (0.5 + 0.12 * lap).clamp(0, 1), torch.randint(0, 10, (b,), generator=gen)


def psnrs(x: torch.Tensor, rec) -> torch.Tensor:
    perm = match(x, rec.images)
    return torch.tensor(psnr(x, rec.images[perm].float(), "none"))


def test_fastica_separates_independent_sources():
    gen = torch.Generator().manual_seed(0)
    s = torch.distributions.Laplace(0.0, 1.0).sample((8, 4000)).double()
    a = torch.randn(40, 8, generator=gen, dtype=torch.float64)
    z, k = cpa_module.whiten(a @ s, 8)
    cov = z @ z.T / z.shape[1]
    torch.testing.assert_close(cov, torch.eye(8, dtype=torch.float64), atol=1e-8, rtol=0)
    w, its = cpa_module.fastica(z, a=1.0, iterations=500, tol=1e-10, gen=gen)
    assert its < 500  # converged
    est = (w @ k) @ (a @ s)
    cos = (est / est.norm(dim=1, keepdim=True)) @ (s / s.norm(dim=1, keepdim=True)).T
    assert float(cos.abs().max(1).values.min()) > 0.98
    assert sorted(cos.abs().argmax(1).tolist()) == list(range(8))  # one source each


def test_a_batch_of_independent_images_is_separated():
    x, y = independent_images(16)
    model = build_model("mlp", (3, 32, 32), 10, 0)
    (rec,) = run_attack("cpa", [observe(model, x, y, mean=MEAN, std=STD)], ica_on="values")
    p = psnrs(x, rec)
    assert float((p >= 30).double().mean()) >= 0.9 and float(p.min()) >= 20
    perm = match(x, rec.images)
    assert bool((rec.labels[perm] == y).all())  # each example's gradient names its label
    assert rec.meta["cpa"]["converged"] and rec.meta["cpa"]["scale"] == "bias"


def test_clipping_noise_and_scale_leave_the_separation_intact():
    """Clip factors and ``scale`` scale the mixing matrix's columns (the bias scale cancels
    them); small noise is removed from the whitening's eigenvalues: the reconstruction is
    the one of the plain gradient."""
    x, y = independent_images(16, seed=1)
    model = build_model("mlp", (3, 32, 32), 10, 1)
    ica = {"ica_on": "values", "complete": "off"}  # the completion needs a noise-free gradient
    (plain,) = run_attack("cpa", [observe(model, x, y, mean=MEAN, std=STD)], **ica)
    assert float((psnrs(x, plain) >= 30).double().mean()) >= 0.75
    for kw in ({"clip": 1e-3, "scale": -0.5}, {"noise": 1e-6}):
        obs = observe(model, x, y, mean=MEAN, std=STD, **kw)
        (rec,) = run_attack("cpa", [obs], **ica)
        assert float(psnrs(plain.images, rec).min()) >= 50, kw


def test_the_image_prior_fixes_sign_and_scale_without_a_bias():
    """Pixels ``μ + σ t ŝ`` in [0, 1]: images that reach 0 and 1 with a mean away from 1/2
    (as digits and most photographs) admit their own sign at the largest |t| only."""
    x, _ = independent_images(4, seed=2)
    x = (2.5 * (x - 0.5) + 0.3).clamp(0, 1)  # reaches 0 and 1, mean ≈ 0.3
    mean, std = (0.3, 0.3, 0.3), (0.2, 0.2, 0.2)
    xn = (x.flatten(1).double() - 0.3) / 0.2
    t = torch.tensor([2.0, -0.5, 3.0, -7.0], dtype=torch.float64)
    model = build_model("mlp", (3, 32, 32), 10, 2)
    obs = observe(model, x, torch.zeros(4).long(), mean=mean, std=std)
    got = cpa_module.prior_scales(xn * t[:, None], obs)
    torch.testing.assert_close(got, 1 / t)  # the images reach 0 and 1: the fit is exact


def test_photographs_are_separated_on_their_pixel_differences():
    """Photographs' pixel values are close to Gaussian and correlated between images, their
    differences sparse: on this batch the unmixing learned on the differences (the default)
    recovers most images at ≥ 20 dB, where on the values it recovers far fewer (measured
    ≈ 13 dB mean); clipping and small noise leave it intact."""
    data = photos()
    idx = torch.randperm(len(data.train_x), generator=torch.Generator().manual_seed(0))[:16]
    x, y = data.train_x[idx], data.train_y[idx]
    model = build_model("mlp", (3, 32, 32), 10, 0)
    obs = observe(model, x, y, mean=data.mean, std=data.std)
    (rec,) = run_attack("cpa", [obs], refine="off")  # ICA's separation alone
    (values,) = run_attack("cpa", [obs], ica_on="values", refine="off")
    assert rec.meta["cpa"]["ica_on"] == "differences" and values.meta["cpa"]["ica_on"] == "values"
    p = psnrs(x, rec)
    assert float((p >= 20).double().mean()) >= 0.75
    assert float(p.mean()) >= float(psnrs(x, values).mean()) + 5
    noisy = observe(model, x, y, mean=data.mean, std=data.std, clip=1e-3, noise=1e-8)
    (rec2,) = run_attack("cpa", [noisy], refine="off")
    assert float(psnrs(rec.images, rec2).min()) >= 35  # measured 39–55 dB


def test_photographs_are_separated_better_than_by_whitening_alone():
    """On the pixel values (the paper's ICA), photographs violate ICA's independence;
    measured on this batch CPA's mean PSNR is ≈ 13 dB against ≈ 11 dB for whitening alone
    (no ICA): the bound keeps 1 dB of that."""
    data = photos()
    idx = torch.randperm(len(data.train_x), generator=torch.Generator().manual_seed(0))[:16]
    x, y = data.train_x[idx], data.train_y[idx]
    obs = observe(build_model("mlp", (3, 32, 32), 10, 0), x, y, mean=data.mean, std=data.std)
    (rec,) = run_attack("cpa", [obs], ica_on="values", refine="off")
    ica = float(psnrs(x, rec).mean())
    fastica = cpa_module.fastica
    try:
        cpa_module.fastica = lambda z, **kw: (torch.eye(z.shape[0], dtype=z.dtype), 0)
        (plain,) = run_attack("cpa", [obs], ica_on="values", refine="off")
    finally:
        cpa_module.fastica = fastica
    assert ica >= float(psnrs(x, plain).mean()) + 1.0


def test_differences_are_refused_for_features():
    x, y = independent_images(4, seed=3)
    obs = observe(build_model("fedavg-cnn", (3, 32, 32), 10, 3), x, y, mean=MEAN, std=STD)
    with pytest.raises(PrivauditError, match="ica_on='values'"):
        run_attack("cpa", [obs], ica_on="differences")


def test_features_need_the_bias_for_their_scale():
    x, y = independent_images(4, seed=3)
    obs = observe(build_model("fedavg-cnn", (3, 32, 32), 10, 3), x, y, mean=MEAN, std=STD)
    with pytest.raises(PrivauditError, match="bias is needed"):
        run_attack("cpa", [obs], scale="prior")


def test_more_examples_than_the_layer_has_units_are_refused():
    x, y = independent_images(12, seed=4)
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(3072, 8), torch.nn.ReLU(), torch.nn.Linear(8, 10)
    ).eval()
    with pytest.raises(PrivauditError, match="at most 8 of 12"):
        run_attack("cpa", [observe(model, x, y, mean=MEAN, std=STD)], layer="1")
