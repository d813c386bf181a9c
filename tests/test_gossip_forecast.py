"""The tied attack's drift forecast (El Mrini, Cyffers & Bellet's setting, ICML 2024) on a run
trained from the command line: ``train --model linear --examples-per-agent 1 --sampling full
--precision float64 --gossip laplacian``, then ``observe_beyond(..., tie=True)``, which
re-simulates the run from what the coalition recovered and solves the tied system again with
the forecast drift taken out (:mod:`privaudit.api.gossip_forecast`,
:mod:`privaudit.attacks.gossip_drift`)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli

from privaudit.api.gossip import observe_beyond
from privaudit.api.gossip_forecast import RunForecast
from privaudit.attacks import gossip_algebra as ga
from privaudit.attacks.gossip_drift import solve_tied
from privaudit.core.config import RunConfig
from privaudit.core.messages import CaptureSpec
from privaudit.core.threat import build_threat
from privaudit.scenario.models import build_model
from privaudit.scenario.topology import build_topology, laplacian_gossip, validate_mixing
from privaudit.sim.run import Run
from privaudit.sim.targets import Target

pytestmark = pytest.mark.usefixtures("one_thread")

N, LR = 8, 1e-4
ANCHOR = ["--model", "linear", "--examples-per-agent", "1", "--sampling", "full"]
ANCHOR += ["--precision", "float64", "--gossip", "laplacian"]


def train(out, *extra: str, agents: int = N, lr: float = LR) -> Run:
    from privaudit.cli import main

    argv = ["train", "--defense", "dsgd", "--out", str(out), "--agents", str(agents)]
    argv += ["--topology", "line", "--rounds", str(agents), "--lr", str(lr), "--no-progress"]
    argv += ["--capture", "all", "--checkpoint-every", "1", *extra]
    assert main(argv) == 0
    return Run.open(out)


@pytest.fixture(scope="module")
def anchor_run(tmp_path_factory) -> Run:
    """D-GD on a line of 8, one photo per agent, one linear layer, float64, W = I − L/d_max."""
    return train(tmp_path_factory.mktemp("forecast") / "run", *ANCHOR)


def truth(run: Run) -> tuple[np.ndarray, np.ndarray, dict]:
    """Every agent's half-steps (T + 1, n, d) from the captured messages and its gradients
    (T, n, d), g_t = (W x̃_{t-1} − x̃_t)/η; and the messages."""
    T, n = run.cfg.rounds, run.cfg.agents
    msgs = run.messages(CaptureSpec.of(rounds=range(1, T + 1)), progress=False)
    sent = {(t, src): m.double().numpy() for (t, src, _, _), m in msgs.items()}
    x0 = run.ctx.x0.double().numpy()
    S = np.stack(
        [np.tile(x0, (n, 1))]
        + [np.stack([sent[(t, k)] for k in range(n)]) for t in range(1, T + 1)]
    )
    W = run.ctx.W.double().numpy()
    lr = run.params.lr
    g = np.stack([((S[0] if t == 1 else W @ S[t - 1]) - S[t]) / lr for t in range(1, T + 1)])
    return S, g, msgs


def test_the_anchor_setting_from_the_command_line(anchor_run):
    """float64 models and messages, El Mrini et al.'s W, their model, one example each."""
    ctx = anchor_run.ctx
    assert ctx.x0.dtype == torch.float64 and ctx.train_x.dtype == torch.float64
    assert torch.equal(ctx.W.cpu(), laplacian_gossip(build_topology("line", N)))
    assert {len(p) for p in ctx.parts} == {1}
    _, _, msgs = truth(anchor_run)
    assert all(m.dtype == torch.float64 for m in msgs.values())
    model = build_model("linear", (3, 32, 32), 10)
    assert sum(p.numel() for p in model.parameters()) == 3 * 32 * 32 * 10 + 10


def test_laplacian_gossip_is_i_minus_l_over_dmax():
    adj = build_topology("erdos-renyi", 12)
    W = laplacian_gossip(adj)
    a = adj.double().fill_diagonal_(0)
    L = torch.diag(a.sum(1)) - a
    assert torch.allclose(W, torch.eye(12, dtype=torch.float64) - L / a.sum(1).max())
    validate_mixing(W, adj)


