"""R-GAP (exact recursive inversion) and the ``auto`` attack's choice (CPU)."""

from __future__ import annotations

import json

import pytest
import torch
from scipy import sparse
from test_attacks import MEAN, STD, observe, photos, psnr
from torch import nn

from privaudit.attacks import ATTACKS, check_options, run_attack
from privaudit.attacks.auto import choose
from privaudit.attacks.chain import Unsupported, linear_chain
from privaudit.attacks.ig import ig, starting_from
from privaudit.attacks.rgap import DENSE_EIG, conv_matrices, solve_layer
from privaudit.cli import main
from privaudit.core.errors import PrivauditError
from privaudit.core.observation import Observation
from privaudit.scenario.models import build_model

ACTIVATIONS = {"sigmoid": nn.Sigmoid, "tanh": nn.Tanh, "leaky": lambda: nn.LeakyReLU(0.2)}


pytestmark = pytest.mark.usefixtures("one_thread")


def chain(act: str = "sigmoid", bias: bool = True, seed: int = 0) -> nn.Module:
    """A small conv chain whose every layer meets R-GAP's rank condition on 3×8×8 inputs:
    192 / 384 unknowns against 384 + 162 / 256 + 216 equations."""
    torch.manual_seed(seed)
    a = ACTIVATIONS[act]
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1),
        a(),
        nn.Conv2d(6, 4, 3, padding=1),
        a(),
        nn.Flatten(),
        nn.Linear(4 * 8 * 8, 10, bias=bias),
    ).eval()


def autograd_observation(model: nn.Module, x: torch.Tensor, label: int) -> Observation:
    """The gradient of one example's cross-entropy by ``torch.autograd.grad``, raw pixels
    (mean 0, std 1: how privaudit feeds DLG's LeNet)."""
    loss = nn.functional.cross_entropy(model(x), torch.tensor([label]))
    names = [n for n, _ in model.named_parameters()]
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return Observation(
        model=model,
        params={n: p.detach().clone() for n, p in model.named_parameters()},
        target={n: g.detach() for n, g in zip(names, grads, strict=True)},
        batch_size=1,
        input_shape=tuple(x.shape[1:]),
        num_classes=10,
        mean=(0.0,) * x.shape[1],
        std=(1.0,) * x.shape[1],
    )


# --- the linear algebra --------------------------------------------------------------------


def test_conv_matrices_match_the_convolution_and_its_weight_gradient():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 5, 5, padding=2, stride=2).double()
    x = torch.rand(1, 3, 12, 12, dtype=torch.float64)
    out = conv(x)
    delta = torch.randn_like(out)
    (dw,) = torch.autograd.grad(out, [conv.weight], delta)
    fwd, grad = conv_matrices(conv, (3, 12, 12), conv.weight.detach(), delta.reshape(-1))
    bias = conv.bias.detach().repeat_interleave(out[0, 0].numel())
    flat = x.reshape(-1).numpy()
    torch.testing.assert_close(torch.from_numpy(fwd @ flat) + bias, out.detach().reshape(-1))
    torch.testing.assert_close(torch.from_numpy(grad @ flat), dw.reshape(-1))


@pytest.mark.parametrize("decay", [1.0, 1e-8])
def test_solve_layer_matches_dense_least_squares_and_the_svd_condition_number(decay):
    """The sparse normal-equation path (Cholesky, Lanczos condition estimate: n is above
    the dense-eigenvalue size) against the dense SVD of the same row-scaled system; an
    ill-conditioned one goes to gelsd."""
    gen = torch.Generator().manual_seed(0)
    n = DENSE_EIG + 44
    scales = torch.logspace(0, torch.log10(torch.tensor(decay)).item(), n, dtype=torch.float64)
    fwd = torch.randn(n, n, generator=gen, dtype=torch.float64) * scales
    grad = torch.randn(200, n, generator=gen, dtype=torch.float64) * scales * 3
    x_true = torch.randn(n, generator=gen, dtype=torch.float64)
    blocks = [(sparse.csr_matrix(m.numpy()), m @ x_true) for m in (fwd, grad)]
    x, info = solve_layer(blocks, n, rcond=1e-12)
    rows = [m * (m.shape[0] ** 0.5 / m.norm()) for m in (fwd, grad)]
    s = torch.linalg.svdvals(torch.cat(rows))
    assert info["cond"] == pytest.approx(float(s[0] / s[-1]), rel=1e-2)
    assert info["solver"] == ("normal-equations" if decay == 1.0 else "lstsq-gelsd")
    if decay == 1.0:
        torch.testing.assert_close(x, x_true)
    assert info["residual"] < 1e-8 and info["equations"] == n + 200 and info["full_rank"]


