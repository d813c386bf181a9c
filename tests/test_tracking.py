"""Gradient tracking: DSGT's invariant, LPPA's cancelling noise shares, DP-DSGT's Laplace noise."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import batch_grad, tiny

from privaudit.api.pipeline import observe
from privaudit.core.context import params_of
from privaudit.core.errors import PrivauditError
from privaudit.core.messages import CaptureSpec, Tap
from privaudit.core.network import SimNetwork
from privaudit.defenses import get_defense
from privaudit.defenses.tracking import paper_budget
from privaudit.sim.run import Run


def sent_by(msgs: dict, t: int, kind: str, n: int) -> torch.Tensor:
    """Each agent's ``kind`` message of round t (the same on all its out-links), (N, D)."""
    return torch.stack(
        [next(v for k, v in msgs.items() if k[:2] == (t, i) and k[3] == kind) for i in range(n)]
    )


def flat(run: Run, named: dict[str, torch.Tensor]) -> torch.Tensor:
    return run.ctx.spec.flatten(named)


def test_lppa_noise_shares_cancel_and_are_injected(tmp_path):
    beta = 0.1
    run = Run.create(tiny("lppa", params={"beta": beta}), tmp_path / "r")
    msgs = run.messages(CaptureSpec.of(rounds=[1, 2]), progress=False)
    n, edges = run.cfg.agents, run.edges()
    assert not any(k[3] == "noise" for k in msgs if k[0] == 2)  # one exchange, in round 1
    share = {(s, d): msgs[(1, s, d, "noise")].double() for s, d in edges}
    d = torch.zeros(n, run.ctx.spec.numel, dtype=torch.float64)
    for (s, r), v in share.items():
        d[s] += v  # sent
        d[r] -= v  # received
    assert float(d.sum(0).abs().max()) < 1e-12  # Theorem 1: Σ_i (Σ sent − Σ received) = 0
    # each share is Laplace(β): E|δ| = β, and |δ| ~ Exp(β) has std β
    all_shares = torch.stack(list(share.values()))
    se = beta / math.sqrt(all_shares.numel())
    assert abs(float(all_shares.abs().mean()) - beta) < 5 * se
    # γ_i^0 = ∇L(x_0; ξ_1) + d_i, with the equation's sign (sent − received)
    gamma0 = sent_by(msgs, 1, "gt", n).double()
    g0 = torch.stack([batch_grad(run, run.ctx.x0, i, 1) for i in range(n)]).double()
    torch.testing.assert_close(gamma0 - g0, d, rtol=0, atol=1e-5)
    assert float((gamma0 - g0).abs().mean()) > beta  # the offset is really there
    torch.testing.assert_close(gamma0.sum(0), g0.sum(0), rtol=0, atol=1e-5)
    # observations on a ring (degree k = 2): d_0 sums 2k shares; the link knows 2 of them
    # and subtracts them; a global observer knows all 4 and recovers ∇L(x_0; ξ_1) exactly
    (gt,) = observe(run, "lppa-gt", 1, links=[(0, 1)], threat="link", progress=False)
    (nz,) = observe(run, "lppa-noise", 1, links=[(0, 1)], threat="link", progress=False)
    (gl,) = observe(run, "lppa-gt", 1, threat="global", victims=[0], progress=False)
    assert gt.meta["exact"] is False and "offset" in gt.meta
    assert gt.noise_std == nz.noise_std == pytest.approx(beta * math.sqrt(2 * 2))
    other = share[(0, 3)] - share[(3, 0)]  # what stays hidden: agent 0's other link
    for o in (gt, nz):
        torch.testing.assert_close(flat(run, o.target).double() - g0[0], other, rtol=0, atol=1e-5)
    assert gl.meta["exact"] is True and gl.noise_std == 0
    torch.testing.assert_close(flat(run, gl.target).double(), g0[0], rtol=0, atol=1e-5)


