"""privaudit.attacks.vertex: the output gradients of a ReLU layer that feeds the classifier,
found as vertices of one polytope per class where SPEAR's sampling is out of reach (CPU).

The batches are bundled photos (3×32×32) through a freshly initialised one-hidden-layer ReLU
net; the gradient is computed independently of the attack (``test_attacks.observe``).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from test_attacks import observe
from torch import nn

from privaudit.attacks import run_attack
from privaudit.attacks.auto import choose
from privaudit.attacks.disaggregation import pick_layer
from privaudit.attacks.identifiability import layer_gradient, top_singular
from privaudit.eval.metrics import match
from privaudit.scenario.data import photos

pytestmark = pytest.mark.usefixtures("one_thread")

vertex = sys.modules["privaudit.attacks.vertex"]
spear_module = sys.modules["privaudit.attacks.spear"]


def net(hidden: int = 256, seed: int = 0) -> nn.Module:
    """Linear → ReLU → the classifier, on flattened photos."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(3 * 32 * 32, hidden), nn.ReLU(), nn.Linear(hidden, 10)
    ).eval()


def batch(b: int, seed: int = 0):
    data = photos()
    idx = torch.randperm(len(data.train_x), generator=torch.Generator().manual_seed(seed))[:b]
    return data.train_x[idx], data.train_y[idx], data.mean, data.std


def inputs(x: torch.Tensor, mean, std) -> torch.Tensor:
    m, s = torch.tensor(mean).view(-1, 1, 1), torch.tensor(std).view(-1, 1, 1)
    return ((x - m) / s).flatten(1).double()


