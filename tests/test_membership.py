"""Membership inference: the message-level scorers on messages whose members are known, and
the pure scoring (ROC, TPR at FPR, the DP region, violations, ε lower bounds, LOSS, LiRA,
RMIA) on cases whose answer is known. CPU only, synthetic data, no downloads."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from privaudit.attacks.membership import (
    SCORERS,
    per_example_gradients,
    score_candidates,
)
from privaudit.core.errors import PrivauditError
from privaudit.core.observation import Observation
from privaudit.eval.bounds import cp_lower, cp_upper, gdp_epsilon
from privaudit.eval.membership_scoring import (
    auc,
    dp_roc_bound,
    epsilon_lower_bound,
    lira_offline,
    lira_online,
    logit_confidence,
    loss_score,
    plot_roc,
    rmia,
    roc,
    tpr_at_fpr,
    violations,
)

MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.3)
SHAPE = (3, 8, 8)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def tiny_conv(seed: int, width: int = 16) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, width, 3, stride=2, padding=1),
        nn.Tanh(),
        nn.Flatten(),
        nn.Linear(width * 16, 10),
    )


def message_of(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    scale: float = 1.0,
    clip: float | None = None,
    noise: float = 0.0,
    seed: int = 0,
) -> Observation:
    """The Observation contract computed independently of the attack's code: scale times
    the mean of the (clipped) per-example gradients of the batch (x, y), plus noise."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    m = torch.tensor(MEAN).view(-1, 1, 1)
    s = torch.tensor(STD).view(-1, 1, 1)

    def loss(p, xi, yi):
        logits = functional_call(model, p, (((xi - m) / s)[None],))
        return nn.functional.cross_entropy(logits, yi[None])

    ge = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    if clip is not None:
        norm = sum(v.flatten(1).pow(2).sum(1) for v in ge.values()).sqrt()
        f = (clip / (norm + 1e-12)).clamp(max=1.0)
        ge = {k: v * f.view(-1, *[1] * (v.dim() - 1)) for k, v in ge.items()}
    gen = torch.Generator().manual_seed(10_000 + seed)
    target = {
        k: scale * v.mean(0) + noise * torch.randn(v.shape[1:], generator=gen)
        for k, v in ge.items()
    }
    return Observation(
        model=model,
        params=params,
        target=target,
        batch_size=x.shape[0],
        input_shape=SHAPE,
        num_classes=10,
        scale=scale,
        clip=clip,
        noise_std=noise,
        mean=MEAN,
        std=STD,
    )


