"""Threat models: the (target × threat) matrix, and the exact identities each richer View
unlocks (momentum difference, tracking difference, push-sum de-biasing, repeated copies)."""

from __future__ import annotations

import functools
import math

import conftest
import pytest
import torch
from conftest import batch_grad

from privaudit.api.pipeline import observe
from privaudit.attacks import run_attack
from privaudit.attacks.common import gradient_fn, one_hot, problem
from privaudit.cli import main
from privaudit.core.errors import PrivauditError
from privaudit.core.threat import build_threat
from privaudit.defenses import DEFENSES
from privaudit.sim.run import Run

THREATS = {"link": {}, "neighbor": {}, "coalition": {"attackers": [1, 3]}, "global": {}}


tiny = functools.partial(conftest.tiny, checkpoint_every=1)


def flat(obs_dict: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.flatten() for v in obs_dict.values()])


@pytest.mark.parametrize("defense", sorted(DEFENSES))
def test_every_target_under_every_threat_runs_or_names_one_that_can(defense, tmp_path):
    run = Run.create(tiny(defense), tmp_path / "r")
    for kind in DEFENSES[defense].kinds:
        target = f"{defense}-{kind}"
        for threat, kw in THREATS.items():
            try:
                obs = observe(run, target, 2, threat=threat, victims=[0], progress=False, **kw)
            except PrivauditError as e:
                assert "--threat" in str(e) and "\n" not in str(e), (target, threat, str(e))
                continue
            (o,) = obs
            assert o.meta["threat"].split()[0] == threat and o.meta["src"] == 0
            # the attacker is told the realised size of the victim's Poisson batch
            b = len(run.secret_index(2, 0))
            assert o.batch_size == b
            if b == 0:  # an empty batch: nothing to reconstruct
                assert o.scale == 0
            (rec,) = run_attack("ig", obs, iterations=1)
            assert rec.images.shape == (b, *run.data.input_shape)


def test_global_sees_more_exactly_than_a_link(tmp_path):
    """dsgd at round 2: x^i_1 = Σ_j w_ij x̃^j_1 needs every neighbour's half-step; a link has
    one of two, a global observer all, and then the target is ∇F_i(x^i_1; ξ_2) exactly."""
    run = Run.create(tiny("dsgd"), tmp_path / "r")
    (lk,) = observe(run, "dsgd-half-model", 2, threat="link", victims=[0], progress=False)
    (gl,) = observe(run, "dsgd-half-model", 2, threat="global", victims=[0], progress=False)
    assert lk.meta["exact"] is False and gl.meta["exact"] is True
    x1 = run.train(until=1, progress=False)["x"][0]
    torch.testing.assert_close(flat(gl.params), x1, rtol=0, atol=1e-6)
    torch.testing.assert_close(flat(gl.target), batch_grad(run, x1, 0, 2), rtol=1e-3, atol=1e-5)
    assert float((flat(lk.params) - x1).abs().max()) > 1e-4  # the link's approximation


def test_momentum_difference_is_exact_under_global_and_isolates_the_self_gradient(tmp_path):
    """nd (no noise), round 2: ṽ^i_2 − β Σ_j w_ij ṽ^j_1 = g̃^i_2 exactly; subtracting the
    intercepted cross-gradients leaves (coef_ii + α Σ_j w_ij C^{ij}) ĝ^{ii} — parallel to the
    victim's own batch gradient."""
    run = Run.create(tiny("nd"), tmp_path / "r")
    for kind in ("mm", "half-model"):
        (o,) = observe(run, f"nd-{kind}", 2, threat="global", victims=[0], progress=False)
        assert o.meta["exact"] is True and o.meta["removed_cg_from"] == [1, 3]
        x1 = run.train(until=1, progress=False)["x"][0]
        g = batch_grad(run, x1, 0, 2)
        cos = torch.nn.functional.cosine_similarity(flat(o.target), g, dim=0)
        assert float(cos) > 0.9999
        ratio = float(flat(o.target).norm() / g.norm())
        p = run.params
        coef = 1 / (math.sqrt(float(run.ctx.W[0, 0])) * 4)  # cross_coef "sqrt"
        assert coef + p.calib_alpha * 0.2689 < ratio < coef + p.calib_alpha * 0.7311
    (lk,) = observe(run, "nd-mm", 2, threat="link", victims=[0], progress=False)
    assert lk.meta["exact"] is False and lk.meta["removed_cg_from"] == [1]


