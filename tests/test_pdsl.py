"""PDSL: Shapley values (exact and Monte-Carlo), the weights π of eq. (20), message
orientation and noise, one round recomputed from the secrets, the public and private
validation sets, and the privacy facts each implies."""

from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch
from conftest import batch_grad, tiny

from privaudit.api.pipeline import observe
from privaudit.core.context import params_of
from privaudit.core.errors import PrivauditError
from privaudit.core.messages import CaptureSpec
from privaudit.defenses import get_defense
from privaudit.defenses.pdsl import code_bits, exact_shapley, shapley, shapley_weights
from privaudit.grads import clip_rows
from privaudit.scenario.data import load_dataset, validation_indices
from privaudit.scenario.topology import metropolis_hastings
from privaudit.sim.run import Run


def table_of(v, m: int) -> torch.Tensor:
    """v(frozenset) → table indexed by bitmask, float64."""
    members = code_bits(torch.arange(1 << m), m).bool()
    values = [v(frozenset(torch.nonzero(b).flatten().tolist())) for b in members]
    return torch.tensor(values, dtype=torch.float64)


def permutation_shapley(v, m: int) -> list[float]:
    """Eq. (7), by enumerating all m! orders."""
    phi = [0.0] * m
    orders = list(itertools.permutations(range(m)))
    for order in orders:
        before: set[int] = set()
        for j in order:
            phi[j] += (v(frozenset(before | {j})) - v(frozenset(before))) / len(orders)
            before.add(j)
    return phi


WEIGHTS, QUOTA = (4, 3, 2, 1), 6


def voting(s: frozenset) -> float:
    return float(sum(WEIGHTS[j] for j in s) >= QUOTA)


def lookup(table: torch.Tensor, batch: int):
    """A value function over membership masks for ``shapley`` from a bitmask table."""
    m = int(table.shape[-1]).bit_length() - 1

    def value(masks: torch.Tensor) -> torch.Tensor:
        codes = (masks.long() << torch.arange(m)).sum(-1)
        return table.expand(batch, -1).gather(1, codes)

    return value


def test_exact_shapley_matches_the_permutation_definition_and_an_additive_game():
    # weighted voting game [6; 4, 3, 2, 1]: Shapley–Shubik indices 5/12, 1/4, 1/4, 1/12
    table = table_of(voting, 4)
    phi = exact_shapley(table)
    torch.testing.assert_close(phi, torch.tensor(permutation_shapley(voting, 4)).double())
    torch.testing.assert_close(phi, torch.tensor([5 / 12, 3 / 12, 3 / 12, 1 / 12]).double())
    # additive game v(S) = Σ a_j + c·[S ≠ ∅]: φ_j = a_j + c/m (the v(∅) offset is shared)
    a = [0.3, -0.1, 0.7, 0.05]
    additive = table_of(lambda s: sum(a[j] for j in s) + 0.5 * bool(s), 4)
    torch.testing.assert_close(exact_shapley(additive), torch.tensor(a).double() + 0.125)
    # batched over games, and through the generic entry point
    both = torch.stack([table, additive])
    torch.testing.assert_close(shapley(lookup(both[:1], 1), 1, 4, "exact")[0], phi)
    torch.testing.assert_close(exact_shapley(both)[1], exact_shapley(additive))


def test_monte_carlo_shapley_converges_to_exact():
    table = table_of(voting, 4)
    exact = exact_shapley(table)
    gen = torch.Generator().manual_seed(0)
    R = 4000
    mc = shapley(lookup(table, 3), 3, 4, "mc", permutations=R, generator=gen)
    # each permutation's marginal is 0 or 1: the estimate's std is ≤ 0.5/√R per player
    assert (mc - exact).abs().max() < 4 * 0.5 / math.sqrt(R)
    # efficiency holds per permutation: Σ_j φ_j = v(all) − v(∅) exactly, for any R
    few = shapley(lookup(table, 5), 5, 4, "mc", permutations=3, generator=gen)
    torch.testing.assert_close(few.sum(-1), torch.ones(5, dtype=torch.float64))
    assert not torch.allclose(few, exact.expand(5, -1))  # 3 permutations are not enough