def drive(
    run: Run, name: str, batches: list[torch.Tensor], tap: Tap | None = None, **params
) -> list[dict]:
    """States after each round of ``name`` on the run's data with the given batches."""
    d = get_defense(name)
    p = params_of(d.Params, params)
    ctx = run.ctx
    state, net, out = d.init(ctx, p), SimNetwork(ctx.adj, ctx.W, tap), []
    for t, idx in enumerate(batches, 1):
        net.round = t
        state = d.round(ctx, p, state, net, ctx.gather(idx))
        out.append(state)
    return out


@pytest.fixture(scope="module")
def driven(tmp_path_factory):
    run = Run.create(tiny("dsgt"), tmp_path_factory.mktemp("d") / "r")
    batches = [run.ctx.sample() for _ in range(4)]
    return run, batches


@pytest.mark.parametrize(
    "name,params",
    [
        ("dsgt", {}),
        ("lppa", {}),
        ("lppa", {"reinject": True, "beta": 0.5}),
    ],
)
def test_average_model_follows_dsgt(driven, name, params):
    """Σ_i d_i = 0 keeps the tracking invariant and DSGT's average update in every round:
    mean θ^t = mean θ^{t-1} − λ mean_i ∇L(θ_i^{t-1}; ξ_t), and mean γ = mean current gradient."""
    run, batches = driven
    lr = 0.05
    states = drive(run, name, batches, lr=lr, **params)
    prev = run.ctx.x0
    for s in states:
        torch.testing.assert_close(s["gt"].mean(0), s["g"].mean(0), rtol=0, atol=1e-6)
        step = prev.expand_as(s["x"]).mean(0) - lr * s["g"].mean(0)
        torch.testing.assert_close(s["x"].mean(0), step, rtol=0, atol=1e-6)
        prev = s["x"]


def test_lppa_average_model_equals_dsgt_after_the_noisy_round(driven):
    """Theorem 1: Σ_i θ_i^1 is DSGT's although every θ_i^1 differs. (Later averages drift
    apart at first order in the noise, since ∇L is not affine: 'lossless' is about sums.)"""
    run, batches = driven
    dsgt = drive(run, "dsgt", batches[:2])
    lppa = drive(run, "lppa", batches[:2], beta=0.5)
    torch.testing.assert_close(lppa[0]["x"].mean(0), dsgt[0]["x"].mean(0), rtol=0, atol=1e-6)
    assert float((lppa[0]["x"] - dsgt[0]["x"]).abs().max()) > 1e-2
    # γ^0 differs from DSGT's by d_i exactly, so the gradients of round 1 are the same
    torch.testing.assert_close(lppa[0]["g"], dsgt[0]["g"])
    # and dp-dsgt's noise does not cancel: its average is off by λ·mean_i ζ_i
    dp = drive(run, "dp-dsgt", batches[:1], beta=0.5)
    assert float((dp[0]["x"].mean(0) - dsgt[0]["x"].mean(0)).abs().max()) > 1e-3


@pytest.mark.parametrize(
    "name,params",
    [
        ("dsgt", {"old_grad": "recompute"}),
        ("dp-dsgt", {"inject": "init"}),
    ],
)
def test_variants_tracking_difference(driven, name, params):
    """γ_i^1 − Σ_j w_ij γ_j^0: ∇L(θ^1; ξ_2) − ∇L(θ^0; ξ_2) with ``recompute`` (Algorithm 1
    line 12, both on the current batch); − ∇L(θ^0; ξ_1) and no fresh noise with init-only DP."""
    run, batches = driven
    ctx, n = run.ctx, run.cfg.agents
    tap = Tap(CaptureSpec())
    drive(run, name, batches[:2], tap=tap, **params)
    msgs = {k: m.payload for k, m in tap.messages.items()}
    gamma0, gamma1 = sent_by(msgs, 1, "gt", n), sent_by(msgs, 2, "gt", n)
    theta1 = sent_by(msgs, 2, "model", n)
    x0 = ctx.x0.expand(n, -1)

    def g(theta: torch.Tensor, t: int) -> torch.Tensor:
        idx = batches[t - 1]
        return ctx.grads.mean(theta, *ctx.gather(idx))

    old = g(x0, 2) if params.get("old_grad") == "recompute" else g(x0, 1)
    diff = gamma1 - ctx.W.float() @ gamma0
    torch.testing.assert_close(diff, g(theta1, 2) - old, rtol=0, atol=1e-5)
    if name == "dp-dsgt":  # round 1 did carry Laplace noise
        assert float((gamma0 - g(x0, 1)).abs().mean()) > 0.01