def test_tracking_difference_is_exact_with_every_neighbour_seen(tmp_path):
    """dsgt round 3 under global: γ_i^2 − Σ_j w_ij γ_j^1 = ∇L(θ_i^2; ξ_3) − ∇L(θ_i^1; ξ_2), a
    two-batch Observation whose second term sits at θ_i^1; IG's batched gradient of the true
    batches in both slots reproduces the target (seed 1: agent 0's Poisson batches of rounds
    2 and 3 have the same size, so both fit the attack's slots)."""
    run = Run.create(tiny("dsgt", seed=1), tmp_path / "r")
    (o,) = observe(run, "dsgt-gt", 3, threat="global", victims=[0], progress=False)
    assert len(run.secret_index(3, 0)) == len(run.secret_index(2, 0)) > 0
    assert o.meta["exact"] is True and len(o.terms) == 1
    theta2, theta1 = flat(o.params), flat(o.terms[0][0])
    want = batch_grad(run, theta2, 0, 3) - batch_grad(run, theta1, 0, 2)
    torch.testing.assert_close(flat(o.target), want, rtol=1e-3, atol=1e-5)
    prob, slot_obs = problem([o], 1, None)
    assert prob.slots == 2 and len(slot_obs) == 2
    images = torch.stack([run.secret_batch(t, 0)[0] for t in (3, 2)]).float()
    labels = [run.secret_batch(t, 0)[1] for t in (3, 2)]
    g = prob.gradient(gradient_fn(prob.stack), images, one_hot(labels, prob.stack, 1))
    torch.testing.assert_close(g[0], prob.target[0], rtol=1e-3, atol=1e-5)


def test_the_attacker_is_told_the_realised_batch_sizes(tmp_path):
    """dsgt round 3 under global, agent 0's batches of 1 (round 3) and 5 (round 2) examples
    (B = 2): the Observation reconstructs 1 image at scale 1/2 and the round-2 term's
    coefficient is −5/1, so that target = scale · (mean gradient of ξ_3 + coef · mean
    gradient of ξ_2), each mean over its own realised batch."""
    run = Run.create(tiny("dsgt", seed=0), tmp_path / "r")
    (o,) = observe(run, "dsgt-gt", 3, threat="global", victims=[0], progress=False)
    b3, b2 = len(run.secret_index(3, 0)), len(run.secret_index(2, 0))
    assert (b3, b2) == (1, 5)
    assert o.batch_size == b3 and o.scale == pytest.approx(b3 / 2)
    (theta1, coef, same), theta2 = o.terms[0], flat(o.params)
    assert coef == pytest.approx(-b2 / b3) and same is False
    assert o.meta["term_rounds"] == [2]
    mean3 = batch_grad(run, theta2, 0, 3) * 2 / b3  # batch_grad is (1/B) Σ over the batch
    mean2 = batch_grad(run, flat(theta1), 0, 2) * 2 / b2
    want = o.scale * (mean3 + coef * mean2)
    torch.testing.assert_close(flat(o.target), want, rtol=1e-3, atol=1e-5)


