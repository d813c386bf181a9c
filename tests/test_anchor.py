"""El Mrini, Cyffers & Bellet's D-GD attack (ICML 2024, §5): with one fixed example per agent
and full-batch steps, tying each non-member's gradient over the rounds
(``knowledge(..., tied=…)``, :func:`privaudit.attacks.gossip_algebra.tie`) lets one attacker at the
end of a line recover agents it never hears — to an error first order in the step size —
while the exact system never reaches past the neighbours; the approximation is refused where
batches are fresh Poisson draws. The coalition's own values are subtracted before solving,
the float rank is taken at the rounding of the equilibrated system, and each victim's
rounding error is estimated: far victims are recovered, symmetric ones stay hidden, and
victims lost to rounding are not claimed."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny

from privaudit.api.gossip import coalition_system, observe_beyond
from privaudit.attacks import gossip_algebra
from privaudit.core.errors import PrivauditError
from privaudit.scenario.topology import build_topology, metropolis_hastings
from privaudit.sim.run import Run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from anchor import (  # noqa: E402
    Forecast,
    anchor_messages,
    attack,
    data,
    dgd,
    gossip_matrix,
    invert,
    linear_model,
    psnr,
    run_anchor,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def line() -> tuple[torch.Tensor, np.ndarray, torch.Tensor, torch.Tensor]:
    """A line 0 – 1 – 2 – 3 – 4 (Metropolis–Hastings W) and one 2×2×2 example per agent."""
    adj = build_topology("line", 5)
    g = torch.Generator().manual_seed(0)
    images = torch.rand(5, 2, 2, 2, generator=g, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 0, 1])
    return adj, metropolis_hastings(adj).numpy(), images, labels


def tied_error(line, lr: float, victim: int = 3) -> float:
    """Relative error of the victim's recovered round-1 gradient, attacker 0, T = 5."""
    adj, W, images, labels = line
    model = linear_model((2, 2, 2), 3, seed=0)
    sent, grads = dgd(model, images, labels, W, lr, rounds=5)
    got = attack(sent, adj, W, lr, [0], "ours")
    g1 = grads[0, victim]
    return float(np.linalg.norm(got[victim] - g1) / np.linalg.norm(g1))


def test_tied_dgd_recovers_a_non_neighbour_and_its_error_grows_with_the_step(line):
    adj, W, _, _ = line
    errs = [tied_error(line, lr) for lr in (1e-6, 1e-4, 1e-2)]
    assert errs[0] < 1e-3  # agent 3 is three hops from the attacker
    assert errs[0] < errs[1] < errs[2]  # first order in η: the drift of the gradients
    assert errs[1] / errs[0] == pytest.approx(100, rel=0.5)
    # without the approximation the same messages never reach past the neighbour
    rec = gossip_algebra.dpsgd(W, 1e-6)
    rows = gossip_algebra.gossip_messages(adj, [0], range(1, 6), own=("x",))
    exact = gossip_algebra.knowledge(rec, [0], rows, rounds=5, known=lambda k: k[0] in rec.public)
    assert gossip_algebra.identifiability(exact).status(("g", 3, 1)) == "hidden"


def test_subtracting_the_true_drift_makes_the_tie_exact_at_any_step(line):
    """drift_shift: with each tied gradient's drift from its round-1 value subtracted from
    the rows, the tied system is the run's own equations: at η = 0.5, where the tie alone is
    far off, every non-member's round-1 gradient comes back to float rounding."""
    adj, W, images, labels = line
    lr = 0.5
    model = linear_model((2, 2, 2), 3, seed=0)
    sent, grads = dgd(model, images, labels, W, lr, rounds=5)
    rec = gossip_algebra.dpsgd(W, lr)
    rows = gossip_algebra.gossip_messages(adj, [0], range(1, 6), own=("x",))
    untied = gossip_algebra.knowledge(
        rec, [0], rows, rounds=5, known=lambda k: k[0] in rec.public or k[1] == 0, cut=True
    )
    tied = gossip_algebra.tie(untied, range(1, 5))
    drift = {("g", k, t): grads[t - 1, k] - grads[0, k] for k in range(1, 5) for t in range(2, 6)}
    known = tied.known_from(sent, lambda key: sent[0, 0])
    keys = [("g", 3, 1), ("g", 4, 1)]
    observed = tied.observed(sent)
    plain = gossip_algebra.solve(tied, observed, known, keys=keys, reference=sent[0, 0])
    shifted = gossip_algebra.solve(
        tied, observed - gossip_algebra.drift_shift(untied, drift), known, keys=keys,
        reference=sent[0, 0],
    )  # fmt: skip
    for i, (_, v, _) in enumerate(keys):
        truth = grads[0, v]
        assert np.linalg.norm(plain.values[i] - truth) > 1e-2 * np.linalg.norm(truth)
        np.testing.assert_allclose(shifted.values[i], truth, atol=1e-9 * np.abs(truth).max())
    assert gossip_algebra.drift_shift(untied, {}).shape == (len(tied.rows), 1)


