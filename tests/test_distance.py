"""Privacy against graph distance (issue 35, item 2): the white-box audit of a victim beyond
the attackers' neighbourhood, Muffliato's pairwise network-DP bound recomputed from the
paper's definition, and Muffliato's recursion (the gossip attack past the neighbourhood)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import batch_grad, run_cli, tiny
from opacus.accountants.analysis.rdp import get_privacy_spent
from opacus.accountants.rdp import RDPAccountant

from privaudit.api.distance import reach_span, victims_by_distance
from privaudit.api.gossip import observe_beyond
from privaudit.api.pipeline import observe
from privaudit.attacks.gossip_algebra import simulate
from privaudit.core.accounting import gdp_epsilon, pairwise_epsilon, release_epsilon
from privaudit.core.errors import PrivauditError
from privaudit.core.messages import CaptureSpec
from privaudit.defenses import DEFENSES
from privaudit.defenses.muffliato import pairwise_share
from privaudit.experiments.audit import audit
from privaudit.scenario.topology import build_topology, metropolis_hastings
from privaudit.sim.run import Run

pytestmark = pytest.mark.usefixtures("one_thread")


def flat(d: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.flatten() for v in d.values()])


def model_before(run: Run, k: int, t: int) -> torch.Tensor:
    return run.ctx.x0 if t == 1 else run.train(until=t - 1, progress=False)["x"][k]


# -- the audit beyond the neighbourhood ---------------------------------------------------------
def test_distance_audit_of_a_non_neighbour_is_sound_and_its_shift_arrives_on_time(tmp_path):
    """DP-D-PSGD on a ring of 6, attacker 0, victim 2 (two hops): the canary in the victim's
    round-1 batch first changes what agent 0 receives in round 2 (one hop per round), so the
    measured shift of the observation is exactly 0 in round 1 and non-zero in round 2; with
    span 0 the audit is refused with that fix. The lower bound stays below the local-DP bound
    of the two releases composed (a correct mechanism is never "violated")."""
    run = Run.create(tiny("dp-dpsgd", agents=6, epsilon=None, sigma=1.0), tmp_path / "r")
    kw = dict(attackers=[0], victim=2, canary_norm=1.0, canary_shape="dirac", progress=False)
    with pytest.raises(PrivauditError, match=r"raise --span \(try 1\)") as e:
        audit(run, "dp-dpsgd-half-model", trials=64, **kw)
    assert "\n" not in str(e.value) and "2 hops away" in str(e.value)
    res = audit(run, "dp-dpsgd-half-model", trials=300, span=1, **kw).to_dict()
    assert res["beyond"] and res["distance"] == 2 and res["receiver"] is None
    (cand,) = res["search"]["candidates"]
    assert cand["shift"][0] == 0.0 and cand["shift"][1] > 0
    assert res["copies"] == 2  # the victim's releases of rounds 1 and 2
    assert res["upper"]["accountant"] == pytest.approx(release_epsilon(1.0 / math.sqrt(2), 1e-5))
    assert 0 <= res["epsilon_lo"] <= res["upper"]["accountant"]
    assert res["verdict"] != "violated" and "pairwise" not in res["upper"]
    assert reach_span(run, "dp-dpsgd-half-model", 1, [0], 2) == 1
    assert reach_span(run, "dp-dpsgd-half-model", 1, [0], 3) == 2


def test_muffliato_reaches_within_the_round_and_is_held_to_its_pairwise_bound(tmp_path):
    """Muffliato's K gossip steps carry round 1's noised model K hops within round 1, so a
    victim two hops from agent 0 is audited with span 0 (the shift is already non-zero);
    the audit reports the pairwise network-DP bound over that round beside the local one."""
    cfg = tiny("muffliato", agents=6, epsilon=None, sigma=1.0, params={"enforce": True})
    run = Run.create(cfg, tmp_path / "m")
    assert reach_span(run, "muffliato-model", 1, [0], 2) == 0
    res = audit(
        run, "muffliato-model", trials=200, attackers=[0], victim=2, progress=False
    ).to_dict()
    (cand,) = res["search"]["candidates"]
    assert res["beyond"] and res["span"] == 0 and cand["shift"][0] > 0
    priv = DEFENSES["muffliato"].privacy(run.params, "model", run.ctx.W.cpu(), 2)
    S = priv.pairwise([0])
    assert res["accounting"]["pairwise_share"] == pytest.approx(S)
    assert res["upper"]["pairwise"] == pytest.approx(pairwise_epsilon(priv, [0], 1e-5, 1))
    # two hops on a ring of 6: agent 0 solves the gossip equations for y⁰_2 (S = 1), so the
    # exact view is one local release, converted exactly
    z = priv.noise_multiplier
    assert S == pytest.approx(1.0)
    assert res["upper"]["pairwise"] == pytest.approx(gdp_epsilon(1 / z, 1e-5))
    assert res["upper"]["pairwise"] <= res["upper"]["accountant"] + 0.02
    assert res["epsilon_lo"] <= res["upper"]["pairwise"]
    assert res["verdicts"]["pairwise"] != "violated" and res["verdict"] != "violated"


# -- Muffliato's pairwise bound, from the paper's definition ------------------------------------
def line3() -> torch.Tensor:
    """Metropolis–Hastings on the line 0 – 1 – 2: degrees 1, 2, 1."""
    W = metropolis_hastings(build_topology("line", 3))
    third = 1 / 3
    hand = torch.tensor(
        [[2 * third, third, 0], [third, third, third], [0, third, 2 * third]], dtype=torch.float64
    )
    torch.testing.assert_close(W, hand)
    return W


def test_pairwise_share_by_hand():
    """S_{v→u} = Σ_{k<K} Σ_{w∈N_u} P_k(W)_{wv}² / ‖P_k(W)_w‖² (Cyffers et al. 2022, Thm 1).
    Line 0 – 1 – 2, observer 0 hears only agent 1, whose row of W is (1/3, 1/3, 1/3) and
    whose row of W² is (1/3, 1/3, 1/3) again."""
    W = line3()
    # K = 2 plain gossip: k = 0 gives 0 (agent 1's own y⁰ has no part of agent 2), k = 1 gives
    # (1/3)² / (3 · (1/3)²) = 1/3
    assert pairwise_share(W, 2, None, victim=2, observers=[0]) == pytest.approx(1 / 3)
    # a neighbour: 1 (its own y⁰) + 1/3
    assert pairwise_share(W, 2, None, victim=1, observers=[0]) == pytest.approx(4 / 3)
    # K = 3 with Chebyshev weight ω: P_2 = ωW² + (1 − ω)I, row 1 = (ω/3, ω/3 + 1 − ω, ω/3)
    w = 1.2
    k2 = (w / 3) ** 2 / (2 * (w / 3) ** 2 + (w / 3 + 1 - w) ** 2)
    assert pairwise_share(W, 3, w, victim=2, observers=[0]) == pytest.approx(1 / 3 + k2)
    # a coalition {0, 2} hears agent 1 once ("heard"), or twice ("all-copies")
    assert pairwise_share(W, 2, None, 1, [0, 2]) == pytest.approx(4 / 3)
    assert pairwise_share(W, 2, None, 1, [0, 2], senders="all-copies") == pytest.approx(8 / 3)
    with pytest.raises(PrivauditError, match="observers"):
        pairwise_share(W, 2, None, 0, [0])


def test_pairwise_epsilon_exact_view_and_the_papers_renyi_bound():
    """The defense's privacy facts carry both shares (enforce: formal; multiplier σ for
    "add-remove"). The exact view's ε is μ-GDP with μ = √(R·S)/z, converted exactly; the
    paper's theorem is α·R·S/(2z²) at every order, converted to (ε, δ) by opacus — each
    recomputed here from its definition."""
    W = line3()
    d = DEFENSES["muffliato"]
    p = d.Params(gossip_steps=2, chebyshev=False, enforce=True, sigma=2.0)
    priv = d.privacy(p, "model", W, agent=2)
    assert priv.formal and priv.noise_multiplier == 2.0
    z, R, delta = 2.0, 3, 1e-5
    assert priv.pairwise([0]) == pytest.approx(1.0)  # agent 0 solves for y⁰_2
    assert priv.pairwise_paper([0]) == pytest.approx(1 / 3)
    assert pairwise_epsilon(priv, [0], delta, R) == pytest.approx(
        gdp_epsilon(math.sqrt(R) / z, delta)
    )
    orders = RDPAccountant.DEFAULT_ALPHAS
    rdp = [R * a * (1 / 3) / (2 * z**2) for a in orders]
    want, _ = get_privacy_spent(orders=orders, rdp=rdp, delta=delta)
    paper = pairwise_epsilon(priv, [0], delta, R, claimed=True, theorem=True)
    assert paper == pytest.approx(want, rel=1e-6)
    assert paper < pairwise_epsilon(priv, [0], delta, R)  # the theorem is below the exact view
    # without enforce nothing bounds the sensitivity: ∞, while the paper's count is finite
    loose = d.privacy(d.Params(gossip_steps=2, chebyshev=False, sigma=2.0), "model", W, 2)
    assert math.isinf(pairwise_epsilon(loose, [0], delta, R))
    assert pairwise_epsilon(loose, [0], delta, R, claimed=True, theorem=True) == pytest.approx(
        want, rel=1e-6
    )


# -- Muffliato's recursion ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def muffliato_line(tmp_path_factory) -> Run:
    cfg = tiny(
        "muffliato", agents=5, topology="line", rounds=3, checkpoint_every=1, epsilon=None, sigma=0
    )
    return Run.create(cfg, tmp_path_factory.mktemp("muff") / "line")


def test_muffliato_recursion_predicts_every_message(muffliato_line):
    """Noise-free Muffliato on a line of 5 (K Chebyshev steps): the recursion, fed the true
    batch gradients at the true models, gives every message of every gossip step."""
    run = muffliato_line
    n, T = 5, 3
    rec = DEFENSES["muffliato"].recursion(run.params, run.ctx.W.cpu(), run.cfg.batch_size)
    K = len(rec.state)
    assert K >= 3 and rec.carries["model"] == "x" and rec.carries[f"model@{K}"] == f"y{K - 1}"
    msgs = run.messages(CaptureSpec.of(rounds=range(1, T + 1), links=run.edges()), progress=False)
    x0 = run.ctx.x0.double()
    values = {("x0", k, 0): x0 for k in range(n)}
    for t in range(1, T + 1):
        for k in range(n):
            values[("g", k, t)] = batch_grad(run, model_before(run, k, t), k, t).double()
    states = simulate(rec, T, values, d=x0.numel())
    kinds = {kind: rec.component(c) for kind, c in rec.carries.items()}
    seen = 0
    for (t, src, _, kind), payload in msgs.items():
        want = torch.from_numpy(states[t, kinds[kind] * n + src])
        err = float((payload.double() - want).norm() / want.norm())
        assert err < 1e-5, (t, src, kind, err)
        seen += 1
    assert seen == T * len(run.edges()) * K


def test_muffliato_gossip_attack_reaches_past_the_neighbourhood(muffliato_line, tmp_path):
    """One attacker at the end of the line recovers agents 2, 3 hops away exactly (no
    noise), through the pipeline's fallback (``privaudit attack --threat coalition``); with
    noise the recovered update's error is z/η, of std σs/η = σG/B."""
    run = muffliato_line
    for v, t in [(3, 1), (2, 2)]:
        (o,) = observe(
            run,
            "muffliato-model",
            t,
            threat="coalition",
            attackers=[0],
            victims=[v],
            progress=False,
        )
        x = model_before(run, v, t)
        assert o.meta["distance"] == v and o.noise_std == 0
        torch.testing.assert_close(flat(o.params), x, rtol=0, atol=1e-6)
        g = batch_grad(run, x, v, t)
        assert float((flat(o.target) - g).norm() / g.norm()) < 1e-4
    sigma, B = 1.0, 2
    noisy = Run.create(
        tiny(
            "muffliato",
            agents=5,
            topology="line",
            rounds=3,
            checkpoint_every=1,
            epsilon=None,
            sigma=sigma,
        ),
        tmp_path / "noisy",
    )
    (o,) = observe_beyond(noisy, "muffliato-model", 1, [0], [3], progress=False)
    assert o.noise_std == pytest.approx(sigma * 1.0 / B)
    err = flat(o.target) - batch_grad(noisy, noisy.ctx.x0, 3, 1)
    assert float(err.std()) == pytest.approx(o.noise_std, rel=0.03)


