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


def test_attack_search_scores_every_grid_point_on_the_train_split(tmp_path):
    """benchmarks/tune_attack.py: one mean PSNR per (tv, lr) point and model, from its cells,
    and the JSON it writes says the same."""
    import json

    from tune_attack import main

    argv = ["--models", "lenet", "--tv", "5e-2,1e-2", "--lr", "0.1", "--batch-sizes", "1"]
    argv += ["--rounds", "0", "--iterations", "2", "--json", str(tmp_path / "out.json")]
    doc = main(argv)
    rows = doc["photos"]["lenet"]
    assert {(r["tv"], r["lr"]) for r in rows} == {(5e-2, 0.1), (1e-2, 0.1)}
    for r in rows:
        assert r["psnr"] == sum(r["cells"].values()) / len(r["cells"])
    assert json.loads((tmp_path / "out.json").read_text())["photos"] == doc["photos"]


def test_attack_search_sets_the_refinement_step_of_fi():
    """``--attack fi``: ``--lr`` reaches fi's ``refine_lr``, so the two points differ."""
    from tune_attack import default_point, main

    argv = ["--attack", "fi", "--models", "lenet", "--tv", "5e-2", "--lr", "0.01,0.1"]
    argv += ["--batch-sizes", "2", "--rounds", "0", "--iterations", "2"]
    rows = main(argv)["photos"]["lenet"]
    assert {(r["tv"], r["lr"]) for r in rows} == {(5e-2, 0.01), (5e-2, 0.1)}
    assert rows[0]["psnr"] != rows[1]["psnr"]
    assert default_point("fi") == (5e-2, 0.01) and default_point("hybrid") == (1e-2, 1.0)


def test_strength_margin_takes_the_best_attack_no_slower_than_breaching():
    from strength import BREACHING, FLOOR, margins

    def row(model, rnd, b, attack, psnr, wall):
        return dict(dataset="photos", model=model, round=rnd, batch_size=b, attack=attack,
                    psnr=psnr, wall_s=wall)  # fmt: skip

    table = [
        row("lenet", 0, 4, "ig", 20.0, 2.0),
        row("lenet", 0, 4, "fi", 30.0, 5.0),  # best, but slower than breaching
        row("lenet", 0, 4, "fi:refine=0", 14.5, 1.0),
        row("lenet", 0, 4, BREACHING, 12.0, 4.0),
        row("lenet", 0, 4, FLOOR, 40.0, 0.0),  # no attack: never the best attack
        row("cnn", 0, 1, "ig", 10.0, 9.0),
        row("cnn", 0, 1, BREACHING, 12.0, 4.0),
        row("cnn", 200, 8, "ig", 10.0, 1.0),  # no breaching row: no margin
    ]
    got = {(m["model"], m["round"], m["batch_size"]): m for m in margins(table)}
    assert set(got) == {("lenet", 0, 4), ("cnn", 0, 1)}
    lenet = got[("lenet", 0, 4)]
    assert lenet["attack"] == "ig" and lenet["margin_db"] == 8.0 and lenet["wall_ratio"] == 0.5
    assert lenet["target"] and lenet["meets"]
    assert lenet["floor_db"] == 40.0 and lenet["breaching_db"] == 12.0
    cnn = got[("cnn", 0, 1)]
    assert cnn["attack"] is None and not cnn["meets"] and not cnn["target"]
    assert cnn["floor_db"] is None


def test_strength_tells_known_labels_and_scores_the_data_mean_floor(tmp_path):
    """benchmarks/strength.py --labels known: the observations carry the true labels (which
    attacks then use as given); every cell has a ``data-mean`` row whose PSNR is the train
    mean image's against the batch."""
    from strength import FLOOR, batches, benchmark, observation, parse_args, trained

    from privaudit.eval.metrics import psnr
    from privaudit.scenario.data import load_dataset

    argv = ["--models", "lenet", "--attacks", "ig", "--batch-sizes", "4", "--rounds", "0"]
    argv += ["--ig-iterations", "2", "--no-breaching", "--labels", "known"]
    report = benchmark(parse_args(argv))
    rows = {r["attack"]: r for r in report["rows"]}
    assert set(rows) == {"ig", FLOOR} and report["settings"]["labels"] == "known"
    data = load_dataset("photos")
    ((x, y),) = batches(data, 4, 1, 0)
    model, _ = trained("lenet", data, 0, 0)
    assert observation(model, data, x, y).labels is None
    assert observation(model, data, x, y, known_labels=True).labels.tolist() == y.tolist()
    mean = data.train_x.float().mean(0, keepdim=True).expand_as(x)
    assert rows[FLOOR]["psnr"] == pytest.approx(psnr(x, mean), abs=1e-4)
    assert rows[FLOOR]["label_acc"] is None and rows[FLOOR]["psnr"] != rows["ig"]["psnr"]
