"""``privaudit compare`` and ``privaudit reproduce dpdl-table3`` on tiny configurations: the
plan, the cache (reuse, resume, identical numbers), the outputs, and bad input."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from privaudit.api.reproduce import PAPER_TABLE3, SCALE, format_table3, table3_rows
from privaudit.api.sweeps import Sweep, execute, load_tensors, plan
from privaudit.cli import main
from privaudit.core.config import RunConfig
from privaudit.eval.report import write_report

# B = 2: every cell has a victim whose Poisson batch is not empty
TINY = [
    "--agents",
    "3",
    "--victims",
    "2",
    "--iterations",
    "3",
    "--no-progress",
    "--batch-size",
    "2",
]
ARGS = ["compare", "--targets", "nd-cg,dpdl-cg", "--rounds", "1,2", "--epsilons", "1", *TINY]


def _mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def test_plan_one_run_per_defense_eps_seed_and_none_for_noise_free():
    targets = ["nd-cg", "dpdl-cg", "dpdl-mm"]
    sweep = Sweep(targets, [1, 5], [1.0, 2.0], [0, 1], RunConfig(agents=3), victims=2)
    runs, cells = plan(sweep)
    # nd adds no noise: one run per seed, ε = None (∞); dpdl: one per (ε, seed)
    assert sorted((d, e, s) for d, e, s in runs if d == "nd") == [("nd", None, 0), ("nd", None, 1)]
    assert len([k for k in runs if k[0] == "dpdl"]) == 4
    assert all(cfg.rounds == 5 for cfg in runs.values())  # trained once, to the largest round
    assert len(cells) == 2 * 2 + 2 * 2 * 2 * 2  # nd: seeds × rounds; dpdl: 2 targets × ε × …
    assert runs[("dpdl", 2.0, 1)].epsilon == 2.0 and runs[("nd", None, 0)].epsilon is None


def test_compare_writes_everything_and_a_rerun_reuses_it(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main([*ARGS, "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "| `dpdl-cg` | 2 |" in stdout and "| `nd-cg` | 1 | ∞ |" in stdout
    for name in ("grid-r1-eps1", "grid-r2-eps1", "sweep-round-eps1", "privacy-utility-r2"):
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / f"{name}.pdf").read_bytes()[:5] == b"%PDF-"
    cells = list(csv.DictReader((out / "cells.csv").open()))
    assert [(c["target"], c["round"]) for c in cells] == [
        ("nd-cg", "1"),
        ("nd-cg", "2"),
        ("dpdl-cg", "1"),
        ("dpdl-cg", "2"),
    ]
    assert {c["epsilon_requested"] for c in cells} == {"inf", "1"}
    dp = [c for c in cells if c["target"] == "dpdl-cg"]
    # σ calibrated to ε = 1 by the paper's count; dpdl's cg (and the run) have no formal
    # guarantee over the run: ∞ beside the ε asked
    assert all(c["epsilon"] == c["run_epsilon"] == "inf" and float(c["sigma"]) > 0 for c in dp)
    assert all(c["victims"] == "2" and float(c["psnr"]) > 0 for c in cells)
    assert (out / "summary.md").read_text().count("| `dpdl-cg` |") == 2
    images = list(csv.DictReader((out / "images.csv").open()))
    results = [json.loads(p.read_text()) for p in (out / "results").rglob("result.json")]
    shown = sum(sum(r["batch_sizes"]) for r in results)  # the victims' realised batches
    assert len(results) == 4 and len(images) == shown > 4  # one row per image under a grid
    runs = sorted(p.name for p in (out / "runs").iterdir() if p.is_dir())
    assert len(runs) == 2 and runs[0].startswith("dpdl-eps1-seed0-")

    # the same arguments again: nothing is trained or attacked, the numbers are identical
    runs_before = _mtimes(out / "runs")
    before = runs_before | _mtimes(out / "results")
    tables = {n: (out / n).read_bytes() for n in ("cells.csv", "summary.csv", "images.csv")}
    assert main([*ARGS, "--out", str(out), "--figures", str(tmp_path / "figs")]) == 0
    assert _mtimes(out / "runs") | _mtimes(out / "results") == before
    assert {n: (out / n).read_bytes() for n in tables} == tables
    figs = {p.name for p in (tmp_path / "figs").iterdir()}
    assert {"grid-r2-eps1.png", "sweep-round-eps1.png", "summary.md"} <= figs
    assert not any(name.endswith(".pdf") for name in figs)
    capsys.readouterr()
    assert main([*ARGS, "--out", str(out), "--json"]) == 0  # stdout: one JSON document
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["summary"]) == len(doc["cells"]) == 4 and doc["files"]["grids"]
    # the victims scored: those whose batch held an image (an empty Poisson batch has none)
    for row, cell in zip(doc["summary"], doc["cells"], strict=True):
        assert row["scored"] == sum(o["psnr"] is not None for o in cell["per_observation"])

    # resume: a lost result is recomputed from the kept run, to the same numbers
    lost = next((out / "results" / "dpdl-cg").glob("r2-*"))
    old = json.loads((lost / "result.json").read_text())
    shutil.rmtree(lost)
    sweep = Sweep(
        ["nd-cg", "dpdl-cg"],
        [1, 2],
        [1.0],
        [0],
        RunConfig(agents=3, batch_size=2),
        victims=2,
        iterations=3,
    )  # the CLI's sweep, through the Python API
    rows = execute(sweep, out, progress=False)
    assert _mtimes(out / "runs") == runs_before  # nothing retrained
    new = json.loads((lost / "result.json").read_text())
    assert new["metrics"] == old["metrics"] and new["per_image"] == old["per_image"]
    assert len(rows) == 4
    capsys.readouterr()

    # the ε sweep plot draws the noised targets against ε and the others as ε = ∞ lines
    more = [
        {**r, "epsilon_requested": e, "metrics": {**r["metrics"], "psnr": r["metrics"]["psnr"] + e}}
        for r in rows
        if r["target"] == "dpdl-cg"
        for e in (2.0, 8.0)
    ]
    written = write_report(rows + more, out / "eps", load_tensors)
    assert {p.name for p in written["sweeps"]} >= {"sweep-eps-r2.png", "sweep-eps-r2.pdf"}


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--targets", "nd-xx"], "unknown target 'nd-xx'"),
        (["--victims", "4"], "--victims must be 1..3"),
        (["--rounds", "0,2"], "--rounds must be ≥ 1"),
        (["--rounds", "a"], "--rounds must be a comma-separated list"),
        (["--sigma", "1"], "--sigma does nothing in compare"),
        (["--threat", "bogus"], "--threat must be one of"),
        (["--audit", "--audit-trials", "16"], "--trials 16 is too few"),
        (["--preset", "nope"], "--preset must be one of"),
        (["--epsilons=1,nan"], "--epsilons must be"),
    ],
)
def test_compare_bad_input_one_line(extra, message, tmp_path, capsys):
    assert main([*ARGS, "--out", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("privaudit: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_reproduce_table3_plumbing_on_photos(tmp_path, capsys):
    out = tmp_path / "t3"
    argv = (
        "reproduce dpdl-table3 --dataset photos --agents 4 --topologies ring --scenarios "
        "nd-cg,dpdl-cg --rounds 2 --victims 1 --iterations 2 --batch-size 1 --no-progress"
    ).split() + ["--out", str(out)]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    assert "MSE paper" in stdout and "where they differ" in stdout
    for sc in ("ND-CG", "DPDL-CG"):
        assert f"ring   4  {sc}" in stdout
    assert "ND-MM" not in stdout and "MSE↑" in stdout
    assert "no paper column" in stdout  # the paper has no N = 4 column
    assert (out / "table3.md").exists() and (out / "table3.json").exists()


def test_reproduce_without_mnist_names_the_fix(tmp_path, capsys):
    argv = "reproduce dpdl-table3 --agents 4 --no-progress".split()
    argv += ["--data-root", str(tmp_path), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--data-root" in err and "--download" in err and err.count("\n") == 1


def _row(topo: str, n: int, target: str, values: dict[str, float]) -> dict:
    return {
        "topology": topo,
        "agents": n,
        "target": target,
        "epsilon": 1.0,
        "metrics": {m: v / SCALE[m] for m, v in values.items()},
    }


def test_table3_against_the_paper_numbers():
    """Our numbers equal to the paper's: every row within tolerance, directions as the
    paper's; swapping ND and DPDL flips every direction."""
    scen = {"ND-CG": "nd-cg", "ND-MM": "nd-mm", "DPDL-CG": "dpdl-cg", "DPDL-MM": "dpdl-mm"}
    rows = [_row("ring", 10, t, PAPER_TABLE3[("ring", 10, sc)]) for sc, t in scen.items()]
    table = table3_rows(rows)
    assert [r["scenario"] for r in table] == list(scen)
    assert all(r["differs"] == "within tolerance" for r in table)
    assert table[2]["direction"] == {"mse": True, "psnr": True, "ssim": True}
    assert "ours 6/6 comparisons agree; the paper's own numbers 6/6" in format_table3(table)
    swapped = {"nd-cg": "dpdl-cg", "dpdl-cg": "nd-cg", "nd-mm": "dpdl-mm", "dpdl-mm": "nd-mm"}
    flipped = table3_rows([{**r, "target": swapped[r["target"]]} for r in rows])
    assert all(v is False for r in flipped if r.get("direction") for v in r["direction"].values())
    assert "PSNR" in flipped[0]["differs"]  # ND now carries DPDL's numbers: far from the paper


