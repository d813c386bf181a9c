"""privaudit.attacks.rowspace: separated inputs moved to the next layer's row space (CPU).

The refinement's fixed point is the truth: every true input's ReLU features lie in the next
layer's gradient's row space. Started from the truth blurred within the layer's own row space
it must come back to it; where the next layer is narrower than the batch it must not run; and
on photographs it must turn ICA's approximate separation into a better one.
"""

from __future__ import annotations

import sys

import pytest
import torch
from test_attacks import observe
from test_cpa import psnrs

from privaudit.attacks import run_attack
from privaudit.eval.metrics import match, psnr
from privaudit.scenario.data import photos
from privaudit.scenario.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

rowspace = sys.modules["privaudit.attacks.rowspace"]
disaggregation = sys.modules["privaudit.attacks.disaggregation"]
identifiability = sys.modules["privaudit.attacks.identifiability"]


def batch(b: int, seed: int = 0):
    data = photos()
    idx = torch.randperm(len(data.train_x), generator=torch.Generator().manual_seed(seed))[:b]
    model = build_model("mlp", data.input_shape, data.num_classes, seed)
    x, y = data.train_x[idx], data.train_y[idx]
    return x, y, observe(model, x, y, mean=data.mean, std=data.std)


def test_a_blurred_batch_is_brought_back_to_the_true_inputs():
    """Start: each true (normalised) input plus 30 % of another's, projected on ∂W's row
    space — what a half-failed ICA hands over. The refinement returns every input to within
    float32 rounding (the images at ≥ 40 dB), its residual from ≥ 1e-3 to ≤ 1e-6."""
    x, y, obs = batch(8)
    layer = disaggregation.pick_layer(obs)
    nxt, why = rowspace.applicable(obs, layer)
    assert nxt is not None and nxt.module == "body.3", why
    mean = torch.tensor(obs.mean, dtype=torch.float64).view(-1, 1, 1)
    std = torch.tensor(obs.std, dtype=torch.float64).view(-1, 1, 1)
    h = ((x.double() - mean) / std).flatten(1)
    blurred = h + 0.3 * h.roll(1, 0)
    sep = disaggregation.Separated(blurred, torch.zeros(200, 8), torch.ones(8, dtype=bool), {})
    out = rowspace.refine(obs, layer, nxt, sep)
    before, after = out.meta["refine"]["residual_before"], out.meta["refine"]["residual"]
    assert min(before) > 1e-3 and max(after) < 1e-6
    images = disaggregation.images_from_inputs(obs, out.h).float()
    assert float(torch.tensor(psnr(x, images, "none")).min()) >= 40


def test_it_runs_only_where_the_next_layer_is_as_wide_as_the_batch():
    """``fedavg-cnn``'s classifier follows its 512-unit layer with 10 outputs: rank ≤ 10 < B,
    its row space holds no example's features, and CPA says why it kept ICA's."""
    data = photos()
    x, y = data.train_x[:16], data.train_y[:16]
    obs = observe(build_model("fedavg-cnn", data.input_shape, 10, 0), x, y, mean=data.mean,
                  std=data.std)  # fmt: skip
    layer = disaggregation.pick_layer(obs)
    nxt, why = rowspace.applicable(obs, layer)
    assert nxt is None and "rank" in why and "below B = 16" in why
    _, _, mlp = batch(4)  # the last linear layer has no next one
    last = identifiability.linear_layers(mlp.model)[-1]
    assert rowspace.applicable(mlp, last) == (None, f"{last.module} is not followed by ReLU "
                                              "and a linear layer in the message")  # fmt: skip


def test_cpa_with_the_refinement_recovers_more_of_the_batch_than_ica_alone():
    """Photographs, B = 32 on ``mlp``: ICA on pixel differences, then the refinement (the
    default) — more images at ≥ 30 dB than ICA alone (measured 31 of 32 against 10), the
    labels at least as right."""
    x, y, obs = batch(32)
    (ica,) = run_attack("cpa", [obs], refine="off")
    (both,) = run_attack("cpa", [obs])
    assert "refine" not in ica.meta["cpa"] and both.meta["cpa"]["refine"]["layer"] == "body.3"
    p_ica, p_both = psnrs(x, ica), psnrs(x, both)
    assert int((p_both >= 30).sum()) > int((p_ica >= 30).sum())
    assert float((p_both >= 30).double().mean()) >= 0.9
    labels = [(r.labels[match(x, r.images)] == y).double().mean() for r in (ica, both)]
    assert float(labels[1]) >= float(labels[0])


def test_auto_picks_cpa_where_the_refinement_pins_the_batch():
    """Past SPEAR's reach (B > 16) on ``mlp``: CPA, and its answer is ``auto``'s."""
    from privaudit.attacks.auto import choose

    _, _, obs = batch(32)
    attack, why = choose(obs)
    assert attack == "cpa" and "body.3's row space" in why
    data = photos()
    cnn = observe(build_model("fedavg-cnn", data.input_shape, 10, 0), data.train_x[:32],
                  data.train_y[:32], mean=data.mean, std=data.std)  # fmt: skip
    name, why = choose(cnn)  # its first linear layer feeds the classifier: the vertex search
    assert name == "spear" and "vertex search" in why