def test_chain_reads_lenet_and_refuses_pooling():
    layers = linear_chain(build_model("lenet", (3, 32, 32), 10), (3, 32, 32))
    assert [type(la.module).__name__ for la in layers] == ["Conv2d"] * 3 + ["Linear"]
    assert [la.in_shape for la in layers] == [(3, 32, 32), (12, 16, 16), (12, 8, 8), (768,)]
    assert all(isinstance(la.activation, nn.Sigmoid) for la in layers[:3])
    with pytest.raises(Unsupported, match="MaxPool2d"):
        linear_chain(build_model("cnn", (3, 8, 8), 10), (3, 8, 8))
    with pytest.raises(Unsupported, match="Linear classifier"):
        linear_chain(nn.Sequential(nn.Flatten(), nn.Linear(12, 10), nn.Sigmoid()), (3, 2, 2))
    with pytest.raises(Unsupported, match="needs a flattened vector"):
        linear_chain(nn.Sequential(nn.Linear(2, 10)), (3, 2, 2))


# --- exactness ----------------------------------------------------------------------------


@pytest.mark.parametrize("act", list(ACTIVATIONS))
@pytest.mark.parametrize("bias", [True, False])
def test_rgap_is_exact_on_a_small_chain(act, bias):
    """Gradients from torch.autograd on a known image; the classifier with and without
    bias (without: the output gradient comes from the label and the loss)."""
    x = photos(1, 8)
    obs = autograd_observation(chain(act, bias), x, 3)
    rec = run_attack("rgap", [obs])[0]
    assert psnr(rec.images, x) >= 40
    assert rec.meta["exact"] and rec.meta["fallback"] is None
    assert rec.meta["exact_layers"] == ["0", "2", "5"]
    assert all(r["rank"] == r["unknowns"] for r in rec.meta["layers"] if r["type"] == "Conv2d")
    assert rec.labels.tolist() == [3] and rec.loss < 1e-6


@pytest.fixture(scope="module")
def lenet_image():
    return build_model("lenet", (3, 32, 32), 10, 0), photos(1, 32)


def test_rgap_is_exact_on_lenet_from_autograd(lenet_image):
    model, x = lenet_image
    rec = run_attack("rgap", [autograd_observation(model, x, 7)])[0]
    assert psnr(rec.images, x) >= 40
    assert rec.meta["exact_layers"] == ["body.0", "body.2", "body.4", "fc"]
    for r in rec.meta["layers"][:3]:
        assert r["rank"] == r["unknowns"] and r["cond"] < 1e4


def test_rgap_is_exact_on_lenet_through_a_normalised_observation(lenet_image):
    """The Observation as the attack tests build it (mean/std normalisation inside)."""
    model, x = lenet_image
    rec = run_attack("rgap", [observe(model, x, torch.tensor([2]), mean=MEAN, std=STD)])[0]
    assert psnr(rec.images, x) >= 40 and rec.meta["exact"]


@pytest.mark.parametrize("bias", [True, False])
def test_scale_and_clip_are_honoured(bias):
    """A scaled, clipped message is inverted exactly; told the wrong scale or no clip,
    the bias-free classifier (the one step that needs them) is not."""
    x = photos(1, 8)
    model = chain("tanh", bias)
    obs = observe(model, x, torch.tensor([3]), scale=-0.3, clip=0.01)
    rec = run_attack("rgap", [obs])[0]
    assert psnr(rec.images, x) >= 40 and rec.meta["exact"]
    if not bias:
        for wrong in ({"clip": None}, {"scale": 0.3}):
            told = Observation(**{**obs.__dict__, **wrong})
            bad = run_attack("rgap", [told], fallback=False)[0]
            assert psnr(bad.images, x) < 30


# --- falling back ---------------------------------------------------------------------------


def test_unsupported_model_falls_back_to_ig_and_says_why():
    x = photos(1, 8)
    obs = observe(build_model("cnn", (3, 8, 8), 10, 0), x, torch.tensor([1]))
    rec = run_attack("rgap", [obs], iterations=3)[0]
    assert "MaxPool2d" in rec.meta["fallback"] and rec.meta["start"] == "noise"
    assert rec.meta["attack"] == "ig"  # what ran is what is reported
    assert not rec.meta["exact"] and rec.meta["exact_layers"] == []
    assert rec.meta["ig"]["iterations"] == 3 and rec.images.shape == x.shape
    with pytest.raises(PrivauditError, match="MaxPool2d"):
        run_attack("rgap", [obs], fallback=False)


def test_batch_of_two_falls_back():
    x = photos(2, 8)
    rec = run_attack("rgap", [observe(chain(), x, torch.tensor([1, 4]))], iterations=2)[0]
    assert "one example" in rec.meta["fallback"] and rec.images.shape == x.shape