def errors(h: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Each true input's relative distance to its nearest recovered one."""
    d = (truth[:, None] - h[None]).norm(dim=-1).min(1).values
    return d / truth.norm(dim=-1)


def test_a_batch_past_samplings_reach_is_recovered_exactly():
    """B = 32 on a 256-unit layer: SPEAR's sampling expects ≈ 2e-4 finds, the vertex search
    finds every output gradient exactly, and with all of them every input and label."""
    b = 32
    assert spear_module.expected_finds(256, b, 1 << 17) < spear_module.MIN_FINDS
    x, y, mean, std = batch(b, seed=1)
    model = net(seed=1)
    obs = observe(model, x, y, mean=mean, std=std)
    (rec,) = run_attack("spear", [obs], samples=1 << 17)
    how = rec.meta["spear"]["how"]
    assert rec.meta["recovered"] == b, how
    assert "as vertices" in how
    layer = pick_layer(obs)
    dw, _ = layer_gradient(obs, layer)
    sep = vertex.separate(obs, layer, top_singular(dw, b)[0], seed=0)
    truth = inputs(x, mean, std)
    cos = torch.nn.functional.cosine_similarity(sep.h[:, None], truth[None], dim=-1)
    assert float(1 - cos.max(1).values.max()) < 1e-6  # each input's direction
    assert float(errors(sep.h, truth).max()) < 1e-3  # and scale (from ê, to float32's 1e-4)
    perm = match(x, rec.images)
    assert bool((rec.labels[perm] == y).all())


def output_gradients(model: nn.Module, x, y, mean, std) -> torch.Tensor:
    """The true per-example output gradients of the hidden layer, d ⊙ W₂ᵀ(p − y), (B, m)."""
    with torch.no_grad():
        z = model[1](inputs(x, mean, std).float()).double()
        p = torch.softmax(model[3](z.clamp_min(0).float()).double(), 1)
    e = p - torch.eye(10, dtype=torch.float64)[y]
    return (z > 0) * (e @ model[3].weight.detach().double())


def test_clipping_and_scale_leave_the_output_gradients_and_inputs_exact():
    """Each example's clip factor rescales its output gradient in ∂W and ∂c alike: the
    vertex (normalised e_y = −1) does not see it, and the scales come from ∂c = Σ t_i δ̂_i
    (p̄ is then read off the model at the mean image)."""
    b = 16
    x, y, mean, std = batch(b, seed=3)
    model = net(seed=3)
    obs = observe(model, x, y, mean=mean, std=std, clip=0.5, scale=-3.0)
    layer = pick_layer(obs)
    dw, _ = layer_gradient(obs, layer)
    sep = vertex.separate(obs, layer, top_singular(dw, b)[0], seed=0)
    assert bool(sep.found.all()), sep.meta["how"]
    truth = output_gradients(model, x, y, mean, std)
    cos = torch.nn.functional.cosine_similarity(sep.g.T[:, None], truth[None], dim=-1)
    assert float(1 - cos.max(1).values.min()) < 1e-6
    assert float(errors(sep.h, inputs(x, mean, std)).max()) < 1e-3  # scales from ∂c


def column_space(b: int, seed: int):
    """A batch, its net, the orthonormal column space ``u`` of the hidden layer's gradient and
    the classifier's weight ``w2`` (numpy)."""
    x, y, mean, std = batch(b, seed=seed)
    model = net(seed=seed)
    obs = observe(model, x, y, mean=mean, std=std)
    dw, _ = layer_gradient(obs, pick_layer(obs))
    u = torch.linalg.qr(top_singular(dw, b)[0])[0].numpy()
    return x, y, mean, std, model, u, model[3].weight.detach().double().numpy()


def test_a_wrong_mask_is_never_called_exact():
    """The true ReLU pattern puts d ⊙ W₂ᵀe in the gradient's column space (e re-solved);
    one active unit of median size switched off leaves it off by far more than EXACT."""
    x, y, mean, std, model, u, w2 = column_space(16, seed=3)
    with torch.no_grad():
        z = model[1](inputs(x, mean, std).float()).double()
        p = torch.softmax(model[3](z.clamp_min(0).float()).double(), 1)
    i, label = 0, int(y[0])
    mask = (z[i] > 0).numpy()
    delta, e, off = vertex.fit_delta(u, w2, mask, label)
    truth = (p[i] - torch.eye(10, dtype=torch.float64)[label]).numpy()
    assert off < 1e-5 and np.allclose(e, truth / -truth[label], atol=1e-4)
    active = np.nonzero(mask)[0]
    typical = active[np.argsort(np.abs(delta[active]))[len(active) // 2]]
    wrong = mask.copy()
    wrong[typical] = False
    assert vertex.fit_delta(u, w2, wrong, label)[2] > 10 * vertex.EXACT


def test_the_residual_of_all_but_one_output_gradient_is_the_missing_input():
    """With every output gradient but example j's found, (I − Δ_K Δ_K⁺) ∂W has rank one and
    its row space is example j's input: one missing example is known up to sign and scale."""
    b = 12
    x, y, mean, std = batch(b, seed=6)
    model = net(seed=6)
    obs = observe(model, x, y, mean=mean, std=std)
    layer = pick_layer(obs)
    dw, _ = layer_gradient(obs, layer)
    w, c = (t.detach().double().numpy() for t in (model[1].weight, model[1].bias))
    missing = vertex.MissingInputs(dw.numpy(), w, c, b, nonnegative=False)
    deltas = list(output_gradients(model, x, y, mean, std).numpy())
    j = 5
    missing(deltas[:j] + deltas[j + 1 :], np.random.default_rng(0))
    truth = inputs(x, mean, std)[j].numpy()
    (row,) = missing.span
    cos = abs(row @ truth) / (np.linalg.norm(row) * np.linalg.norm(truth))
    assert cos > 1 - 1e-6


def test_small_noise_is_searched_within_its_angle_and_large_noise_is_not():
    """Noise N(0, σ²) turns the column space by ≈ σ(√m + √n)/s_B: at 1e-7 on these photos
    every output gradient is still found, with its input close; where the turn passes
    ANGLE the search is not run, and says so."""
    b = 16
    x, y, mean, std = batch(b, seed=4)
    model = net(seed=4)
    layer = pick_layer(observe(model, x, y, mean=mean, std=std))
    small = observe(model, x, y, mean=mean, std=std, noise=1e-7)
    dw, _ = layer_gradient(small, layer)
    sep = vertex.separate(small, layer, top_singular(dw, b)[0], seed=0)
    assert bool(sep.found.all()) and 0 < sep.meta["angle"] < vertex.ANGLE, sep.meta["how"]
    truth = inputs(x, mean, std)
    cos = torch.nn.functional.cosine_similarity(sep.h[:, None], truth[None], dim=-1)
    assert float(cos.max(1).values.min()) > 0.99
    large = observe(model, x, y, mean=mean, std=std, noise=1e-3)
    dw, _ = layer_gradient(large, layer)
    sep = vertex.separate(large, layer, top_singular(dw, b)[0], seed=0)
    assert not bool(sep.found.any()) and "not run" in sep.meta["how"]


def test_a_layer_not_feeding_the_classifier_is_not_searched():
    x, y, mean, std = batch(8, seed=4)
    deep = nn.Sequential(
        nn.Flatten(), nn.Linear(3 * 32 * 32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
        nn.Linear(64, 10),
    )  # fmt: skip
    obs = observe(deep.eval(), x, y, mean=mean, std=std)
    nxt, why = vertex.classifier_after(obs, pick_layer(obs))
    assert nxt is None and "not the classifier" in why


def test_auto_picks_spear_past_the_sampling_where_the_layer_feeds_the_classifier():
    x, y, mean, std = batch(32, seed=5)
    obs = observe(net(seed=5), x, y, mean=mean, std=std)
    name, why = choose(obs)
    assert name == "spear" and "vertex" in why


def test_where_the_outputs_spread_far_only_true_output_gradients_are_claimed():
    """A classifier 30× larger spreads the softmax outputs far from their mean (as training
    does): the label no longer fixes most signs and few examples are found — but each one
    claimed is a true output gradient (a fitted e must be a softmax output)."""
    b = 24
    x, y, mean, std = batch(b, seed=8)
    model = net(seed=8)
    with torch.no_grad():
        model[3].weight.mul_(30.0)
    obs = observe(model, x, y, mean=mean, std=std)
    layer = pick_layer(obs)
    dw, _ = layer_gradient(obs, layer)
    sep = vertex.separate(obs, layer, top_singular(dw, b)[0], seed=0)
    k = int(sep.found.sum())
    assert 0 < k < b, sep.meta["how"]
    truth = output_gradients(model, x, y, mean, std)
    cos = torch.nn.functional.cosine_similarity(sep.g[:, :k].T[:, None], truth[None], dim=-1)
    assert float(1 - cos.max(1).values.min()) < 1e-6


def test_the_sparse_rows_of_a_span_of_relu_inputs_are_its_inputs():
    """SPEAR's sampling on the rows: of a span of r ReLU inputs (half their entries zero),
    the rows zero on ≥ 30 % of their entries are exactly those inputs, each once — a mixture
    of two is zero only where both are (a quarter)."""
    rng = np.random.default_rng(0)
    r, n = 10, 200
    inputs = rng.random((r, n)) * (rng.random((r, n)) < 0.5)
    span = np.linalg.qr(inputs.T @ rng.standard_normal((r, r)))[0].T  # mixed, orthonormal
    rows = vertex.sparse_rows(span, rng)
    unit = inputs / np.linalg.norm(inputs, axis=1, keepdims=True)
    cos = np.abs(rows @ unit.T)
    assert len(rows) == r and np.allclose(np.sort(cos.max(1)), 1.0, atol=1e-9)
    assert sorted(cos.argmax(1).tolist()) == list(range(r))


def test_a_wrong_unit_hidden_under_the_tolerance_is_polished_away(monkeypatch):
    """A mask wrong on the unit of smallest |W₂ᵀe| misses span(U) by less than ``EXACT`` (so
    the search would accept it) and leaves its input that far off; the polish puts it right,
    by re-reading and, without that, by the flips alone."""
    x, y, mean, std, model, u, w2 = column_space(16, seed=3)
    true = output_gradients(model, x, y, mean, std)[0].numpy() != 0
    label = int(y[0])
    delta, e, off = vertex.fit_delta(u, w2, true, label)
    assert off < 1e-6
    wrong = true.copy()
    j = int(np.argmin(np.abs(w2.T @ e)))
    wrong[j] = not wrong[j]
    bad, e_bad, off_bad = vertex.fit_delta(u, w2, wrong, label)
    assert 0 < off_bad < vertex.EXACT
    _, fixed, _ = vertex.polish(u, w2, (label, bad, e_bad))
    assert np.array_equal(fixed != 0, true)
    monkeypatch.setattr(vertex, "REPAIRS", 0)
    _, fixed, _ = vertex.polish(u, w2, (label, bad, e_bad))
    assert np.array_equal(fixed != 0, true)
