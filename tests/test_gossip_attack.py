"""The gossip algebra on real runs (El Mrini, Cyffers & Bellet, ICML 2024): a defense states
its linear recursion once (``Defense.recursion``), and ``observe_beyond`` reconstructs a
coalition's victim — its update and the model it was computed at — from the captured
messages: exactly against the run's secrets where the update is identifiable, with one line
naming the fix where it is not, and with the GLS std where the messages are noised."""

from __future__ import annotations

import pytest
import torch
from conftest import batch_grad, tiny

from privaudit.api.gossip import observe_beyond
from privaudit.api.pipeline import observe
from privaudit.attacks import gossip_algebra
from privaudit.core import recursion
from privaudit.core.errors import PrivauditError, Unobservable
from privaudit.defenses import DEFENSES
from privaudit.scenario.topology import build_topology, metropolis_hastings
from privaudit.sim.run import Run

pytestmark = pytest.mark.usefixtures("one_thread")
REL = 1e-5  # float32 messages; the estimator's gain is ~20–70 (1/η and the mixing)


def flat(d: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.flatten() for v in d.values()])


def true_state(run: Run, v: int, t: int) -> torch.Tensor:
    """Agent v's model after round t − 1: where its round-t gradient was computed (the
    post-gossip model of D-PSGD, θ^{t-1} of gradient tracking)."""
    return run.ctx.x0 if t == 1 else run.train(until=t - 1, progress=False)["x"][v]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def dsgd_line(tmp_path_factory) -> Run:
    """D-PSGD on a line 0 – 1 – 2 – 3 – 4, every round checkpointed (true states)."""
    cfg = tiny("dsgd", agents=5, topology="line", rounds=3, checkpoint_every=1)
    return Run.create(cfg, tmp_path_factory.mktemp("gossip") / "dsgd")


# -- the vocabulary ---------------------------------------------------------------------------
def test_the_recursion_lives_in_core_and_defenses_state_theirs():
    assert (
        gossip_algebra.Recursion is recursion.Recursion and gossip_algebra.dpsgd is recursion.dpsgd
    )
    W = metropolis_hastings(build_topology("ring", 5))
    dsgd = DEFENSES["dsgd"]
    rec = dsgd.recursion(dsgd.Params(lr=0.1), W, 4)
    assert rec.carries == {"half-model": "x"} and rec.update == "g" and not rec.noise
    assert rec.point(2, 0) == {
        ("x", 0, 1): pytest.approx(1 / 3),
        ("x", 1, 1): 1 / 3,
        ("x", 4, 1): 1 / 3,
    }
    dp = DEFENSES["dp-dpsgd"]
    rec = dp.recursion(dp.Params(lr=0.1, clip=2.0, sigma=0.5), W, 4)
    assert rec.noise == {"z": pytest.approx(0.1 * 0.5 * 2.0 / 4)} and rec.facts == {"clip": 2.0}
    assert DEFENSES["dpdl"].recursion(DEFENSES["dpdl"].Params(), W, 4) is None  # not linear
    shifted = rec.shifted(2)
    assert shifted.public == frozenset() and shifted.point(1, 0)[("x", 0, 0)] == pytest.approx(
        1 / 3
    )


# -- D-PSGD: exact where identifiable, one line where not --------------------------------------
def test_dsgd_victim_is_recovered_exactly_and_agrees_with_the_planner(dsgd_line):
    run = dsgd_line
    for v, t in [(1, 2), (3, 1)]:
        (o,) = observe_beyond(run, "dsgd-half-model", t, [0, 2], [v], progress=False)
        x = true_state(run, v, t)
        assert o.batch_size > 0
        torch.testing.assert_close(flat(o.params), x, rtol=0, atol=1e-6)
        assert rel(flat(o.target), batch_grad(run, x, v, t)) < REL
        assert o.noise_std == 0 and o.clip is None and o.scale == o.batch_size / 2
        m = o.meta
        assert (m["src"], m["dst"], m["round"], m["distance"], m["identifiable"]) == (
            v,
            None,
            t,
            1,
            True,
        )
        assert (
            m["threat"].startswith("coalition 0,2 (gossip algebra, ")
            and f"rank {m['rank']}, agent {v}: rounding error " in m["threat"]
        )
        # float32 messages, one hop: rounding leaves ~u·gain of the update, far below it
        assert 0 < m["float_error_rel"] < 1e-4 and m["float_error"] > 0
        (p,) = observe(
            run,
            "dsgd-half-model",
            t,
            threat="coalition",
            attackers=[0, 2],
            victims=[v],
            progress=False,
        )
        assert p.meta["exact"] and rel(flat(o.target), flat(p.target)) < REL
    # a window of the rounds (the recursion restarted, nothing public) gives the same
    (w,) = observe_beyond(run, "dsgd-half-model", 2, [0, 2], [1], rounds_back=1, progress=False)
    assert (
        w.meta["rounds"] == [1, 3]
        and rel(flat(w.target), batch_grad(run, true_state(run, 1, 2), 1, 2)) < REL
    )


