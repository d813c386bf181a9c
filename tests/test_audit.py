"""Accounting per defense, the ε lower-bound estimators, and the canary audit end to end."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from privaudit.cli import main
from privaudit.core.accounting import account, release_epsilon
from privaudit.core.config import RunConfig
from privaudit.core.context import params_of
from privaudit.core.errors import PrivauditError
from privaudit.defenses import DEFENSES, get_defense
from privaudit.defenses.dp_dpsgd import DPDPSGD
from privaudit.eval import bounds
from privaudit.experiments.audit import audit, verdict
from privaudit.plugins import load_plugins
from privaudit.scenario.topology import build_topology, metropolis_hastings
from privaudit.sim.run import Run

W_RING = metropolis_hastings(build_topology("ring", 6)).double()


# -- accounting facts per defense ---------------------------------------------------------------
W_EXP = metropolis_hastings(build_topology("exponential", 6)).double()


def _privacy(name: str, kind: str, **params):
    d = get_defense(name)
    W = W_EXP if d.topology == "exponential" else W_RING  # the push-sum defenses' own graph
    return d.privacy(params_of(d.Params, params), kind, W)


def test_gaussian_channels_count_every_release() -> None:
    cg = _privacy("dpdl", "cg", sigma=1.5)
    assert cg.noise_multiplier == 1.5 and cg.releases == 2  # ring: 2 neighbours
    # a Gaussian per release at a fixed evaluation point, which carries un-noised state
    assert cg.per_release and not cg.formal
    assert account(cg, 1e-5, 0.1, 10)["release"] < math.inf == account(cg, 1e-5, 0.1, 10)["run"]
    assert not _privacy("dpdl", "mm", sigma=1.5).formal  # un-noised self-gradient
    pdsl = _privacy("pdsl", "cg", sigma=1.5)
    assert pdsl.noise_multiplier == 0.75 and pdsl.claimed_multiplier == 1.5  # flat clip: 2C
    assert pdsl.releases == 2 and pdsl.clip_unit == "batch"  # cg: one per neighbour
    assert _privacy("pdsl", "mm", sigma=1.5).releases == 3  # mm also carries ĝ_ii
    assert _privacy("dp-dpsgd", "half-model", sigma=1.0).releases == 1


def test_no_formal_dp_says_why() -> None:
    ada = _privacy("adad2p", "half-model")
    assert not ada.formal and "data" in ada.reason
    lppa = _privacy("lppa", "gt")
    assert not lppa.formal and lppa.mechanism == "laplace"
    assert lppa.paper_epsilon(1e-5, 0.1) == pytest.approx(0.1 / (math.sqrt(2) * 0.025))
    assert not _privacy("constd2p", "half-model", sigma=1.0).formal  # G assumed, not clipped
    assert _privacy("dsgd", "half-model").mechanism == "none"
    acc = account(_privacy("dsgd", "half-model"), 1e-5, 0.1, 10)
    assert math.isinf(acc["release"]) and math.isinf(acc["run"])


def test_pdsl_paper_rule_and_release_epsilon() -> None:
    p = _privacy("pdsl", "cg", sigma=2.0)
    # ring, MH weights 1/3: 2·(3 + 9)·√(2 ln 1.25e5) / ((1/3)·2·√27)
    want = 2 * 12 * math.sqrt(2 * math.log(1.25e5)) / ((1 / 3) * 2.0 * math.sqrt(27))
    assert p.paper_epsilon(1e-5, 0.0) == pytest.approx(want)
    # one Gaussian release at σ = 2 is μ = 1/2 GDP; PRV agrees with the exact conversion
    assert release_epsilon(2.0, 1e-5) == pytest.approx(bounds.gdp_epsilon(0.5, 1e-5), rel=0.01)


# -- estimators ---------------------------------------------------------------------------------
def test_clopper_pearson_and_gdp_on_known_gaussians() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(1.0, 1.0, 3000), rng.normal(0.0, 1.0, 3000)
    g = bounds.gdp_estimate(a, b, 1e-5, 0.95)
    assert g["mu_lo"] < 1.0 < g["mu_hi"] and g["epsilon_lo"] < bounds.gdp_epsilon(1.0, 1e-5)
    thr = bounds.best_threshold(a[:1500], b[:1500], 1e-5, 0.95)
    cp = bounds.clopper_pearson_epsilon(a[1500:], b[1500:], thr, 1e-5, 0.95)
    assert 0 < cp < bounds.gdp_epsilon(1.0, 1e-5)
    same = bounds.gdp_estimate(rng.normal(size=2000), rng.normal(size=2000), 1e-5, 0.95)
    assert same["epsilon_lo"] == 0.0


def _pooled_scores(mu, n, k, seed, rho=0.0, stds=None):
    """n trials of k canaries: fixed per-coordinate offsets, a shift of mu when in, and noise
    of std ``stds`` (default 1) with correlation rho across one trial's canaries."""
    rng = np.random.default_rng(seed)
    coins = rng.random((n, k)) < 0.5
    noise = math.sqrt(1 - rho) * rng.normal(size=(n, k)) + math.sqrt(rho) * rng.normal(size=(n, 1))
    std = np.ones(k) if stds is None else np.asarray(stds)
    return 5 * rng.normal(size=k) + std * noise + mu * coins, coins