def test_weights_are_min_max_normalised_and_divided_by_omega():
    phi = torch.tensor([[0.2, 0.5, 0.3], [0.1, 0.1, 0.1]], dtype=torch.float64)
    omega = torch.tensor([[0.5, 0.25, 0.25], [0.4, 0.3, 0.3]], dtype=torch.float64)
    hat, pi = shapley_weights(phi, omega)
    torch.testing.assert_close(hat[0], torch.tensor([0.0, 1.0, 1 / 3], dtype=torch.float64))
    # π = φ̂/(ω Σφ̂): Σφ̂ = 4/3
    torch.testing.assert_close(pi[0], torch.tensor([0.0, 3.0, 1.0], dtype=torch.float64))
    # 0/0 guard: all φ equal → φ̂ = 1, π_j = 1/(ω_j m)
    torch.testing.assert_close(hat[1], torch.ones(3, dtype=torch.float64))
    torch.testing.assert_close(pi[1], 1 / (3 * omega[1]))
    # as written, Σ_j ω_j π_j = 1 (so Σ_j π_j ≈ 1/ω), and the minimum player gets 0
    torch.testing.assert_close((omega * pi).sum(-1), torch.ones(2, dtype=torch.float64))
    # padding slots are ignored by min/max and get π = 0; a tolerance widens the tie
    mask = torch.tensor([[True, True, False]])
    hat, pi = shapley_weights(torch.tensor([[0.3, 0.2, -5.0]]), torch.ones(1, 3), mask)
    torch.testing.assert_close(pi, torch.tensor([[1.0, 0.0, 0.0]]))
    _, pi = shapley_weights(torch.tensor([[0.3, 0.3 + 1e-7]]), torch.ones(1, 2), tol=1e-6)
    torch.testing.assert_close(pi, torch.tensor([[0.5, 0.5]]))


def clipped(run: Run, flat: torch.Tensor, agent: int, t: int, clip: float) -> torch.Tensor:
    """Flat-clipped batch-mean gradient of ``agent``'s round-t batch at ``flat``."""
    return clip_rows(batch_grad(run, flat, agent, t)[None], clip)[0]


@pytest.mark.parametrize("validation", ["public", "private"])
def test_cg_is_senders_batch_at_receivers_model_and_rounds_recompute(tmp_path, validation):
    """σ = 0: cg on i→j is clip_C(∇F_i(x_j; ξ_i)); û_i = α u_i + Σ_j π_ij ĝ_{j,i} with π
    from an independent exact-Shapley recomputation (eq. 7) on the validation set: the
    public one (the same images for every agent) or the agent's own held-out examples."""
    clip, lr = 0.2, 5.0  # gradients have norm ≈ 25: clipping is active; big steps break ties
    params = {"clip": clip, "shapley": "exact", "lr": lr, "validation": validation}
    run = Run.create(tiny("pdsl", sigma=0.0, params=params), tmp_path / "r")
    msgs = run.messages(CaptureSpec.of(rounds=[1, 2]), progress=False)
    assert {k[3] for k in msgs} == {"model", "cg", "mm", "half-model"}
    for src, dst in run.edges():
        got = msgs[(2, src, dst, "cg")]
        torch.testing.assert_close(got, clipped(run, msgs[(2, dst, src, "model")], src, 2, clip))
        assert float(got.norm()) == pytest.approx(clip, rel=1e-4)
        wrong = clipped(run, msgs[(2, src, dst, "model")], dst, 2, clip)
        assert not torch.allclose(got, wrong, atol=1e-6)
        u = (msgs[(2, src, dst, "model")] - msgs[(2, src, dst, "half-model")]) / lr
        torch.testing.assert_close(u, msgs[(2, src, dst, "mm")], rtol=1e-3, atol=1e-5)

    state = run.dir.load_checkpoint(2)
    if validation == "private":
        val = state["state.val"]  # fixed at init, carried in the state
        assert run.ctx.val_x is None
    else:
        assert "state.val" not in state and run.ctx.holdout == []
    W, p, n = run.ctx.W, run.params, run.cfg.agents
    model, spec = run.ctx.model, run.ctx.spec
    nbrs = [[j for j in range(n) if run.ctx.adj[i, j]] for i in range(n)]
    mm = {(t, i): msgs[(t, i, nbrs[i][0], "mm")] for t in (1, 2) for i in range(n)}
    untied = 0
    for t in (1, 2):
        for i in range(n):
            if validation == "private":
                assert set(val[i].tolist()) == set(run.ctx.holdout[i].tolist())
                vx, vy = run.ctx.train_x[val[i]], run.ctx.train_y[val[i]]
            else:
                vx, vy = run.ctx.val_x, run.ctx.val_y
            players = [i, *nbrs[i]]
            x = msgs[(t, i, nbrs[i][0], "model")]
            g = {j: msgs[(t, j, i, "cg")] for j in nbrs[i]}
            g[i] = clipped(run, x, i, t, clip)

            @functools.cache
            def v(s: frozenset, x=x, g=g, players=players, vx=vx, vy=vy) -> float:
                if not s:
                    return 0.0
                flat = x - lr * torch.stack([g[players[k]] for k in s]).mean(0)
                out = torch.func.functional_call(model, spec.unflatten(flat), (vx,))
                return float((out.argmax(-1) == vy).double().mean())

            phi = torch.tensor(permutation_shapley(v, len(players)), dtype=torch.float64)
            omega = torch.tensor([float(W[i, j]) for j in players], dtype=torch.float64)
            _, pi = shapley_weights(phi, omega, tol=p.tie_tol)
            untied += int((pi == 0).any())
            u_prev = sum(float(W[i, j]) * mm[(t - 1, j)] for j in players) if t > 1 else 0.0
            expected = p.momentum * u_prev + sum(float(pi[k]) * g[j] for k, j in enumerate(players))
            torch.testing.assert_close(mm[(t, i)], expected, rtol=1e-4, atol=1e-5)
    assert untied >= 2  # the recomputation exercised unequal weights, not only the 0/0 guard


