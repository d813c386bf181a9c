"""Every ε a run prints, recomputed without opacus from the mechanism's definition.

The mechanism: agent i's batch is Poisson sampled at q_i = B/n_i; per round it is released
r_i times, each release a Gaussian with noise multiplier z (std over add/remove
sensitivity). The r_i releases of one batch are jointly one Gaussian with multiplier
z/√r_i; T rounds compose. The Rényi divergence of the Poisson-subsampled Gaussian is
computed here by numerical integration (Mironov, Talwar & Zhang 2019, §3.3),

    A_α = ∫ N(x; 0, s²) · ((1 − q) + q · exp((2x − 1) / (2s²)))^α dx,   RDP(α) = ln A_α / (α − 1),

and turned into (ε, δ) by Balle et al. 2020, Thm. 21 (the conversion opacus also uses).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats
from scipy.optimize import brentq

from privaudit.core.accounting import ADJACENCY, SAMPLING, sigma_for_epsilon
from privaudit.core.config import RunConfig
from privaudit.core.errors import PrivauditError
from privaudit.defenses.base import neighbours
from privaudit.eval.bounds import check_levels
from privaudit.experiments.centralised import centralised_dpsgd
from privaudit.sim.run import Run

ORDERS = np.concatenate([np.arange(1.1, 11, 0.1), np.arange(11, 65, 1.0)])


def rdp_poisson_gaussian(q: float, s: float, alpha: float) -> float:
    """RDP of order α of the Poisson-subsampled Gaussian (rate q, multiplier s): the
    integral above on a fine grid around its peak (log-sum-exp, Simpson's rule)."""
    if q == 1:
        return alpha / (2 * s * s)
    x = np.linspace(-14 * s, 14 * s + alpha / s**2, 4001)
    mix = np.logaddexp(math.log1p(-q), math.log(q) + (2 * x - 1) / (2 * s * s))
    logf = stats.norm.logpdf(x, scale=s) + alpha * mix
    peak = float(logf.max())
    return (peak + math.log(integrate.simpson(np.exp(logf - peak), x=x))) / (alpha - 1)


def epsilon(q: float, z: float, releases: int, rounds: int, delta: float) -> float:
    """(ε, δ) of ``rounds`` rounds of ``releases`` same-batch Gaussian releases at z."""
    s = z / math.sqrt(releases)
    best = math.inf
    for a in ORDERS:
        rdp = rounds * rdp_poisson_gaussian(q, s, float(a))
        eps = rdp + math.log1p(-1 / a) - (math.log(delta) + math.log(a)) / (a - 1)
        best = min(best, eps)
    return best


def gaussian_epsilon(z: float, delta: float) -> float:
    """ε of one Gaussian mechanism at multiplier z, exactly (Balle & Wang 2018, Thm. 8):
    the ε at which δ(ε) = Φ(1/(2z) − εz) − e^ε Φ(−1/(2z) − εz) equals ``delta``."""

    def excess(eps: float) -> float:
        return (
            stats.norm.cdf(1 / (2 * z) - eps * z)
            - math.exp(eps) * stats.norm.cdf(-1 / (2 * z) - eps * z)
            - delta
        )

    return brentq(excess, 0.0, 100.0, xtol=1e-10)


def test_the_independent_rdp_matches_known_values() -> None:
    """Without sampling the Gaussian's RDP is α/(2z²) exactly; with sampling the integral
    agrees with the binomial expansion at integer orders (Mironov et al., Thm. 5)."""
    assert rdp_poisson_gaussian(1.0, 2.0, 3.0) == pytest.approx(3 / 8)
    q, s, a = 0.05, 1.3, 4
    binom = sum(
        math.comb(a, k) * (1 - q) ** (a - k) * q**k * math.exp((k * k - k) / (2 * s * s))
        for k in range(a + 1)
    )
    assert rdp_poisson_gaussian(q, s, a) == pytest.approx(math.log(binom) / (a - 1), rel=1e-6)


# defense → (its message kinds that are formal, the true multiplier per unit σ, the releases
# per round of agent i's batch, from the mechanism's definition, for a node of degree d)
MECHANISMS = {
    # flat clip of the batch mean to C: adding/removing one example moves it by up to 2C;
    # the half-step model adds the noised self-gradient: d + 1 releases
    "dp-cga": ({"cg", "half-model", "model"}, 0.5, lambda d: d + 1),
    # PDSL with the paper's public validation set: flat clip as DP-CGA; π is computed from
    # noised gradients and public data, so the momentum and models are post-processing of
    # the d cross-gradients and the noised self-gradient
    "pdsl": ({"cg", "mm", "half-model", "model"}, 0.5, lambda d: d + 1),
    # per-example clip, one noised gradient broadcast per round
    "dp-dpsgd": ({"half-model"}, 1.0, lambda d: 1),
}


def _run(tmp_path, defense: str, **kw) -> Run:
    cfg = dict(defense=defense, rounds=30, agents=5, batch_size=8, epsilon=1.0)
    return Run.create(RunConfig(**{**cfg, **kw}), tmp_path / defense)


@pytest.mark.parametrize("defense", sorted(MECHANISMS))
def test_calibrated_sigma_gives_the_target_epsilon(tmp_path, defense: str) -> None:
    """σ calibrated for ε = 1, fed back through the independent computation for every
    agent (its own q_i and degree), gives a worst agent within 1 % of the target and
    never above it by more than 1 %; every agent's reported ε matches its own."""
    run = _run(tmp_path, defense)
    formal, unit, releases = MECHANISMS[defense]
    res, W, T = run.resolved, run.ctx.W.cpu(), run.cfg.rounds
    z = res["sigma"] * unit
    per_agent = []
    for i, part in enumerate(run.ctx.parts):
        q = run.cfg.batch_size / len(part)
        per_agent.append(epsilon(q, z, releases(len(neighbours(W, i))), T, run.cfg.delta))
        assert res["agents"][i]["sample_rate"] == pytest.approx(q)
        assert res["agents"][i]["epsilon"] == pytest.approx(per_agent[-1], rel=0.01)
    assert max(per_agent) == pytest.approx(1.0, rel=0.01) and max(per_agent) <= 1.01
    assert res["epsilon"] == pytest.approx(max(per_agent), rel=0.01)
    assert {k for k, v in res["kinds"].items() if v["formal"]} == formal
    for k, v in res["kinds"].items():
        assert math.isfinite(v["epsilon"]) == (k in formal), (k, v)
        if k not in formal:
            assert v["reason"]
    assert res["adjacency"] == ADJACENCY and res["sampling"] == SAMPLING


def test_the_runs_epsilon_is_infinite_when_any_kind_on_the_wire_has_no_guarantee(tmp_path):
    """DPDL at σ = 1: model, half-model and mm carry the un-noised self-gradient, and each cg
    is evaluated at the receiver's model, which carries it from round 2 on — so the run's ε
    (everything on the wire) is ∞ with the reason, every agent's too; σ was what was asked;
    the paper's count (multiplier σ, one release per neighbour) is recomputed here."""
    run = _run(tmp_path, "dpdl", epsilon=None, sigma=1.0)
    res, W, T = run.resolved, run.ctx.W.cpu(), run.cfg.rounds
    assert res["epsilon"] == math.inf and res["formal_kinds"] == []
    assert "no formal guarantee" in res["epsilon_reason"]
    assert all(a["epsilon"] == math.inf for a in res["agents"])
    assert not any(v["formal"] for v in res["kinds"].values())
    cg = res["kinds"]["cg"]
    assert cg["per_release"] and "evaluated at the receiver's model" in cg["reason"]
    # one message at a fixed evaluation point: the Gaussian mechanism at multiplier σ = 1
    assert cg["epsilon_one_release"] == pytest.approx(
        gaussian_epsilon(1.0, run.cfg.delta), rel=0.01
    )
    claims = [
        epsilon(run.cfg.batch_size / len(part), 1.0, len(neighbours(W, i)), T, run.cfg.delta)
        for i, part in enumerate(run.ctx.parts)
    ]
    assert cg["epsilon_claimed"] == pytest.approx(max(claims), rel=0.01)
    assert res["calibrated"] is None and run.cfg.epsilon is None  # what was asked: σ


def test_dpdl_epsilon_calibrates_sigma_by_the_papers_count_and_says_so(tmp_path, capsys):
    """--epsilon 1 on DPDL: no kind composes into a guarantee, so σ is set by the paper's
    count (the cg releases' claimed ε is 1), and the command's line says which kinds it
    calibrated and that every kind stays ∞."""
    from conftest import run_cli

    out = tmp_path / "run"
    argv = ["train", "--defense", "dpdl", "--rounds", "5", "--agents", "4", "--out", str(out)]
    code, stdout, err = run_cli(capsys, *argv, "--epsilon", "1", "--no-progress")
    assert code == 0, err
    line = stdout.splitlines()[1]
    assert line.startswith("--epsilon 1 calibrated σ = ") and "(the paper's count)" in line
    assert "model, cg, mm, half-model stay ε = ∞ over the run" in line
    assert "ε over the run (every message on the wire) = ∞" in stdout
    run = Run.open(out)
    assert run.resolved["kinds"]["cg"]["epsilon_claimed"] == pytest.approx(1.0, rel=0.01)


def test_a_run_whose_every_kind_is_formal_reports_its_worst_kind(tmp_path):
    """DP-CGA (every message a function of noised releases): the run's ε is finite, the
    largest over its kinds, with no reason."""
    res = _run(tmp_path, "dp-cga").resolved
    assert res["epsilon_reason"] is None and set(res["formal_kinds"]) == set(res["kinds"])
    assert res["epsilon"] == pytest.approx(max(v["epsilon"] for v in res["kinds"].values()))


def test_per_agent_epsilon_follows_each_agents_own_rate(tmp_path) -> None:
    """Skewed shards: the smallest shard has the largest q and the largest ε; the run's ε
    is that worst agent's, and the others' are strictly smaller."""
    run = _run(tmp_path, "dp-dpsgd", dirichlet_alpha=0.3, agents=6)
    sizes = [len(p) for p in run.ctx.parts]
    eps = [a["epsilon"] for a in run.resolved["agents"]]
    assert len(set(sizes)) > 1
    assert int(np.argmax(eps)) == int(np.argmin(sizes))
    assert min(eps) < max(eps) == pytest.approx(run.resolved["epsilon"])


def test_flat_clip_defense_is_calibrated_on_twice_the_sensitivity(tmp_path) -> None:
    """DP-CGA labelled ε = 1: the naive count (multiplier σ, d releases — the papers') would
    call the same σ far more private; the true (σ/2, d + 1) is what the run calibrates."""
    run = _run(tmp_path, "dp-cga")
    res, T, d = run.resolved, run.cfg.rounds, 2  # ring: degree 2
    q = max(run.cfg.batch_size / len(p) for p in run.ctx.parts)
    naive = epsilon(q, res["sigma"], d, T, run.cfg.delta)
    true = epsilon(q, res["sigma"] / 2, d + 1, T, run.cfg.delta)
    assert true == pytest.approx(1.0, rel=0.01)
    assert naive < 0.6
    assert res["kinds"]["cg"]["epsilon_claimed"] == pytest.approx(naive, rel=0.01)


def test_the_papers_own_count_calibrates_the_sigma_the_paper_would_use(tmp_path) -> None:
    """``calibrate(claimed=True)`` is the σ at which the paper's count (DP-CGA: multiplier σ,
    d releases per round) reaches the ε: recomputed here with the independent RDP above.
    The correct count then puts the same σ far above that ε."""
    from privaudit.core.accounting import calibrate

    run = _run(tmp_path, "dp-cga")
    T, d, delta = run.cfg.rounds, 2, run.cfg.delta  # ring: degree 2
    rates = [run.cfg.batch_size / len(p) for p in run.ctx.parts]
    W = run.ctx.W.cpu().double()
    sigma = calibrate(run.defense, run.params, W, rates, 1.0, delta, T, claimed=True)
    q = max(rates)
    assert epsilon(q, sigma, d, T, delta) == pytest.approx(1.0, rel=0.01)
    assert epsilon(q, sigma / 2, d + 1, T, delta) > 2.0
    assert sigma < run.resolved["sigma"] / 2  # the correct σ of the same run's ε = 1


@pytest.mark.parametrize("delta", [0.0, 1.0, 2.0, math.nan, 1e-31])
def test_every_delta_entry_point_refuses_the_same_way(delta: float) -> None:
    """One δ check (limits.check_delta): the run config, the accountant, the audit's bounds
    and the centralised reference all refuse a δ outside [1e-30, 1) with the same line."""
    x, y = torch.zeros(2, 1, 2, 2), torch.zeros(2, dtype=torch.long)
    calls = [
        lambda: RunConfig(delta=delta).validate(),
        lambda: sigma_for_epsilon(1.0, delta, 0.1, 10),
        lambda: check_levels(0.95, delta),
        lambda: centralised_dpsgd(
            torch.nn.Linear(4, 2),
            x,
            y,
            x,
            y,
            sample_rate=0.5,
            steps=1,
            lr=0.1,
            clip=1.0,
            epsilon=1.0,
            delta=delta,
        ),
    ]
    for call in calls:
        with pytest.raises(
            PrivauditError, match=r"--delta must be a finite number in \[1e-30, 1\)"
        ):
            call()
