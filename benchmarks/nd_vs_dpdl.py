"""Does DPDL's noise stop the attack that breaks the undefended baseline?

Trains ND (DPDL without clipping or noise) and DPDL at ε on the embedded default data with
batch size 1, captures the cross-gradient of round R on 8 links (8 different victims), and
runs the default attack of ``privaudit attack`` on all 8 as one batched problem. Prints the
mean PSNR / SSIM of each and the drop, against the foundation issue's bar (ND ≥ 22 dB,
drop ≥ 8 dB).

    python benchmarks/nd_vs_dpdl.py [--round 200] [--epsilon 1] [--iterations N] [--json]
                                    [--figures figures/]   # keep the two grids
                                    [--out DIR]

Each defense's run, attack and scores are saved in ``--out`` (default
``privaudit-out/benchmarks/nd_vs_dpdl``) as they finish; a rerun into the same folder
computes only what is not there yet (``benchmarks/resume.py``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from resume import Pieces, add_out  # noqa: E402 - a sibling script, not a package

from privaudit.api.pipeline import attack
from privaudit.core.config import RunConfig
from privaudit.core.files import dumps_strict
from privaudit.sim.run import Run


def identity(defense: str, args: argparse.Namespace) -> dict:
    """What one defense's scores depend on (``benchmarks/resume.py``)."""
    return dict(bench="nd_vs_dpdl", defense=defense, round=args.round, epsilon=args.epsilon,
                agents=args.agents, iterations=args.iterations, seed=args.seed,
                device=args.device)  # fmt: skip


def measure(defense: str, args: argparse.Namespace, root: Path) -> dict:
    cfg = RunConfig(
        defense=defense,
        rounds=args.round,
        batch_size=1,
        epsilon=args.epsilon,
        agents=args.agents,
        device=args.device,
        seed=args.seed,
    )
    run = Run.create(cfg, f"{root}/{defense}")
    links = [(i, (i + 1) % args.agents) for i in range(8)]
    t0 = time.perf_counter()
    res = attack(
        run,
        f"{defense}-cg",
        args.round,
        links=links,
        iterations=args.iterations,
        lpips=False,
        progress=not args.json,
        out=f"{root}/{defense}-out",
    ).to_dict()
    res["total_s"] = time.perf_counter() - t0
    return res


def keep_figure(defense: str, res: dict, args: argparse.Namespace) -> None:
    """Copy the grid of ``defense`` (in its working folder) to ``--figures``."""
    if args.figures and res.get("figure"):  # no grid when every victim's batch is empty
        Path(args.figures).mkdir(parents=True, exist_ok=True)
        shutil.copy(res["figure"], Path(args.figures) / f"{defense}-cg-b1-r{args.round}.png")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--round", type=int, default=200)
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--agents", type=int, default=10)
    p.add_argument("--iterations", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true")
    p.add_argument("--figures", default=None, help="folder to copy the two grids into")
    p.add_argument("--markdown", default=None, help="write the table here (benchmarks/figures.py)")
    add_out(p, "nd_vs_dpdl")
    args = p.parse_args(argv)
    pieces = Pieces(args.out, [identity(d, args) for d in ("nd", "dpdl")], [__file__])
    got = {}
    for d in ("nd", "dpdl"):
        got[d] = pieces.run(identity(d, args), lambda work, d=d: measure(d, args, work))
        keep_figure(d, got[d], args)
    nd, dp = got["nd"], got["dpdl"]
    drop = nd["metrics"]["psnr"] - dp["metrics"]["psnr"]
    ok = nd["metrics"]["psnr"] >= 22 and drop >= 8
    row = {
        "round": args.round,
        "epsilon": args.epsilon,
        "sigma": dp["sigma"],
        "attack": nd["attack"],
        "victims": len(nd["links"]),
        "nd_psnr": nd["metrics"]["psnr"],
        "nd_ssim": nd["metrics"]["ssim"],
        "dpdl_psnr": dp["metrics"]["psnr"],
        "dpdl_ssim": dp["metrics"]["ssim"],
        "psnr_drop": drop,
        "nd_per_victim": [o["psnr"] for o in nd["per_observation"]],
        "dpdl_per_victim": [o["psnr"] for o in dp["per_observation"]],
        "seconds": nd["total_s"] + dp["total_s"],
        "meets_bar": ok,
    }
    if args.json:
        print(dumps_strict(row, sort_keys=False))
        return
    print(
        f"B = 1 (Poisson), round {args.round}, {row['victims']} victims, attack {row['attack']}, "
        f"ε = {args.epsilon} (σ = {row['sigma']:.3g})"
    )
    print(f"{'target':<8} {'PSNR dB':>8} {'SSIM':>6}   per-victim PSNR")
    for name, key in (("nd-cg", "nd"), ("dpdl-cg", "dpdl")):
        # an empty Poisson batch (B = 1 expected) has nothing to reconstruct: —
        per = " ".join("    —" if v is None else f"{v:5.1f}" for v in row[f"{key}_per_victim"])
        print(f"{name:<8} {row[f'{key}_psnr']:8.2f} {row[f'{key}_ssim']:6.3f}   {per}")
    print(
        f"PSNR drop {drop:.2f} dB (bar: nd ≥ 22 dB, drop ≥ 8 dB): "
        f"{'met' if ok else 'NOT met'}; {row['seconds']:.0f} s"
    )
    if args.markdown:
        Path(args.markdown).write_text(markdown(row, args))


def markdown(row: dict, args: argparse.Namespace) -> str:
    """The headline table: each target's mean PSNR and SSIM over the victims scored (a victim
    whose Poisson batch is empty that round has nothing to reconstruct)."""
    lines = ["| target | victims scored | mean PSNR | SSIM |", "|---|---|---|---|"]
    for name, key in (("nd-cg", "nd"), ("dpdl-cg", "dpdl")):
        scored = sum(v is not None for v in row[f"{key}_per_victim"])
        lines.append(
            f"| `{name}` | {scored} of {row['victims']} | {row[f'{key}_psnr']:.1f} dB "
            f"| {row[f'{key}_ssim']:.2f} |"
        )
    note = (
        f"\nRound {args.round}, B = 1 (Poisson), ε = {args.epsilon:g} for dpdl (σ = "
        f"{row['sigma']:.3g}), attack {row['attack']}.\n"
    )
    return "\n".join(lines) + "\n" + note


if __name__ == "__main__":
    main()