def test_cg_noise_has_the_documented_std_and_observations_build(tmp_path):
    """ĝ − clip_C(g) = n ~ N(0, σ²C²), fresh per link: std over D ≈ 16k coordinates is σC."""
    sigma, clip = 2.0, 0.5
    run = Run.create(tiny("pdsl", sigma=sigma, params={"clip": clip}), tmp_path / "r")
    kinds = run.resolved["kinds"]  # ring: two neighbours, + ĝ_{i,i} inside û_i
    assert kinds["cg"]["releases_per_round"] == 2 and kinds["mm"]["releases_per_round"] == 3
    msgs = run.messages(CaptureSpec.of(rounds=[1, 2, 3]), progress=False)  # all observe needs
    D = run.ctx.spec.numel
    noises = []
    for src, dst in run.edges():
        noise = msgs[(2, src, dst, "cg")] - clipped(run, msgs[(2, dst, src, "model")], src, 2, clip)
        noises.append(noise)
        assert abs(float(noise.mean())) < 4 * sigma * clip / math.sqrt(D)
        assert abs(float(noise.std()) / (sigma * clip) - 1) < 4 * math.sqrt(1 / (2 * D))
    # two links out of the same agent carry independent noise on the same batch
    a, b = noises[0], noises[1]
    assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 4 / math.sqrt(D)
    for kind in ("cg", "mm", "half-model", "model"):
        (obs,) = observe(run, f"pdsl-{kind}", 2, progress=False)
        assert obs.meta["exact"] == (kind == "cg")
        if kind == "cg":
            assert obs.noise_std == pytest.approx(sigma * clip) and obs.clip is None
            torch.testing.assert_close(
                run.ctx.spec.flatten(obs.params),
                msgs[(2, obs.meta["dst"], obs.meta["src"], "model")],
            )


def test_private_validation_split_is_held_out_of_training(tmp_path):
    run = Run.create(
        tiny("pdsl", rounds=4, params={"validation": "private", "val_size": 8}), tmp_path / "r"
    )
    assert run.ctx.val_x is None and len(run.data.test_y) == len(load_dataset("photos").test_y)
    assert len(run.ctx.holdout) == run.cfg.agents
    for part, held in zip(run.ctx.parts, run.ctx.holdout, strict=True):
        assert len(held) == 8 and not set(held.tolist()) & set(part.tolist())
    run.messages(CaptureSpec.of(rounds=[1, 2, 3, 4]), progress=False)
    for t in range(1, 5):
        for i, held in enumerate(run.ctx.holdout):
            assert not set(run.secret_index(t, i).tolist()) & set(held.tolist())


def test_public_validation_set_is_test_data_shared_and_out_of_test_accuracy(tmp_path):
    """The default 𝒬: 20 % of the test split by a seeded draw (80 of photos' 400), one set
    for every agent, in no agent's shard nor its training batches, and not counted in the
    run's test accuracy, which is over the remaining test examples exactly."""
    run = Run.create(tiny("pdsl", rounds=2), tmp_path / "r")
    full = load_dataset("photos")
    idx = validation_indices(len(full.test_y), 80, run.cfg.seed)
    assert len(idx) == len(set(idx.tolist())) == 80
    mean = torch.tensor(run.data.mean).view(-1, 1, 1)
    std = torch.tensor(run.data.std).view(-1, 1, 1)
    torch.testing.assert_close(run.ctx.val_x, (full.test_x[idx] - mean) / std)
    assert torch.equal(run.ctx.val_y, full.test_y[idx])
    assert run.ctx.holdout == [] and run.defense.holdout_size(run.params) == 0
    # the rest of the test split, in order, is what test accuracy measures
    rest = torch.ones(len(full.test_y), dtype=torch.bool)
    rest[idx] = False
    assert torch.equal(run.data.test_x, full.test_x[rest])
    assert torch.equal(run.data.test_y, full.test_y[rest])
    # no validation image is a training image (of any shard)
    flat_val = full.test_x[idx].flatten(1)
    for part in run.ctx.parts:
        train = full.train_x[part.cpu()].flatten(1)
        assert not (torch.cdist(flat_val, train) == 0).any()
    state = run.train(progress=False)
    assert set(state) == {"x", "u"}
    with torch.no_grad():
        out = torch.func.functional_call(
            run.ctx.model,
            run.ctx.spec.unflatten(state["x"].mean(0)),
            ((full.test_x[rest] - mean) / std,),
        )
    expected = float((out.argmax(1) == full.test_y[rest]).double().mean())
    assert run.test_accuracy(state) == pytest.approx(expected)
    # the draw is seeded: another seed, another set; an explicit size is taken as given
    assert not torch.equal(validation_indices(400, 80, 1), idx)
    pdsl = get_defense("pdsl")
    assert pdsl.public_validation_size(params_of(pdsl.Params, {"val_size": 123}), 400) == 123


