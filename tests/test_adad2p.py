"""AdaD²P / ConstD²P / ClipD²P: the one-peer exponential schedule, push-sum mass and
de-biasing, the noise of each variant, and the link observation."""

from __future__ import annotations

import functools
import math

import conftest
import pytest
import torch
from conftest import secret_batch

from privaudit.api.pipeline import observe
from privaudit.core.context import params_of
from privaudit.core.errors import PrivauditError
from privaudit.core.messages import CaptureSpec, Tap
from privaudit.core.network import SimNetwork
from privaudit.core.threat import build_threat
from privaudit.defenses import get_defense
from privaudit.defenses.adad2p import active_rounds, hop, hops, peers, push_sum
from privaudit.grads import clip_rows
from privaudit.scenario.topology import build_topology, exponential, metropolis_hastings
from privaudit.sim.run import Run

tiny = functools.partial(conftest.tiny, checkpoint_every=1)


def test_hop_schedule():
    assert hops(2) == [1] and hops(3) == [1, 2] and hops(4) == [1, 2]
    assert hops(20) == [1, 2, 4, 8, 16]  # SGP: every 2^j < N
    assert [peers(5, t) for t in (1, 2, 3, 4)] == [
        [1, 2, 3, 4, 0],
        [2, 3, 4, 0, 1],
        [4, 0, 1, 2, 3],
        [1, 2, 3, 4, 0],
    ]
    assert active_rounds(4, 0, 1) == (1, 2) and active_rounds(4, 3, 1) == (2, 2)
    assert active_rounds(4, 1, 0) is None  # 0 − 1 ≡ 3 is not a hop
    assert active_rounds(5, 1, 0) == (3, 3)  # hop 4 ≡ −1


def test_push_sum_conserves_mass_and_debiases_to_the_average():
    """Per-agent shares make P^k only column stochastic: x alone is biased, z = x/w is not."""
    n, g = 5, torch.Generator().manual_seed(1)
    net = SimNetwork(exponential(n), metropolis_hastings(exponential(n)))
    x = torch.randn(n, 3, generator=g, dtype=torch.float64)
    w = torch.ones(n, 1, dtype=torch.float64)
    keep = torch.tensor([0.2, 0.5, 0.9, 0.6, 0.3], dtype=torch.float64)[:, None]
    avg = x.mean(0)
    for t in range(1, 200):
        peer = torch.tensor(peers(n, t))
        pre = push_sum(net, x, w, peer, keep, prescale=True)
        x, w = push_sum(net, x, w, peer, keep, prescale=False)
        torch.testing.assert_close(pre, (x, w), rtol=0, atol=1e-14)
        torch.testing.assert_close(w.sum(), torch.tensor(float(n), dtype=w.dtype))
        torch.testing.assert_close(x.sum(0), avg * n)
    torch.testing.assert_close(x / w, avg.expand(n, -1), rtol=0, atol=1e-9)
    assert (x - avg).abs().max() > 1e-2  # without de-biasing the agents disagree
    assert w.std() > 1e-2


def test_run_schedule_mixing_and_mass(tmp_path):
    run = Run.create(tiny("adad2p", rounds=3, agents=5), tmp_path / "r")
    n, keep = 5, run.params.keep
    prev = run.defense.init(run.ctx, run.params)
    for t in range(1, 4):
        state = run.train(until=t, capture=CaptureSpec.of(rounds=[t]), progress=False)
        msgs = run.dir.load_messages(t)
        sent = {(s, d) for (_, s, d, _k) in msgs}
        assert sent == {(i, p) for i, p in enumerate(peers(n, t))}
        assert {k for (*_, k) in msgs} == {"half-model", "weight"}
        half = torch.stack([msgs[(t, i, p, "half-model")] for i, p in enumerate(peers(n, t))])
        wts = torch.stack([msgs[(t, i, p, "weight")] for i, p in enumerate(peers(n, t))])
        torch.testing.assert_close(wts, prev["w"])  # w^k travels with x^{k+½}
        src_of = (torch.arange(n) - hop(n, t)) % n  # agent i hears from i − 2^j
        torch.testing.assert_close(state["x"], keep * half + (1 - keep) * half[src_of])
        torch.testing.assert_close(state["w"], torch.ones(n, 1))
        assert float(state["w"].sum()) == n
        # mass: the network average of x is the average of the half-step models
        torch.testing.assert_close(state["x"].mean(0), half.mean(0), rtol=1e-5, atol=1e-7)
        prev = state