def test_new_fields_at_their_default_keep_the_old_keys():
    """Runs made before ``precision`` and ``gossip`` keep their identity (folder names and
    cache keys); a run that sets them has another."""
    old = RunConfig().identity()
    assert "precision" not in old and "gossip" not in old
    assert RunConfig(precision="float64").identity()["precision"] == "float64"
    assert RunConfig(gossip="laplacian").identity()["gossip"] == "laplacian"


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [("--precision", "float16", "--precision must be one of float32, float64"),
     ("--gossip", "ring", "unknown gossip matrix 'ring'")],
)  # fmt: skip
def test_bad_precision_or_gossip_is_refused_in_one_line(flag, value, needle, tmp_path, capsys):
    argv = ["train", "--defense", "dsgd", "--out", str(tmp_path / "r"), "--agents", "4"]
    code, _, err = run_cli(capsys, *argv, "--rounds", "1", flag, value)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("privaudit: error: "), err
    assert needle in lines[0], lines[0]
    assert not (tmp_path / "r").exists()


def test_the_forecast_from_true_gradients_is_the_run_itself(anchor_run):
    """Handed every non-member's true round-1 gradient, the coalition's re-simulation (its
    own messages, each victim's example inverted and its label read off the bias gradient —
    right also where normalised inputs make iDLG's row sums change sign) reproduces every
    agent's gradient in every round: the forecast drift is the true drift."""
    S, g, msgs = truth(anchor_run)
    tgt = Target.of("dsgd-half-model")
    rec = tgt.defense.recursion(anchor_run.params, anchor_run.ctx.W.cpu(), 1)
    view = build_threat("coalition", attackers=[0]).view(msgs, anchor_run.public())
    x0 = anchor_run.ctx.x0.cpu()
    states = {(0, t): S[t, 0] for t in range(1, N + 1)}
    forecast = RunForecast(
        anchor_run, rec, N, lambda v: tgt.defense.make_observation(view, x0, v), states
    )
    got = {k: g[0, k] for k in range(1, N)}
    updates, states = forecast(got, 1.0)
    assert all(forecast.inverted[k][0] < 1e-12 for k in got)
    labels = [int(forecast.inverted[k][2]) for k in range(1, N)]
    assert labels == [int(anchor_run.ctx.train_y[anchor_run.ctx.parts[k]]) for k in range(1, N)]
    for k in range(1, N):  # every gradient of every round, to the inversion's float32
        for t in range(1, N + 1):
            err = np.linalg.norm(updates[t - 1, k] - g[t - 1, k])
            assert err <= 1e-6 * np.linalg.norm(g[t - 1, k])
            assert err <= 1e-4 * np.linalg.norm(g[t - 1, k] - g[0, k]) or t == 1
    assert np.abs(states - S).max() <= 1e-8 * np.abs(S).max()  # every message, re-simulated
    # trusting no inversion holds every agent at its given gradient: no drift
    held, _ = forecast(got, 0.0)
    assert all(np.array_equal(held[t, k], g[0, k]) for k in got for t in range(N))


def test_the_forecast_recovers_far_victims_far_better_than_the_tie(anchor_run):
    """Line of 8, attacker at the end, η = 1e-4: every victim's gradient with the forecast
    is at least 100× closer to the truth than the tie's first pass, also at a later round
    (the update there carries its forecast drift, the model its own)."""
    S, g, _ = truth(anchor_run)
    W = anchor_run.ctx.W.double().numpy()
    victims = list(range(1, N))
    for t in (1, 3):
        tied = observe_beyond(anchor_run, "dsgd-half-model", t, [0], victims, tie=True,
                              progress=False, forecast=False)  # fmt: skip
        both = observe_beyond(anchor_run, "dsgd-half-model", t, [0], victims, tie=True,
                              progress=False)  # fmt: skip
        for v, a, b in zip(victims, tied, both, strict=True):
            true = g[t - 1, v]
            err = [
                float(np.linalg.norm(flat(o.target) - true) / np.linalg.norm(true)) for o in (a, b)
            ]
            assert err[1] <= err[0] / 100, (t, v, err)
            at = S[0, v] if t == 1 else (W @ S[t - 1])[v]
            assert np.linalg.norm(flat(b.params) - at) <= 1e-6 * np.linalg.norm(at)
        told = both[0].meta["forecast"]
        assert told["agents forecast"] == N - 1 and told["non-members solved"] == N - 1
        assert told["misfits"] == sorted(told["misfits"], reverse=True)
        assert len(told["misfits"]) >= 2 and tied[0].meta["forecast"] == "not used: forecast=False"


def flat(d: dict) -> np.ndarray:
    return torch.cat([v.reshape(-1) for v in d.values()]).double().numpy()