def test_table3_row_without_a_scored_victim_is_not_measured():
    """Every victim's batch empty (Poisson, B = 1): the row says it was not measured, never
    'within tolerance', and the DPDL row beside it has no direction to count."""
    scen = {"ND-CG": "nd-cg", "DPDL-CG": "dpdl-cg"}
    rows = [_row("ring", 10, t, PAPER_TABLE3[("ring", 10, sc)]) for sc, t in scen.items()]
    for r in rows:
        r["per_observation"] = [dict(r["metrics"]), dict(r["metrics"])]
    empty = {m: None for m in rows[0]["metrics"]}
    rows[0] = {**rows[0], "metrics": empty, "per_observation": [None, None]}
    table = table3_rows(rows)
    nd, dpdl = table
    assert nd["differs"].startswith("not measured") and nd["ours"]["scored"] == 0
    assert dpdl["differs"] == "within tolerance" and dpdl["ours"]["scored"] == 2
    assert dpdl["direction"] is None
    text = format_table3(table)
    assert "ours 0/0 comparisons agree" in text
    assert "1/1 measured rows within tolerance" in text and "1 not measured" in text


# -- the privacy–utility frontier (--preset utility) -------------------------------------------


def test_utility_plan_trains_each_defense_at_its_operating_point_per_eps():
    """No data is read by the plan: the shipped MNIST points are checked as they stand."""
    from privaudit.scenario import presets

    sweep = Sweep(
        ["dpdl-cg", "dsgd-half-model"],
        [],
        [1.0, 8.0, float("inf")],
        [0],
        RunConfig(dataset="mnist", agents=10),
        preset="utility",
        explicit={"params": {"momentum": 0.9}},
    )
    runs, cells = plan(sweep)
    for eps in (1.0, 8.0):
        point = presets.operating_point("utility", "dpdl", "mnist", eps)
        cfg = runs[("dpdl", eps, 0)]
        assert (cfg.model, cfg.batch_size, cfg.rounds) == (
            point.model,
            point.batch_size,
            point.rounds,
        )
        assert cfg.epsilon == eps and cfg.sigma is None and cfg.preset == "utility"
        assert cfg.params == {**point.params, "momentum": 0.9}  # the explicit flag on top
    no_noise = runs[("dpdl", float("inf"), 0)]
    assert no_noise.sigma == 0.0 and no_noise.epsilon is None
    assert no_noise.rounds == presets.operating_point("utility", "dpdl", "mnist").rounds
    assert runs[("dsgd", None, 0)].rounds == presets.OPERATING_POINTS[("dsgd", "mnist")][0].rounds
    # each run's last round is attacked, once per target
    assert sorted((c.target, c.round) for c in cells if c.target == "dpdl-cg") == sorted(
        ("dpdl-cg", runs[("dpdl", e, 0)].rounds) for e in (1.0, 8.0, float("inf"))
    )


