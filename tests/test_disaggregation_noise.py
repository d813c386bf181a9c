"""benchmarks/disaggregation_noise.py: the fraction-recovered-against-σ curve and the
defenses' own messages on it, end to end on the bundled photos."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import disaggregation_noise  # noqa: E402 - a benchmark script, not a package


def test_noise_stops_the_attack_and_the_defense_sits_on_the_curve(tmp_path):
    """Without noise CPA recovers the whole B = 4 batch; at σ = 1 none of it; a dp-dpsgd
    message at ε = 8 is attacked through the pipeline and placed at its calibrated σ."""
    argv = ["--batch-sizes", "4", "--sigmas", "0,1", "--batches", "1", "--epsilons", "8"]
    argv += ["--defended", "dp-dpsgd-half-model", "--figures", str(tmp_path)]
    rows = disaggregation_noise.main(argv)
    clean, noisy, defended = rows
    assert clean["sigma"] == 0 and clean["at20"] == clean["n"] == 4
    assert noisy["sigma"] == 1 and noisy["at20"] == 0
    assert defended["label"].startswith("dp-dpsgd-half-model ε = 8") and defended["sigma"] > 0.1
    assert defended["at20"] == 0 and defended["n"] == defended["realised_b"]
    table = (tmp_path / "sigma.md").read_text()
    assert "| 4 | DP-SGD release | 0 | 4 of 4 (100%) |" in table
    assert (tmp_path / "sigma.png").stat().st_size and (tmp_path / "sigma.pdf").stat().st_size