def test_the_forecast_says_why_it_was_not_used(tmp_path):
    """Two examples per agent: a recovered gradient is a sum of two, which does not invert, so
    the coalition cannot re-run the training; the tie's first pass stands and says so."""
    run = train(tmp_path / "two", "--examples-per-agent", "2", "--sampling", "full", agents=5)
    (obs,) = observe_beyond(run, "dsgd-half-model", 1, [0], [2], tie=True, progress=False)
    assert obs.meta["forecast"] == (
        "not used: agents hold 2 examples, and only one example's gradient inverts"
    )


def test_a_solve_that_explains_the_run_worse_is_never_used():
    """Constant gradients make the tie exact: its solve, re-simulated, reproduces the
    messages. A forecast whose drift is not there moves the next solve away, whose own
    re-simulation then fits the messages worse — so it is dropped and the tie's solve
    stands, exactly."""
    rng = np.random.default_rng(0)
    n, T, d = 6, 6, 4
    adj = build_topology("line", n)
    rec = ga.dpsgd(laplacian_gossip(adj).numpy(), 0.1)
    grads = rng.normal(size=(n, d))
    values = {("x0", k, 0): np.ones(d) for k in range(n)}
    values.update({("g", k, t): grads[k] for k in range(n) for t in range(1, T + 1)})
    states = ga.simulate(rec, T, values, d)
    rows = ga.gossip_messages(adj, [0], range(1, T + 1), own=("x",))
    untied = ga.knowledge(
        rec, [0], rows, rounds=T, known=lambda k: k[0] == "x0" or k[1] == 0, cut=True
    )
    system = ga.tie(untied, range(1, n))
    analysis = ga.identifiability(system)
    keys = [("g", k, 1) for k in range(1, n)]
    known = system.known_from(states, lambda key: np.ones(d))
    observed = system.observed(states)

    def wrong(got, trust):  # the run re-simulated from got, with a drift that is not there
        held = {**values, **{("g", k, t): got[k] for k in got for t in range(1, T + 1)}}
        updates = np.stack([[held[("g", k, t)] for k in range(n)] for t in range(1, T + 1)])
        return updates + rng.normal(size=updates.shape), ga.simulate(rec, T, held, d)

    plain = solve_tied(system, untied, observed, known, analysis, keys)
    drift = solve_tied(system, untied, observed, known, analysis, keys, forecast=wrong)
    assert drift.offsets == {} and drift.trust is None and len(drift.misfits) == 1
    assert drift.misfits[0] < 1e-9 * np.abs(observed).max()
    for k in range(1, n):
        assert np.array_equal(drift.got[k], plain.got[k])
        assert np.allclose(plain.got[k], grads[k], atol=1e-8)


def test_identifiable_victims(anchor_run):
    """Tied, a coalition at the end of a line hears every agent; untied (D-PSGD's exact
    system) only its neighbour, whose first update is its first message less x_0."""
    from privaudit.api.gossip import identifiable_victims

    tied = identifiable_victims(anchor_run, "dsgd-half-model", 1, [0], tie=True)
    assert tied == list(range(1, N))
    assert identifiable_victims(anchor_run, "dsgd-half-model", 1, [0]) == [1]
    assert identifiable_victims(anchor_run, "dsgd-half-model", 1, [0, 4]) == [1, 3, 5]


def test_the_run_is_the_anchors_d_gd(anchor_run):
    """What ``privaudit train`` writes in the anchor's setting is benchmarks/anchor.py's D-GD
    (the simulation its side-by-side checks against the anchor's own code) on the run's
    examples, x_0, W and η, to float64 rounding; and the command line's tied attack
    (``run_attack``) recovers every victim of the line."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from anchor import dgd, linear_model, psnr, run_attack, run_data, run_messages

    x, y, pixels, _, _ = run_data(anchor_run)
    model = linear_model(tuple(x.shape[1:]), 10, 0)
    torch.nn.utils.vector_to_parameters(anchor_run.ctx.x0.cpu().double(), model.parameters())
    sent, _ = dgd(model, x, y, anchor_run.ctx.W.cpu().double().numpy(), LR, N)
    ours = run_messages(anchor_run)
    assert np.abs(ours - sent).max() <= 1e-12 * np.abs(sent).max()
    got, hidden = run_attack(anchor_run, [0])
    assert hidden == 0 and sorted(got) == list(range(1, N))
    assert all(psnr(got[v], pixels[v]) >= 40 for v in got)