@pytest.mark.parametrize("rho", [0.0, 0.9])
def test_the_pooled_estimate_covers_mu_even_when_one_trials_scores_are_correlated(rho):
    """K canaries per trial, pooled: over 200 seeds μ_lo stays below the true μ at least 95 %
    of the time (its two components each at α/2: it covers more often), also when a trial's
    scores share 90 % of their noise (the intervals are cluster-robust over trials); and the
    pool has power: near μ with 16 canaries of 400 trials."""
    misses, los = 0, []
    for seed in range(200):
        g = bounds.pooled_gdp_estimate(*_pooled_scores(0.5, 400, 16, seed, rho), 1e-5, 0.95)
        misses += g["mu_lo"] > 0.5
        los.append(g["mu_lo"])
    assert misses <= 10 and 0.4 < np.mean(los) < 0.5
    assert g["canaries"] == 16 and g["mu_lo"] <= g["mu"] <= g["mu_hi"]


def test_the_pooled_mu_never_exceeds_the_most_exposed_canarys():
    """Canaries of unequal noise (μ_k = 1/σ_k: 1, 0.5, 0.25): the pool estimates mean Δ over
    RMS σ = 1/√7, below the largest μ_k, so it bounds the mechanism's worst pair from below."""
    s, c = _pooled_scores(1.0, 20_000, 3, 0, stds=[1.0, 2.0, 4.0])
    g = bounds.pooled_gdp_estimate(s, c, 1e-5, 0.95)
    assert g["mu_hi"] < 1.0 and g["mu"] == pytest.approx(1 / math.sqrt(7), rel=0.03)
    with pytest.raises(PrivauditError, match="at least 100 trials"):
        bounds.pooled_gdp_estimate(s[:50], c[:50], 1e-5, 0.95)


def test_one_run_bound_is_the_binomial_tail_without_delta() -> None:
    # δ = 0: p = P[Binomial(r, e^ε/(1+e^ε)) ≥ v]
    p = bounds.one_run_p_value(100, 20, 18, 1.0, 0.0)
    q = 1 / (1 + math.exp(-1.0))
    assert p == pytest.approx(stats.binom.sf(17, 20, q))
    assert bounds.one_run_p_value(100, 20, 18, 1.0, 1e-5) > p  # δ only adds
    eps = bounds.one_run_epsilon(100, 20, 18, 0.0, 0.05)
    assert bounds.one_run_p_value(100, 20, 18, eps, 0.0) == pytest.approx(0.05, abs=1e-3)
    assert bounds.one_run_epsilon(100, 20, 10, 0.0, 0.05) == 0.0  # chance level: no bound


def test_verdicts() -> None:
    assert verdict(2.1, 2.0) == "violated"
    assert verdict(1.8, 2.0) == "consistent"
    assert verdict(0.5, 2.0) == "loose"
    assert verdict(5.0, math.inf) == "no guarantee"