def test_dsgd_hides_a_victim_with_an_unheard_neighbour_and_names_the_fix(dsgd_line):
    """Every half-step carries a fresh unknown, so g_v^t = (Σ_j w_vj x̃_j^{t-1} − x̃_v^t)/η is
    identifiable only when the coalition hears v and all of v's neighbours — never two hops
    out, however many rounds it records; the fix it names (v's neighbours) then works."""
    run = dsgd_line
    for v, hops, fix in [(4, "2 hops", "0,2,3"), (3, "1 hop", "0,2,4")]:
        with pytest.raises(Unobservable) as e:
            observe_beyond(run, "dsgd-half-model", 2, [0, 2], [v], progress=False)
        msg = str(e.value)
        assert "\n" not in msg and "rank 6 over 8 unknowns" in msg and "rounds 1..3" in msg
        assert f"{hops} away" in msg and f"--attacker {fix}" in msg
        assert "rounds" not in msg.split(":")[-1]  # no later horizon would help
    (o,) = observe_beyond(run, "dsgd-half-model", 2, [0, 2, 3], [4], progress=False)
    x = true_state(run, 4, 2)
    torch.testing.assert_close(flat(o.params), x, rtol=0, atol=1e-6)
    if o.batch_size:
        assert rel(flat(o.target), batch_grad(run, x, 4, 2)) < REL


def test_errors_are_one_line(dsgd_line, tmp_path):
    run = dsgd_line
    for bad, kw, what in [
        ([0, 2], {"victims": [2]}, "one of the attackers"),
        ([], {}, "coalition"),
        ([0, 9], {}, "0..4"),
        ([0, 2], {"rounds_back": 0}, "rounds_back"),
    ]:
        with pytest.raises(PrivauditError, match=what) as e:
            observe_beyond(run, "dsgd-half-model", 2, bad, progress=False, **kw)
        assert "\n" not in str(e.value)
    other = Run.create(tiny("dpdl", rounds=2), tmp_path / "dpdl")
    with pytest.raises(Unobservable, match="no linear recursion"):
        observe_beyond(other, "dpdl-cg", 1, [0], progress=False)


# -- noise: the estimator's std -----------------------------------------------------------------
def test_dp_dpsgd_reports_sigma_c_over_b(tmp_path):
    """ĝ = clipped mean + N(0, (σC/B)²): the recovered update's error is that noise alone
    (the half-steps it is solved from are observed, noise included), and its spread over the
    model's coordinates is the reported std."""
    sigma, clip, B = 0.5, 1.0, 2
    run = Run.create(
        tiny("dp-dpsgd", agents=5, topology="line", checkpoint_every=1, sigma=sigma), tmp_path / "r"
    )
    for v, t in [(1, 2), (3, 1)]:
        (o,) = observe_beyond(run, "dp-dpsgd-half-model", t, [0, 2], [v], progress=False)
        assert o.noise_std == pytest.approx(sigma * clip / B) and o.clip == clip
        x = true_state(run, v, t)
        torch.testing.assert_close(flat(o.params), x, rtol=0, atol=1e-6)
        err = flat(o.target) - batch_grad(run, x, v, t, clip=clip)
        assert float(err.std()) == pytest.approx(o.noise_std, rel=0.03)  # 62k coordinates
        assert abs(float(err.mean())) < 5 * o.noise_std / err.numel() ** 0.5
        (p,) = observe(
            run,
            "dp-dpsgd-half-model",
            t,
            threat="coalition",
            attackers=[0, 2],
            victims=[v],
            progress=False,
        )
        assert (
            p.noise_std == pytest.approx(o.noise_std) and rel(flat(o.target), flat(p.target)) < REL
        )


# -- gradient tracking: past the neighbourhood ---------------------------------------------------
def test_dsgt_states_its_recursion_and_its_noised_subclasses_do_not():
    W = torch.full((3, 3), 1 / 3, dtype=torch.float64)
    assert DEFENSES["dsgt"].recursion(DEFENSES["dsgt"].Params(lr=0.1), W, 4) is not None
    for name in ("lppa", "dp-dsgt"):
        assert DEFENSES[name].recursion(DEFENSES[name].Params(lr=0.1), W, 4) is None


def test_gradient_tracking_reveals_agents_two_hops_away(tmp_path):
    """DSGT gossips θ and γ, two values per agent and round for one fresh gradient: one
    attacker on a ring of 5 recovers both agents it does not touch, exactly, at their true
    models (rounds t..t+2 of messages), though it receives none of their messages."""
    run = Run.create(
        tiny("dsgt", agents=5, topology="ring", rounds=4, checkpoint_every=1), tmp_path / "r"
    )
    obs = observe_beyond(run, "dsgt-gt", 2, [0], [2, 3], progress=False)
    for o, v in zip(obs, [2, 3], strict=True):
        x = true_state(run, v, 2)
        assert o.meta["distance"] == 2 and o.meta["rounds"] == [1, 4] and o.noise_std == 0
        torch.testing.assert_close(flat(o.params), x, rtol=0, atol=1e-6)
        assert o.batch_size > 0 and rel(flat(o.target), batch_grad(run, x, v, 2)) < REL
    with pytest.raises(Unobservable) as e:  # round 3 needs round 5's messages
        observe_beyond(run, "dsgt-gt", 3, [0], [2], progress=False)
    assert "--rounds 5" in str(e.value) and "\n" not in str(e.value)
