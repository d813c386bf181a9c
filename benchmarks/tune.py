"""Operating-point search: a grid over training settings, scored on a validation split.

Every grid point trains the defense with ``eval_split="validation"`` — 10 % of the training
split held out of training and measured instead of the test split, which the search never
sees — once per ``--epsilons`` value (``inf``: no noise), and is scored by its mean
validation accuracy over them. The best point is printed as the
:class:`privaudit.scenario.presets.OperatingPoint` that ``privaudit/scenario/presets.py``
ships; a noised defense is searched one ε at a time, as it ships one point per ε. As is
usual, the search itself is not accounted.

    python benchmarks/tune.py --defense dpdl --dataset mnist --data-root DIR \
        --grid lr=0.5,1,2 --grid batch_size=64,128 [--grid clip=0.5,1] \
        [--model tanh-cnn --rounds 400 --dirichlet-alpha 0.5 --epsilons 1,8 --out tune]

A grid key is a run setting (model, batch_size, rounds, dirichlet_alpha) or a defense
parameter (lr, clip, momentum, …). Finished points are kept in ``OUT/results.jsonl``: an
interrupted search resumes where it stopped, and a wider grid reuses what is done. Each
grid point's run at each ε is one task of ``--executor`` (``local``, the default: one after
the other, here; ``ray``: as many at once as the cluster holds, docs/running-at-scale.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import math
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from privaudit.api.executor import LocalExecutor, Task, TaskFailed
from privaudit.cli.options import add_executor_options, executor_from_args
from privaudit.core.config import RunConfig
from privaudit.core.errors import Interrupted, PrivauditError
from privaudit.sim.run import Run

RUN_FIELDS = ("model", "batch_size", "rounds", "dirichlet_alpha")


def grid_axis(text: str) -> tuple[str, list[Any]]:
    """``name=v1,v2,…`` → (name, values parsed as JSON numbers or kept as text)."""
    name, _, values = text.partition("=")
    if not values:
        raise argparse.ArgumentTypeError(f"--grid takes NAME=V1,V2,…, got {text!r}")

    def parse(v: str) -> Any:
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return v

    return name.strip().replace("-", "_"), [parse(v) for v in values.split(",")]


def config_of(base: RunConfig, point: dict[str, Any], epsilon: float) -> RunConfig:
    """The run of one grid point at one ε (∞: no noise, σ = 0)."""
    fields = {k: v for k, v in point.items() if k in RUN_FIELDS}
    params = {**base.params, **{k: v for k, v in point.items() if k not in RUN_FIELDS}}
    noise = {"epsilon": None, "sigma": 0.0} if math.isinf(epsilon) else {"epsilon": epsilon}
    cfg = dataclasses.replace(base, **fields, **noise, params=params)
    return dataclasses.replace(cfg, checkpoint_every=cfg.rounds).validate()


def key_of(cfg: RunConfig) -> str:
    return hashlib.sha256(json.dumps(cfg.identity(), sort_keys=True).encode()).hexdigest()[:16]


def train(cfg: RunConfig, path: Path) -> tuple[float, float, float, str | None]:
    """One grid point at one ε, as a task: its validation accuracy, σ and seconds, and the
    error that stopped it (accuracy and σ NaN: e.g. a batch larger than a shard), or None."""
    t0 = time.perf_counter()
    error = None
    try:
        run = Run.create(cfg, path)
        acc = run.test_accuracy(run.train(progress=False))
        sigma = run.resolved["sigma"]
    except Interrupted:
        raise
    except PrivauditError as e:
        acc, sigma, error = math.nan, math.nan, str(e)
    return acc, sigma, time.perf_counter() - t0, error


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--defense", required=True)
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--data-root", default=None)
    p.add_argument("--grid", action="append", default=[], type=grid_axis, metavar="NAME=V,…")
    p.add_argument("--model", default="tanh-cnn")
    p.add_argument("--rounds", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--dirichlet-alpha", type=float, default=0.5)
    p.add_argument("--agents", type=int, default=10)
    p.add_argument("--topology", default=None)
    p.add_argument("--epsilons", default="1,8", help="comma-separated; inf: no noise")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1: as privaudit's CLI)"
    )
    p.add_argument("--out", default="privaudit-out/tune")
    add_executor_options(p)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    try:
        executor = executor_from_args(args) or LocalExecutor()
    except PrivauditError as e:
        p.error(str(e))
    out = Path(args.out)
    if executor.parallel:  # the workers' working folder is not this one
        out = out.resolve()
        if args.data_root is not None:
            args.data_root = str(Path(args.data_root).resolve())
    warnings.filterwarnings("ignore")
    from privaudit.defenses import get_defense

    defense = get_defense(args.defense)
    base = RunConfig(
        defense=args.defense,
        agents=args.agents,
        topology=args.topology or defense.topology or "ring",
        dataset=args.dataset,
        data_root=args.data_root,
        model=args.model,
        batch_size=args.batch_size,
        rounds=args.rounds,
        dirichlet_alpha=args.dirichlet_alpha,
        seed=args.seed,
        device=args.device,
        eval_split="validation",
    )
    epsilons = [float(e) for e in args.epsilons.split(",")]
    names = [n for n, _ in args.grid]
    points = [
        dict(zip(names, vs, strict=True)) for vs in itertools.product(*(v for _, v in args.grid))
    ]
    out.mkdir(parents=True, exist_ok=True)
    log = out / "results.jsonl"
    done = {}
    if log.exists():
        for line in log.read_text().splitlines():
            r = json.loads(line)
            done[r["key"]] = r
    gpus = 1.0 if args.device.startswith("cuda") else 0.0
    tasks: dict[str, Task] = {}  # every run not in the log, in the grid's order
    runs: dict[str, tuple[dict[str, Any], float]] = {}  # a task's (grid point, ε)
    for point in points:
        for eps in epsilons:
            cfg = config_of(base, point, eps)
            key = key_of(cfg)
            if key not in done and key not in tasks:
                shown = ", ".join(f"{k}={v}" for k, v in point.items())
                label = f"{args.defense} {shown} ε={eps:g}"
                args_ = (cfg, out / "runs" / key)
                tasks[key] = Task(key, train, args_, label=label, gpus=gpus)
                runs[key] = point, eps
    cached = len(points) * len(epsilons) - len(tasks)
    failed: list[TaskFailed] = []
    try:
        for t, result in executor.run(list(tasks.values()), cached=cached):
            if isinstance(result, TaskFailed):  # only where the executor keeps going
                print(result.line(), file=sys.stderr, flush=True)
                failed.append(result)
                continue
            (point, eps), cfg = runs[t.key], t.args[0]
            acc, sigma, seconds, error = result
            if error is not None:
                print(f"  {point} ε={eps:g}: {error}", file=sys.stderr)
            r = {
                "key": t.key,
                "defense": args.defense,
                "point": point,
                "epsilon": eps,
                "sigma": sigma,
                "validation_accuracy": acc,
                "seconds": seconds,
                "config": cfg.identity(),
            }
            with log.open("a") as f:
                f.write(json.dumps(r) + "\n")
            done[t.key] = r
            shown = ", ".join(f"{k}={v}" for k, v in point.items())
            print(
                f"{args.defense} {shown} ε={eps:g}: validation accuracy {acc:.4f} "
                f"(σ {sigma:.3g}, {r['seconds']:.0f} s)",
                flush=True,
            )
    except PrivauditError as e:  # the executor's: interrupted, no cluster
        if not executor.parallel:
            raise
        sys.exit(f"error: {e}")
    if failed:
        sys.exit(
            f"error: {len(failed)} of {len(tasks)} runs failed (each line above); the "
            f"{len(tasks) - len(failed)} finished are kept in {log}: fix the cause and run the "
            "same command again"
        )
    rows = []
    for point in points:
        accs = [
            done[key_of(config_of(base, point, eps))]["validation_accuracy"] for eps in epsilons
        ]
        score = statistics.fmean(accs) if not any(map(math.isnan, accs)) else math.nan
        rows.append((score, point, accs))
    rows.sort(key=lambda r: -r[0] if not math.isnan(r[0]) else math.inf)
    eps_cols = " | ".join(f"ε={e:g}" for e in epsilons)
    print(f"\n| {' | '.join(names)} | {eps_cols} | mean |")
    print("|" + "---|" * (len(names) + len(epsilons) + 1))
    for score, point, accs in rows:
        cells = " | ".join(str(point[n]) for n in names)
        print(f"| {cells} | " + " | ".join(f"{a:.4f}" for a in accs) + f" | {score:.4f} |")
    score, best, accs = rows[0]
    cfg = config_of(base, best, epsilons[0])
    params = {k: v for k, v in best.items() if k not in RUN_FIELDS}
    grid = " ".join(f"--grid {n}={','.join(map(str, v))}" for n, v in args.grid)
    fixed = {"model": args.model, "rounds": args.rounds, "batch_size": args.batch_size}
    fixed["dirichlet_alpha"] = args.dirichlet_alpha
    fixed_flags = " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in fixed.items() if k not in names
    )
    searched = (
        f"benchmarks/tune.py --defense {args.defense} --dataset {args.dataset} {grid} "
        f"{fixed_flags} --epsilons {args.epsilons}: validation "
        + ", ".join(f"{a:.3f} at ε={e:g}" for a, e in zip(accs, epsilons, strict=True))
    )
    anchor = epsilons[0] if len(epsilons) == 1 and math.isfinite(epsilons[0]) else None
    print(
        f"\nbest: ({args.defense!r}, {args.dataset!r}): OperatingPoint(model={cfg.model!r}, "
        f"batch_size={cfg.batch_size}, rounds={cfg.rounds}, "
        f"dirichlet_alpha={cfg.dirichlet_alpha}, params={params!r}, searched={searched!r}, "
        f"epsilon={anchor})"
    )


if __name__ == "__main__":
    main()