def draw(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Images uniform in [0, 1]; labels uniform over 10 classes."""
    return torch.rand(n, *SHAPE, generator=gen), torch.randint(0, 10, (n,), generator=gen)


def scenario(seed: int, members: int = 64, others: int = 64, **kw):
    gen = torch.Generator().manual_seed(seed)
    xm, ym = draw(members, gen)
    xo, yo = draw(others, gen)
    obs = message_of(tiny_conv(seed), xm, ym, seed=seed, **kw)
    return obs, torch.cat([xm, xo]), torch.cat([ym, yo]), members


# -- message-level scorers ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw", [{}, {"clip": 0.5, "scale": -0.3}], ids=["plain", "clipped-negative-scale"]
)
def test_noise_free_message_reveals_its_members(kw):
    """B = 64 members and 64 non-members of one distribution: without noise the message
    holds each member's gradient, and every scorer ranks members first."""
    obs, x, y, b = scenario(0, **kw)
    got = {s: auc(*np.split(score_candidates(obs, x, y, s).numpy(), [b])) for s in SCORERS}
    assert got["lr"] > 0.97 and got["lr-iso"] > 0.97, got
    assert got["inner"] > 0.9 and got["cosine"] > 0.9, got


def test_drowned_message_is_chance():
    """Noise std 100 per coordinate on a mean gradient of norm ≈ 0.1: every scorer is at
    chance (64 members, 256 non-members)."""
    obs, x, y, b = scenario(1, others=256, noise=100.0)
    for s in SCORERS:
        a = auc(*np.split(score_candidates(obs, x, y, s, chunk=50).numpy(), [b]))
        assert abs(a - 0.5) < 0.12, (s, a)


def test_reference_population_separates_too():
    """lr with the rest's moments from 512 separate examples of the distribution. It is
    weaker than with the candidates as the population: there, the candidates' mean holds
    the members' own gradients too, so centring on it also contrasts each candidate with
    the others."""
    obs, x, y, b = scenario(0)
    ref = draw(512, torch.Generator().manual_seed(99))
    scores = score_candidates(obs, x, y, "lr", reference=ref)
    assert auc(scores[:b], scores[b:]) > 0.9


def test_lr_is_the_gaussian_log_likelihood_ratio_for_one_example():
    """B = 1: the rest is the noise alone (μ = 0, s = noise_std/|scale|), so
    log Λ = (⟨m, g⟩ − ‖g‖²/2)/s² exactly, with m = target/scale."""
    gen = torch.Generator().manual_seed(3)
    x, y = draw(5, gen)
    obs = message_of(tiny_conv(3), x[:1], y[:1], scale=-2.0, clip=1.0, noise=0.05)
    g = per_example_gradients(obs, x, y)
    m = torch.cat([v.reshape(-1) for v in obs.target.values()]).double() / obs.scale
    s2 = (obs.noise_std / obs.scale) ** 2
    want = (g @ m - (g * g).sum(1) / 2) / s2
    torch.testing.assert_close(score_candidates(obs, x, y, "lr"), want, rtol=1e-9, atol=1e-6)
    assert int(score_candidates(obs, x, y, "lr").argmax()) == 0
    exact = message_of(tiny_conv(3), x[:1], y[:1])  # no noise: s² = 0, floored, still finite
    scores = score_candidates(exact, x, y, "lr")
    assert bool(torch.isfinite(scores).all()) and int(scores.argmax()) == 0


def test_per_example_gradients_are_the_mechanisms():
    """Chunked (7 candidates, chunks of 3) gradients equal autograd's, one example at a
    time, normalised with the observation's mean/std and clipped to C."""
    gen = torch.Generator().manual_seed(4)
    x, y = draw(7, gen)
    model = tiny_conv(4)
    obs = message_of(model, x, y, clip=0.3)
    got = per_example_gradients(obs, x, y, chunk=3)
    m, s = torch.tensor(MEAN).view(-1, 1, 1), torch.tensor(STD).view(-1, 1, 1)
    for i in range(7):
        model.zero_grad()
        nn.functional.cross_entropy(model(((x[i] - m) / s)[None]), y[i : i + 1]).backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()
        g = g * min(1.0, 0.3 / float(g.norm()))
        torch.testing.assert_close(got[i], g, rtol=1e-5, atol=1e-7)
    assert bool((got.norm(dim=1) <= 0.3 + 1e-9).all())


def test_refusals_are_one_line():
    obs, x, y, _ = scenario(5, members=4, others=4)
    with_terms = Observation(**{**obs.__dict__, "terms": [(obs.params, -1.0, False)]})
    cases = [
        (lambda: score_candidates(with_terms, x, y), "terms"),
        (lambda: score_candidates(obs, x, y, "nope"), "choose one of"),
        (lambda: score_candidates(obs, x[:, :1], y), "input_shape"),
        (lambda: score_candidates(obs, x, y + 10), "labels must lie"),
        (lambda: score_candidates(Observation(**{**obs.__dict__, "scale": 0.0}), x, y), "scale"),
        (lambda: score_candidates(obs, x[:1], y[:1], "lr"), "at least 2"),
    ]
    for call, words in cases:
        with pytest.raises(PrivauditError, match=words) as err:
            call()
        assert "\n" not in str(err.value)


# -- ROC, TPR at FPR, the DP region -------------------------------------------------------------
def test_roc_and_auc_on_hand_made_scores():
    fpr, tpr = roc([3, 2, 1], [2, 0])
    np.testing.assert_allclose(fpr, [0, 0, 0.5, 0.5, 1])
    np.testing.assert_allclose(tpr, [0, 1 / 3, 2 / 3, 1, 1])
    assert auc([3, 2, 1], [2, 0]) == pytest.approx(4.5 / 6)  # 4 wins and a tie of 6 pairs
    assert auc([5, 6], [1, 2, 3]) == 1.0 and auc([1, 2], [5, 6]) == 0.0
    assert auc([1, 1], [1, 1, 1]) == 0.5
    with pytest.raises(PrivauditError, match="NaN"):
        auc([1.0, math.nan], [0.0])
    with pytest.raises(PrivauditError, match="members and non-members"):
        roc([], [0.0])


def test_tpr_at_fpr_and_its_interval():
    out = np.arange(100.0)
    members = np.arange(50.0, 150.0)
    p = tpr_at_fpr(members, out, 0.01)
    assert p.fpr == 0.01 and p.tpr == 0.51  # one non-member (99) and 98 < members ≤ 149
    assert p.tpr_lo == pytest.approx(cp_lower(51, 100, 0.025))
    assert p.tpr_hi == pytest.approx(cp_upper(51, 100, 0.025))
    assert p.tpr_lo < 0.51 < p.tpr_hi
    zero = tpr_at_fpr(members, out, 0.0)
    assert zero.fpr == 0 and zero.tpr == 0.50  # members 100..149 lie above every non-member
    assert p.resolved and p.resolution == 0.01 and not zero.resolved


def test_an_fpr_below_one_over_n_is_not_resolved():
    """60 non-members cannot measure a 0.1 % FPR: the point says so, and ``mia`` prints no
    TPR for it (the issue: a "TPR at 0.1 % FPR" equal to the 1 % figure, from fpr 0.0)."""
    from privaudit.cli.mia import tpr_text

    rng = np.random.default_rng(0)
    out, members = rng.normal(size=60), rng.normal(1.0, size=60)
    low, one = tpr_at_fpr(members, out, 0.001), tpr_at_fpr(members, out, 0.01)
    assert not low.resolved and not one.resolved and low.resolution == pytest.approx(1 / 60)
    assert tpr_at_fpr(members, out, 1 / 60).resolved
    pts = {"0.001": low.__dict__, "0.05": tpr_at_fpr(members, out, 0.05).__dict__}
    assert tpr_text(pts, "0.001").startswith("TPR at 0.1 % FPR not measurable")
    assert "needs 1000" in tpr_text(pts, "0.001")
    assert tpr_text(pts, "0.05").startswith("TPR ") and "at 5 % FPR" in tpr_text(pts, "0.05")


def test_dp_roc_bound_at_known_points():
    f = np.array([0.0, 0.1, 0.5, 0.8, 1.0])
    np.testing.assert_allclose(dp_roc_bound(f, 0.0, 0.0), f)  # 0-DP: no test beats chance
    # ε = ln 2: e^ε·FPR below the crossing (1 − δ)/(1 + e^ε) = 1/3, 1 − ½(1 − FPR) above it
    np.testing.assert_allclose(dp_roc_bound(f, math.log(2), 0.0), [0, 0.2, 0.75, 0.9, 1])
    assert float(dp_roc_bound(0.0, 0.0, 0.1)) == pytest.approx(0.1)  # δ: TPR ≤ δ at FPR 0
    assert float(dp_roc_bound(0.0, 1.0, 0.1)) == pytest.approx(0.1)
    np.testing.assert_array_equal(dp_roc_bound(f, math.inf, 0.0), np.ones(5))
    # the two branches meet at FPR* = (1 − δ)/(1 + e^ε), where TPR = e^ε FPR* + δ
    e, d = 1.3, 0.01
    star = (1 - d) / (1 + math.exp(e))
    assert float(dp_roc_bound(star, e, d)) == pytest.approx(math.exp(e) * star + d)


def gaussian_trials(mu: float, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n trials with and n without of a Gaussian mechanism of sensitivity μ and std 1,
    scored by the output itself: μ-GDP, the most powerful test."""
    r = np.random.default_rng(seed)
    return r.normal(mu, 1.0, n), r.normal(0.0, 1.0, n)


def randomized_response(eps: float, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Binary randomized response, exactly ε-DP: output 1 with probability e^ε/(1 + e^ε)
    for a member and 1/(1 + e^ε) for a non-member."""
    r = np.random.default_rng(seed)
    p = math.exp(eps) / (1 + math.exp(eps))
    return (r.random(n) < p).astype(float), (r.random(n) < 1 - p).astype(float)


def test_violations_flag_an_understated_epsilon_only():
    for seed in range(4):
        a, b = gaussian_trials(2.0, 1000, seed)
        eps = gdp_epsilon(2.0, 1e-5)  # the mechanism's true ε
        assert violations(a, b, eps, 1e-5) == []
        found = violations(a, b, 1.0, 1e-5)
        assert found and all(v.tpr_lo > v.bound for v in found)
        a, b = randomized_response(1.0, 2000, seed)
        assert violations(a, b, 1.0, 0.0) == []
        assert len(violations(a, b, 0.5, 0.0)) == 1  # ties: one distinct test


def test_epsilon_lower_bound_never_exceeds_the_truth():
    """Tight cases: randomized response at ε = 1 (the bound approaches ε = 1) and a weak
    Gaussian mechanism (μ = 3, ε ≈ 16.7 at δ = 1e-5); over 5 seeds the bound stays below the
    true ε and is clearly positive."""
    for seed in range(5):
        a, b = randomized_response(1.0, 4000, seed)
        lb = epsilon_lower_bound(a, b, 1e-5, seed=seed)
        assert 0.7 < lb <= 1.0, lb
        a, b = gaussian_trials(3.0, 1000, seed)
        lb = epsilon_lower_bound(a, b, 1e-5, seed=seed)
        assert 2.0 < lb <= gdp_epsilon(3.0, 1e-5), lb
    one = epsilon_lower_bound(a, b, 1e-5, method="one-run")
    assert 2.0 < one <= gdp_epsilon(3.0, 1e-5)
    a, b = gaussian_trials(0.0, 1000, 0)  # no signal: nothing to certify
    assert epsilon_lower_bound(a, b, 1e-5) == 0.0


# -- model-level scorers ------------------------------------------------------------------------
def test_logit_confidence_is_stable():
    z = np.array([[2.0, 0.5, -1.0], [1000.0, 0.0, -1000.0], [0.0, 800.0, 0.0]])
    y = np.array([0, 0, 0])
    phi = logit_confidence(z, y)
    p = np.exp(z[0]) / np.exp(z[0]).sum()
    assert phi[0] == pytest.approx(math.log(p[0] / (1 - p[0])))
    assert phi[1] == pytest.approx(1000.0) and phi[2] == pytest.approx(-800.0)
    assert np.isfinite(phi).all()
    torch_phi = logit_confidence(torch.tensor(z), torch.tensor(y))
    np.testing.assert_allclose(torch_phi, phi)


def test_lira_and_rmia_see_through_per_example_difficulty():
    """Per-example difficulty d_i ~ N(0, 3²) shifts every model's logit confidence on x_i;
    training on x_i adds 1.5 (std 0.5 across models). The raw confidence is mostly
    difficulty; LiRA's per-example Gaussians and RMIA's ratio to the reference models
    remove it."""
    r = np.random.default_rng(0)
    n, k = 400, 16
    d = r.normal(0, 3, n)
    member = np.arange(n) < n // 2
    in_confs = d[:, None] + 1.5 + r.normal(0, 0.5, (n, k))
    out_confs = d[:, None] + r.normal(0, 0.5, (n, k))
    target = d + 1.5 * member + r.normal(0, 0.5, n)
    raw = auc(target[member], target[~member])
    online = lira_online(target, in_confs, out_confs)
    offline = lira_offline(target, out_confs)
    pooled = lira_online(target, in_confs, out_confs, global_variance=True)
    for s in (online, offline, pooled):
        assert auc(s[member], s[~member]) > max(0.9, raw + 0.2)
    # RMIA on probabilities p = sigmoid(φ), population z: 300 examples no model trained on
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    dz = r.normal(0, 3, 300)
    ref_z = sig(dz[:, None] + r.normal(0, 0.5, (300, k)))
    target_z = sig(dz + r.normal(0, 0.5, 300))
    both = np.concatenate([in_confs[:, : k // 2], out_confs[:, : k // 2]], axis=1)
    online = rmia(sig(target), sig(both), target_z, ref_z, gamma=1.0)
    offline = rmia(sig(target), sig(out_confs), target_z, ref_z, gamma=1.0, a=0.5)
    for s in (online, offline):
        assert ((s >= 0) & (s <= 1)).all()
    assert auc(online[member], online[~member]) > max(0.9, raw + 0.2)
    # offline is weaker here: p = sigmoid(φ) saturates at 1 for the easy examples
    assert auc(offline[member], offline[~member]) > raw + 0.1
    # missing reference values (NaN) are left out of the fits
    holes = out_confs.copy()
    holes[:, ::2] = np.nan
    s = lira_offline(target, holes)
    assert auc(s[member], s[~member]) > 0.9


def test_model_level_attacks_on_a_toy_model():
    """A linear softmax model memorises 32 points with random labels; 8 reference models
    train on 4 random halves of the 64-point pool and their complements. LOSS, LiRA
    (online and offline) and RMIA rank the target model's 32 training points above the 32
    it never saw."""
    gen = torch.Generator().manual_seed(0)
    pool_x = torch.randn(64, 40, generator=gen)
    pool_y = torch.randint(0, 4, (64,), generator=gen)
    z_x = torch.randn(64, 40, generator=gen)  # population samples for RMIA
    z_y = torch.randint(0, 4, (64,), generator=gen)

    def train(mask: torch.Tensor) -> nn.Module:
        model = nn.Linear(40, 4)
        opt = torch.optim.Adam(model.parameters(), lr=0.05)
        for _ in range(100):
            opt.zero_grad()
            nn.functional.cross_entropy(model(pool_x[mask]), pool_y[mask]).backward()
            opt.step()
        return model

    def signals(model: nn.Module, x, y) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        with torch.no_grad():
            logits = model(x)
        loss = nn.functional.cross_entropy(logits, y, reduction="none").numpy()
        prob = torch.softmax(logits.double(), 1)[torch.arange(len(y)), y].numpy()
        return loss, logit_confidence(logits, y), prob

    torch.manual_seed(0)
    member = torch.zeros(64, dtype=torch.bool)
    member[torch.randperm(64, generator=gen)[:32]] = True
    target = train(member)
    t_loss, t_phi, t_prob = signals(target, pool_x, pool_y)
    t_prob_z = signals(target, z_x, z_y)[2]
    phis, probs, probs_z, masks = [], [], [], []
    for i in range(8):  # 4 random halves and their complements: each point in 4, out of 4
        if i % 2 == 0:
            mask = torch.zeros(64, dtype=torch.bool)
            mask[torch.randperm(64, generator=gen)[:32]] = True
        else:
            mask = ~mask
        model = train(mask)
        _, phi, prob = signals(model, pool_x, pool_y)
        phis.append(phi)
        probs.append(prob)
        probs_z.append(signals(model, z_x, z_y)[2])
        masks.append(mask.numpy())
    phis, masks = np.stack(phis, 1), np.stack(masks, 1)
    in_confs = np.where(masks, phis, np.nan)
    out_confs = np.where(~masks, phis, np.nan)
    m = member.numpy()
    scores = {
        "loss": loss_score(t_loss),
        "lira-online": lira_online(t_phi, in_confs, out_confs, global_variance=True),
        "lira-offline": lira_offline(t_phi, out_confs, global_variance=True),
        "rmia": rmia(t_prob, np.stack(probs, 1), t_prob_z, np.stack(probs_z, 1)),
    }
    aucs = {name: auc(s[m], s[~m]) for name, s in scores.items()}
    assert all(v > 0.85 for v in aucs.values()), aucs


def test_plot_roc_writes_a_figure(tmp_path):
    a, b = gaussian_trials(2.0, 500, 0)
    out = plot_roc({"gaussian μ = 2": roc(a, b)}, tmp_path / "roc.png", bound=(1.0, 1e-5))
    assert out.exists() and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(PrivauditError, match="at least one curve"):
        plot_roc({}, tmp_path / "none.png")


# -- the joint scorer --------------------------------------------------------------------------
def test_decompose_recovers_the_membership_indicator_without_noise():
    """The message is an exact combination of the candidates' gradients (D ≫ n): the
    posterior weights are 1 for the 64 members and 0 for the others, to rounding."""
    obs, x, y, b = scenario(2, members=64, others=64)
    w = score_candidates(obs, x, y, "decompose")
    assert torch.allclose(w[:b], torch.ones(b, dtype=w.dtype), atol=1e-3), w[:b]
    assert torch.allclose(w[b:], torch.zeros(len(w) - b, dtype=w.dtype), atol=1e-3), w[b:]


def test_decompose_is_chance_under_overwhelming_noise():
    """Noise std 100: the ridge λ = 4B²s² dominates and the weights stay at their prior ½,
    ranking members no better than chance."""
    obs, x, y, b = scenario(3, others=256, noise=100.0)
    w = score_candidates(obs, x, y, "decompose")
    assert abs(auc(w[:b].numpy(), w[b:].numpy()) - 0.5) < 0.12
    assert float((w - 0.5).abs().max()) < 0.05
