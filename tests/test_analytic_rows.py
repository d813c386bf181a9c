"""Which rows of a recovered first-layer gradient to trust (attacks/analytic.py ``combine``):
least squares where the rows carry errors of the same size, El Mrini et al.'s largest-|∂b|
row along directions where the rows disagree — never worse than that row, and better than it
(and than a plain average of the rows) under independent noise."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from privaudit.attacks.analytic import combine, recover
from privaudit.core.errors import PrivauditError
from privaudit.core.observation import Observation
from privaudit.scenario.data import load_dataset

pytestmark = pytest.mark.usefixtures("one_thread")
CLASSES = 10


def psnr(x: torch.Tensor, img: torch.Tensor) -> float:
    mse = float(((x.clamp(0, 1) - img) ** 2).mean())
    return 10 * np.log10(1 / mse)


def true_gradient(img: torch.Tensor, label: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(∂W, ∂b) of cross-entropy for one example through a fresh Linear layer (float64)."""
    torch.manual_seed(seed)
    layer = nn.Linear(img.numel(), CLASSES).double()
    loss = nn.functional.cross_entropy(layer(img.reshape(1, -1)), torch.tensor([label]))
    dw, db = torch.autograd.grad(loss, [layer.weight, layer.bias])
    return dw, db


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    d = load_dataset("photos")
    return d.train_x[torch.arange(0, 2400, 300)].double()  # 8 photographs, 3×32×32


def test_equal_size_noise_beats_the_anchors_row_and_the_plain_average(images):
    """Independent noise of one size on every coordinate: the rows agree up to noise, so
    the rule is eq. (2) — above the single row, far above averaging the rows' ratios (whose
    small-|∂b| rows blow the noise up)."""
    g = torch.Generator().manual_seed(1)
    gains_row, gains_avg, vs_ls = [], [], []
    for i, img in enumerate(images):
        dw, db = true_gradient(img, i % CLASSES, seed=i)
        sigma = 0.02 * float(db.abs().max())
        ndw = dw + sigma * torch.randn(dw.shape, generator=g, dtype=torch.float64)
        ndb = db + sigma * torch.randn(db.shape, generator=g, dtype=torch.float64)
        x = img.reshape(-1)
        new = psnr(combine(ndw, ndb), x)
        gains_row.append(new - psnr(combine(ndw, ndb, "row"), x))
        gains_avg.append(new - psnr((ndw / ndb[:, None]).mean(0), x))
        vs_ls.append(new - psnr(combine(ndw, ndb, "ls"), x))
    # on average over the images (one draw can favour the single row by chance)
    assert np.mean(gains_row) > 0.3 and sum(g > 0 for g in gains_row) >= 6
    assert min(gains_avg) > 5
    assert max(abs(v) for v in vs_ls) < 1e-9  # no row direction is flagged: it is eq. (2)


def test_shared_corruption_keeps_the_anchors_row_where_least_squares_is_pulled(images):
    """The tied approximation's error: another agent's image enters a few rows, strongly
    (α ⊗ [x_k; 1], the other example's rank-1 gradient), the best row barely. Least squares
    is pulled towards x_k; the rule keeps the anchor's row along that direction and its
    result is at least the row's, plus the small independent noise averaged elsewhere."""
    g = torch.Generator().manual_seed(2)
    for i in range(4):
        img, other = images[i].reshape(-1), images[i + 4].reshape(-1)
        label = i % CLASSES
        dw, db = true_gradient(images[i], label, seed=i)
        alpha = torch.zeros(CLASSES, dtype=torch.float64)
        alpha[(label + 1) % CLASSES], alpha[(label + 2) % CLASSES] = 0.3, -0.2
        alpha[label] = 0.01
        ndw = dw + alpha[:, None] * other[None]
        ndb = db + alpha
        sigma = 1e-3 * float(db.abs().max())
        ndw = ndw + sigma * torch.randn(dw.shape, generator=g, dtype=torch.float64)
        new, row = psnr(combine(ndw, ndb), img), psnr(combine(ndw, ndb, "row"), img)
        ls = psnr(combine(ndw, ndb, "ls"), img)
        assert new >= row - 1e-6 and new > ls + 3


def test_exact_gradient_is_recovered_exactly_and_rules_are_checked(images):
    img = images[0]
    dw, db = true_gradient(img, 3, seed=0)
    for rule in ("reliable", "ls", "row"):
        torch.testing.assert_close(combine(dw, db, rule), img.reshape(-1))
    with pytest.raises(PrivauditError, match="row rule"):
        combine(dw, db, "median")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(img.numel(), CLASSES)).double()
    obs = Observation(
        model=model,
        params={k: v.detach() for k, v in model.named_parameters()},
        target={"1.weight": dw, "1.bias": db},
        batch_size=1,
        input_shape=tuple(img.shape),
        num_classes=CLASSES,
        mean=(0.0,) * 3,
        std=(1.0,) * 3,
    )
    out, residual = recover(obs, rule="row")
    torch.testing.assert_close(out[0], img) and residual < 1e-20
