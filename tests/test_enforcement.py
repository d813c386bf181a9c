"""ConstD²P and Muffliato scale their noise by a gradient bound G. Unenforced (the papers'
choice), nothing bounds the per-example gradients, so no formal ε; with ``enforce`` every
per-example gradient is clipped at G and the release is a Gaussian mechanism whose noise
multiplier — checked here against a sensitivity measured by adding one example — is formal.
"""

from __future__ import annotations

import math
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from privaudit.core.config import RunConfig
from privaudit.core.context import params_of
from privaudit.core.messages import CaptureSpec, Tap
from privaudit.core.network import SimNetwork
from privaudit.core.sampling import PAD
from privaudit.grads import clip_rows
from privaudit.sim.run import Run

B = 4  # expected batch size

# defense → (topology, name of G, message kind, extra params)
DEFENSES = {
    "muffliato": ("ring", "grad_bound", "model", {"gossip_steps": 1}),
    "constd2p": ("exponential", "G", "half-model", {}),
}


def config(name: str, params: dict, **fields) -> RunConfig:
    """A 4-agent run of ``name`` on its graph, with ``params`` and RunConfig ``fields``."""
    topology, _, _, extra = DEFENSES[name]
    base = dict(rounds=1, agents=4, batch_size=B, topology=topology, checkpoint_every=1)
    return RunConfig(defense=name, params={**extra, **params}, **{**base, **fields})


def make_run(tmp_path, name: str, **params) -> Run:
    cfg = config(name, params, sigma=0.0)
    return Run.create(cfg, tmp_path / f"{name}-{len(list(tmp_path.iterdir()))}")


def with_params(run: Run, **kw):
    """The run's parameters with ``kw`` changed (validated)."""
    return params_of(run.defense.Params, {**asdict(run.params), **kw})


def loop_grads(run: Run, idx: torch.Tensor) -> torch.Tensor:
    """Per-example gradients (b, D) at x_0 of the examples ``idx``, one autograd call each
    (independent of the vmapped engines the defenses use)."""
    ctx = run.ctx
    named = {
        k: v.detach().clone().requires_grad_(True) for k, v in ctx.spec.unflatten(ctx.x0).items()
    }
    out = []
    for i in idx.tolist():
        logits = functional_call(ctx.model, named, (ctx.train_x[i][None],))
        loss = F.cross_entropy(logits, ctx.train_y[i][None])
        grads = torch.autograd.grad(loss, [named[n] for n in ctx.spec.names])
        out.append(torch.cat([g.reshape(-1) for g in grads]))
    return torch.stack(out)


def batches(run: Run, row0: list[int]) -> torch.Tensor:
    """A padded index (N, B): agent 0's row is ``row0`` (shard positions, or None for a padded
    slot), every other agent its first B shard examples."""
    ctx = run.ctx
    rows = [[int(ctx.parts[0][k]) if k is not None else PAD for k in row0]]
    rows += [ctx.parts[a][:B].tolist() for a in range(1, ctx.n)]
    return torch.tensor(rows)


def release(run: Run, p, index: torch.Tensor) -> torch.Tensor:
    """Agent 0's noised message of round 1 (its ``kind``), from x_0, on the batches
    ``index`` — the defense's own round, with the run's generators."""
    ctx, kind = run.ctx, DEFENSES[run.defense.name][2]
    net = SimNetwork(ctx.adj, ctx.W, Tap(CaptureSpec.of(rounds=[1])))
    net.round = 1
    run.defense.round(ctx, p, run.defense.init(ctx, p), net, ctx.gather(index))
    return next(m.payload for m in net.tap.messages.values() if m.src == 0 and m.kind == kind)


def step_of(run: Run, p, index: torch.Tensor) -> torch.Tensor:
    """(x_0 − message)/η: the released gradient (with its noise) of agent 0."""
    return (run.ctx.x0 - release(run, p, index)) / p.lr


