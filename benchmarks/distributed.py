"""Rounds per second: the torch.distributed backend (one process per agent, gloo) next to
the in-process simulator, same defense, seed and machine.

Each engine trains 2R rounds (R = ``--rounds``) with a checkpoint every R rounds; rounds/s =
R / (time the round-2R checkpoint was written − time the round-R one was), so process
start-up, data loading and the first (slow) rounds are left out. Start-up (the wall time
before round R's checkpoint, minus R rounds at the measured rate) is reported on its own.
Ratio = distributed / simulator.

    python benchmarks/distributed.py [--agents 4,8 --defenses dsgd,dpdl --rounds 30
        --model lenet --batch-size 8] [--json] [--out DIR]

Each row is saved in ``--out`` (default ``privaudit-out/benchmarks/distributed``) as it
finishes; a rerun into the same folder prints the rows already there and measures the rest,
each on fresh runs (``benchmarks/resume.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from resume import Pieces, add_out  # noqa: E402 - a sibling script, not a package

from privaudit.core.config import RunConfig
from privaudit.core.files import dumps_strict
from privaudit.sim.distributed import launch
from privaudit.sim.run import Run
from privaudit.sim.rundir import RunDir


def timed(engine: str, cfg: RunConfig, root: Path) -> tuple[float, float]:
    """(rounds/s between the two checkpoints, start-up seconds)."""
    path = root / f"{engine}-{cfg.defense}-{cfg.agents}"
    t0 = time.time()
    if engine == "sim":
        Run.create(cfg, path).train(progress=False)
    else:
        launch(cfg, path, progress=False)
    rd = RunDir(path)
    half, end = (rd.round_file("checkpoints", t) for t in (cfg.checkpoint_every, cfg.rounds))
    rate = cfg.checkpoint_every / (end.stat().st_mtime - half.stat().st_mtime)
    return rate, half.stat().st_mtime - t0 - cfg.checkpoint_every / rate


def measure(n: int, defense: str, args: argparse.Namespace, root: Path) -> dict:
    """One row: both engines on the same configuration, their runs in ``root``."""
    cfg = RunConfig(
        defense=defense, rounds=2 * args.rounds, agents=n, model=args.model,
        batch_size=args.batch_size, sigma=1.0, epsilon=None,
        seed=args.seed, checkpoint_every=args.rounds,
    )  # fmt: skip
    row = {"agents": n, "defense": defense}
    for engine in ("sim", "dist"):
        rate, startup = timed(engine, cfg, root)
        row[f"{engine}_rounds_per_s"], row[f"{engine}_startup_s"] = rate, startup
    row["ratio"] = row["dist_rounds_per_s"] / row["sim_rounds_per_s"]
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", default="4,8")
    p.add_argument("--defenses", default="dsgd,dpdl")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--model", default="lenet")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--sim-threads",
        type=int,
        default=None,
        help="torch threads of the simulator (default: torch's)",
    )
    p.add_argument("--json", action="store_true")
    add_out(p, "distributed")
    args = p.parse_args(argv)
    if args.sim_threads:
        torch.set_num_threads(args.sim_threads)  # ranks use cores // ranks threads each
    warnings.filterwarnings("ignore")
    todo = [(int(n), d) for n in args.agents.split(",") for d in args.defenses.split(",")]

    def identity(n: int, defense: str) -> dict:
        return dict(bench="distributed", agents=n, defense=defense, rounds=args.rounds,
                    model=args.model, batch_size=args.batch_size, seed=args.seed,
                    sim_threads=args.sim_threads)  # fmt: skip

    # timed pieces: each measured on runs trained anew (a killed attempt's are removed)
    pieces = Pieces(args.out, [identity(*t) for t in todo], [__file__])
    rows = []
    for n, defense in todo:
        row = pieces.run(
            identity(n, defense), lambda work, n=n, d=defense: measure(n, d, args, work)
        )
        rows.append(row)
        if not args.json:
            print(
                f"{n:>3} agents  {defense:<6} sim {row['sim_rounds_per_s']:7.2f} r/s  "
                f"distributed {row['dist_rounds_per_s']:7.2f} r/s  "
                f"ratio {row['ratio']:5.2f}  (distributed start-up "
                f"{row['dist_startup_s']:.1f} s, simulator {row['sim_startup_s']:.1f} s)",
                flush=True,
            )
    info = {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    if args.json:
        print(dumps_strict({"machine": info, "rows": rows}, sort_keys=False))
    else:
        print(f"machine: {info['cpus']} CPUs; simulator threads {info['torch_threads']}, "
              "one thread per rank; gloo over TCP on 127.0.0.1")  # fmt: skip


if __name__ == "__main__":
    main()
