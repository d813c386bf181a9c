"""The simulator and the DPDL family: message orientation, clipping and noise, resumption."""

from __future__ import annotations

import functools
import math
import os
import signal

import conftest
import pytest
import torch
from conftest import batch_grad

from privaudit.core.accounting import epsilon_for_sigma, sigma_for_epsilon
from privaudit.core.errors import PrivauditError
from privaudit.core.messages import CaptureSpec
from privaudit.grads import clip_rows
from privaudit.sim.run import Run

tiny = functools.partial(conftest.tiny, rounds=4)


def test_cg_is_senders_batch_at_receivers_model(tmp_path):
    run = Run.create(tiny("nd"), tmp_path / "run")
    msgs = run.messages(CaptureSpec.of(rounds=[3]), progress=False)
    kinds = {k[3] for k in msgs}
    assert kinds == {"model", "cg", "mm", "half-model"}
    for src, dst in run.edges():
        expected = batch_grad(run, msgs[(3, dst, src, "model")], src, 3)
        torch.testing.assert_close(msgs[(3, src, dst, "cg")], expected, rtol=1e-4, atol=1e-6)
        # and not the receiver's own batch at the sender's model
        wrong = batch_grad(run, msgs[(3, src, dst, "model")], dst, 3)
        assert not torch.allclose(msgs[(3, src, dst, "cg")], wrong, atol=1e-6)


def test_momentum_and_half_model_are_consistent(tmp_path):
    run = Run.create(tiny("nd"), tmp_path / "run")
    m = run.messages(CaptureSpec.of(rounds=[1, 2]), progress=False)
    lr = run.params.lr
    for src, dst in run.edges():
        v = (m[(2, src, dst, "model")] - m[(2, src, dst, "half-model")]) / lr
        torch.testing.assert_close(v, m[(2, src, dst, "mm")], rtol=1e-3, atol=1e-5)
    # every agent starts from the public x_0
    for src, dst in run.edges():
        torch.testing.assert_close(m[(1, src, dst, "model")], run.ctx.x0)


def test_dpdl_noise_has_the_documented_std(tmp_path):
    """g̈ − clipped mean = z/B with z ~ N(0, σ²C²): its std over D ≈ 15k coordinates is σC/B."""
    sigma, clip, B = 2.0, 0.5, 4
    run = Run.create(tiny("dpdl", sigma=sigma, batch_size=B, params={"clip": clip}), tmp_path / "r")
    msgs = run.messages(CaptureSpec.of(rounds=[2]), progress=False)
    stds = []
    for src, dst in run.edges():
        clean = batch_grad(run, msgs[(2, dst, src, "model")], src, 2, clip)
        assert clean.norm() <= clip * (1 + 1e-5)
        noise = msgs[(2, src, dst, "cg")] - clean
        stds.append(float(noise.std()))
        assert abs(float(noise.mean())) < 4 * sigma * clip / B / math.sqrt(noise.numel())
    D = run.ctx.spec.numel
    tol = 4 * math.sqrt(1 / (2 * D))  # 4 standard errors of a sample std
    for s in stds:
        assert abs(s / (sigma * clip / B) - 1) < tol


def test_clip_rows_bounds_norm_and_keeps_small_rows():
    g = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    out = clip_rows(g, 1.0)
    torch.testing.assert_close(out.norm(dim=1), torch.tensor([1.0, 0.5]))
    torch.testing.assert_close(out[1], g[1])
    torch.testing.assert_close(out[0] / out[0].norm(), g[0] / g[0].norm())


def test_resume_and_recapture_are_bit_identical(tmp_path):
    cfg = tiny("dpdl", rounds=5, epsilon=2.0)
    full = Run.create(cfg, tmp_path / "a")
    state = full.train(capture=CaptureSpec.of(rounds=[4]), progress=False)
    first = full.dir.load_messages(4)
    # a second run trained in two pieces, with round 4 captured later from checkpoint 2
    part = Run.create(cfg, tmp_path / "b")
    part.train(until=3, progress=False)
    again = part.messages(CaptureSpec.of(rounds=[4]), progress=False)
    assert first.keys() == again.keys()
    for k in first:
        assert torch.equal(first[k], again[k])
    resumed = Run.open(tmp_path / "b").train(progress=False)
    assert torch.equal(state["x"], resumed["x"])


def test_existing_run_with_other_config_is_refused(tmp_path):
    Run.create(tiny("nd"), tmp_path / "r").train(progress=False)
    with pytest.raises(PrivauditError, match="different configuration"):
        Run.create(tiny("nd", agents=6), tmp_path / "r")