# -- the white-box audit on the defenses' own round code ----------------------------------------
class HalfNoiseDPSGD(DPDPSGD):
    """Deliberately broken: the noise std is half of what its σ (and accounting) says."""

    name = "dp-dpsgd-broken"

    def round(self, ctx, p, state, net, batch):
        return super().round(ctx, dataclasses.replace(p, sigma=p.sigma / 2), state, net, batch)


@pytest.fixture
def broken():
    DEFENSES[HalfNoiseDPSGD.name] = HalfNoiseDPSGD()
    yield HalfNoiseDPSGD.name
    DEFENSES.pop(HalfNoiseDPSGD.name)


def _run(tmp_path, defense: str, **kw) -> Run:
    cfg = dict(defense=defense, rounds=1, agents=4, epsilon=None, sigma=2.0)
    return Run.create(RunConfig(**{**cfg, **kw}), tmp_path / defense)


def test_halved_noise_is_reported_violated(tmp_path, broken) -> None:
    torch.manual_seed(0)
    res = audit(
        _run(tmp_path, broken), f"{broken}-half-model", trials=1500, progress=False
    ).to_dict()
    assert res["upper"]["accountant"] == pytest.approx(release_epsilon(2.0, 1e-5))
    assert res["verdict"] == "violated", res["gdp"]
    assert res["gdp"]["mu_lo"] > 0.5  # the accountant's μ = 1/σ; the broken one has 2/σ


def test_correct_mechanism_is_tight_and_not_violated(tmp_path) -> None:
    """One fixed canary (no search: every trial on it at 1 − α) is tight."""
    run = _run(tmp_path, "dp-dpsgd")
    fixed = dict(canary_norm=1.0, canary_shape="dirac")
    res = audit(run, "dp-dpsgd-half-model", trials=1500, progress=False, **fixed).to_dict()
    assert len(res["search"]["candidates"]) == 1 and res["search"]["pilot_trials"] == 0
    up = res["upper"]["accountant"]
    assert res["verdict"] != "violated"
    assert 0.6 * up < res["epsilon_lo"] <= up
    assert res["gdp"]["mu_lo"] < 0.5 < res["gdp"]["mu_hi"]  # the true μ = 1/σ is covered


def test_flat_clip_audit_exceeds_the_runs_own_accounting(tmp_path) -> None:
    """PDSL's batch clip has sensitivity 2C; the run accounts C: the audit shows it."""
    res = audit(_run(tmp_path, "pdsl", sigma=4.0), "pdsl-cg", trials=1200, progress=False).to_dict()
    assert res["canary"]["kind"] == "opposite"
    assert res["verdicts"]["paper's count"] == "violated"
    assert res["verdicts"]["accountant"] != "violated"


def test_one_run_audit_on_a_short_run(tmp_path) -> None:
    run = _run(tmp_path, "dp-dpsgd", rounds=12, sigma=0.2, batch_size=32)
    res = audit(run, "dp-dpsgd-half-model", mode="one-run", trials=200, progress=False).to_dict()
    assert res["observed_rounds"] == 12 and res["trials"] == 200
    assert 0 < res["epsilon_lo"] <= res["upper"]["accountant"]
    assert res["verdict"] != "violated"
    # the same canaries under the f-DP analysis: (ε, δ) below the accountant's as well
    f = res["one_run_fdp"]
    assert f["canaries"] == 200 and 0 <= f["epsilon_lo"] <= res["upper"]["accountant"]


PLUGIN = Path(__file__).resolve().parents[1] / "examples/plugin/privaudit_example/defense.py"


def test_pooled_canaries_reach_the_release_epsilon_and_never_violate_it(tmp_path) -> None:
    """256 Dirac canaries per trial on the correct mechanism (σ = 2: one release ε = 2.0),
    4 audit seeds of 1000 trials: never violated, and the pooled bound is within 0.9 of the
    accounted ε where one canary per trial gets 0.6–0.85 (test above, 1500 trials)."""
    run = _run(tmp_path, "dp-dpsgd")
    for seed in range(4):
        res = audit(run, "dp-dpsgd-half-model", trials=1000, canaries=256, seed=seed,
                    progress=False).to_dict()  # fmt: skip
        up = res["upper"]["accountant"]
        assert res["verdict"] != "violated" and 0.9 * up < res["epsilon_lo"] <= up
        assert res["gdp"]["mu_lo"] < 0.5 < res["gdp"]["mu_hi"]  # μ = 1/σ, covered
        assert res["statistic"] == "pooled" and res["canary"]["count"] == 256