def test_dsgt_tracking_invariant_on_the_wire(tmp_path):
    run = Run.create(tiny("dsgt"), tmp_path / "r")
    msgs = run.messages(CaptureSpec.of(rounds=[1, 3]), progress=False)
    n = run.cfg.agents
    assert {k[3] for k in msgs} == {"model", "gt"}
    # γ_i^0 is the raw gradient at the public x_0
    g0 = torch.stack([batch_grad(run, run.ctx.x0, i, 1) for i in range(n)])
    torch.testing.assert_close(sent_by(msgs, 1, "gt", n), g0, rtol=1e-4, atol=1e-6)
    (obs,) = observe(run, "dsgt-gt", 1, links=[(0, 1)], progress=False)
    assert obs.meta["exact"] is True and obs.noise_std == 0
    torch.testing.assert_close(flat(run, obs.target), g0[0], rtol=1e-4, atol=1e-6)
    # round 3: mean γ^2 = mean ∇L(θ^2; ξ_3), while individual γ_i track the average
    theta = sent_by(msgs, 3, "model", n)
    gamma = sent_by(msgs, 3, "gt", n)
    g = torch.stack([batch_grad(run, theta[i], i, 3) for i in range(n)])
    torch.testing.assert_close(gamma.mean(0), g.mean(0), rtol=0, atol=1e-6)
    assert float((gamma - g).abs().max()) > 1e-4


def test_dp_dsgt_noise_has_the_laplace_scale(tmp_path):
    beta = 0.2
    run = Run.create(tiny("dp-dsgt", params={"beta": beta}), tmp_path / "r")
    msgs = run.messages(CaptureSpec.of(rounds=[1, 2]), progress=False)
    n = run.cfg.agents
    W = run.ctx.W.float()
    g1 = torch.stack([batch_grad(run, run.ctx.x0, i, 1) for i in range(n)])
    gamma1 = sent_by(msgs, 1, "gt", n)
    theta2, gamma2 = sent_by(msgs, 2, "model", n), sent_by(msgs, 2, "gt", n)
    g2 = torch.stack([batch_grad(run, theta2[i], i, 2) for i in range(n)])
    # round 1: ζ = γ̃^0 − ∇L; round 2 (fresh noise): ζ = γ̃^1 − W γ̃^0 − (g_2 − g_1)
    for zeta in (gamma1 - g1, gamma2 - W @ gamma1 - (g2 - g1)):
        se = beta / math.sqrt(zeta.numel())  # |ζ| ~ Exp(β): mean β, std β
        assert abs(float(zeta.abs().mean()) - beta) < 5 * se
        # Laplace, not Gaussian: std / E|ζ| = √2 (a Gaussian gives √(π/2) ≈ 1.25)
        assert abs(float(zeta.std() / zeta.abs().mean()) - math.sqrt(2)) < 0.04
    (obs,) = observe(run, "dp-dsgt-gt", 1, links=[(0, 1)], progress=False)
    assert obs.noise_std == pytest.approx(math.sqrt(2) * beta) and obs.meta["exact"] is True


