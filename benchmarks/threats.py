"""What does each adversary recover? Mean PSNR / SSIM over 8 victims per (target × threat).

Default data (embedded photos), batch size 1, Inverting Gradients (privaudit's default attack)
on all 8 victims of a row as one batched problem. Rows (issue #4):

- ``dsgt-gt`` / ``lppa-gt`` / ``dp-dsgt-gt`` under ``neighbor`` on a complete graph at the
  paper's iterations 0, 1, 5, 20 (γ^0, γ^1, … are sent in rounds 1, 2, 6, 21);
- ``dpdl-cg`` under ``link`` against ``dpdl-mm`` under ``global`` (the momentum minus every
  intercepted cross-gradient: the clipped, un-noised self-gradient plus the self-pair noise);
- ``pdsl-cg``: one copy (``neighbor``) against the average of every copy (``coalition`` of
  the victim's neighbours).

    python benchmarks/threats.py [--iterations 3000] [--round 100] [--epsilon 1] [--json]
        [--out DIR]

Each row is saved in ``--out`` (default ``privaudit-out/benchmarks/threats``, the runs beside
them) as it finishes; a rerun into the same folder prints the rows already there and computes
the rest (``benchmarks/resume.py``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from resume import Pieces, add_out  # noqa: E402 - a sibling script, not a package

from privaudit.api.pipeline import attack
from privaudit.core.config import RunConfig
from privaudit.core.files import dumps_strict
from privaudit.sim.run import Run

VICTIMS = list(range(8))


def rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """(defense, run options, target, round, threat) of every row of the table."""
    out = []
    for t in (1, 2, 6, 21):
        for d in ("dsgt", "lppa", "dp-dsgt"):
            out.append(dict(defense=d, topology="complete", rounds=21, round=t, threat="neighbor"))
    r = args.round
    out += [
        dict(defense="dpdl", topology="ring", rounds=r, round=r, threat="link", kind="cg"),
        dict(defense="dpdl", topology="ring", rounds=r, round=r, threat="global", kind="mm"),
        dict(defense="pdsl", topology="ring", rounds=r, round=r, threat="neighbor", kind="cg"),
        dict(defense="pdsl", topology="ring", rounds=r, round=r, threat="coalition", kind="cg"),
    ]
    return out


def identity(row: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """What a row's numbers depend on (``benchmarks/resume.py``)."""
    return dict(bench="threats", row=row, iterations=args.iterations, epsilon=args.epsilon,
                seed=args.seed, device=args.device)  # fmt: skip


def measure(row: dict[str, Any], args: argparse.Namespace, pieces: Pieces) -> dict[str, Any]:
    cfg = RunConfig(
        defense=row["defense"],
        rounds=row["rounds"],
        topology=row["topology"],
        batch_size=1,
        epsilon=args.epsilon,
        seed=args.seed,
        device=args.device,
    )
    name = f"{row['defense']}-{row['topology']}-{row['rounds']}"  # one run, several rows
    run = Run.create(cfg, pieces.shared(name, {"config": cfg.identity()}))
    target = f"{row['defense']}-{row.get('kind', 'gt')}"
    t0 = time.perf_counter()
    res = attack(
        run,
        target,
        row["round"],
        threat=row["threat"],
        victims=VICTIMS,
        iterations=args.iterations,
        lpips=False,
        progress=not args.json,
    )
    return {
        "target": target,
        "threat": row["threat"],
        "topology": row["topology"],
        "round": row["round"],
        "psnr": res.metrics["psnr"],
        "ssim": res.metrics["ssim"],
        "label_acc": res.metrics["label_acc"],
        "exact": res.exact_observation,
        "noise_std": sum(res.noise_std) / len(res.noise_std),
        "epsilon": res.epsilon,
        "seconds": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=None, help="IG iterations (default 3000)")
    p.add_argument("--round", type=int, default=100, help="round of the dpdl / pdsl rows")
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--only", default=None, help="comma-separated defenses to run")
    p.add_argument("--json", action="store_true")
    add_out(p, "threats")
    args = p.parse_args(argv)
    todo = rows(args)
    if args.only:
        keep = set(args.only.split(","))
        todo = [r for r in todo if r["defense"] in keep]
    pieces = Pieces(args.out, [identity(r, args) for r in todo], [__file__])
    results = []
    for row in todo:
        results.append(
            pieces.run(identity(row, args), lambda _work, row=row: measure(row, args, pieces))
        )
        if not args.json:
            r = results[-1]
            print(
                f"{r['target']:<11} {r['threat']:<9} {r['topology']:<8} round {r['round']:>3}"
                f"  PSNR {r['psnr']:6.2f} dB  SSIM {r['ssim']:6.3f}  labels "
                f"{r['label_acc']:.2f}  exact {str(r['exact']):<5}  noise std "
                f"{r['noise_std']:.3g}  ({r['seconds']:.0f} s)",
                flush=True,
            )
    if args.json:
        print(dumps_strict(results, sort_keys=False))


if __name__ == "__main__":
    main()