@pytest.mark.parametrize("plugin", [False, True])
def test_pooled_canaries_catch_the_halved_noise(tmp_path, broken, registries, plugin) -> None:
    """The under-noised twins (this file's and the example plugin's, whose round-t message
    crosses in round t + 1), 1000 trials of 256 canaries: violated, μ near 2/σ."""
    if plugin:
        load_plugins([PLUGIN])
    defense = "cta-dpsgd-halfnoise" if plugin else broken
    run = _run(tmp_path, defense, rounds=2)
    target = f"{defense}-model" if plugin else f"{broken}-half-model"
    res = audit(run, target, trials=1000, canaries=256, progress=False).to_dict()
    assert res["verdict"] == "violated" and res["gdp"]["mu_lo"] > 0.9


def test_pooled_canaries_are_refused_where_they_would_not_be_independent_examples(
    tmp_path,
) -> None:
    """A flat batch clip (PDSL's cross-gradients: canaries would share one clip), a span,
    and a one-run audit are refused with the fix."""
    with pytest.raises(PrivauditError, match="per-example clip.*drop --canaries"):
        audit(_run(tmp_path, "pdsl"), "pdsl-cg", trials=200, canaries=8, progress=False)
    run = _run(tmp_path, "dp-dpsgd", rounds=2)
    with pytest.raises(PrivauditError, match="--span is for one canary per trial"):
        audit(run, "dp-dpsgd-half-model", trials=200, canaries=8, span=1, progress=False)
    with pytest.raises(PrivauditError, match="--canaries is for the white-box audit"):
        audit(run, "dp-dpsgd-half-model", mode="one-run", trials=200, canaries=8)


def _full_batch_run(tmp_path, defense: str, rounds: int = 3) -> Run:
    """Full batches (q = 1): the run is exactly its Gaussian releases, μ = √rounds/σ."""
    return _run(tmp_path, defense, rounds=rounds, sigma=4.0, examples_per_agent=8, batch_size=8)


@pytest.mark.parametrize("plugin", [False, True])
def test_one_run_catches_the_halved_noise(tmp_path, broken, registries, plugin) -> None:
    """An under-noised twin (σ/2 on the wire, σ accounted: this file's, and the example
    plugin's ``cta-dpsgd-halfnoise``) is violated in one run of 9 rounds on each of 3 audit
    seeds: the f-DP μ test rejects the accounted μ = 3/σ. (The plugin's round-t model
    crosses in round t + 1, so its last release is never seen: 8 of the 9 releases the
    accounting counts. The ε tests alone need a bound above 1/2 of the true ε, which one run
    does not always reach.)"""
    if plugin:
        load_plugins([PLUGIN])
    defense = "cta-dpsgd-halfnoise" if plugin else broken
    run = _full_batch_run(tmp_path, defense, rounds=9)
    target = f"{defense}-model" if plugin else f"{broken}-half-model"
    for seed in range(3):
        res = audit(run, target, mode="one-run", trials=10_000, threat="coalition", seed=seed,
                    progress=False).to_dict()  # fmt: skip
        assert res["observed_rounds"] == (8 if plugin else 9)
        assert res["mu"]["upper"] == pytest.approx(3 / 4.0)
        assert res["mu"]["lower"] > res["mu"]["upper"] and res["verdict"] == "violated"


def test_one_run_never_flags_the_correct_mechanism(tmp_path) -> None:
    """The correct mechanism over 6 audit seeds: both tests (each at 1 − α/2) and Steinke et
    al.'s bound beside stay below the accounted ε and μ, and the f-DP analysis has power
    (μ ≥ 0.2 of the true 0.43)."""
    run = _full_batch_run(tmp_path, "dp-dpsgd")
    for seed in range(6):
        res = audit(run, "dp-dpsgd-half-model", mode="one-run", trials=10_000,
                    threat="coalition", seed=seed, progress=False).to_dict()  # fmt: skip
        up = res["upper"]["accountant"]
        assert res["one_run"]["epsilon"] <= up and res["one_run_fdp"]["epsilon_lo"] <= up
        assert res["epsilon_lo"] == res["one_run_fdp"]["epsilon_lo"]
        assert 0.2 < res["mu"]["lower"] <= res["mu"]["upper"] and res["verdict"] != "violated"
        assert res["level"] == pytest.approx(1 - 0.05 / 2)