def test_tied_system_aliases_every_round_and_agrees_with_the_exact_analysis(line):
    adj, W, _, _ = line
    rec = gossip_algebra.dpsgd(W, 0.1)
    rows = gossip_algebra.gossip_messages(adj, [0], range(1, 6), own=("x",))
    s = gossip_algebra.knowledge(
        rec, [0], rows, rounds=5, known=lambda k: k[0] in rec.public, tied=[1, 2, 3, 4]
    )
    assert s.index(("g", 4, 5)) == s.index(("g", 4, 1)) and s.role(("g", 0, 2)) == "unknown"
    assert s.index(("g", 0, 2)) != s.index(("g", 0, 1))  # the coalition's own stay per round
    fl, ex = gossip_algebra.identifiability(s), gossip_algebra.identifiability(s, method="exact")
    assert fl.rank == ex.rank == len(s.unknowns)
    assert fl.keys() == ex.keys()
    # a functional over several rounds' keys adds into the one tied column
    cu = s.functional({("g", 2, 1): 1.0, ("g", 2, 4): 2.0})[0]
    assert cu[s.index(("g", 2, 1))] == 3.0 and cu.sum() == 3.0


def test_tie_is_refused_under_fresh_poisson_batches(tmp_path):
    run = Run.create(tiny("dsgd", agents=5, topology="line", rounds=3), tmp_path / "run")
    with pytest.raises(PrivauditError, match=r"q = .* < 1.*--sampling full"):
        observe_beyond(run, "dsgd-half-model", 1, [0], [3], tie=True, progress=False)


@pytest.fixture(scope="module")
def line35() -> dict:
    """Fig. 6's setting on the bundled photos (one image set, not the benchmark's): a line
    of 35, the attacker at an end, W = I − L/d_max, T = 35, D-GD at η = 1e-5 and 1e-7."""
    n = 35
    images, labels = data("photos", None, n, 100)
    adj = build_topology("line", n)
    W = gossip_matrix(adj, "laplacian")
    model = linear_model((3, 32, 32), int(labels.max()) + 1, seed=100)
    runs = {lr: dgd(model, images, labels, W, lr, n) for lr in (1e-4, 1e-5, 1e-7)}
    return dict(n=n, images=images, labels=labels, adj=adj, W=W, model=model, runs=runs)


def test_the_coalition_knows_its_own_updates_and_states(line):
    """observe_beyond's system subtracts everything the coalition holds: its own gradients
    (and noise) and its states at every round are known variables, its own messages are no
    rows, and only the others' updates are unknowns — solved without ever asking for the
    coalition's gradients (they reach the others only through its recorded states)."""
    adj, W, _, _ = line
    rec = gossip_algebra.dpsgd(W, 0.1)
    s = coalition_system(rec, adj, [0], 0, 5, tie=True)
    assert s.role(("g", 0, 3)) == "known" and s.role(gossip_algebra.state_key("x", 0, 2)) == "known"
    assert {k[1] for k in s.unknowns} == {1, 2, 3, 4} and len(s.unknowns) == 4  # tied
    assert all(m.src != 0 for m in s.rows)  # its own messages are known values, not rows
    rng = np.random.default_rng(0)
    vals = {("x0", k, 0): np.ones(3) for k in range(5)}
    for k in range(1, 5):  # the others' gradients constant: the tie is exact
        g = rng.normal(size=3)
        vals.update({("g", k, t): g for t in range(1, 6)})
    vals.update({("g", 0, t): rng.normal(size=3) for t in range(1, 6)})  # the attacker's vary
    st = gossip_algebra.simulate(rec, 5, vals, d=3)
    public = {("x0", k, 0): np.ones(3) for k in range(5)}  # nothing of the attacker's but x_0
    out = gossip_algebra.solve(s, s.observed(st), s.known_from(st, public), reference=np.ones(3))
    for i, key in enumerate(out.keys):
        np.testing.assert_allclose(out.values[i], vals[key], atol=1e-9)


