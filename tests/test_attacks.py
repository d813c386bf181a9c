"""privaudit.attacks: exact recoveries, label inference, batching, registry (fast, CPU)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from privaudit.attacks import ATTACKS, DEFAULT_ATTACK, run_attack
from privaudit.attacks.common import gradient_fn, one_hot, stack_observations
from privaudit.attacks.labels import infer_labels
from privaudit.core.errors import PrivauditError
from privaudit.core.observation import Observation
from privaudit.scenario.models import build_model

MEAN = (0.5, 0.45, 0.4)
STD = (0.25, 0.25, 0.25)

pytestmark = pytest.mark.usefixtures("one_thread")


def photos(n: int, size: int) -> torch.Tensor:
    """``n`` natural images (crops of scikit-image's photographs), else smooth synthetic ones."""
    try:
        from skimage import data, transform

        srcs = [data.astronaut(), data.chelsea(), data.coffee(), data.rocket()]
        out = []
        for i in range(n):
            im = srcs[i % len(srcs)]
            s = min(im.shape[:2])
            im = transform.resize(im[:s, :s], (size, size), anti_aliasing=True)
            out.append(torch.tensor(im, dtype=torch.float32).permute(2, 0, 1))
        return torch.stack(out)
    except ImportError:  # pragma: no cover - scikit-image is a dependency
        u = torch.linspace(0, 1, size)
        yy, xx = torch.meshgrid(u, u, indexing="ij")
        return torch.stack(
            [
                torch.stack([(torch.sin(3 * xx + i) + 1) / 2, yy, (xx * yy + i / n) % 1])
                for i in range(n)
            ]
        )


def observe(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    scale: float = 1.0,
    clip: float | None = None,
    noise: float = 0.0,
    mean: tuple[float, ...] = MEAN,
    std: tuple[float, ...] = STD,
    num_classes: int = 10,
) -> Observation:
    """The leak the contract describes, computed independently of the attacks' code."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    m = torch.tensor(mean).view(-1, *[1] * (x.dim() - 2))
    s = torch.tensor(std).view(-1, *[1] * (x.dim() - 2))

    def loss(p, xb, yb):
        return nn.functional.cross_entropy(functional_call(model, p, ((xb - m) / s,)), yb)

    if clip is None:
        g = grad(loss)(params, x, y)
    else:
        per = vmap(grad(lambda p, xi, yi: loss(p, xi[None], yi[None])), in_dims=(None, 0, 0))
        ge = per(params, x, y)
        norm = sum(v.flatten(1).pow(2).sum(1) for v in ge.values()).sqrt()
        f = (clip / (norm + 1e-12)).clamp(max=1.0)
        g = {k: (v * f.view(-1, *[1] * (v.dim() - 1))).mean(0) for k, v in ge.items()}
    gen = torch.Generator().manual_seed(123)
    target = {k: scale * v + noise * torch.randn(v.shape, generator=gen) for k, v in g.items()}
    return Observation(
        model=model,
        params=params,
        target=target,
        batch_size=x.shape[0],
        input_shape=tuple(x.shape[1:]),
        num_classes=num_classes,
        scale=scale,
        clip=clip,
        noise_std=noise,
        mean=mean,
        std=std,
    )


def mse(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b) ** 2).mean())


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(10 * torch.log10(1 / ((a - b) ** 2).mean()))


# --- analytic ---------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [{}, {"scale": -0.3, "clip": 0.01}])
def test_analytic_recovers_linear_input_exactly(cfg):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Flatten(), nn.Linear(3 * 8 * 8, 16), nn.Sigmoid(), nn.Linear(16, 10)
    ).eval()
    x = torch.rand(1, 3, 8, 8)
    rec = run_attack("analytic", [observe(model, x, torch.tensor([4]), **cfg)])[0]
    assert rec.images.shape == x.shape
    torch.testing.assert_close(rec.images, x, atol=1e-5, rtol=0)
    assert rec.labels.tolist() == [4]
    assert rec.loss < 1e-10


def test_analytic_needs_linear_first_layer():
    model = build_model("lenet", (3, 16, 16), 10, 0)
    obs = observe(model, photos(1, 16), torch.tensor([1]))
    with pytest.raises(PrivauditError, match="first layer is Linear"):
        run_attack("analytic", [obs])


# --- the dummy gradient models the mechanism ----------------------------------------------


@pytest.mark.parametrize("cfg", [{}, {"scale": 0.5}, {"clip": 0.05, "scale": 2.0}])
def test_dummy_gradient_matches_target_at_the_truth(cfg):
    model = build_model("lenet", (3, 16, 16), 10, 0)
    x, y = photos(2, 16), torch.tensor([1, 7])
    obs = observe(model, x, y, **cfg)
    stack = stack_observations([obs])
    g = gradient_fn(stack)(x[None], one_hot([y], stack, 1))[0]
    t = torch.cat([obs.target[n].reshape(-1) for n in stack.names])
    torch.testing.assert_close(g, t, atol=1e-6, rtol=1e-4)


# --- DLG / iDLG / IG on the DLG LeNet -----------------------------------------------------


@pytest.fixture(scope="module")
def lenet_obs():
    model = build_model("lenet", (3, 16, 16), 10, 0)
    x = photos(1, 16)
    return observe(model, x, torch.tensor([3])), x


def test_idlg_reconstructs_near_exactly(lenet_obs):
    obs, x = lenet_obs
    rec = run_attack("idlg", [obs], iterations=15)[0]
    assert rec.labels.tolist() == [3]
    assert rec.meta["labels"] == "inferred"
    assert mse(rec.images, x) < 1e-3


def test_dlg_reconstructs_near_exactly(lenet_obs):
    obs, x = lenet_obs
    rec = run_attack("dlg", [obs], iterations=25)[0]
    assert rec.labels.tolist() == [3]
    assert rec.meta["labels"] == "optimized"
    assert mse(rec.images, x) < 1e-3


def test_lbfgs_attacks_run_on_several_images_at_once(lenet_obs):
    """Two restarts, or two observations, put several dummy images through the traced
    channels-last convolutions at once; their gradient then has no flat view, which torch's
    L-BFGS asked for (it raised). Each image is still recovered."""
    obs, x = lenet_obs
    (rec,) = run_attack("dlg", [obs], iterations=25, restarts=2)
    assert mse(rec.images, x) < 1e-3
    recs = run_attack("idlg", [obs, obs], iterations=15)
    assert len(recs) == 2 and all(mse(r.images, x) < 1e-3 for r in recs)


def test_ig_beats_a_random_image(lenet_obs):
    obs, x = lenet_obs
    rec = run_attack("ig", [obs], iterations=300)[0]
    assert rec.images.shape == x.shape and rec.labels.dtype == torch.int64
    assert 0 <= float(rec.images.min()) and float(rec.images.max()) <= 1
    random = psnr(torch.rand(x.shape, generator=torch.Generator().manual_seed(0)), x)
    assert psnr(rec.images, x) > random + 6


def test_given_labels_are_used(lenet_obs):
    obs, _ = lenet_obs
    given = Observation(**{**obs.__dict__, "labels": torch.tensor([5])})
    rec = run_attack("ig", [given], iterations=2)[0]
    assert rec.labels.tolist() == [5] and rec.meta["labels"] == "given"


# --- labels -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg", [{}, {"scale": -0.05}, {"clip": 0.1}, {"noise": 1e-3}, {"clip": 1.0, "noise": 1e-3}]
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_label_inference_single_example(cfg, seed):
    model = build_model("lenet", (3, 16, 16), 10, seed)
    label = (3 * seed + 1) % 10
    obs = observe(model, photos(1, 16), torch.tensor([label]), **cfg)
    assert infer_labels(obs).tolist() == [label]


@pytest.mark.parametrize(("arch", "seed"), [("lenet", 0), ("cnn", 0), ("cnn", 1), ("cnn", 2)])
@pytest.mark.parametrize("cfg", [{}, {"scale": 3.0}, {"clip": 0.1}, {"noise": 1e-3}])
def test_label_inference_batch_of_four(arch, seed, cfg):
    model = build_model(arch, (3, 16, 16), 10, seed)
    y = torch.tensor([8, 0, 5, 2])
    obs = observe(model, photos(4, 16), y, **cfg)
    labels = infer_labels(obs)
    assert labels.dtype == torch.int64
    assert sorted(labels.tolist()) == sorted(y.tolist())


# --- batching and determinism -------------------------------------------------------------


def test_ig_batched_equals_separate():
    imgs = photos(3, 16)
    obs = [
        observe(build_model("lenet", (3, 16, 16), 10, k), imgs[k : k + 1], torch.tensor([k]))
        for k in range(3)
    ]
    batched = run_attack("ig", obs, iterations=40, restarts=2, seed=5)
    for k in range(3):
        alone = run_attack("ig", [obs[k]], iterations=40, restarts=2, seed=5 + k)[0]
        torch.testing.assert_close(batched[k].images, alone.images, atol=1e-6, rtol=0)
        assert batched[k].loss == pytest.approx(alone.loss, abs=1e-6)
        assert batched[k].meta["restart"] == alone.meta["restart"]


def test_deterministic_given_seed(lenet_obs):
    obs, _ = lenet_obs
    a = run_attack("idlg", [obs], iterations=2, seed=3)[0]
    b = run_attack("idlg", [obs], iterations=2, seed=3)[0]
    c = run_attack("idlg", [obs], iterations=2, seed=4)[0]
    assert torch.equal(a.images, b.images)
    assert not torch.equal(a.images, c.images)


def test_mixed_architectures_are_refused(lenet_obs):
    obs, x = lenet_obs
    other = observe(build_model("cnn", (3, 16, 16), 10, 0), x, torch.tensor([1]))
    with pytest.raises(PrivauditError, match="one architecture"):
        run_attack("ig", [obs, other], iterations=1)


# --- registry -----------------------------------------------------------------------------


def test_registry():
    assert set(ATTACKS) == {
        "ig", "dlg", "idlg", "analytic", "rgap", "fi", "hybrid", "auto", "cpa", "spear"
    }  # fmt: skip
    assert DEFAULT_ATTACK in ATTACKS


def test_unknown_attack_lists_valid_names(lenet_obs):
    with pytest.raises(PrivauditError) as err:
        run_attack("nope", [lenet_obs[0]])
    for name in ATTACKS:
        assert name in str(err.value)


def test_unknown_option_is_refused(lenet_obs):
    with pytest.raises(PrivauditError, match="tv"):
        run_attack("dlg", [lenet_obs[0]], tv=0.1)


def test_traced_step_equals_eager_and_is_replayed_through_aten():
    """value_and_grad's traced, folded, channels-last, direct-ATen step gives functorch's
    eager value and gradient (second order through the dummy gradient)."""
    from privaudit.attacks import common, compiled

    imgs = photos(4, 16)
    obs = [
        observe(build_model("lenet", (3, 16, 16), 10, k), imgs[k : k + 1], torch.tensor([k]))
        for k in range(4)
    ]
    stack = stack_observations(obs)
    y = one_hot([torch.tensor([k]) for k in range(4)], stack, 1)
    dummy = common.gradient_fn(stack)
    target = stack.target

    def objective(x):
        g = dummy(x, y)
        return common.cosine_distance(g, target) + 0.1 * common.total_variation(x)

    x = torch.rand(4, 1, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    (ge,), le = compiled.value_and_grad(objective, x, trace=False)(x)
    for channels_last in (False, True):
        step = compiled.value_and_grad(objective, x, channels_last=channels_last)
        fn = next(c.cell_contents for c in step.__closure__ if callable(c.cell_contents))
        assert fn.func.__name__ == "forward"  # traced and bound by direct_ops, not eager
        x2 = torch.rand_like(x)  # a new point: nothing of the example is baked in
        (gt,), lt = step(x2)
        (ge2,), le2 = compiled.value_and_grad(objective, x2, trace=False)(x2)
        torch.testing.assert_close(lt, le2, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(gt, ge2, rtol=1e-4, atol=1e-5 * float(ge2.abs().max()))
    assert not torch.allclose(ge, ge2)


def test_fold_constants_keeps_inplace_and_merges_repeats():
    from torch.fx.experimental.proxy_tensor import make_fx

    from privaudit.attacks.compiled import fold_constants

    w = torch.randn(5, 5)

    def f(x):
        a = (w.t() * 2) @ x  # constant subexpression w.t() * 2: folded
        b = (w.t() * 2) @ x
        return (a + b).relu_()  # in place: kept

    gm = make_fx(f)(torch.randn(5, 3))
    before = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    fold_constants(gm)
    gm.recompile()
    after = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    aten = torch.ops.aten
    assert aten.t.default in before and aten.t.default not in after
    assert after.count(aten.mm.default) == 1 and aten.relu_.default in after
    x = torch.randn(5, 3)
    torch.testing.assert_close(gm(x), f(x))
