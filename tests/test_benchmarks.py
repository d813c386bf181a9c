"""The speed benchmark's correctness check: the vectorized simulator and the naive per-agent
loop of benchmarks/naive_dpdl.py compute the same DPDL messages (a check of both engines)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from naive_dpdl import compare_clean, noise_residual  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_naive_loop_and_simulator_send_the_same_messages(tmp_path):
    """Same batches, clipping on, σ = 0: every model, cross-gradient, momentum and half-step
    message of every link and round agrees to float tolerance."""
    out = compare_clean(tmp_path / "run", agents=4, rounds=2)
    assert out["messages"] == 2 * 8 * 4  # 2 rounds × 8 directed ring links × 4 kinds
    assert out["max_rel_err"] < 1e-4


def test_noised_cross_gradients_carry_exactly_the_documented_noise(tmp_path):
    """With σ > 0 each cross-gradient minus the naive clean value is N(0, (σC/B)²)."""
    out = noise_residual(tmp_path / "run", agents=4, rounds=1)
    assert out["sigma"] > 0 and out["values"] > 100_000
    assert abs(out["std_ratio"] - 1) < 0.02
    assert abs(out["mean"]) < 0.02 * out["expected_std"]
