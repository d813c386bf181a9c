"""The centralised DP-SGD reference (privaudit.experiments.centralised) on a tiny separable task."""

import math

import pytest
import torch
from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier
from torch import nn

from privaudit.core.accounting import epsilon_for_sigma
from privaudit.experiments.centralised import ReferenceResult, centralised_dpsgd, pooled_sample_rate
from privaudit.scenario.models import build_model


def _images(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """8×8 single-channel images whose class is the sign of the mean pixel: each class's
    pixels are shifted by ±0.5, so the mean is ±0.5 ± 0.125 (separable by a linear model)."""
    g = torch.Generator().manual_seed(seed)
    shift = torch.randint(0, 2, (n,), generator=g).float() * 2 - 1
    x = torch.randn(n, 1, 8, 8, generator=g) + 0.5 * shift.view(-1, 1, 1, 1)
    return x, (x.mean(dim=(1, 2, 3)) > 0).long()


@pytest.fixture(scope="module")
def data():
    train_x, train_y = _images(256, 0)
    test_x, test_y = _images(256, 1)
    return train_x, train_y, test_x, test_y


def _linear(seed: int = 0) -> nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 2))


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_non_private_reference_learns(data):
    model = _linear()
    res = centralised_dpsgd(
        model, *data, sample_rate=0.1, steps=60, lr=0.5, clip=None, epsilon=None
    )
    assert isinstance(res, ReferenceResult)
    assert res.accuracy >= 0.9
    assert res.epsilon == math.inf and res.sigma == 0.0 and res.clip is None
    assert res.steps == 60 and res.sample_rate == 0.1
    # trained in place and left in eval mode: the returned accuracy is the model's
    assert not model.training
    with torch.no_grad():
        acc = (model(data[2]).argmax(-1) == data[3]).float().mean().item()
    assert acc == pytest.approx(res.accuracy)


def test_private_reference_learns_at_large_epsilon(data):
    res = centralised_dpsgd(
        _linear(), *data, sample_rate=0.1, steps=60, lr=0.5, clip=1.0, epsilon=50.0
    )
    assert res.accuracy >= 0.9
    assert 0 < res.sigma and res.epsilon <= 50.0 + 0.01
    assert res.clip == 1.0


@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")
def test_private_sigma_and_epsilon_match_opacus_and_project_accounting(data):
    q, steps, delta, target = 0.1, 20, 1e-5, 0.2
    res = centralised_dpsgd(
        _linear(),
        *data,
        sample_rate=q,
        steps=steps,
        lr=0.5,
        clip=1.0,
        epsilon=target,
        delta=delta,
    )
    sigma = get_noise_multiplier(
        target_epsilon=target, target_delta=delta, sample_rate=q, steps=steps, accountant="rdp"
    )
    assert res.sigma == sigma and sigma > 5  # a tiny ε: heavy noise
    assert res.epsilon <= target + 0.01
    acc = RDPAccountant()
    acc.history = [(sigma, q, steps)]
    assert res.epsilon == pytest.approx(acc.get_epsilon(delta=delta), rel=1e-6)
    ours = epsilon_for_sigma(res.sigma, delta, q, steps)
    assert res.epsilon == pytest.approx(ours, rel=1e-3)


@pytest.mark.parametrize("epsilon", [None, 5.0])
def test_same_seed_same_result_other_seed_differs(data, epsilon):
    kw = dict(sample_rate=0.1, steps=15, lr=0.5, clip=1.0, epsilon=epsilon)
    a, b, c = _linear(), _linear(), _linear()
    ra = centralised_dpsgd(a, *data, seed=3, **kw)
    rb = centralised_dpsgd(b, *data, seed=3, **kw)
    rc = centralised_dpsgd(c, *data, seed=4, **kw)
    assert ra == rb
    assert all(torch.equal(p, r) for p, r in zip(_params(a), _params(b), strict=True))
    assert not all(torch.equal(p, r) for p, r in zip(_params(a), _params(c), strict=True))
    assert ra.sigma == rc.sigma


def test_caller_random_state_is_left_alone(data):
    torch.manual_seed(123)  # σ for (ε, q, steps) is cached: the same as the test above
    before = torch.random.get_rng_state()
    centralised_dpsgd(_linear(), *data, sample_rate=0.1, steps=15, lr=0.5, clip=1.0, epsilon=5.0)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_private_requires_clip(data):
    with pytest.raises(ValueError, match="clip"):
        centralised_dpsgd(
            _linear(), *data, sample_rate=0.1, steps=5, lr=0.5, clip=None, epsilon=1.0
        )


