"""Search an attack's TV weight and step size per model, on data the benchmarks do not report.

For every model (``lenet``: sigmoid, raw pixels; ``cnn``: ReLU, normalised pixels), round
(0 and 200 SGD steps, trained as in ``benchmarks/strength.py``) and batch size B, ``--images``
batches of B images are drawn from the photos *train* split (strength.py reports the test
split) with a fixed seed; each batch gives strength.py's observation (exact gradient, labels
hidden). The attack (``--attack``: ``ig``, ``fi`` or ``hybrid``) runs at ``--iterations``
(strength.py's budget: 300 for IG and ``fi``, 30 L-BFGS steps for the hybrid) for every grid
point (``--tv`` × ``--lr``; for ``fi`` ``--lr`` sets the refinement's step ``refine_lr``)
and the mean PSNR over all cells is printed per model, with the best point. With
``--data-root DIR`` the best point of each model and the current default are re-scored the
same way on MNIST's train split (the folder that holds ``MNIST/``), as a check on a second
data set. Models, observations and scoring are strength.py's helpers.

Usage::

    python benchmarks/tune_attack.py [--attack ig|fi|hybrid] [--models lenet,cnn]
        [--tv 1e-4,1e-3,1e-2,5e-2] [--lr 0.03,0.1,0.3] [--batch-sizes 1,4] [--rounds 0,200]
        [--images 1] [--iterations 300] [--data-root DIR] [--threads 1] [--seed 0] [--json PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from strength import batches, ints, names, observation, trained  # noqa: E402 - sibling script

STEP = {"ig": "lr", "fi": "refine_lr", "hybrid": "lr"}  # the option --lr sets


def default_point(attack: str) -> tuple[float, float]:
    """The attack's signature defaults of (tv, its step option)."""
    import inspect

    from privaudit.attacks import ATTACKS

    params = inspect.signature(ATTACKS[attack]).parameters
    return params["tv"].default, params[STEP[attack]].default


def floats(text: str) -> list[float]:
    return [float(s) for s in text.split(",") if s.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--attack", default="ig", choices=sorted(STEP))
    p.add_argument("--models", default="lenet,cnn")
    p.add_argument("--tv", default="1e-4,1e-3,1e-2,5e-2")
    p.add_argument("--lr", default="0.03,0.1,0.3")
    p.add_argument("--batch-sizes", default="1,4")
    p.add_argument("--rounds", default="0,200")
    p.add_argument("--images", type=int, default=1, help="batches per cell (default 1)")
    p.add_argument("--iterations", type=int, default=300, help="the attack's (default 300)")
    p.add_argument("--data-root", default=None, help="also re-score on MNIST from this folder")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="PATH")
    return p.parse_args(argv)


def cells(data: Any, model_name: str, args: argparse.Namespace) -> list[tuple]:
    """(round, B, observations, images, labels) per cell, the images from the train split."""
    train_only = dataclasses.replace(data, test_x=data.train_x, test_y=data.train_y)
    out = []
    for rnd in ints(args.rounds):
        model, _ = trained(model_name, data, rnd, args.seed)
        for b in ints(args.batch_sizes):
            drawn = batches(train_only, b, args.images, args.seed)
            obs = [observation(model, data, x, y) for x, y in drawn]
            out.append((rnd, b, obs, [x for x, _ in drawn], [y for _, y in drawn]))
    return out


def score_point(cs: list[tuple], tv: float, lr: float, args: argparse.Namespace) -> dict:
    """Mean PSNR of the attack at (tv, lr) over every batch of every cell, and per cell."""
    from privaudit.attacks import run_attack
    from privaudit.eval.metrics import score

    per_cell, all_ = {}, []
    for rnd, b, obs, xs, ys in cs:
        step = {STEP[args.attack]: lr}
        recs = run_attack(
            args.attack, obs, iterations=args.iterations, seed=args.seed, tv=tv, **step
        )
        vals = [
            score(x, y, r.images.detach().cpu(), r.labels.cpu(), lpips=False)["psnr"]
            for x, y, r in zip(xs, ys, recs, strict=True)
        ]
        per_cell[f"r{rnd} B={b}"] = sum(vals) / len(vals)
        all_ += vals
    return dict(tv=tv, lr=lr, psnr=sum(all_) / len(all_), cells=per_cell)


def search(data: Any, model_name: str, points: list[tuple[float, float]], args) -> list[dict]:
    cs = cells(data, model_name, args)
    rows = []
    for tv, lr in points:
        t = time.perf_counter()
        rows.append(score_point(cs, tv, lr, args))
        print(
            f"  {model_name} tv={tv:g} lr={lr:g}: {rows[-1]['psnr']:.2f} dB "
            f"({time.perf_counter() - t:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    return rows


def print_grid(dname: str, model_name: str, rows: list[dict]) -> None:
    lrs = sorted({r["lr"] for r in rows})
    tvs = sorted({r["tv"] for r in rows})
    at = {(r["tv"], r["lr"]): r["psnr"] for r in rows}
    print(f"\n{dname} / {model_name}: mean PSNR (dB), rows tv, columns lr")
    print("tv \\ lr " + "".join(f"{lr:>9g}" for lr in lrs))
    for tv in tvs:
        cols = "".join(f"{at[(tv, lr)]:>9.2f}" if (tv, lr) in at else f"{'':>9}" for lr in lrs)
        print(f"{tv:<8g}" + cols)
    best = max(rows, key=lambda r: r["psnr"])
    cells_ = ", ".join(f"{k} {v:.1f}" for k, v in best["cells"].items())
    print(f"best: tv={best['tv']:g} lr={best['lr']:g}, {best['psnr']:.2f} dB ({cells_})")


def main(argv: list[str] | None = None) -> dict:
    import torch

    from privaudit.scenario.data import load_dataset

    args = parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    grid = [(tv, lr) for tv in floats(args.tv) for lr in floats(args.lr)]
    photos = load_dataset("photos")
    report: dict[str, Any] = {"settings": vars(args), "photos": {}, "mnist": {}}
    best = {}
    for m in names(args.models):
        rows = search(photos, m, grid, args)
        report["photos"][m] = rows
        best[m] = max(rows, key=lambda r: r["psnr"])
        print_grid("photos train", m, rows)
    if args.data_root:
        mnist = load_dataset("mnist", args.data_root)
        points = sorted({default_point(args.attack), *((b["tv"], b["lr"]) for b in best.values())})
        for m in names(args.models):
            rows = search(mnist, m, points, args)
            report["mnist"][m] = rows
            print_grid("mnist train", m, rows)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