def test_an_empty_victim_batch_has_nothing_to_reconstruct(tmp_path):
    """dsgd round 1, seed 4: agent 3's Poisson batch is empty. Its message carries a zero
    gradient, the Observation has batch size 0 and scale 0, and the attack pipeline answers
    it with an empty reconstruction, scored None, not a crash."""
    from privaudit.api.pipeline import reconstruct

    run = Run.create(tiny("dsgd", seed=4), tmp_path / "r")
    (o,) = observe(run, "dsgd-half-model", 1, threat="link", victims=[3], progress=False)
    assert len(run.secret_index(1, 3)) == 0
    assert o.batch_size == 0 and o.scale == 0
    assert float(flat(o.target).abs().max()) == 0  # (x_0 − x̃)/η with x̃ = x_0 − η · 0
    (rec,) = run_attack("ig", [o], iterations=1)
    assert rec.images.shape == (0, *run.data.input_shape) and rec.meta["empty"]
    kw = dict(threat="link", iterations=1, lpips=False, progress=False)
    a = reconstruct(run, "dsgd-half-model", 1, victims=[3, 0], **kw)
    sizes = a.result.batch_sizes
    assert sizes == [0, len(run.secret_index(1, 0))] and sizes[1] > 0
    assert a.recons[1].images.shape[0] == sizes[1]
    assert a.result.per_observation[0]["psnr"] is None
    assert a.result.metrics["psnr"] == a.result.per_observation[1]["psnr"]


def test_push_sum_debiasing_is_exact_when_both_pairs_are_seen(tmp_path):
    """constd2p, σ = 0, round 2: a global observer rebuilds x_0^1 from round 1's two pairs
    into agent 0, so the target is ∇f(z; ξ_2) at z = x/w exactly; a link cannot."""
    run = Run.create(tiny("constd2p", sigma=0.0), tmp_path / "r")
    (gl,) = observe(run, "constd2p-half-model", 2, threat="global", victims=[0], progress=False)
    (lk,) = observe(run, "constd2p-half-model", 2, threat="link", victims=[0], progress=False)
    assert gl.meta["exact"] is True and lk.meta["exact"] is False
    state = run.train(until=1, progress=False)
    z = state["x"][0] / state["w"][0]
    torch.testing.assert_close(flat(gl.params), z, rtol=0, atol=1e-6)
    torch.testing.assert_close(flat(gl.target), batch_grad(run, z, 0, 2), rtol=1e-3, atol=1e-5)


def test_a_coalition_averages_the_repeated_releases_of_one_batch(tmp_path):
    """dpdl-cg, round 1 (every model is x_0): agents 1 and 3 each receive a copy of agent 0's
    noised cross-gradient; their average has noise std σC/(B√2) and is still exact."""
    run = Run.create(tiny("dpdl", epsilon=4.0), tmp_path / "r")
    msgs = run.messages(run_capture(run, 1), progress=False)
    (one,) = observe(run, "dpdl-cg", 1, threat="neighbor", attackers=[1], victims=[0])
    (avg,) = observe(run, "dpdl-cg", 1, threat="coalition", attackers=[1, 3], victims=[0])
    assert avg.meta["copies"] == 2 and avg.meta["exact"] is True
    assert avg.noise_std == pytest.approx(one.noise_std / math.sqrt(2)) and one.noise_std > 0
    both = (msgs[(1, 0, 1, "cg")] + msgs[(1, 0, 3, "cg")]) / 2
    torch.testing.assert_close(flat(avg.target), both)


def test_a_stronger_observer_never_observes_a_cross_gradient_less_exactly(tmp_path):
    """nd-cg, round 3 (the neighbours' models differ): copies of agent 0's batch at other
    receivers' models are left out, not averaged at a mean model, so the global observer's
    Observation is the link's — exact, at agent 1's model — and not an approximation."""
    run = Run.create(tiny("nd"), tmp_path / "r")
    (lk,) = observe(run, "nd-cg", 3, threat="link", victims=[0], progress=False)
    (gl,) = observe(run, "nd-cg", 3, threat="global", victims=[0], progress=False)
    assert lk.meta["exact"] is True and gl.meta["exact"] is True
    assert "left_out" in gl.meta or gl.meta.get("copies", 1) > 1
    torch.testing.assert_close(flat(gl.params), flat(lk.params), rtol=0, atol=0)
    torch.testing.assert_close(flat(gl.target), flat(lk.target), rtol=0, atol=0)