def test_a_validation_set_too_large_for_the_test_split_is_refused(tmp_path):
    with pytest.raises(PrivauditError, match="lower the defense's val_size"):
        # photos: 400 test images
        Run.create(tiny("pdsl", params={"val_size": 400}), tmp_path / "r")
    with pytest.raises(PrivauditError, match="validation must be one of"):
        Run.create(tiny("pdsl", params={"validation": "shared"}), tmp_path / "s")
    with pytest.raises(PrivauditError, match="val_size must be an integer"):
        Run.create(tiny("pdsl", params={"val_size": 0.5}), tmp_path / "t")


@pytest.mark.parametrize("validation", ["public", "private"])
def test_privacy_follows_the_validation_set(validation):
    """cg: deg releases, formal; mm / half-model / model: post-processing of the deg + 1
    releases with a public 𝒬, no finite ε with a private one. Flat clip: multiplier σ/2;
    the claim is Theorem 1's σ, one mechanism per round."""
    star = torch.zeros(5, 5, dtype=torch.bool)
    star[0, 1:] = star[1:, 0] = True
    W = metropolis_hastings(star).double()  # hub 0: degree 4, leaves 1
    pdsl = get_defense("pdsl")
    p = params_of(pdsl.Params, {"sigma": 3.0, "validation": validation})
    for agent, deg in ((None, 4), (0, 4), (1, 1)):
        for kind in pdsl.kinds:
            pr = pdsl.privacy(p, kind, W, agent)
            assert pr.noise_multiplier == 1.5 and pr.clip_unit == "batch"
            assert pr.claimed_multiplier == 3.0 and pr.claimed_releases == 1
            assert pr.releases == (deg if kind == "cg" else deg + 1)
            assert pr.formal == (validation == "public"), (kind, pr.reason)
            # a private 𝒬: cg is a Gaussian per release at a model that carries it
            assert pr.per_release == (kind == "cg" and validation == "private")
    assert not pdsl.privacy(params_of(pdsl.Params, {}), "mm", W).formal  # σ = 0: no noise


def test_default_run_reports_a_finite_epsilon_for_every_kind(tmp_path):
    """--epsilon with the public 𝒬: every kind is formal, σ is calibrated on the worst one
    (deg + 1 releases), which then spends exactly the target; with a private 𝒬 none is, and
    σ follows the paper's count."""
    run = Run.create(tiny("pdsl", epsilon=2.0, rounds=2), tmp_path / "pub")
    kinds = run.resolved["kinds"]
    assert all(k["formal"] and math.isfinite(k["epsilon"]) for k in kinds.values())
    assert max(k["epsilon"] for k in kinds.values()) == pytest.approx(2.0, rel=0.02)
    assert kinds["cg"]["epsilon"] < kinds["mm"]["epsilon"]
    state = run.train(progress=False)
    assert torch.isfinite(state["x"]).all() and 0.0 <= run.test_accuracy(state) <= 1.0
    private = Run.create(
        tiny("pdsl", epsilon=2.0, rounds=2, params={"validation": "private"}), tmp_path / "p"
    )
    kinds = private.resolved["kinds"]
    # cg's evaluation point carries π from private validation images: no run guarantee;
    # σ by the paper's count (Theorem 1: multiplier σ, one release per round)
    assert kinds["cg"]["per_release"] and math.isinf(kinds["cg"]["epsilon"])
    assert kinds["cg"]["epsilon_claimed"] == pytest.approx(2.0, rel=0.02)
    assert not kinds["mm"]["formal"] and math.isinf(kinds["mm"]["epsilon"])
    assert private.params.sigma < run.params.sigma  # the count: one release at multiplier σ
