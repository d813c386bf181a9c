"""El Mrini, Cyffers & Bellet's setting (ICML 2024) from the command line: one example per
agent (``--examples-per-agent``), full-batch local steps (``--sampling full``: D-GD, every
example in every round, and q = 1 in the accounting: no amplification) and the tied
approximation (``attack -a tie=true``), which reaches a victim beyond the coalition's
neighbours — refused with one line naming the fix on a run of fresh Poisson batches."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import run_cli, tiny
from scipy import stats
from scipy.optimize import brentq

from privaudit.core.errors import PrivauditError
from privaudit.core.messages import CaptureSpec
from privaudit.scenario.data import per_agent
from privaudit.sim.run import Run

pytestmark = pytest.mark.usefixtures("one_thread")

# opacus' RDP orders (its RDPAccountant's default alphas), the accountant a run uses by default
ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))


def refused(code: int, err: str, needle: str) -> None:
    """The CLI's refusal: exit 2, one stderr line ``privaudit: error: …`` holding ``needle``."""
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("privaudit: error: "), err
    assert needle in lines[0], lines[0]


def gaussian_rdp_epsilon(z: float, rounds: int, delta: float) -> float:
    """(ε, δ) of ``rounds`` compositions of the Gaussian mechanism at multiplier z — no
    sampling: RDP(α) = T α / (2 z²) exactly — converted at the best of :data:`ORDERS` (Balle
    et al. 2020, Thm. 21, the conversion opacus uses)."""
    return min(
        rounds * a / (2 * z * z) + math.log1p(-1 / a) - (math.log(delta) + math.log(a)) / (a - 1)
        for a in ORDERS
    )


def gaussian_exact_epsilon(mu: float, delta: float) -> float:
    """The tight ε of a μ-GDP mechanism (T Gaussians at z compose to μ = √T / z) at δ:
    δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Balle & Wang 2018; Dong et al. 2019)."""

    def excess(eps: float) -> float:
        return (
            stats.norm.cdf(-eps / mu + mu / 2)
            - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
            - delta
        )

    return brentq(excess, 0.0, 200.0, xtol=1e-12)


# -- one example per agent -----------------------------------------------------------------
def test_per_agent_cuts_each_shard_to_a_seeded_subset_of_it():
    parts = [torch.arange(0, 10), torch.arange(10, 17), torch.arange(17, 30)]
    cut = per_agent(parts, 3, seed=1)
    assert [len(p) for p in cut] == [3, 3, 3]
    for p, c in zip(parts, cut, strict=True):
        assert set(c.tolist()) <= set(p.tolist()) and torch.equal(c, c.sort().values)
    again = per_agent(parts, 3, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(cut, again, strict=True))
    assert per_agent(parts, None) is parts
    with pytest.raises(PrivauditError, match="--examples-per-agent 8 is more than a shard of 7"):
        per_agent(parts, 8)


# -- full batches: every example, every round ------------------------------------------------
@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> Run:
    """``train --sampling full --examples-per-agent 2``: D-PSGD, 4 agents on a ring, 3
    rounds, every message captured."""
    from privaudit.cli import main

    out = tmp_path_factory.mktemp("anchor") / "full"
    argv = ["train", "--defense", "dsgd", "--out", str(out), "--agents", "4", "--rounds", "3"]
    assert main([*argv, "--examples-per-agent", "2", "--sampling", "full"] + CAPTURE) == 0
    return Run.open(out)


CAPTURE = ["--capture", "all", "--checkpoint-every", "1", "--no-progress"]


def sent(msgs: dict, t: int, i: int) -> torch.Tensor:
    """Agent i's round-t half-model message (the same on each of its links)."""
    values = [v for (r, src, _, kind), v in msgs.items() if (r, src, kind) == (t, i, "half-model")]
    assert values and all(torch.equal(v, values[0]) for v in values)
    return values[0].cpu().float()