def test_epsilon_sigma_round_trip_and_composition():
    q, T = 0.05, 100
    s1 = sigma_for_epsilon(1.0, 1e-5, q, T, releases_per_round=1)
    s2 = sigma_for_epsilon(1.0, 1e-5, q, T, releases_per_round=2)
    assert s2 == pytest.approx(math.sqrt(2) * s1)
    assert epsilon_for_sigma(s1, 1e-5, q, T) == pytest.approx(1.0, abs=0.02)
    assert epsilon_for_sigma(s1 * 2, 1e-5, q, T) < 0.6
    assert epsilon_for_sigma(0.0, 1e-5, q, T) == math.inf
    with pytest.raises(PrivauditError, match="delta"):
        sigma_for_epsilon(1.0, 1.5, q, T)


def test_dpdl_sigma_comes_from_epsilon(tmp_path):
    run = Run.create(tiny("dpdl", epsilon=1.0), tmp_path / "r")
    r = run.resolved
    assert r["kinds"]["cg"]["releases_per_round"] == 2  # ring: one cross-gradient per neighbour
    # σ by the paper's count (its cg releases reach ε = 1); the run has no formal guarantee
    assert r["kinds"]["cg"]["epsilon_claimed"] == pytest.approx(1.0, abs=0.02)
    assert r["epsilon"] == math.inf and r["calibrated"]["basis"] == "the paper's count"
    assert run.params.sigma == pytest.approx(r["sigma"]) and r["sigma"] > 1


def interrupted(tmp_path, monkeypatch, method: str, signals: int, every: int):
    """Train 5 DPDL rounds (checkpoints every ``every``), sending ``signals`` real SIGINTs at
    the 4th call of the defense's ``method``; the run, the uninterrupted run's final state
    and the error line."""
    cfg = tiny("dpdl", rounds=5, checkpoint_every=every, epsilon=2.0)
    reference = Run.create(cfg, tmp_path / "ref").train(progress=False)
    run = Run.create(cfg, tmp_path / "r")
    real = getattr(type(run.defense), method)
    calls = {"n": 0}

    def signalled(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 4:
            for _ in range(signals):  # a third raises KeyboardInterrupt at once
                os.kill(os.getpid(), signal.SIGINT)
        return real(self, *a, **kw)

    monkeypatch.setattr(type(run.defense), method, signalled)
    with pytest.raises(PrivauditError) as error:
        run.train(progress=False)
    monkeypatch.setattr(type(run.defense), method, real)
    return run, reference, str(error.value)


def assert_resumes_to(reference, path) -> None:
    resumed = Run.open(path).train(progress=False)
    assert torch.equal(resumed["x"], reference["x"]) and torch.equal(resumed["v"], reference["v"])


def test_interrupt_saves_a_checkpoint_and_resume_matches(tmp_path, monkeypatch):
    """One Ctrl-C in the middle of round 4: the round finishes, the stop is at its end."""
    run, reference, line = interrupted(tmp_path, monkeypatch, "round", 1, every=10)
    assert "interrupted after round 4" in line, line
    assert run.dir.checkpoint_rounds() == [4]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    assert_resumes_to(reference, run.dir.path)


@pytest.mark.parametrize("every", [2, 10], ids=["checkpoint-2", "no-checkpoint"])
def test_a_round_cut_halfway_resumes_from_the_last_checkpoint(tmp_path, monkeypatch, every):
    """The simulator hands DPDL its state to overwrite (Consumed). A third Ctrl-C (raised at
    once) halfway through round 4 — x̃ and ṽ already written into round 3's x and v — leaves
    no whole round 3 in memory: nothing is checkpointed from it, the line names the last
    checkpoint, and the resumed run is the uninterrupted one bit for bit."""
    run, reference, line = interrupted(tmp_path, monkeypatch, "mix_half", 3, every)
    again = "resume from round 2" if every == 2 else "start again"
    assert "halfway through round 4" in line and again in line, line
    assert run.dir.checkpoint_rounds() == ([2] if every == 2 else [])
    assert_resumes_to(reference, run.dir.path)


def test_dpdl_calibration_weight_range():
    from privaudit.defenses.dpdl import calibration

    lo, hi = 1 / (1 + math.e), math.e / (1 + math.e)
    g = torch.randn(2000, 50, generator=torch.Generator().manual_seed(0))
    h = torch.randn(2000, 50, generator=torch.Generator().manual_seed(1))
    c = calibration(g, h)
    assert ((c >= lo - 1e-6) & (c <= hi + 1e-6)).all()
    # the extremes: aligned gradients are damped most, opposed ones up-weighted most
    assert float(calibration(g[:1], 3 * g[:1])) == pytest.approx(lo, abs=1e-6)
    assert float(calibration(g[:1], -g[:1])) == pytest.approx(hi, abs=1e-6)
    assert float(calibration(g[:1], g[:1])) < float(calibration(g[:1], h[:1])) < hi