def test_far_victims_are_recovered_and_subtracting_around_x0_lowers_their_error(line35):
    """The old float cut-off (rtol 1e-9 on unit rows) hid every victim past 11 hops of this
    line, at every η; the default now recovers all but the last at ≥ 20 dB (η = 1e-5; the
    last's estimated rounding error exceeds its signal). Subtracting the coalition's known
    values around x_0 rather than raw lowers the far victims' error where rounding dominates
    it (η = 1e-7, where the tie's own error is ~1e-4)."""
    n, adj, W, model, images = (line35[k] for k in ("n", "adj", "W", "model", "images"))
    sent, grads = line35["runs"][1e-5]
    rows = gossip_algebra.gossip_messages(adj, [0], range(1, n + 1), own=("x",))
    got = attack(sent, adj, W, 1e-5, [0])
    assert sorted(got) == list(range(1, n - 1))  # d = 34: its rounding error exceeds it
    worst = min(psnr(invert(model, sent[0, 0], got[v], (3, 32, 32)), images[v]) for v in got)
    assert worst >= 20
    # rounding-dominated far end: raw subtraction (the old rows' way) against around x_0
    sent, grads = line35["runs"][1e-7]
    rec = gossip_algebra.dpsgd(W, 1e-7)
    s = gossip_algebra.knowledge(
        rec, [0], rows, rounds=n, known=lambda k: k[0] in rec.public or k[1] == 0,
        tied=range(1, n), cut=True,
    )  # fmt: skip
    a = gossip_algebra.identifiability(s)
    keys = [("g", v, 1) for v in range(20, 28)]
    known = s.known_from(sent, lambda k: sent[0, 0])
    raw = gossip_algebra.solve(s, s.observed(sent), known, analysis=a, keys=keys)
    centred = gossip_algebra.solve(
        s, s.observed(sent), known, analysis=a, keys=keys, reference=sent[0, 0]
    )

    def err(out) -> float:
        return sum(np.linalg.norm(out.values[i] - grads[0, k[1]]) for i, k in enumerate(keys))

    assert err(centred) < 0.8 * err(raw)


def test_the_drift_forecast_recovers_the_line_at_a_larger_step(line35):
    """η = 1e-4: the tie's own error hides some far victims of the line below 20 dB; the
    coalition's forecast of the drift (the run re-simulated from the recovered gradients,
    each forecast victim's drift from its own inversion) brings back every victim, and none
    of the truth enters it — the forecast reads only the members' rows of the images."""
    n, adj, W, model, images = (line35[k] for k in ("n", "adj", "W", "model", "images"))
    labels = line35["labels"]
    sent, _ = line35["runs"][1e-4]
    shape = (3, 32, 32)

    def count(got: dict) -> int:
        return sum(
            psnr(invert(model, sent[0, 0], g, shape), images[v]) >= 20 for v, g in got.items()
        )

    first = attack(sent, adj, W, 1e-4, [0])
    blind, blind_labels = images.clone(), labels.clone()
    blind[1:] = torch.rand(blind[1:].shape, generator=torch.Generator().manual_seed(1))
    blind_labels[1:] = (labels[1:] + 1) % (int(labels.max()) + 1)
    predict = Forecast(model, blind, blind_labels, [0], W, 1e-4, n)
    predict_true = Forecast(model, images, labels, [0], W, 1e-4, n)
    for trust in predict.trusts:  # the members' rows only
        np.testing.assert_array_equal(predict(first, trust)[0], predict_true(first, trust)[0])
    corrected = attack(sent, adj, W, 1e-4, [0], drift=predict)
    assert count(first) < count(corrected) == n - 1

    class Wrong(Forecast):  # a solve that explains the messages worse is never used
        def __call__(self, got: dict, trust: float) -> tuple[np.ndarray, np.ndarray]:
            g, states = super().__call__(got, trust)
            return g + np.random.default_rng(0).normal(size=g.shape) * np.abs(g).max(), states

    kept = attack(sent, adj, W, 1e-4, [0], drift=Wrong(model, images, labels, [0], W, 1e-4, n))
    assert kept.keys() == first.keys()
    assert all(np.array_equal(kept[v], first[v]) for v in first)