def test_full_sampling_steps_on_every_example_of_the_shard_in_every_round(full_run):
    """Each agent's batch is its whole shard (both of its examples) in every round, and each
    message is the D-GD step on exactly that: x̃_i^t = x_i − η ∇f_i(x_i) at x_i = (W x̃^{t-1})_i,
    f_i the mean loss over the shard, recomputed here from the messages of round t − 1."""
    run = full_run
    n, W, lr = run.cfg.agents, run.ctx.W.cpu().float(), run.params.lr
    assert run.cfg.batch_size == run.cfg.examples_per_agent == 2
    assert [len(p) for p in run.ctx.parts] == [2] * n
    assert [a["sample_rate"] for a in run.resolved["agents"]] == [1.0] * n
    prev = run.ctx.x0.cpu().float()[None].expand(n, -1)
    for t in range(1, run.cfg.rounds + 1):
        assert run.batch_sizes(t) == [2] * n
        for i in range(n):
            assert torch.equal(run.secret_index(t, i).cpu(), run.ctx.parts[i].cpu())
        msgs = run.messages(CaptureSpec.of(rounds=[t]), progress=False)
        now = torch.stack([sent(msgs, t, i) for i in range(n)])
        at = W @ prev
        for i in range(n):
            part = run.ctx.parts[i]
            x, y = run.ctx.train_x[part][None], run.ctx.train_y[part][None]
            g = run.ctx.grads.clipped_mean(at[i][None].to(x.device), x, y, None)[0].cpu()
            torch.testing.assert_close(now[i], at[i] - lr * g, rtol=1e-5, atol=1e-6)
        prev = now


def test_full_sampling_is_accounted_as_the_gaussian_mechanism_unamplified(tmp_path, capsys):
    """``--sampling full`` with ``--epsilon 4``: every agent's rate is q = 1, σ is calibrated
    so that T unsampled Gaussian releases give ε = 4 — recomputed here from the mechanism's
    RDP, α/(2σ²) per round — above the tight GDP value and above what Poisson sampling at
    q = 1/2 would have claimed at that σ."""
    argv = ["train", "--defense", "dp-dpsgd", "--out", str(tmp_path / "r"), "--json"]
    argv += ["--agents", "4", "--rounds", "2", "--epsilon", "4", "--no-progress"]
    code, out, err = run_cli(capsys, *argv, "--examples-per-agent", "1", "--sampling", "full")
    assert code == 0, err
    doc = json.loads(out)
    sigma, delta, T = doc["sigma"], doc["delta"], 2
    assert [a["sample_rate"] for a in doc["agents"]] == [1.0] * 4
    kind = doc["kinds"]["half-model"]  # per-example clip, one noised gradient per round
    want = gaussian_rdp_epsilon(sigma, T, delta)
    assert kind["epsilon"] == pytest.approx(want, rel=1e-6)
    assert want == pytest.approx(4.0, rel=0.01) and doc["epsilon"] == pytest.approx(want)
    assert all(a["epsilon"] == pytest.approx(want, rel=1e-6) for a in doc["agents"])
    assert gaussian_exact_epsilon(math.sqrt(T) / sigma, delta) < want
    from privaudit.core.accountants import get_accountant

    assert get_accountant("rdp").epsilon(sigma, delta, 0.5, T) < 0.9 * want  # amplified
    assert "--sampling full: batch_size=1" in err  # where the settings came from


def test_train_prints_that_full_batches_are_not_amplified(full_run, capsys):
    from privaudit.cli.train import privacy_lines

    assert "full batches: q = 1 for every agent, no amplification" in privacy_lines(
        full_run.resolved
    )


