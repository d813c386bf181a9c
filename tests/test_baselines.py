"""The DP baselines dp-dpsgd, muffliato and dp-cga: noise scales, clipping, gossip, the QP."""

from __future__ import annotations

import functools
import math

import conftest
import pytest
import torch
from conftest import batch_grad

from privaudit.core.context import params_of
from privaudit.core.errors import PrivauditError
from privaudit.core.messages import CaptureSpec
from privaudit.core.network import SimNetwork
from privaudit.defenses import get_defense
from privaudit.defenses.dp_cga import DPCGAParams, aggregate, box_qp
from privaudit.defenses.muffliato import chebyshev_omega, gap_of, gossip
from privaudit.grads import clip_rows
from privaudit.scenario.topology import metropolis_hastings, ring
from privaudit.sim.run import Run

tiny = functools.partial(conftest.tiny, rounds=2, checkpoint_every=1)


def assert_std(noises: list[torch.Tensor], std: float) -> None:
    """Each sample's std over D coordinates is ``std`` within 4 standard errors; mean ≈ 0."""
    for z in noises:
        D = z.numel()
        assert abs(float(z.mean())) < 4 * std / math.sqrt(D)
        assert abs(float(z.std()) / std - 1) < 4 * math.sqrt(1 / (2 * D))


def one_link_per_agent(run: Run) -> dict[int, int]:
    return {s: d for s, d in reversed(run.edges())}


def test_dp_dpsgd_noise_is_sigma_c_over_b_on_the_clipped_mean(tmp_path):
    sigma, clip, B = 2.0, 0.5, 4
    cfg = tiny("dp-dpsgd", rounds=1, sigma=sigma, batch_size=B, params={"clip": clip})
    run = Run.create(cfg, tmp_path / "r")
    assert run.resolved["kinds"]["half-model"]["releases_per_round"] == 1
    msgs = run.messages(CaptureSpec.of(rounds=[1]), progress=False)
    x0, lr = run.ctx.x0, run.params.lr
    noises = []
    for src, dst in one_link_per_agent(run).items():
        clean = batch_grad(run, x0, src, 1, clip)
        noises.append((x0 - msgs[(1, src, dst, "half-model")]) / lr - clean)
    assert_std(noises, sigma * clip / B)


@pytest.mark.parametrize("calibration,factor", [("add-remove", 1.0), ("replace-one", 2.0)])
def test_muffliato_noise_is_sigma_lr_g_over_b_on_the_parameters(tmp_path, calibration, factor):
    """y⁰ − (x_0 − η ĝ) is N(0, σ²s²) with s = ηG/B, the add/remove sensitivity of the step
    (2ηG/B for replace-one): the noise shrinks with the batch, as in the authors' code."""
    sigma, lr, G, B = 1.5, 0.1, 2.0, 4
    params = {"lr": lr, "grad_bound": G, "gossip_steps": 2, "calibration": calibration}
    cfg = tiny("muffliato", rounds=1, sigma=sigma, batch_size=B, params=params)
    run = Run.create(cfg, tmp_path / "r")
    assert run.resolved["kinds"]["model"]["releases_per_round"] == 1
    assert run.params.noise_std(B) == pytest.approx(factor * sigma * lr * G / B)
    msgs = run.messages(CaptureSpec.of(rounds=[1]), progress=False)
    x0 = run.ctx.x0
    noises = [
        msgs[(1, s, d, "model")] - (x0 - lr * batch_grad(run, x0, s, 1))
        for s, d in one_link_per_agent(run).items()
    ]
    assert_std(noises, factor * sigma * lr * G / B)


def test_muffliato_gossip_keeps_the_average_and_records_every_step(tmp_path):
    cfg = tiny("muffliato", sigma=0.0, params={"gossip_steps": 3})
    run = Run.create(cfg, tmp_path / "r")
    msgs = run.messages(CaptureSpec.of(rounds=[2]), progress=False)
    assert {k[3] for k in msgs} == {"model", "model@2", "model@3"}
    y0 = torch.stack([msgs[(2, s, d, "model")] for s, d in one_link_per_agent(run).items()])
    x2 = run.dir.load_checkpoint(2)["state.x"]
    torch.testing.assert_close(x2.mean(0), y0.mean(0), rtol=0, atol=1e-6)
    assert not torch.allclose(x2, y0, atol=1e-6)  # the models did mix