@pytest.mark.parametrize("name", list(DEFENSES))
def test_per_example_gradients_at_x0_exceed_the_default_bound(tmp_path, name):
    """The papers' G (1 for Muffliato, 3.5 ConstD²P's MNIST value) is no bound at all here."""
    run = make_run(tmp_path, name)
    G = getattr(run.params, DEFENSES[name][1])
    norms = loop_grads(run, run.ctx.parts[0][:8]).norm(dim=1)
    assert (norms > 2 * G).all(), norms


CASES = [
    ("muffliato", {}),
    ("constd2p", {}),
    ("constd2p", {"unit": "batch"}),
]


@pytest.mark.parametrize("name,extra", CASES)
@pytest.mark.parametrize("enforce", [False, True])
def test_released_step_is_the_per_example_clipped_mean(tmp_path, name, extra, enforce):
    """σ = 0: the released step of a padded Poisson-style batch (3 examples, B = 4) is
    (1/B) Σ_b clip_G(g_b) with ``enforce`` (a flat clip of the mean for unit "batch"), the
    plain (1/B) Σ_b g_b without — each g_b from a per-example autograd loop."""
    G = 0.5
    run = make_run(tmp_path, name, **{DEFENSES[name][1]: G, "enforce": enforce, **extra})
    index = batches(run, [0, 1, 2, None])
    got = step_of(run, run.params, index)
    per = loop_grads(run, index[0, :3])
    plain = per.sum(0) / B
    if not enforce:
        want = plain
    elif extra.get("unit") == "batch":
        want = clip_rows(plain, G)
    else:
        want = (per * torch.clamp(G / per.norm(dim=1, keepdim=True), max=1.0)).sum(0) / B
        assert (per.norm(dim=1) > G).all()  # every example's contribution was cut to G/B
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    if enforce:
        assert (plain - want).norm() > 0.5 * plain.norm()  # the clip did bind


MULTIPLIER_CASES = [
    ("muffliato", {}, 1.0),
    ("muffliato", {"calibration": "replace-one"}, 2.0),
    ("constd2p", {}, 1.0),
]


@pytest.mark.parametrize("name,extra,factor", MULTIPLIER_CASES)
def test_multiplier_is_noise_std_over_the_measured_sensitivity(tmp_path, name, extra, factor):
    """Add one example with a large gradient (‖g*‖ > 2G) to agent 0's batch and measure how
    far the un-noised release moves: η‖g*‖/B unenforced (unbounded in G), exactly ηG/B with
    ``enforce``. The noise std of the release, measured over D coordinates, over that
    sensitivity is the formal multiplier ``privacy()`` states (σ, or 2σ for replace-one)."""
    G, sigma = 1.0, 1.3
    key, kind = DEFENSES[name][1], DEFENSES[name][2]
    run = make_run(tmp_path, name, **{key: G, **extra})
    lr = run.params.lr
    cand = run.ctx.parts[0][:16]
    norms = loop_grads(run, cand).norm(dim=1)
    star = int(norms.argmax())
    assert norms[star] > 2 * G
    rest = [k for k in range(16) if k != star][:2]
    without, with_star = batches(run, [*rest, None, None]), batches(run, [*rest, star, None])
    moved = {}
    for enforce in (False, True):
        p0 = with_params(run, enforce=enforce, sigma=0.0)
        moved[enforce] = float((release(run, p0, with_star) - release(run, p0, without)).norm())
    assert moved[False] == pytest.approx(lr * float(norms[star]) / B, rel=1e-3)
    assert moved[False] > 2 * lr * G / B  # one example moves it arbitrarily far
    assert moved[True] == pytest.approx(lr * G / B, rel=1e-3)  # clipped: exactly ηG/B

    p = with_params(run, enforce=True, sigma=sigma)
    noise = release(run, p, without) - release(run, with_params(run, enforce=True), without)
    D = noise.numel()
    std = float(noise.std())
    pr = run.defense.privacy(p, kind, run.ctx.W, agent=0)
    assert pr.formal and pr.releases == 1 and pr.clip == G and pr.clip_unit == "example"
    assert pr.noise_multiplier == pytest.approx(factor * sigma)
    assert abs(std / moved[True] / pr.noise_multiplier - 1) < 5 / math.sqrt(2 * D)
    assert abs(float(noise.mean())) < 5 * std / math.sqrt(D)