# -- the tied attack, end to end -------------------------------------------------------------
def test_tied_attack_reconstructs_a_non_neighbour_of_a_full_batch_run(tmp_path, capsys):
    """One example per agent on a line 0 – 1 – 2 – 3 – 4, full-batch D-GD for T = n rounds;
    the attacker at the end recovers agent 3 (three hops away) with ``-a tie=true``."""
    run = tmp_path / "run"
    argv = ["train", "--defense", "dsgd", "--out", str(run), "--agents", "5"]
    argv += ["--topology", "line", "--rounds", "5", "--lr", "1e-3", *CAPTURE]
    code, out, err = run_cli(capsys, *argv, "--examples-per-agent", "1", "--sampling", "full")
    assert code == 0, err
    assert "--sampling full: batch_size=1" in out and "full batches: q = 1" in out
    argv = ["attack", "--run", str(run), "--target", "dsgd-half-model", "--round", "1"]
    argv += ["--attacker", "0", "--victim", "3", "-a", "tie=true", "--out", str(tmp_path / "o")]
    code, out, err = run_cli(capsys, *argv, "--iterations", "1", "--no-lpips", "--no-progress")
    assert code == 0, err
    result = json.loads((tmp_path / "o" / "result.json").read_text())
    assert result["links"] == [[3, None]] and result["batch_sizes"] == [1]
    assert result["attack_options"]["tie"] is True and result["exact_observation"] is False
    assert "tied updates" in result["adversaries"][0]
    assert np.isfinite(result["metrics"]["psnr"]) and (tmp_path / "o" / "grid.png").exists()


# -- refusals: one line, the fix --------------------------------------------------------------
def test_tied_attack_on_a_poisson_run_is_refused_with_the_fix(tmp_path, capsys):
    run = Run.create(tiny("dsgd", agents=5, topology="line", rounds=3), tmp_path / "run")
    argv = ["attack", "--run", str(run.dir.path), "--target", "dsgd-half-model", "--round", "1"]
    argv += ["--attacker", "0", "--victim", "3", "-a", "tie=true", "--out", str(tmp_path / "o")]
    code, _, err = run_cli(capsys, *argv, "--no-progress")
    refused(code, err, "--sampling full --examples-per-agent K")
    assert "q = " in err and "< 1" in err and not (tmp_path / "o").exists()


ATTACK = ["attack", "--target", "dsgd-half-model", "--round", "1", "--agents", "5"]
TIE = ["--topology", "line", "--attacker", "0", "--victim", "3", "-a", "tie=true"]


@pytest.mark.parametrize(
    "argv, needle",
    [
        # a run to be trained with Poisson batches: refused before any training
        ([*ATTACK, *TIE], "add --sampling full --examples-per-agent K"),
        ([*ATTACK, *TIE[:-2], "-a", "tie=yes"], "-a tie takes true or false"),
        (
            [*ATTACK, "-a", "tie=true", "--sampling", "full", "--examples-per-agent", "1"],
            "--attacker",
        ),
        ([*ATTACK, "-a", "tie=true", "--link", "3,2"], "drop --link"),
        (
            ["attack", "--target", "dsgd-half-model", "--round", "1", "--run", "{tmp}/r"]
            + ["--sampling", "full"],
            "--sampling does nothing with --run",
        ),
        (["train", "--defense", "dsgd", "--sampling", "full"], "add --examples-per-agent K"),
        (
            ["train", "--defense", "dsgd", "--sampling", "full", "--examples-per-agent", "2"]
            + ["--batch-size", "4"],
            "drop --batch-size",
        ),
        (["train", "--defense", "dsgd", "--examples-per-agent", "1"], "use --sampling full"),
        (["train", "--defense", "dsgd", "--examples-per-agent", "0"], "--examples-per-agent"),
        (["train", "--defense", "dsgd", "--sampling", "some"], "--sampling"),
        (
            ["train", "--defense", "dsgd", "--agents", "4", "--examples-per-agent", "5000"]
            + ["--sampling", "full"],
            "--examples-per-agent",
        ),
    ],
)
def test_bad_values_are_refused_in_one_line(argv, needle, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, *argv, "--out", str(out), "--no-progress")
    refused(code, err, needle)
    assert not out.exists()