def test_chebyshev_gossip_averages_faster_than_plain_on_a_ring():
    n, K = 20, 15
    adj = ring(n)
    W = metropolis_hastings(adj)
    net = SimNetwork(adj, W)
    y0 = torch.randn(n, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    omega = chebyshev_omega(gap_of(W))
    assert 1 < omega < 2
    fast, plain = gossip(net, y0, K, omega), gossip(net, y0, K, None)
    for y in (fast, plain):
        torch.testing.assert_close(y.mean(0), y0.mean(0), rtol=0, atol=1e-12)
    err = lambda y: float((y - y0.mean(0)).norm())  # noqa: E731
    assert err(fast) < 0.25 * err(plain) < 0.25 * err(y0)


def kkt(P: torch.Tensor, q: torch.Tensor, lower: float, c: torch.Tensor) -> None:
    g = (P @ c.unsqueeze(-1)).squeeze(-1) + q
    scale = float(q.abs().max())
    assert (c >= lower - 1e-10).all()
    assert (g >= -1e-8 * scale).all()
    assert ((c - lower) * g).abs().max() < 1e-8 * scale


@pytest.mark.parametrize("lower", [0.0, 0.5])
def test_box_qp_satisfies_kkt(lower):
    gen = torch.Generator().manual_seed(1)
    M = torch.randn(16, 4, 30, generator=gen, dtype=torch.float64)
    g = torch.randn(16, 30, generator=gen, dtype=torch.float64)
    P, q = M @ M.transpose(-1, -2), (M @ g.unsqueeze(-1)).squeeze(-1)
    c = box_qp(P, q, lower)
    kkt(P, q, lower, c)
    at = c - lower < 1e-9
    assert at.any() and (~at).any()  # the instance has active and inactive constraints


def test_cga_aggregate_is_gems_projection_and_cone_the_cone_projection():
    """With margin 0, g̃ = g + Σ c m has ⟨g̃, m_j⟩ ≥ 0 (= 0 where c_j > 0); "cone" returns
    the projection p of g onto cone(m): ⟨g − p, m_j⟩ ≤ 0 and ⟨g − p, p⟩ = 0."""
    gen = torch.Generator().manual_seed(2)
    n, d, D = 3, 3, 40
    self_g = torch.randn(n, D, generator=gen, dtype=torch.float64)
    inc = torch.randn(n, d, D, generator=gen, dtype=torch.float64)
    valid = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    pi_self, pi_in = torch.full((n,), 0.4, dtype=torch.float64), torch.full((n, d), 0.3)
    m = pi_in.double().unsqueeze(-1) * inc * valid.unsqueeze(-1)
    g = 0.4 * self_g
    p = DPCGAParams(qp_margin=0.0)
    out = aggregate(self_g, inc, valid, pi_self, pi_in, [D], p)
    dots = (m @ out.unsqueeze(-1)).squeeze(-1)
    assert ((m @ g.unsqueeze(-1)) < -1e-3).any()  # g itself violates some constraint
    assert (dots >= -1e-9).all()
    proj = aggregate(self_g, inc, valid, pi_self, pi_in, [D], DPCGAParams(qp="cone"))
    res = g - proj
    assert ((m @ res.unsqueeze(-1)).squeeze(-1) <= 1e-9).all()
    assert ((res * proj).sum(-1).abs() < 1e-9).all()
    # a per-layer QP differs from one QP on the whole vector
    split = aggregate(self_g, inc, valid, pi_self, pi_in, [D // 2, D // 2], p)
    assert not torch.allclose(split, out)


def test_dp_cga_clips_the_batch_mean_and_aggregates_what_it_received(tmp_path):
    clip = 0.02
    cfg = tiny("dp-cga", sigma=0.0, params={"clip": clip, "momentum": 0.0})
    run = Run.create(cfg, tmp_path / "r")
    msgs = run.messages(CaptureSpec.of(rounds=[1, 2]), progress=False)
    assert {k[3] for k in msgs} == {"model", "cg", "half-model"}
    for src, dst in run.edges():
        at = msgs[(2, dst, src, "model")]  # the receiver's model
        mean = batch_grad(run, at, src, 2)
        cg = msgs[(2, src, dst, "cg")]
        torch.testing.assert_close(cg, clip_rows(mean[None], clip)[0], rtol=1e-4, atol=1e-7)
        assert float(cg.norm()) <= clip * (1 + 1e-5)
        per_example = batch_grad(run, at, src, 2, clip)
        assert not torch.allclose(cg, per_example, atol=1e-6)
    # round 1, v_0 = 0: (x_0 − x̃_i)/η is the QP aggregate of i's own and incoming gradients
    x0, W = run.ctx.x0, run.ctx.W
    for i in range(4):
        nbrs = sorted({s for s, d in run.edges() if d == i})
        own = clip_rows(batch_grad(run, x0, i, 1)[None], clip)
        inc = torch.stack([msgs[(1, j, i, "cg")] for j in nbrs])[None]
        pi_in = torch.stack([W[i, j] for j in nbrs])[None]
        valid = torch.ones(1, len(nbrs), dtype=torch.bool)
        want = aggregate(own, inc, valid, W[i, i][None], pi_in, run.ctx.spec.sizes, run.params)
        got = (x0 - msgs[(1, i, nbrs[0], "half-model")]) / run.params.lr
        torch.testing.assert_close(got, want[0], rtol=1e-3, atol=1e-6)


def test_dp_cga_noise_is_sigma_c_and_counts_the_self_gradient_release(tmp_path):
    sigma, clip = 1.5, 0.5
    cfg = tiny("dp-cga", rounds=1, sigma=sigma, params={"clip": clip})
    run = Run.create(cfg, tmp_path / "r")
    kinds = run.resolved["kinds"]
    assert kinds["cg"]["releases_per_round"] == 2  # ring: one per neighbour
    assert kinds["half-model"]["releases_per_round"] == 3  # and ĝ^{ii} through x̃
    msgs = run.messages(CaptureSpec.of(rounds=[1]), progress=False)
    x0 = run.ctx.x0
    noises = [
        msgs[(1, s, d, "cg")] - clip_rows(batch_grad(run, x0, s, 1)[None], clip)[0]
        for s, d in run.edges()
    ]
    assert_std(noises, sigma * clip)


@pytest.mark.parametrize(
    ("defense", "params", "match"),
    [
        ("muffliato", {"gossip_steps": 0}, "gossip_steps"),
        ("muffliato", {"gossip_steps": -2}, "gossip_steps"),
        ("muffliato", {"grad_bound": 0.0}, "grad_bound"),
        ("muffliato", {"chebyshev": "False"}, "chebyshev"),
        ("dp-cga", {"qp": "nnls"}, "qp"),
        ("dp-cga", {"qp_iters": 0}, "qp_iters"),
        ("dp-cga", {"clip": None}, "clip"),
        ("dp-dpsgd", {"clip": 0.0}, "clip"),
    ],
)
def test_bad_params_are_refused(defense, params, match):
    with pytest.raises(PrivauditError, match=match):
        params_of(get_defense(defense).Params, params)


def test_releases_per_round():
    W = metropolis_hastings(ring(6))

    def privacy(name: str, kind: str):
        d = get_defense(name)
        return d.privacy(params_of(d.Params, {"sigma": 1.0}), kind, W)

    assert privacy("dp-dpsgd", "half-model").releases == 1
    assert privacy("muffliato", "model").releases == 1  # y⁰; later gossip post-processes it
    assert privacy("muffliato", "model").claimed_releases == 1
    assert privacy("dp-cga", "cg").releases == 2  # ring: two neighbours