def test_batch_clip_multiplier_is_half_sigma(tmp_path):
    """ConstD²P unit "batch" with ``enforce``: the mean is flat-clipped at G, so adding one
    example moves it by at most 2G (both means on the G-sphere): noise std σG over 2G."""
    G, sigma = 1.0, 1.3
    run = make_run(tmp_path, "constd2p", G=G, unit="batch", enforce=True)
    p0 = with_params(run, sigma=0.0)
    lr = run.params.lr
    a, b = batches(run, [0, 1, None, None]), batches(run, [0, 1, 2, None])
    steps = [step_of(run, p0, x) for x in (a, b)]
    for s in steps:
        assert float(s.norm()) == pytest.approx(G, rel=1e-4)  # the clip binds at x_0
    assert float((steps[1] - steps[0]).norm()) <= 2 * G * (1 + 1e-5)
    p = with_params(run, sigma=sigma)
    noise = (release(run, p0, a) - release(run, p, a)) / lr
    pr = run.defense.privacy(p, "half-model", run.ctx.W)
    assert pr.formal and pr.clip_unit == "batch"
    assert abs(float(noise.std()) / (2 * G) / pr.noise_multiplier - 1) < 5 / math.sqrt(
        2 * noise.numel()
    )


@pytest.mark.parametrize("name", list(DEFENSES))
def test_a_run_reports_what_privacy_says(tmp_path, name):
    """Unenforced: not formal, with a reason; --epsilon still sets σ by the paper's claim
    (multiplier σ, one release per round) and the run reports ε = ∞ beside the claimed ε.
    Enforced: formal, and the run's ε is the target."""
    kind = DEFENSES[name][2]
    eps = 2.0
    runs = {}
    for enforce in (False, True):
        cfg = config(name, {"enforce": enforce}, rounds=3, epsilon=eps)
        runs[enforce] = run = Run.create(cfg, tmp_path / f"r{int(enforce)}")
        pr = run.defense.privacy(run.params, kind, run.ctx.W)
        assert run.params.sigma > 0
        assert pr.claimed_multiplier == run.params.sigma and pr.claimed_releases == 1
        assert pr.formal is enforce and pr.reason
        report = run.resolved
        assert report["kinds"][kind]["formal"] is enforce
        if enforce:
            assert report["epsilon"] == pytest.approx(eps, rel=0.02)
        else:
            assert report["epsilon"] == math.inf
            assert "G" in report["kinds"][kind]["reason"]
            assert report["epsilon_claimed"] == pytest.approx(eps, rel=0.02)
    # both calibrate σ to the same multiplier: the same σ
    assert runs[True].params.sigma == pytest.approx(runs[False].params.sigma, rel=1e-6)


def test_muffliato_replace_one_calibration_with_enforcement_gives_the_same_noise(tmp_path):
    """Formal: σ is set so that the add/remove multiplier meets ε, so the replace-one
    convention (s = 2ηG/B, multiplier 2σ) ends with half the σ and the same noise."""
    std = {}
    for cal in ("add-remove", "replace-one"):
        cfg = config("muffliato", {"enforce": True, "calibration": cal}, rounds=3, epsilon=2.0)
        run = Run.create(cfg, tmp_path / cal)
        std[cal] = run.params.noise_std(B)
    assert std["replace-one"] == pytest.approx(std["add-remove"], rel=1e-6)


@pytest.mark.parametrize(
    "name,params,match",
    [
        ("muffliato", {"enforce": "yes"}, "enforce"),
        ("muffliato", {"calibration": "replace"}, "calibration"),
        ("muffliato", {"sensitivity": 0.1}, "unknown parameter"),
        ("constd2p", {"enforce": 1}, "enforce"),
    ],
)
def test_bad_enforcement_params_are_refused(name, params, match):
    from privaudit.core.errors import PrivauditError
    from privaudit.defenses import get_defense

    with pytest.raises(PrivauditError, match=match):
        params_of(get_defense(name).Params, params)