# -- the command line ---------------------------------------------------------------------------
TINY = ["--agents", "4", "--no-progress"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--delta", "2"], "--delta must be a finite number in [1e-30, 1)"),
        (["--confidence", "1.5"], "--confidence must be a finite number in (0, 1)"),
        (["--trials", "5"], "needs at least 32 trials"),
        (["--mode", "one-run", "--trials", "3"], "needs at least 16 canaries"),
        (["--mode", "blind"], "--mode must be white-box or one-run"),
        (["--mode", "one-run", "--canaries", "8"], "--canaries does nothing in --mode one-run"),
        (["--canaries", "8", "--span", "1"], "--span is for one canary per trial"),
        (["--canaries", "0"], "--canaries must be an integer in 1.."),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, args, needle) -> None:
    code = main(["audit", "--target", "dpdl-cg", "--out", str(tmp_path), *TINY, *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err and len(err.splitlines()) == 1


def test_no_noise_target_reports_infinite_upper(tmp_path, capsys) -> None:
    out = tmp_path / "a"
    code = main(
        ["audit", "--target", "dsgd-half-model", "--trials", "64", "--out", str(out), *TINY]
    )
    text = capsys.readouterr().out
    assert code == 0
    assert "ε upper = ∞" in text and "no guarantee" in text and (out / "audit.json").exists()


def test_coalition_without_attacker_is_every_receiver(tmp_path, capsys) -> None:
    """As ``privaudit attack``: --threat coalition with no --attacker pools every agent the
    victim sends to (victim 0 on the 4-ring: agents 1 and 3)."""
    out = tmp_path / "a"
    code = main(
        ["audit", "--target", "dpdl-cg", "--threat", "coalition", "--trials", "64"]
        + ["--out", str(out), *TINY]
    )
    text = capsys.readouterr().out
    assert code == 0 and "coalition 1,3" in text
    res = json.loads((out / "audit.json").read_text())
    assert res["threat"] == "coalition 1,3" and res["copies"] == 2
    # every trial's raw outcome beside it: coin, candidate, score, one row per trial
    rows = (out / res["scores_file"]).read_text().splitlines()
    assert rows[0] == "coin,candidate,score" and len(rows) == 1 + res["trials"]
    assert {r.split(",")[0] for r in rows[1:]} == {"0", "1"}
    assert (out / "tradeoff.png").exists() and (out / "tradeoff.pdf").exists()


THREATS = [("link", None), ("neighbor", None), ("coalition", [1, 4]), ("global", None)]


@pytest.mark.parametrize("threat, attackers", THREATS)
def test_correct_mechanism_is_never_violated_under_any_threat(tmp_path, threat, attackers) -> None:
    """DPDL's cross-gradients (per-example clip, σ = 2) under every threat model, over 2
    seeds: the upper bound is the ε of exactly the releases the Observation combines (2
    copies for a coalition of both ring neighbours or a global observer), so no audit is
    "violated". Each lower bound holds at confidence 0.999; over the 8 audits of this test
    a correct mechanism is flagged with probability ≤ 0.8 % (Bonferroni), and the seeds are
    fixed, so the outcome is deterministic."""
    run = _run(tmp_path, "dpdl", agents=5)
    copies = 2 if threat in ("coalition", "global") else 1
    for seed in range(2):
        res = audit(
            run,
            "dpdl-cg",
            trials=800,
            confidence=0.999,
            threat=threat,
            attackers=attackers,
            seed=seed,
            progress=False,
        ).to_dict()
        assert res["copies"] == copies
        assert res["upper"]["accountant"] == pytest.approx(
            release_epsilon(2.0 / math.sqrt(copies), 1e-5)
        )
        assert res["verdict"] != "violated", (seed, res["epsilon_lo"], res["upper"])
        assert res["epsilon_lo"] > 0.1 * res["upper"]["accountant"]  # the audit has power