def clean_grads(run: Run, agent: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example gradients (b, D) of ``agent``'s realised round-t batch at x_0, and their
    sum over the expected batch size B (the batch mean of Poisson sampling)."""
    per = run.ctx.grads.per_example(run.ctx.x0[None], *secret_batch(run, agent, t))[0]
    return per, per.sum(0) / run.cfg.batch_size


CASES = {
    "adad2p-example": ("adad2p", {"sigma": 0.5}, None),
    "adad2p-batch": ("adad2p", {"sigma": 0.5, "unit": "batch"}, None),
    "constd2p-example": ("constd2p", {"G": 3.0}, 2.0),
    "constd2p-enforced": ("constd2p", {"G": 0.05, "enforce": True}, 2.0),
    "constd2p-enforced-batch": ("constd2p", {"G": 0.05, "enforce": True, "unit": "batch"}, 2.0),
    "clipd2p-example": ("clipd2p", {"clip": 0.05}, 2.0),
    "clipd2p-batch": ("clipd2p", {"clip": 0.05, "unit": "batch"}, 2.0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_noise_std_and_exact_first_round_observation(tmp_path, case):
    """Round 1 starts at the public x_0: (x_0 − x^{½})/γ − g is exactly the noise, whose
    sample std over D ≈ 16k coordinates must be σS/B (σS for unit "batch")."""
    defense, params, sigma = CASES[case]
    cfg = tiny(defense, rounds=1, batch_size=3, sigma=sigma, params=params)
    run = Run.create(cfg, tmp_path / "r")
    p, B, D = run.params, 3, run.ctx.spec.numel
    if defense == "adad2p":  # --epsilon (default 1) does not override the paper's σ
        assert run.resolved["epsilon"] == math.inf and p.sigma == params["sigma"]
    else:
        assert run.resolved["kinds"]["half-model"]["releases_per_round"] == 1
        assert p.sigma == sigma
    obs = observe(run, f"{defense}-half-model", 1, links=[(a, a + 1) for a in range(3)])
    tol = 5 / math.sqrt(2 * D)  # 5 standard errors of a sample std
    for o in obs:
        per, mean = clean_grads(run, o.meta["src"], 1)
        batch = p.unit == "batch"
        if defense == "adad2p":
            S = mean.norm() if batch else per.norm(dim=1).max()
            g = mean
        elif defense == "constd2p" and not p.enforce:
            S, g = p.G, mean
        else:  # clipd2p, or constd2p clipping at G
            S = p.clip if defense == "clipd2p" else p.G
            g = clip_rows(mean, S) if batch else clip_rows(per, S).sum(0) / B
            assert g.norm() <= S * (1 if batch else len(per) / B) * (1 + 1e-5)
            if len(per):  # the clip did bind (per-example norms at x_0 are far above S)
                assert (mean - g).norm() > 0.5 * mean.norm()
        want = p.sigma * float(S) / (1 if batch else B)
        target = torch.cat([v.flatten() for v in o.target.values()])
        params_at = torch.cat([v.flatten() for v in o.params.values()])
        torch.testing.assert_close(params_at, run.ctx.x0)
        noise = target - g
        assert abs(float(noise.std()) / want - 1) < tol, (float(noise.std()), want)
        assert abs(float(noise.mean())) < 5 * want / math.sqrt(D)
        assert o.noise_std == pytest.approx(want, rel=0.05)
        assert o.meta["exact"] is True


def test_link_observation_schedule_and_errors(tmp_path):
    run = Run.create(tiny("constd2p", rounds=3, sigma=0.0), tmp_path / "r")
    d = run.defense
    assert d.rounds_needed("half-model", 3, 4) == [1, 2, 3]  # hops 1, 2: active every 2
    # round 2 uses hop 2 on 4 agents: 0→1 is idle, and 1→0 is never used
    with pytest.raises(PrivauditError, match=r"0->1 carries no message in round 2.*rounds 1, 3, 5"):
        observe(run, "constd2p-half-model", 2, links=[(0, 1)], progress=False)
    msgs = run.messages(CaptureSpec.of(rounds=[1, 2, 3]), progress=False)
    view = build_threat("link", link=(1, 0)).view(msgs, run.public())
    with pytest.raises(PrivauditError, match="1->0 never carries"):
        d.observe(view, "weight", 1, 1, 0)
    # round 3 (hop 1 again): x̂ is 0's round-1 half-step model on the same link
    (o,) = observe(run, "constd2p-weight", 3, links=[(0, 1)], progress=False)
    assert o.meta["exact"] is False and o.meta["params_from"] == "round 1"
    params_at = torch.cat([v.flatten() for v in o.params.values()])
    torch.testing.assert_close(params_at, msgs[(1, 0, 1, "half-model")])
    (o,) = observe(run, "constd2p-half-model", 2, links=[(3, 1)], progress=False)
    assert o.meta["params_from"] == "x0"


def test_gradient_is_taken_at_the_debiased_point(tmp_path):
    """With x = 2x_0 and w = 2 (σ = 0): x^{½} = 2x_0 − γ∇f(z = x_0), and w stays 2."""
    run = Run.create(tiny("constd2p", rounds=1, sigma=0.0), tmp_path / "r")
    ctx, n = run.ctx, 4
    net = SimNetwork(ctx.adj, ctx.W, Tap(CaptureSpec.of(rounds=[1])))
    net.round = 1
    batch = ctx.gather(ctx.sample())
    x0 = ctx.x0.expand(n, -1).contiguous()
    state = {"x": 2 * x0, "w": torch.full((n, 1), 2.0)}
    out = run.defense.round(ctx, run.params, state, net, batch)
    half = torch.stack(
        [net.tap.messages[(1, i, p, "half-model")].payload for i, p in enumerate(peers(n, 1))]
    )
    g = ctx.grads.mean(x0, *batch)
    torch.testing.assert_close(half, 2 * x0 - run.params.lr * g)
    torch.testing.assert_close(out["w"], state["w"])


def test_prescaled_messages_carry_the_share_and_observe_the_same(tmp_path):
    plain = Run.create(tiny("clipd2p", rounds=1, sigma=1.0), tmp_path / "a")
    scaled = Run.create(
        tiny("clipd2p", rounds=1, sigma=1.0, params={"prescale": True}), tmp_path / "b"
    )
    a = plain.messages(CaptureSpec.of(rounds=[1]), progress=False)
    b = scaled.messages(CaptureSpec.of(rounds=[1]), progress=False)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], 0.5 * a[k])
    (oa,) = observe(plain, "clipd2p-half-model", 1, progress=False)
    (ob,) = observe(scaled, "clipd2p-half-model", 1, progress=False)
    for key in oa.target:
        torch.testing.assert_close(oa.target[key], ob.target[key])


@pytest.mark.parametrize(
    "name,params,match",
    [
        ("adad2p", {"keep": 1.0}, "keep"),
        ("adad2p", {"sigma": -0.1}, "sigma"),
        ("adad2p", {"lr": 0}, "lr"),
        ("adad2p", {"unit": "sum"}, "unit"),
        ("adad2p", {"clip": 1.0}, "unknown parameter"),
        ("constd2p", {"G": 0.0}, "G must be"),
        ("constd2p", {"prescale": "yes"}, "prescale"),
        ("clipd2p", {"clip": -1.0}, "clip must be"),
        ("clipd2p", {"sigma": math.inf}, "sigma"),
    ],
)
def test_bad_params_are_refused(name, params, match):
    with pytest.raises(PrivauditError, match=match):
        params_of(get_defense(name).Params, params)


def test_wrong_topology_is_refused(tmp_path):
    """privacy() refuses a graph the defense cannot run on, so a run is refused before
    anything is written; on its own graph: one release per round, to one peer."""
    for name in ("adad2p", "constd2p", "clipd2p"):
        d = get_defense(name)
        p = params_of(d.Params, {"sigma": 1.0})
        with pytest.raises(PrivauditError, match="needs --topology exponential.*torus"):
            d.privacy(p, "half-model", metropolis_hastings(build_topology("torus", 6)))
        pr = d.privacy(p, "half-model", metropolis_hastings(exponential(6)), agent=2)
        assert pr.releases == 1 and pr.formal == (name == "clipd2p")
        assert pr.claimed_releases == 1 and pr.claimed_multiplier == (name != "adad2p")
    with pytest.raises(PrivauditError, match="needs --topology exponential.*ring"):
        Run.create(tiny("adad2p", topology="ring"), tmp_path / "r")
    assert not (tmp_path / "r").exists()