@pytest.mark.parametrize("epsilon", [None, 2.0])
def test_exact_steps_with_empty_batches(data, epsilon, monkeypatch):
    """q = 0.002 over 256 examples: about 60% of the batches are empty, each still a step."""
    calls = []
    sgd_step = torch.optim.SGD.step

    def counting(self, *args, **kwargs):
        calls.append(1)
        return sgd_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.SGD, "step", counting)
    model = _linear()
    res = centralised_dpsgd(
        model, *data, sample_rate=0.002, steps=25, lr=0.5, clip=1.0, epsilon=epsilon
    )
    assert len(calls) == 25 and res.steps == 25
    # an empty batch's mean loss is NaN; its (zero) clipped gradient must not leak it
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert 0.0 <= res.accuracy <= 1.0
    if epsilon is not None:  # the accountant composed exactly 25 steps at q
        acc = RDPAccountant()
        acc.history = [(res.sigma, 0.002, 25)]
        assert res.epsilon == pytest.approx(acc.get_epsilon(delta=1e-5), rel=1e-6)


def test_opacus_supported_layers(data):
    """Conv2d, GroupNorm, Tanh, MaxPool2d, Linear and Sigmoid (and the project's LeNet)."""
    torch.manual_seed(0)
    mixed = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.GroupNorm(2, 4),
        nn.Tanh(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64, 8),
        nn.Sigmoid(),
        nn.Linear(8, 2),
    )
    lenet = build_model("lenet", (1, 8, 8), 2)
    for model in (mixed, lenet):
        before = _params(model)
        res = centralised_dpsgd(
            model, *data, sample_rate=0.1, steps=4, lr=0.1, clip=1.0, epsilon=5.0
        )
        assert math.isfinite(res.epsilon) and 0.0 <= res.accuracy <= 1.0
        after = _params(model)
        assert all(torch.isfinite(p).all() for p in after)
        assert not all(torch.equal(p, r) for p, r in zip(before, after, strict=True))


def test_pooled_sample_rate():
    assert pooled_sample_rate(64, [1000, 1000, 1000]) == pytest.approx(64 / 1000)
    assert pooled_sample_rate(10, [100, 300]) == pytest.approx(20 / 400)
    # a shard smaller than B is sampled whole (q_i = 1): it contributes n_i, not B
    assert pooled_sample_rate(10, [5, 95]) == pytest.approx(15 / 100)
    assert pooled_sample_rate(7, [7]) == 1.0
    for bad in ((0, [10]), (4, []), (4, [10, 0])):
        with pytest.raises(ValueError):
            pooled_sample_rate(*bad)


def test_reference_of_a_run_uses_its_data_rate_and_steps():
    """The reference of a run configuration: its partition's pooled rate, its rounds as
    steps, its clip; the private one spends at most the run's ε."""
    from privaudit.core.config import RunConfig
    from privaudit.experiments.centralised import reference_for
    from privaudit.scenario.data import dirichlet_partition, evaluation_split, photos

    cfg = RunConfig(
        dataset="photos", model="tanh-cnn", agents=4, batch_size=8, rounds=3,
        params={"lr": 0.1, "clip": 0.5}, eval_split="validation",
    )  # fmt: skip
    data = evaluation_split(photos(), "validation", cfg.seed)
    parts = dirichlet_partition(data.train_y, 4, cfg.dirichlet_alpha, seed=0, min_size=8)
    res = reference_for(cfg, 4.0)
    assert res.steps == 3 and res.clip == 0.5
    assert res.sample_rate == pytest.approx(4 * 8 / sum(len(p) for p in parts))
    assert res.epsilon <= 4.0 + 0.01 and res.sigma > 0
    assert 0.0 <= res.accuracy <= 1.0
    assert reference_for(cfg, None).epsilon == math.inf


def test_dp_dpsgd_average_model_carries_the_noise_of_centralised_dp_sgd_at_sigma_sqrt_n(
    tmp_path,
):
    """Why dp-dpsgd at ε cannot beat centralised DP-SGD at σ√N (the accuracy benchmark's
    reference row): every agent adds N(0, (σC/B)²) to its own batch mean, so the agents'
    average model moves by the average of N such draws — std σC/(B√N) per coordinate, the
    noise a curator adds to the mean of N·B pooled examples at multiplier σ√N. Measured:
    one round, the same batches with and without noise."""
    import dataclasses

    from privaudit.core.config import RunConfig
    from privaudit.sim.run import Run

    n, sigma, lr, clip, b = 5, 3.0, 0.1, 1.0, 4
    base = RunConfig(
        defense="dp-dpsgd",
        agents=n,
        topology="complete",
        batch_size=b,
        rounds=1,
        sigma=sigma,
        params={"lr": lr, "clip": clip},
        checkpoint_every=1,
    )
    noised = Run.create(base, tmp_path / "noised").train(progress=False)["x"]
    clean = Run.create(dataclasses.replace(base, sigma=0.0), tmp_path / "clean")
    diff = (noised - clean.train(progress=False)["x"]).mean(0) / lr  # the average's noise
    pooled = sigma * math.sqrt(n) * clip / (n * b)  # a curator's σ' C / (N·B), σ' = σ√N
    assert diff.numel() > 10_000  # LeNet: the std estimate is within ~2 % at 4σ
    assert diff.std().item() == pytest.approx(pooled, rel=0.03)
    assert diff.std().item() == pytest.approx(sigma * clip / (b * math.sqrt(n)), rel=0.03)