def test_cli_attack_and_audit_beyond_the_neighbourhood(tmp_path, capsys):
    """``privaudit audit --attacker 0 --victim 3`` on a ring of 6 audits what agent 0
    receives; a span too short for the distance is one error line naming the fix."""
    base = ["--agents", "6", "--no-progress", "--rounds", "3"]
    code, _, err = run_cli(
        capsys,
        "audit",
        "--target",
        "dsgd-half-model",
        "--attacker",
        "0",
        "--victim",
        "3",
        "--trials",
        "64",
        "--out",
        str(tmp_path / "a"),
        *base,
    )
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--span (try 2)" in err
    code, out, _ = run_cli(
        capsys,
        "audit",
        "--target",
        "dsgd-half-model",
        "--attacker",
        "0",
        "--victim",
        "3",
        "--span",
        "2",
        "--trials",
        "64",
        "--out",
        str(tmp_path / "b"),
        *base,
    )
    assert code == 0 and "victim 3 hops away" in out and "no guarantee" in out


def test_victims_by_distance():
    adj = build_topology("ring", 8)
    assert victims_by_distance(adj, 0) == {1: 1, 2: 2, 3: 3, 4: 4}
    assert victims_by_distance(adj, 2, [2, 9]) == {2: 0}
    assert np.array_equal(adj.sum(1).numpy(), np.full(8, 2))