def test_rank_deficient_layer_falls_back_from_rgaps_start():
    """A stride-2 first layer with 4 filters: 64 + 108 equations for 192 unknowns."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1, stride=2), nn.Sigmoid(), nn.Flatten(), nn.Linear(64, 10)
    ).eval()
    obs = observe(model, photos(1, 8), torch.tensor([5]))
    rec = run_attack("rgap", [obs], iterations=2)[0]
    (layer,) = [r for r in rec.meta["layers"] if r["layer"] == "0"]
    assert layer["rank"] < layer["unknowns"] == 192 and not layer["exact"]
    assert rec.meta["exact_layers"] == ["3"]
    assert "rank condition fails at 0" in rec.meta["fallback"] and rec.meta["start"] == "rgap"
    assert rec.meta["attack"] == "rgap+ig"


def test_ig_starts_where_it_is_told():
    x = photos(1, 8)
    obs = observe(chain(), x, torch.tensor([3]))
    with starting_from(x.unsqueeze(0)):
        (near,) = ig(obs, iterations=1, lr=1e-6, tv=0.0)
    (far,) = ig(obs, iterations=1, lr=1e-6, tv=0.0)
    assert psnr(near.images, x) > 80 and psnr(far.images, x) < 20


# --- auto --------------------------------------------------------------------------------


def test_auto_picks_the_strongest_applicable_attack():
    x1, x2 = photos(1, 8), photos(2, 8)
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(192, 16), nn.Sigmoid(), nn.Linear(16, 10))
    cases = {
        "analytic": observe(mlp.eval(), x1, torch.tensor([2])),
        "rgap": observe(chain(), x1, torch.tensor([2])),
        "ig": observe(build_model("cnn", (3, 8, 8), 10, 0), x1, torch.tensor([2])),
    }
    # no closed form for the ReLU cnn: its one example's features solve, so fi, not ig
    runs = {"analytic": "analytic", "rgap": "rgap", "ig": "fi"}
    for want, obs in cases.items():
        assert choose(obs)[0] == want
        rec = run_attack("auto", [obs], iterations=2)[0]
        assert rec.meta["attack"] == runs[want] and rec.meta["auto"]
        if want != "ig":
            assert psnr(rec.images, x1) >= 40
    batch = observe(chain(), x2, torch.tensor([2, 6]))
    assert choose(batch) == ("ig", "B = 2: the closed forms invert one example")
    rec = run_attack("auto", [batch], iterations=2)[0]  # the batch's features solve exactly
    assert rec.meta["attack"] == "fi" and "exactly" in rec.meta["auto"]


def test_auto_turns_a_failed_rank_condition_into_ig():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1, stride=2), nn.Sigmoid(), nn.Flatten(), nn.Linear(64, 10)
    ).eval()
    obs = observe(model, photos(1, 8), torch.tensor([5]))
    assert choose(obs)[0] == "rgap"  # by architecture; the rank is known only once it runs
    rec = run_attack("auto", [obs], iterations=2)[0]
    assert rec.meta["attack"] == "ig" and "rank condition fails" in rec.meta["auto"]


def test_registry_and_options():
    assert {"rgap", "auto"} <= set(ATTACKS)
    assert check_options("rgap", {"rcond": 1e-6, "tv": 0}) == {"rcond": 1e-6, "tv": 0.0}
    assert check_options("auto", {"lr": 0.05, "label_method": "llg"})["lr"] == 0.05
    with pytest.raises(PrivauditError, match="rcond must be"):
        check_options("rgap", {"rcond": 2.0})
    with pytest.raises(PrivauditError, match="takes no option"):
        check_options("auto", {"max_iter": 3})


# --- end to end ---------------------------------------------------------------------------

TINY = ["--agents", "3", "--batch-size", "1", "--no-progress", "--iterations", "4", "--no-lpips"]


def test_cli_auto_reports_its_choice_on_nd_cg(tmp_path, capsys):
    """nd-cg on the default LeNet with B = 1: in round 1 of seed 1 victim 0's Poisson batch
    holds one example, which auto hands to R-GAP and R-GAP inverts exactly."""
    out = tmp_path / "out"
    args = ["--target", "nd-cg", "--round", "1", "--attack", "auto", "--out", str(out)]
    code = main(["attack", *args, "--seed", "1", *TINY])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads((out / "result.json").read_text())
    assert result["batch_sizes"] == [1], "the seed no longer draws one example: pick another"
    assert result["attack"] == "auto" and result["attack_used"] == ["rgap"]
    assert result["metrics"]["psnr"] >= 40 and result["metrics"]["label_acc"] == 1.0
    assert "auto (rgap)" in stdout


def test_auto_leaves_a_noised_message_to_optimisation_which_recovers_more(lenet_image):
    """Noise on the gradient (a DP message) compounds through R-GAP's recursion: on the
    LeNet at noise std 1e-2 its recovery is at noise level; the optimisation auto picks
    instead (fi: the one example's features still solve to within its bound) is not."""
    import dataclasses

    model, x = lenet_image
    clean = autograd_observation(model, x, 7)
    g = torch.Generator().manual_seed(0)
    noisy = {k: v + 1e-2 * torch.randn(v.shape, generator=g) for k, v in clean.target.items()}
    obs = dataclasses.replace(clean, target=noisy, noise_std=1e-2)
    assert choose(obs)[0] == "ig" and "noised" in choose(obs)[1]
    assert choose(clean)[0] == "rgap"
    picked = run_attack("auto", [obs], iterations=300)[0]
    closed = run_attack("rgap", [obs])[0]
    assert picked.meta["attack"] == "fi" and "approximately" in picked.meta["auto"]
    assert psnr(picked.images, x) >= psnr(closed.images, x) + 3