def test_the_rounding_error_is_estimated_and_victims_lost_to_it_are_not_claimed(line35):
    """η = 1e-7: past ~25 hops the recovered gradient is rounding, not the victim's. The
    estimated error (float_error, from the payloads' unit roundoff and the weights) is
    within 1.5× of the measured one where rounding dominates, and the default keeps the
    victims whose estimate is below their signal: every one it leaves out is below 20 dB,
    every one it keeps with an estimate under 0.2 is above."""
    n, adj, W, model, images = (line35[k] for k in ("n", "adj", "W", "model", "images"))
    sent, grads = line35["runs"][1e-7]
    report: dict[int, float] = {}
    every = attack(sent, adj, W, 1e-7, [0], max_error=None, report=report)
    assert sorted(every) == list(range(1, n))  # all identifiable in the algebra
    for v in (22, 24, 26):  # the tie's error (~1e-4) is far below the rounding here
        measured = np.linalg.norm(every[v] - grads[0, v]) / np.linalg.norm(every[v])
        assert measured / 1.5 < report[v] < 1.5 * measured
    kept = attack(sent, adj, W, 1e-7, [0])
    assert 20 < len(kept) < n - 1 and sorted(kept) == list(range(1, len(kept) + 1))
    shape = (3, 32, 32)
    for v in range(1, n):  # nothing recoverable is hidden, nothing claimed is lost
        p = psnr(invert(model, sent[0, 0], every[v], shape), images[v])
        assert p < 20 if v not in kept else (p >= 20 or report[v] > 0.2), (v, p, report[v])


def test_victims_symmetric_about_the_coalition_stay_hidden():
    """A leaf attacker of a star hears only the centre; the other leaves are interchangeable
    (an automorphism fixing the coalition swaps them), so no cut-off may call them
    identifiable: the float default and the exact analysis agree that only the centre is."""
    adj = build_topology("star", 6)
    W = gossip_matrix(adj, "laplacian")
    rec = gossip_algebra.dpsgd(W, 1e-3)
    rows = gossip_algebra.gossip_messages(adj, [1], range(1, 13), own=("x",))
    s = gossip_algebra.knowledge(
        rec, [1], rows, rounds=12, known=lambda k: k[0] in rec.public or k[1] == 1,
        tied=[0, 2, 3, 4, 5], cut=True,
    )  # fmt: skip
    for method in ("qr", "exact"):
        a = gossip_algebra.identifiability(s, method=method)
        assert [k[1] for k in a.keys("g")] == [0], method
        assert a.status(("g", 3, 1)) == "hidden"
    a = gossip_algebra.identifiability(s)
    assert np.isfinite(a.condition[s.index(("g", 0, 1))])
    assert np.isinf(a.condition[s.index(("g", 2, 1))])


@pytest.mark.skipif(
    not os.environ.get("DECATTACK"), reason="DECATTACK names no decAttack checkout to run"
)
def test_the_anchors_own_code_runs_on_the_same_data_and_messages():
    """benchmarks/anchor.py --decattack: the anchor's own simulation, least squares and
    inversion (in a subprocess, attackers relabelled first) on our images, graph, W, η and
    x_0 produce our messages (to rounding) and, on a short ring, the images privaudit's
    solve inverted by the anchor's own largest-|∂b| row gives."""
    n, lr, members = 6, 1e-4, [0, 3]
    images, labels = data("photos", None, n, 0)
    adj = build_topology("ring", n)
    W = gossip_matrix(adj, "laplacian")
    model = linear_model((3, 32, 32), int(labels.max()) + 1, seed=0)
    sent, _ = dgd(model, images, labels, W, lr, n)
    x0 = torch.from_numpy(sent[0, 0])
    deps = os.environ.get("DECATTACK_DEPS")
    imgs, secs, msgs, perm = run_anchor(
        os.environ["DECATTACK"], deps, images, labels, adj, members, x0, [lr], n
    )
    assert perm[:2] == members and secs[0] > 0
    ours = anchor_messages(sent, adj, perm, len(members))
    assert np.abs(ours - msgs[0]).max() < 1e-10 * np.abs(msgs[0]).max()
    got = attack(sent, adj, W, lr, members, "lstsq")
    for v, im in imgs[0].items():
        mine = invert(model, sent[0, 0], got[v], (3, 32, 32), "row")
        torch.testing.assert_close(im.reshape(3, 32, 32).clamp(0, 1), mine, atol=1e-6, rtol=0)