def run_capture(run: Run, t: int):
    from privaudit.core.messages import CaptureSpec

    return CaptureSpec.of(rounds=[t])


def test_lppa_offset_hides_gamma0_from_a_link_but_not_from_a_neighbour(tmp_path):
    """Complete graph of 4: a link knows 2 of the 6 shares of d_0, so γ_0^0 stays offset; a
    neighbour sees every γ_j^0 and γ_0^1, and the round-2 difference with roles swapped,
    Σ_j w_0j γ_j^0 − γ_0^1 = ∇L(x_0; ξ_1) − ∇L(θ_0^1; ξ_2), is exact — the offset cancels."""
    run = Run.create(tiny("lppa", topology="complete", params={"beta": 0.2}), tmp_path / "r")
    (lk,) = observe(run, "lppa-gt", 1, threat="link", victims=[0], progress=False)
    assert lk.meta["exact"] is False and "offset" in lk.meta
    assert lk.noise_std == pytest.approx(0.2 * math.sqrt(2 * 4))
    (nb,) = observe(run, "lppa-gt", 1, threat="neighbor", attackers=[1], victims=[0])
    assert nb.meta["exact"] is True and nb.noise_std == 0 and len(nb.terms) == 1
    theta1 = flat(nb.terms[0][0])
    want = batch_grad(run, run.ctx.x0, 0, 1) - batch_grad(run, theta1, 0, 2)
    torch.testing.assert_close(flat(nb.target), want, rtol=1e-3, atol=1e-5)
    (r2,) = observe(run, "lppa-gt", 2, threat="neighbor", attackers=[1], victims=[0])
    assert r2.meta["exact"] is True and r2.noise_std == 0


def test_threat_errors_are_one_line_and_name_the_fix(tmp_path):
    run = Run.create(tiny("dsgd", agents=6), tmp_path / "r")
    cases = [
        (dict(threat="neighbor", attackers=[3], victims=[0]), "--attacker"),  # not adjacent
        (dict(threat="coalition", attackers=[0, 1], victims=[0]), "--victim"),
        (dict(threat="gossip", victims=[0]), "link"),
    ]
    for kw, fix in cases:
        with pytest.raises(PrivauditError, match=fix) as e:
            observe(run, "dsgd-half-model", 1, progress=False, **kw)
        assert "\n" not in str(e.value)
    with pytest.raises(PrivauditError, match="--link SRC,DST"):
        build_threat("link")
    with pytest.raises(PrivauditError, match="--attacker A,B"):
        build_threat("coalition")
    (o,) = observe(run, "dsgd-half-model", 1, threat="coalition", victims=[0], progress=False)
    assert o.meta["threat"] == "coalition 1,5"  # default: everyone the victim sends to


def test_cli_picks_the_weakest_adversary_and_takes_attackers(tmp_path, capsys):
    base = ["attack", "--agents", "4", "--rounds", "3", "--batch-size", "1", "--no-progress"]
    fast = ["--iterations", "2", "--no-lpips"]
    code = main([*base, "--target", "dsgt-gt", "--round", "2", "--out", str(tmp_path / "a"), *fast])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "threat: link 0<->1 — the weakest adversary" in out
    code = main(
        [*base, "--target", "dsgt-gt", "--round", "3", "--threat", "coalition", "--attacker",
         "1,3", "--victim", "0,2", "--out", str(tmp_path / "b"), *fast]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "under coalition 1,3 (links [[0, 1], [2, 1]])" in out
    code = main(
        [*base, "--target", "dsgt-gt", "--round", "2", "--attacker", "3", "--out",
         str(tmp_path / "c"), *fast]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0 and "under neighbor 3 (links [[0, 3]])" in out, err
    code = main([*base, "--target", "dsgt-gt", "--round", "2", "--threat", "spy", *fast])
    _, err = capsys.readouterr()
    assert code == 2 and "unknown threat model" in err and err.count("\n") == 1