def test_recovered_images_are_counted_over_every_seed_at_20_db_or_more():
    from privaudit.eval.report import summarize

    def row(seed: int, psnr: list[float | None]) -> dict:
        metric = dict.fromkeys(("psnr", "ssim", "mse", "lpips", "label_acc"), 1.0)
        return {
            "target": "dpdl-cg",
            "round": 5,
            "epsilon_requested": 1.0,
            "epsilon": 1.0,
            "sigma": 1.0,
            "threat": "local",
            "seed": seed,
            "per_observation": [{"psnr": 1.0}],
            "per_image": {"psnr": psnr, "ssim": [0.0] * len(psnr)},
            "metrics": metric,
            "spread": metric,
            "test_acc": 0.5,
        }

    # 20.0 counts, 19.99 does not; an image not scored (None) is not in the sample
    (s,) = summarize([row(0, [25.0, 19.99, 20.0]), row(1, [None, 31.0, 3.0])])
    assert (s["recovered"], s["images"]) == (3, 5)


def test_compare_utility_draws_the_frontier_with_its_references(tmp_path, monkeypatch, capsys):
    from privaudit.scenario import presets

    def point(rounds: int, lr: float, eps: float | None) -> presets.OperatingPoint:
        return presets.OperatingPoint("lenet", 2, rounds, 0.5, {"lr": lr}, "test", eps)

    monkeypatch.setitem(presets.OPERATING_POINTS, ("dsgd", "photos"), (point(3, 0.1, None),))
    monkeypatch.setitem(
        presets.OPERATING_POINTS,
        ("dp-dpsgd", "photos"),
        (point(2, 0.2, 1.0), point(3, 0.3, 8.0)),
    )
    out = tmp_path / "frontier"
    argv = ["compare", "--preset", "utility", "--targets", "dsgd-half-model,dp-dpsgd-half-model"]
    argv += ["--epsilons", "1,8,inf", "--agents", "3", "--victims", "1", "--iterations", "2"]
    argv += ["--audit-trials", "32", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    cells = list(csv.DictReader((out / "cells.csv").open()))
    attacked = {(c["target"], c["epsilon_requested"]): int(c["round"]) for c in cells}
    # the last round of each run, at the point of its ε (∞: the largest searched ε's)
    assert attacked == {
        ("dsgd-half-model", "inf"): 3,  # no noise to calibrate: one run
        ("dp-dpsgd-half-model", "1"): 2,
        ("dp-dpsgd-half-model", "8"): 3,
        ("dp-dpsgd-half-model", "inf"): 3,
    }
    audited = {(c["target"], c["epsilon_requested"]): c["audit_epsilon_lo"] for c in cells}
    assert audited.pop(("dsgd-half-model", "inf")) == ""  # nothing noised to audit
    assert all(lo != "" and float(lo) >= 0 for lo in audited.values())
    # membership inference on every run's last messages, private or not (cached beside it)
    for c in cells:
        # no TPR at 1 % FPR where fewer than 100 non-members cannot resolve it: empty
        assert c["mia_tpr"] == "" or 0 <= float(c["mia_tpr"]) <= 1
        assert 0 <= float(c["mia_auc"]) <= 1
        assert 0 <= float(c["label_counts_exact"]) <= 1
    assert len(list((out / "runs").glob("*.mia-*.json"))) == len(cells)
    table = (out / "frontier.md").read_text().splitlines()
    assert "MIA TPR @ 1 % FPR" in table[0] and "label counts exact" in table[0]
    rows = {r.split("|")[1].strip(): r for r in table[2:]}
    assert len(table) == 2 + 4 + 4  # four runs, opacus at ε = 1 and 8, two non-private
    opacus = [r for r in table if r.startswith("| centralised DP-SGD")]
    assert [r.split("|")[2].strip() for r in opacus] == ["1", "8"]
    for r in opacus:  # the reference spends at most the ε asked for
        assert float(r.split("|")[3]) <= float(r.split("|")[2]) * 1.001
    # each at dp-dpsgd's operating point for its ε
    assert "lenet, B = 2, T = 2, lr 0.2" in opacus[0] and "T = 3, lr 0.3" in opacus[1]
    # the non-private D-PSGD reference is the dsgd run itself, at its operating point
    dsgd_acc = float(rows["`dsgd-half-model`"].split("|")[5])
    assert float(rows["D-PSGD, non-private"].split("|")[5]) == dsgd_acc
    # images recovered at >= 20 dB: the count of images.csv's PSNRs at or above it, of all
    col = table[0].split("|").index(" ≥ 20 dB ")
    per_image = list(csv.DictReader((out / "images.csv").open()))
    for c in cells:
        mine = [
            float(i["psnr"])
            for i in per_image
            if (i["target"], i["epsilon_requested"]) == (c["target"], c["epsilon_requested"])
        ]
        row = next(
            r
            for r in table[2:]
            if r.split("|")[1].strip() == f"`{c['target']}`"
            and r.split("|")[2].strip()
            == ("∞" if c["epsilon_requested"] == "inf" else c["epsilon_requested"])
        )
        want = f"{sum(p >= 20 for p in mine)} of {len(mine)}" if mine else "—"
        assert row.split("|")[col].strip() == want
    # the accuracy pivot: the same test accuracies, one column per ε asked
    pivot = (out / "accuracy.md").read_text().splitlines()
    assert pivot[0] == "| target | ε = 1 | ε = 8 | ε = ∞ |"
    dp = next(r for r in pivot if r.startswith("| `dp-dpsgd-half-model`")).split("|")[2:5]
    accs = {
        r.split("|")[2].strip(): r.split("|")[5].strip()
        for r in table[2:]
        if r.startswith("| `dp-dpsgd-half-model`")
    }
    assert [v.strip() for v in dp] == [accs["1"], accs["8"], accs["∞"]]
    assert (out / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(out.glob("grid-rlast-eps*.png"))  # one per ε whose victim's batch is not empty