def test_lppa_link_observations_on_a_single_edge(tmp_path):
    """N = 2: the link holds both of agent 0's shares, so lppa-noise is the raw gradient, and
    the round-2 tracking difference is exact (the init offset cancels)."""
    run = Run.create(tiny("lppa", agents=2, params={"beta": 0.5}), tmp_path / "r")
    (nz,) = observe(run, "lppa-noise", 1, links=[(0, 1)], progress=False)
    g1 = batch_grad(run, run.ctx.x0, 0, 1)
    assert nz.meta["exact"] is True and nz.noise_std == 0
    torch.testing.assert_close(flat(run, nz.target), g1, rtol=1e-4, atol=1e-5)
    msgs = run.messages(CaptureSpec.of(rounds=[1]), progress=False)
    assert float((msgs[(1, 0, 1, "gt")] - g1).abs().mean()) > 0.5  # the wire carries d_0
    (gt,) = observe(run, "lppa-gt", 1, links=[(0, 1)], progress=False)
    torch.testing.assert_close(flat(run, gt.target), g1, rtol=1e-4, atol=1e-5)
    (model,) = observe(run, "lppa-model", 1, links=[(0, 1)], progress=False)
    torch.testing.assert_close(flat(run, model.target), flat(run, gt.target), rtol=0, atol=1e-4)
    (diff,) = observe(run, "lppa-gt", 2, links=[(0, 1)], progress=False)
    g2 = batch_grad(run, flat(run, diff.params), 0, 2)
    torch.testing.assert_close(flat(run, diff.target), g2 - g1, rtol=0, atol=1e-5)
    assert diff.meta["exact"] is True and len(diff.terms) == 1
    (theta0, coef, same), x0 = diff.terms[0], run.ctx.x0
    # the round-1 batch's coefficient relative to the round-2 batch's mean (realised sizes)
    b1, b2 = len(run.secret_index(1, 0)), len(run.secret_index(2, 0))
    assert coef == pytest.approx(-b1 / b2) and same is False
    torch.testing.assert_close(torch.cat([v.flatten() for v in theta0.values()]), x0)


def test_bad_params_are_refused(tmp_path):
    for name, bad in [
        ("lppa", {"beta": 0.0}),
        ("lppa", {"beta": -0.1}),
        ("lppa", {"beta": float("nan")}),
        ("dp-dsgt", {"beta": 0.0}),
        ("dp-dsgt", {"inject": "sometimes"}),
        ("dsgt", {"lr": 0.0}),
        ("dsgt", {"old_grad": "stale"}),
        ("dsgt", {"beta": 0.1}),
    ]:
        with pytest.raises(PrivauditError):
            params_of(get_defense(name).Params, bad)
    with pytest.raises(PrivauditError, match="beta"):
        Run.create(tiny("dp-dsgt", params={"beta": -1.0}), tmp_path / "r")


def test_paper_budget_is_theorems_2_and_3_as_written():
    W = torch.full((4, 4), 0.25, dtype=torch.float64)
    dp = paper_budget(1.0, 0.025, W, 5, lppa=False)
    lp = paper_budget(1.0, 0.025, W, 5, lppa=True)
    torch.testing.assert_close(dp, torch.full((4,), 40.0, dtype=torch.float64))
    torch.testing.assert_close(lp, dp / math.sqrt(2))
    with pytest.raises(PrivauditError):
        paper_budget(1.0, 0.0, W, 1, lppa=True)


def test_lppa_resume_does_not_exchange_again(tmp_path):
    """Round 3 re-simulated from the round-2 checkpoint is bit-identical and has no shares."""
    cfg = tiny("lppa", rounds=4)
    full = Run.create(cfg, tmp_path / "a")
    full.train(capture=CaptureSpec.of(rounds=[3]), progress=False)
    part = Run.create(cfg, tmp_path / "b")
    part.train(until=2, progress=False)
    again = part.messages(CaptureSpec.of(rounds=[3]), progress=False)
    first = full.dir.load_messages(3)
    assert first.keys() == again.keys() and {k[3] for k in again} == {"model", "gt"}
    assert all(torch.equal(first[k], again[k]) for k in first)
